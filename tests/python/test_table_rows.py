"""txn.load_dict's rows of numpy arrays and DLPack-only objects (TAP; host
backend, no torch, no GPU): each row of refit._batch.Table equals the
descriptor refit.describe makes of the same tensor one at a time, for
every dtype refit takes, views (strided, offset, negative strides),
read-only and 0-d arrays; producers whose interface is not the one the
fast path reads (an __array_struct__ that is not numpy's struct, a
DLPack 0.x producer, a DLPack 2.x capsule, mixed capsule kinds) fall back
to describe, and a load writes the right bytes. DLPack capsules are
consumed as DLPack's Python spec says (renamed used, each tensor's deleter
called once, after the update is over), never read twice, and a row
refit refuses is named. The producers and the model are those of
bench/probes/table_rows.py (bench/probes/table_sources.py).

usage: test_table_rows.py   (env: REFIT_LIB, REFIT_SOURCE_ROOT)"""
import ctypes
import gc
import os
import sys

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
sys.path.insert(0, os.path.join(ROOT, "bench", "probes"))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import refit  # noqa: E402
from refit import _batch, _ffi, tensors  # noqa: E402
import harness  # noqa: E402  (tests/python/harness.py)
from harness import raises  # noqa: E402
from table_sources import RecordingDLPack as DLPackOnly, row_model  # noqa: E402

ROW = ctypes.sizeof(_ffi.Tensor)


def rows_of(table):
    """Each row as (data + byte_offset, device, ndim, dtype, shape, strides
    in items or None): where its first element is and how it is laid out."""
    return [fields(_ffi.Tensor.from_address(table.srcs_ptr + i * ROW)) for i in range(table.n)]


def fields(t):
    nd = t.ndim
    return ((t.data or 0) + t.byte_offset, (t.device.device_type, t.device.device_id), nd,
            (t.dtype.code, t.dtype.bits, t.dtype.lanes), tuple(t.shape[:nd]),
            tuple(t.strides[:nd]) if nd and t.strides else None)


def contiguous_strides(shape):
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def same_layout(got, want):
    """want: describe()'s fields, whose strides are always given; a row
    with none is row-major, which is the same layout."""
    if got[5] is None and want[5] is not None and want[5] == contiguous_strides(want[4]):
        want = want[:5] + (None,)
    return got == want


def check_rows(tensors_, what):
    names = ["t%d" % i for i in range(len(tensors_))]
    table = _batch.Table(names, tensors_)
    got = rows_of(table)
    for name, g, t in zip(names, got, tensors_):
        d = refit.describe(t)   # kept while read: a DLTensor lives in its capsule
        want = fields(d.t)
        assert same_layout(g, want), (what, name, g, want)
    return table


# every numpy dtype refit takes, native byte order
DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.int32, np.int16,
          np.int8, np.uint64, np.uint32, np.uint16, np.uint8, np.bool_,
          ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu,
          ml_dtypes.float4_e2m1fn]


def arrays_of(dt):
    base = np.arange(2 * 3 * 5).reshape(2, 3, 5).astype(dt)
    ro = base.copy()
    ro.flags.writeable = False
    return {"contiguous": base, "0-d": np.array(base.flat[7]), "offset view": base[1],
            "offset rows": base[:, 1:], "read-only": ro, "size 0": base[:0],
            "one row of many": base.reshape(6, 5)[4:5]}


def strided_of(dt):
    base = np.arange(4 * 6).reshape(4, 6).astype(dt)
    return {"columns": base[:, ::2], "transposed": base.T, "reversed": base[::-1],
            "reversed columns": base[:, ::-1], "offset strided": base[1:, 1::2]}


