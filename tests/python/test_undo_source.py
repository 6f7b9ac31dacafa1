"""Undo sources from Python on the host backend (update(undo_source=...),
docs/core.md "Undo sources"): numpy-backed, no torch, no GPU (TAP; every
function test_* is one test point). An update after one loaded from
safetensors files keeps no undo log: its abort reloads the files, fp8
quantized online again, and every byte and the version come back; a file
changed since falls back to the undo log; a snapshot serves too; the
journal and refitctl show which source served each update.

usage: test_undo_source.py   (env: REFIT_LIB, the build's librefit.so;
REFIT_SOURCE_ROOT, the checkout; REFIT_BUILD_ROOT, the build)"""
import json
import os
import shutil
import struct
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

TMP = tempfile.mkdtemp(prefix="refit-undosrc-")
REFITCTL = os.path.join(os.environ.get("REFIT_BUILD_ROOT", ""), "tools", "refitctl")
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(BF16): "BF16"}


class Engine:
    """An f32 MLP weight and a projection quantized online to fp8 from
    BF16 (per-channel scales), journaled."""

    def __init__(self, journal):
        self.up = np.zeros((8, 8), np.float32)
        self.q = np.zeros((16, 32), E4M3)
        self.q_scale = np.zeros((16,), np.float32)
        self.ctx = refit.Context(worker_id="py-undo", journal_path=journal)
        m = self.model = self.ctx.create_model()
        m.add_module("mlp")
        m.bind_runtime("mlp", "w", self.up)
        m.expect("mlp", "up", "f32", [8, 8])
        m.add_module("q", "fp8", {"scheme": "per_channel", "online": True})
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


def write_checkpoint(seed, name):
    """A safetensors file of the engine's checkpoint, version seed."""
    r = np.random.default_rng(seed)
    tensors = {"up": r.standard_normal((8, 8)).astype(np.float32),
               "q.weight": r.standard_normal((16, 32)).astype(BF16)}
    header, blobs, off = {}, [], 0
    for k, a in tensors.items():
        b = a.tobytes()
        header[k] = {"dtype": ST_DTYPES[a.dtype], "shape": list(a.shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def refitctl(*args):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([REFITCTL] + list(args), capture_output=True, text=True, env=env,
                          check=True)


def updates(journal):
    return json.loads(refitctl("journal", "updates", "--json", "--db", journal).stdout)["updates"]


class Boom(Exception):
    pass


def abort_update(e, path, version, **kw):
    """An update of version from path that the engine abandons; the undo
    bytes it had saved."""
    saved = None
    try:
        with e.model.update(version=version, **kw) as txn:
            txn.load_safetensors(path)
            saved = txn.stats()["undo_host_bytes"]
            raise Boom()
    except Boom:
        pass
    return saved


def test_files_serve_the_abort():
    journal = os.path.join(TMP, "files.db")
    e = Engine(journal)
    a1, a2 = write_checkpoint(1, "a1.safetensors"), write_checkpoint(2, "a2.safetensors")
    with e.model.update(version="v1") as txn:
        txn.load_safetensors(a1)
    v1 = e.arrays()
    assert abort_update(e, a2, "v2") == 0  # no undo log
    assert e.same(v1)                      # fp8 bytes and scales re-quantized equal
    assert np.any(v1["q"] != 0)
    assert e.ctx.version == "v1" and e.ctx.health() == refit.Health.READY
    rows = updates(journal)
    assert rows[0]["undo_source"] == "undo-log", rows[0]
    assert rows[1]["undo_source"] == "files file://" + os.path.realpath(a1), rows[1]
    assert rows[1]["state"] == "rolled_back" and rows[1]["undo_host_bytes"] == 0, rows[1]
    table = refitctl("journal", "updates", "--db", journal).stdout
    assert "files" in table.splitlines()[-1], table
    shown = refitctl("journal", "show", str(rows[1]["id"]), "--db", journal).stdout
    assert "undo source" in shown and "a1.safetensors" in shown, shown
    e.ctx.close()


def test_changed_file_keeps_the_undo_log():
    journal = os.path.join(TMP, "changed.db")
    e = Engine(journal)
    b1, b2 = write_checkpoint(1, "b1.safetensors"), write_checkpoint(2, "b2.safetensors")
    with e.model.update(version="v1") as txn:
        txn.load_safetensors(b1)
    v1 = e.arrays()
    write_checkpoint(3, "b1.safetensors")   # replaced since the commit
    raises("REFIT_EUNSUPPORTED", lambda: e.model.begin("v2", undo_source="files"),
           "b1.safetensors", "nothing written")
    assert e.ctx.health() == refit.Health.READY
    assert abort_update(e, b2, "v2") > 0
    assert e.same(v1)
    last = updates(journal)[-1]
    assert last["undo_source"].startswith("undo-log; passed over files"), last
    assert last["undo_host_bytes"] > 0, last
    try:
        e.model.begin("v2", undo_source="sometimes")
        raise AssertionError("undo_source='sometimes' accepted")
    except ValueError as err:
        assert "undo_source" in str(err), err
    e.ctx.close()


def test_snapshot_serves_the_abort():
    journal = os.path.join(TMP, "snap.db")
    e = Engine(journal)
    c2 = write_checkpoint(2, "c2.safetensors")
    with e.model.update(version="v1") as txn:
        r = np.random.default_rng(1)
        txn.load_dict({"up": r.standard_normal((8, 8)).astype(np.float32),
                       "q.weight": r.standard_normal((16, 32)).astype(BF16)})
    snap = os.path.join(TMP, "snap-v1")
    e.model.snapshot(snap)
    v1 = e.arrays()
    assert abort_update(e, c2, "v2") == 0
    assert e.same(v1) and e.ctx.version == "v1"
    assert updates(journal)[-1]["undo_source"] == "snapshot snapshot://" + snap
    abort_update(e, c2, "v2", undo_source="off")
    assert e.ctx.health() == refit.Health.POISONED
    assert updates(journal)[-1]["undo_source"] == "none"
    e.ctx.close()


if __name__ == "__main__":
    try:
        sys.exit(harness.run(globals()))
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
