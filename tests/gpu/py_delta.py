"""Delta updates on the GPU (docs/core.md and docs/embedding.md "Delta
updates"): patches from CUDA, pinned and pageable tensors into
py_binding's Tiny model (TP rank 1 of 2, padded vocabulary, fused qkv,
row-parallel o, tied head, a bf16 norm cast to f32) give the bytes a full
reload of the patched checkpoint gives, bit for bit; an abort after half
the patches restores every byte, the undo log in device memory and only
the patched elements saved; a bad patch writes nothing; the guide's
push_delta block runs."""
import torch

import refit

import embedding_doc
import py_binding as pb


def _build(m, **ctx_kw):
    """py_binding.build with context options (an undo device budget)."""
    ctx = refit.Context(worker_id="py-delta", rank=pb.TP_RANK, journal_path="", **ctx_kw)
    model = ctx.create_model()
    refit.register_module(
        model, m, fused={"qkv": [("q", 16), ("k", 4), ("v", 4)]},
        shard_dims={"embed": 0, "qkv": 0, "o": 1}, tp_rank=pb.TP_RANK, tp_size=pb.TP,
        padded={"embed": 30}, ckpt_dtype={"norm": torch.bfloat16},
        rename={"embed": "model.embed", "head": "lm_head"})
    model.seal()
    return ctx, model


def _bytes(m):
    torch.cuda.synchronize()
    return {n: p.detach().view(torch.uint8).clone() for n, p in m.named_parameters()}


def _full(model, version, ck):
    with model.update(version=version) as txn:
        txn.load_dict({k: v.to(pb.DEV) for k, v in ck.items() if v is not None})
    torch.cuda.synchronize()


def _patch(ck, new, frac, seed, where="cuda"):
    """{name: (indices, values)} changing about frac of each tensor's
    elements to new's (indices and values on `where`), and the patched
    checkpoint."""
    g = torch.Generator().manual_seed(seed)
    out, patched = {}, {"lm_head": None}
    for n, t in ck.items():
        if t is None:
            continue
        flat = t.flatten()
        idx = (torch.rand(flat.numel(), generator=g) < frac).nonzero().flatten()
        if idx.numel() == 0:
            idx = torch.tensor([flat.numel() // 2])
        idx = idx[torch.randperm(idx.numel(), generator=g)]    # any order
        vals = new[n].flatten()[idx].contiguous()
        p = flat.clone()
        p[idx] = vals
        patched[n] = p.view(t.shape)
        if where == "cuda":
            idx, vals = idx.to(pb.DEV), vals.to(pb.DEV)
        elif where == "pinned":
            vals = vals.pin_memory()
        out[n] = (idx, vals)
    return out, patched


def test_delta_equals_full_reload():
    for where in ("cuda", "pinned", "cpu"):
        m1, m2 = pb.Tiny(), pb.Tiny()
        (ctx1, model1), (ctx2, model2) = _build(m1), _build(m2)
        ck1 = pb.checkpoint(1)
        _full(model1, "v1", ck1)
        patches, patched = _patch(ck1, pb.checkpoint(2), 0.1, 3, where)
        with model1.update(version="v2", base="v1") as txn:
            txn.load_deltas(patches)
            st = txn.stats()
        assert st["delta_tensors"] == len(patches), st
        torch.cuda.synchronize()
        assert ctx1.version == "v2" and ctx1.health() == refit.Health.READY
        pb.check(m1, patched)
        _full(model2, "v2", patched)
        b1, b2 = _bytes(m1), _bytes(m2)
        for n in b1:
            assert torch.equal(b1[n], b2[n]), (where, n)
        for c, mo in ((ctx1, model1), (ctx2, model2)):
            mo.destroy()
            c.close()


def test_abort_after_half_restores_every_byte_device_undo():
    m = pb.Tiny()
    ctx, model = _build(m, undo_device_budget=1 << 20)
    ck1 = pb.checkpoint(1)
    _full(model, "v1", ck1)
    before = _bytes(m)
    with model.begin(version="full") as txn:   # a full update's undo, for scale
        txn.load_dict({k: v.to(pb.DEV) for k, v in pb.checkpoint(2).items() if v is not None})
        full = txn.stats()
        txn.abort()
    patches, _ = _patch(ck1, pb.checkpoint(2), 0.03, 4)
    names = sorted(patches)
    txn = model.begin(version="v2", base="v1")
    txn.load_deltas({n: patches[n] for n in names[: len(names) // 2]})
    st = txn.stats()
    saved = st["undo_device_bytes"] + st["undo_host_bytes"]
    assert st["undo_device_bytes"] == saved > 0, st
    assert saved * 5 < full["undo_device_bytes"] + full["undo_host_bytes"], (st, full)
    txn.abort()
    after = _bytes(m)
    for n in before:
        assert torch.equal(before[n], after[n]), n
    assert ctx.version == "v1" and ctx.health() == refit.Health.READY
    model.destroy()
    ctx.close()


def test_bad_patch_writes_nothing():
    m = pb.Tiny()
    ctx, model = _build(m)
    _full(model, "v1", pb.checkpoint(1))
    before = _bytes(m)
    txn = model.begin(version="v2", base="v1", keep_going=True)
    good = torch.arange(0, 16, device=pb.DEV)
    bad = torch.tensor([1, 2, 8 * 8], device=pb.DEV)             # o is [8, 8]
    vals = torch.ones(3, dtype=torch.bfloat16, device=pb.DEV)
    try:
        txn.load_deltas({"q": (good, torch.ones(16, dtype=torch.bfloat16, device=pb.DEV)),
                         "o": (bad, vals)})
        raise AssertionError("the bad row was accepted")
    except refit.RefitError as err:
        assert err.name == "REFIT_EINVAL" and "row 1 (o)" in err.message, err
    assert txn.stats()["tensors_loaded"] == 0
    txn.abort()
    after = _bytes(m)
    for n in before:
        assert torch.equal(before[n], after[n]), n
    model.destroy()
    ctx.close()


def test_guide_push_delta():
    ns = embedding_doc.run(embedding_doc.blocks(), ["delta"], "embedding_guide_delta")
    m = pb.Tiny()
    ctx, model = _build(m)
    ck1 = pb.checkpoint(1)
    _full(model, "v1", ck1)
    _, patched = _patch(ck1, pb.checkpoint(2), 0.05, 6)
    old = {k: v.to(pb.DEV) for k, v in ck1.items() if v is not None}
    new = {k: v.to(pb.DEV) for k, v in patched.items() if v is not None}
    ns["push_delta"](model, "v1", "v2", old, new)
    torch.cuda.synchronize()
    pb.check(m, patched)
    assert ctx.version == "v2"
    model.destroy()
    ctx.close()
