"""Snapshots and restore from Python on the host backend (model.snapshot,
model.restore, ctx.verify_snapshot; refitctl snapshot and journal):
numpy-backed, no torch, no GPU (TAP; every function test_* is one test
point). A worker process killed with SIGKILL and restarted restores its
fp8 weights (quantized online from BF16) bit-equal; another TP rank, a
damaged file are refused with bytes, version and health unchanged; the
journal and refitctl show the restore and its source.

usage: test_snapshot.py   (env: REFIT_LIB, the build's librefit.so;
REFIT_SOURCE_ROOT, the checkout; REFIT_BUILD_ROOT, the build)"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import refit  # noqa: E402
import harness  # noqa: E402  (tests/python/harness.py)
from harness import raises  # noqa: E402

TMP = tempfile.mkdtemp(prefix="refit-snapshot-")
REFITCTL = os.path.join(os.environ.get("REFIT_BUILD_ROOT", ""), "tools", "refitctl")
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


class Engine:
    """Rank `rank` of 2: an MLP weight sharded on dim 0 (f32) and a
    projection quantized online to fp8 from BF16 (per-tensor scale)."""

    def __init__(self, rank=0, journal=""):
        self.up = np.zeros((4, 8), np.float32)
        self.q = np.zeros((16, 32), E4M3)
        self.q_scale = np.zeros((1,), np.float32)
        self.ctx = refit.Context(worker_id="py-snap", journal_path=journal)
        m = self.model = self.ctx.create_model()
        m.add_module("mlp")
        m.bind_runtime("mlp", "w", self.up)
        m.expect("mlp", "up", "f32", [8, 8], shard=(0, rank, 2))
        m.add_module("q", "fp8", {"scheme": "per_tensor", "online": True})
        m.bind_runtime("q", "weight", self.q)
        m.bind_runtime("q", "weight_scale", self.q_scale)
        m.expect("q", "q.weight", BF16, [16, 32], target="weight")
        m.seal()

    def arrays(self):
        return {"up": self.up.copy(), "q": self.q.view(np.uint8).copy(),
                "q_scale": self.q_scale.copy()}

    def same(self, arrays):
        now = self.arrays()
        return all(np.array_equal(now[k], v) for k, v in arrays.items())

    def close(self):
        self.ctx.close()


def refitctl(*args, check=False):
    """refitctl with the build's own sanitizer runtime, if any: the one
    preloaded into python for librefit would clash with it."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([REFITCTL] + list(args), capture_output=True, text=True, env=env,
                          check=check)


def checkpoint(seed):
    r = np.random.default_rng(seed)
    return {"up": r.standard_normal((8, 8)).astype(np.float32),
            "q.weight": r.standard_normal((16, 32)).astype(BF16)}


def update(e, seed, version):
    with e.model.update(version=version) as txn:
        txn.load_dict(checkpoint(seed))


def snapshot(name, rank=0):
    """A worker at v2, snapshotted to TMP/name; its arrays."""
    e = Engine(rank)
    update(e, 1, "v1")
    update(e, 2, "v2")
    path = os.path.join(TMP, name)
    e.model.snapshot(path)
    arrays = e.arrays()
    e.close()
    return path, arrays


CHILD = r"""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
import numpy as np
import test_snapshot as t
e = t.Engine(0, sys.argv[2])
t.update(e, 1, "v1")
t.update(e, 2, "v2")
e.model.snapshot(sys.argv[3])
np.savez(sys.argv[4], **e.arrays())
print("ready", flush=True)
time.sleep(600)
"""


