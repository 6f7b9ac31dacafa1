"""ctypes binding of the keeper in include/refit/ipc.h (docs/restart.md,
"The keeper"): a long-lived process holding the committed state of a group
of workers of one plan signature, serving restores over a Unix socket.

Keeper (its model registered and sealed as the workers' is)::

    pool = refit.keeper.Pool(ctx, nbytes)                 # host memory (a memfd)
    w = pool.tensor((4096, 4096), "f32")                  # runtime tensors in it
    model.bind_runtime("layers.0.mlp", "weight", w) ...; model.seal()
    k = refit.keeper.Keeper(model, "/run/refit/keeper.sock", pool=pool,
                            follow="/run/refit/keeper-follow.sock")
    k.run()                                               # serve and follow

On a GPU the runtime tensors may be ordinary torch CUDA tensors (memory
cudaIpcGetMemHandle can share: no expandable segments) and pool None.
The trainer lists the follow path among its Sender's paths: the keeper
votes on every update and holds only what the whole group committed.

Restarting worker (registered and sealed as usual)::

    refit.keeper.restore(model, "keeper:///run/refit/keeper.sock")
    # RefitError: load the checkpoint instead (nothing was written)
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, List, Optional, Sequence

from . import _ffi
from .core import Context, Model, Stream, _b, _check, _estate
from .ipc import RecvOpts, _stream, _uids
from .tensors import Desc, refit_dtype

_P, _I, _D, _U64, _U32 = (ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_uint64,
                          ctypes.c_uint32)

SCHEME = "keeper://"


class KeeperOpts(ctypes.Structure):
    _fields_ = [("version", _U32), ("follow_path", ctypes.c_char_p),
                ("follow", ctypes.POINTER(RecvOpts)), ("timeout_s", _D),
                ("socket_mode", _U32), ("allow_uids", ctypes.POINTER(_U32)),
                ("n_allow_uids", _U32), ("greet_timeout_s", _D)]


class KeeperStats(ctypes.Structure):
    _fields_ = [(k, _U64) for k in ("restores_served", "restores_refused", "peers_refused",
                                    "updates_committed", "updates_aborted")] + \
               [("servable", _I), ("why_not", ctypes.c_char * 256)]


class RestoreOpts(ctypes.Structure):
    _fields_ = [("version", _U32), ("rollback", _I), ("timeout_s", _D), ("stream", _P),
                ("allow_uids", ctypes.POINTER(_U32)), ("n_allow_uids", _U32), ("verify", _I)]


_PP = ctypes.POINTER(_P)
_PROTOS = {
    "refit_ipc_pool_create": (_I, [_PP, _P, ctypes.c_int32, _U64]),
    "refit_ipc_pool_alloc": (_I, [_P, _U64, _PP]),
    "refit_ipc_pool_destroy": (None, [_P]),
    "refit_ipc_keeper_create": (_I, [_PP, _P, _P, ctypes.c_char_p,
                                     ctypes.POINTER(KeeperOpts)]),
    "refit_ipc_keeper_destroy": (None, [_P]),
    "refit_ipc_keeper_run": (_I, [_P, _D]),
    "refit_ipc_keeper_stats_get": (_I, [_P, ctypes.POINTER(KeeperStats)]),
    "refit_ipc_restore": (_I, [_P, ctypes.c_char_p, ctypes.POINTER(RestoreOpts)]),
    "refit_ipc_keeper_undo_arm": (_I, [_P, ctypes.c_char_p, ctypes.POINTER(RestoreOpts)]),
}
_lib = _ffi.prototyped(_PROTOS)


def _path(path: str) -> str:
    """A socket path, given bare or as keeper://PATH."""
    path = os.fspath(path)
    return path[len(SCHEME):] if path.startswith(SCHEME) else path


class PoolTensor:
    """A row-major tensor in a Pool's memory that describes itself to refit
    (bind it as a runtime tensor of the keeper's model)."""

    def __init__(self, pool: "Pool", address: int, shape: Sequence[int], dtype: Any) -> None:
        self.pool, self.address, self.shape = pool, address, tuple(shape)
        self.dtype = refit_dtype(dtype)
        n = 1
        for s in self.shape:
            n *= s
        self.nbytes = n * self.dtype[1] // 8

    def _refit_desc(self) -> Desc:
        strides, acc = [], 1
        for s in reversed(self.shape):
            strides.append(acc)
            acc *= s
        dev = (_ffi.DEVICE_CPU, 0) if self.pool.device < 0 else (_ffi.DEVICE_CUDA,
                                                                  self.pool.device)
        return Desc(self.address, dev[0], dev[1], self.dtype, self.shape,
                    tuple(reversed(strides)), self)

    def tobytes(self) -> bytes:
        """Its bytes (host pools)."""
        if self.pool.device >= 0:
            raise ValueError("refit: a device pool's bytes are read on the device")
        return ctypes.string_at(self.address, self.nbytes)


class Pool:
    """refit_ipc_pool: memory a keeper's runtime tensors live in, shared
    whole with the workers that restore from it; device None: host memory."""

    def __init__(self, ctx: Context, nbytes: int, device: Optional[int] = None) -> None:
        self.ctx, self.device = ctx, -1 if device is None else int(device)
        h = _P()
        self._h: Optional[ctypes.c_void_p] = None
        with ctx._lock:
            _check(ctx.handle, _lib().refit_ipc_pool_create(ctypes.byref(h), ctx.handle,
                   self.device, nbytes), "refit_ipc_pool_create")
            self._h = h

    def alloc(self, nbytes: int) -> int:
        """nbytes of it, 256-byte aligned: the address."""
        if self._h is None:
            raise _estate("ipc pool: it is closed")
        p = _P()
        with self.ctx._lock:
            _check(self.ctx.handle, _lib().refit_ipc_pool_alloc(self._h, nbytes,
                   ctypes.byref(p)), "refit_ipc_pool_alloc")
        return p.value or 0

    def tensor(self, shape: Sequence[int], dtype: Any = "f32") -> PoolTensor:
        t = PoolTensor(self, 0, shape, dtype)
        t.address = self.alloc(max(t.nbytes, 1))
        return t

    def close(self) -> None:
        """After the keeper and the model using it are gone."""
        if self._h:
            _lib().refit_ipc_pool_destroy(self._h)
            self._h = None


