"""ctypes binding of include/refit/transport.h: weights from a trainer to
the ranks of an engine over NCCL, in buckets, with a cross-rank commit
(docs/nccl.md).

Trainer (root)::

    ctx = refit.Context(worker_id="trainer")
    uid = nccl_unique_id(ctx)                  # hand it to every rank
    x = Transport.nccl(ctx, device=0, unique_id=uid, nranks=n, rank=0)
    s = Sender(x, label="step-1200")
    for name, p in model.named_parameters():
        s.add(name, p)                         # borrowed: kept alive here
    res = s.send()                             # raises RefitError unless all committed

Worker (every other rank)::

    x = Transport.nccl(worker_ctx, device=r, unique_id=uid, nranks=n, rank=r)
    res = Receiver(model, x).receive_update(rollback=True)

In one process (tests, a trainer beside its engine), a Loopback group of
ranks, one thread each, stands in for NCCL::

    g = Loopback(2)
    x0 = Transport.loopback(trainer_ctx, g, 0)  # in the sender's thread
    x1 = Transport.loopback(worker_ctx, g, 1)   # in the receiver's

Ranks that load their own tensors (no sender) commit as a group::

    txn = model.begin(version="step-1200")
    txn.load_dict(my_shard)
    res = group_finalize(x, txn)               # every rank commits, or every rank aborts

Closing a context closes its transports and senders, destroying a model
its receivers (calls then raise RefitError REFIT_ESTATE); calls run under
the context's lock (refit.core: Threads), so the ranks of a Loopback group
in one process each take their own context.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional

from . import _ffi
from .core import (Context, Model, RefitError, Stream, Txn, _b, _check, _describe_as, _estate,
                   _s, _t, status_name)

_P, _I, _D = ctypes.c_void_p, ctypes.c_int, ctypes.c_double


class NcclId(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * 128)]


class NcclOpts(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("comm", _P), ("id", ctypes.POINTER(NcclId)),
                ("nranks", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("device", ctypes.c_int32), ("stream", _P), ("timeout_s", _D),
                ("abort_borrowed", _I)]


class SendOpts(ctypes.Structure):
    """refit_send_opts, version 2 (direct_min_bytes included)."""
    _fields_ = [("version", ctypes.c_uint32), ("version_label", ctypes.c_char_p),
                ("bucket_bytes", ctypes.c_uint64), ("root", _I), ("checksum_payload", _I),
                ("timeout_s", _D), ("stream", _P), ("direct_min_bytes", ctypes.c_uint64)]


class RecvOpts(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("root", _I), ("timeout_s", _D),
                ("start_timeout_s", _D), ("stream", _P), ("max_bucket_bytes", ctypes.c_uint64),
                ("filter", _ffi.FILTER_FN), ("filter_user", _P)]


class UpdateOpts(ctypes.Structure):
    """refit_update_opts as refit.h has it now (the members after rollback
    included: the C side reads them)."""
    _fields_ = [("version", ctypes.c_uint32), ("version_label", ctypes.c_char_p),
                ("source_uri", ctypes.c_char_p), ("rollback", _I),
                ("source_digest", ctypes.c_char_p), ("fingerprint", _I)]


class GroupResult(ctypes.Structure):
    _fields_ = [("decision", _I), ("local_status", _I), ("failed_rank", _I),
                ("vote_taken", _I), ("worker_status", _I), ("buckets", ctypes.c_uint32),
                ("tensors", ctypes.c_uint64), ("bytes", ctypes.c_uint64), ("seconds", _D),
                ("version_label", ctypes.c_char * 128)]

    def as_dict(self) -> Dict[str, Any]:
        d = {k: getattr(self, k) for k, _ in self._fields_ if k != "version_label"}
        d["version_label"] = _s(self.version_label)
        return d


_PP = ctypes.POINTER(_P)
_PROTOS = {
    "refit_nccl_probe": (_I, [_P]),
    "refit_nccl_unique_id": (_I, [_P, ctypes.POINTER(NcclId)]),
    "refit_transport_nccl": (_I, [_PP, _P, ctypes.POINTER(NcclOpts)]),
    "refit_loopback_create": (_I, [_PP, _I]),
    "refit_loopback_destroy": (None, [_P]),
    "refit_transport_loopback": (_I, [_PP, _P, _P, _I, _D]),
    "refit_transport_close": (None, [_P]),
    "refit_transport_rank": (_I, [_P]),
    "refit_transport_nranks": (_I, [_P]),
    "refit_transport_aborted": (_I, [_P]),
    "refit_sender_create": (_I, [_PP, _P, ctypes.POINTER(SendOpts)]),
    "refit_sender_destroy": (None, [_P]),
    "refit_sender_add": (_I, [_P, ctypes.c_char_p, ctypes.POINTER(_ffi.Tensor)]),
    "refit_sender_add_delta": (_I, [_P, ctypes.c_char_p, ctypes.c_size_t, _P, _P,
                                   ctypes.POINTER(_ffi.Tensor)]),
    "refit_sender_clear": (None, [_P]),
    "refit_sender_set_label": (_I, [_P, ctypes.c_char_p]),
    "refit_sender_send": (_I, [_P, ctypes.POINTER(GroupResult)]),
    "refit_receiver_create": (_I, [_PP, _P, _P, ctypes.POINTER(RecvOpts)]),
    "refit_receiver_destroy": (None, [_P]),
    "refit_receive_update": (_I, [_P, ctypes.POINTER(UpdateOpts),
                                  ctypes.POINTER(GroupResult)]),
    "refit_receive": (_I, [_P, _P, _P, _P]),
    "refit_group_finalize": (_I, [_P, _P, _I, ctypes.POINTER(GroupResult)]),
}
_lib = _ffi.prototyped(_PROTOS)


def nccl_probe(ctx: Context) -> str:
    """Which NCCL and CUDA driver refit finds in this process (a string)."""
    with ctx._lock:
        _check(ctx.handle, _lib().refit_nccl_probe(ctx.handle), "refit_nccl_probe")
        return _t(_lib().refit_errmsg(ctx.handle))


def nccl_unique_id(ctx: Context) -> bytes:
    """ncclGetUniqueId on this rank: 128 bytes to hand to every rank."""
    uid = NcclId()
    with ctx._lock:
        _check(ctx.handle, _lib().refit_nccl_unique_id(ctx.handle, ctypes.byref(uid)),
               "refit_nccl_unique_id")
    return bytes(uid.bytes)


class Loopback:
    """refit_loopback: nranks endpoints in one process, one thread each (a
    test's ranks, or a trainer and an engine in one process); the bytes go
    through host memory. Transport.loopback(ctx, group, rank) makes each;
    close them all before the group."""

    def __init__(self, nranks: int) -> None:
        h = _P()
        rc = _lib().refit_loopback_create(ctypes.byref(h), int(nranks))
        if rc:
            raise RefitError(rc, status_name(rc),
                             "refit_loopback_create: %d ranks" % nranks, "refit_loopback_create")
        self._h: Optional[ctypes.c_void_p] = h
        self.nranks = int(nranks)

    def close(self) -> None:
        if self._h:
            _lib().refit_loopback_destroy(self._h)
            self._h = None

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Transport:
    """refit_transport: NCCL (a communicator refit creates from a unique id,
    or the caller's ncclComm_t as an int), or one rank of a Loopback group.
    Close it when done."""

    def __init__(self, ctx: Context, handle: ctypes.c_void_p,
                 group: Optional[Loopback] = None) -> None:
        """(made by loopback() and nccl(), under ctx's lock)"""
        self.ctx, self._group = ctx, group
        self._h: Optional[ctypes.c_void_p] = handle
        self._why: Optional[str] = None
        ctx._adopt(self)

    @classmethod
    def loopback(cls, ctx: Context, group: Loopback, rank: int,
                 timeout: float = 0.0) -> Transport:
        """Rank rank of group (a Loopback); messages on ctx; timeout in
        seconds for each exchange (0: 300)."""
        if group._h is None:
            raise RefitError(-3, "REFIT_ESTATE", "loopback group is closed")
        h = _P()
        with ctx._lock:
            _check(ctx.handle, _lib().refit_transport_loopback(ctypes.byref(h), ctx.handle,
                                                              group._h, int(rank),
                                                              float(timeout)),
                   "refit_transport_loopback")
            return cls(ctx, h, group)

    @classmethod
    def nccl(cls, ctx: Context, device: int, unique_id: Optional[bytes] = None,
             nranks: int = 0, rank: int = 0, comm: Optional[int] = None,
             stream: Stream = None, timeout: float = 0.0,
             abort_borrowed: bool = False) -> Transport:
        uid = None
        if unique_id is not None:
            uid = NcclId()
            uid.bytes[:] = list(unique_id)
        o = NcclOpts(1, comm, ctypes.pointer(uid) if uid else None, nranks, rank, device,
                     stream, timeout, int(abort_borrowed))
        h = _P()
        with ctx._lock:
            _check(ctx.handle, _lib().refit_transport_nccl(ctypes.byref(h), ctx.handle,
                                                          ctypes.byref(o)),
                   "refit_transport_nccl")
            return cls(ctx, h)

    @property
    def handle(self) -> ctypes.c_void_p:
        """Take it under the context's lock, with the call that uses it."""
        if not self._h:
            raise _estate("transport: %s" % (self._why or "it is closed"))
        return self._h

    def _get(self, fn: Any) -> int:
        with self.ctx._lock:
            return int(fn(self.handle))

    rank = property(lambda self: self._get(_lib().refit_transport_rank))
    nranks = property(lambda self: self._get(_lib().refit_transport_nranks))
    aborted = property(lambda self: bool(self._get(_lib().refit_transport_aborted)))

    def _release(self, why: str) -> None:
        self.close()
        self._why = why

    def close(self) -> None:
        with self.ctx._lock:
            if self._h:
                _lib().refit_transport_close(self._h)
                self._h = None


def _call(ctx: Context, call: str, fn: Any, *args: Any) -> None:
    """fn(*args) under ctx's lock (args: callables are called there, for the
    handles); RefitError unless it returns 0."""
    with ctx._lock:
        rc = fn(*[a() if callable(a) else a for a in args])
        _check(ctx.handle, rc, call)


class Sender:
    """The trainer side: add tensors once, send() each update.

    direct_min_bytes: tensors at least this large (and contiguous on the
    communicator's device) are broadcast from themselves, unpacked; 0 (the
    default): every byte is packed (docs/nccl.md says when each pays)."""

    def __init__(self, transport: Transport, label: Optional[str] = None,
                 bucket_bytes: int = 0, root: int = 0, checksum: bool = True,
                 timeout: float = 0.0, stream: Stream = None,
                 direct_min_bytes: int = 0) -> None:
        if direct_min_bytes < 0:
            raise ValueError(f"direct_min_bytes must be >= 0, not {direct_min_bytes}")
        self.x, self._label = transport, _b(label)
        self._keep: List[Any] = []
        o = SendOpts(2, self._label, bucket_bytes, root, int(checksum), timeout, stream,
                     direct_min_bytes)
        h = _P()
        self._h: Optional[ctypes.c_void_p] = None
        self._why: Optional[str] = None
        _call(transport.ctx, "refit_sender_create", _lib().refit_sender_create,
              ctypes.byref(h), lambda: transport.handle, ctypes.byref(o))
        self._h = h
        transport.ctx._adopt(self)

    @property
    def handle(self) -> ctypes.c_void_p:
        """Take it under the context's lock, with the call that uses it."""
        if not self._h:
            raise _estate("sender: %s" % (self._why or "it is closed"))
        return self._h

    def _release(self, why: str) -> None:
        self.close()
        self._why = why

    def add(self, name: str, tensor: Any) -> None:
        d = _describe_as(tensor, None, "tensor %s" % name, "refit_sender_add")
        self.add_descriptor(name, d)

    def add_delta(self, name: str, indices: Any, values: Any, counts: Any = None) -> None:
        """A patch of checkpoint tensor name for a delta update on the
        receivers (docs/nccl.md "Patches"): flat indices (or run starts with
        counts), copied to host int64 here, and values (1-D, the checkpoint
        dtype), borrowed as add()'s tensors. The receivers apply it with
        txn.load_delta in an update begun with base= (receive_update(base=))."""
        from .core import _int64s
        call = "refit_sender_add_delta %s" % name
        idx = _int64s(indices, "indices of %s" % name, call)
        cnt = _int64s(counts, "run counts of %s" % name, call) if counts is not None else None
        if cnt and cnt[1] != idx[1]:
            raise RefitError(-1, "REFIT_EINVAL", "%s: %d run starts but %d counts"
                             % (call, idx[1], cnt[1]), call)
        d = _describe_as(values, None, "values of %s" % name, call)
        _call(self.x.ctx, call, _lib().refit_sender_add_delta, lambda: self.handle, _b(name),
              idx[1], idx[2], cnt[2] if cnt else None, ctypes.byref(d.t))
        self._keep += [idx[0], d] + ([cnt[0]] if cnt else [])

    def set_label(self, label: str) -> None:
        """The version label of the next send() (keep one Sender across
        steps: its buffers are reused)."""
        self._label = _b(label)
        _call(self.x.ctx, "refit_sender_set_label", _lib().refit_sender_set_label,
              lambda: self.handle, self._label)

    def add_descriptor(self, name: str, desc: Any) -> None:
        """Add a prepared descriptor (torch_util.describe) as it is: for
        tensors whose descriptor the caller adjusted."""
        _call(self.x.ctx, "refit_sender_add", _lib().refit_sender_add, lambda: self.handle,
              _b(name), ctypes.byref(desc.t))
        self._keep.append(desc)

    def send(self) -> Dict[str, Any]:
        """One update, then the vote: the group result (a dict); RefitError
        when the group did not commit."""
        res = GroupResult()
        _call(self.x.ctx, "refit_sender_send", _lib().refit_sender_send, lambda: self.handle,
              ctypes.byref(res))
        return res.as_dict()

    def close(self) -> None:
        with self.x.ctx._lock:
            if self._h:
                _lib().refit_sender_destroy(self._h)
                self._h, self._keep = None, []


class Receiver:
    """A worker rank: receive_update() waits for an update, loads it and
    takes part in the vote."""

    def __init__(self, model: Model, transport: Transport, root: int = 0,
                 timeout: float = 0.0, start_timeout: float = 0.0, stream: Stream = None,
                 max_bucket_bytes: int = 0) -> None:
        self.model, self.x = model, transport
        o = RecvOpts(1, root, timeout, start_timeout, stream, max_bucket_bytes,
                     _ffi.FILTER_FN(0), None)
        h = _P()
        self._h: Optional[ctypes.c_void_p] = None
        self._why: Optional[str] = None
        _call(model.ctx, "refit_receiver_create", _lib().refit_receiver_create,
              ctypes.byref(h), lambda: model.handle, lambda: transport.handle, ctypes.byref(o))
        self._h = h
        model.ctx._adopt(self, model)
        # its updates load on stream (None: the legacy default stream), from
        # the transport's device buckets: the queue and save stream, no ring
        model._prepare_or_warn(0 if stream is None else stream, False, "Receiver")

    @property
    def handle(self) -> ctypes.c_void_p:
        """Take it under the context's lock, with the call that uses it."""
        if not self._h:
            raise _estate("receiver: %s" % (self._why or "it is closed"))
        return self._h

    def _release(self, why: str) -> None:
        self.close()
        self._why = why

    def receive_update(self, rollback: bool = True, label: Optional[str] = None,
                       source_uri: Optional[str] = None, base: Optional[str] = None,
                       changed: Optional[List[str]] = None) -> Dict[str, Any]:
        """Wait for an update and take it (an update of the worker's: it
        first waits for another thread's to end). base: a delta update
        against that version, which takes the sender's patches (add_delta);
        changed: the modules it changes (None: what arrives is what
        changed), as Model.begin's."""
        self._strings = (_b(label), _b(source_uri))
        opts: Any = UpdateOpts(1, self._strings[0], self._strings[1], int(rollback), None, 0)
        if base is not None:
            opts = self._delta_opts(rollback, base, changed)
        res = GroupResult()
        ctx = self.model.ctx
        claimed = ctx._claim(label, call="receive_update")
        try:
            _call(ctx, "refit_receive_update", _lib().refit_receive_update,
                  lambda: self.handle, ctypes.byref(opts), ctypes.byref(res))
        finally:
            ctx._free_slot(claimed)
        return res.as_dict()

    def _delta_opts(self, rollback: bool, base: str, changed: Optional[List[str]]) -> Any:
        opts, self._delta_keep = delta_update_opts(self._strings[0], self._strings[1],
                                                   rollback, base, changed)
        return opts

    def receive(self, txn: Txn) -> int:
        """Every bucket of one update into txn (a refit.Txn the caller
        began). Returns this rank's status for the vote (0, or the first
        local failure: the rest was drained); raises RefitError when the
        transport failed (it is aborted: abort the txn)."""
        txn._ready()
        ctx = self.model.ctx
        with ctx._lock:
            rc = _lib().refit_receive(self.handle, txn.handle, None, None)
            if rc in (-15, -20):  # REFIT_EIO, REFIT_ETIMEDOUT: the transport, not the data
                _check(ctx.handle, rc, "refit_receive")
        return rc

    def close(self) -> None:
        with self.model.ctx._lock:
            if self._h:
                _lib().refit_receiver_destroy(self._h)
                self._h = None


def delta_update_opts(label: Optional[bytes], uri: Optional[bytes], rollback: bool, base: str,
                      changed: Optional[List[str]]) -> Any:
    """refit_update_opts of a delta update against base (changed: the
    modules it changes, None: what arrives is what changed), as the
    UpdateOpts the receivers' calls are declared with, and what must stay
    alive while they run."""
    mods = [_b(m) for m in (changed or [])]
    names = (ctypes.c_char_p * max(len(mods), 1))(*mods)
    full = _ffi.UpdateOpts(_ffi.UPDATE_OPTS_VERSION, label, uri, int(rollback), None, 0, 0, 0)
    full.base_version = _b(base)
    full.changed_modules = names
    full.n_changed_modules = len(mods)
    full.others_unchanged = 1 if changed is None else 0
    keep = (full.base_version, names, full)
    return ctypes.cast(ctypes.pointer(full), ctypes.POINTER(UpdateOpts)).contents, keep


def group_finalize(transport: Transport, txn: Txn, local_status: int = 0) -> Dict[str, Any]:
    """Cross-rank commit of txn (a refit.Txn) on this rank: prepare (or
    abort at once when local_status is not 0), vote over the transport,
    commit only when every rank prepared. The txn ends here in every case.
    Returns the group result (a dict); RefitError when the group aborted."""
    txn._ready()
    ctx = txn.model.ctx
    res = GroupResult()
    with ctx._lock:
        x = transport.handle
        h = txn._end("aborted")
        try:
            rc = _lib().refit_group_finalize(x, h, int(local_status), ctypes.byref(res))
        finally:
            txn._keep.clear()
        txn.result = "committed" if rc == 0 else "aborted"
        _check(transport.ctx.handle, rc, "refit_group_finalize")
    return res.as_dict()
