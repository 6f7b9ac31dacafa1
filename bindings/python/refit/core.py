"""The refit API over ctypes: contexts, models, transactions, sources.

Ownership follows refit.h: a Context owns its Model; a Txn ends with
finalize(), commit() after prepare(), or abort(); descriptors of registered
tensors stay alive (held here) until the model is destroyed. Tensors are
torch tensors, numpy arrays, objects with __dlpack__, or anything with a
`_refit_desc()` method (see refit.tensors).

Closing: Context.close() and Model.destroy() end what was made from them
(transactions, source sets, senders, receivers, transports) first, and
those then raise RefitError REFIT_ESTATE naming what is gone; no call
reaches freed memory.

Threads: refit.h allows one thread at a time per context; the binding
serializes for it. Each C call on a context and what was made from it runs
under the context's lock (an RLock: ctypes releases the GIL in the call),
and an update holds the context from begin to its end: a second thread's
begin (or replay, receive_update) waits for it, at most the context's
begin_wait, then REFIT_ETIMEDOUT names that update's thread. Strings refit returns
(versions, messages) are copied under the lock."""
from __future__ import annotations

import ctypes
import enum
import os
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _ffi
from ._errors import (RefitError, _b, _check, _describe_as, _estate, _int64s, _s, _t,  # noqa: F401
                      describe)
from .tensors import Desc, DTypeLike, refit_dtype

Stream = Union[None, int, ctypes.c_void_p, Any]
"""A CUDA stream: None (the model's device's current torch stream, else the
legacy default stream), a cudaStream_t as an int or c_void_p, or an object
with .cuda_stream (torch.cuda.Stream)."""
Progress = Callable[[int, int, Optional[str]], None]
"""progress(bytes, tensors, current name): running totals after each tensor."""
LogFn = Callable[[int, str], None]
"""log(level, message): 0 error, 1 warning, 2 debug."""


class Health(enum.IntEnum):
    EMPTY = 0
    READY = 1
    UPDATING = 2
    POISONED = 3


_ESTATE, _EINVAL, _EPOISONED = -3, -1, -12
_EUNSUPPORTED = -14
_ETIMEDOUT = -20
_CONTEXT_WAIT = object()    # begin(wait=) not given: the context's begin_wait
# Model.restore(path) of a path with a scheme: restore(model, path, rollback=)
# of the module above core that serves it ("keeper://": refit.keeper),
# wired by refit/__init__.py, so that core imports none of them.
_RESTORE_SCHEMES: Dict[str, Callable[..., None]] = {}


def status_name(status: int) -> str:
    """The symbol of a status ("REFIT_EDUPLICATE")."""
    return _t(_ffi.lib().refit_status_name(status))


def strerror(status: int) -> str:
    """The description of a status ("tensor delivered twice")."""
    return _t(_ffi.lib().refit_strerror(status))


def dtype_name(dtype: DTypeLike) -> str:
    """refit's short name of a dtype ("bf16"); "?" when refit has none."""
    code, bits = refit_dtype(dtype)
    return _t(_ffi.lib().refit_dtype_name(_ffi.DType(code, bits, 1)))


def _params(params: Union[None, str, Mapping[str, Any]]) -> Optional[str]:
    if params is None or isinstance(params, str):
        return params
    return "\n".join("%s: %s" % (k, str(v).lower() if isinstance(v, bool) else v)
                     for k, v in params.items())


def _stream_arg(stream: Stream) -> Optional[ctypes.c_void_p]:
    if stream is None or isinstance(stream, ctypes.c_void_p):
        return stream
    if hasattr(stream, "cuda_stream"):
        stream = stream.cuda_stream
    return ctypes.c_void_p(int(stream)) if int(stream) else None


def _wait_seconds(wait: Any, what: str) -> Optional[float]:
    """A wait in seconds: None (no limit) or a number >= 0."""
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0:
        raise ValueError("refit: %s is a number of seconds >= 0 or None, not %r" % (what, wait))
    return float(wait)


