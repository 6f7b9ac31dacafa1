"""The Python binding on the host backend, numpy-backed, no torch, no GPU
(TAP; every function test_* is one test point).

usage: test_binding.py   (env: REFIT_LIB, the build's librefit.so;
REFIT_SOURCE_ROOT, the checkout; REFIT_PROJECT_VERSION, meson's)"""
import json
import os
import sqlite3
import sys
import tempfile

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import refit  # noqa: E402
from refit import tensors  # noqa: E402
import harness  # noqa: E402  (tests/python/harness.py)
from harness import raises  # noqa: E402

TMP = tempfile.mkdtemp(prefix="refit-pytest-")


class Engine:
    """A toy engine: a fused qkv, a tied embedding/head, an MLP weight and
    an f32 norm filled from a bf16 checkpoint (cast), all numpy arrays."""

    def __init__(self, journal=""):
        self.qkv = np.zeros((12, 4), np.float32)   # q 8 rows, k 2, v 2
        self.embed = np.zeros((6, 4), np.float32)  # lm_head is tied to it
        self.up = np.zeros((4, 4), np.float32)
        self.norm = np.zeros((4,), np.float32)
        self.ctx = refit.Context(worker_id="py-host", journal_path=journal)
        m = self.model = self.ctx.create_model()
        m.add_module("qkv")
        m.bind_runtime("qkv", "w", self.qkv)
        for i, (name, rows) in enumerate([("q", 8), ("k", 2), ("v", 2)]):
            m.expect("qkv", name, np.float32, [rows, 4], dst_offset=[[0, 8, 10][i], 0])
        m.add_module("embed")
        m.bind_runtime("embed", "w", self.embed)
        m.expect("embed", "embed", "f32", [6, 4])
        m.expect("embed", "lm_head", "f32", [6, 4], tie_of="embed")
        m.add_module("up")
        m.bind_runtime("up", "w", self.up)
        m.expect("up", "up", np.dtype("float32"), [4, 4])
        m.add_module("norm", params={"cast": True})
        m.bind_runtime("norm", "w", self.norm)
        m.expect("norm", "norm", ml_dtypes.bfloat16, [4])
        m.seal()

    def snapshot(self):
        return {k: getattr(self, k).copy() for k in ("qkv", "embed", "up", "norm")}

    def same(self, snap):
        return all(np.array_equal(getattr(self, k), v) for k, v in snap.items())


def checkpoint(seed):
    r = np.random.default_rng(seed)
    f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    return {"q": f(8, 4), "k": f(2, 4), "v": f(2, 4), "embed": f(6, 4), "up": f(4, 4),
            "norm": f(4).astype(ml_dtypes.bfloat16)}


def expect_holds(e, ck):
    assert np.array_equal(e.qkv, np.concatenate([ck["q"], ck["k"], ck["v"]])), "qkv"
    assert np.array_equal(e.embed, ck["embed"]), "embed"
    assert np.array_equal(e.up, ck["up"]), "up"
    assert np.array_equal(e.norm, ck["norm"].astype(np.float32)), "norm"


def journal_row(path, uid):
    with sqlite3.connect(path) as db:
        return db.execute("SELECT state, source_uri, source_digest, error, mode, replay_of "
                          "FROM updates WHERE id = ?", (uid,)).fetchone()


class DLPackOnly:
    """Exposes only the DLPack protocol of a numpy array (as CuPy or JAX
    would); legacy=True: the pre-1.0 __dlpack__ without max_version."""

    def __init__(self, a, legacy=False):
        self.a, self.legacy = a, legacy

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, stream=None, max_version=None, **kw):
        if self.legacy:
            if max_version is not None:
                raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
            return self.a.__dlpack__()
        return self.a.__dlpack__(max_version=max_version)


# ---- tests -------------------------------------------------------------

def test_version_is_meson_project_version():
    assert refit.__version__ == os.environ["REFIT_PROJECT_VERSION"], refit.__version__


def test_register_numpy_update_and_commit():
    e = Engine()
    assert e.ctx.health() == refit.Health.EMPTY
    st = e.model.stats()
    assert st["modules"] == 4 and st["runtime_tensors"] == 4 and st["ckpt_tensors"] == 7, st
    ptrs = {k: getattr(e, k).ctypes.data for k in ("qkv", "embed", "up", "norm")}
    ck = checkpoint(1)
    with e.model.update(version="v1") as txn:
        txn.load_dict(dict(ck, lm_head=ck["embed"]))
        assert e.ctx.health() == refit.Health.UPDATING
        # 7 delivered: lm_head, tied to embed, is accepted and not written
        # again (one storage, one write), as refit_load counts it
        assert txn.stats()["tensors_loaded"] == 7, txn.stats()
    assert txn.result == "committed"
    assert e.ctx.health() == refit.Health.READY and e.ctx.version == "v1"
    e.ctx.check_serving()
    expect_holds(e, ck)
    assert ptrs == {k: getattr(e, k).ctypes.data for k in ptrs}


