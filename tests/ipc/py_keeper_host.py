"""refit.keeper through the Python binding on host memory (TAP), no torch,
no GPU: a forked keeper (its runtime tensors in a Pool, following the
trainer) and a forked trainer (refit.ipc.Sender to the keeper alone, v1
then v2); this process's fresh worker restores v2 from the keeper with
the trainer's bytes and label, journaled with source keeper://PATH, and
an update aborted with the keeper as its undo source goes back to v2; a
worker of another shape is refused naming the difference, nothing
written; Keeper.stats counts what it served.

usage: py_keeper_host.py BINDINGS_DIR   (env: REFIT_LIB)"""
import ctypes
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, sys.argv[1])
import refit  # noqa: E402
import refit.ipc  # noqa: E402
import refit.keeper  # noqa: E402
from refit import torch_util  # noqa: E402

SHAPES = {"a.weight": (4, 3), "b.weight": (5,), "c.weight": (2, 2, 2)}


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


def register(m, make, shapes=SHAPES):
    out = {}
    for n, shape in shapes.items():
        m.add_module(n)
        out[n] = make(shape)
        m.bind_runtime(n, "w", out[n])
        m.expect(n, n, "f32", list(shape))
    m.seal()
    return out


def keeper_main(serve, follow):
    ctx = refit.Context(worker_id="py-keeper", journal_path="")
    pool = refit.keeper.Pool(ctx, 1 << 16)
    m = ctx.create_model()
    register(m, lambda shape: pool.tensor(shape, "f32"))
    k = refit.keeper.Keeper(m, serve, pool=pool, follow=follow, follow_timeout=10, timeout=10)
    k.run(30)
    return 0


def trainer_main(follow):
    ctx = refit.Context(worker_id="py-trainer", journal_path="")
    src = {n: Host(s) for n, s in SHAPES.items()}
    with refit.ipc.Sender(ctx, [follow], timeout=10) as s:
        for n, t in src.items():
            s.add(n, t, share=False)
        for v in (1, 2):
            for k, t in enumerate(src.values()):
                for i in range(t.n):
                    t.buf[i] = 100.0 * v + 10 * k + i
            s.send(label="v%d" % v)
    ctx.close()
    return 0


def fork(fn, *args):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = fn(*args)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def test_restore_from_keeper():
    d = tempfile.mkdtemp(prefix="refit-keeper-py-")
    serve, follow = os.path.join(d, "k.sock"), os.path.join(d, "f.sock")
    keeper = fork(keeper_main, serve, follow)
    try:
        trainer = fork(trainer_main, follow)
        _, st = os.waitpid(trainer, 0)
        assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, st
        journal = os.path.join(d, "w.db")
        ctx = refit.Context(worker_id="py-worker", journal_path=journal)
        m = ctx.create_model()
        rt = register(m, lambda shape: Host(shape, -1.0))
        m.restore("keeper://" + serve)  # Model.restore hands keeper:// to refit.keeper
        assert ctx.version == "v2", ctx.version
        for k, (n, t) in enumerate(rt.items()):
            assert t.values() == [200.0 + 10 * k + i for i in range(t.n)], (n, t.values())
        # the keeper as the next update's undo source: an abort puts v2 back
        refit.keeper.arm_undo(m, serve, timeout=10)  # it holds v2, byte for byte
        try:
            with m.update("v9", undo_source="keeper") as t:
                for n, shape in SHAPES.items():
                    t.load(n, Host(shape, 900.0))
                raise KeyError("abandon v9")
        except KeyError:
            pass
        assert ctx.version == "v2", ctx.version
        for k, (n, t) in enumerate(rt.items()):
            assert t.values() == [200.0 + 10 * k + i for i in range(t.n)], (n, t.values())
        db = sqlite3.connect(journal)
        rows = db.execute("SELECT count(*) FROM updates WHERE state = 'committed' AND "
                          "source_uri = ?", ("keeper://" + serve,)).fetchone()[0]
        db.close()
        assert rows == 1, rows
        ctx.close()

        # another shape: refused before anything is written
        ctx = refit.Context(worker_id="py-other", journal_path="")
        m = ctx.create_model()
        other = dict(SHAPES, **{"b.weight": (6,)})
        rt = register(m, lambda shape: Host(shape, -1.0), other)
        try:
            refit.keeper.restore(m, serve, timeout=10)
            raise AssertionError("a restore of another signature was not refused")
        except refit.RefitError as e:
            assert "plan signature differs" in str(e) and "nothing written" in str(e), str(e)
        assert all(v == -1.0 + i for t in rt.values() for i, v in enumerate(t.values()))
        assert ctx.health() == refit.core.Health.EMPTY, ctx.health()
        ctx.close()
    finally:
        os.kill(keeper, signal.SIGTERM)
        os.waitpid(keeper, 0)