class Context:
    """One per engine worker (rank): refit_open.

    journal_path: None reads $REFIT_JOURNAL; "" keeps no journal.
    plugin_dirs: extra format-plugin folders (a list or a ':'-joined
    string), searched before the plugins installed inside this package.
    journal_best_effort: an update goes on when the journal cannot record
    it (the gap is recorded later) instead of being refused at begin.
    log: log(level, message) receives the library's lines instead of stderr.
    undo_device_budget: bytes of device memory an update's undo log may take
    (0: pinned host memory only).
    delta_master_budget: bytes refit may keep as a master of online-quantized
    modules' checkpoint tensors, so that txn.load_delta can patch them
    (docs/core.md "Delta updates"; 0: such a patch is refused).
    begin_wait: seconds a begin (update, replay, receive_update) waits for
    another thread's open update to end before REFIT_ETIMEDOUT names that
    update's thread and start (None: no limit); begin(wait=) overrides it."""

    def __init__(self, worker_id: Optional[str] = None, rank: int = 0,
                 journal_path: Optional[str] = None,
                 plugin_dirs: Union[None, str, Sequence[str]] = None,
                 staging_budget: int = 0, *, journal_best_effort: bool = False,
                 log: Optional[LogFn] = None, undo_device_budget: int = 0,
                 begin_wait: Optional[float] = 300.0, delta_master_budget: int = 0) -> None:
        L = _ffi.lib()
        self.begin_wait = _wait_seconds(begin_wait, "Context(begin_wait=)")
        self._h: Optional[ctypes.c_void_p] = None
        self._model: Optional[Model] = None
        self._lock = threading.RLock()      # held across each C call (module doc)
        self._slot = threading.Condition(threading.Lock())
        # the thread whose update is open (the Thread itself: an exited
        # thread's ident may be another's now), and (wall clock, monotonic
        # clock, version) of that update's begin
        self._updater: Optional[threading.Thread] = None
        self._holder: Optional[Tuple[float, float, Optional[str]]] = None
        self._deps: List[Tuple[Any, Optional[Model]]] = []  # (weakref, its model)
        dirs = [plugin_dirs] if isinstance(plugin_dirs, str) else list(plugin_dirs or [])
        bundled = _ffi.bundled_plugin_dir()
        if bundled:
            dirs.append(bundled)
        self._keep: List[Any] = [_b(worker_id), _b(journal_path), _b(":".join(dirs) or None)]
        opt = _ffi.Options()
        opt.version = _ffi.OPTIONS_VERSION
        opt.worker_id = self._keep[0]
        opt.rank = rank
        opt.journal_path = self._keep[1]
        opt.plugin_dirs = self._keep[2]
        opt.staging_budget = staging_budget
        opt.journal_best_effort = 1 if journal_best_effort else 0
        opt.undo_device_budget = undo_device_budget  # device bytes the undo log may hold
        opt.delta_master_budget = delta_master_budget
        if log is not None:
            self._log = _ffi.LOG_FN(lambda user, level, msg: log(level, _t(msg)))
            opt.log_fn = self._log
        h = ctypes.c_void_p()
        rc = L.refit_open(ctypes.byref(h), ctypes.byref(opt))
        if rc:
            raise RefitError(rc, status_name(rc), strerror(rc), "refit_open")
        self._h = h

    @property
    def handle(self) -> ctypes.c_void_p:
        if self._h is None:
            raise _estate("context was closed")
        return self._h

    def close(self) -> None:
        """Close the context: what was made from it is ended first (an open
        update aborted); using any of it then raises REFIT_ESTATE."""
        with self._lock:
            if self._h is None:
                return
            self._release(None, "its context was closed")
            if self._model is not None:
                self._model._gone("its context was closed")
            _ffi.lib().refit_close(self._h)
            self._h = None
        self._free_slot(None)

    # -- what was made from this context (module doc: Closing, Threads) --

    def _adopt(self, obj: Any, model: Optional["Model"] = None) -> None:
        """obj (with _release(why)) ends when this context closes, or when
        model is destroyed."""
        self._deps = [d for d in self._deps if d[0]() is not None]
        self._deps.append((weakref.ref(obj), model))

    def _release(self, model: Optional["Model"], why: str) -> None:
        """End the live objects made from this context (from model only, when
        given), the newest first: a sender before its transport."""
        keep = []
        for ref, m in reversed(self._deps):
            obj = ref()
            if obj is None:
                continue
            if model is None or m is model:
                obj._release(why)
            else:
                keep.append((ref, m))
        self._deps = keep[::-1]

    def _claim(self, version: Optional[str] = None, wait: Any = _CONTEXT_WAIT,
               call: str = "begin") -> bool:
        """Wait until no other thread holds an open update, at most wait
        seconds (default: begin_wait; None: no limit), then RefitError
        REFIT_ETIMEDOUT naming the holder; True when this call took the
        slot (False: this thread holds it already, and refit refuses the
        second update). version: the label the holder is named by."""
        me = threading.current_thread()
        limit = self.begin_wait if wait is _CONTEXT_WAIT else _wait_seconds(wait, call + "(wait=)")
        deadline = None if limit is None else time.monotonic() + limit
        with self._slot:
            while self._updater is not None and self._updater is not me:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RefitError(_ETIMEDOUT, "REFIT_ETIMEDOUT",
                                     self._holder_said(limit), call)
                self._slot.wait(left)
            if self._updater is me:
                return False
            self._updater = me
            self._holder = (time.time(), time.monotonic(), version)
            return True

    def _holder_said(self, waited: Optional[float]) -> str:
        """The open update another thread holds, for a begin that waited."""
        waited = waited or 0.0
        th = self._updater
        if th is None or self._holder is None:
            return "waited %.3g s for another thread's update to end" % waited
        wall, mono, version = self._holder
        return ("waited %.3g s for the update %s of thread '%s' (ident %d%s), open since "
                "%s UTC (%.1f s ago); a Txn must end (finalize, commit, abort, a with "
                "block) or its context be closed" % (
                    waited, "'%s'" % version if version else "with no version label",
                    th.name, th.ident or 0, "" if th.is_alive() else ", which has exited",
                    time.strftime("%H:%M:%S", time.gmtime(wall)), time.monotonic() - mono))

    def _free_slot(self, claimed: Optional[bool] = True) -> None:
        """The open update ended (claimed: True), or ended by close/destroy
        whoever held it (None)."""
        if claimed is False:
            return
        with self._slot:
            self._updater = None
            self._holder = None
            self._slot.notify_all()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def errmsg(self) -> str:
        with self._lock:
            return _t(_ffi.lib().refit_errmsg(self.handle))

    def health(self) -> Health:
        with self._lock:
            return Health(_ffi.lib().refit_worker_health(self.handle))

    def check_serving(self) -> None:
        """Raises RefitError (REFIT_EPOISONED, REFIT_ESTATE) unless READY."""
        with self._lock:
            _check(self.handle, _ffi.lib().refit_check_serving(self.handle),
                   "refit_check_serving")

    def verify_snapshot(self, path: str) -> None:
        """Check snapshot path without a model (refit_snapshot_verify): the
        manifest's checksum, the tensor file, and each module's fingerprint
        recomputed from the file. RefitError (REFIT_ECORRUPT ...) if not."""
        with self._lock:
            _check(self.handle, _ffi.lib().refit_snapshot_verify(self.handle,
                                                                 _b(os.fspath(path))),
                   "verify_snapshot %s" % path)

    @property
    def version(self) -> Optional[str]:
        """The version label the worker holds (READY), else None."""
        with self._lock:    # copied before another thread's commit frees it
            return _s(_ffi.lib().refit_worker_version(self.handle))

    @property
    def journal_behind(self) -> bool:
        """True while the journal lacks the end record of an update that did
        end (its write failed: disk full, I/O error, lock timeout). The
        record is held and written first by the next journal write (the
        next begin, a health change, close); until then the journal shows
        that update unended."""
        with self._lock:
            return bool(_ffi.lib().refit_journal_behind(self.handle))

    def metrics(self) -> str:
        """The worker's metrics in the Prometheus text format 0.0.4
        (docs/operators.md "Metrics"), for the engine's /metrics;
        refit.prometheus.Collector serves them to prometheus_client."""
        text, n = ctypes.c_void_p(), ctypes.c_size_t()
        L = _ffi.lib()
        with self._lock:
            _check(self.handle, L.refit_metrics_text(self.handle, ctypes.byref(text),
                                                     ctypes.byref(n)), "refit_metrics_text")
        try:
            return ctypes.string_at(text, n.value).decode("utf-8", "replace")
        finally:
            L.refit_metrics_free(text)

    def create_model(self) -> "Model":
        h = ctypes.c_void_p()
        with self._lock:
            _check(self.handle, _ffi.lib().refit_model_create(ctypes.byref(h), self.handle),
                   "refit_model_create")
            self._model = Model(self, h)
        return self._model

    def open_source(self, path: str) -> "Source":
        """A safetensors file or checkpoint directory (durable: replayable)."""
        return Source(self, path)

    def open_source_memory(self, buf: Any, label: str = "memory") -> "Source":
        """One safetensors file held in memory (bytes, bytearray, memoryview,
        mmap, a uint8 numpy array): borrowed, kept alive by the Source. Not
        durable: an update from it cannot be replayed."""
        return Source.from_memory(self, buf, label)


