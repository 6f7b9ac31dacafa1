"""Online FP8 end to end: a small engine that runs torch._scaled_mm on FP8
weights and scales. Its weights are runtime tensors that refit fills from
BF16 checkpoints, quantizing them on the GPU at post-load (format fp8,
online: per-tensor, fused q/k/v with a scale per weight, per-channel, and a
block-128 layer). The same engine fed by a PyTorch reference quantization
(amax / 448, x / scale, clamp, cast, the arithmetic of plugins/fp8/quant_fp8.h
in torch ops) must give the same weights, scales and outputs bit for bit.
A CUDA graph of the refit engine's forward, captured once, survives
reloads; reloading the same weights changes no byte; a reload equals a
cold start; an aborted update with rollback restores the previous output.
"""
import torch

import refit

DEV = "cuda"
M = 48                    # tokens
H, I = 256, 512           # hidden, intermediate
QKV = [("q", 256), ("k", 128), ("v", 128)]


class Skip(Exception):
    pass


def need_fp8():
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        raise Skip("this torch has no float8_e4m3fn / _scaled_mm")
    if torch.cuda.get_device_capability() < (8, 9):
        raise Skip("FP8 GEMMs need compute capability 8.9 or later")


# ---- the PyTorch reference quantization ----

def ref_scale(amax):
    # a true division by a device tensor (torch turns a division by a CPU
    # scalar into a multiplication by its reciprocal, which rounds
    # otherwise); full_like is a fill kernel, so this can be graph-captured
    s = torch.div(amax, torch.full_like(amax, 448.0))
    return torch.where(s > 0, s, torch.ones_like(s))


def expand_blocks(s, n, k):
    """A [ceil(n/128), ceil(k/128)] block scale as [n, k] (views and one copy)."""
    bn, bk = s.shape
    return s[:, None, :, None].expand(bn, 128, bk, 128).reshape(bn * 128, bk * 128)[:n, :k]


def ref_encode(x, s):
    return torch.div(x, s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def ref_quant(w, scheme):
    """(q, scale) of a BF16 [N, K] weight: per_tensor scale [1],
    per_channel [N, 1], block128 [ceil(N/128), ceil(K/128)]."""
    x = w.float()
    n, k = x.shape
    if scheme == "per_tensor":
        s = ref_scale(x.abs().amax()).reshape(1)
        return ref_encode(x, s), s
    if scheme == "per_channel":
        s = ref_scale(x.abs().amax(dim=1, keepdim=True))
        return ref_encode(x, s), s
    bn, bk = (n + 127) // 128, (k + 127) // 128
    pad = torch.zeros(bn * 128, bk * 128, device=x.device)
    pad[:n, :k] = x.abs()
    s = ref_scale(pad.view(bn, 128, bk, 128).amax(dim=(1, 3)))
    return ref_encode(x, expand_blocks(s, n, k)), s


# ---- the engine ----

def act_quant(x, rowwise):
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True) if rowwise else xf.abs().amax()
    s = ref_scale(amax)
    return ref_encode(xf, s), s.reshape(-1, 1) if rowwise else s.reshape(())


def scaled_mm(xq, sx, wq, sw):
    r = torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
    return r[0] if isinstance(r, tuple) else r


def fp8_zeros(*shape):
    return torch.zeros(*shape, dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)


def fp8_cat(ts):
    return torch.cat([t.view(torch.uint8) for t in ts]).view(torch.float8_e4m3fn)