def test_strided_and_bf16_sources():
    e = Engine()
    ck = checkpoint(2)
    up_t = np.ascontiguousarray(ck["up"].T)
    with e.model.update(version="v") as txn:
        txn.load_dict({k: v for k, v in ck.items() if k != "up"})
        txn.load("up", up_t.T)  # a transposed view: element strides (1, 4)
    expect_holds(e, ck)


def test_fingerprints():
    a, b = Engine(), Engine()
    ck = checkpoint(3)
    for e in (a, b):
        before = e.model.fingerprint()
        with e.model.update(version="v") as txn:
            txn.load_dict(ck)
        assert e.model.fingerprint() != before
    assert a.model.fingerprint() == b.model.fingerprint()
    assert a.model.fingerprint("up") == b.model.fingerprint("up", "w")
    assert a.model.fingerprint("up") != a.model.fingerprint("qkv")
    c = Engine()
    with c.model.update(version="v") as txn:
        txn.load_dict(dict(ck, up=ck["up"] + 1))
    assert c.model.fingerprint("up") != a.model.fingerprint("up")
    assert c.model.fingerprint("qkv") == a.model.fingerprint("qkv")
    raises("REFIT_ENOTFOUND", lambda: a.model.fingerprint("nope"), "nope")


def test_journaled_module_fingerprints():
    path = os.path.join(TMP, "fp.db")
    e = Engine(journal=path)
    with e.model.update(version="v", fingerprint=True) as txn:
        txn.load_dict(checkpoint(4))
        uid = txn.journal_id
    assert uid > 0
    e.ctx.close()
    with sqlite3.connect(path) as db:
        fps = dict(db.execute("SELECT name, fingerprint FROM modules WHERE update_id = ?",
                              (uid,)).fetchall())
    assert set(fps) == {"qkv", "embed", "up", "norm"} and all(fps.values()), fps


def test_abort_restores_and_poison_without_rollback():
    e = Engine()
    ck = checkpoint(5)
    with e.model.update(version="a") as txn:
        txn.load_dict(ck)
    snap = e.snapshot()
    txn = e.model.begin(version="b")
    txn.load_dict(checkpoint(6))
    assert not e.same(snap)
    assert txn.abort() is True and txn.result == "aborted"
    assert e.same(snap) and e.ctx.health() == refit.Health.READY and e.ctx.version == "a"
    # an exception inside the block aborts, and the bytes are restored
    try:
        with e.model.update(version="c") as txn:
            txn.load_dict(checkpoint(7))
            raise KeyError("engine failed")
    except KeyError:
        pass
    assert txn.result == "aborted" and e.same(snap) and e.ctx.version == "a"
    txn = e.model.begin(version="d", rollback=False)
    txn.load("up", checkpoint(8)["up"])
    assert txn.abort("trainer gone") is False
    assert e.ctx.health() == refit.Health.POISONED
    raises("REFIT_EPOISONED", e.ctx.check_serving)


def test_two_phase_commit():
    e = Engine()
    ck = checkpoint(9)
    txn = e.model.begin(version="p1")
    txn.load_dict(ck)
    txn.prepare()
    assert txn.prepared and e.ctx.health() == refit.Health.UPDATING
    txn.commit()
    assert txn.result == "committed" and e.ctx.version == "p1"
    expect_holds(e, ck)
    snap = e.snapshot()
    # prepared, then the group decides to abort: restored
    txn = e.model.begin(version="p2")
    txn.load_dict(checkpoint(10))
    txn.prepare()
    assert txn.abort("rank 3 failed its prepare")
    assert e.same(snap) and e.ctx.version == "p1"
    # prepare refuses an incomplete module and ends the update
    txn = e.model.begin(version="p3")
    txn.load("q", checkpoint(11)["q"])
    raises("REFIT_EINCOMPLETE", txn.prepare, "qkv")
    assert txn.result == "failed" and e.same(snap) and e.ctx.health() == refit.Health.READY
    raises("REFIT_ESTATE", txn.commit, "not prepared")
    # inside a with block, a prepared txn commits on exit
    with e.model.update(version="p4") as txn:
        txn.load_dict(ck)
        txn.prepare()
    assert e.ctx.version == "p4"


