"""refit.ipc through the Python binding on host memory, without torch or a
GPU (TAP): a forked trainer (Sender, device=None, packed buckets) sends
three updates to this process's Receiver; each commits with the trainer's
bytes and label, and both profiles (Sender.profile, Receiver.profile) have
every phase stamped in order on the clock both processes share. The
socket's mode: 0600 by default under umask 000, socket_mode when given.

usage: py_ipc_host.py BINDINGS_DIR   (env: REFIT_LIB)"""
import ctypes
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, sys.argv[1])
import refit  # noqa: E402
import refit.ipc  # noqa: E402
from refit import torch_util  # noqa: E402

SHAPES = {"a.weight": (4, 3), "b.weight": (5,), "c.weight": (2, 2, 2)}
SEND_PHASES = ("start_ns", "packed_ns", "encoded_ns", "results_ns", "posted_ns", "voted_ns",
               "decided_ns", "end_ns")
RECV_PHASES = ("call_ns", "update_ns", "checked_ns", "begun_ns", "waited_ns", "enqueued_ns",
               "prepared_ns", "voted_ns", "decision_ns", "committed_ns", "result_ns")


class Host:
    """A row-major f32 host buffer that describes itself to refit."""

    def __init__(self, shape, base=0.0):
        self.shape = tuple(shape)
        self.n = 1
        for s in shape:
            self.n *= s
        self.buf = (ctypes.c_float * self.n)()
        self.fill(base)

    def fill(self, base):
        for i in range(self.n):
            self.buf[i] = base + i

    def strides(self):
        out, acc = [], 1
        for s in reversed(self.shape):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))

    def _refit_desc(self):
        return torch_util.Desc(ctypes.addressof(self.buf), 1, 0, (2, 32), self.shape,
                               self.strides(), self)

    def values(self):
        return list(self.buf)


def ordered(prof, keys):
    at = [prof[k] for k in keys]
    return at[0] > 0 and at == sorted(at)


def trainer(path, updates):
    """The child: 0 when every send committed with its profile in order."""
    ctx = refit.Context(worker_id="py-trainer", journal_path="")
    src = {n: Host(s) for n, s in SHAPES.items()}
    with refit.ipc.Sender(ctx, [path], timeout=10, spin=0.001) as s:
        for n, t in src.items():
            s.add(n, t, share=False)
        for v in range(1, updates + 1):
            for k, t in enumerate(src.values()):
                t.fill(100.0 * v + 10 * k)
            s.send(label="v%d" % v)
            p = s.profile()
            if p["seq"] != v or not ordered(p, SEND_PHASES):
                print("# trainer profile of v%d: %s" % (v, p))
                return 3
    ctx.close()
    return 0


def test_three_updates_and_profiles():
    path = os.path.join(tempfile.mkdtemp(prefix="refit-ipc-py-"), "w.sock")
    ctx = refit.Context(worker_id="py-worker", journal_path="")
    m = ctx.create_model()
    rt = {}
    for n, shape in SHAPES.items():
        m.add_module(n)
        rt[n] = Host(shape, -1.0)
        m.bind_runtime(n, "w", rt[n])
        m.expect(n, n, "f32", list(shape))
    m.seal()
    r = refit.ipc.Receiver(m, path, timeout=10, start_timeout=10, spin=0.001)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = trainer(path, 3)
        finally:
            os._exit(code)
    try:
        for v in range(1, 4):
            t0 = time.monotonic_ns()
            res = r.receive_update(rollback=True)
            assert res["decision"] == 0 and res["version_label"] == "v%d" % v, res
            assert ctx.version == "v%d" % v
            for k, (n, t) in enumerate(rt.items()):
                want = [100.0 * v + 10 * k + i for i in range(t.n)]
                assert t.values() == want, (v, n, t.values())
            p = r.profile()
            assert p["seq"] == v and ordered(p, RECV_PHASES), p
            assert p["call_ns"] >= t0 and p["gpu_copy_ms"] == -1 and p["copies_done_ns"] == 0, p
        st = r.stats()
        assert st["updates"] == 3 and st["connections"] == 1 and st["refused"] == 0, st
    finally:
        _, status = os.waitpid(pid, 0)
        r.close()
        ctx.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_socket_mode_and_peer_options():
    """The socket is the owner's alone (0600) whatever the umask, unless
    socket_mode says otherwise; allow_uids and greet_timeout are taken."""
    d = tempfile.mkdtemp(prefix="refit-ipc-py-")
    ctx = refit.Context(worker_id="py-modes", journal_path="")
    m = ctx.create_model()
    m.add_module("a.weight")
    t = Host((2,))
    m.bind_runtime("a.weight", "w", t)
    m.expect("a.weight", "a.weight", "f32", [2])
    m.seal()
    old = os.umask(0)
    try:
        modes = {}
        for name, kw in (("default", {}),
                         ("wide", dict(socket_mode=0o660, allow_uids=[65534], greet_timeout=0.5))):
            path = os.path.join(d, name + ".sock")
            with refit.ipc.Receiver(m, path, **kw):
                modes[name] = os.stat(path).st_mode & 0o777
    finally:
        os.umask(old)
        ctx.close()
    assert modes == {"default": 0o600, "wide": 0o660}, modes


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