class Engine:
    """FP8 weights and scales in fixed storage (what refit writes into):
    up [I, H] per-tensor; qkv [512, H] fused, one scale per piece; down
    [H, I] per-channel (row-wise _scaled_mm); out [H + 72, H] block-128
    (ragged rows: dequantized, then a BF16 matmul)."""

    def __init__(self):
        f32 = dict(dtype=torch.float32, device=DEV)
        nq = sum(r for _, r in QKV)
        self.w = {"up": fp8_zeros(I, H), "qkv": fp8_zeros(nq, H), "down": fp8_zeros(H, I),
                  "out": fp8_zeros(H + 72, H)}
        self.s = {"up": torch.ones(1, **f32), "qkv": torch.ones(len(QKV), **f32),
                  "down": torch.ones(H, 1, **f32), "out": torch.ones(3, 2, **f32)}
        self.rowwise = True

    def forward(self, x):
        xq, sx = act_quant(x, False)
        h = scaled_mm(xq, sx, self.w["up"], self.s["up"].reshape(()))       # [M, I]
        hq, sh = act_quant(h, self.rowwise)
        if self.rowwise:
            y = scaled_mm(hq, sh, self.w["down"], self.s["down"].reshape(1, -1))
        else:
            y = (h.float() @ (self.w["down"].float() * self.s["down"]).t()).to(torch.bfloat16)
        yq, sy = act_quant(y, False)
        # one GEMM over the fused weight (cuBLASLt refuses some narrow
        # per-piece shapes), then each piece's scale on its columns
        one = torch.ones((), dtype=torch.float32, device=DEV)
        z = scaled_mm(yq, sy, self.w["qkv"], one)                              # [M, 512]
        col = torch.cat([self.s["qkv"][i].expand(rows) for i, (_, rows) in enumerate(QKV)])
        z = (z.float() * col).to(torch.bfloat16)
        wo = (self.w["out"].float() * expand_blocks(self.s["out"], H + 72, H)).to(torch.bfloat16)
        return z[:, :H] @ wo.t()


def checkpoint(seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=g, device=DEV) * 0.05).to(torch.bfloat16)  # noqa: E731
    ck = {"up_proj.weight": r(I, H), "down_proj.weight": r(H, I), "o_proj.weight": r(H + 72, H)}
    for name, rows in QKV:
        ck["%s_proj.weight" % name] = r(rows, H)
    # rows of zeros (scale 1) and of tiny values in some of them
    ck["down_proj.weight"][7].zero_()
    ck["o_proj.weight"][130:] *= 1e-30
    return ck


def reference_engine(ck):
    e = Engine()
    e.w["up"], e.s["up"] = ref_quant(ck["up_proj.weight"], "per_tensor")
    qs, ss = [], []
    for name, _ in QKV:
        q, s = ref_quant(ck["%s_proj.weight" % name], "per_tensor")
        qs.append(q)
        ss.append(s)
    e.w["qkv"], e.s["qkv"] = fp8_cat(qs), torch.cat(ss)
    e.w["down"], e.s["down"] = ref_quant(ck["down_proj.weight"], "per_channel")
    e.w["out"], e.s["out"] = ref_quant(ck["o_proj.weight"], "block128")
    return e


def register(engine):
    ctx = refit.Context(worker_id="py-fp8")
    m = ctx.create_model()
    bf16 = torch.bfloat16
    for mod, scheme in (("up", "per_tensor"), ("qkv", "per_tensor"), ("down", "per_channel"),
                        ("out", "block128")):
        m.add_module(mod, "fp8", {"scheme": scheme, "online": True})
        m.bind_runtime(mod, "weight", engine.w[mod])
        m.bind_runtime(mod, "weight_scale", engine.s[mod])
    m.expect("up", "up_proj.weight", bf16, (I, H), target="weight")
    m.expect("down", "down_proj.weight", bf16, (H, I), target="weight")
    m.expect("out", "o_proj.weight", bf16, (H + 72, H), target="weight")
    r0 = 0
    for name, rows in QKV:
        m.expect("qkv", "%s_proj.weight" % name, bf16, (rows, H), target="weight",
                 dst_offset=(r0, 0))
        r0 += rows
    m.seal()
    return ctx, m


def bytes_of(engine):
    return {k: (engine.w[k].view(torch.uint8).clone(), engine.s[k].view(torch.int32).clone())
            for k in engine.w}


def assert_same_bytes(a, b, what):
    for k in a:
        for i, kind in enumerate(("weight", "scale")):
            x, y = a[k][i], b[k][i]
            if not torch.equal(x, y):
                bad = (x != y).sum().item()
                raise AssertionError("%s: %s %s: %d of %d elements differ" %
                                     (what, k, kind, bad, x.numel()))