def test_errors_raise_refit_error_with_message():
    e = Engine()
    ck = checkpoint(12)
    with e.model.update(version="v") as txn:
        txn.load_dict(ck)
    snap = e.snapshot()
    # keep_going: each refusal leaves the update open (by default the first
    # one fails it closed, checked below)
    txn = e.model.begin(version="bad", keep_going=True)
    raises("REFIT_EUNEXPECTED", lambda: txn.load("model.nope", ck["up"]), "model.nope")
    raises("REFIT_EMISMATCH", lambda: txn.load("up", np.zeros((4, 5), np.float32)), "up")
    raises("REFIT_EMISMATCH", lambda: txn.load("up", ck["up"].astype(np.float16)), "up")
    txn.load("up", ck["up"])
    err = raises("REFIT_EDUPLICATE", lambda: txn.load("up", ck["up"]), "up")
    assert str(err).startswith("load up: REFIT_EDUPLICATE: "), str(err)
    assert err.status == -7 and refit.status_name(-7) == "REFIT_EDUPLICATE"
    assert refit.strerror(-7) == "tensor delivered twice"
    txn.abort()
    assert e.same(snap)
    try:
        txn.load("up", ck["up"])
        raise AssertionError("a load after abort went through")
    except refit.RefitError as err:
        assert err.name == "REFIT_ESTATE" and "ended" in err.message
    txn = e.model.begin(version="closed")
    raises("REFIT_EUNEXPECTED", lambda: txn.load("model.nope", ck["up"]), "keep_going")
    raises("REFIT_ESTATE", lambda: txn.load("up", ck["up"]), "failed earlier")
    txn.abort()
    assert e.same(snap) and e.model.ctx.version == "v"
    raises("REFIT_ESTATE", lambda: e.model.add_module("x"), "sealed")
    ro = np.zeros((4,), np.float32)
    ro.flags.writeable = False
    c = refit.Context(journal_path="")
    m = c.create_model()
    raises("REFIT_ENOTFOUND", lambda: m.add_module("x", "no-such-format"), "no-such-format")
    m.add_module("n")
    raises("REFIT_EINVAL", lambda: m.bind_runtime("n", "w", ro), "read-only")
    try:
        refit.describe(object())
        raise AssertionError("an object became a tensor")
    except TypeError as err:
        assert "object" in str(err)
    assert refit.dtype_name(ml_dtypes.bfloat16) == "bf16"
    assert refit.refit_dtype(np.float32) == (2, 32) and refit.refit_dtype("float8_e4m3fn") == (10, 8)


