"""Patches over refit.ipc through the Python binding on host memory, no
torch, no GPU (TAP): a forked trainer sends Sender.add_delta patches (the
index and the run form) for two steps, each committed by this process's
Receiver.receive_update(base=...) with exactly the patched bytes; a third
step's index past its tensor (an untrusted trainer) is refused on both
sides, bytes, version and health unchanged.

usage: py_ipc_delta_host.py BINDINGS_DIR   (env: REFIT_LIB)"""
import ctypes
import os
import sys
import tempfile
import traceback

sys.path.insert(0, sys.argv[1])
import refit  # noqa: E402
import refit.ipc  # noqa: E402
from refit import torch_util  # noqa: E402


class Host:
    """A row-major f32 host buffer that describes itself to refit."""

    def __init__(self, shape, base=0.0):
        self.shape = tuple(shape)
        self.n = 1
        for s in shape:
            self.n *= s
        self.buf = (ctypes.c_float * self.n)()
        for i in range(self.n):
            self.buf[i] = base + i

    def _refit_desc(self):
        strides, acc = [], 1
        for s in reversed(self.shape):
            strides.append(acc)
            acc *= s
        return torch_util.Desc(ctypes.addressof(self.buf), 1, 0, (2, 32), self.shape,
                               tuple(reversed(strides)), self)

    def values(self):
        return list(self.buf)


def trainer(path):
    """The child: 0 when steps 1 and 2 commit and step 3 is refused."""
    ctx = refit.Context(worker_id="py-delta-trainer", journal_path="")
    code = 0
    with refit.ipc.Sender(ctx, [path], timeout=10, spin=0.001) as s:
        s.add_delta("a.weight", [0, 5, 11], Host((3,), 50.0))
        s.add_delta("b.weight", [2], Host((1,), 70.0))
        s.send(label="v1")
        s.add_delta("a.weight", [3], Host((6,), 80.0), counts=[6])   # rows 1 and 2
        s.send(label="v2")
        s.add_delta("b.weight", [1, 5], Host((2,), 90.0))            # b has 5 elements
        try:
            s.send(label="v3")
            code = 3
        except refit.RefitError as err:
            if "is outside" not in err.message:
                print("# trainer: %s" % err)
                code = 4
    ctx.close()
    return code


def test_patches_then_a_refused_one():
    path = os.path.join(tempfile.mkdtemp(prefix="refit-ipc-delta-py-"), "w.sock")
    ctx = refit.Context(worker_id="py-delta-worker", journal_path="")
    m = ctx.create_model()
    rt = {"a.weight": Host((4, 3), -1.0), "b.weight": Host((5,), -1.0)}
    for n, t in rt.items():
        m.add_module(n)
        m.bind_runtime(n, "w", t)
        m.expect(n, n, "f32", list(t.shape))
    m.seal()
    with m.update(version="v0") as txn:
        txn.load("a.weight", Host((4, 3), 0.0))
        txn.load("b.weight", Host((5,), 0.0))
    r = refit.ipc.Receiver(m, path, timeout=10, start_timeout=10, spin=0.001)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = trainer(path)
        finally:
            os._exit(code)
    try:
        a, b = [float(i) for i in range(12)], [float(i) for i in range(5)]
        res = r.receive_update(base="v0")
        a[0], a[5], a[11], b[2] = 50.0, 51.0, 52.0, 70.0
        assert res["decision"] == 0 and ctx.version == "v1", res
        assert rt["a.weight"].values() == a and rt["b.weight"].values() == b
        r.receive_update(base="v1")
        a[3:9] = [80.0 + i for i in range(6)]
        assert ctx.version == "v2" and rt["a.weight"].values() == a
        try:
            r.receive_update(base="v2")
            raise AssertionError("a patch past its tensor was taken")
        except refit.RefitError as err:
            assert "index 1 (5) is outside" in err.message, err.message
        assert rt["a.weight"].values() == a and rt["b.weight"].values() == b
        assert ctx.version == "v2" and ctx.health() == refit.Health.READY
    finally:
        _, status = os.waitpid(pid, 0)
        r.close()
        ctx.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    print("1..%d" % len(tests))
    bad = 0
    for i, (n, f) in enumerate(tests, 1):
        try:
            f()
            print("ok %d - %s" % (i, n))
        except Exception:
            bad += 1
            print("not ok %d - %s" % (i, n))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
        sys.stdout.flush()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