def test_sigkill_restart_restores_bit_equal():
    journal = os.path.join(TMP, "kill.db")
    snap = os.path.join(TMP, "kill-snap")
    before = os.path.join(TMP, "kill-before.npz")
    child = subprocess.Popen([sys.executable, "-c", CHILD, os.path.abspath(__file__), journal,
                              snap, before], stdout=subprocess.PIPE, env=os.environ)
    try:
        line = child.stdout.readline()
        assert line.strip() == b"ready", line
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL, child.returncode
    e = Engine(0, journal)
    assert e.ctx.health() == refit.Health.EMPTY
    e.model.restore(snap)
    assert e.ctx.health() == refit.Health.READY
    assert e.ctx.version == "v2"
    want = dict(np.load(before))
    assert e.same(want)
    assert np.any(want["q"] != 0)   # fp8 bytes, as the killed worker's post-load left them
    e.close()
    # the journal: the killed worker's snapshot, the restore and its source
    out = refitctl("journal", "updates", "--json", "--db", journal, check=True)
    rows = json.loads(out.stdout)["updates"]
    last = rows[-1]
    assert last["mode"] == "restore" and last["state"] == "committed", last
    assert last["source_uri"] == "snapshot://" + os.path.realpath(snap), last
    assert [r["mode"] for r in rows] == ["normal", "normal", "restore"], rows
    out = refitctl("journal", "events", "--json", "--db", journal, check=True)
    kinds = [ev["kind"] for ev in json.loads(out.stdout)["events"]]
    assert "snapshot" in kinds and "restore" in kinds, kinds


def test_update_after_restore_equals_cold_start():
    path, _ = snapshot("update-snap")
    e = Engine(0)
    e.model.restore(path)
    update(e, 3, "v3")
    cold = Engine(0)
    update(cold, 3, "v3")
    assert e.same(cold.arrays())
    e.close()
    cold.close()


def test_another_rank_refused_nothing_written():
    path, _ = snapshot("rank-snap", rank=0)
    e = Engine(1)
    update(e, 1, "v1")
    keep = e.arrays()
    raises("REFIT_EMISMATCH", lambda: e.model.restore(path), "plan signature differs",
           "shard.rank", "snapshot 0, this worker 1", "nothing written")
    assert e.same(keep)
    assert e.ctx.version == "v1" and e.ctx.health() == refit.Health.READY
    e.close()


def test_damaged_snapshot_refused_and_verify_says_so():
    path, _ = snapshot("good-snap")
    ctx = refit.Context(journal_path="")
    ctx.verify_snapshot(path)
    bad = os.path.join(TMP, "bad-snap")
    subprocess.run(["cp", "-r", path, bad], check=True)
    f = os.path.join(bad, "runtime.safetensors")
    data = bytearray(open(f, "rb").read())
    data[-1] ^= 1
    open(f, "wb").write(bytes(data))
    raises("REFIT_ECORRUPT", lambda: ctx.verify_snapshot(bad), "module", "the manifest recorded")
    e = Engine(0)
    update(e, 1, "v1")
    keep = e.arrays()
    raises("REFIT_ECORRUPT", lambda: e.model.restore(bad), "nothing written")
    assert e.same(keep) and e.ctx.version == "v1"
    e.close()
    # refitctl agrees, and shows the good one
    r = refitctl("snapshot", "verify", bad)
    assert r.returncode == 1 and "the manifest recorded" in r.stderr, r
    r = refitctl("snapshot", "verify", path)
    assert r.returncode == 0 and r.stdout.startswith("ok: "), r
    r = refitctl("snapshot", "show", path, check=True)
    assert "version      v2" in r.stdout and "fp8" in r.stdout, r.stdout
    r = refitctl("snapshot", "show", "--json", path, check=True)
    man = json.loads(r.stdout)
    assert man["version"] == "v2"
    assert [m["name"] for m in man["signature"]["modules"]] == ["mlp", "q"]
    assert man["signature"]["modules"][1]["params"] == {"scheme": "per_tensor",
                                                        "online": "true"}
    ctx.close()


def test_snapshot_needs_ready_and_a_new_path():
    e = Engine(0)
    path = os.path.join(TMP, "empty-snap")
    raises("REFIT_ESTATE", lambda: e.model.snapshot(path), "EMPTY")
    update(e, 1, "v1")
    os.mkdir(path)
    raises("REFIT_EEXIST", lambda: e.model.snapshot(path), "exists")
    e.close()


if __name__ == "__main__":
    try:
        sys.exit(harness.run(globals()))
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
