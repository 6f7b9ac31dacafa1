"""Delta files from Python (refit.write_delta_file, txn.load_delta_file,
docs/delta-file.md) on the host backend, numpy only (TAP; every function
test_* is one test point). Loading a written file gives the bytes
load_deltas gives; model.update() takes base, version and source from the
file; a flipped byte, a file cut short and another base are refused with
bytes, version and health unchanged; a failed update is replayed from
its file (model.replay).

usage: test_delta_file.py   (env: REFIT_LIB, the build's librefit.so;
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

TMP = tempfile.mkdtemp(prefix="refit-delta-file-")
BF16 = ml_dtypes.bfloat16


class Engine:
    """A fused qkv (f32) and a bf16 norm cast to f32."""

    def __init__(self, journal=""):
        self.qkv = np.zeros((12, 4), np.float32)
        self.norm = np.zeros((4,), np.float32)
        self.ctx = refit.Context(worker_id="py-delta-file", journal_path=journal)
        m = self.model = self.ctx.create_model()
        m.add_module("attn")
        m.bind_runtime("attn", "w", self.qkv)
        for name, rows, off in (("q", 8, 0), ("k", 2, 8), ("v", 2, 10)):
            m.expect("attn", name, np.float32, [rows, 4], dst_offset=[off, 0])
        m.add_module("norm", params={"cast": True})
        m.bind_runtime("norm", "w", self.norm)
        m.expect("norm", "norm", BF16, [4])
        m.seal()

    def snapshot(self):
        return self.qkv.copy(), self.norm.copy()

    def same(self, snap):
        return np.array_equal(self.qkv, snap[0]) and np.array_equal(self.norm, snap[1])


def checkpoint(seed):
    r = np.random.default_rng(seed)
    ck = {n: r.standard_normal((rows, 4)).astype(np.float32)
          for n, rows in (("q", 8), ("k", 2), ("v", 2))}
    ck["norm"] = r.standard_normal(4).astype(BF16)
    return ck


def table(ck2):
    """q: three elements; k: rows 0..2 as one run; norm: one element."""
    return {"q": (np.array([30, 2, 17]), ck2["q"].reshape(-1)[[30, 2, 17]]),
            "k": (np.array([0]), np.array([8]), ck2["k"].reshape(-1)),
            "norm": ([3], ck2["norm"][3:4])}


def at_v1(journal=""):
    e = Engine(journal)
    with e.model.update(version="v1") as txn:
        txn.load_dict(checkpoint(1))
    return e


def patched_bytes(t):
    e = at_v1()
    with e.model.update(version="v2", base="v1") as txn:
        txn.load_deltas(t)
    return e.snapshot()


def write(e, path, t, base="v1", version="v2"):
    refit.write_delta_file(e.ctx, path, t, base=base, version=version)


def test_file_equals_rows_and_update_takes_base_from_file():
    t = table(checkpoint(2))
    want = patched_bytes(t)
    journal = os.path.join(TMP, "j1.db")
    e = at_v1(journal)
    path = os.path.join(TMP, "a.delta.safetensors")
    write(e, path, t)
    with e.model.update() as txn:      # base, version and source from the file
        txn.load_delta_file(path)
    assert e.same(want)
    assert e.ctx.version == "v2" and e.ctx.health() == refit.Health.READY
    with sqlite3.connect(journal) as db:
        row = db.execute("SELECT base_version, source_uri, state FROM updates "
                         "WHERE version = 'v2'").fetchone()
    assert row == ("v1", "file://" + path, "committed"), row


def refused(e, before, path, status, *words, base="v1", version="v2"):
    txn = e.model.begin(version=version, base=base)
    raises(status, lambda: txn.load_delta_file(path), *words)
    txn.abort()
    assert e.same(before)
    assert e.ctx.version == "v1" and e.ctx.health() == refit.Health.READY


def test_refusals_leave_everything():
    e = at_v1()
    before = e.snapshot()
    path = os.path.join(TMP, "b.delta.safetensors")
    write(e, path, table(checkpoint(2)))
    other = os.path.join(TMP, "b0.delta.safetensors")
    write(e, other, table(checkpoint(2)), base="v0")
    refused(e, before, other, "REFIT_EMISMATCH", "the file patches base 'v0', the update's "
            "base is 'v1'")
    refused(e, before, path, "REFIT_EMISMATCH", "makes version 'v2', the update is 'v9'",
            version="v9")
    data = bytearray(open(path, "rb").read())
    flipped = os.path.join(TMP, "flipped.delta.safetensors")
    data[-1] ^= 0x40                      # the last value written: norm's bf16
    open(flipped, "wb").write(bytes(data))
    refused(e, before, flipped, "REFIT_ECORRUPT", "tensor norm: checksum mismatch",
            "nothing written")
    cut = os.path.join(TMP, "cut.delta.safetensors")
    open(cut, "wb").write(bytes(data[:-5]))
    refused(e, before, cut, "REFIT_ECORRUPT", "data-size")


def test_index_out_of_range_refused_by_the_model():
    e = at_v1()
    before = e.snapshot()
    path = os.path.join(TMP, "c.delta.safetensors")
    write(e, path, {"v": ([3, 8], np.ones(2, np.float32))})     # v has 8 elements
    refused(e, before, path, "REFIT_EINVAL", "row 0 (v)", "index 1 (8) is outside")


def test_writer_refuses():
    e = at_v1()
    path = os.path.join(TMP, "d.delta.safetensors")
    raises("REFIT_EDUPLICATE", lambda: write(e, path, [("q", ([1], np.ones(1, np.float32))),
                                                        ("q", ([2], np.ones(1, np.float32)))]),
           "rows 0 and 1 patch the same tensor")
    raises("REFIT_EMISMATCH", lambda: write(e, path, {"q": ([1, 2], np.ones(3, np.float32))}),
           "3 values for 2 elements")
    assert not os.path.exists(path)


def test_replay_from_file():
    journal = os.path.join(TMP, "j2.db")
    e = at_v1(journal)
    t = table(checkpoint(2))
    want = patched_bytes(t)
    before = e.snapshot()
    path = os.path.join(TMP, "e.delta.safetensors")
    write(e, path, t)
    txn = e.model.update()
    txn.load_delta_file(path)
    uid = txn.journal_id
    txn.abort()
    assert e.same(before) and e.ctx.version == "v1"
    e.model.replay(uid)
    assert e.same(want)
    assert e.ctx.version == "v2" and e.ctx.health() == refit.Health.READY


if __name__ == "__main__":
    sys.exit(harness.run(globals()))
