"""The refit API over ctypes: contexts, models, transactions, sources.

Ownership follows refit.h: a Context owns its Model; a Txn ends with
finalize() or abort(); descriptors of registered tensors stay alive (held
here) until the model is destroyed. Tensors are anything with a
`_refit_desc()` method or a torch.Tensor (see refit.torch_util.describe)."""

import ctypes
import enum

from . import _ffi


class RefitError(Exception):
    """A refit call failed. status: the negative code; name: its symbol
    ("REFIT_EDUPLICATE"); message: refit_errmsg at the time of the failure."""

    def __init__(self, status, name, message, call=""):
        self.status = status
        self.name = name
        self.message = message
        self.call = call
        super().__init__("%s%s: %s" % (call + ": " if call else "", name, message))


class Health(enum.IntEnum):
    EMPTY = 0
    READY = 1
    UPDATING = 2
    POISONED = 3


def _b(s):
    return None if s is None else (s.encode() if isinstance(s, str) else s)


def _s(b):
    return None if b is None else b.decode(errors="replace")


def status_name(status):
    return _s(_ffi.lib().refit_status_name(status))


def _check(ctx_handle, rc, call):
    if rc != 0:
        L = _ffi.lib()
        msg = _s(L.refit_errmsg(ctx_handle)) if ctx_handle else ""
        raise RefitError(rc, _s(L.refit_status_name(rc)), msg or _s(L.refit_strerror(rc)), call)


def _params(params):
    if params is None or isinstance(params, str):
        return params
    return "\n".join("%s: %s" % (k, str(v).lower() if isinstance(v, bool) else v)
                     for k, v in params.items())


def describe(tensor):
    """A descriptor for a tensor: torch tensors through refit.torch_util,
    anything else must provide _refit_desc()."""
    if hasattr(tensor, "_refit_desc"):
        return tensor._refit_desc()
    from . import torch_util
    return torch_util.describe(tensor)


class Context:
    """One per engine worker (rank): refit_open."""

    def __init__(self, worker_id=None, rank=0, journal_path=None, plugin_dirs=None,
                 staging_budget=0):
        L = _ffi.lib()
        self._keep = [_b(worker_id), _b(journal_path), _b(plugin_dirs)]
        opt = _ffi.Options(_ffi.OPTIONS_VERSION, self._keep[0], rank, self._keep[1],
                           self._keep[2], staging_budget)
        h = ctypes.c_void_p()
        rc = L.refit_open(ctypes.byref(h), ctypes.byref(opt))
        if rc:
            raise RefitError(rc, status_name(rc), _s(L.refit_strerror(rc)), "refit_open")
        self._h = h
        self._model = None

    @property
    def handle(self):
        if self._h is None:
            raise RefitError(-3, "REFIT_ESTATE", "context is closed")
        return self._h

    def close(self):
        if self._h is not None:
            _ffi.lib().refit_close(self._h)
            self._h = None
            if self._model is not None:
                self._model._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def errmsg(self):
        return _s(_ffi.lib().refit_errmsg(self.handle))

    def health(self):
        return Health(_ffi.lib().refit_worker_health(self.handle))

    def check_serving(self):
        _check(self.handle, _ffi.lib().refit_check_serving(self.handle), "refit_check_serving")

    @property
    def version(self):
        return _s(_ffi.lib().refit_worker_version(self.handle))

    def create_model(self):
        h = ctypes.c_void_p()
        _check(self.handle, _ffi.lib().refit_model_create(ctypes.byref(h), self.handle),
               "refit_model_create")
        self._model = Model(self, h)
        return self._model

    def open_source(self, path):
        return Source(self, path)


