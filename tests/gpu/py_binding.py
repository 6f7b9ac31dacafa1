"""The Python binding on the GPU: a torch.nn.Module registered with the
structural mapping (TP shard, padded vocabulary, fused qkv, row-parallel
shard on dim 1, tied head, cast norm, a non-persistent buffer as a side
tensor), loaded from a dict of CUDA tensors, from pinned and pageable CPU
tensors, and from a safetensors file; every runtime byte checked against the
slice PyTorch computes; data pointers unchanged; errors as RefitError.
seal() prepares the caller's stream: the first update at the defaults makes
no stream queue and no undo memory (refit_sys counters, undo_held)."""
import ctypes
import os
import tempfile

import torch

import refit

DEV = "cuda"
TP_RANK, TP = 1, 2


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        bf = dict(dtype=torch.bfloat16, device=DEV)
        self.embed = torch.nn.Parameter(torch.full((16, 8), 7.0, **bf))   # vocab 30 -> 32, rank 1
        self.qkv = torch.nn.Parameter(torch.full((12, 8), 7.0, **bf))     # q 16, k 4, v 4 rows / 2
        self.o = torch.nn.Parameter(torch.full((8, 4), 7.0, **bf))        # [8, 8] split on dim 1
        self.norm = torch.nn.Parameter(torch.full((8,), 7.0, dtype=torch.float32, device=DEV))
        self.head = self.embed                                             # tied
        self.register_buffer("inv_freq", torch.arange(4.0, device=DEV), persistent=False)


def checkpoint(seed):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    return {"model.embed": r(30, 8), "q": r(16, 8), "k": r(4, 8), "v": r(4, 8), "o": r(8, 8),
            "norm": r(8), "lm_head": None}


def expected(ck):
    emb = torch.cat([ck["model.embed"][16:30], torch.zeros(2, 8, dtype=torch.bfloat16)])
    qkv = torch.cat([ck["q"][8:16], ck["k"][2:4], ck["v"][2:4]])
    return {"embed": emb, "qkv": qkv, "o": ck["o"][:, 4:8].contiguous(),
            "norm": ck["norm"].float()}


def build(m, prepare=True):
    ctx = refit.Context(worker_id="py-binding", rank=TP_RANK)
    model = ctx.create_model()
    names = refit.register_module(
        model, m, fused={"qkv": [("q", 16), ("k", 4), ("v", 4)]},
        shard_dims={"embed": 0, "qkv": 0, "o": 1}, tp_rank=TP_RANK, tp_size=TP,
        padded={"embed": 30}, ckpt_dtype={"norm": torch.bfloat16},
        rename={"embed": "model.embed", "head": "lm_head"})
    assert set(names) == {"model.embed", "lm_head", "q", "k", "v", "o", "norm"}, names
    assert model.aliases == {"lm_head": "model.embed"}, model.aliases
    model.seal(prepare=prepare)
    st = model.stats()
    assert st["side_tensors"] == 1 and st["runtime_tensors"] == 4, st
    return ctx, model


def check(m, ck):
    want = expected(ck)
    for name, w in want.items():
        got = getattr(m, name).detach().cpu()
        assert torch.equal(got.view(torch.uint8) if got.dtype != torch.float32 else got,
                           w.view(torch.uint8) if w.dtype != torch.float32 else w), name
    assert m.head.data_ptr() == m.embed.data_ptr()


def test_structural_mapping_from_every_source():
    m = Tiny()
    ptrs = {n: p.data_ptr() for n, p in m.named_parameters()}
    ctx, model = build(m)
    assert ctx.health() == refit.Health.EMPTY
    for seed, where in enumerate(["cuda", "pinned", "cpu", "safetensors"], 1):
        ck = checkpoint(seed)
        tensors = {k: v for k, v in ck.items() if v is not None}
        tensors["lm_head"] = ck["model.embed"]  # both tied names: written once
        with model.update(version="v%d" % seed) as txn:
            if where == "safetensors":
                from safetensors.torch import save_file
                with tempfile.TemporaryDirectory() as d:
                    path = os.path.join(d, "model.safetensors")
                    save_file({k: v.contiguous() for k, v in tensors.items()
                               if k != "lm_head"}, path)
                    txn.load_safetensors(path)
            else:
                if where == "cuda":
                    tensors = {k: v.to(DEV) for k, v in tensors.items()}
                elif where == "pinned":
                    tensors = {k: v.pin_memory() for k, v in tensors.items()}
                txn.load_dict(tensors)
        torch.cuda.synchronize()
        assert ctx.health() == refit.Health.READY and ctx.version == "v%d" % seed
        check(m, ck)
    assert ptrs == {n: p.data_ptr() for n, p in m.named_parameters()}
    model.destroy()
    ctx.close()