def safetensors_bytes(ck):
    """One safetensors file of a name -> numpy array mapping (F32, BF16)."""
    header, data, off = {}, [], 0
    for name in sorted(ck):
        v = np.ascontiguousarray(ck[name])
        b = v.tobytes()
        header[name] = {"dtype": {"float32": "F32", "bfloat16": "BF16"}[v.dtype.name],
                        "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        data.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(data)


def write_checkpoint(path, ck):
    with open(path, "wb") as f:
        f.write(safetensors_bytes(ck))


def test_failed_safetensors_update_replays():
    path = os.path.join(TMP, "replay.db")
    e = Engine(journal=path)
    ck1, ck2 = checkpoint(13), checkpoint(14)
    with e.model.update(version="v1") as txn:
        txn.load_dict(ck1)
    snap = e.snapshot()
    f = os.path.join(TMP, "step-2.safetensors")
    write_checkpoint(f, ck2)
    try:
        with e.model.update(version="v2") as txn:
            txn.load_safetensors(f)
            raise RuntimeError("rank 1 lost its trainer")
    except RuntimeError:
        pass
    uid = txn.journal_id  # known after the update ended
    assert e.same(snap) and e.ctx.version == "v1"
    src = e.ctx.open_source(f)
    ident, uri = src.identity(), src.uri
    assert src.durable and uri == "file://" + os.path.abspath(f)
    assert ident.startswith("file-id:") and len(ident) == 72, ident
    assert len(src) == 6 and ("up", (4, 4), 64) in src.tensors()
    src.close()
    state, s_uri, s_digest, error, _, _ = journal_row(path, uid)
    assert (state, s_uri, s_digest) == ("rolled_back", uri, ident), (state, s_uri, s_digest)
    assert "rank 1 lost its trainer" in (error or ""), error
    e.model.replay(uid)
    assert e.ctx.health() == refit.Health.READY and e.ctx.version == "v2"
    expect_holds(e, ck2)
    with sqlite3.connect(path) as db:
        (rid,) = db.execute("SELECT max(id) FROM updates").fetchone()
    assert journal_row(path, rid)[4:] == ("replay", uid)
    # a file that changed since is refused, naming it, and nothing moves
    snap2 = e.snapshot()
    try:
        with e.model.update(version="v3") as txn:
            txn.load_safetensors(f)
            uid3 = txn.journal_id
            raise RuntimeError("again")
    except RuntimeError:
        pass
    write_checkpoint(f, checkpoint(15))
    raises("REFIT_ECORRUPT", lambda: e.model.replay(uid3), "rewritten, touched or replaced", f)
    assert e.same(snap2) and e.ctx.version == "v2"


def test_identity_refuses_a_touched_file_and_digest_reads_bytes():
    """The default records the files' identity: the same bytes with a new
    mtime are refused at replay; digest=True records the SHA-256, which
    still replays a file whose bytes are the same."""
    path = os.path.join(TMP, "ident.db")
    e = Engine(journal=path)
    ck = checkpoint(21)
    f = os.path.join(TMP, "step-id.safetensors")
    write_checkpoint(f, ck)
    ids = {}
    for digest in (False, True):
        try:
            with e.model.update(version="d%d" % digest) as txn:
                txn.load_safetensors(f, digest=digest)
                ids[digest] = txn.journal_id
                raise RuntimeError("lost")
        except RuntimeError:
            pass
    with e.ctx.open_source(f) as src:
        sha, ident = src.digest(), src.identity()
    assert journal_row(path, ids[False])[2] == ident
    assert journal_row(path, ids[True])[2] == sha and len(sha) == 64
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    with e.ctx.open_source(f) as src:
        assert src.identity() != ident and src.digest() == sha
    snap = e.snapshot()
    raises("REFIT_ECORRUPT", lambda: e.model.replay(ids[False]), "identity", f)
    assert e.same(snap)
    e.model.replay(ids[True])
    expect_holds(e, ck)
    with e.ctx.open_source_memory(safetensors_bytes(ck), label="mem") as src:
        raises("REFIT_EUNSUPPORTED", src.identity, "memory")


def test_memory_source_is_not_durable():
    path = os.path.join(TMP, "mem.db")
    e = Engine(journal=path)
    ck = checkpoint(16)
    buf = safetensors_bytes({k: v for k, v in ck.items() if k != "norm"})
    with e.ctx.open_source_memory(buf, label="from-trainer") as src:
        assert not src.durable and len(src) == 5
        txn = e.model.begin(version="m", source_uri=src.uri)
        txn.load_source(src)
        txn.load("norm", ck["norm"])
        uid = txn.journal_id
        txn.finalize()
    expect_holds(e, ck)
    # the same bytes from a writable buffer, read in place, then aborted
    ba = bytearray(safetensors_bytes({k: v for k, v in checkpoint(17).items() if k != "norm"}))
    src = refit.Source.from_memory(e.ctx, ba, "ba")
    txn = e.model.begin(version="m2", source_uri=src.uri)
    txn.load_source(src)
    uid2 = txn.journal_id
    txn.abort()
    src.close()
    expect_holds(e, ck)
    raises("REFIT_EUNSUPPORTED", lambda: e.model.replay(uid2), "not durable")
    raises("REFIT_ESTATE", lambda: e.model.replay(uid), "committed")


def test_dlpack_objects():
    e = Engine()
    ck = checkpoint(18)
    with e.model.update(version="d") as txn:
        for name, v in ck.items():  # numpy exports no bfloat16 through DLPack
            txn.load(name, v if name == "norm" else DLPackOnly(v, legacy=(name == "k")))
    expect_holds(e, ck)
    # a runtime tensor through DLPack, and the capsule released with the model
    w = np.zeros((3, 5), np.float32)
    refs = sys.getrefcount(w)
    c = refit.Context(journal_path="")
    m = c.create_model()
    m.add_module("w")
    m.bind_runtime("w", "w", DLPackOnly(w))
    m.expect("w", "w", "f32", [3, 5])
    m.seal()
    assert sys.getrefcount(w) > refs  # held by the capsule refit reads
    src = np.arange(15, dtype=np.float32).reshape(3, 5)
    with m.update(version="1") as txn:
        txn.load("w", DLPackOnly(src[:, ::-1].copy()[:, ::-1]))
    assert np.array_equal(w, src)
    d = tensors.describe(DLPackOnly(src))
    assert (d.t.ndim, d.t.shape[0], d.t.shape[1], d.t.dtype.code) == (2, 3, 5, 2)
    ro = src.copy()
    ro.flags.writeable = False
    assert tensors.describe(DLPackOnly(ro)).readonly
    m.destroy()
    c.close()
    del d, txn
    assert sys.getrefcount(w) == refs, (sys.getrefcount(w), refs)


def test_load_dict_rows_of_numpy_and_dlpack():
    """load_dict's table over numpy arrays (read a batch at a time),
    objects with only __dlpack__ (1.x capsules read a batch at a time, 0.x
    ones described one by one), a negative-strided view (its first element
    is not where its memory starts) and mixes of them: every update holds
    the checkpoint's values."""
    from refit import _batch
    e = Engine()
    for seed, wrap in enumerate([
            lambda k, a: a,                                             # numpy
            lambda k, a: a[::-1, ::-1].copy()[::-1, ::-1] if k == "up" else a,  # a view
            lambda k, a: a if k == "norm" else DLPackOnly(a),           # 1.x capsules
            lambda k, a: a if k == "norm" else DLPackOnly(a, legacy=k == "q"),  # and a 0.x
            lambda k, a: DLPackOnly(a) if k in ("k", "embed") else a]):  # mixed
        ck = checkpoint(40 + seed)
        src = {k: wrap(k, v) for k, v in ck.items()}
        with e.model.update(version="v%d" % seed) as txn:
            txn.load_dict(src)
        expect_holds(e, ck)
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(5)]
    t = _batch.Table(["n%d" % i for i in range(5)], arrays)
    assert list(t._rows[0::6]) == [a.ctypes.data for a in arrays], "data pointers"
    d = refit.describe(arrays[0]).t
    assert t._rows[2] & 0xFFFFFFFF == d.ndim and t._rows[2] >> 32 == (
        d.dtype.code | d.dtype.bits << 8 | d.dtype.lanes << 16), hex(t._rows[2])
    caps = [DLPackOnly(a) for a in arrays]
    t = _batch.Table(["n%d" % i for i in range(5)], caps)
    assert t._caps is not None and list(t._rows[0::6]) == [a.ctypes.data for a in arrays]


