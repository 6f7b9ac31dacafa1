"""ctypes declarations of include/refit/refit.h (the public API), and of the
few refit/sys calls the binding itself makes (undo memory held, a txn's
staging peak, preparing a CUDA stream).

The structs mirror the C layouts field for field; keep them in step with
refit.h (members are only ever appended there, under a version check).

The library is looked for, first found wins: $REFIT_LIB; librefit.so inside
this package (where `pip install` puts it, with the format plugins in
plugins/ beside it); the source tree's build folders (a checkout); the
system's library path."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Callable, List

c_int64_p = ctypes.POINTER(ctypes.c_int64)

MAX_DIMS = 8

DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3


class Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", Device),
        ("ndim", ctypes.c_int32),
        ("dtype", DType),
        ("shape", c_int64_p),
        ("strides", c_int64_p),
        ("byte_offset", ctypes.c_uint64),
    ]


OPTIONS_VERSION = 3
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class Options(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("worker_id", ctypes.c_char_p),
        ("rank", ctypes.c_int32),
        ("journal_path", ctypes.c_char_p),
        ("plugin_dirs", ctypes.c_char_p),
        ("staging_budget", ctypes.c_uint64),
        ("journal_best_effort", ctypes.c_int),
        ("undo_device_budget", ctypes.c_uint64),
        ("log_fn", LOG_FN),
        ("log_user", ctypes.c_void_p),
        # version 3: masters for deltas into online-quantized modules
        ("delta_master_budget", ctypes.c_uint64),
    ]


CKPT_SPEC_VERSION = 1


class CkptSpec(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("dtype", DType),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("target", ctypes.c_char_p),
        ("shard_dim", ctypes.c_int32),
        ("shard_rank", ctypes.c_int32),
        ("shard_count", ctypes.c_int32),
        ("pad_to", ctypes.c_int64),
        ("expert", ctypes.c_int64),
        ("dst_offset", ctypes.c_int64 * MAX_DIMS),
        ("tie_of", ctypes.c_char_p),
    ]


UPDATE_OPTS_VERSION = 4
# refit_update_opts.undo_source (refit.h REFIT_UNDO_*)
UNDO_SOURCES = {"auto": 0, "undo-log": 1, "files": 2, "snapshot": 3, "off": 4, "keeper": 5}


class UpdateOpts(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("version_label", ctypes.c_char_p),
        ("source_uri", ctypes.c_char_p),
        ("rollback", ctypes.c_int),
        ("source_digest", ctypes.c_char_p),
        ("fingerprint", ctypes.c_int),
        ("partial", ctypes.c_int),
        ("keep_going", ctypes.c_int),
        # version 3: a delta update
        ("base_version", ctypes.c_char_p),
        ("changed_modules", ctypes.POINTER(ctypes.c_char_p)),
        ("n_changed_modules", ctypes.c_uint32),
        ("others_unchanged", ctypes.c_int),
        # version 4: what restores an abort (docs/core.md "Undo sources")
        ("undo_source", ctypes.c_int),
    ]


SEAL_OPTS_VERSION = 1


class SealOpts(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("undo_reserve", ctypes.c_int),
    ]


REPLAY_OPTS_VERSION = 1


class ReplayOpts(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("full", ctypes.c_int),
        ("rollback", ctypes.c_int),
    ]


RESTORE_OPTS_VERSION = 1


class RestoreOpts(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("rollback", ctypes.c_int),
    ]


class ModelStats(ctypes.Structure):
    _fields_ = [
        ("modules", ctypes.c_uint32),
        ("runtime_tensors", ctypes.c_uint32),
        ("side_tensors", ctypes.c_uint32),
        ("ckpt_tensors", ctypes.c_uint32),
        ("routes_direct", ctypes.c_uint32),
        ("routes_staged", ctypes.c_uint32),
        ("routes_view", ctypes.c_uint32),
        ("runtime_bytes", ctypes.c_uint64),
    ]


class TxnStats(ctypes.Structure):
    _fields_ = [
        ("tensors_loaded", ctypes.c_uint64),
        ("bytes_loaded", ctypes.c_uint64),
        ("modules_touched", ctypes.c_uint32),
        ("modules_complete", ctypes.c_uint32),
        ("undo_device_bytes", ctypes.c_uint64),
        ("undo_host_bytes", ctypes.c_uint64),
    ]


class Delta(ctypes.Structure):
    """refit_delta: one row of refit_load_deltas."""
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("n", ctypes.c_size_t),
        ("indices", ctypes.c_void_p),
        ("counts", ctypes.c_void_p),
        ("values", ctypes.POINTER(Tensor)),
    ]


class SourceTensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", DType),
        ("ndim", ctypes.c_int32),
        ("shape", c_int64_p),
        ("bytes", ctypes.c_uint64),
        ("file", ctypes.c_char_p),
    ]


PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
                               ctypes.c_char_p)
FILTER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)

_P = ctypes.c_void_p
_S = ctypes.c_char_p
_I = ctypes.c_int

# name: (restype, argtypes)
_PROTOS = {
    "refit_strerror": (_S, [_I]),
    "refit_status_name": (_S, [_I]),
    "refit_dtype_name": (_S, [DType]),
    "refit_open": (_I, [ctypes.POINTER(_P), ctypes.POINTER(Options)]),
    "refit_close": (None, [_P]),
    "refit_errmsg": (_S, [_P]),
    "refit_worker_health": (_I, [_P]),
    "refit_health_name": (_S, [_I]),
    "refit_check_serving": (_I, [_P]),
    "refit_worker_version": (_S, [_P]),
    "refit_journal_behind": (_I, [_P]),
    "refit_metrics_text": (_I, [_P, ctypes.POINTER(_P), ctypes.POINTER(ctypes.c_size_t)]),
    "refit_metrics_free": (None, [_P]),
    "refit_module_version": (_S, [_P, _S]),
    "refit_model_create": (_I, [ctypes.POINTER(_P), _P]),
    "refit_model_destroy": (None, [_P]),
    "refit_model_add_module": (_I, [_P, _S, _S, _S]),
    "refit_module_bind_runtime": (_I, [_P, _S, _S, ctypes.POINTER(Tensor)]),
    "refit_model_add_side": (_I, [_P, _S, ctypes.POINTER(Tensor)]),
    "refit_model_expect": (_I, [_P, _S, _S, ctypes.POINTER(CkptSpec)]),
    "refit_model_load_manifest": (_I, [_P, _S]),
    "refit_model_seal": (_I, [_P]),
    "refit_model_seal_with": (_I, [_P, ctypes.POINTER(SealOpts)]),
    "refit_model_stats_get": (_I, [_P, ctypes.POINTER(ModelStats)]),
    "refit_runtime_fingerprint": (_I, [_P, _S, _S, ctypes.POINTER(ctypes.c_uint64)]),
    "refit_model_fingerprint": (_I, [_P, ctypes.POINTER(ctypes.c_uint64)]),
    "refit_begin": (_I, [ctypes.POINTER(_P), _P, ctypes.POINTER(UpdateOpts)]),
    "refit_load": (_I, [_P, _S, ctypes.POINTER(Tensor), _P]),
    "refit_load_part": (_I, [_P, _S, ctypes.c_int64, ctypes.POINTER(Tensor), _P]),
    "refit_load_delta": (_I, [_P, _S, ctypes.c_size_t, _P, ctypes.POINTER(Tensor), _P]),
    "refit_load_delta_runs": (_I, [_P, _S, ctypes.c_size_t, _P, _P, ctypes.POINTER(Tensor),
                                   _P]),
    "refit_load_deltas": (_I, [_P, ctypes.c_size_t, _P, _P]),
    "refit_finalize": (_I, [_P]),
    "refit_finalize_prepare": (_I, [_P]),
    "refit_commit": (_I, [_P]),
    "refit_abort": (_I, [_P]),
    "refit_abort_reason": (_I, [_P, _S]),
    "refit_txn_journal_id": (ctypes.c_int64, [_P]),
    "refit_replay": (_I, [_P, ctypes.c_int64, ctypes.POINTER(ReplayOpts)]),
    "refit_snapshot_write": (_I, [_P, _S]),
    "refit_restore": (_I, [_P, _S, ctypes.POINTER(RestoreOpts)]),
    "refit_snapshot_verify": (_I, [_P, _S]),
    "refit_txn_stats_get": (_I, [_P, ctypes.POINTER(TxnStats)]),
    "refit_source_open": (_I, [ctypes.POINTER(_P), _P, _S]),
    "refit_source_open_memory": (_I, [ctypes.POINTER(_P), _P, _P, ctypes.c_size_t, _S]),
    "refit_source_is_durable": (_I, [_P]),
    "refit_source_digest": (_I, [_P, ctypes.POINTER(ctypes.c_char)]),
    "refit_source_identity": (_I, [_P, ctypes.POINTER(ctypes.c_char)]),
    "refit_source_close": (None, [_P]),
    "refit_source_count": (ctypes.c_size_t, [_P]),
    "refit_source_tensor_at": (_I, [_P, ctypes.c_size_t, ctypes.POINTER(SourceTensor)]),
    "refit_source_uri": (_S, [_P]),
    "refit_load_source": (_I, [_P, _P, PROGRESS_FN, _P, _P]),
    "refit_load_source_filtered": (_I, [_P, _P, FILTER_FN, _P, PROGRESS_FN, _P, _P]),
    # refit/sys/stats.h, refit/sys/cuda.h (docs/abi.md: may change in a minor
    # release); a library without one: calling it raises AttributeError
    "refit_sys_undo_held": (_I, [_P, _I, ctypes.POINTER(ctypes.c_uint64),
                                 ctypes.POINTER(ctypes.c_uint64)]),
    "refit_sys_txn_staging_peak": (ctypes.c_size_t, [_P]),
    "refit_sys_txn_delta": (None, [_P, ctypes.POINTER(ctypes.c_uint64),
                                   ctypes.POINTER(ctypes.c_uint32)]),
    "refit_sys_cuda_prepare": (_I, [_I, _P, ctypes.c_uint]),
    "refit_sys_cuda_last_error": (_S, []),
}

# refit_sys_cuda_prepare's what (refit/sys/cuda.h)
CUDA_PREPARE_SAVES = 1
CUDA_PREPARE_RING = 2

_lib = None
HERE = os.path.dirname(os.path.abspath(__file__))


def bundled_plugin_dir() -> str | None:
    """The plugins folder installed inside this package, or None (a
    checkout, where the build's own plugins are found by the library)."""
    d = os.path.join(HERE, "plugins")
    return d if os.path.isdir(d) else None


def _candidates():
    env = os.environ.get("REFIT_LIB")
    if env:
        yield env
    yield os.path.join(HERE, "librefit.so")
    root = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    for build in ("build", "build-gpu"):
        yield os.path.join(root, build, "librefit.so")
    found = ctypes.util.find_library("refit")
    if found:
        yield found


def prototyped(protos: dict) -> Callable[[], ctypes.CDLL]:
    """A getter of librefit with protos ({name: (restype, argtypes)}) set
    on its first call: how a module of the binding declares the functions
    it calls beyond _PROTOS."""
    done: List[bool] = []

    def get() -> ctypes.CDLL:
        L = lib()
        if not done:
            for name, (res, args) in protos.items():
                fn = getattr(L, name)
                fn.restype, fn.argtypes = res, args
            done.append(True)
        return L
    return get


def lib() -> ctypes.CDLL:
    """The loaded librefit (REFIT_LIB, then inside the package, then the
    source tree's build folders, then the system's library path)."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        for name, (res, args) in _PROTOS.items():
            fn = getattr(handle, name, None)
            if fn is None:
                continue  # an older library: calls to it raise AttributeError
            fn.restype = res
            fn.argtypes = args
        _lib = handle
        return _lib
    raise OSError("refit: cannot load librefit.so; set REFIT_LIB. Tried: " + "; ".join(tried))