class Model:
    """refit_model: registration, seal, updates, replay."""

    def __init__(self, ctx: Context, handle: ctypes.c_void_p) -> None:
        self.ctx = ctx
        self._h: Optional[ctypes.c_void_p] = handle
        self._keep: List[Any] = []           # descriptors and tensors refit borrows
        self.aliases: Dict[str, str] = {}    # tied checkpoint name -> its primary name
        self.expected: set = set()           # every checkpoint name a module expects
        self.foreign: set = set()            # names of other ranks' experts: loads skip them
        # every CUDA device a runtime tensor is on, in binding order: the
        # one record of the model's devices (device is its first)
        self.cuda_devices: List[int] = []
        self._why: Optional[str] = None      # why it is gone: destroyed, context closed

    @property
    def device(self) -> Optional[Tuple[int, int]]:
        """(DEVICE_CUDA, id) of the first CUDA device a runtime tensor is
        on, cuda_devices[0], where loads default to that device's current
        torch stream; None for a model in host memory. Read-only: derived
        from cuda_devices."""
        return (_ffi.DEVICE_CUDA, self.cuda_devices[0]) if self.cuda_devices else None

    @property
    def handle(self) -> ctypes.c_void_p:
        if self._h is None:
            why = self._why or "model was destroyed"
            raise _estate(why if why.startswith("model") else "model: " + why)
        return self._h

    def _check(self, rc: int, call: str) -> None:
        _check(self.ctx.handle, rc, call)

    def _call(self, call: str, fn: Any, *args: Any) -> None:
        """fn(model handle, *args) under the context's lock; RefitError
        unless it returns 0."""
        with self.ctx._lock:
            rc = fn(self.handle, *args)
            if rc:
                _check(self.ctx.handle, rc, call)

    def _gone(self, why: str) -> None:
        self._h = None
        self._why = why
        self._keep.clear()

    def destroy(self) -> None:
        """Destroy the model: its source sets and receivers are ended first,
        an open update aborted; using any of them then raises REFIT_ESTATE.
        The context goes on (create_model makes another)."""
        ctx = self.ctx
        with ctx._lock:
            if self._h is None:
                return
            ctx._release(self, "its model was destroyed")
            _ffi.lib().refit_model_destroy(self._h)
            self._gone("model was destroyed")
        ctx._free_slot(None)

    def add_module(self, name: str, format: str = "unquantized",
                   params: Union[None, str, Mapping[str, Any]] = None) -> None:
        """A module of a registered format; params: its flat YAML mapping
        ("cast: true") or a dict."""
        self._call("add_module %s" % name, _ffi.lib().refit_model_add_module, _b(name),
                   _b(format), _b(_params(params)))

    def bind_runtime(self, module: str, name: str, tensor: Any) -> None:
        """Bind an engine-owned tensor (borrowed until destroy()) to module."""
        call = "bind_runtime %s/%s" % (module, name)
        d = _describe_as(tensor, None, "runtime tensor %s/%s" % (module, name), call)
        if d.readonly:
            raise RefitError(_EINVAL, "REFIT_EINVAL", "runtime tensor %s/%s is read-only; refit "
                             "writes runtime tensors in place" % (module, name), call)
        self._call(call, _ffi.lib().refit_module_bind_runtime, _b(module), _b(name),
                   ctypes.byref(d.t))
        self._keep.append(d)    # bound: refit borrows it (a refused one is not kept)
        if d.device_type == _ffi.DEVICE_CUDA and d.device_id not in self.cuda_devices:
            self.cuda_devices.append(d.device_id)

    def add_side(self, name: str, tensor: Any) -> None:
        """Graph-visible memory that is not a weight: its address is verified."""
        d = _describe_as(tensor, None, "side tensor %s" % name, "add_side %s" % name)
        self._keep.append(d)
        self._call("add_side %s" % name, _ffi.lib().refit_model_add_side, _b(name),
                   ctypes.byref(d.t))

    def expect(self, module: str, ckpt_name: str, dtype: DTypeLike, shape: Sequence[int],
               target: Optional[str] = None, shard: Optional[Tuple[int, int, int]] = None,
               pad_to: int = 0, expert: int = -1, dst_offset: Optional[Sequence[int]] = None,
               tie_of: Optional[str] = None) -> None:
        """dtype: the checkpoint's (refit.tensors.refit_dtype); shape: the full
        checkpoint shape; shard: (dim, rank, count); dst_offset: per dim."""
        code, bits = refit_dtype(dtype)
        spec = _ffi.CkptSpec()
        spec.version = _ffi.CKPT_SPEC_VERSION
        spec.dtype = _ffi.DType(code, bits, 1)
        spec.ndim = len(shape)
        for i, s in enumerate(shape):
            spec.shape[i] = int(s)
        strings = [_b(target), _b(tie_of)]
        self._keep.append(strings)
        spec.target = strings[0]
        spec.shard_dim, spec.shard_rank, spec.shard_count = shard if shard else (0, 0, 1)
        spec.pad_to = int(pad_to)
        spec.expert = int(expert)
        for i, o in enumerate(dst_offset or ()):
            spec.dst_offset[i] = int(o)
        spec.tie_of = strings[1]
        self._call("expect %s" % ckpt_name, _ffi.lib().refit_model_expect, _b(module),
                   _b(ckpt_name), ctypes.byref(spec))
        self.expected.add(ckpt_name)
        if tie_of:
            self.aliases[ckpt_name] = tie_of

    def load_manifest(self, path: str) -> None:
        self._call("load_manifest %s" % path, _ffi.lib().refit_model_load_manifest, _b(path))

    def seal(self, prepare: Union[bool, str] = True, stream: Stream = None,
             undo_reserve: Optional[bool] = None) -> None:
        """Build the update plan (refit_model_seal_with); registration is over.

        Seal also readies what the first update would otherwise allocate
        inside it (docs/embedding.md "The first update"): with undo_reserve
        True the C core starts reserving the undo log's memory on a thread
        of its own (undo_held(wait=True) waits for it); False reserves
        nothing (an engine that never updates with rollback: its first
        update with rollback allocates it); None (the default) reserves
        unless REFIT_UNDO_RESERVE=0 is in the environment. For a model
        with CUDA runtime tensors, this also prepares the stream updates
        will load on (prepare_stream):
          prepare=True or "files" (the default): the stream's queue, its
            save stream, and the pinned ring that pageable sources (files,
            CPU tensors) are copied through (128 MiB pinned, held for the
            process, as the first such load would hold it);
          "device": the queue and save stream only, for a reloader whose
            sources are all device or pinned memory (no 128 MiB);
          False: nothing (the first update makes them).
        stream: the stream updates will load on (default: what each load
        defaults to, the caller's current torch stream on the model's
        device, taken now). A library built without CUDA, or a model with
        no CUDA tensor: nothing to prepare. A CUDA failure while preparing
        is a RuntimeWarning, not an error: the model is sealed, and the
        first update allocates what is missing."""
        ring = _prepare_ring(prepare)   # a bad value refused before sealing
        if undo_reserve is None:
            self._call("seal", _ffi.lib().refit_model_seal_with, None)
        elif isinstance(undo_reserve, bool):
            opts = _ffi.SealOpts(_ffi.SEAL_OPTS_VERSION, 1 if undo_reserve else 0)
            self._call("seal", _ffi.lib().refit_model_seal_with, ctypes.byref(opts))
        else:
            raise ValueError("refit: seal(undo_reserve=) is True, False or None, not %r"
                             % (undo_reserve,))
        if ring is not None:
            self._prepare_or_warn(stream, ring, "seal")

    def _prepare_or_warn(self, stream: Stream, ring: bool, who: str) -> None:
        """prepare_stream, a failure a RuntimeWarning (seal, a receiver)."""
        if not self.cuda_devices:
            return
        try:
            self.prepare_stream(stream, ring=ring)
        except RefitError as err:
            warnings.warn("refit: %s could not prepare the update stream (%s); the first "
                          "update allocates what is missing" % (who, err.message),
                          RuntimeWarning, stacklevel=3)

    def prepare_stream(self, stream: Stream = None, ring: bool = True) -> bool:
        """Make now what the first update on stream would make inside it
        (refit_sys_cuda_prepare, refit/sys/cuda.h), on every CUDA device
        the model's runtime tensors are on: the stream's queue (two pinned
        tables, 3 MiB each by default) and its save stream for undo saves;
        with ring, the pinned ring of pageable sources (ring_chunks x
        ring_chunk_bytes, 128 MiB by default). Held for the process;
        calling it again costs nothing. seal() calls it; call it for
        another stream an engine also loads on. stream: as for loads
        (default: the caller's current torch stream on the model's
        device). Returns False when there is nothing to prepare (no CUDA
        tensor, a library without CUDA or without the call); RefitError
        for a CUDA failure."""
        L = _ffi.lib()
        fn = getattr(L, "refit_sys_cuda_prepare", None)
        if fn is None or not self.cuda_devices:
            return False
        if stream is None:
            from .torch_util import default_stream
            st = default_stream(self.device)
        else:
            st = _stream_arg(stream)
        what = _ffi.CUDA_PREPARE_SAVES | (_ffi.CUDA_PREPARE_RING if ring else 0)
        for dev in self.cuda_devices:
            rc = fn(dev, st, what)
            if rc == _EUNSUPPORTED:
                return False    # built without CUDA
            if rc:
                raise RefitError(rc, status_name(rc), "cuda device %d: %s" % (
                    dev, _t(L.refit_sys_cuda_last_error())), "prepare_stream")
        return True

    def undo_held(self, wait: bool = True) -> Tuple[int, int]:
        """(device_bytes, host_bytes) of undo-log memory the model holds
        between updates (refit_sys_undo_held): what seal reserved for an
        update with rollback (every runtime tensor's bytes plus a little
        alignment slack: device memory within the context's
        undo_device_budget, the rest host memory, pinned on a GPU), grown
        by any update that needed more. wait=True first waits for seal's
        reservation to end: call it after seal to keep that cost out of
        the first update (which would otherwise wait at its first save).
        (0, 0) before seal, or after seal(undo_reserve=False) until an
        update with rollback. RefitError REFIT_ESTATE while an update is open, or
        with wait=False while the reservation still runs."""
        dev, host = ctypes.c_uint64(), ctypes.c_uint64()
        with self.ctx._lock:
            rc = _ffi.lib().refit_sys_undo_held(self.handle, 1 if wait else 0,
                                                ctypes.byref(dev), ctypes.byref(host))
        if rc == _ESTATE:
            raise RefitError(rc, "REFIT_ESTATE", "an update is open" if wait else
                             "an update is open, or seal's reservation is still running "
                             "(undo_held(wait=True) waits for it)", "undo_held")
        if rc:
            raise RefitError(rc, status_name(rc), strerror(rc), "undo_held")
        return dev.value, host.value

    def stats(self) -> Dict[str, int]:
        st = _ffi.ModelStats()
        self._call("stats", _ffi.lib().refit_model_stats_get, ctypes.byref(st))
        return {k: getattr(st, k) for k, *_ in _ffi.ModelStats._fields_}

    def module_version(self, module: str) -> Optional[str]:
        """The version label of the commit that last delivered module, or
        None: no such module, never committed, or holding bytes of an
        aborted update. After a partial update the modules it did not
        deliver keep their own."""
        with self.ctx._lock:    # copied before another thread's commit frees it
            return _s(_ffi.lib().refit_module_version(self.handle, _b(module)))

    def fingerprint(self, module: Optional[str] = None, name: Optional[str] = None) -> int:
        """64-bit content fingerprint of one runtime tensor (module, name:
        "w" by default), or of every runtime tensor when module is None."""
        out = ctypes.c_uint64()
        L = _ffi.lib()
        if module is None:
            self._call("fingerprint", L.refit_model_fingerprint, ctypes.byref(out))
        else:
            self._call("fingerprint", L.refit_runtime_fingerprint, _b(module), _b(name or "w"),
                       ctypes.byref(out))
        return out.value

    def source_set(self, tensors: Any, strict: bool = True) -> "SourceSet":
        """A SourceSet over a name -> tensor mapping, for txn.load_set."""
        return SourceSet(self, tensors, strict)

    def begin(self, version: Optional[str] = None, source_uri: Optional[str] = None,
              rollback: bool = True, *, source_digest: Optional[str] = None,
              fingerprint: bool = False, partial: bool = False,
              keep_going: bool = False, base: Optional[str] = None,
              changed: Optional[Sequence[str]] = None,
              wait: Any = _CONTEXT_WAIT, undo_source: str = "auto") -> "Txn":
        """refit_begin now: the worker is UPDATING when this returns.
        source_uri/source_digest: what the journal records as the source
        ("file:///..." is what replay can reopen). fingerprint: journal each
        committed module's content fingerprint. partial: modules not loaded
        keep their version; keep_going: a refused load leaves the update
        open (by default it fails the update closed).

        base: a delta update against that version (every module must hold
        it, else REFIT_EMISMATCH naming the one that does not); it takes
        txn.load_delta patches, and after the commit the whole model holds
        version. changed: the modules it changes (each must receive
        something; others are refused); None: every module not delivered
        is unchanged.

        wait: seconds to wait while another thread's update is open
        (default: the context's begin_wait; None: no limit); then
        RefitError REFIT_ETIMEDOUT names that update, its thread and when
        it began.

        undo_source: what restores the previous version if the update
        aborts with rollback (docs/core.md "Undo sources"): "auto" (the
        previous update's files when they hold it, else a snapshot of it,
        else the undo log), "undo-log", "files" or "snapshot" (that one, or
        RefitError REFIT_EUNSUPPORTED saying why), "off" (no rollback)."""
        return Txn(self, version, source_uri, rollback, source_digest=source_digest,
                   fingerprint=fingerprint, partial=partial, keep_going=keep_going,
                   base=base, changed=changed, wait=wait, undo_source=undo_source)

    def update(self, version: Optional[str] = None, source_uri: Optional[str] = None,
               rollback: bool = True, *, source_digest: Optional[str] = None,
               fingerprint: bool = False, partial: bool = False,
               keep_going: bool = False, base: Optional[str] = None,
               changed: Optional[Sequence[str]] = None,
               wait: Any = _CONTEXT_WAIT, undo_source: str = "auto") -> "Txn":
        """with model.update(...) as txn: ... finalizes on exit, aborts on an
        exception. The update begins at its first call, so a first
        txn.load_safetensors(path) records that file as its source (URI and
        digest) and a failed update can be replayed. base, changed: a
        delta update, wait and undo_source, as in begin()."""
        return Txn(self, version, source_uri, rollback, source_digest=source_digest,
                   fingerprint=fingerprint, partial=partial, keep_going=keep_going,
                   base=base, changed=changed, lazy=True, wait=wait,
                   undo_source=undo_source)

    def replay(self, update_id: int, full: bool = False, rollback: bool = True) -> None:
        """Re-run a failed, aborted, rolled-back or interrupted update from
        its journal record and durable source (refit_replay): the modules
        the journal does not show complete, or every module with full."""
        opts = _ffi.ReplayOpts(_ffi.REPLAY_OPTS_VERSION, 1 if full else 0, 1 if rollback else 0)
        claimed = self.ctx._claim("replay of update %d" % update_id, call="replay")
        try:
            self._call("replay %d" % update_id, _ffi.lib().refit_replay, int(update_id),
                       ctypes.byref(opts))
        finally:
            self.ctx._free_slot(claimed)


    def snapshot(self, path: str) -> None:
        """Write the committed state of this READY worker to the new
        directory path (refit_snapshot_write, docs/restart.md): its runtime
        tensors as they are, post-processed, and a manifest with the
        version, each module's fingerprint and the plan signature."""
        self._call("snapshot %s" % path, _ffi.lib().refit_snapshot_write, _b(os.fspath(path)))

    def restore(self, path: str, rollback: bool = True) -> None:
        """Restore snapshot path into this sealed model (refit_restore):
        refused, nothing written, unless its files are intact and its plan
        signature equals this worker's (the message names the first
        difference: load the checkpoint instead); then the runtime bytes
        are copied as they are, no post-load runs, and the worker commits
        at the snapshot's version. A failure after the first byte rolls
        back (rollback) or poisons the worker, as any update. A path
        keeper://SOCKET restores from a keeper (refit.keeper.restore)."""
        for scheme, restore in _RESTORE_SCHEMES.items():
            if os.fspath(path).startswith(scheme):
                return restore(self, path, rollback=rollback)
        opts = _ffi.RestoreOpts(_ffi.RESTORE_OPTS_VERSION, 1 if rollback else 0)
        claimed = self.ctx._claim("restore of %s" % path, call="restore")
        try:
            self._call("restore %s" % path, _ffi.lib().refit_restore, _b(os.fspath(path)),
                       ctypes.byref(opts))
        finally:
            self.ctx._free_slot(claimed)


