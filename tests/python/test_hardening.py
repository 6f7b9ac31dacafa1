"""The binding against careless use (issue 29, Y1-Y3), on the host backend,
numpy-backed, no torch, no GPU (TAP; every function test_* is one point).

Y1: a handle used after its context was closed or its model destroyed
    raises RefitError REFIT_ESTATE naming what is gone, never reaches freed
    memory. Each case runs in a child process (a use after free there is an
    ASan report or an assertion abort, reported here, not a dead suite).
Y2: one Context from several threads: calls are serialized, an update
    holds the context until it ends, version strings are copied under it.
Y3: a numpy array of non-native byte order is refused, naming the tensor
    and its dtype, on every path (single, batched, runtime, source set).

usage: test_hardening.py   (env: REFIT_LIB, REFIT_SOURCE_ROOT; under a
sanitizer LD_PRELOAD, inherited by the children)"""
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import numpy as np  # noqa: E402

import refit  # noqa: E402
import refit.ipc  # noqa: E402
from refit import transport as tp  # noqa: E402
import harness  # noqa: E402  (tests/python/harness.py)

TMP = tempfile.mkdtemp(prefix="refit-hardening-")
SWAPPED = ">" if sys.byteorder == "little" else "<"   # the byte order that is not native


def world(n=4):
    """A sealed one-module model of n f32 on a fresh context."""
    ctx = refit.Context(worker_id="hardening", journal_path="")
    m = ctx.create_model()
    w = np.zeros((n,), np.float32)
    m.add_module("a")
    m.bind_runtime("a", "w", w)
    m.expect("a", "a", "f32", [n])
    m.seal()
    return ctx, m, w


def estate(fn, *words):
    """fn() raises RefitError REFIT_ESTATE whose message has every word."""
    try:
        fn()
    except refit.RefitError as err:
        assert err.name == "REFIT_ESTATE", "%s, not REFIT_ESTATE: %s" % (err.name, err)
        for w in words:
            assert w in err.message, "%r not in %r" % (w, err.message)
        return err
    raise AssertionError("no RefitError REFIT_ESTATE")


# ---- Y1: cases run in a child (argv: --case NAME) --------------------------

def _gone(how, ctx, m):
    if how == "close":
        ctx.close()
        return "context was closed"
    m.destroy()
    return "model was destroyed"


def case_txn(how, what):
    ctx, m, w = world()
    one = np.ones(4, np.float32)
    txn = m.update(version="v1") if what.startswith("with") else m.begin(version="v1")
    if what.startswith("with"):
        txn.__enter__()
        txn.load("a", one)
    if what == "commit":
        txn.load("a", one)
        txn.prepare()
    why = _gone(how, ctx, m)
    if what == "load":
        estate(lambda: txn.load("a", one), why, "transaction")
    elif what == "load_dict":
        estate(lambda: txn.load_dict({"a": one}), why, "transaction")
    elif what == "finalize":
        estate(txn.finalize, why)
    elif what == "commit":
        estate(txn.commit, why)
    elif what == "abort":
        estate(txn.abort, why)
    elif what == "with":         # leaving the block normally: finalize
        estate(lambda: txn.__exit__(None, None, None), why)
    elif what == "with_error":   # leaving on an exception: that exception goes on
        assert txn.__exit__(KeyError, KeyError("x"), None) is None
    assert txn.result == "aborted", txn.result
    estate(lambda: txn.load("a", one), why)     # and stays so
    assert not w.any(), w


def case_ipc_receiver(how):
    ctx, m, _ = world()
    r = refit.ipc.Receiver(m, os.path.join(TMP, "r-%s-%d.sock" % (how, os.getpid())),
                           timeout=0.2, start_timeout=0.2)
    why = _gone(how, ctx, m)
    estate(r.receive_update, why, "receiver")
    estate(r.stats, why)
    r.close()


