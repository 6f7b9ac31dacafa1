"""Delta updates from Python on the host backend (txn.load_delta,
load_delta_runs, load_deltas; model.update(version=, base=, changed=)):
numpy-backed, no torch, no GPU (TAP; every function test_* is one test
point). A delta reload equals a full reload of the patched checkpoint bit
for bit; a wrong base, a bad index, a duplicate, a module declared and
not delivered are refused with bytes, version and health unchanged; an
abort after half the patches restores every byte. Online fp8 modules take
patches through refit's masters (delta_master_budget).

usage: test_delta.py   (env: REFIT_LIB, the build's librefit.so;
REFIT_SOURCE_ROOT, the checkout)"""
import os
import sqlite3
import sys
import tempfile

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import refit  # noqa: E402
import harness  # noqa: E402  (tests/python/harness.py)
from harness import raises  # noqa: E402

TMP = tempfile.mkdtemp(prefix="refit-delta-")
BF16 = ml_dtypes.bfloat16
SHAPES = {"q": (8, 4), "k": (2, 4), "v": (2, 4), "embed": (6, 4), "up": (8, 4),
          "experts.0.w": (4, 4), "experts.1.w": (4, 4), "experts.2.w": (4, 4), "norm": (4,)}


class Engine:
    """Rank `rank` of 2: a fused qkv, a tied embedding/head, an MLP weight
    sharded on dim 0, three experts stacked in one tensor, a bf16 norm cast
    to f32."""

    def __init__(self, rank=1, journal=""):
        self.qkv = np.zeros((12, 4), np.float32)
        self.embed = np.zeros((6, 4), np.float32)
        self.up = np.zeros((4, 4), np.float32)
        self.experts = np.zeros((3, 4, 4), np.float32)
        self.norm = np.zeros((4,), np.float32)
        self.ctx = refit.Context(worker_id="py-delta", journal_path=journal)
        m = self.model = self.ctx.create_model()
        m.add_module("attn")
        m.bind_runtime("attn", "w", self.qkv)
        for name, off in (("q", 0), ("k", 8), ("v", 10)):
            m.expect("attn", name, np.float32, SHAPES[name], dst_offset=[off, 0])
        m.add_module("embed")
        m.bind_runtime("embed", "w", self.embed)
        m.expect("embed", "embed", "f32", [6, 4])
        m.expect("embed", "lm_head", "f32", [6, 4], tie_of="embed")
        m.add_module("mlp")
        m.bind_runtime("mlp", "w", self.up)
        m.expect("mlp", "up", "f32", [8, 4], shard=(0, rank, 2))
        m.add_module("moe")
        m.bind_runtime("moe", "w", self.experts)
        for e in range(3):
            m.expect("moe", "experts.%d.w" % e, "f32", [4, 4], expert=e)
        m.add_module("norm", params={"cast": True})
        m.bind_runtime("norm", "w", self.norm)
        m.expect("norm", "norm", BF16, [4])
        m.seal()

    def snapshot(self):
        return {k: getattr(self, k).copy() for k in ("qkv", "embed", "up", "experts", "norm")}

    def same(self, snap):
        return all(np.array_equal(getattr(self, k), v) for k, v in snap.items())