def test_journal_best_effort_and_log():
    lines = []
    bad = os.path.join(TMP, "no-such-dir", "j.db")
    e = Engine(journal=bad)
    raises("REFIT_EJOURNAL", lambda: e.model.begin(version="x"), "no-such-dir")
    assert e.ctx.health() == refit.Health.EMPTY
    ctx = refit.Context(journal_path=bad, journal_best_effort=True,
                        plugin_dirs=[os.path.join(TMP, "no-plugins-here")],
                        log=lambda level, msg: lines.append((level, msg)))
    assert any("no-plugins-here" in msg for _, msg in lines), lines
    a = one_update(ctx, 2)
    assert ctx.version == "1" and np.array_equal(a, np.ones(2))


def test_module_versions_after_a_partial_update():
    e = Engine()
    ck = checkpoint(1)
    with e.model.update(version="v1") as txn:
        txn.load_dict(ck)
    with e.model.update(version="v2", partial=True) as txn:
        txn.load("up", checkpoint(2)["up"])
    assert [e.model.module_version(m) for m in ("qkv", "embed", "up", "norm")] == \
        ["v1", "v1", "v2", "v1"]
    assert e.model.module_version("no-such-module") is None
    # an aborted update without rollback leaves up holding its bytes: no version
    txn = e.model.begin(version="v3", rollback=False, partial=True)
    txn.load("up", checkpoint(3)["up"])
    txn.abort()
    assert e.model.module_version("up") is None and e.model.module_version("qkv") == "v1"


def test_journal_behind_while_another_writer_holds_the_lock():
    # the end record of an update that committed waits while the journal
    # is locked (a 2 s busy timeout), and is written by the next begin
    path = os.path.join(TMP, "behind.db")
    e = Engine(journal=path)
    ck = checkpoint(1)
    with e.model.update(version="v1") as txn:
        txn.load_dict(ck)
    assert not e.ctx.journal_behind
    txn = e.model.begin(version="v2")
    txn.load_dict(checkpoint(2))
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    try:
        txn.finalize()
        assert e.ctx.version == "v2"
        assert e.ctx.journal_behind
    finally:
        db.execute("ROLLBACK")
        db.close()
    uid = txn.journal_id
    assert journal_row(path, uid)[0] != "committed", journal_row(path, uid)
    with e.model.update(version="v3") as txn:
        txn.load_dict(checkpoint(3))
    assert not e.ctx.journal_behind
    assert journal_row(path, uid)[0] == "committed", journal_row(path, uid)


