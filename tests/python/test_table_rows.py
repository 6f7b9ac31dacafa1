"""txn.load_dict's rows of numpy arrays and DLPack-only objects (TAP; host
backend, no torch, no GPU): each row of refit._batch.Table equals the
descriptor refit.describe makes of the same tensor one at a time, for
every dtype refit takes, views (strided, offset, negative strides),
read-only and 0-d arrays; producers whose interface is not the one the
fast path reads (an __array_struct__ that is not numpy's struct, a
DLPack 0.x producer, a DLPack 2.x capsule, mixed capsule kinds) fall back
to describe, and a load writes the right bytes.

usage: test_table_rows.py   (env: REFIT_LIB, REFIT_SOURCE_ROOT)"""
import ctypes
import os
import sys

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import refit  # noqa: E402
from refit import _batch, _ffi, tensors  # noqa: E402
import harness  # noqa: E402  (tests/python/harness.py)
from harness import raises  # noqa: E402

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


class DLPackOnly:
    """Only the DLPack protocol, over a numpy array; records each call."""

    def __init__(self, a, calls=None):
        self.a = a
        self.calls = calls if calls is not None else []

    def __dlpack_device__(self):
        self.calls.append("device")
        return self.a.__dlpack_device__()

    def __dlpack__(self, **kw):
        self.calls.append(("dlpack", tuple(sorted(kw.items()))))
        return self.a.__dlpack__(**kw)


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
    assert table._caps is not None and len(table._caps) == 5
    assert [g[0] for g in rows_of(table)] == [a.ctypes.data for a in arrs]


class Managed(ctypes.Structure):
    _fields_ = tensors._DLManagedTensorVersioned._fields_


class Forged:
    """A producer whose versioned capsule it builds itself: DLPack version
    major.0, device (type, id), over a numpy array's memory."""

    def __init__(self, a, major=1, device=(_ffi.DEVICE_CPU, 0)):
        self.a = a
        self.shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        m = self.m = Managed()
        m.major, m.minor = major, 0
        m.dl_tensor = _ffi.Tensor(a.ctypes.data, _ffi.Device(*device), a.ndim,
                                  _ffi.DType(*refit.tensors.numpy_code(a.dtype), 1),
                                  ctypes.cast(self.shape, _ffi.c_int64_p), None, 0)

    def __dlpack_device__(self):
        dev = self.m.dl_tensor.device
        return (dev.device_type, dev.device_id)

    def __dlpack__(self, stream=None, max_version=None):
        return _capsule_new(ctypes.addressof(self.m), b"dltensor_versioned", None)


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
    ctx = refit.Context(worker_id="table-rows", journal_path="")
    m = ctx.create_model()
    w = np.zeros((n, 6), np.float32)
    m.add_module("m")
    m.bind_runtime("m", "w", w)
    for i in range(n):
        m.expect("m", "t%d" % i, "f32", [1, 6], dst_offset=[i, 0])
    m.seal()
    return ctx, m, w


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