def _prepare_ring(prepare: Union[bool, str]) -> Optional[bool]:
    """seal(prepare=...): None (prepare nothing), else whether the ring too."""
    if prepare is True or prepare == "files":
        return True
    if prepare == "device":
        return False
    if prepare is False:
        return None
    raise ValueError("refit: seal(prepare=) is True, 'files', 'device' or False, not %r"
                     % (prepare,))


class Txn:
    """One update: load*, then finalize(), or prepare() then commit(), or
    abort(). Sources are kept alive here until the txn ends (refit reads
    device and pinned ones until its stream is synchronized at the end).

    result: None while open, then "committed", "aborted" or "failed"."""

    def __init__(self, model: Model, version: Optional[str] = None,
                 source_uri: Optional[str] = None, rollback: bool = True, *,
                 source_digest: Optional[str] = None, fingerprint: bool = False,
                 partial: bool = False, keep_going: bool = False, lazy: bool = False,
                 base: Optional[str] = None,
                 changed: Optional[Sequence[str]] = None,
                 wait: Any = _CONTEXT_WAIT, undo_source: str = "auto") -> None:
        if undo_source not in _ffi.UNDO_SOURCES:
            raise ValueError("refit: undo_source is one of %s, not %r"
                             % (", ".join(sorted(_ffi.UNDO_SOURCES)), undo_source))
        self.undo_source = undo_source
        self.model = model
        self._wait = wait
        self.base = base
        self.changed = None if changed is None else [str(m) for m in changed]
        self.version = version
        self.source_uri = source_uri
        self.source_digest = source_digest
        self.rollback = rollback
        self.fingerprint = fingerprint
        self.partial = partial
        self.keep_going = keep_going
        self._h: Optional[ctypes.c_void_p] = None
        self._journal_id = 0
        self._keep: List[Any] = []
        self.result: Optional[str] = None
        self.prepared = False
        self._staging_peak = 0      # refit_sys_txn_staging_peak when it ended
        self._lock = model.ctx._lock
        self._claimed = False       # this txn holds its context's update slot
        self._why: Optional[str] = None
        if not lazy:
            self._begin()

    def _begin(self) -> None:
        strings = [_b(self.version), _b(self.source_uri), _b(self.source_digest)]
        opts = _ffi.UpdateOpts(_ffi.UPDATE_OPTS_VERSION, strings[0], strings[1],
                               1 if self.rollback else 0, strings[2],
                               1 if self.fingerprint else 0, 1 if self.partial else 0,
                               1 if self.keep_going else 0)
        opts.undo_source = _ffi.UNDO_SOURCES[self.undo_source]
        if self.base is not None:
            opts.base_version = _b(self.base)
            mods = self.changed or []
            names = (ctypes.c_char_p * max(len(mods), 1))(*[_b(m) for m in mods])
            opts.changed_modules = names
            opts.n_changed_modules = len(mods)
            opts.others_unchanged = 1 if self.changed is None else 0
        h = ctypes.c_void_p()
        ctx = self.model.ctx
        claimed = ctx._claim(self.version, self._wait)  # another thread's: wait for its end
        try:
            with self._lock:
                self.model._call("begin", lambda mh: _ffi.lib().refit_begin(
                    ctypes.byref(h), mh, ctypes.byref(opts)))
                self._h = h
                self._claimed = claimed
                self._journal_id = int(_ffi.lib().refit_txn_journal_id(h))
        except BaseException:
            ctx._free_slot(claimed)
            raise

    @property
    def begun(self) -> bool:
        return self._h is not None or self.result is not None

    @property
    def handle(self) -> ctypes.c_void_p:
        """The refit_txn (begun now if lazy). Take it under the context's
        lock, with the call that uses it."""
        h = self._h
        if h is None:
            if self.result is not None:
                raise _estate("transaction %s" % (self._why or "already ended"))
            self._begin()
            assert self._h is not None
            return self._h
        if self.model._h is None:   # destroyed with the model: refit freed it
            self._over("aborted")
            self._why = self._aborted_why()
            raise _estate("transaction %s" % self._why)
        return h

    def _aborted_why(self) -> str:
        why = self.model._why or "model was destroyed"
        return "aborted: " + ("its " + why if why.startswith("model") else why)

    def _over(self, result: str) -> None:
        self._h = None
        self.result = result
        self._keep.clear()
        if self._claimed:
            self._claimed = False
            self.model.ctx._free_slot()

    def _note_peak(self, h: ctypes.c_void_p) -> None:
        fn = getattr(_ffi.lib(), "refit_sys_txn_staging_peak", None)
        if fn is not None:
            self._staging_peak = int(fn(h))

    def _end(self, result: str) -> ctypes.c_void_p:
        """The handle, the txn marked over (result): for the call that ends
        it, made under the same hold of the lock."""
        h = self.handle
        self._note_peak(h)
        self._h = None
        self.result = result
        if self._claimed:
            self._claimed = False
            self.model.ctx._free_slot()
        return h

    def _stream(self, desc: Any, stream: Stream) -> Optional[ctypes.c_void_p]:
        if stream is not None:
            return _stream_arg(stream)
        from .torch_util import default_stream
        return default_stream(self.model.device, desc)

    @property
    def journal_id(self) -> int:
        """The journal row of this update (0 without a journal): what
        Model.replay takes. Still known after the update ended; asking a
        lazy update that has not begun begins it."""
        if self._h is None and self.result is None:
            self._begin()
        return self._journal_id

    def _ready(self) -> None:
        """Begin a lazy update now, before the lock is taken: the begin may
        wait for another thread's update to end."""
        if self._h is None and self.result is None:
            self._begin()

    def _run(self, call: str, fn: Any, *args: Any) -> None:
        """fn(txn handle, *args) under the context's lock; RefitError unless 0."""
        self._ready()
        with self._lock:
            rc = fn(self.handle, *args)
            if rc:
                self.model._check(rc, call)

    def load(self, name: str, tensor: Any, stream: Stream = None) -> None:
        """One whole checkpoint tensor; every check before any byte is written.
        A name in model.foreign (another rank's expert) is skipped."""
        if name in self.model.foreign:
            return
        st = self._stream(None, stream)
        d = _describe_as(tensor, st.value if st else None, "tensor %s" % name, "load %s" % name)
        self._keep.append(d)
        self._run("load %s" % name, _ffi.lib().refit_load, _b(name), ctypes.byref(d.t), st)

    def load_part(self, name: str, offset: int, tensor: Any, stream: Stream = None) -> None:
        """Rows [offset, offset + rows) of the split dim of a checkpoint tensor."""
        if name in self.model.foreign:
            return
        st = self._stream(None, stream)
        d = _describe_as(tensor, st.value if st else None, "tensor %s" % name,
                         "load_part %s" % name)
        self._keep.append(d)
        self._run("load_part %s" % name, _ffi.lib().refit_load_part, _b(name), int(offset),
                  ctypes.byref(d.t), st)

    def load_delta(self, name: str, indices: Any, values: Any, stream: Stream = None) -> None:
        """A patch of one checkpoint tensor in a delta update (begin(base=)):
        the elements at flat indices (row-major over the checkpoint's full
        shape; any order, none twice) take values (1-D, the checkpoint
        dtype, host or device). Lands where load() would put those
        elements; the undo log saves only them. A module built by a
        post-load step (online quantization) is refused."""
        self.load_deltas({name: (indices, values)}, stream)

    def load_delta_runs(self, name: str, starts: Any, counts: Any, values: Any,
                        stream: Stream = None) -> None:
        """The run form: counts[i] elements from flat index starts[i] (rows
        [a, b) of a [R, C] tensor: start a * C, count (b - a) * C); values
        holds the runs' elements one run after another."""
        self.load_deltas({name: (starts, counts, values)}, stream)

    def load_deltas(self, table: Any, stream: Stream = None) -> None:
        """Many patches in one refit_load_deltas call: a mapping (or pairs)
        name -> (indices, values) or (starts, counts, values). Every row is
        checked before any byte is written; a refusal names the row. Names
        of other ranks' experts (model.foreign) are skipped."""
        items = list(table.items() if isinstance(table, Mapping) else table)
        rows, keep = [], []
        st = self._stream(None, stream)
        for name, patch in items:
            if name in self.model.foreign:
                continue
            call = "load_delta %s" % name
            if len(patch) == 2:
                idx, counts, vals = _int64s(patch[0], "indices of %s" % name, call), None, \
                    patch[1]
            elif len(patch) == 3:
                idx = _int64s(patch[0], "run starts of %s" % name, call)
                counts = _int64s(patch[1], "run counts of %s" % name, call)
                vals = patch[2]
                if counts[1] != idx[1]:
                    raise RefitError(_EINVAL, "REFIT_EINVAL", "%s: %d run starts but %d counts"
                                     % (call, idx[1], counts[1]), call)
            else:
                raise RefitError(_EINVAL, "REFIT_EINVAL", "%s: a patch is (indices, values) "
                                 "or (starts, counts, values), not %d items"
                                 % (call, len(patch)), call)
            d = _describe_as(vals, st.value if st else None, "values of %s" % name, call)
            keep += [idx[0], d] + ([counts[0]] if counts else [])
            rows.append(_ffi.Delta(_b(name), idx[1], idx[2], counts[2] if counts else None,
                                   ctypes.pointer(d.t)))
        if not rows:
            return
        arr = (_ffi.Delta * len(rows))(*rows)
        self._keep.append(keep)
        self._keep.append(arr)
        what = "load_delta %s" % items[0][0] if len(items) == 1 else "load_deltas"
        self._run(what, _ffi.lib().refit_load_deltas, len(rows), ctypes.cast(arr, ctypes.c_void_p),
                  st)

    def load_delta_file(self, path: str, stream: Stream = None) -> None:
        """The patches of a delta file (docs/delta-file.md, refit_load_delta_file):
        refused, nothing written, when it is malformed or cut short, a
        tensor's checksum differs, or its base or version is not the
        update's. As the first call of model.update() it also sets what the
        update left unset: base and version from the file, and the file as
        its source (a failed update is then replayed from it)."""
        from . import delta_file
        path = os.path.abspath(os.fspath(path))
        if self._h is None and self.result is None:
            base, version = delta_file.versions(path)
            if self.base is None:
                self.base = base
            if self.version is None:
                self.version = version
            if self.source_uri is None:
                src = Source(self.model.ctx, path)
                try:
                    self.source_uri, self.source_digest = src.uri, src.identity()
                finally:
                    src.close()
        delta_file.load_into(self, path, stream)

    def load_dict(self, tensors, stream=None, strict=True):
        """Every tensor of a name -> tensor mapping, in one refit_load_many
        call: every row checked before any byte is written (a bad one
        refuses them all). A tied name whose other name is also in the
        mapping is accepted and written once. With strict=False, names no
        module expects are skipped; names of other ranks' experts
        (model.foreign) always are."""
        from . import _batch
        names, values = _batch.split(tensors, None if strict else self.model.expected,
                                     self.model.foreign)
        table = _batch.Table(names, values)
        self._keep.append(table)
        self._run("load_dict", _batch.lib().refit_load_many, table.n, table.names_ptr,
                  table.srcs_ptr, self._stream(None, stream))

    def load_set(self, source_set, stream=None):
        """Every tensor of a prepared SourceSet, in one call."""
        from . import _batch
        st = self._stream(None, stream)
        self._ready()
        with self._lock:
            self._run("load_set", _batch.lib().refit_load_set, source_set.handle, st)
            self._keep.append(source_set)

    def load_safetensors(self, path: str, strict: bool = True,
                         progress: Optional[Progress] = None, stream: Stream = None,
                         digest: bool = False) -> None:
        """A .safetensors file or a checkpoint directory, streamed from its
        mapping (refit_source_open + refit_load_source) on stream (default:
        the current torch stream of the model's device). With strict=False,
        tensors no module expects are skipped.

        As the first call of an update from Model.update() with no
        source_uri, it records the file as the update's source: its URI and
        its files' identity (Source.identity(): name, size, inode, mtime,
        ctime; no byte read), so replay refuses a file rewritten, touched or
        replaced since. digest=True records the SHA-256 instead, which reads
        every byte once more before the load. Either way a failed update is
        replayable (Model.replay(journal_id))."""
        src = Source(self.model.ctx, path)
        try:
            if self._h is None and self.result is None and self.source_uri is None:
                self.source_uri = src.uri
                self.source_digest = src.digest() if digest else src.identity()
            src.load_into(self, strict=strict, progress=progress, stream=stream)
        finally:
            src.close()

    def load_source(self, src: "Source", strict: bool = True,
                    progress: Optional[Progress] = None, stream: Stream = None) -> None:
        """Every tensor of an open Source (file or memory)."""
        src.load_into(self, strict=strict, progress=progress, stream=stream)

    def stats(self) -> Dict[str, int]:
        """refit_txn_stats (tensors and bytes loaded, modules touched and
        complete, undo bytes saved), and staging_peak."""
        st = _ffi.TxnStats()
        self._ready()
        with self._lock:
            self._run("txn stats", _ffi.lib().refit_txn_stats_get, ctypes.byref(st))
            out = {k: getattr(st, k) for k, *_ in _ffi.TxnStats._fields_}
            out["staging_peak"] = self.staging_peak
            fn = getattr(_ffi.lib(), "refit_sys_txn_delta", None)
            if fn is not None:
                el, tn = ctypes.c_uint64(), ctypes.c_uint32()
                fn(self.handle, ctypes.byref(el), ctypes.byref(tn))
                out["delta_elements"], out["delta_tensors"] = el.value, tn.value
        return out

    @property
    def staging_peak(self) -> int:
        """The most bytes of staging this update has held at once
        (refit_sys_txn_staging_peak): what Context(staging_budget=) must
        allow for this order of loads. Kept once the update has ended
        (read as it ended); 0 for one that never began or staged nothing."""
        with self._lock:
            if self._h is None or self.model._h is None:
                return self._staging_peak
            self._note_peak(self._h)
            return self._staging_peak

    def _finish(self, call: str, fn: Any) -> None:
        """End the txn with fn (refit_finalize, refit_commit): committed,
        or failed and RefitError."""
        self._ready()
        with self._lock:
            h = self._end("failed")
            try:
                rc = fn(h)
                if rc:
                    self.model._check(rc, call)
            finally:
                self._keep.clear()
            self.result = "committed"

    def finalize(self) -> None:
        """Check completeness, run the checks, commit (READY at this
        version). On failure the update is aborted as abort() would and
        RefitError raised; the txn is over either way."""
        self._finish("finalize", _ffi.lib().refit_finalize)

    def prepare(self) -> None:
        """First phase of a group commit (refit_finalize_prepare): every
        check of finalize. On success the txn stays open (UPDATING) and
        only commit() or abort() is left; on failure it is aborted, freed,
        and RefitError raised."""
        self._ready()
        with self._lock:
            self._note_peak(self.handle)    # a failure frees the txn
            rc = _ffi.lib().refit_finalize_prepare(self.handle)
            if rc:
                self._over("failed")
                self.model._check(rc, "prepare")
        self.prepared = True

    def commit(self) -> None:
        """Second phase: commit a prepared txn (cannot fail once prepared)."""
        if not self.prepared:
            raise RefitError(_ESTATE, "REFIT_ESTATE", "commit of an update that was not "
                             "prepared; call prepare() first, or finalize()", "commit")
        self._finish("commit", _ffi.lib().refit_commit)

    def abort(self, reason: Optional[str] = None) -> bool:
        """Abandon the update, recording reason in the journal (default:
        "aborted by the caller"). True when the worker is back to its
        previous state, False when it is POISONED (rollback was off and
        bytes were written)."""
        if self._h is None and self.result is None:  # a lazy update never begun
            self.result = "aborted"
            return True
        L = _ffi.lib()
        with self._lock:
            h = self._end("aborted")
            rc = L.refit_abort_reason(h, _b(reason)) if reason is not None else L.refit_abort(h)
            self._keep.clear()
            if rc not in (0, _EPOISONED):
                self.model._check(rc, "abort")
        return rc == 0

    def __enter__(self) -> "Txn":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.result is not None:
            return
        if self._h is not None and self.model._h is None and exc_type is not None:
            self._over("aborted")   # its model went first: the exception goes on
            self._why = self._aborted_why()
            return
        if exc_type is None:
            if self.prepared:
                self.commit()
            else:
                self.finalize()
        else:
            self.abort("%s: %s" % (exc_type.__name__, exc) if exc_type else None)