def test_keeper_stats_in_process():
    d = tempfile.mkdtemp(prefix="refit-keeper-py-")
    ctx = refit.Context(worker_id="py-keeper", journal_path="")
    pool = refit.keeper.Pool(ctx, 1 << 16)
    m = ctx.create_model()
    register(m, lambda shape: pool.tensor(shape, "f32"))
    with refit.keeper.Keeper(m, os.path.join(d, "k.sock"), pool=pool) as k:
        st = k.stats()
        assert not st["servable"] and "no committed version" in st["why_not"], st
        t0 = time.monotonic()
        k.run(0.05)
        assert time.monotonic() - t0 < 5
    ctx.close()
    pool.close()


MANIFEST = """kind: model
name: keeper-tool-test
modules:
  - name: a
    format: unquantized
    runtime:
      - {name: w, dtype: f32, shape: [4, 3]}
    checkpoint:
      - {name: a.weight, dtype: f32, shape: [4, 3], target: w}
"""


def manifest_worker(yaml, wid):
    ctx = refit.Context(worker_id=wid, journal_path="")
    m = ctx.create_model()
    m.load_manifest(yaml)
    w = Host((4, 3), -1.0)
    m.bind_runtime("a", "w", w)
    m.seal()
    return ctx, m, w


def test_keeper_tool_from_snapshot():
    """refit-keeper --model --snapshot --serve: a worker restores from it."""
    tool = os.environ.get("REFIT_KEEPER")
    if not tool:
        print("# skip: REFIT_KEEPER unset")
        return
    d = tempfile.mkdtemp(prefix="refit-keeper-tool-")
    yaml, snap, sock = (os.path.join(d, n) for n in ("m.yaml", "snap", "k.sock"))
    with open(yaml, "w") as f:
        f.write(MANIFEST)
    ctx, m, _ = manifest_worker(yaml, "py-snap")
    with m.update("v7") as t:
        t.load("a.weight", Host((4, 3), 7.0))
    m.snapshot(snap)
    ctx.close()
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)  # a sanitizer's runtime is linked into the tool itself
    p = subprocess.Popen([tool, "--model", yaml, "--snapshot", snap, "--serve", sock,
                          "--for", "30"], stderr=subprocess.PIPE, env=env)
    try:
        ctx, m, w = manifest_worker(yaml, "py-restored")
        refit.keeper.restore(m, "keeper://" + sock, timeout=20)
        assert ctx.version == "v7", ctx.version
        assert w.values() == [7.0 + i for i in range(12)], w.values()
        ctx.close()
    finally:
        p.terminate()
        err = p.communicate()[1].decode(errors="replace")
    assert "serving version v7" in err, err


def main():
    tests = [test_restore_from_keeper, test_keeper_stats_in_process,
             test_keeper_tool_from_snapshot]
    print("1..%d" % len(tests))
    failed = 0
    for i, t in enumerate(tests, 1):
        try:
            t()
            print("ok %d - %s" % (i, t.__name__))
        except Exception:
            failed += 1
            print("not ok %d - %s" % (i, t.__name__))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
