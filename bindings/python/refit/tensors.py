"""Tensors as refit sees them: a refit_tensor descriptor (the DLPack DLTensor
layout) over memory that something else owns.

Accepted, as runtime tensors and as sources:
  - torch.Tensor (CUDA, pinned host, pageable host): read from data_ptr(),
    shape and stride(), no DLPack capsule made (the cheapest path);
  - numpy.ndarray (host), through __array_interface__; ml_dtypes' bfloat16
    and float8 dtypes included;
  - any object with __dlpack__ (CuPy, JAX, numpy, torch, ...), host or
    device: refit consumes the capsule (DLPack's Python spec: renamed
    "used_...") and reads its DLTensor in place; the tensor's deleter is
    called when the descriptor is collected, not before;
  - anything with a _refit_desc() method returning a Desc.

Neither torch nor numpy is imported here: each is looked up in sys.modules,
so a process without torch never loads it."""
from __future__ import annotations

import ctypes
import itertools
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
# DLPack 0.x's DLManagedTensor: the DLTensor, manager_ctx, then the deleter
DELETER_AT_LEGACY = ctypes.sizeof(_ffi.Tensor) + ctypes.sizeof(ctypes.c_void_p)
DELETER_AT_VERSIONED = _DLManagedTensorVersioned.deleter.offset

# PyCapsule_GetPointer(capsule, name) as an int (0 for NULL); ValueError
# when the capsule's name is another (CPython raises, ctypes passes it on)
capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_size_t, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
# PyCapsule_SetName keeps the pointer it is given, not a copy: the names
# live in buffers that are never freed (a producer may keep its capsule
# past this module's teardown)
capsule_rename = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)(
    ("PyCapsule_SetName", ctypes.pythonapi))


def _lasting_name(text: bytes) -> int:
    buf = ctypes.create_string_buffer(text)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(buf))   # never freed
    return ctypes.addressof(buf)


USED_VERSIONED = _lasting_name(b"used_dltensor_versioned")
USED_LEGACY = _lasting_name(b"used_dltensor")
_deleters: dict = {}   # a deleter's address -> a callable of it


def _deleter(addr: int) -> Any:
    f = _deleters.get(addr)
    if f is None:
        if len(_deleters) >= 64:
            _deleters.clear()
        # the GIL held, as a capsule's destructor would call it
        f = _deleters[addr] = ctypes.PYFUNCTYPE(None, ctypes.c_size_t)(addr)
    return f


class Consumed:
    """Managed tensors taken out of their capsules, as DLPack's Python spec
    has a consumer do: each capsule renamed "used_dltensor[_versioned]" (so
    neither its destructor nor another consumer takes the tensor again),
    and each tensor's deleter called once, by this object when it is
    collected: the memory read through them stays the producer's until
    then. Made by consume()."""

    __slots__ = ("_calls",)

    def __init__(self, calls: list) -> None:
        self._calls = calls     # [(a deleter, the managed tensors it frees)]

    def __del__(self) -> None:
        calls, self._calls = self._calls, []
        for fn, managed in calls:
            left = iter(managed)
            while True:
                try:
                    for _ in map(fn, left):
                        pass
                    break
                except Exception:  # noqa: BLE001 (one deleter's error: the rest still run)
                    continue


def consume(caps: Sequence[Any], groups: Sequence[Tuple[int, list]], used: int) -> Consumed:
    """Take each capsule's managed tensor: rename the capsules used
    (USED_VERSIONED or USED_LEGACY); groups: (a deleter's address, the
    managed tensors it frees), called when the Consumed returned is
    collected (a deleter of 0, which DLPack allows, is none). Call it once
    every row was read and accepted (a row refused before leaves every
    capsule to its own destructor)."""
    calls = [(_deleter(d), managed) for d, managed in groups if d]
    for _ in map(capsule_rename, caps, itertools.repeat(used)):
        pass
    return Consumed(calls)


def _describe_dlpack(obj: Any, stream: Optional[int] = None) -> Desc:
    """The DLTensor inside obj.__dlpack__()'s capsule, read in place. The
    capsule is consumed (renamed, its tensor's deleter called by the Desc's
    owner when the Desc is collected), as DLPack's Python spec says."""
    kw = {}
    dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (_ffi.DEVICE_CPU, 0)
    if int(dev[0]) == _ffi.DEVICE_CUDA:
        kw["stream"] = stream if stream is not None else 1  # 1: CUDA's legacy default stream
    try:
        cap = obj.__dlpack__(max_version=(1, 0), **kw)
    except TypeError:  # a producer of the DLPack 0.x protocol
        cap = obj.__dlpack__(**kw)
    if _capsule_valid(cap, b"dltensor_versioned"):
        at = capsule_pointer(cap, b"dltensor_versioned")
        m = _DLManagedTensorVersioned.from_address(at)
        if m.major != 1:
            raise TypeError("refit: DLPack %d.%d capsule from %s: only 1.x is read"
                            % (m.major, m.minor, type(obj).__name__))
        owner = consume([cap], [(m.deleter or 0, [at])], USED_VERSIONED)
        return Desc._over(m.dl_tensor, (owner, obj), bool(m.flags & _DLPACK_FLAG_READ_ONLY))
    if _capsule_valid(cap, b"dltensor"):
        # DLManagedTensor: the DLTensor is its first member
        at = capsule_pointer(cap, b"dltensor")
        deleter = ctypes.c_size_t.from_address(at + DELETER_AT_LEGACY).value
        owner = consume([cap], [(deleter, [at])], USED_LEGACY)
        return Desc._over(_ffi.Tensor.from_address(at), (owner, obj), False)
    if _capsule_valid(cap, b"used_dltensor_versioned") or _capsule_valid(cap, b"used_dltensor"):
        raise TypeError("refit: %s.__dlpack__() returned a DLPack capsule already consumed "
                        "(a capsule is read once; ask __dlpack__ for a new one)"
                        % type(obj).__name__)
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
