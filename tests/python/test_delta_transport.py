"""Patches over the NCCL transport from Python, on a Loopback group (no
GPU, numpy): Sender.add_delta next to Sender.add, Receiver.receive_update
(base=) commits the bytes load_deltas gives; a patch the model refuses
(an index out of range from the trainer, an untrusted peer) fails the
update on both sides with bytes, version and health unchanged (TAP).

usage: test_delta_transport.py   (env: REFIT_LIB, REFIT_SOURCE_ROOT)"""
import os
import sys
import threading

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import numpy as np  # noqa: E402

import refit  # noqa: E402
from refit import transport as tp  # noqa: E402
import harness  # noqa: E402  (tests/python/harness.py)


class Engine:
    """Two f32 modules: a [6, 4] weight and a [4] norm."""

    def __init__(self):
        self.w = np.zeros((6, 4), np.float32)
        self.n = np.zeros((4,), np.float32)
        self.ctx = refit.Context(worker_id="py-delta-nccl", journal_path="")
        m = self.model = self.ctx.create_model()
        m.add_module("lin")
        m.bind_runtime("lin", "w", self.w)
        m.expect("lin", "w", "f32", [6, 4])
        m.add_module("norm")
        m.bind_runtime("norm", "w", self.n)
        m.expect("norm", "n", "f32", [4])
        m.seal()
        r = np.random.default_rng(1)
        self.v1 = {"w": r.standard_normal((6, 4)).astype(np.float32),
                   "n": r.standard_normal(4).astype(np.float32)}
        with self.model.update(version="v1") as txn:
            txn.load_dict(self.v1)

    def snapshot(self):
        return self.w.copy(), self.n.copy()


def step(e, patches, whole=None):
    """One update over a Loopback group: patches (name -> (indices,
    values[, counts])) and whole tensors; (sender's, receiver's) result
    or RefitError."""
    out = {}
    tctx = refit.Context(worker_id="trainer", journal_path="")
    with tp.Loopback(2) as g:
        x0 = tp.Transport.loopback(tctx, g, 0, timeout=30)
        x1 = tp.Transport.loopback(e.ctx, g, 1, timeout=30)
        rx = tp.Receiver(e.model, x1)
        s = tp.Sender(x0, label="v2")
        for name, p in patches.items():
            s.add_delta(name, p[0], p[1], *p[2:])
        for name, t in (whole or {}).items():
            s.add(name, t)

        def send():
            try:
                out["send"] = s.send()
            except refit.RefitError as err:
                out["send"] = err
        th = threading.Thread(target=send)
        th.start()
        try:
            out["recv"] = rx.receive_update(base="v1")
        except refit.RefitError as err:
            out["recv"] = err
        th.join()
        s.close()
        rx.close()
        x0.close()
        x1.close()
    tctx.close()
    return out["send"], out["recv"]


def test_patches_and_whole_tensors():
    e = Engine()
    vals = np.array([7.0, 8.0, 9.0], np.float32)
    run = np.arange(8, dtype=np.float32)          # rows 2..3 of w
    n2 = np.array([1.5, 2.5, 3.5, 4.5], np.float32)
    sent, got = step(e, {"w": ([1, 22, 3], vals)}, {"n": n2})
    assert sent["decision"] == 0 and got["version_label"] == "v2", (sent, got)
    want = e.v1["w"].copy().reshape(-1)
    want[[1, 22, 3]] = vals
    assert np.array_equal(e.w.reshape(-1), want) and np.array_equal(e.n, n2)
    assert e.ctx.version == "v2" and e.ctx.health() == refit.Health.READY
    e2 = Engine()
    sent, got = step(e2, {"w": ([8], run, [8])})  # the run form; n unchanged
    assert sent["decision"] == 0, sent
    want = e2.v1["w"].copy()
    want[2:4] = run.reshape(2, 4)
    assert np.array_equal(e2.w, want) and np.array_equal(e2.n, e2.v1["n"])


def test_peer_index_out_of_range_refused():
    e = Engine()
    before = e.snapshot()
    sent, got = step(e, {"w": ([1, 24], np.ones(2, np.float32))})  # w has 24 elements
    assert isinstance(sent, refit.RefitError) and isinstance(got, refit.RefitError), (sent, got)
    assert "index 1 (24) is outside" in got.message, got.message
    assert all(np.array_equal(a, b) for a, b in zip(e.snapshot(), before))
    assert e.ctx.version == "v1" and e.ctx.health() == refit.Health.READY


def test_sender_refuses_a_bad_patch():
    e = Engine()
    tctx = refit.Context(worker_id="trainer", journal_path="")
    with tp.Loopback(2) as g:
        s = tp.Sender(tp.Transport.loopback(tctx, g, 0, timeout=5), label="v2")
        err = harness.raises("REFIT_EINVAL", lambda: s.add_delta("w", [1, 2],
                                                                 np.ones(3, np.float32)),
                             "3 values for 2 elements")
        assert "w" in err.message
        harness.raises("REFIT_EINVAL", lambda: s.add_delta("w", [-1], np.ones(1, np.float32)),
                       "index 0 is -1 (negative)")
        s.add_delta("w", [1], np.ones(1, np.float32))
        harness.raises("REFIT_EEXIST", lambda: s.add("w", e.v1["w"]), "added twice")
        s.close()
    tctx.close()


if __name__ == "__main__":
    sys.exit(harness.run(globals()))