class Model:
    """refit_model: registration, seal, updates."""

    def __init__(self, ctx, handle):
        self.ctx = ctx
        self._h = handle
        self._keep = []          # descriptors and tensors refit borrows
        self.aliases = {}        # tied checkpoint name -> its primary name
        self.expected = set()    # every checkpoint name a module expects
        self.device = None       # (type, id) of the first device runtime tensor

    @property
    def handle(self):
        if self._h is None:
            raise RefitError(-3, "REFIT_ESTATE", "model is destroyed")
        return self._h

    def _check(self, rc, call):
        _check(self.ctx.handle, rc, call)

    def destroy(self):
        if self._h is not None:
            _ffi.lib().refit_model_destroy(self._h)
            self._h = None
            self._keep.clear()

    def add_module(self, name, format="unquantized", params=None):
        self._check(_ffi.lib().refit_model_add_module(self.handle, _b(name), _b(format),
                                                      _b(_params(params))),
                    "add_module %s" % name)

    def bind_runtime(self, module, name, tensor):
        d = describe(tensor)
        self._keep.append(d)
        if d.device_type == _ffi.DEVICE_CUDA and self.device is None:
            self.device = (d.device_type, d.device_id)
        self._check(_ffi.lib().refit_module_bind_runtime(self.handle, _b(module), _b(name),
                                                         ctypes.byref(d.t)),
                    "bind_runtime %s/%s" % (module, name))

    def add_side(self, name, tensor):
        d = describe(tensor)
        self._keep.append(d)
        self._check(_ffi.lib().refit_model_add_side(self.handle, _b(name), ctypes.byref(d.t)),
                    "add_side %s" % name)

    def expect(self, module, ckpt_name, dtype, shape, target=None, shard=None, pad_to=0,
               expert=-1, dst_offset=None, tie_of=None):
        """dtype: a refit dtype (code, bits) pair or a torch dtype; shape: the full
        checkpoint shape; shard: (dim, rank, count); dst_offset: per dim."""
        from .torch_util import refit_dtype
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
        self._check(_ffi.lib().refit_model_expect(self.handle, _b(module), _b(ckpt_name),
                                                  ctypes.byref(spec)),
                    "expect %s" % ckpt_name)
        self.expected.add(ckpt_name)
        if tie_of:
            self.aliases[ckpt_name] = tie_of

    def load_manifest(self, path):
        self._check(_ffi.lib().refit_model_load_manifest(self.handle, _b(path)),
                    "load_manifest %s" % path)

    def seal(self):
        self._check(_ffi.lib().refit_model_seal(self.handle), "seal")

    def stats(self):
        st = _ffi.ModelStats()
        self._check(_ffi.lib().refit_model_stats_get(self.handle, ctypes.byref(st)), "stats")
        return {k: getattr(st, k) for k, _ in _ffi.ModelStats._fields_}

    def fingerprint(self, module=None, name=None):
        out = ctypes.c_uint64()
        L = _ffi.lib()
        if module is None:
            rc = L.refit_model_fingerprint(self.handle, ctypes.byref(out))
        else:
            rc = L.refit_runtime_fingerprint(self.handle, _b(module), _b(name or "w"),
                                             ctypes.byref(out))
        self._check(rc, "fingerprint")
        return out.value

    def begin(self, version=None, source_uri=None, rollback=True, partial=False,
              keep_going=False):
        """partial: a delta (modules not loaded keep their version);
        keep_going: a refused load leaves the update open."""
        return Txn(self, version, source_uri, rollback, partial, keep_going)

    def update(self, version=None, source_uri=None, rollback=True, partial=False,
               keep_going=False):
        """with model.update(...) as txn: ... finalizes on exit, aborts on error."""
        return self.begin(version, source_uri, rollback, partial, keep_going)