def test_strided_source_and_parts():
    m = Tiny()
    ctx, model = build(m)
    ck = checkpoint(11)
    with model.update(version="a") as txn:
        for k, v in ck.items():
            if v is None:
                continue
            if k == "o":  # a transposed view of the same logical tensor
                v = v.t().contiguous().t()
                assert not v.is_contiguous()
            if k == "model.embed":  # in parts, out of order
                txn.load_part(k, 20, v[20:30].to(DEV))
                txn.load_part(k, 0, v[0:20].to(DEV))
                continue
            txn.load(k, v.to(DEV))
    check(m, ck)
    ctx.close()


def test_errors_carry_messages():
    m = Tiny()
    ctx, model = build(m)
    ck = checkpoint(3)
    txn = model.begin(version="bad", keep_going=True)  # each refusal leaves it open
    try:
        txn.load("q", torch.zeros(15, 8, dtype=torch.bfloat16, device=DEV))
        raise AssertionError("a wrong shape was accepted")
    except refit.RefitError as e:
        assert e.name == "REFIT_EMISMATCH" and "q" in e.message, e
    try:
        txn.load("nope", ck["q"])
        raise AssertionError("an unexpected name was accepted")
    except refit.RefitError as e:
        assert e.name == "REFIT_EUNEXPECTED" and "nope" in e.message, e
    txn.load("q", ck["q"].to(DEV))
    try:
        txn.load("q", ck["q"].to(DEV))
        raise AssertionError("a duplicate was accepted")
    except refit.RefitError as e:
        assert e.name == "REFIT_EDUPLICATE", e
    try:
        txn.finalize()  # the model was never loaded: every module is needed
        raise AssertionError("an incomplete update committed")
    except refit.RefitError as e:
        assert e.name == "REFIT_EINCOMPLETE" and "module" in e.message, e
    assert ctx.health() == refit.Health.EMPTY
    ctx.close()


def fresh_stream():
    """A stream no earlier test used (torch's pool hands the same 32 out
    again, and refit's stream queues live for the process): made by
    cudaStreamCreate and never destroyed, so no later handle repeats it."""
    h = ctypes.c_void_p()
    err = torch.cuda.cudart().cudaStreamCreate(ctypes.addressof(h))
    assert int(err) == 0 and h.value, int(err)
    return torch.cuda.ExternalStream(h.value)


def safetensors_update(model, version, seed):
    """One update at the defaults (rollback on, undo log in pinned host
    memory) from a page-cached safetensors file: pageable, through the
    pinned ring. Returns the checkpoint."""
    from safetensors.torch import save_file
    ck = checkpoint(seed)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        save_file({k: v.contiguous() for k, v in ck.items() if v is not None}, path)
        with model.update(version=version) as txn:
            txn.load_safetensors(path)
        torch.cuda.current_stream().synchronize()
    return ck


def test_seal_prepares_the_first_update():
    """Issue 28: after seal() and undo_held(wait=True), the first update at
    the defaults allocates nothing a steady one does not. Counted, not
    timed: refit_sys_cuda_stats' queues (the (stream, device) queues made
    so far) do not move in the first update on the stream seal prepared,
    and the undo memory held (undo_held, reserved at seal: every runtime
    byte, pinned) covers the update and is the same after it. The control:
    a model sealed with prepare=False makes its stream's queue in its first
    update."""
    from refit import _sys
    for prepare in (True, False):
        s = fresh_stream()
        m = Tiny()
        q0 = _sys.cuda_stats()["queues"]
        with torch.cuda.stream(s):
            ctx, model = build(m, prepare=prepare)
        q_seal = _sys.cuda_stats()["queues"]
        assert q_seal == q0 + (1 if prepare else 0), (prepare, q0, q_seal)
        dev, host = model.undo_held(wait=True)
        st = model.stats()
        need = st["runtime_bytes"] + 512 * st["runtime_tensors"]
        assert dev == 0 and host >= need, (dev, host, need)   # no budget: pinned host
        before = _sys.cuda_stats()
        with torch.cuda.stream(s):
            ck = safetensors_update(model, "v1", 21)
        after = _sys.cuda_stats()
        check(m, ck)
        assert after["pageable_bytes"] > before["pageable_bytes"], "not through the ring"
        assert model.undo_held(wait=False) == (dev, host), (model.undo_held(), dev, host)
        assert after["queues"] == q_seal + (0 if prepare else 1), (prepare, q_seal, after)
        with torch.cuda.stream(s):   # a steady one: nothing either way
            check(m, safetensors_update(model, "v2", 22))
        assert _sys.cuda_stats()["queues"] == after["queues"]
        assert model.undo_held(wait=False) == (dev, host)
        ctx.close()
