"""ctypes binding of include/refit/ipc.h: a colocated trainer hands weights
to the engine workers on the same machine over CUDA IPC (docs/ipc.md).

Worker (listens; one per engine rank)::

    r = refit.ipc.Receiver(model, "/run/refit/rank0.sock", stream=torch.cuda.current_stream())
    while serving:
        res = r.receive_update(rollback=True)    # RefitError unless the group committed

Trainer::

    s = refit.ipc.Sender(ctx, ["/run/refit/rank0.sock"], device=0)
    for name, p in model.named_parameters():
        s.add(name, p)                           # its own storage, shared once (share=True)
    for step in ...:
        optimizer.step()
        s.send(label=f"step-{step}")             # every worker committed, or RefitError

Handles are made at the first send and reused; a parameter whose storage
moved is exported again. share=False packs the tensor into refit's flat
buckets instead (strided tensors, or memory cudaIpcGetMemHandle cannot
share, such as PyTorch's expandable segments).

Closing the context (either side) or destroying the worker's model closes
its senders and receivers; their calls then raise RefitError REFIT_ESTATE.
Calls run under the context's lock (refit.core: Threads).
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from . import _ffi
from .core import Context, Model, Stream, _b, _check, _describe_as, _estate
from .transport import GroupResult, UpdateOpts, delta_update_opts

_P, _I, _D, _U64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_double, ctypes.c_uint64

SHARE, PACK = 0, 1


class SendOpts(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("version_label", ctypes.c_char_p),
                ("device", ctypes.c_int32), ("bucket_bytes", _U64), ("checksum", _I),
                ("timeout_s", _D), ("stream", _P), ("spin_s", _D),
                ("allow_uids", ctypes.POINTER(ctypes.c_uint32)), ("n_allow_uids", ctypes.c_uint32)]


class RecvOpts(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("timeout_s", _D), ("start_timeout_s", _D),
                ("stream", _P), ("max_bucket_bytes", _U64), ("filter", _ffi.FILTER_FN),
                ("filter_user", _P), ("spin_s", _D), ("profile_gpu", _I),
                ("socket_mode", ctypes.c_uint32), ("allow_uids", ctypes.POINTER(ctypes.c_uint32)),
                ("n_allow_uids", ctypes.c_uint32), ("greet_timeout_s", _D)]


def _uids(uids: Optional[Sequence[int]]) -> Any:
    """allow_uids as a C array (copied by refit at create), or None."""
    return (ctypes.c_uint32 * len(uids))(*uids) if uids else None


class Stats(ctypes.Structure):
    _fields_ = [(k, _U64) for k in ("connections", "updates", "handles_opened",
                                    "handles_closed", "handles_cached", "events_opened",
                                    "refused", "source_sets_built")]


class SendProfile(ctypes.Structure):
    """refit_ipc_send_profile: CLOCK_MONOTONIC ns (time.monotonic_ns())."""
    _fields_ = [(k, _U64) for k in ("seq", "start_ns", "packed_ns", "encoded_ns", "results_ns",
                                    "posted_ns", "voted_ns", "decided_ns", "end_ns")]


class RecvProfile(ctypes.Structure):
    """refit_ipc_recv_profile: CLOCK_MONOTONIC ns, and GPU times in ms."""
    _fields_ = [(k, _U64) for k in ("seq", "call_ns", "update_ns", "checked_ns", "begun_ns",
                                    "waited_ns", "enqueued_ns", "copies_done_ns",
                                    "prepared_ns", "voted_ns", "decision_ns", "committed_ns",
                                    "result_ns")] + [("gpu_wait_ms", _D), ("gpu_copy_ms", _D)]


def _as_dict(st: ctypes.Structure) -> Dict[str, Any]:
    return {k: getattr(st, k) for k, _ in st._fields_}


_PP = ctypes.POINTER(_P)
_PROTOS = {
    "refit_ipc_sender_create": (_I, [_PP, _P, ctypes.POINTER(ctypes.c_char_p), _I,
                                     ctypes.POINTER(SendOpts)]),
    "refit_ipc_sender_destroy": (None, [_P]),
    "refit_ipc_sender_add": (_I, [_P, ctypes.c_char_p, ctypes.POINTER(_ffi.Tensor), _I]),
    "refit_ipc_sender_add_delta": (_I, [_P, ctypes.c_char_p, ctypes.c_size_t, _P, _P,
                                        ctypes.POINTER(_ffi.Tensor)]),
    "refit_ipc_sender_set_label": (_I, [_P, ctypes.c_char_p]),
    "refit_ipc_sender_send": (_I, [_P, ctypes.POINTER(GroupResult)]),
    "refit_ipc_host_alloc": (_I, [_P, ctypes.c_size_t, _PP]),
    "refit_ipc_receiver_create": (_I, [_PP, _P, ctypes.c_char_p, ctypes.POINTER(RecvOpts)]),
    "refit_ipc_receiver_destroy": (None, [_P]),
    "refit_ipc_receive_update": (_I, [_P, ctypes.POINTER(UpdateOpts),
                                      ctypes.POINTER(GroupResult)]),
    "refit_ipc_receiver_stats": (_I, [_P, ctypes.POINTER(Stats)]),
    "refit_ipc_sender_profile": (_I, [_P, ctypes.POINTER(SendProfile)]),
    "refit_ipc_receiver_profile": (_I, [_P, ctypes.POINTER(RecvProfile)]),
}
_lib = _ffi.prototyped(_PROTOS)


def _stream(stream: Stream) -> Any:
    """A cudaStream_t from a torch.cuda.Stream, an int, or None."""
    if stream is None:
        return None
    return getattr(stream, "cuda_stream", stream)


def _device(device: Any) -> int:
    """-1 (host memory), an int, or a torch.device / "cuda:N"."""
    if device is None:
        return -1
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is None and isinstance(device, str):
        index = int(device.split(":")[1]) if ":" in device else 0
    return 0 if index is None else index


class Sender:
    """The trainer side: add tensors once, send() each update."""

    def __init__(self, ctx: Context, paths: Union[str, Sequence[str]], device: Any = None,
                 label: Optional[str] = None, bucket_bytes: int = 0, checksum: bool = False,
                 timeout: float = 0.0, stream: Stream = None, spin: float = 0.0,
                 allow_uids: Optional[Sequence[int]] = None) -> None:
        """spin: seconds to busy-poll for each vote before sleeping (0: the
        default, 5 ms; negative: never). allow_uids: workers listening as
        these uids are trusted besides this process's own uid."""
        if isinstance(paths, str):
            paths = [paths]
        self.ctx, self._label = ctx, _b(label)
        self._keep: List[Any] = []
        self._patches: List[Any] = []  # add_delta's, until the send
        self._paths = (ctypes.c_char_p * len(paths))(*[_b(p) for p in paths])
        uids = _uids(allow_uids)
        o = SendOpts(3, self._label, _device(device), bucket_bytes, int(checksum), timeout,
                     _stream(stream), spin, uids, len(allow_uids or ()))
        h = _P()
        self._h: Optional[ctypes.c_void_p] = None
        self._why: Optional[str] = None
        with ctx._lock:
            _check(ctx.handle, _lib().refit_ipc_sender_create(ctypes.byref(h), ctx.handle,
                   self._paths, len(paths), ctypes.byref(o)), "refit_ipc_sender_create")
            self._h = h
            ctx._adopt(self)

    @property
    def handle(self) -> ctypes.c_void_p:
        """Take it under the context's lock, with the call that uses it."""
        if self._h is None:
            raise _estate("ipc sender: %s" % (self._why or "it is closed"))
        return self._h

    def _call(self, call: str, fn: Any, *args: Any) -> None:
        with self.ctx._lock:
            rc = fn(self.handle, *args)
            _check(self.ctx.handle, rc, call)

    def _release(self, why: str) -> None:
        self.close()
        self._why = why

    def add(self, name: str, tensor: Any, share: bool = True) -> None:
        """Export tensor under name: its own storage (share=True), or packed
        into refit's buckets at each send (share=False). Kept alive here."""
        d = _describe_as(tensor, None, "tensor %s" % name, "refit_ipc_sender_add")
        self._call("refit_ipc_sender_add", _lib().refit_ipc_sender_add, _b(name),
                   ctypes.byref(d.t), SHARE if share else PACK)
        self._keep.append((d, tensor))

    def add_delta(self, name: str, indices: Any, values: Any, counts: Any = None) -> None:
        """A patch of checkpoint tensor name for the next send only
        (docs/ipc.md "Patches"): flat indices (or run starts with counts),
        copied to host int64 here, and values (1-D, the checkpoint dtype),
        packed like a share=False tensor. The workers apply it in a delta
        update (Receiver.receive_update(base=...))."""
        from .core import RefitError, _int64s
        call = "refit_ipc_sender_add_delta %s" % name
        idx = _int64s(indices, "indices of %s" % name, call)
        cnt = _int64s(counts, "run counts of %s" % name, call) if counts is not None else None
        if cnt and cnt[1] != idx[1]:
            raise RefitError(-1, "REFIT_EINVAL", "%s: %d run starts but %d counts"
                             % (call, idx[1], cnt[1]), call)
        d = _describe_as(values, None, "values of %s" % name, call)
        self._call(call, _lib().refit_ipc_sender_add_delta, _b(name), idx[1], idx[2],
                   cnt[2] if cnt else None, ctypes.byref(d.t))
        self._patches.append((idx[0], d, values, cnt[0] if cnt else None))

    def add_dict(self, tensors: Mapping[str, Any], share: bool = True) -> None:
        for name, t in tensors.items():
            self.add(name, t, share)

    def set_label(self, label: str) -> None:
        self._label = _b(label)
        self._call("refit_ipc_sender_set_label", _lib().refit_ipc_sender_set_label,
                   self._label)

    def send(self, label: Optional[str] = None) -> Dict[str, Any]:
        """One update to every worker and the decision: the group result (a
        dict); RefitError when the group did not commit."""
        if label is not None:
            self.set_label(label)
        res = GroupResult()
        try:
            self._call("refit_ipc_sender_send", _lib().refit_ipc_sender_send, ctypes.byref(res))
        finally:
            self._patches = []  # the send dropped them
        return res.as_dict()

    def profile(self) -> Dict[str, Any]:
        """The last send's phases (refit_ipc_send_profile) as a dict."""
        p = SendProfile()
        self._call("refit_ipc_sender_profile", _lib().refit_ipc_sender_profile,
                   ctypes.byref(p))
        return _as_dict(p)

    def host_alloc(self, nbytes: int) -> int:
        """Host memory (a host sender, device=None) a tensor may live in to
        be shared unpacked: its address, valid until close()."""
        p = _P()
        self._call("refit_ipc_host_alloc", _lib().refit_ipc_host_alloc, nbytes,
                   ctypes.byref(p))
        return p.value or 0

    def close(self) -> None:
        with self.ctx._lock:
            if self._h:
                _lib().refit_ipc_sender_destroy(self._h)
                self._h, self._keep = None, []

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Receiver:
    """A worker: receive_update() waits for a trainer's update, takes it
    into a transaction and commits or aborts as the trainer decides."""

    def __init__(self, model: Model, path: str, timeout: float = 0.0,
                 start_timeout: float = 0.0, stream: Stream = None, max_bucket_bytes: int = 0,
                 filter: Optional[Callable[[str], bool]] = None, spin: float = 0.0,
                 profile_gpu: bool = False, socket_mode: int = 0,
                 allow_uids: Optional[Sequence[int]] = None, greet_timeout: float = 0.0) -> None:
        """filter: name -> bool, called for every tensor of an update's
        index before anything begins (False: not loaded). spin: seconds to
        busy-poll for the update and the decision before sleeping (0: the
        default, 2 ms; negative: never). profile_gpu: CUDA events around
        the copies for profile()'s GPU times. socket_mode: the socket file's
        permission bits (0: 0600); allow_uids: trainers of these uids are
        accepted besides this process's own uid; greet_timeout: seconds a
        connected peer has to greet before the next is accepted (0: 1)."""
        self.model = model
        self._filter = (_ffi.FILTER_FN(lambda user, name: int(bool(filter(name.decode()))))
                        if filter else _ffi.FILTER_FN(0))
        uids = _uids(allow_uids)
        o = RecvOpts(3, timeout, start_timeout, _stream(stream), max_bucket_bytes,
                     self._filter, None, spin, int(bool(profile_gpu)), socket_mode, uids,
                     len(allow_uids or ()), greet_timeout)
        h = _P()
        self._h: Optional[ctypes.c_void_p] = None
        self._why: Optional[str] = None
        ctx = model.ctx
        with ctx._lock:
            _check(ctx.handle, _lib().refit_ipc_receiver_create(ctypes.byref(h), model.handle,
                   _b(path), ctypes.byref(o)), "refit_ipc_receiver_create")
            self._h = h
            ctx._adopt(self, model)
        # its updates load on stream (None: the legacy default stream), from
        # the trainer's device memory: the queue and save stream, no ring
        model._prepare_or_warn(0 if stream is None else stream, False, "ipc.Receiver")

    @property
    def handle(self) -> ctypes.c_void_p:
        """Take it under the context's lock, with the call that uses it."""
        if self._h is None:
            raise _estate("ipc receiver: %s" % (self._why or "it is closed"))
        return self._h

    def _call(self, call: str, fn: Any, *args: Any) -> None:
        with self.model.ctx._lock:
            rc = fn(self.handle, *args)
            _check(self.model.ctx.handle, rc, call)

    def _release(self, why: str) -> None:
        self.close()
        self._why = why

    def receive_update(self, rollback: bool = True, label: Optional[str] = None,
                       source_uri: Optional[str] = None, base: Optional[str] = None,
                       changed: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Wait for a trainer's update and take it: an update of the
        worker's, so it first waits for another thread's to end, and holds
        the context until it returns. base: a delta update against that
        version, which takes the trainer's patches (Sender.add_delta);
        changed: the modules it changes (None: what arrives is what
        changed)."""
        self._strings = (_b(label), _b(source_uri))
        opts: Any = UpdateOpts(1, self._strings[0], self._strings[1], int(rollback), None, 0)
        if base is not None:
            opts, self._delta_keep = delta_update_opts(
                self._strings[0], self._strings[1], rollback, base,
                None if changed is None else list(changed))
        res = GroupResult()
        ctx = self.model.ctx
        claimed = ctx._claim(label, call="receive_update")
        try:
            self._call("refit_ipc_receive_update", _lib().refit_ipc_receive_update,
                       ctypes.byref(opts), ctypes.byref(res))
        finally:
            ctx._free_slot(claimed)
        return res.as_dict()

    def stats(self) -> Dict[str, Any]:
        st = Stats()
        self._call("refit_ipc_receiver_stats", _lib().refit_ipc_receiver_stats,
                   ctypes.byref(st))
        return _as_dict(st)

    def profile(self) -> Dict[str, Any]:
        """The last update's phases on this worker (refit_ipc_recv_profile)."""
        p = RecvProfile()
        self._call("refit_ipc_receiver_profile", _lib().refit_ipc_receiver_profile,
                   ctypes.byref(p))
        return _as_dict(p)

    def close(self) -> None:
        with self.model.ctx._lock:
            if self._h:
                _lib().refit_ipc_receiver_destroy(self._h)
                self._h = None

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