class Txn:
    """One update: load*, then finalize() or abort(). Device and pinned
    sources are kept alive here until the txn ends (refit reads them until
    its stream is synchronized at finalize/abort)."""

    def __init__(self, model, version, source_uri, rollback, partial=False, keep_going=False):
        self.model = model
        self._strings = [_b(version), _b(source_uri)]
        opts = _ffi.UpdateOpts(_ffi.UPDATE_OPTS_VERSION, self._strings[0], self._strings[1],
                               1 if rollback else 0, None, 0, 1 if partial else 0,
                               1 if keep_going else 0)
        h = ctypes.c_void_p()
        model._check(_ffi.lib().refit_begin(ctypes.byref(h), model.handle, ctypes.byref(opts)),
                     "begin")
        self._h = h
        self._keep = []
        self.result = None

    @property
    def handle(self):
        if self._h is None:
            raise RefitError(-3, "REFIT_ESTATE", "transaction already ended")
        return self._h

    def _stream(self, desc, stream):
        if stream is not None:
            return stream
        from .torch_util import default_stream
        return default_stream(self.model.device, desc)

    def load(self, name, tensor, stream=None):
        d = describe(tensor)
        self._keep.append(d)
        self.model._check(_ffi.lib().refit_load(self.handle, _b(name), ctypes.byref(d.t),
                                                self._stream(d, stream)),
                          "load %s" % name)

    def load_part(self, name, offset, tensor, stream=None):
        d = describe(tensor)
        self._keep.append(d)
        self.model._check(_ffi.lib().refit_load_part(self.handle, _b(name), int(offset),
                                                     ctypes.byref(d.t),
                                                     self._stream(d, stream)),
                          "load_part %s" % name)

    def load_dict(self, tensors, stream=None, strict=True):
        """Every tensor of a name -> tensor mapping. A tied name whose primary
        is also in the mapping is skipped (one storage, one write). With
        strict=False, names no module expects are skipped."""
        aliases = self.model.aliases
        for name, t in tensors.items():
            if name in aliases and aliases[name] in tensors:
                continue
            if not strict and name not in self.model.expected:
                continue
            self.load(name, t, stream)

    def load_safetensors(self, path, strict=True, progress=None, stream=None):
        """A .safetensors file or a checkpoint directory, streamed from its
        mapping (refit_source_open + refit_load_source) on stream (default:
        the current torch stream of the model's device). With strict=False,
        tensors no module expects are skipped."""
        src = Source(self.model.ctx, path)
        try:
            src.load_into(self, strict=strict, progress=progress, stream=stream)
        finally:
            src.close()

    def stats(self):
        st = _ffi.TxnStats()
        self.model._check(_ffi.lib().refit_txn_stats_get(self.handle, ctypes.byref(st)),
                          "txn stats")
        return {k: getattr(st, k) for k, _ in _ffi.TxnStats._fields_}

    def finalize(self):
        h, self._h = self.handle, None
        try:
            self.model._check(_ffi.lib().refit_finalize(h), "finalize")
        finally:
            self._keep.clear()
        self.result = "committed"

    def abort(self):
        """Returns True when the worker is back to its previous state, False
        when it is POISONED (rollback was off and bytes were written)."""
        h, self._h = self.handle, None
        rc = _ffi.lib().refit_abort(h)
        self._keep.clear()
        self.result = "aborted"
        if rc not in (0, -12):
            self.model._check(rc, "abort")
        return rc == 0

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._h is None:
            return False
        if exc_type is None:
            self.finalize()
        else:
            self.abort()
        return False


class Source:
    """A safetensors file or directory (refit_source_open)."""

    def __init__(self, ctx, path):
        self.ctx = ctx
        h = ctypes.c_void_p()
        _check(ctx.handle, _ffi.lib().refit_source_open(ctypes.byref(h), ctx.handle, _b(path)),
               "source_open %s" % path)
        self._h = h

    def close(self):
        if self._h is not None:
            _ffi.lib().refit_source_close(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def uri(self):
        return _s(_ffi.lib().refit_source_uri(self._h))

    def tensors(self):
        L = _ffi.lib()
        out = []
        for i in range(L.refit_source_count(self._h)):
            st = _ffi.SourceTensor()
            _check(self.ctx.handle, L.refit_source_tensor_at(self._h, i, ctypes.byref(st)),
                   "source_tensor_at")
            out.append((_s(st.name), tuple(st.shape[k] for k in range(st.ndim)), st.bytes))
        return out

    def load_into(self, txn, strict=True, progress=None, stream=None):
        L = _ffi.lib()
        st = txn._stream(None, stream)
        prog = _ffi.PROGRESS_FN(lambda u, b, n, cur: progress(b, n, _s(cur))) if progress \
            else _ffi.PROGRESS_FN()
        if strict and not txn.model.aliases:
            rc = L.refit_load_source(txn.handle, self._h, prog, None, st)
        else:
            expected, aliases = txn.model.expected, txn.model.aliases
            present = {n for n, _, _ in self.tensors()}

            def keep(user, name):
                n = _s(name)
                if n in aliases and aliases[n] in present:
                    return 0  # its primary is in the source: written once
                return 1 if (strict or n in expected) else 0
            filt = _ffi.FILTER_FN(keep)
            rc = L.refit_load_source_filtered(txn.handle, self._h, filt, None, prog, None, st)
        txn.model._check(rc, "load_source %s" % self.uri)
