"""Descriptor tables for many tensors per call (refit_load_many, source sets).

A table is built in one go, not one ctypes object per tensor: the fields of
every tensor are read by map() over C callables (no Python frame per
tensor; each distinct shape and strides stored once; a contiguous
tensor's strides are not read at all: its row has none, which refit reads
as contiguous), and the refit_tensor rows (48 bytes: data, device,
ndim|dtype, shape*, strides*, byte_offset) are six 64-bit words each in
one array.array, their shape and strides in another, the names in one
NUL-separated bytes object.

numpy arrays and objects with only __dlpack__ (CuPy, JAX) are read the same
way, with no per-row call into ctypes: an array's data pointer and flags,
a capsule's pointer and name, and a DLTensor's six words are gathered for
every row at once by a numpy fancy index over the process's memory (the
layouts are CPython's PyCapsule and numpy's PyArrayObject_fields, both a
compiled ABI; each is checked against ctypes once, and the binding falls
back to refit.describe row by row where either differs). Other tensors go
through refit.describe one by one."""

import array
import ctypes
import itertools
import operator
import struct
import sys
from typing import Any

from . import _ffi

_P = ctypes.c_void_p
_sz = ctypes.c_size_t
lib = _ffi.prototyped({  # refit.h, "many tensors per call"
    "refit_load_many": (ctypes.c_int, [_P, _sz, _P, _P, _P]),
    "refit_source_set_create": (ctypes.c_int, [ctypes.POINTER(_P), _P, _sz, _P, _P]),
    "refit_source_set_repoint": (ctypes.c_int, [_P, _sz, _P]),
    "refit_load_set": (ctypes.c_int, [_P, _P, _P]),
    "refit_source_set_count": (_sz, [_P]),
    "refit_source_set_destroy": (None, [_P]),
})


_DEV_CPU = _ffi.DEVICE_CPU
_DEV_PINNED = _ffi.DEVICE_CUDA_HOST
_DEV_CUDA = _ffi.DEVICE_CUDA
_dtype_words: dict = {}   # torch dtype -> its refit dtype, shifted into word 2


def _dtype_word(dt):
    w = _dtype_words.get(dt)
    if w is None:
        from .torch_util import refit_dtype
        code, bits = refit_dtype(dt)
        w = _dtype_words[dt] = (code << 32) | (bits << 40) | (1 << 48)
    return w


def _dtype_row_words(dtypes):
    """Each dtype's word (one dict look-up a tensor, at C speed)."""
    try:
        return list(map(_dtype_words.__getitem__, dtypes))
    except KeyError:
        for dt in set(dtypes):
            _dtype_word(dt)
        return list(map(_dtype_words.__getitem__, dtypes))


# (data_ptr, get_device, is_contiguous) by name, for any torch-like object
_BY_NAME = (operator.methodcaller("data_ptr"), operator.methodcaller("get_device"),
            operator.methodcaller("is_contiguous"))
_torch_methods: Any = None  # (torch.Tensor's own three, {torch.Tensor, torch.nn.Parameter})
_get_shape = operator.attrgetter("shape")
_get_dtype = operator.attrgetter("dtype")
_add = operator.add
_TAIL = struct.Struct("=QQQQ")   # a row's ndim|dtype, shape*, strides*, byte_offset


def _getters(ts):
    """The three methods to map over ts: torch.Tensor's own (no bound
    method made per tensor) when every tensor is exactly a torch.Tensor or
    a Parameter, which overrides none of them; else looked up by name."""
    global _torch_methods
    if _torch_methods is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return _BY_NAME
        T = torch.Tensor
        _torch_methods = ((T.data_ptr, T.get_device, T.is_contiguous), {T, torch.nn.Parameter})
    mine, plain = _torch_methods
    return mine if set(map(type, ts)) <= plain else _BY_NAME


def _is_pair(key):
    """A _fill key of (None, shape, strides), not a shape."""
    return len(key) == 3 and key[0] is None


