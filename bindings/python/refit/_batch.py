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
way, through the interfaces their producers publish: an array's
__array_struct__, a DLPack capsule (consumed as DLPack's Python spec says:
renamed used, each tensor's deleter called when the table is collected);
the structs behind them are read for every row at once by a numpy fancy
index over the process's memory, and a table the fast path cannot read (a
strided numpy view, a DLPack 0.x producer, ...) goes through
refit.describe row by row, as other tensors do."""

import array
import ctypes
import itertools
import operator
import struct
import sys
from typing import Any

from . import _ffi
from . import tensors as _tensors
from .tensors import _DLManagedTensorVersioned as _DLMV

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


# ---- numpy and DLPack rows: public interfaces, read for every row at once
#
# Each row's fields come from an interface its producer publishes, never
# from an object's own struct (whose layout a numpy or CPython release may
# change): numpy's __array_struct__ (the array interface protocol's C
# struct, PyArrayInterface, documented by numpy with a sanity member equal
# to 2), and DLPack's capsule (DLManagedTensorVersioned, or the legacy
# DLManagedTensor, as the DLPack spec defines them). Each capsule's
# pointer is asked of CPython's PyCapsule_GetPointer (a checked call: the
# wrong name raises); the structs behind the pointers are then read for
# all rows at once by a numpy fancy index over the process's memory
# (_gather), not by a ctypes object per row.

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


def _gather_rows(np, addrs, offsets):
    """The uint64 words at each address of addrs (8-byte aligned) plus
    each of offsets: an array of len(addrs) rows, one column an offset."""
    lo = int(addrs.min())
    offs = np.asarray(offsets, dtype=np.int64)
    n = (int(addrs.max()) - lo + int(offs.max())) // 8 + 1
    mem = np.asarray(_Memory(lo, n, np.dtype(np.uint64).str))
    return mem[((addrs - np.uint64(lo)) // np.uint64(8)).astype(np.int64)[:, None] + offs // 8]


class _ArrayStruct(ctypes.Structure):
    """numpy's PyArrayInterface, what __array_struct__'s capsule holds."""
    _fields_ = [("two", ctypes.c_int), ("nd", ctypes.c_int), ("typekind", ctypes.c_char),
                ("itemsize", ctypes.c_int), ("flags", ctypes.c_int),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("data", ctypes.c_void_p), ("descr", ctypes.c_void_p)]


_NPY_C_CONTIGUOUS = 0x1      # PyArrayInterface.flags: the row-major, gap-free layout
_DLPACK_HEADER = _DLMV.dl_tensor.offset   # DLManagedTensorVersioned: version .. flags
_USED_VERSIONED, _USED_LEGACY = _tensors.USED_VERSIONED, _tensors.USED_LEGACY
# by the DLTensor's offset in its managed struct: the offsets of a row's
# words (the DLTensor's six, the deleter, then the version when versioned)
_DLPACK_WORDS = {
    _DLPACK_HEADER: [_DLPACK_HEADER + 8 * w for w in range(6)]
    + [_tensors.DELETER_AT_VERSIONED, 0],
    0: [8 * w for w in range(6)] + [_tensors.DELETER_AT_LEGACY]}
_consume = _tensors.consume
# PyCapsule_GetPointer(capsule, name) as an int (0 for NULL); ValueError
# when the capsule's name is another (CPython raises, ctypes passes it on)
_capsule_addr = _tensors.capsule_pointer
_array_struct = operator.attrgetter("__array_struct__")
# one producer call a row: __dlpack__ with no stream, which DLPack's
# Python spec defines for CUDA as the legacy default stream (what
# describe() asks for, stream=1) and requires on the host; the device is
# the DLTensor's own, so __dlpack_device__ is not asked
_dlpack_v1 = operator.methodcaller("__dlpack__", max_version=(1, 0))


_np_words: dict = {}   # numpy dtype -> its word 2 (native byte order only)


def _np_dtype_words(names, dtypes):
    """Each numpy dtype's word; a dtype refit cannot take refused naming
    the first row of it (RefitError REFIT_EINVAL)."""
    try:
        return list(map(_np_words.__getitem__, dtypes))
    except KeyError:
        from ._errors import RefitError
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
        """numpy rows (host memory), each array's data pointer and flags
        from its __array_struct__: False where some array is not
        C-contiguous (a strided or negative-strided view: described), or
        a struct is not the documented one (its member two is not 2)."""
        n = self.n
        dwords = _np_dtype_words(self.names, list(map(_get_dtype, ts)))
        if n == 0:
            self._fill([], [], dwords, [])
            return True
        structs = list(map(_array_struct, ts))  # each owns its struct: kept while read
        try:
            at = np.fromiter(map(_capsule_addr, structs, itertools.repeat(None)),
                             dtype=np.uint64, count=n)
        except ValueError:  # a subclass's __array_struct__ that is no such capsule
            return False
        i32 = np.dtype(np.int32)
        if (_gather(np, at + np.uint64(_ArrayStruct.two.offset), i32) != 2).any():
            return False
        flags = _gather(np, at + np.uint64(_ArrayStruct.flags.offset), i32)
        if not (flags & _NPY_C_CONTIGUOUS).all():
            return False
        ptrs = _gather(np, at + np.uint64(_ArrayStruct.data.offset), np.dtype(np.uint64))
        self._fill(ptrs.tolist(), [_DEV_CPU], dwords, list(map(_get_shape, ts)))
        return True

    def _rows_dlpack(self, np, types, ts):
        """Rows of objects with only __dlpack__ (CuPy, JAX): each row the
        DLTensor of its capsule, copied as it is (refit_tensor is its
        layout), every capsule consumed (renamed used, its deleter called
        when the table is collected: tensors.consume). False (described,
        which says what is wrong) where a producer speaks DLPack 0.x only,
        its capsules are not all of one kind (versioned or legacy), a
        versioned one is not 1.x, or a device is not CPU, CUDA or CUDA
        host memory: then no capsule was consumed."""
        if not all(hasattr(t, "__dlpack__") and not hasattr(t, "_refit_desc") for t in types):
            return False
        n = self.n
        if n == 0:
            return False
        try:
            caps = list(map(_dlpack_v1, ts))
        except Exception:  # noqa: BLE001 (DLPack 0.x only, a dtype DLPack has not: described)
            return False
        try:
            at = np.fromiter(map(_capsule_addr, caps, itertools.repeat(b"dltensor_versioned")),
                             dtype=np.uint64, count=n)
            header, used = _DLPACK_HEADER, _USED_VERSIONED
        except ValueError:  # not all versioned: a 0.x producer's legacy capsules?
            try:
                at = np.fromiter(map(_capsule_addr, caps, itertools.repeat(b"dltensor")),
                                 dtype=np.uint64, count=n)
                header, used = 0, _USED_LEGACY
            except ValueError:
                return False
        if not at.all() or (at & np.uint64(7)).any():
            return False
        # every word a row needs, by one index over memory: the DLTensor's
        # six, the deleter, and (versioned) the word holding the major
        # version; all at 8-byte offsets from the managed tensor's start
        words = _gather_rows(np, at, _DLPACK_WORDS[header])
        if header and ((words[:, 7] & np.uint64(0xFFFFFFFF)) != 1).any():
            return False    # a DLPack major version refit does not read
        kinds = words[:, 1] & np.uint64(0xFFFFFFFF)
        if not np.isin(kinds, (_DEV_CPU, _DEV_CUDA, _DEV_PINNED)).all():
            return False
        self._rows = array.array("Q", words[:, :6].tobytes())
        self._dims = array.array("q")
        dels = words[:, 6]
        if (dels == dels[0]).all():     # one producer's deleter: no grouping
            groups = [(int(dels[0]), at.tolist())]
        else:
            groups = [(int(d), at[dels == d].tolist()) for d in np.unique(dels)]
        self._caps = _consume(caps, groups, used)
        cuda = np.flatnonzero(kinds == np.uint64(_DEV_CUDA))
        if len(cuda):
            self.device = (_DEV_CUDA, int(words[cuda[0], 1]) >> 32)
        return True

    def _rows_described(self, ts):
        from ._errors import _describe_as
        descs = []
        for k, t in zip(self.names, ts):
            try:
                descs.append(_describe_as(t, None, "tensor %s" % k, "load_dict"))
            except (TypeError, ValueError) as err:     # the same kind, naming the row
                if type(err) not in (TypeError, ValueError):
                    raise
                why = str(err)
                raise type(err)("refit: tensor %s: %s" % (k, why[7:] if why.startswith(
                    "refit: ") else why)) from None
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
            from ._errors import describe
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