def test_loopback_sender_to_receiver():
    # a trainer and an engine in one process, one thread each: the update
    # arrives whole and commits; a bad tensor aborts the group and leaves
    # the engine's bytes and version as they were
    import threading
    from refit import transport as tp
    e = Engine()
    tctx = refit.Context(worker_id="trainer", journal_path="")
    with tp.Loopback(2) as g:
        x0, x1 = tp.Transport.loopback(tctx, g, 0, timeout=30), \
            tp.Transport.loopback(e.ctx, g, 1, timeout=30)
        assert (x0.rank, x0.nranks, x1.rank) == (0, 2, 1)
        rx = tp.Receiver(e.model, x1)
        out = {}

        def step(ck, label):
            s = tp.Sender(x0, label=label)
            for k, v in ck.items():
                s.add(k, v)

            def send():
                try:
                    out["send"] = s.send()
                except refit.RefitError as err:
                    out["send"] = err
            th = threading.Thread(target=send)
            th.start()
            try:
                out["recv"] = rx.receive_update()
            except refit.RefitError as err:
                out["recv"] = err
            th.join()
            s.close()
        ck = checkpoint(4)
        step(ck, "step-1")
        assert out["send"]["decision"] == 0 and out["recv"]["version_label"] == "step-1", out
        expect_holds(e, ck)
        assert e.ctx.version == "step-1"
        snap = e.snapshot()
        bad = dict(checkpoint(5), up=np.zeros((5, 4), np.float32))
        step(bad, "step-2")
        assert isinstance(out["send"], refit.RefitError), out
        assert isinstance(out["recv"], refit.RefitError) and "up" in out["recv"].message, out
        assert e.same(snap) and e.ctx.version == "step-1"
        assert e.ctx.health() == refit.Health.READY
        rx.close()
        x0.close()
        x1.close()
    tctx.close()


def one_update(ctx, n):
    """A one-module model of n float32 zeros on ctx, updated to ones
    (version "1"); its runtime array."""
    a = np.zeros((n,), np.float32)
    m = ctx.create_model()
    m.add_module("a")
    m.bind_runtime("a", "w", a)
    m.expect("a", "a", "f32", [n])
    m.seal()
    with m.update(version="1") as txn:
        txn.load("a", np.ones(n, np.float32))
    return a


def test_cuda_stats_by_name():
    """refit._sys.cuda_stats: every counter of refit_sys_cuda_stats by its
    name, as an int; an update of host tensors leaves them as they were
    (no CUDA backend work)."""
    from refit import _sys
    before = _sys.cuda_stats()
    assert tuple(before) == _sys.FIELDS and len(before) == 14, before
    assert all(isinstance(v, int) and v >= 0 for v in before.values()), before
    assert np.array_equal(one_update(refit.Context(), 4), np.ones(4))
    assert _sys.cuda_stats() == before


def big_model(ctx, seal=True):
    """Two modules on ctx: 3 MiB and 2 MiB of float32 (more than the 4 MiB
    of the undo log's smallest host chunk), sealed; (model, arrays)."""
    arrs = {"a": np.zeros((768, 1024), np.float32), "b": np.zeros((512, 1024), np.float32)}
    m = ctx.create_model()
    for k, a in arrs.items():
        m.add_module(k)
        m.bind_runtime(k, "w", a)
        m.expect(k, k, "f32", list(a.shape))
    if seal:
        m.seal()
    return m, arrs


def test_undo_held_reserved_at_seal():
    """Model.undo_held (refit_sys_undo_held): seal reserves the undo log of
    a full update with rollback (host memory at undo_device_budget 0:
    every runtime byte plus 512 bytes a tensor, a chunk's slack at most
    more), before the first update; updates with and without rollback
    leave it as it was; REFIT_ESTATE while an update is open."""
    ctx = refit.Context(journal_path="")
    m, arrs = big_model(ctx, seal=False)
    assert m.undo_held() == (0, 0), m.undo_held()           # not sealed: no pool
    m.seal()
    dev, host = m.undo_held(wait=True)
    st = m.stats()
    need = st["runtime_bytes"] + 512 * st["runtime_tensors"]
    assert st["runtime_bytes"] == sum(a.nbytes for a in arrs.values()), st
    assert dev == 0 and need <= host <= need + 2048, (dev, host, need)
    assert m.undo_held(wait=False) == (dev, host)
    for rollback in (True, False):
        with m.update(version="r%d" % rollback, rollback=rollback) as txn:
            txn.load_dict({k: np.full(a.shape, 1 + rollback, np.float32)
                           for k, a in arrs.items()})
            err = raises("REFIT_ESTATE", lambda: m.undo_held(), "update is open")
            assert err.call == "undo_held", err.call
            saved = txn.stats()
        assert saved["undo_host_bytes"] == (st["runtime_bytes"] if rollback else 0), saved
        assert m.undo_held(wait=False) == (dev, host), (rollback, m.undo_held())
    assert all((a == 1).all() for a in arrs.values())
    ctx.close()
    raises("REFIT_ESTATE", lambda: m.undo_held(), "context was closed")