def case_ipc_sender():
    # a worker waits in receive_update (its own thread and context) so that
    # the trainer's sender connects and is greeted
    wctx, wm, _ = world()
    path = os.path.join(TMP, "w-%d.sock" % os.getpid())
    r = refit.ipc.Receiver(wm, path, timeout=1, start_timeout=30)
    got = []

    def worker():
        try:
            got.append(r.receive_update())
        except refit.RefitError as err:
            got.append(err)
    th = threading.Thread(target=worker)
    th.start()
    ctx = refit.Context(worker_id="trainer", journal_path="")
    s = refit.ipc.Sender(ctx, [path], timeout=1)
    s.add("a", np.ones(4, np.float32), share=False)
    ctx.close()
    estate(s.send, "context was closed", "sender")
    estate(lambda: s.add("b", np.ones(4, np.float32)), "context was closed")
    s.close()
    th.join()
    assert len(got) == 1 and isinstance(got[0], refit.RefitError), got
    r.close()
    wctx.close()


def case_transport(how):
    ctx, m, _ = world()
    with tp.Loopback(2) as g:
        x = tp.Transport.loopback(ctx, g, 1, timeout=0.2)
        rx = tp.Receiver(m, x)
        tctx = refit.Context(worker_id="trainer", journal_path="")
        x0 = tp.Transport.loopback(tctx, g, 0, timeout=0.2)
        s = tp.Sender(x0, label="v")
        s.add("a", np.ones(4, np.float32))
        why = _gone(how, ctx, m)
        estate(rx.receive_update, why, "receiver")
        if how == "close":
            estate(lambda: x.rank, why, "transport")
        tctx.close()
        estate(s.send, "context was closed", "sender")
        estate(lambda: x0.rank, "context was closed", "transport")
        rx.close()
        x.close()
        s.close()
        x0.close()


def case_source_set(how):
    ctx, m, w = world()
    src = {"a": np.ones(4, np.float32)}
    ss = m.source_set(src)
    txn = m.begin(version="v1")
    why = _gone(how, ctx, m)
    estate(lambda: txn.load_set(ss), why)
    estate(lambda: ss.repoint(), why, "source set")
    ss.close()
    assert not w.any(), w


CASES = {"%s_%s" % (how, what): (lambda how=how, what=what: case_txn(how, what))
         for how in ("close", "destroy")
         for what in ("load", "load_dict", "finalize", "commit", "abort", "with", "with_error")}
CASES.update({"%s_ipc_receiver" % how: (lambda how=how: case_ipc_receiver(how))
              for how in ("close", "destroy")})
CASES["close_ipc_sender"] = case_ipc_sender
CASES.update({"%s_transport" % how: (lambda how=how: case_transport(how))
              for how in ("close", "destroy")})
CASES.update({"%s_source_set" % how: (lambda how=how: case_source_set(how))
              for how in ("close", "destroy")})


def run_child(args, timeout=120):
    p = subprocess.run([sys.executable, os.path.abspath(__file__)] + args,
                       capture_output=True, text=True, timeout=timeout)
    tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-12:])
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), \
        "child %s: exit %d\n%s" % (" ".join(args), p.returncode, tail)


def test_y1_handles_after_close_or_destroy():
    failed = []
    for name in CASES:
        try:
            run_child(["--case", name])
        except AssertionError as err:
            failed.append("%s: %s" % (name, err))
    assert not failed, "%d of %d cases failed:\n%s" % (len(failed), len(CASES),
                                                        "\n".join(failed))


def case_new_model():
    """The context outlives a destroyed model: a new model, a new update."""
    ctx, m, _ = world()
    txn = m.begin(version="v1")
    m.destroy()
    estate(lambda: txn.load("a", np.ones(4, np.float32)), "model was destroyed")
    m2 = ctx.create_model()      # the context goes on: a new model, a new update
    w = np.zeros((2,), np.float32)
    m2.add_module("b")
    m2.bind_runtime("b", "w", w)
    m2.expect("b", "b", "f32", [2])
    m2.seal()
    with m2.update(version="v2") as t2:
        t2.load("b", np.full(2, 3, np.float32))
    assert ctx.version == "v2" and (w == 3).all(), (ctx.version, w)
    ctx.close()
    estate(lambda: m2.begin(), "context was closed")


CASES["destroy_then_new_model"] = case_new_model


# ---- Y2 -------------------------------------------------------------------