def test_numpy_rows_every_dtype_and_view():
    for dt in DTYPES:
        arrs = arrays_of(dt)
        for what, a in arrs.items():    # each alone, then all in one table
            check_rows([a], (np.dtype(dt).name, what))
        table = check_rows(list(arrs.values()), (np.dtype(dt).name, "together"))
        assert table.device is None
        for what, a in strided_of(dt).items():
            check_rows([a], (np.dtype(dt).name, what))
            check_rows([arrs["contiguous"], a], (np.dtype(dt).name, what, "mixed"))
    mixed = [a for dt in DTYPES for a in arrays_of(dt).values()]
    check_rows(mixed, "every dtype in one table")


def test_numpy_rows_read_from_the_array_struct():
    # a C-contiguous table takes the fast path: its rows point at each
    # array's first element and carry no strides
    base = np.arange(40, dtype=np.float32).reshape(8, 5)
    views = [base[i] for i in range(8)] + [base[2:4], np.array(3.5, np.float32)]
    table = check_rows(views, "views")
    got = rows_of(table)
    assert [g[0] for g in got] == [v.__array_interface__["data"][0] for v in views]
    assert all(g[5] is None for g in got), got
    assert table._caps is None      # no descriptor per row: not described


def test_numpy_swapped_byte_order_refused_naming_the_row():
    ok = np.zeros(3, np.float32)
    raises("REFIT_EINVAL", lambda: _batch.Table(["a", "b"], [ok, ok.astype(">f4")]),
           "tensor b", "big-endian")
    raises("REFIT_EINVAL", lambda: _batch.Table(["a", "c"], [ok, np.zeros(3, np.complex64)]),
           "tensor c", "complex64")


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class ArrayStruct(ctypes.Structure):
    """numpy's documented PyArrayInterface (what __array_struct__ holds)."""
    _fields_ = [("two", ctypes.c_int), ("nd", ctypes.c_int), ("typekind", ctypes.c_char),
                ("itemsize", ctypes.c_int), ("flags", ctypes.c_int),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("data", ctypes.c_void_p), ("descr", ctypes.c_void_p)]


class OddStruct(np.ndarray):
    """An ndarray whose __array_struct__ is not numpy's struct (its sanity
    member is not 2): the table must not read it as one."""

    def __array_finalize__(self, obj):
        st = self._st = ArrayStruct()
        st.two = 3
        st.flags = 1
        st.data = 16    # what would be read as the data pointer

    @property
    def __array_struct__(self):
        return _capsule_new(ctypes.addressof(self._st), None, None)


class NotACapsule(np.ndarray):
    @property
    def __array_struct__(self):
        return object()


def test_numpy_interface_not_the_documented_one_falls_back():
    for cls in (OddStruct, NotACapsule):
        a = np.arange(12, dtype=np.float32).reshape(3, 4).view(cls)
        table = check_rows([a, np.ones(4, np.float32).view(cls)], cls.__name__)
        assert rows_of(table)[0][0] == a.ctypes.data, cls
        assert table._caps is not None   # described, row by row


class LegacyOnly(DLPackOnly):
    """A DLPack 0.x producer: no max_version (and no read-only arrays)."""

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()


class LegacyCapsule(DLPackOnly):
    """Takes max_version, yet answers with a legacy capsule (as the spec
    allows a producer that has no 1.x)."""

    def __dlpack__(self, stream=None, max_version=None):
        return self.a.__dlpack__()


def test_dlpack_rows_equal_describe():
    for dt in DTYPES:
        if dt in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
                  ml_dtypes.float8_e8m0fnu, ml_dtypes.float4_e2m1fn):
            continue    # numpy's __dlpack__ has no DLPack code for them
        arrs = arrays_of(dt)
        views = list(arrs.values()) + list(strided_of(dt).values())
        writable = [v for v in views if v.flags.writeable]  # 0.x cannot say read-only
        for cls in (DLPackOnly, LegacyOnly, LegacyCapsule):
            table = check_rows([cls(v) for v in (views if cls is DLPackOnly else writable)],
                               (np.dtype(dt).name, cls.__name__))
            assert table.device is None
        # the kinds mixed in one table: described, the same rows
        check_rows([DLPackOnly(views[0]), LegacyCapsule(views[1])], (np.dtype(dt).name, "mix"))