class Keeper:
    """refit_ipc_keeper: serves restores of model's committed state at path
    and, with follow, takes the trainer's updates as one more worker."""

    def __init__(self, model: Model, path: str, pool: Optional[Pool] = None,
                 follow: Optional[str] = None, follow_timeout: float = 0.0,
                 timeout: float = 0.0, socket_mode: int = 0,
                 allow_uids: Optional[Sequence[int]] = None,
                 greet_timeout: float = 0.0) -> None:
        """follow: the socket the trainer's Sender lists among its workers'
        (None: the embedder updates the model itself); follow_timeout: each
        wait within a followed update (0: 300 s); timeout: each wait of a
        restore served (0: 60 s); socket_mode, allow_uids, greet_timeout:
        as refit.ipc.Receiver's, for the restore socket."""
        self.model, self.pool, self.path = model, pool, _path(path)
        self._follow = _b(follow)
        self._ro = RecvOpts(3, follow_timeout, 0, None, 0, _ffi.FILTER_FN(0), None, 0, 0, 0,
                            None, 0, greet_timeout)
        self._uids = _uids(allow_uids)
        o = KeeperOpts(1, self._follow, ctypes.pointer(self._ro) if follow else None, timeout,
                       socket_mode, self._uids, len(allow_uids or ()), greet_timeout)
        h = _P()
        self._h: Optional[ctypes.c_void_p] = None
        self._why: Optional[str] = None
        ctx = model.ctx
        with ctx._lock:
            _check(ctx.handle, _lib().refit_ipc_keeper_create(ctypes.byref(h), model.handle,
                   pool._h if pool else None, _b(self.path), ctypes.byref(o)),
                   "refit_ipc_keeper_create")
            self._h = h
            ctx._adopt(self, model)

    @property
    def handle(self) -> ctypes.c_void_p:
        if self._h is None:
            raise _estate("keeper: %s" % (self._why or "it is closed"))
        return self._h

    def _release(self, why: str) -> None:
        self.close()
        self._why = why

    def run(self, seconds: float = -1.0) -> None:
        """Serve restores and follow the trainer for seconds (< 0: until
        an error of the keeper's own); holds the model's update slot."""
        ctx = self.model.ctx
        claimed = ctx._claim("keeper", call="keeper run")
        try:
            with ctx._lock:
                _check(ctx.handle, _lib().refit_ipc_keeper_run(self.handle, seconds),
                       "refit_ipc_keeper_run")
        finally:
            ctx._free_slot(claimed)

    def stats(self) -> Dict[str, Any]:
        st = KeeperStats()
        with self.model.ctx._lock:
            _check(self.model.ctx.handle, _lib().refit_ipc_keeper_stats_get(self.handle,
                   ctypes.byref(st)), "refit_ipc_keeper_stats_get")
        out: Dict[str, Any] = {k: getattr(st, k) for k, _ in st._fields_}
        out["why_not"] = st.why_not.decode(errors="replace")
        out["servable"] = bool(st.servable)
        return out

    def close(self) -> None:
        with self.model.ctx._lock:
            if self._h:
                _lib().refit_ipc_keeper_destroy(self._h)
                self._h = None

    def __enter__(self) -> "Keeper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def restore(model: Model, path: str, rollback: bool = True, timeout: float = 0.0,
            stream: Stream = None, allow_uids: Optional[Sequence[int]] = None,
            verify: bool = True) -> None:
    """Restore the sealed model from the keeper at path (keeper://PATH or
    the bare socket path), refit_ipc_restore: RefitError with nothing
    written when the keeper serves nothing or the plan signatures differ
    (load the checkpoint instead); a keeper gone before it confirms, or any
    failure after the first byte, rolls back (rollback) or poisons.
    verify: every module's fingerprint after the copies against the
    keeper's (one more read of the bytes)."""
    uids = _uids(allow_uids)
    opts = RestoreOpts(1, 1 if rollback else 0, timeout, _stream(stream), uids,
                       len(allow_uids or ()), 1 if verify else 0)
    ctx = model.ctx
    claimed = ctx._claim("restore from %s" % path, call="restore")
    try:
        model._call("restore from keeper %s" % path, _lib().refit_ipc_restore,
                    _b(_path(path)), ctypes.byref(opts))
    finally:
        ctx._free_slot(claimed)


def arm_undo(model: Model, path: str, timeout: float = 0.0,
             allow_uids: Optional[Sequence[int]] = None) -> None:
    """The keeper at path as the undo source of this READY worker's next
    update (refit_ipc_keeper_undo_arm; update(undo_source="keeper"), or
    "auto" when no files or snapshot serve): RefitError unless it holds
    this worker's version, byte for byte. Only this call arms a keeper."""
    uids = _uids(allow_uids)
    opts = RestoreOpts(1, 1, timeout, None, uids, len(allow_uids or ()), 1)
    model._call("arm keeper %s" % path, _lib().refit_ipc_keeper_undo_arm, _b(_path(path)),
                ctypes.byref(opts))


__all__: List[str] = ["Keeper", "Pool", "PoolTensor", "arm_undo", "restore", "SCHEME"]