def case_threads():
    """Two threads updating one context, one reading its health and
    versions: every update commits, every version read is one committed."""
    ctx, m, w = world(64)
    n = int(os.environ.get("REFIT_HARDENING_ITERS", "150"))
    committed, seen, errors = set(), [], []
    stop = threading.Event()

    def updater(k):
        try:
            for i in range(n):
                label = "t%d-%d" % (k, i)
                if i % 2:
                    with m.update(version=label) as txn:
                        txn.load("a", np.full(64, k * 1000 + i, np.float32))
                else:
                    txn = m.begin(version=label)
                    txn.load_dict({"a": np.full(64, k * 1000 + i, np.float32)})
                    txn.finalize()
                committed.add(label)
        except Exception as err:  # noqa: BLE001 (reported below)
            errors.append("updater %d: %r" % (k, err))

    def reader():
        while not stop.is_set():
            try:
                v, mv, h = ctx.version, m.module_version("a"), ctx.health()
                seen.append((v, mv, h))
            except Exception as err:  # noqa: BLE001
                errors.append("reader: %r" % err)
                return
    ths = [threading.Thread(target=updater, args=(k,)) for k in (1, 2)]
    rd = threading.Thread(target=reader)
    rd.start()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    stop.set()
    rd.join()
    assert not errors, errors
    assert len(committed) == 2 * n, len(committed)
    bad = [s for s in seen if (s[0] is not None and s[0] not in committed)
           or (s[1] is not None and s[1] not in committed)]
    assert not bad, "versions never committed were read: %r" % bad[:5]
    assert len(seen) > 0
    last = ctx.version
    k, i = map(int, last[1:].split("-"))
    assert (w == k * 1000 + i).all(), (last, w[:4])
    ctx.close()


CASES["threads"] = case_threads


def test_y2_one_context_from_three_threads():
    run_child(["--case", "threads"], timeout=300)


def test_y2_an_update_holds_the_context_until_it_ends():
    # a second thread's begin waits for the first thread's update to end;
    # the thread that holds the update may begin none other (refused)
    ctx, m, w = world()
    txn = m.begin(version="a")
    order = []

    def second():
        with m.update(version="b") as t2:
            t2.load("a", np.full(4, 2, np.float32))
        order.append("b committed")
    th = threading.Thread(target=second)
    th.start()
    th.join(0.3)
    assert th.is_alive() and not order, "the second update did not wait"
    estate(lambda: m.begin(version="again"), "open")
    txn.load("a", np.ones(4, np.float32))
    order.append("a loaded")
    txn.finalize()
    th.join(30)
    assert order == ["a loaded", "b committed"] and ctx.version == "b", (order, ctx.version)
    assert (w == 2).all(), w
    ctx.close()


def begin_in_thread(fn, limit=10.0):
    """fn() (a begin) on a daemon thread, joined for at most limit seconds:
    (what it returned or raised, seconds it took); AssertionError when it
    is still waiting (a begin that would hang forever)."""
    out = []

    def run():
        t0 = time.monotonic()
        try:
            out.append(fn())
        except Exception as err:    # noqa: BLE001 (handed to the test)
            out.append(err)
        out.append(time.monotonic() - t0)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit)
    assert not th.is_alive(), "begin still waiting after %.0f s: it hangs" % limit
    return out[0], out[1]


def test_y2_a_leaked_update_times_out_naming_its_thread():
    # a thread that began an update and exited without ending it: another
    # thread's begin waits at most the context's begin_wait, then says
    # which update, which thread and since when; the context goes on
    ctx, m, w = world()
    ctx.begin_wait = 0.5
    leaked, gone = [], threading.Event()

    def leaker():
        leaked.append(m.begin(version="v-leak"))
        gone.wait()     # never ends it
    th = threading.Thread(target=leaker, name="leaker")
    th.start()
    while not leaked:
        time.sleep(0.01)
    for exited in (False, True):
        if exited:
            gone.set()
            th.join()
        err, took = begin_in_thread(lambda: m.begin(version="next"))
        assert isinstance(err, refit.RefitError) and err.name == "REFIT_ETIMEDOUT", err
        for word in ("waited 0.5 s", "'v-leak'", "thread 'leaker'", "open since", "s ago"):
            assert word in err.message, (word, err.message)
        assert ("which has exited" in err.message) == exited, err.message
        assert 0.5 <= took < 5, took
    assert ctx.health() == refit.Health.UPDATING    # the leaked update is still open
    # per call: wait= (0: at once)
    err, took = begin_in_thread(lambda: m.update(version="n2", wait=0).journal_id)
    assert err.name == "REFIT_ETIMEDOUT" and took < 0.5, (err, took)
    leaked[0].abort()
    assert ctx.health() != refit.Health.UPDATING
    txn = m.begin(version="mine")
    err, _ = begin_in_thread(lambda: m.begin(version="other", wait=0.2))
    assert err.name == "REFIT_ETIMEDOUT" and "'mine'" in err.message, err
    assert "MainThread" in err.message and "exited" not in err.message, err.message
    txn.abort()
    txn, took = begin_in_thread(lambda: m.begin(version="free", wait=0.2))
    assert isinstance(txn, refit.Txn) and txn.result is None, txn
    txn.abort()
    for bad in (-1, "1", True):
        try:
            m.begin(version="x", wait=bad)
            raise AssertionError("begin(wait=%r) accepted" % (bad,))
        except ValueError as e:
            assert "wait" in str(e), e
    assert ctx.health() != refit.Health.UPDATING and ctx.version is None
    ctx.close()
    try:
        refit.Context(journal_path="", begin_wait=-2)
        raise AssertionError("Context(begin_wait=-2) accepted")
    except ValueError as e:
        assert "begin_wait" in str(e), e