def test_dlpack_rows_ask_the_producer_once():
    # one __dlpack__ a row, no stream (DLPack's spec: the legacy default
    # stream on CUDA, the only value on the host) and no __dlpack_device__:
    # the device is the capsule's own
    calls = []
    arrs = [np.full((2, 3), i, np.float32) for i in range(5)]
    table = _batch.Table(["a%d" % i for i in range(5)], [DLPackOnly(a, calls) for a in arrs])
    assert calls == [("dlpack", (("max_version", (1, 0)),))] * 5, calls
    assert isinstance(table._caps, tensors.Consumed)    # not described: the batch path
    assert [g[0] for g in rows_of(table)] == [a.ctypes.data for a in arrs]


class Managed(ctypes.Structure):
    _fields_ = tensors._DLManagedTensorVersioned._fields_


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Forged:
    """A producer whose versioned capsule it builds itself: DLPack version
    major.0, device (type, id), over a numpy array's memory. freed: a
    list the tensor's deleter appends the managed tensor's address to
    (None: no deleter, as DLPack allows); same_capsule: every __dlpack__
    hands out the one capsule it made first (a producer that caches)."""

    def __init__(self, a, major=1, device=(_ffi.DEVICE_CPU, 0), freed=None, same_capsule=False):
        self.a = a
        self.shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        m = self.m = Managed()
        m.major, m.minor = major, 0
        m.dl_tensor = _ffi.Tensor(a.ctypes.data, _ffi.Device(*device), a.ndim,
                                  _ffi.DType(*refit.tensors.numpy_code(a.dtype), 1),
                                  ctypes.cast(self.shape, _ffi.c_int64_p), None, 0)
        if freed is not None:
            self.deleter = _DELETER(freed.append)
            m.deleter = ctypes.cast(self.deleter, ctypes.c_void_p).value
        self.same_capsule = same_capsule
        self.capsule = None

    @property
    def address(self):
        return ctypes.addressof(self.m)

    def __dlpack_device__(self):
        dev = self.m.dl_tensor.device
        return (dev.device_type, dev.device_id)

    def __dlpack__(self, stream=None, max_version=None):
        if self.capsule is not None and self.same_capsule:
            return self.capsule
        self.capsule = _capsule_new(self.address, b"dltensor_versioned", None)
        return self.capsule


_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def named(capsule, name):
    return bool(_capsule_valid(capsule, name))


def test_dlpack_device_read_from_the_capsule():
    arrs = [np.zeros((2, 2), np.float32) for _ in range(3)]
    devs = [(_ffi.DEVICE_CPU, 0), (_ffi.DEVICE_CUDA, 3), (_ffi.DEVICE_CUDA_HOST, 0)]
    table = _batch.Table(["a", "b", "c"], [Forged(a, device=d) for a, d in zip(arrs, devs)])
    assert [g[1] for g in rows_of(table)] == devs
    assert table.device == (_ffi.DEVICE_CUDA, 3), table.device


def test_dlpack_other_major_version_refused_not_read():
    ok = DLPackOnly(np.zeros(4, np.float32))
    bad = Forged(np.zeros(4, np.float32), major=2)
    try:
        _batch.Table(["a", "b"], [ok, bad])
    except TypeError as err:    # describe()'s refusal, as for one load
        assert "DLPack 2.0" in str(err) and "only 1.x" in str(err), err
    else:
        raise AssertionError("a DLPack 2.0 capsule was read")


def world(n):
    return row_model(refit, n, 6)