def test_undo_reserve_off_then_first_update_allocates():
    """REFIT_UNDO_RESERVE=0 (read by seal): nothing held until the first
    update with rollback takes it. With an undo_device_budget the
    reservation goes to the device side of undo_held's pair while the
    budget lasts (the host backend's "device" memory is malloc'd), the
    rest to the host side."""
    os.environ["REFIT_UNDO_RESERVE"] = "0"
    try:
        ctx = refit.Context(journal_path="")
        m, arrs = big_model(ctx)
    finally:
        del os.environ["REFIT_UNDO_RESERVE"]
    assert m.undo_held() == (0, 0), m.undo_held()
    with m.update(version="1") as txn:
        txn.load_dict({k: np.ones(a.shape, np.float32) for k, a in arrs.items()})
    dev, host = m.undo_held(wait=False)
    assert dev == 0 and host >= m.stats()["runtime_bytes"], (dev, host)
    ctx.close()
    for budget in (64 << 20, 2 << 20):
        ctx = refit.Context(journal_path="", undo_device_budget=budget)
        m, arrs = big_model(ctx)
        dev, host = m.undo_held()
        st = m.stats()
        need = st["runtime_bytes"] + 512 * st["runtime_tensors"]
        if budget > need:
            assert host == 0 and need <= dev <= need + 2048, (budget, dev, host)
        else:
            assert 0 < dev <= budget and dev + host >= need, (budget, dev, host)
        ctx.close()


def test_seal_undo_reserve_option():
    """Model.seal(undo_reserve=) (refit_model_seal_with): False reserves
    nothing, True reserves even with REFIT_UNDO_RESERVE=0 in the
    environment (which overrides the default, None, only); a value other
    than a bool or None is refused before sealing."""
    runtime = (768 + 512) * 1024 * 4
    for reserve, env, held in ((False, None, False), (True, "0", True), (None, "0", False),
                               (None, None, True)):
        if env is not None:
            os.environ["REFIT_UNDO_RESERVE"] = env
        try:
            ctx = refit.Context(journal_path="")
            m, arrs = big_model(ctx, seal=False)
            try:
                m.seal(undo_reserve=1)
                raise AssertionError("seal(undo_reserve=1) accepted")
            except ValueError as err:
                assert "undo_reserve" in str(err) and "1" in str(err), err
            m.seal(undo_reserve=reserve)
        finally:
            os.environ.pop("REFIT_UNDO_RESERVE", None)
        dev, host = m.undo_held()
        assert dev == 0 and (host >= runtime if held else host == 0), (reserve, env, host)
        raises("REFIT_ESTATE", lambda: m.seal(undo_reserve=reserve), "already sealed")
        ctx.close()


def fp8_online(ctx, rows):
    """Online per-tensor fp8 modules l0, l1, ... on ctx: module i's weight
    [2 * rows[i], 32] fused from BF16 checkpoint tensors li.gate.weight
    and li.up.weight [rows[i], 32] (STAGED routes: the module's BF16 bytes
    are staged whole from its first tensor on), sealed."""
    m = ctx.create_model()
    keep = []
    for i, n in enumerate(rows):
        w, s = np.zeros((2 * n, 32), ml_dtypes.float8_e4m3fn), np.zeros((1,), np.float32)
        keep += [w, s]
        m.add_module("l%d" % i, "fp8", {"scheme": "per_tensor", "online": True})
        m.bind_runtime("l%d" % i, "weight", w)
        m.bind_runtime("l%d" % i, "weight_scale", s)
        for j, part in enumerate(("gate", "up")):
            m.expect("l%d" % i, "l%d.%s.weight" % (i, part), ml_dtypes.bfloat16, [n, 32],
                     target="weight", dst_offset=[n * j, 0])
    m.seal()
    assert m.stats()["routes_staged"] == 2 * len(rows), m.stats()
    return m, keep