class Source:
    """A safetensors checkpoint: a file or directory (refit_source_open), or
    one file held in memory (Source.from_memory)."""

    def __init__(self, ctx: Context, path: Optional[str], *, _handle: Any = None,
                 _buf: Any = None) -> None:
        self.ctx = ctx
        self._buf = _buf
        if _handle is not None:
            self._h: Optional[ctypes.c_void_p] = _handle
            return
        h = ctypes.c_void_p()
        with ctx._lock:
            _check(ctx.handle, _ffi.lib().refit_source_open(ctypes.byref(h), ctx.handle,
                                                            _b(path)),
                   "source_open %s" % path)
        self._h = h

    @classmethod
    def from_memory(cls, ctx: Context, buf: Any, label: str = "memory") -> "Source":
        """One safetensors file in memory. buf: bytes (read in place), a
        writable buffer (bytearray, mmap, numpy array: read in place), or any
        other buffer (copied once). It is kept alive by the Source."""
        keep: Any
        if isinstance(buf, bytes):
            keep, ptr, n = buf, ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p), len(buf)
        else:
            mv = memoryview(buf).cast("B")
            if mv.readonly:
                keep = bytes(mv)
                ptr, n = ctypes.cast(ctypes.c_char_p(keep), ctypes.c_void_p), len(keep)
            else:
                keep = (ctypes.c_char * mv.nbytes).from_buffer(mv)
                ptr, n = ctypes.cast(keep, ctypes.c_void_p), mv.nbytes
        h = ctypes.c_void_p()
        with ctx._lock:
            _check(ctx.handle, _ffi.lib().refit_source_open_memory(ctypes.byref(h), ctx.handle,
                                                                    ptr, n, _b(label)),
                   "source_open_memory %s" % label)
        return cls(ctx, None, _handle=h, _buf=keep)

    @property
    def handle(self) -> ctypes.c_void_p:
        if self._h is None:
            raise RefitError(_ESTATE, "REFIT_ESTATE", "source is closed")
        return self._h

    def close(self) -> None:
        if self._h is not None:
            _ffi.lib().refit_source_close(self._h)
            self._h = None
            self._buf = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def uri(self) -> str:
        """"file:///abs/path" of a file or directory; the label's URI in memory."""
        return _t(_ffi.lib().refit_source_uri(self.handle))

    @property
    def durable(self) -> bool:
        """True when an update from this source can be replayed (files)."""
        return bool(_ffi.lib().refit_source_is_durable(self.handle))

    def digest(self) -> str:
        """SHA-256 hex of the source (of the file; of its files' digests for a
        directory). Reads every byte on the first call, then cached."""
        out = ctypes.create_string_buffer(65)
        with self.ctx._lock:
            _check(self.ctx.handle, _ffi.lib().refit_source_digest(self.handle, out),
                   "source_digest")
        return out.value.decode()

    def identity(self) -> str:
        """"file-id:" and 64 hex digits over each file's name, size, device,
        inode, mtime and ctime (refit_source_identity): reads no byte. As an
        update's source digest, replay takes the source only while its
        files are the very ones loaded. Memory sources have none."""
        out = ctypes.create_string_buffer(80)
        with self.ctx._lock:
            _check(self.ctx.handle, _ffi.lib().refit_source_identity(self.handle, out),
                   "source_identity")
        return out.value.decode()

    def __len__(self) -> int:
        return int(_ffi.lib().refit_source_count(self.handle))

    def tensors(self) -> List[Tuple[str, Tuple[int, ...], int]]:
        """(name, shape, bytes) of every tensor, in file and offset order."""
        L = _ffi.lib()
        out = []
        for i in range(L.refit_source_count(self.handle)):
            st = _ffi.SourceTensor()
            if L.refit_source_tensor_at(self.handle, i, ctypes.byref(st)):
                raise RefitError(_EINVAL, "REFIT_EINVAL", "source %s: no tensor %d"
                                 % (self.uri, i), "source_tensor_at")
            out.append((_t(st.name), tuple(st.shape[k] for k in range(st.ndim)), st.bytes))
        return out

    def load_into(self, txn: Txn, strict: bool = True, progress: Optional[Progress] = None,
                  stream: Stream = None) -> None:
        L = _ffi.lib()
        st = txn._stream(None, stream)
        prog = _ffi.PROGRESS_FN(lambda u, b, n, cur: progress(b, n, _s(cur))) if progress \
            else _ffi.PROGRESS_FN()
        call = "load_source %s" % self.uri
        if strict and not txn.model.aliases and not txn.model.foreign:
            txn._run(call, L.refit_load_source, self.handle, prog, None, st)
        else:
            expected, aliases = txn.model.expected, txn.model.aliases
            foreign = txn.model.foreign
            present = {n for n, _, _ in self.tensors()} if aliases else set()

            def keep(user: Any, name: bytes) -> int:
                n = _s(name)
                if n in foreign:
                    return 0  # another rank's expert
                if n in aliases and aliases[n] in present:
                    return 0  # its primary is in the source: written once
                return 1 if (strict or n in expected) else 0
            filt = _ffi.FILTER_FN(keep)
            txn._run(call, L.refit_load_source_filtered, self.handle, filt, None, prog, None, st)