def test_dlpack_capsules_consumed_once_and_freed_after_the_update():
    # DLPack's Python spec: the consumer renames the capsule "used_..." and
    # calls the tensor's deleter itself, once, when done with the memory
    # (here: when the update is over, not when the table is built)
    for batch in (True, False):     # the batch path; described row by row
        freed = []
        arrs = [np.full((1, 6), i, np.float32) for i in range(3)]
        prods = [Forged(a, freed=freed) for a in arrs]
        if not batch:
            prods[1] = Forged(arrs[1], freed=freed, same_capsule=True)
            prods.append(LegacyCapsule(np.full((1, 6), 3, np.float32)))  # mixed: described
        ctx, m, w = world(len(prods))
        with m.update(version="v1", rollback=False) as txn:
            txn.load_dict({"t%d" % i: p for i, p in enumerate(prods)})
            for p in prods[:3]:
                assert named(p.capsule, b"used_dltensor_versioned"), (batch, p.capsule)
                assert not named(p.capsule, b"dltensor_versioned")
            assert freed == [], (batch, freed)      # the copy may still read them
        gc.collect()
        assert sorted(freed) == sorted(p.address for p in prods[:3]), (batch, freed)
        assert (w[:, 0] == np.arange(len(prods))).all(), w
        ctx.close()


def test_dlpack_consumed_capsule_not_read_again():
    # a producer that hands out the same capsule twice: the second load
    # finds it used and refuses the row, naming it; nothing freed twice
    freed = []
    a = np.full((1, 6), 7, np.float32)
    same = Forged(a, freed=freed, same_capsule=True)
    ctx, m, w = world(2)
    src = {"t0": DLPackOnly(np.zeros((1, 6), np.float32)), "t1": same}
    with m.update(version="v1", rollback=False) as txn:
        txn.load_dict(src)
    gc.collect()
    assert freed == [same.address] and (w[1] == 7).all(), (freed, w)
    w[:] = 0
    for call in (lambda: _batch.Table(["t0", "t1"], [src["t0"], same]),
                 lambda: refit.describe(same)):
        try:
            call()
        except TypeError as err:
            assert "already consumed" in str(err), err
        else:
            raise AssertionError("a used capsule was read again")
    try:
        with m.update(version="v2", rollback=False) as txn:
            txn.load_dict(src)
    except TypeError as err:
        assert "tensor t1" in str(err) and "already consumed" in str(err), err
    else:
        raise AssertionError("a used capsule was loaded again")
    gc.collect()
    assert freed == [same.address], freed
    assert (w == 0).all() and ctx.version == "v1", (w, ctx.version)
    ctx.close()


def test_dlpack_deleter_error_frees_the_rest():
    # a deleter that leaves a Python error set (here CPython's
    # PyErr_NoMemory, whose one argument-less call sets MemoryError) does
    # not stop the other tensors' deleters, whichever group runs first
    freed = []
    arrs = [np.full((1, 6), i, np.float32) for i in range(3)]
    prods = [Forged(a, freed=freed) for a in arrs]
    prods[1].m.deleter = ctypes.cast(ctypes.pythonapi.PyErr_NoMemory, ctypes.c_void_p).value
    for path in ("batch", "described"):
        del freed[:]
        ctx, m, w = world(3)
        src = {"t%d" % i: p for i, p in enumerate(prods)}
        if path == "described":     # a legacy capsule among them: row by row
            src["t1"] = LegacyCapsule(arrs[1])
            prods[0].m.deleter, prods[2].m.deleter = (
                ctypes.cast(ctypes.pythonapi.PyErr_NoMemory, ctypes.c_void_p).value,
                ctypes.cast(prods[2].deleter, ctypes.c_void_p).value)
        with m.update(version="v1", rollback=False) as txn:
            txn.load_dict(src)
        gc.collect()
        want = [prods[0].address, prods[2].address] if path == "batch" else [prods[2].address]
        assert sorted(freed) == sorted(want), (path, freed)
        assert (w[:, 0] == np.arange(3)).all(), w
        ctx.close()


