"""The many-tensors path on the GPU with torch tensors: txn.load_dict (one
refit_load_many call) and refit.SourceSet (txn.load_set) over CUDA,
pinned and pageable tensors of a registered torch.nn.Module (TP shard,
padded vocabulary, fused qkv, tied head); every runtime byte against
per-tensor txn.load; a bad row refuses the call with the worker's bytes
unchanged; a set reused across trainer steps on a side stream."""
import torch

import refit
from refit import _batch, _ffi

import py_binding as pb


def _world():
    m = pb.Tiny()
    ctx, model = pb.build(m)
    return m, ctx, model


def _tensors(seed, where="cuda"):
    ck = pb.checkpoint(seed)
    t = {k: v for k, v in ck.items() if v is not None}
    t["lm_head"] = ck["model.embed"]
    if where == "cuda":
        t = {k: v.to(pb.DEV) for k, v in t.items()}
    elif where == "pinned":
        t = {k: v.pin_memory() for k, v in t.items()}
    return ck, t


def _bytes(m):
    return {n: p.detach().view(torch.uint8).clone() for n, p in m.named_parameters()}


def test_load_dict_equals_per_tensor_load():
    m1, ctx1, model1 = _world()
    m2, ctx2, model2 = _world()
    for seed, where in enumerate(["cuda", "pinned", "cpu"], 1):
        ck, t = _tensors(seed, where)
        with model1.update(version="v%d" % seed) as txn:
            for name, x in t.items():
                if name != "lm_head":
                    txn.load(name, x)
        with model2.update(version="v%d" % seed) as txn:
            txn.load_dict(t)
        pb.check(m2, ck)
        b1, b2 = _bytes(m1), _bytes(m2)
        for n in b1:
            assert torch.equal(b1[n], b2[n]), (where, n)
    assert ctx2.health() == refit.Health.READY


def test_bad_row_refuses_the_call():
    m, ctx, model = _world()
    ck, t = _tensors(1)
    with model.update(version="v1") as txn:
        txn.load_dict(t)
    before = _bytes(m)
    _, bad = _tensors(2)
    bad["o"] = torch.zeros(8, 9, dtype=torch.bfloat16, device=pb.DEV)
    txn = model.begin(version="v2", rollback=False)
    try:
        txn.load_dict(bad)
        raise AssertionError("a wrong shape was accepted")
    except refit.RefitError as e:
        assert e.name == "REFIT_EMISMATCH" and "(o)" in e.message, e
        assert "nothing written" in e.message, e.message
    torch.cuda.synchronize()
    after = _bytes(m)
    for n in before:
        assert torch.equal(before[n], after[n]), n
    assert txn.abort()     # not POISONED: nothing was written
    assert ctx.health() == refit.Health.READY


def test_source_set_across_steps_on_a_side_stream():
    m, ctx, model = _world()
    ck, t = _tensors(1)
    ss = model.source_set(t)          # the trainer's buffers, fixed
    side = torch.cuda.Stream()
    for step in range(1, 4):
        ck, fresh = _tensors(10 + step)
        with torch.no_grad():
            for k, v in fresh.items():
                if k != "lm_head":
                    t[k].copy_(v)      # the optimizer step, in place
        with torch.cuda.stream(side):
            side.wait_stream(torch.cuda.default_stream())
            with model.update(version="step-%d" % step) as txn:
                txn.load_set(ss)
        torch.cuda.synchronize()
        ck["lm_head"] = None
        pb.check(m, ck)
    assert ctx.version == "step-3"
    ss.close()


class _DLPackOnly:
    """Only DLPack (as a CuPy or JAX array reaches refit); records calls."""

    def __init__(self, t, calls):
        self.t, self.calls = t, calls

    def __dlpack_device__(self):
        self.calls.append("device")
        return self.t.__dlpack_device__()

    def __dlpack__(self, **kw):
        self.calls.append(tuple(sorted(kw)))
        return self.t.__dlpack__(**kw)


def test_load_dict_of_dlpack_only_objects():
    # CUDA, pinned and pageable sources seen only through __dlpack__: one
    # call a row with no stream (the legacy default stream, DLPack's
    # default), the device read from the capsule, the bytes of txn.load
    m, ctx, model = _world()
    for seed, where in enumerate(["cuda", "pinned", "cpu"], 1):
        ck, t = _tensors(seed, where)
        calls: list = []
        src = {k: _DLPackOnly(v, calls) for k, v in t.items()}
        table = _batch.Table(list(src), list(src.values()))
        assert calls == [("max_version",)] * len(src), calls
        assert table.device == ((_ffi.DEVICE_CUDA, torch.cuda.current_device())
                                if where == "cuda" else None), (where, table.device)
        with model.update(version="v%d" % seed) as txn:
            txn.load_dict(src)
        torch.cuda.synchronize()
        pb.check(m, ck)
    assert ctx.version == "v3" and ctx.health() == refit.Health.READY
