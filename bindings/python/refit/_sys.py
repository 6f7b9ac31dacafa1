"""refit/sys/cuda.h's counters, for benches and tests (docs/abi.md: a
counter may change meaning or go away in a minor release). Without CUDA
every counter is zero."""

import ctypes
from typing import Dict

from . import _ffi


class CudaStats(ctypes.Structure):
    """refit_sys_cuda_stats, field for field."""
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "batch_launches", "batch_rows", "memcpy_calls", "kernel_copies", "pageable_bytes",
        "ring_waits", "host_copy_ns", "prefault_ns", "ring_wait_ns", "queues",
        "ring_fill_wait_ns", "ring_drain_ns", "ring_dma_ns", "ring_dma_bytes")]


FIELDS = tuple(n for n, *_ in CudaStats._fields_)

lib = _ffi.prototyped({
    "refit_sys_cuda_stats_get": (None, [ctypes.POINTER(CudaStats)]),
})


def cuda_stats() -> Dict[str, int]:
    """The CUDA backend's counters since the process started, by name."""
    s = CudaStats()
    lib().refit_sys_cuda_stats_get(ctypes.byref(s))
    return {n: getattr(s, n) for n in FIELDS}