# ---- Y3 -------------------------------------------------------------------

def einval(fn, *words):
    try:
        fn()
    except refit.RefitError as err:
        assert err.name == "REFIT_EINVAL", "%s, not REFIT_EINVAL: %s" % (err.name, err)
        for w in words:
            assert w in str(err), "%r not in %r" % (w, str(err))
        return err
    raise AssertionError("no RefitError REFIT_EINVAL")


def test_y3_non_native_byte_order_refused_everywhere():
    ctx, m, w = world()
    swapped = np.arange(4, dtype=SWAPPED + "f4")
    ds = swapped.dtype.str
    txn = m.begin(version="v1", keep_going=True)
    einval(lambda: txn.load("a", swapped), "a", ds, "byte order")
    einval(lambda: txn.load_part("a", 0, swapped), "a", ds)
    einval(lambda: txn.load_dict({"a": swapped}), "a", ds, "byte order")
    mixed = {"a": np.arange(4, dtype=np.float32), "x.b": np.arange(2, dtype=SWAPPED + "i4")}
    einval(lambda: txn.load_dict(mixed), "x.b", mixed["x.b"].dtype.str)   # before any name check
    txn.abort()
    assert not w.any(), w
    einval(lambda: m.source_set({"a": swapped}), "a", ds)
    ctx2 = refit.Context(journal_path="")
    m2 = ctx2.create_model()
    m2.add_module("n")
    einval(lambda: m2.bind_runtime("n", "w", np.zeros(4, SWAPPED + "f4")), "n/w", ds)
    try:
        m2.expect("n", "n", np.dtype(SWAPPED + "f4"), [4])
        raise AssertionError("a non-native dtype was expected")
    except TypeError as err:
        assert ds in str(err), str(err)
    ctx2.close()
    # the same values in native order go through, written as the numbers
    with m.update(version="v2") as t2:
        t2.load("a", swapped.astype("=f4"))
    assert np.array_equal(w, np.arange(4, dtype=np.float32)), w
    with m.update(version="v3") as t3:       # '<f4' spelled out on a little-endian host
        t3.load_dict({"a": np.full(4, 7, dtype=np.dtype("f4").newbyteorder("="))})
    assert (w == 7).all(), w
    ctx.close()


def test_y3_describe_names_the_dtype():
    # describe() itself (no tensor name to give): TypeError with the dtype
    # str; one-byte and native dtypes, spelled any way, go through
    for dt in ("|u1", "u1", "=f4", "f4", "<f4" if sys.byteorder == "little" else ">f4"):
        assert refit.describe(np.zeros(2, dt)).t.dtype.bits in (8, 32), dt
    for dt in (SWAPPED + "f4", SWAPPED + "i8", SWAPPED + "f2"):
        try:
            refit.describe(np.zeros(2, dt))
            raise AssertionError("%s described" % dt)
        except TypeError as err:
            assert np.dtype(dt).str in str(err) and "byte order" in str(err), str(err)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        CASES[sys.argv[2]]()
        print("OK", flush=True)
        return 0
    return harness.run(globals())


if __name__ == "__main__":
    sys.exit(main())