def checkpoint(seed):
    r = np.random.default_rng(seed)
    ck = {n: r.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    ck["norm"] = ck["norm"].astype(BF16)
    return ck


def patches(ck, new, frac, seed, shuffle=False):
    """name -> (indices, values): about frac of each tensor's elements take
    new's values. Also the patched checkpoint."""
    r = np.random.default_rng(seed)
    out, patched = {}, {}
    for n, a in ck.items():
        flat = a.reshape(-1)
        idx = np.flatnonzero(r.random(flat.size) < frac)
        if idx.size == 0:
            idx = np.array([r.integers(flat.size)])
        if shuffle:
            r.shuffle(idx)
        vals = new[n].reshape(-1)[idx]
        out[n] = (idx, vals)
        p = flat.copy()
        p[idx] = vals
        patched[n] = p.reshape(a.shape)
    return out, patched


def full_update(e, version, ck):
    with e.model.update(version=version) as txn:
        txn.load_dict(ck)


def test_delta_equals_full_reload():
    for rank in (0, 1):
        e = Engine(rank)
        ck1, ck2 = checkpoint(1), checkpoint(2)
        full_update(e, "v1", ck1)
        before = e.snapshot()
        table, patched = patches(ck1, ck2, 0.1, 7, shuffle=True)
        with e.model.update(version="v2", base="v1") as txn:
            txn.load_deltas(table)
            st = txn.stats()
            assert st["delta_tensors"] == len(table), st
            assert st["delta_elements"] == sum(len(i) for i, _ in table.values()), st
        assert e.ctx.version == "v2" and e.ctx.health() == refit.Health.READY
        assert not e.same(before)
        delta = e.snapshot()
        full_update(e, "v2-full", patched)
        assert e.same(delta), "rank %d: the delta differs from the full reload" % rank


def test_one_by_one_and_runs_and_tied_name():
    e = Engine()
    ck1, ck2 = checkpoint(1), checkpoint(2)
    full_update(e, "v1", ck1)
    table, patched = patches(ck1, ck2, 0.2, 3)
    with e.model.update(version="v2", base="v1") as txn:
        for n, (idx, vals) in table.items():
            if n == "embed":
                txn.load_delta("lm_head", idx, vals)      # the tied name
            elif n == "up":                               # rows 2..6 as one run
                patched["up"] = ck1["up"].copy()
                patched["up"][2:6] = ck2["up"][2:6]
                txn.load_delta_runs("up", [8], [16], ck2["up"][2:6].reshape(-1))
            elif n == "q":
                txn.load_delta(n, list(idx), vals)        # a list of ints
            else:
                txn.load_delta(n, idx, vals)
    delta = e.snapshot()
    full_update(e, "v2-full", patched)
    assert e.same(delta)


def test_refusals_change_nothing():
    e = Engine()
    ck1, ck2 = checkpoint(1), checkpoint(2)
    full_update(e, "v1", ck1)
    snap, fp = e.snapshot(), e.model.fingerprint()
    vals = np.ones(3, np.float32)
    cases = [
        ("REFIT_EINVAL", [1, 2, 32], vals, "index 2 (32) is outside the tensor's 32"),
        ("REFIT_EDUPLICATE", [1, 2, 1], vals, "element 1 is given twice"),
        ("REFIT_EMISMATCH", [1, 2, 3], vals.astype(BF16), "values: "),
        ("REFIT_EINVAL", [1.0, 2.0, 3.0], vals, "indices of up: dtype float64"),
    ]
    for status, idx, v, words in cases:
        txn = e.model.begin(version="v2", base="v1")
        txn.load_delta("q", [0], np.ones(1, np.float32))   # bytes written first
        raises(status, lambda: txn.load_delta("up", np.asarray(idx), v), words)
        txn.abort()
        assert e.same(snap) and e.model.fingerprint() == fp, status
        assert e.ctx.version == "v1" and e.ctx.health() == refit.Health.READY
    # a wrong base: refused at begin, nothing written
    raises("REFIT_EMISMATCH", lambda: e.model.begin(version="v3", base="v0"),
           "against base 'v0'", "holds version 'v1'")
    # a declared module that receives nothing: finalize refuses, rolled back
    txn = e.model.begin(version="v2", base="v1", changed=["attn", "moe"])
    txn.load_delta("k", [0, 5], np.array([9, 9], np.float32))
    raises("REFIT_EINCOMPLETE", txn.finalize, "lists module moe", "nothing of it arrived")
    # a module it does not declare
    txn = e.model.begin(version="v2", base="v1", changed=["attn"])
    raises("REFIT_EUNEXPECTED", lambda: txn.load_delta("up", [0], np.ones(1, np.float32)),
           "does not list module mlp")
    txn.abort()
    # not a delta update
    txn = e.model.begin(version="v2")
    raises("REFIT_ESTATE", lambda: txn.load_delta("up", [0], np.ones(1, np.float32)),
           "not a delta update")
    txn.abort()
    assert e.same(snap) and e.model.fingerprint() == fp
    assert e.ctx.version == "v1" and e.ctx.health() == refit.Health.READY


def test_abort_after_half_restores_every_byte():
    e = Engine()
    ck1, ck2 = checkpoint(1), checkpoint(2)
    full_update(e, "v1", ck1)
    snap = e.snapshot()
    with e.model.begin(version="v9") as txn:   # a full update's undo, for scale
        txn.load_dict(ck2)
        full_undo = txn.stats()["undo_host_bytes"]
        txn.abort()
    table, _ = patches(ck1, ck2, 0.03, 5)
    txn = e.model.begin(version="v2", base="v1")
    names = list(table)
    txn.load_deltas({n: table[n] for n in names[: len(names) // 2]})
    undo = txn.stats()["undo_host_bytes"]
    assert 0 < undo <= 4 * sum(len(table[n][0]) for n in names), (undo, full_undo)
    assert undo * 5 < full_undo, (undo, full_undo)
    assert not e.same(snap)
    txn.abort()
    assert e.same(snap) and e.ctx.version == "v1"


def test_whole_model_takes_the_label_and_journal_says_delta():
    path = os.path.join(TMP, "journal.db")
    e = Engine(journal=path)
    ck1, ck2 = checkpoint(1), checkpoint(2)
    full_update(e, "v1", ck1)
    with e.model.update(version="v2", base="v1", changed=["mlp"]) as txn:
        txn.load_delta("up", [0, 1, 2], ck2["up"].reshape(-1)[:3])
        uid = txn.journal_id
    for mod in ("attn", "embed", "mlp", "moe", "norm"):
        assert e.model.module_version(mod) == "v2", mod
    assert e.ctx.version == "v2"
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT state, base_version, delta_elements FROM updates WHERE id = ?",
                         (uid,)).fetchone()
        tensors = db.execute("SELECT name, elements FROM delta_tensors WHERE update_id = ?",
                             (uid,)).fetchall()
    assert row == ("committed", "v1", 3), row
    assert tensors == [("up", 3)], tensors


class OnlineFp8:
    """A block-128 fp8 module quantized online from a bf16 [256, 256]
    weight, and a per-channel one fused from gate and up [128, 128]; with
    delta_master_budget refit keeps their masters."""

    def __init__(self, budget=1 << 24):
        self.ctx = refit.Context(worker_id="py-delta-fp8", journal_path="",
                                 delta_master_budget=budget)
        m = self.model = self.ctx.create_model()
        self.w = np.zeros((256, 256), ml_dtypes.float8_e4m3fn)
        self.s = np.zeros((2, 2), np.float32)
        m.add_module("lin", "fp8", {"scheme": "block128", "online": True})
        m.bind_runtime("lin", "weight", self.w)
        m.bind_runtime("lin", "weight_scale", self.s)
        m.expect("lin", "w.weight", BF16, [256, 256], target="weight")
        self.gu = np.zeros((256, 128), ml_dtypes.float8_e4m3fn)
        self.gus = np.zeros((256,), np.float32)
        m.add_module("mlp", "fp8", {"scheme": "per_channel", "online": True})
        m.bind_runtime("mlp", "weight", self.gu)
        m.bind_runtime("mlp", "weight_scale", self.gus)
        for j, part in enumerate(("gate", "up")):
            m.expect("mlp", "%s.weight" % part, BF16, [128, 128], target="weight",
                     dst_offset=[128 * j, 0])
        m.seal()

    def snapshot(self):
        return [a.view(np.uint8).copy() for a in (self.w, self.s, self.gu, self.gus)]


def online_checkpoint(seed):
    r = np.random.default_rng(seed)
    return {"w.weight": r.standard_normal((256, 256)).astype(BF16),
            "gate.weight": r.standard_normal((128, 128)).astype(BF16),
            "up.weight": r.standard_normal((128, 128)).astype(BF16)}


def test_online_fp8_delta_equals_full_reload():
    """txn.load_delta into online fp8 modules (block-128, fused per-channel)
    patches refit's masters and rebuilds the touched groups: the runtime
    bytes equal a full reload of the patched checkpoint; an abort after
    half the patches restores every byte and the masters."""
    e = OnlineFp8()
    ck1, ck2 = online_checkpoint(1), online_checkpoint(2)
    with e.model.update(version="v1") as txn:
        txn.load_dict(ck1)
    before = e.snapshot()
    table, patched = patches(ck1, ck2, 0.03, 5)
    txn = e.model.begin(version="v2", base="v1")
    txn.load_delta("w.weight", *table["w.weight"])
    assert [a.tobytes() for a in e.snapshot()] != [a.tobytes() for a in before]
    txn.abort()
    assert all(np.array_equal(a, b) for a, b in zip(e.snapshot(), before))
    with e.model.update(version="v2", base="v1") as txn:
        for n, (idx, vals) in table.items():
            txn.load_delta(n, idx, vals)
    assert e.ctx.version == "v2" and e.ctx.health() == refit.Health.READY
    delta = e.snapshot()
    with e.model.update(version="v2-full") as txn:
        txn.load_dict(patched)
    assert all(np.array_equal(a, b) for a, b in zip(e.snapshot(), delta))


def test_online_fp8_refusals():
    """Without a master (budget 0) a patch is refused naming the budget; a
    NaN in a patched block fails the update: bytes, version and health as
    before."""
    e = OnlineFp8(budget=0)
    ck1 = online_checkpoint(1)
    with e.model.update(version="v1") as txn:
        txn.load_dict(ck1)
    before = e.snapshot()
    txn = e.model.begin(version="v2", base="v1")
    raises("REFIT_EUNSUPPORTED", lambda: txn.load_delta("w.weight", [3], np.ones(1, BF16)),
           "module lin", "delta_master_budget is 0", "nothing written")
    txn.abort()
    e = OnlineFp8()
    with e.model.update(version="v1") as txn:
        txn.load_dict(ck1)
    before = e.snapshot()
    txn = e.model.begin(version="v2", base="v1")
    raises("REFIT_ECORRUPT", lambda: txn.load_delta("w.weight", [3, 60000],
                                                    np.array([1, np.nan], BF16)),
           "w.weight (module lin)", "NaN")
    txn.abort()
    assert all(np.array_equal(a, b) for a, b in zip(e.snapshot(), before))
    assert e.ctx.version == "v1" and e.ctx.health() == refit.Health.READY


if __name__ == "__main__":
    sys.exit(harness.run(globals()))
