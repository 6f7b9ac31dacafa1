"""Tensors as refit sees them: a refit_tensor descriptor (the DLPack DLTensor
layout) over memory that something else owns.

Accepted, as runtime tensors and as sources:
  - torch.Tensor (CUDA, pinned host, pageable host): read from data_ptr(),
    shape and stride(), no DLPack capsule made (the cheapest path);
  - numpy.ndarray (host), through __array_interface__; ml_dtypes' bfloat16
    and float8 dtypes included;
  - any object with __dlpack__ (CuPy, JAX, numpy, torch, ...), host or
    device: refit reads the DLTensor inside the capsule in place, and the
    capsule (so the producer's memory) lives as long as the descriptor;
  - anything with a _refit_desc() method returning a Desc.

Neither torch nor numpy is imported here: each is looked up in sys.modules,
so a process without torch never loads it."""
from __future__ import annotations

import ctypes
import sys
from typing import Any, Optional, Sequence, Tuple, Union

from . import _ffi

DTypeLike = Union[Tuple[int, int], str, Any]
"""A refit dtype: a (code, bits) pair, a refit name ("bf16"), a torch or
numpy dtype, or a numpy dtype name ("float32", "bfloat16")."""

# (code, bits) by dtype name, torch's and numpy's/ml_dtypes' spellings alike
_BY_NAME = {
    "float64": (2, 64), "float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16),
    "int64": (0, 64), "int32": (0, 32), "int16": (0, 16), "int8": (0, 8),
    "uint64": (1, 64), "uint32": (1, 32), "uint16": (1, 16), "uint8": (1, 8),
    "bool": (6, 8), "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8),
    "float8_e8m0fnu": (14, 8), "float4_e2m1fn": (17, 4),
    "f64": (2, 64), "f32": (2, 32), "f16": (2, 16), "bf16": (4, 16), "i64": (0, 64),
    "i32": (0, 32), "i16": (0, 16), "i8": (0, 8), "u8": (1, 8),
}


class ByteOrderError(TypeError):
    """A numpy dtype whose bytes are not in this machine's order: refit's
    dtypes are native, and reading them as such would load swapped bytes."""


_SWAPPED = ">" if sys.byteorder == "little" else "<"   # numpy's mark of the other order


def _byte_order_error(dt: Any) -> ByteOrderError:
    return ByteOrderError("numpy dtype '%s' is %s-endian, not this machine's byte order; "
                          "refit reads native bytes (convert: a.astype(a.dtype.newbyteorder"
                          "('=')))" % (dt.str, "big" if _SWAPPED == ">" else "little"))


def refit_dtype(dtype: DTypeLike) -> Tuple[int, int]:
    """(code, bits) of a dtype: a pair, a refit name ("bf16"), a torch dtype,
    a numpy dtype or its name. TypeError names a dtype refit has not
    (ByteOrderError: a numpy dtype of the other byte order, ">f4")."""
    if isinstance(dtype, tuple):
        return (int(dtype[0]), int(dtype[1]))
    name = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
    np = sys.modules.get("numpy")
    if name not in _BY_NAME and np is not None and not isinstance(dtype, str):
        try:
            dt = np.dtype(dtype)  # np.float32, np.dtype("<f4"), ml_dtypes.bfloat16
        except TypeError:
            pass
        else:
            if dt.byteorder == _SWAPPED:
                raise _byte_order_error(dt)
            name = dt.name
    if name not in _BY_NAME:
        raise TypeError("refit: no refit dtype for %s" % name)
    return _BY_NAME[name]


_numpy_codes: dict = {}   # numpy dtype (native order only) -> (code, bits)


def numpy_code(dt: Any) -> Tuple[int, int]:
    """refit_dtype of a numpy dtype, decided once per dtype (the byte order
    check included: a swapped dtype is never cached, so always refused)."""
    r = _numpy_codes.get(dt)
    if r is None:
        if dt.byteorder == _SWAPPED:
            raise _byte_order_error(dt)
        try:
            r = refit_dtype(dt)
        except ByteOrderError:
            raise
        except TypeError:
            raise TypeError("refit: no refit dtype for numpy dtype %s" % dt) from None
        _numpy_codes[dt] = r
    return r


