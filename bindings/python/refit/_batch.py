"""Descriptor tables for many tensors per call (refit_load_many, source sets).

A table is built in one go, not one ctypes object per tensor: the fields of
every tensor are read in a few list comprehensions, and the refit_tensor
rows (48 bytes: data, device, ndim|dtype, shape*, strides*, byte_offset)
are six 64-bit words each in one array.array, their shape and strides in
another, the names in one NUL-separated bytes object. Tensors that are not
torch-like (no data_ptr/stride) go through refit.describe one by one."""

import array
import ctypes
import itertools

from . import _ffi

_P = ctypes.c_void_p
_protos_set = False


def lib():
    """librefit with the batch functions' prototypes set (refit.h, "many
    tensors per call")."""
    global _protos_set
    L = _ffi.lib()
    if not _protos_set:
        sz = ctypes.c_size_t
        for name, res, args in (
                ("refit_load_many", ctypes.c_int, [_P, sz, _P, _P, _P]),
                ("refit_source_set_create", ctypes.c_int, [ctypes.POINTER(_P), _P, sz, _P, _P]),
                ("refit_source_set_repoint", ctypes.c_int, [_P, sz, _P]),
                ("refit_load_set", ctypes.c_int, [_P, _P, _P]),
                ("refit_source_set_count", sz, [_P]),
                ("refit_source_set_destroy", None, [_P])):
            fn = getattr(L, name)
            fn.restype = res
            fn.argtypes = args
        _protos_set = True
    return L


_DEV_CPU = _ffi.DEVICE_CPU
_DEV_PINNED = _ffi.DEVICE_CUDA_HOST
_DEV_CUDA = _ffi.DEVICE_CUDA
_dtype_words = {}   # torch dtype -> its refit dtype, shifted into word 2


def _dtype_word(dt):
    w = _dtype_words.get(dt)
    if w is None:
        from .torch_util import refit_dtype
        code, bits = refit_dtype(dt)
        w = _dtype_words[dt] = (code << 32) | (bits << 40) | (1 << 48)
    return w


def _address(buf):
    return buf.buffer_info()[0] if len(buf) else 0


class Table:
    """n rows of (name, refit_tensor) over tensors kept alive here.
    names_ptr / srcs_ptr: what refit_load_many and refit_source_set_create
    take. device: (type, id) of the first device tensor, or None."""

    __slots__ = ("n", "names", "tensors", "device", "_blob", "_name_ptrs", "_dims", "_rows",
                 "names_ptr", "srcs_ptr")

    def __init__(self, names, tensors):
        names = list(names)
        tensors = list(tensors)
        self.n = n = len(names)
        if len(tensors) != n:
            raise ValueError("refit: %d names for %d tensors" % (n, len(tensors)))
        self.names = names
        self.tensors = tensors
        self.device = None
        self._set_names(names)
        try:
            self._rows_torch(tensors)
        except AttributeError:  # not torch-like: one descriptor at a time
            self._rows_described(tensors)
        self.srcs_ptr = _address(self._rows)

    def _set_names(self, names):
        joined = "\0".join(names)
        blob = (joined + "\0").encode()
        if len(blob) == len(joined) + 1:        # ASCII: one byte a character
            lens = [len(s) + 1 for s in names]
        else:
            lens = [len(s.encode()) + 1 for s in names]
        self._blob = ctypes.create_string_buffer(blob, len(blob))
        base = ctypes.addressof(self._blob)
        offs = itertools.accumulate(lens, initial=0)
        self._name_ptrs = array.array("Q", [base + o for o in itertools.islice(offs, len(names))])
        self.names_ptr = _address(self._name_ptrs)

    def _rows_torch(self, ts):
        ptrs = [t.data_ptr() for t in ts]
        shapes = [t.shape for t in ts]
        strides = [t.stride() for t in ts]
        devs = [t.get_device() for t in ts]      # -1: host memory
        words2 = [len(s) | _dtype_word(t.dtype) for s, t in zip(shapes, ts)]
        if min(devs, default=0) < 0:
            devwords = [(_DEV_CUDA | (d << 32)) if d >= 0
                        else (_DEV_PINNED if t.is_pinned() else _DEV_CPU)
                        for d, t in zip(devs, ts)]
        else:
            devwords = [_DEV_CUDA | (d << 32) for d in devs]
        for d in devs:
            if d >= 0:
                self.device = (_DEV_CUDA, d)
                break
        self._fill(ptrs, devwords, words2, shapes, strides)

    def _rows_described(self, ts):
        from .core import describe
        descs = [describe(t) for t in ts]
        ptrs = [d.t.data or 0 for d in descs]
        devwords = [d.device_type | (d.device_id << 32) for d in descs]
        words2 = [d.t.ndim | (d.t.dtype.code << 32) | (d.t.dtype.bits << 40) | (1 << 48)
                  for d in descs]
        shapes = [tuple(d.shape[:d.t.ndim]) for d in descs]
        strides = [tuple(d.strides[:d.t.ndim]) for d in descs]
        for d in descs:
            if d.device_type == _DEV_CUDA:
                self.device = (_DEV_CUDA, d.device_id)
                break
        self._fill(ptrs, devwords, words2, shapes, strides)

    def _fill(self, ptrs, devwords, words2, shapes, strides):
        n = self.n
        # per row: its shape, then its strides
        self._dims = array.array("q", itertools.chain.from_iterable(
            itertools.chain.from_iterable(zip(shapes, strides))))
        base = _address(self._dims)
        ndims = [w & 0xFFFFFFFF for w in words2]
        offs = list(itertools.accumulate((2 * k for k in ndims), initial=0))
        w = [0] * (6 * n)
        w[0::6] = ptrs
        w[1::6] = devwords
        w[2::6] = words2
        w[3::6] = [base + 8 * o for o in offs[:n]]
        w[4::6] = [base + 8 * (o + k) for o, k in zip(offs, ndims)]
        self._rows = array.array("Q", w)

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


def split(tensors, expected=None):
    """(names, tensors) of a mapping, less the names not in expected when
    it is given (strict=False)."""
    if expected is None:
        return list(tensors.keys()), list(tensors.values())
    items = [(k, v) for k, v in tensors.items() if k in expected]
    return [k for k, _ in items], [v for _, v in items]
