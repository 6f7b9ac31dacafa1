"""Delta files (docs/delta-file.md): a delta update's patches in one
safetensors file, with its base version, its new version and a SHA-256 of
each tensor's indices and values.

    refit.write_delta_file(ctx, "/ckpt/step-1201.delta.safetensors",
                           {"up.weight": (indices, values), ...},
                           base="step-1200", version="step-1201")
    with model.update() as txn:          # base and version from the file
        txn.load_delta_file("/ckpt/step-1201.delta.safetensors")

The writer and the reader are librefit's (refit_delta_file_write,
refit_load_delta_file): one format, one checksum."""
from __future__ import annotations

import ctypes
import json
import os
import struct
from typing import Any, Dict, Tuple

from . import _ffi
from ._errors import RefitError, _b, _check, _describe_as, _int64s

_lib = _ffi.prototyped({
    "refit_delta_file_write": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p,
                                              ctypes.c_char_p, ctypes.c_char_p,
                                              ctypes.c_size_t, ctypes.c_void_p]),
    "refit_load_delta_file": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p,
                                             ctypes.c_void_p]),
})

_EINVAL, _ECORRUPT = -1, -17


def _host(values: Any) -> Any:
    """values in host memory: a torch tensor on a device is copied back."""
    if hasattr(values, "device") and hasattr(values, "detach"):
        if values.device.type != "cpu":
            return values.detach().cpu().contiguous()
        return values.detach().contiguous()
    return values


def write_delta_file(ctx: Any, path: str, patches: Any, *, base: str, version: str) -> None:
    """Write patches (a mapping, or pairs, name -> (indices, values) or
    (starts, counts, values), as txn.load_deltas takes them) against base,
    making version, to path (written to a temporary name, renamed). A row
    the writer can check without the model (a negative index, a value
    count that is not the elements', two rows of one tensor) is refused
    naming it, nothing written; ranges and duplicates are the loader's."""
    items = list(patches.items() if hasattr(patches, "items") else patches)
    rows, keep = [], []
    for name, patch in items:
        call = "write_delta_file %s" % name
        if len(patch) not in (2, 3):
            raise RefitError(_EINVAL, "REFIT_EINVAL", "%s: a patch is (indices, values) or "
                             "(starts, counts, values), not %d items" % (call, len(patch)),
                             call)
        idx = _int64s(patch[0], "indices of %s" % name, call)
        counts = _int64s(patch[1], "run counts of %s" % name, call) if len(patch) == 3 \
            else None
        if counts and counts[1] != idx[1]:
            raise RefitError(_EINVAL, "REFIT_EINVAL", "%s: %d run starts but %d counts"
                             % (call, idx[1], counts[1]), call)
        d = _describe_as(_host(patch[-1]), None, "values of %s" % name, call)
        keep += [idx[0], d] + ([counts[0]] if counts else [])
        rows.append(_ffi.Delta(_b(name), idx[1], idx[2], counts[2] if counts else None,
                               ctypes.pointer(d.t)))
    arr = (_ffi.Delta * max(len(rows), 1))(*rows)
    with ctx._lock:
        rc = _lib().refit_delta_file_write(ctx.handle, _b(os.fspath(path)), _b(base),
                                           _b(version), len(rows),
                                           ctypes.cast(arr, ctypes.c_void_p))
        _check(ctx.handle, rc, "write_delta_file %s" % path)
    del keep


def versions(path: str) -> Tuple[str, str]:
    """(base, version) a delta file declares, from its header alone.
    REFIT_ECORRUPT when path is not a delta file."""
    call = "delta file %s" % path
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n > 100_000_000:
                raise ValueError("a header of %d bytes" % n)
            meta: Dict[str, str] = json.loads(f.read(n)).get("__metadata__") or {}
    except (OSError, ValueError, struct.error, AttributeError) as err:
        raise RefitError(_ECORRUPT, "REFIT_ECORRUPT", "%s: %s" % (call, err), call) from None
    base, version = meta.get("refit.delta.base_version"), meta.get("refit.delta.version")
    if not isinstance(base, str) or not isinstance(version, str):
        raise RefitError(_ECORRUPT, "REFIT_ECORRUPT", "%s: not a refit delta file (no "
                         "refit.delta.base_version and refit.delta.version in its "
                         "__metadata__)" % call, call)
    return base, version


def load_into(txn: Any, path: str, stream: Any = None) -> None:
    """txn.load_delta_file's load (refit_load_delta_file) of path, an
    absolute path; what the file gives an update that has not begun (its
    base, version and source) txn sets first (refit.core)."""
    st = txn._stream(None, stream)
    txn._run("load_delta_file %s" % path, _lib().refit_load_delta_file, _b(path), st)