class Desc:
    """A refit_tensor over a tensor's memory, holding its owner alive.

    t: the _ffi.Tensor refit reads (refit borrows a registered one, and its
    shape and strides, until the model is destroyed: keep the Desc)."""

    __slots__ = ("t", "shape", "strides", "tensor", "device_type", "device_id", "readonly")
    shape: Optional[ctypes.Array[ctypes.c_int64]]
    strides: Optional[ctypes.Array[ctypes.c_int64]]

    def __init__(self, data: Optional[int], device_type: int, device_id: int,
                 dtype: Tuple[int, int], shape: Sequence[int], strides: Sequence[int],
                 owner: Any, readonly: bool = False) -> None:
        n = len(shape)
        self.shape = (ctypes.c_int64 * max(n, 1))(*shape)
        self.strides = (ctypes.c_int64 * max(n, 1))(*strides)
        self.tensor = owner
        self.device_type = device_type
        self.device_id = device_id
        self.readonly = readonly
        code, bits = dtype
        # DLPack's layout: data is where the memory starts, byte_offset
        # where the first element is. A view with negative strides (numpy's
        # a[::-1]) reaches below its first element: say so, as DLPack does.
        below = 0
        if data and bits >= 8 and all(e > 0 for e in shape):
            below = sum(-st * (e - 1) for st, e in zip(strides, shape) if st < 0) * (bits // 8)
        self.t = _ffi.Tensor(data - below if data and below else data,
                             _ffi.Device(device_type, device_id), n,
                             _ffi.DType(code, bits, 1),
                             ctypes.cast(self.shape, _ffi.c_int64_p),
                             ctypes.cast(self.strides, _ffi.c_int64_p), below)

    @classmethod
    def _over(cls, tensor: "_ffi.Tensor", owner: Any, readonly: bool) -> "Desc":
        """A Desc whose refit_tensor is one that owner keeps (a DLTensor)."""
        d = cls.__new__(cls)
        d.t = tensor
        d.shape = d.strides = None
        d.tensor = owner
        d.device_type = tensor.device.device_type
        d.device_id = tensor.device.device_id
        d.readonly = readonly
        return d


# ---- torch ----------------------------------------------------------------

def _describe_torch(t: Any) -> Desc:
    dev = t.device
    if dev.type == "cuda":
        dt, did = _ffi.DEVICE_CUDA, dev.index if dev.index is not None else 0
    elif dev.type == "cpu":
        dt, did = (_ffi.DEVICE_CUDA_HOST if t.is_pinned() else _ffi.DEVICE_CPU), 0
    else:
        raise TypeError("refit: tensors on %s are not supported" % dev.type)
    return Desc(t.data_ptr() or None, dt, did, refit_dtype(t.dtype), tuple(t.shape),
                tuple(t.stride()), t)


# ---- numpy ----------------------------------------------------------------

def _describe_numpy(a: Any) -> Desc:
    ai = a.__array_interface__
    ptr, readonly = ai["data"]
    item = a.dtype.itemsize
    dt = numpy_code(a.dtype)
    strides = []
    for s in a.strides:
        if s % item:
            raise ValueError("refit: a numpy array with a stride of %d bytes, not a multiple "
                             "of its %d-byte items, has no refit descriptor" % (s, item))
        strides.append(s // item)
    return Desc(ptr or None, _ffi.DEVICE_CPU, 0, dt, a.shape, strides, a, readonly=readonly)


# ---- DLPack ---------------------------------------------------------------

class _DLManagedTensorVersioned(ctypes.Structure):
    """DLPack 1.x: version, manager_ctx, deleter, flags, then the DLTensor."""
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _ffi.Tensor)]


_DLPACK_FLAG_READ_ONLY = 1
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _describe_dlpack(obj: Any, stream: Optional[int] = None) -> Desc:
    """The DLTensor inside obj.__dlpack__()'s capsule, read in place. The
    capsule is not renamed "used_...": it stays the owner, and when the Desc
    (so the capsule) is collected its destructor calls the producer's
    deleter, as for any capsule that was never consumed."""
    kw = {}
    dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (_ffi.DEVICE_CPU, 0)
    if int(dev[0]) == _ffi.DEVICE_CUDA:
        kw["stream"] = stream if stream is not None else 1  # 1: CUDA's legacy default stream
    try:
        cap = obj.__dlpack__(max_version=(1, 0), **kw)
    except TypeError:  # a producer of the DLPack 0.x protocol
        cap = obj.__dlpack__(**kw)
    if _capsule_valid(cap, b"dltensor_versioned"):
        m = _DLManagedTensorVersioned.from_address(_capsule_ptr(cap, b"dltensor_versioned"))
        if m.major != 1:
            raise TypeError("refit: DLPack %d.%d capsule from %s: only 1.x is read"
                            % (m.major, m.minor, type(obj).__name__))
        return Desc._over(m.dl_tensor, (cap, obj), bool(m.flags & _DLPACK_FLAG_READ_ONLY))
    if _capsule_valid(cap, b"dltensor"):
        # DLManagedTensor: the DLTensor is its first member
        return Desc._over(_ffi.Tensor.from_address(_capsule_ptr(cap, b"dltensor")), (cap, obj),
                          False)
    raise TypeError("refit: %s.__dlpack__() returned no DLPack capsule" % type(obj).__name__)


def _is(obj: Any, module: str, cls: str) -> bool:
    m = sys.modules.get(module)
    return m is not None and isinstance(obj, getattr(m, cls))


def describe(tensor: Any, stream: Optional[int] = None) -> Desc:
    """A Desc over tensor: a torch.Tensor, a numpy.ndarray, an object with
    __dlpack__, or one with _refit_desc(). stream: the CUDA stream the copy
    will run on, handed to a device producer's __dlpack__ so it orders its
    pending work before it (default: the legacy default stream)."""
    if isinstance(tensor, Desc):
        return tensor
    if hasattr(tensor, "_refit_desc"):
        return tensor._refit_desc()
    if _is(tensor, "torch", "Tensor"):
        return _describe_torch(tensor)
    if _is(tensor, "numpy", "ndarray"):
        return _describe_numpy(tensor)
    if hasattr(tensor, "__dlpack__"):
        return _describe_dlpack(tensor, stream)
    raise TypeError("refit: a %s is not a tensor refit can read (torch, numpy, __dlpack__ or "
                    "_refit_desc())" % type(tensor).__name__)