def test_txn_staging_peak():
    """Txn.staging_peak (refit_sys_txn_staging_peak): a staged module's
    BF16 bytes from its first tensor on; kept after the update ends
    (committed or aborted) and in txn.stats(); 0 for an update not begun
    and for direct routes."""
    ctx = refit.Context(journal_path="")
    m, keep = fp8_online(ctx, [32, 16])
    bf = lambda n: np.ones((n, 32), ml_dtypes.bfloat16)  # noqa: E731
    with m.update(version="1") as txn:
        assert txn.staging_peak == 0        # lazy, not begun
        txn.load("l0.gate.weight", bf(32))
        assert txn.staging_peak == 64 * 32 * 2, txn.staging_peak   # l0 whole: 4096
        txn.load("l0.up.weight", bf(32))
        assert txn.stats()["staging_peak"] == 4096, txn.stats()
        txn.load("l1.gate.weight", bf(16))
        txn.load("l1.up.weight", bf(16))
        peak = txn.staging_peak
        assert 4096 <= peak <= 4096 + 2048, peak  # l0's retired staging perhaps still held
    assert txn.result == "committed" and txn.staging_peak == peak, (txn.result, txn.staging_peak)
    assert (keep[0].astype(np.float32) == 448).all()       # quantized: amax / 448 scale
    txn = m.begin("2")
    txn.load("l1.up.weight", bf(16))
    assert txn.abort() and txn.staging_peak == 2048, txn.staging_peak
    ctx.close()
    e = Engine()    # direct routes only: nothing staged
    with e.model.update(version="v") as txn:
        txn.load_dict(checkpoint(3))
    assert txn.result == "committed" and txn.staging_peak == 0, txn.staging_peak


def test_seal_prepare_without_cuda():
    """seal(prepare=...) on a host model: nothing to prepare, whatever the
    value; a bad value is refused before sealing; prepare_stream says
    there was nothing to do (no CUDA tensor; a library without CUDA)."""
    ctx = refit.Context(journal_path="")
    m, _ = big_model(ctx, seal=False)
    try:
        m.seal(prepare="ring")
    except ValueError as err:
        assert "'files', 'device'" in str(err), err
    else:
        raise AssertionError("seal(prepare='ring') accepted")
    assert m.cuda_devices == [] and m.prepare_stream() is False
    m.seal(prepare="device")
    raises("REFIT_ESTATE", m.seal, "already sealed")
    from refit import _ffi
    L = _ffi.lib()
    # this build's library: the call is there and says it has no CUDA
    rc = L.refit_sys_cuda_prepare(0, None, _ffi.CUDA_PREPARE_SAVES)
    if rc == -14:
        assert "without CUDA" in L.refit_sys_cuda_last_error().decode()
        m.cuda_devices.append(0)    # as if a CUDA tensor were bound
        assert m.prepare_stream(0) is False
    ctx.close()


def test_model_device_is_cuda_devices_first():
    """Model.cuda_devices is the record of the model's CUDA devices and
    Model.device its first, read-only; a runtime tensor whose bind refit
    refuses records no device."""
    ctx = refit.Context(journal_path="")
    m, _ = big_model(ctx, seal=False)
    assert m.cuda_devices == [] and m.device is None
    buf = np.zeros(8, np.float32)
    m.add_module("g")

    def fake(dev):  # host memory said to be on CUDA device dev
        return tensors.Desc(buf.ctypes.data, refit._ffi.DEVICE_CUDA, dev, (2, 32), (8,), (1,), buf)
    want = []
    for i, dev in enumerate((5, 2, 5)):
        try:
            m.bind_runtime("g", "w%d" % i, fake(dev))
        except refit.RefitError:    # a build whose backend checks the device
            pass
        else:
            want += [] if dev in want else [dev]
        assert m.cuda_devices == want, (m.cuda_devices, want)
    raises("REFIT_EEXIST", lambda: m.bind_runtime("g", "w0", fake(9)), "already bound")
    assert m.cuda_devices == want, m.cuda_devices   # refused: no device recorded
    assert m.device == ((refit._ffi.DEVICE_CUDA, want[0]) if want else None), m.device
    m.cuda_devices.append(3)
    assert m.device == (refit._ffi.DEVICE_CUDA, m.cuda_devices[0]), m.device
    try:
        m.device = (refit._ffi.DEVICE_CUDA, 7)
        raise AssertionError("Model.device was set apart from cuda_devices")
    except AttributeError:
        pass
    ctx.close()


def test_torch_never_imported():
    assert "torch" not in sys.modules


if __name__ == "__main__":
    sys.exit(harness.run(globals(), last="test_torch_never_imported"))