class SourceSet:
    """A prepared source set (refit_source_set): the same tensors loaded at
    every update (a trainer's parameters, a transport's receive buffers),
    names resolved and descriptors checked once; txn.load_set(set) is then
    one call. The tensors are held here; write each update's values into
    them, or repoint() after the memory moved. Destroying its model ends it."""

    def __init__(self, model, tensors, strict=True):
        from . import _batch
        self.model = model
        self._h = None
        self._why = None
        names, values = _batch.split(tensors, None if strict else model.expected,
                                     model.foreign)
        self._table = _batch.Table(names, values)
        h = ctypes.c_void_p()
        with model.ctx._lock:
            model._call("source_set", lambda mh: _batch.lib().refit_source_set_create(
                ctypes.byref(h), mh, self._table.n, self._table.names_ptr,
                self._table.srcs_ptr))
            self._h = h
            model.ctx._adopt(self, model)

    @property
    def handle(self):
        """Take it under the context's lock, with the call that uses it."""
        if self._why is not None:
            raise _estate("source set: %s" % self._why)
        if self._h is None:
            raise _estate("source set is closed")
        return self._h

    def _release(self, why):
        # refit detaches the set when its model goes (it is freed by close())
        self._why = why

    def __len__(self):
        return self._table.n

    @property
    def names(self):
        return list(self._table.names)

    def repoint(self, tensors=None):
        """Re-read the data pointers: of tensors (a sequence in the set's
        order, or a mapping with the set's names), or of the held tensors.
        Every row is checked again; a refusal changes nothing."""
        from . import _batch
        if isinstance(tensors, dict):
            tensors = [tensors[k] for k in self._table.names]
        ptrs = self._table.data_pointers(tensors)
        with self.model.ctx._lock:
            rc = _batch.lib().refit_source_set_repoint(
                self.handle, len(ptrs), ptrs.buffer_info()[0] if len(ptrs) else None)
            if rc:
                self.model._check(rc, "source_set repoint")
        if tensors is not None:
            self._table.tensors = list(tensors)

    def close(self):
        if self._h is not None:
            from . import _batch
            with self.model.ctx._lock:
                _batch.lib().refit_source_set_destroy(self._h)
                self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