def test_dlpack_producer_memory_released_once():
    # numpy's own capsules: its deleter drops the reference the capsule's
    # tensor holds on the array; after the update each array's count is
    # back where it was (not left held, not dropped twice), on both paths,
    # for versioned and legacy capsules, after a load and after a refusal
    arrs = [np.full((1, 6), i, np.float32) for i in range(4)]
    for wrap in (DLPackOnly, LegacyCapsule, None):
        prods = ([wrap(a) for a in arrs] if wrap else
                 [DLPackOnly(arrs[0]), LegacyCapsule(arrs[1]), DLPackOnly(arrs[2]),
                  LegacyCapsule(arrs[3])])
        before = [sys.getrefcount(a) for a in arrs]
        for bad in (None, 2):
            ctx, m, w = world(len(arrs))
            src = {"t%d" % i: p for i, p in enumerate(prods)}
            if bad is not None:     # a wrong shape: refused by refit_load_many
                src["t%d" % bad] = wrap(arrs[bad].reshape(2, 3)) if wrap else \
                    DLPackOnly(arrs[bad].reshape(2, 3))
            try:
                with m.update(version="v1", rollback=False) as txn:
                    txn.load_dict(src)
            except refit.RefitError as err:
                assert bad is not None and "t%d" % bad in err.message, err
            del src, txn
            ctx.close()
            gc.collect()
            assert [sys.getrefcount(a) for a in arrs] == before, (wrap, bad)
        del prods


def test_dlpack_wrong_dtype_or_shape_row_refused_naming_it():
    # a refused row refuses the whole load_dict, naming the row; nothing
    # written, version and health as they were
    good = [DLPackOnly(np.full((1, 6), i + 1, np.float32)) for i in range(3)]
    for bad, status, words in (
            (DLPackOnly(np.zeros((1, 6), np.float64)), "REFIT_EMISMATCH", ("row 1 (t1)", "f64")),
            (DLPackOnly(np.zeros((2, 3), np.float32)), "REFIT_EMISMATCH", ("row 1 (t1)", "extent")),
            (DLPackOnly(np.zeros((1, 6), np.int32)), "REFIT_EMISMATCH", ("row 1 (t1)", "i32")),
            (Forged(np.zeros((1, 6), np.float32), major=2), None, ("tensor t1", "DLPack 2.0"))):
        ctx, m, w = world(3)
        with m.update(version="v0", rollback=False) as txn:
            txn.load_dict({"t%d" % i: p for i, p in enumerate(good)})
        health = ctx.health()
        src = {"t0": good[0], "t1": bad, "t2": good[2]}
        w[:] = 9

        def load():
            with m.update(version="v1") as txn:
                txn.load_dict(src)
        if status is None:
            try:
                load()
            except TypeError as err:
                assert all(x in str(err) for x in words), err
            else:
                raise AssertionError("row t1 was not refused")
        else:
            raises(status, load, *words)
        assert (w == 9).all() and ctx.version == "v0" and ctx.health() == health, \
            (words, w, ctx.version, ctx.health())
        ctx.close()


def test_load_dict_writes_the_rows_bytes():
    # the same update from numpy views (contiguous, offset, strided,
    # negative strides, read-only) and from DLPack-only objects over them
    src = np.arange(6 * 12, dtype=np.float32).reshape(6, 12)
    ro = src[3:4, :6].copy()
    ro.flags.writeable = False
    views = [src[0:1, :6], src[1:2, 6:], src[2:3, ::2], src[4:5, 11::-2][:, :6],
             ro, src[5:6, 1:7]]
    want = np.concatenate([np.ascontiguousarray(v) for v in views])
    writable = [v if v.flags.writeable else v.copy() for v in views]  # for DLPack 0.x
    for wrap, vs in ((lambda v: v, views), (DLPackOnly, views), (LegacyCapsule, writable)):
        ctx, m, w = world(len(vs))
        with m.update(version="v1", rollback=False) as txn:
            txn.load_dict({"t%d" % i: wrap(v) for i, v in enumerate(vs)})
        assert (w == want).all(), (wrap, w, want)
        ctx.close()


if __name__ == "__main__":
    sys.exit(harness.run(globals()))