def _names_table(names):
    """(names, their NUL-terminated blob, an array of pointers into it)."""
    joined = "\0".join(names)
    blob = (joined + "\0").encode()
    if len(blob) == len(joined) + 1:        # ASCII: one byte a character
        lens = map(_add, map(len, names), itertools.repeat(1))
    else:
        lens = [len(s.encode()) + 1 for s in names]
    buf = ctypes.create_string_buffer(blob, len(blob))
    ptrs = list(itertools.accumulate(lens, initial=ctypes.addressof(buf)))
    del ptrs[-1]
    return list(names), buf, array.array("Q", ptrs)


_names_seen: dict = {}  # len(names) -> the last _names_table of that many names


# ---- numpy and DLPack rows: fields gathered from memory, a row at a time in C

class _Memory:
    """A numpy view of n items of typestr at addr (no copy, no ctypes type)."""

    def __init__(self, addr, n, typestr):
        self.__array_interface__ = {"data": (addr, True), "shape": (n,),
                                    "typestr": typestr, "version": 3}


def _gather(np, addrs, dt):
    """The item of dtype dt at each address of addrs (a uint64 array of
    addresses aligned to dt): one fancy index over a view spanning them."""
    size = dt.itemsize
    lo = int(addrs.min())
    n = (int(addrs.max()) - lo) // size + 1
    mem = np.asarray(_Memory(lo, n, dt.str))
    return mem[(addrs - lo) // size]


_layout: dict = {}   # "array" / "capsule" -> the verified offsets, or None


def _array_layout(np):
    """(data, flags) offsets of PyArrayObject_fields, checked against
    ctypes on two arrays (contiguous and not); None if they differ."""
    if "array" not in _layout:
        _layout["array"] = None
        try:
            head = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
            a, b = np.arange(4, dtype=np.float32), np.arange(6, dtype=np.float64)[::2]
            data, flags = head, head + 6 * 8

            def rd(obj, off, ct):
                return ct.from_address(id(obj) + off).value
            if (rd(a, data, ctypes.c_void_p) == a.ctypes.data and rd(a, flags, ctypes.c_int) & 1
                    and rd(b, data, ctypes.c_void_p) == b.ctypes.data
                    and not rd(b, flags, ctypes.c_int) & 1
                    and rd(a, head + 8, ctypes.c_int) == 1):
                _layout["array"] = (data, flags)
        except Exception:  # noqa: BLE001 (any surprise: the slow path)
            pass
    return _layout["array"]


def _capsule_layout(np):
    """(pointer, name) offsets of a PyCapsule, checked against
    PyCapsule_GetPointer on a numpy DLPack capsule; None if they differ."""
    if "capsule" not in _layout:
        _layout["capsule"] = None
        try:
            from .tensors import _capsule_ptr
            head = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
            cap = np.arange(2, dtype=np.float32).__dlpack__()
            ptr = ctypes.c_void_p.from_address(id(cap) + head).value
            name = ctypes.c_char_p.from_address(id(cap) + head + 8).value
            if ptr == _capsule_ptr(cap, b"dltensor") and name == b"dltensor":
                _layout["capsule"] = (head, head + 8)
        except Exception:  # noqa: BLE001
            pass
    return _layout["capsule"]


_np_words: dict = {}   # numpy dtype -> its word 2 (native byte order only)


def _np_dtype_words(names, dtypes):
    """Each numpy dtype's word; a dtype refit cannot take refused naming
    the first row of it (RefitError REFIT_EINVAL)."""
    try:
        return list(map(_np_words.__getitem__, dtypes))
    except KeyError:
        from .core import RefitError
        from .tensors import numpy_code
        for dt in set(dtypes):
            if dt in _np_words:
                continue
            try:
                code, bits = numpy_code(dt)
            except TypeError as err:
                row = dtypes.index(dt)
                raise RefitError(-1, "REFIT_EINVAL", "tensor %s: %s" % (names[row], err),
                                 "load_dict") from None
            _np_words[dt] = (code << 32) | (bits << 40) | (1 << 48)
        return list(map(_np_words.__getitem__, dtypes))


_first = operator.itemgetter(0)
_DLPACK_HEADER = 32   # DLManagedTensorVersioned: version, manager_ctx, deleter, flags


def _address(buf):
    return buf.buffer_info()[0] if len(buf) else 0


class Table:
    """n rows of (name, refit_tensor) over tensors kept alive here.
    names_ptr / srcs_ptr: what refit_load_many and refit_source_set_create
    take. device: (type, id) of the first device tensor, or None."""

    __slots__ = ("n", "names", "tensors", "device", "_blob", "_name_ptrs", "_dims", "_rows",
                 "names_ptr", "srcs_ptr", "_caps")

    def __init__(self, names, tensors):
        names = list(names)
        tensors = list(tensors)
        self.n = n = len(names)
        if len(tensors) != n:
            raise ValueError("refit: %d names for %d tensors" % (n, len(tensors)))
        self.names = names
        self.tensors = tensors
        self.device = None
        self._caps = None
        self._set_names(names)
        np = sys.modules.get("numpy")
        types = set(map(type, tensors))
        if np is not None and types and all(issubclass(t, np.ndarray) for t in types):
            done = self._rows_numpy(np, tensors)
        else:
            try:
                self._rows_torch(tensors)
                done = True
            except AttributeError:  # not torch-like
                self.device = None
                done = np is not None and self._rows_dlpack(np, types, tensors)
        if not done:        # one descriptor at a time
            self._rows_described(tensors)
        self.srcs_ptr = _address(self._rows)

    def _set_names(self, names):
        # the names of a model's updates repeat: equal to the last list of
        # this length, its NUL-separated blob and pointers serve again
        # (refit reads them, never writes them)
        hit = _names_seen.get(len(names))
        if hit is None or hit[0] != names:
            hit = _names_table(names)
            if len(_names_seen) >= 8:
                _names_seen.clear()
            _names_seen[len(names)] = hit
        _, self._blob, self._name_ptrs = hit
        self.names_ptr = _address(self._name_ptrs)

    def _rows_torch(self, ts):
        # map over C callables: no Python frame per tensor
        get_ptr, get_device, is_contiguous = _getters(ts)
        ptrs = list(map(get_ptr, ts))
        devs = list(map(get_device, ts))       # -1: host memory
        dwords = _dtype_row_words(list(map(_get_dtype, ts)))
        lo, hi = min(devs, default=0), max(devs, default=0)
        if lo == hi and lo >= 0:                # one device: one word
            devwords = [_DEV_CUDA | (lo << 32)] * len(devs)
        elif lo >= 0:
            devwords = [_DEV_CUDA | (d << 32) for d in devs]
        else:
            devwords = [(_DEV_CUDA | (d << 32)) if d >= 0
                        else (_DEV_PINNED if t.is_pinned() else _DEV_CPU)
                        for d, t in zip(devs, ts)]
        if devs and hi >= 0:
            self.device = (_DEV_CUDA, lo if lo >= 0 else next(d for d in devs if d >= 0))
        # a contiguous tensor's key is its shape alone (strides: none); the
        # others' (None, shape, strides), which no shape equals
        keys = list(map(_get_shape, ts))
        contig = list(map(is_contiguous, ts))
        if not all(contig):
            keys = [k if c else (None, k, t.stride()) for k, c, t in zip(keys, contig, ts)]
        self._fill(ptrs, devwords, dwords, keys)

    def _rows_numpy(self, np, ts):
        """numpy rows (host memory): False where the array layout is not
        the one checked, or some array is not C-contiguous (described)."""
        lay = _array_layout(np)
        if lay is None:
            return False
        n = self.n
        dwords = _np_dtype_words(self.names, list(map(_get_dtype, ts)))
        if n == 0:
            self._fill([], [], dwords, [])
            return True
        ids = np.fromiter(map(id, ts), dtype=np.uint64, count=n)
        flags = _gather(np, ids + np.uint64(lay[1]), np.dtype(np.uint32))
        if not (flags & 1).all():   # a strided view: its strides, in items, are read there
            return False
        ptrs = _gather(np, ids + np.uint64(lay[0]), np.dtype(np.uint64)).tolist()
        self._fill(ptrs, [_DEV_CPU], dwords, list(map(_get_shape, ts)))
        return True

    def _rows_dlpack(self, np, types, ts):
        """Rows of objects with only __dlpack__ (CuPy, JAX): each row the
        DLTensor of its capsule, copied as it is (refit_tensor is its
        layout); the capsules are kept here, and a device producer is asked
        for them on CUDA's legacy default stream, as describe() asks. False
        where the capsule layout is not the one checked, a producer speaks
        DLPack 0.x only or a capsule is of another kind (described)."""
        if not all(hasattr(t, "__dlpack__") and not hasattr(t, "_refit_desc") for t in types):
            return False
        lay = _capsule_layout(np)
        if lay is None or self.n == 0:
            return False
        u64, u32 = np.dtype(np.uint64), np.dtype(np.uint32)
        devs = list(map(operator.methodcaller("__dlpack_device__"), ts))
        kinds_of = {int(d) for d in set(map(_first, devs))}
        if not kinds_of <= {_DEV_CPU, _DEV_CUDA, _DEV_PINNED}:
            return False
        host = operator.methodcaller("__dlpack__", max_version=(1, 0))
        try:
            if _DEV_CUDA not in kinds_of:
                caps = list(map(host, ts))
            else:   # as describe() asks: ordered after CUDA's legacy default stream
                cuda = operator.methodcaller("__dlpack__", max_version=(1, 0), stream=1)
                caps = [cuda(t) if int(d[0]) == _DEV_CUDA else host(t) for t, d in zip(ts, devs)]
        except Exception:  # noqa: BLE001 (DLPack 0.x only, a dtype DLPack has not: described)
            return False
        n = self.n
        ids = np.fromiter(map(id, caps), dtype=np.uint64, count=n)
        names = _gather(np, ids + np.uint64(lay[1]), u64)
        managed = _gather(np, ids + np.uint64(lay[0]), u64)
        kinds = {p: ctypes.string_at(p) if p else b"" for p in np.unique(names).tolist()}
        if set(kinds.values()) - {b"dltensor_versioned", b"dltensor"} or not managed.all():
            return False
        versioned = np.zeros(n, dtype=bool)
        for p, k in kinds.items():
            if k == b"dltensor_versioned":
                versioned |= names == np.uint64(p)
        if versioned.any() and (_gather(np, managed[versioned], u32) != 1).any():
            return False    # a DLPack major version refit does not read
        dl = managed + versioned.astype(np.uint64) * np.uint64(_DLPACK_HEADER)
        r = array.array("Q", bytes(48 * n))
        for w in range(6):
            r[w::6] = array.array("Q", _gather(np, dl + np.uint64(8 * w), u64).tobytes())
        self._rows = r
        self._dims = array.array("q")
        self._caps = caps
        for d in devs:
            if int(d[0]) == _DEV_CUDA:
                self.device = (_DEV_CUDA, int(d[1]))
                break
        return True

    def _rows_described(self, ts):
        from .core import _describe_as
        descs = [_describe_as(t, None, "tensor %s" % k, "load_dict") for k, t in zip(self.names, ts)]
        ptrs = [d.t.data or 0 for d in descs]
        devwords = [d.device_type | (d.device_id << 32) for d in descs]
        dwords = [(d.t.dtype.code << 32) | (d.t.dtype.bits << 40) | (1 << 48) for d in descs]
        keys = []
        for d in descs:     # the refit_tensor's own shape and strides (a DLTensor's too)
            nd = d.t.ndim
            shape = tuple(d.t.shape[:nd]) if nd else ()
            keys.append((None, shape, tuple(d.t.strides[:nd])) if nd and d.t.strides else shape)
        for d in descs:
            if d.device_type == _DEV_CUDA:
                self.device = (_DEV_CUDA, d.device_id)
                break
        self._fill(ptrs, devwords, dwords, keys)
        offsets = [d.t.byte_offset for d in descs]
        if any(offsets):    # where the first element is (a negative-strided view's)
            self._rows[5::6] = array.array("Q", offsets)
        self._caps = descs  # a DLPack capsule lives as long as its Desc

    def _fill(self, ptrs, devwords, dwords, keys):
        # keys: each row's shape (contiguous: no strides) or (None, shape,
        # strides). Each distinct key once in _dims, its shape then its
        # strides; a row's last four words (ndim|dtype, shape*, strides*,
        # byte_offset) are those of its key and dtype, packed once per
        # distinct pair and joined a row at a time (a model repeats a few
        # shapes and one dtype); ptrs and devices go in by array slices.
        # No per-row tuple is kept (nor traced by the garbage collector)
        n = self.n
        first = {}
        try:
            if n and keys.count(keys[0]) == n:  # one key (an MoE's experts): no hashing
                first[keys[0]] = 0
                rows = [0] * n
            else:
                rows = list(map(first.setdefault, keys, range(n)))
        except TypeError:   # a list for a shape or strides (torch-like, not torch)
            keys = [(None, tuple(k[1]), tuple(k[2])) if _is_pair(k) else tuple(k) for k in keys]
            first = {}
            rows = list(map(first.setdefault, keys, range(n)))
        flat, dims_of = [], {}      # key's row -> (ndim, shape at, strides at or -1)
        for key, i in first.items():
            shape, strides = (key[1], key[2]) if _is_pair(key) else (key, None)
            at = len(flat)
            flat.extend(shape)
            dims_of[i] = (len(shape), at, len(flat) if strides is not None else -1)
            if strides is not None:
                flat.extend(strides)
        self._dims = array.array("q", flat)
        base = _address(self._dims)
        if n == 0 or dwords.count(dwords[0]) == n:    # one dtype: a tail per key
            tail_of = rows
            pairs = {i: (i, dwords[0]) for i in first.values()}
        else:
            combos = {}
            tail_of = list(map(combos.setdefault, zip(rows, dwords), range(n)))
            pairs = {i: pair for pair, i in combos.items()}
        tails = {}
        for i, (ki, dw) in pairs.items():
            ndim, sh, st = dims_of[ki]
            tails[i] = _TAIL.pack(ndim | dw, base + 8 * sh, 0 if st < 0 else base + 8 * st, 0)
        body = array.array("Q")
        if len(tails) == 1:
            body.frombytes(next(iter(tails.values())))
            body *= n
        else:
            body.frombytes(b"".join(map(tails.__getitem__, tail_of)))
        r = array.array("Q", bytes(48 * n))
        r[0::6] = array.array("Q", ptrs)
        if n and (len(devwords) == 1 or devwords.count(devwords[0]) == n):
            r[1::6] = array.array("Q", devwords[:1]) * n
        else:
            r[1::6] = array.array("Q", devwords)
        r[2::6] = body[0::4]
        r[3::6] = body[1::4]
        r[4::6] = body[2::4]
        self._rows = r

    def data_pointers(self, tensors=None):
        """A void* array of the tensors' data pointers (the held ones when
        tensors is None), for refit_source_set_repoint."""
        ts = self.tensors if tensors is None else list(tensors)
        if len(ts) != self.n:
            raise ValueError("refit: %d tensors for a set of %d" % (len(ts), self.n))
        try:
            ptrs = [t.data_ptr() for t in ts]
        except AttributeError:
            from .core import describe
            ptrs = [describe(t).t.data or 0 for t in ts]
        return array.array("Q", ptrs)


def _desc_key(t):
    """A refit_tensor's row key: its shape (NULL strides: contiguous), else
    (None, shape, strides)."""
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if not t.strides:
        return shape
    return (None, shape, tuple(t.strides[i] for i in range(t.ndim)))


def split(tensors, expected=None, foreign=None):
    """(names, tensors) of a mapping, less the names not in expected when
    it is given (strict=False) and those in foreign (other ranks' experts)."""
    if expected is None and not foreign:
        return list(tensors.keys()), list(tensors.values())
    if expected is None:
        items = [(k, v) for k, v in tensors.items() if k not in foreign]
    else:
        items = [(k, v) for k, v in tensors.items() if k in expected]
    return [k for k, _ in items], [v for _, v in items]