def test_scaled_mm_engine_matches_torch_quantization():
    need_fp8()
    eng = Engine()
    x = (torch.randn(M, H, device=DEV, generator=torch.Generator(device=DEV).manual_seed(3))
         ).to(torch.bfloat16)
    ck_a, ck_b = checkpoint(10), checkpoint(11)
    ref_a, ref_b = reference_engine(ck_a), reference_engine(ck_b)
    try:
        ref_a.forward(x)
    except RuntimeError as e:  # no row-wise scaled GEMM in this torch/GPU: dequantize that layer
        eng.rowwise = ref_a.rowwise = ref_b.rowwise = False
        print("# row-wise _scaled_mm unavailable (%s): the per-channel layer is dequantized" %
              str(e).splitlines()[0])
    ptrs = {k: (eng.w[k].data_ptr(), eng.s[k].data_ptr()) for k in eng.w}
    ctx, m = register(eng)

    # A, cold
    with m.update(version="a") as txn:
        txn.load_dict(ck_a)
    assert ctx.health() == refit.Health.READY
    assert_same_bytes(bytes_of(eng), bytes_of(ref_a), "A against torch")
    out_a = eng.forward(x)
    assert torch.equal(out_a, ref_a.forward(x)), "A: outputs differ"
    snap_a = bytes_of(eng)

    # a CUDA graph of the refit engine, captured once
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        eng.forward(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gout = eng.forward(x)

    def replay():
        g.replay()
        torch.cuda.synchronize()
        return gout.clone()
    gout_a = replay()
    if not torch.equal(gout_a, out_a):  # the captured kernels may differ from eager ones
        print("# graph replay and eager differ (max |d| %g): graphs compared with graphs" %
              (gout_a.float() - out_a.float()).abs().max().item())

    # B (from CPU tensors this time), twice: the same bytes
    with m.update(version="b") as txn:
        txn.load_dict({k: v.cpu() for k, v in ck_b.items()})
    assert_same_bytes(bytes_of(eng), bytes_of(ref_b), "B against torch")
    assert torch.equal(eng.forward(x), ref_b.forward(x)), "B: outputs differ"
    gout_b = replay()
    assert not torch.equal(gout_b, gout_a)
    if torch.equal(gout_a, out_a):
        assert torch.equal(gout_b, ref_b.forward(x)), "B: the graph's output differs"
    snap_b = bytes_of(eng)
    with m.update(version="b2") as txn:
        txn.load_dict(ck_b)
    assert_same_bytes(bytes_of(eng), snap_b, "B reloaded")

    # A again equals the cold start on A
    with m.update(version="a2") as txn:
        txn.load_dict(ck_a)
    assert_same_bytes(bytes_of(eng), snap_a, "A after B against A cold")
    assert torch.equal(replay(), gout_a)

    # an aborted update with rollback: A's output exactly
    txn = m.begin(version="c", rollback=True)
    txn.load_dict(checkpoint(12))
    assert txn.abort()
    assert ctx.health() == refit.Health.READY and ctx.version == "a2"
    assert torch.equal(replay(), gout_a)
    assert_same_bytes(bytes_of(eng), snap_a, "after abort")

    # a NaN is refused, naming module and tensor, and nothing changes
    bad = dict(ck_b)
    bad["k_proj.weight"] = bad["k_proj.weight"].clone()
    bad["k_proj.weight"][3, 5] = float("nan")
    txn = m.begin(version="nan", rollback=True)
    try:
        txn.load_dict(bad)
        txn.finalize()
        raise AssertionError("a NaN weight was quantized")
    except refit.RefitError as e:
        assert e.name == "REFIT_ECORRUPT", e
        assert "qkv" in e.message and "k_proj.weight" in e.message, e.message
    if ctx.health() == refit.Health.UPDATING:
        txn.abort()
    assert ctx.health() == refit.Health.READY
    assert_same_bytes(bytes_of(eng), snap_a, "after a refused NaN")

    assert ptrs == {k: (eng.w[k].data_ptr(), eng.s[k].data_ptr()) for k in eng.w}
    m.destroy()
    ctx.close()
