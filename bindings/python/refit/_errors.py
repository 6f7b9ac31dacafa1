"""The leaf of the refit package: its error, the status and string helpers
and the descriptor helpers every other module shares. It imports no other
refit module but _ffi and tensors, so core and the modules below it
(_batch, delta_file) take these from here and import each other one way
(refit.core re-exports them under their old names)."""
from __future__ import annotations

import array
import operator
from typing import Any, Optional, Tuple, Union

from . import _ffi
from .tensors import ByteOrderError, Desc
from .tensors import describe as _describe

_ESTATE, _EINVAL = -3, -1


class RefitError(Exception):
    """A refit call failed. status: the negative code; name: its symbol
    ("REFIT_EDUPLICATE"); message: refit_errmsg at the time of the failure;
    call: what the binding was doing ("load q_proj.weight")."""

    def __init__(self, status: int, name: str, message: str, call: str = "") -> None:
        self.status = status
        self.name = name
        self.message = message
        self.call = call
        super().__init__("%s%s: %s" % (call + ": " if call else "", name, message))


def _b(s: Union[None, str, bytes]) -> Optional[bytes]:
    return None if s is None else (s.encode() if isinstance(s, str) else s)


def _s(b: Optional[bytes]) -> Optional[str]:
    return None if b is None else b.decode(errors="replace")


def _t(b: Optional[bytes]) -> str:
    """A string refit always returns (a name, a message): "" for NULL."""
    return _s(b) or ""


def _estate(what: str) -> RefitError:
    return RefitError(_ESTATE, "REFIT_ESTATE", what)


def _check(ctx_handle: Any, rc: int, call: str) -> None:
    """RefitError for a failing rc, with the context's message: call it
    under the context's lock, with the failing call (the message is the
    last call's)."""
    if rc != 0:
        L = _ffi.lib()
        msg = _t(L.refit_errmsg(ctx_handle)) if ctx_handle else ""
        raise RefitError(rc, _t(L.refit_status_name(rc)), msg or _t(L.refit_strerror(rc)), call)


def _int64s(x: Any, what: str, call: str) -> Tuple[Any, int, int]:
    """Integers as a contiguous int64 host array: (owner, count, address).
    A torch tensor (any device) or numpy array of an integer dtype, or a
    sequence of ints; anything else is REFIT_EINVAL naming what it is."""
    def bad(why: str) -> RefitError:
        return RefitError(_EINVAL, "REFIT_EINVAL", "%s: %s: %s" % (call, what, why), call)
    if hasattr(x, "detach") and hasattr(x, "is_floating_point"):  # torch
        import torch
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise bad("dtype %s, not an integer dtype" % x.dtype)
        if x.dim() != 1:
            raise bad("%d dims, not 1" % x.dim())
        h = x.detach().to("cpu", torch.int64).contiguous()
        return h, int(h.numel()), int(h.data_ptr()) if h.numel() else 0
    kind = getattr(getattr(x, "dtype", None), "kind", None)
    if kind is not None:  # numpy
        if kind not in "iu":
            raise bad("dtype %s, not an integer dtype" % x.dtype)
        if x.ndim != 1:
            raise bad("%d dims, not 1" % x.ndim)
        import numpy as np
        a = np.ascontiguousarray(x, dtype=np.int64)
        return a, int(a.size), int(a.ctypes.data) if a.size else 0
    try:
        q = array.array("q", (operator.index(v) for v in x))
    except (TypeError, OverflowError) as err:
        raise bad(str(err)) from None
    return q, len(q), q.buffer_info()[0] if len(q) else 0


def describe(tensor: Any, stream: Optional[int] = None) -> Desc:
    """A descriptor for a tensor (refit.tensors.describe)."""
    return _describe(tensor, stream)


def _describe_as(tensor: Any, stream: Optional[int], what: str, call: str) -> Desc:
    """describe(), a byte order refit cannot read refused as REFIT_EINVAL
    naming what the tensor is ("tensor up.weight")."""
    try:
        return _describe(tensor, stream)
    except ByteOrderError as err:
        raise RefitError(_EINVAL, "REFIT_EINVAL", "%s: %s" % (what, err), call) from None
