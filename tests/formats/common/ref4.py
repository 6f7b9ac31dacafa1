#!/usr/bin/env python3
"""Reference data for the 4-bit format tests (int4, nvfp4, mxfp4).

Writes one safetensors file holding checkpoint-like tensors, named as the
public checkpoints name them, plus `expect.*` tensors: what the C side must
reproduce (dequantized values, swizzled scales, fused factors, quantized
bytes). Everything is computed here with numpy and ml_dtypes, independently
of the C kernels.

  ref4.py int4   OUT --n N --k K --group G [--asym] [--seed S] [--scale-dtype bf16]
  ref4.py int4-online OUT --n N --k K --group G [--dtype bf16] [--scale-dtype bf16] [--seed S]
  ref4.py nvfp4  OUT --n N --k K --convention modelopt|ct [--no-input] [--seed S]
  ref4.py nvfp4-online OUT --n N --k K [--dtype bf16|f16|f32] [--seed S]
  ref4.py mxfp4  OUT --n N --k K [--experts E] [--blocks] [--seed S]
  ref4.py mxfp4-online OUT --n N --k K [--experts E] [--dtype bf16] [--seed S]
  ref4.py fp4pack OUT        every byte's two E2M1 codes and values
"""
import argparse
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

E2M1 = ml_dtypes.float4_e2m1fn
E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu
BF16 = ml_dtypes.bfloat16


def cdiv(a, b):
    return -(-a // b)


# ---- int4 (compressed-tensors pack-quantized) ----

def pack_int4_rows(vals):
    """[R, C] int in -8..7 -> int32 [R, ceil(C/8)], 8 per word along C,
    low nibble first, codes value + 8, padded with code 0."""
    r, c = vals.shape
    codes = np.zeros((r, cdiv(c, 8) * 8), dtype=np.uint32)
    codes[:, :c] = (vals + 8).astype(np.uint32)
    codes = codes.reshape(r, -1, 8)
    words = np.zeros(codes.shape[:2], dtype=np.uint32)
    for j in range(8):
        words |= codes[:, :, j] << np.uint32(4 * j)
    return words.view(np.int32)


def cmd_int4(a, rng):
    n, k, g = a.n, a.k, a.group
    groups = 1 if g <= 0 else cdiv(k, g)
    q = rng.integers(-8, 8, size=(n, k))
    sdt = {"bf16": BF16, "f16": np.float16, "f32": np.float32}[a.scale_dtype]
    scale = (rng.uniform(0.001, 0.05, size=(n, groups))).astype(sdt)
    out = {
        "W.weight_packed": pack_int4_rows(q),
        "W.weight_scale": scale,
        "W.weight_shape": np.array([n, k], dtype=np.int64),
    }
    zp = np.zeros((n, groups), dtype=np.int64)
    if a.asym:
        zp = rng.integers(-8, 8, size=(n, groups))
        out["W.weight_zero_point"] = np.ascontiguousarray(pack_int4_rows(zp.T).T)
    col_group = np.arange(k) // g if g > 0 else np.zeros(k, dtype=np.int64)
    deq = (q - zp[:, col_group]).astype(np.float32) * scale.astype(np.float32)[:, col_group]
    out["expect.dequant"] = deq.astype(np.float32)
    return out


def int4_quantize(x, group, sdt):
    """compressed-tensors symmetric INT4 (calculate_qparams, _quantize):
    per row and group of `group` columns (<= 0: the row), amax with 0 in
    the range, scale = amax / 7.5 (bit range 15 / 2) in f32, rounded to
    the scale dtype, 0 -> that dtype's eps; q = rint(clip(x / scale, -8,
    7)), ties to even. x: f32 [N, K]. Returns q [N, K], scale [N, G]."""
    n, k = x.shape
    g = group if group > 0 else max(k, 1)
    groups = cdiv(k, g) if group > 0 else 1
    pad = np.zeros((n, groups * g), dtype=np.float32)
    pad[:, :k] = x
    amax = np.abs(pad.reshape(n, groups, g)).max(axis=2)
    s = (amax / np.float32(7.5)).astype(np.float32).astype(sdt)
    eps = (ml_dtypes.finfo(sdt) if sdt == BF16 else np.finfo(sdt)).eps
    s = np.where(s == 0, np.array(eps, dtype=sdt), s).astype(sdt)
    sf = s.astype(np.float32)[:, np.arange(k) // g]
    q = np.rint(np.clip(x / sf, np.float32(-8), np.float32(7))).astype(np.int64)
    return q, s


def cmd_int4_online(a, rng):
    n, k = a.n, a.k
    dt = {"bf16": BF16, "f16": np.float16, "f32": np.float32}[a.dtype]
    sdt = {"bf16": BF16, "f16": np.float16, "f32": np.float32}[a.scale_dtype]
    w = rng.normal(0, 1, size=(n, k)).astype(np.float32)
    w *= np.float32(2.0) ** rng.integers(-6, 4, size=(n, 1)).astype(np.float32)
    if n > 0 and k > 0:
        w[0, :min(k, max(a.group, 1) if a.group > 0 else k)] = 0.0   # a zero group: eps
    if n > 1 and k > 0:  # amax 7.5: scale 1, x / scale hits the ties of rint
        w[1] = (np.arange(k) % 31 - 15).astype(np.float32) * np.float32(0.5)
    if n > 2 and k > 0:  # subnormal magnitudes (f32 only stays subnormal)
        w[2] = rng.uniform(-1, 1, size=k).astype(np.float32) * np.float32(1e-39)
    if n > 3 and k > 0:
        w[3, k // 2] = 1000.0
    w = w.astype(dt)
    q, s = int4_quantize(w.astype(np.float32), a.group, sdt)
    return {"W.weight": w, "expect.packed": pack_int4_rows(q), "expect.scale": s,
            "expect.dequant": (q.astype(np.float32) *
                               s.astype(np.float32)[:, np.arange(k) // (a.group if a.group > 0
                                                                        else max(k, 1))])}


# ---- E2M1 packing, shared by nvfp4 and mxfp4 ----

def decode_e2m1(codes):
    """E2M1 codes (uint8 0..15) -> float32 via ml_dtypes."""
    table = np.arange(16, dtype=np.uint8)
    # ml_dtypes stores float4_e2m1fn one per byte, in the low 4 bits
    vals = table.view(E2M1).astype(np.float32)
    return vals[codes]


def pack_fp4_rows(codes):
    """[..., C] codes -> [..., ceil(C/2)] bytes, low nibble first."""
    c = codes.shape[-1]
    pad = np.zeros(codes.shape[:-1] + (cdiv(c, 2) * 2,), dtype=np.uint8)
    pad[..., :c] = codes
    return (pad[..., 0::2] | (pad[..., 1::2] << 4)).astype(np.uint8)


def swizzle_128x4(scale):
    """vLLM/FlashInfer swizzle_blockscale, 2-D: pad to [128*, 4*], then
    reshape (Rp/128, 4, 32, Cp/4, 4) and permute (0, 3, 2, 1, 4)."""
    r, c = scale.shape
    rp, cp = cdiv(r, 128) * 128, cdiv(c, 4) * 4
    p = np.zeros((rp, cp), dtype=np.uint8)
    p[:r, :c] = scale.view(np.uint8)
    p = p.reshape(rp // 128, 4, 32, cp // 4, 4).transpose(0, 3, 2, 1, 4)
    return np.ascontiguousarray(p).reshape(rp, cp)


def random_e4m3_scales(rng, shape):
    # positive, finite, normal E4M3 patterns (exponent field 1..14)
    exp = rng.integers(1, 15, size=shape)
    man = rng.integers(0, 8, size=shape)
    return ((exp << 3) | man).astype(np.uint8).view(E4M3)


def cmd_nvfp4(a, rng):
    n, k = a.n, a.k
    codes = rng.integers(0, 16, size=(n, k)).astype(np.uint8)
    blocks = cdiv(k, 16)
    scale = random_e4m3_scales(rng, (n, blocks))
    out = {"expect.swizzled": swizzle_128x4(scale)}
    vals = decode_e2m1(codes) * scale.astype(np.float32)[:, np.arange(k) // 16]
    g_w = np.float32(rng.uniform(0.5, 4.0))
    g_in = np.float32(rng.uniform(0.5, 4.0))
    one = np.float32(1.0)
    if a.convention == "modelopt":
        out["W.weight"] = pack_fp4_rows(codes)
        out["W.weight_scale"] = scale
        out["W.weight_scale_2"] = np.array(g_w, dtype=np.float32)  # 0-d, as ModelOpt
        deq = vals * g_w
        alpha = g_w
        if not a.no_input:
            out["W.input_scale"] = np.array(g_in, dtype=np.float32)
            alpha = np.float32(g_in * g_w)
            out["expect.input_scale_inv"] = np.array([one / g_in], dtype=np.float32)
    else:
        out["W.weight_packed"] = pack_fp4_rows(codes)
        out["W.weight_scale"] = scale
        out["W.weight_global_scale"] = np.array([g_w], dtype=np.float32)
        deq = vals * one / g_w
        alpha = one / g_w
        if not a.no_input:
            out["W.input_global_scale"] = np.array([g_in], dtype=np.float32)
            alpha = one / np.float32(g_in * g_w)
            out["expect.input_scale_inv"] = np.array([g_in], dtype=np.float32)
    out["expect.dequant"] = deq.astype(np.float32)
    out["expect.alpha"] = np.array([alpha], dtype=np.float32)
    return out


def nvfp4_quantize(x):
    """Online NVFP4 of a float32 [n, k] matrix, compressed-tensors' order
    (generate_gparam, calculate_qparams, _quantize), every step in float32:
    gs = 448 * 6 / amax (1 for amax 0, FLT_MAX past it); per block of 16
    along a row s = gs * (bmax / 6) clamped to 448 and cast to E4M3 (a zero
    scale becomes 0.125); q = E2M1(clip(x / (s / gs), -6, 6)).
    Returns (codes [n, k], E4M3 scale bytes [n, ceil(k/16)], gs)."""
    n, k = x.shape
    f32 = np.float32
    amax = f32(np.max(np.abs(x))) if x.size else f32(0)
    with np.errstate(over="ignore", divide="ignore"):
        gs = f32(1) if amax == 0 else f32(2688) / amax
    if np.isinf(gs):
        gs = f32(np.finfo(np.float32).max)
    blocks = cdiv(k, 16)
    xp = np.zeros((n, blocks * 16), dtype=np.float32)
    xp[:, :k] = x
    xb = xp.reshape(n, blocks, 16)
    bmax = np.max(np.abs(xb), axis=2) if n else np.zeros((0, blocks), np.float32)
    s = np.clip(gs * (bmax / f32(6)), 0, 448).astype(E4M3).view(np.uint8)
    s = np.where(s == 0, np.uint8(0x20), s).astype(np.uint8)
    div = s.view(E4M3).astype(np.float32) / gs
    with np.errstate(over="ignore"):
        q = np.clip(xb / div[..., None], -6, 6).astype(E2M1).view(np.uint8) & 0xF
    return q.reshape(n, blocks * 16)[:, :k], s, gs


def cmd_nvfp4_online(a, rng):
    n, k = a.n, a.k
    dt = {"bf16": BF16, "f16": np.float16, "f32": np.float32}[a.dtype]
    w = rng.normal(0, 1, size=(n, k)).astype(np.float32)
    w *= np.float32(2.0) ** rng.integers(-6, 6, size=(n, 1)).astype(np.float32)
    if n > 3 and k > 0:
        w[0, :min(16, k)] = 0.0                        # a zero block: scale 0.125
        w[1, :] *= np.float32(1e-4)                    # small blocks: subnormal E4M3 scales
        w[2, 0] = np.float32(-300.0)                   # an outlier sets the global scale
        w[3, :min(16, k)] = np.float32(-1e-3) * w[3, :min(16, k)] ** 2  # -0 codes
    w = w.astype(dt)
    codes, scale, gs = nvfp4_quantize(w.astype(np.float32))
    one = np.float32(1)
    sv = scale.view(E4M3).astype(np.float32)
    deq = decode_e2m1(codes) * sv[:, np.arange(k) // 16] / gs if k else codes.astype(np.float32)
    return {"W.weight": w, "expect.packed": pack_fp4_rows(codes),
            "expect.swizzled": swizzle_128x4(scale), "expect.scale": scale,
            "expect.alpha": np.array([one / gs], dtype=np.float32),
            "expect.dequant": deq.astype(np.float32),
            "expect.div": (sv / gs).astype(np.float32)}


# ---- mxfp4 ----

def random_e8m0(rng, shape):
    return rng.integers(120, 134, size=shape).astype(np.uint8)


def cmd_mxfp4(a, rng):
    e, n, k = a.experts, a.n, a.k
    lead = (e,) if e else ()
    codes = rng.integers(0, 16, size=lead + (n, k)).astype(np.uint8)
    scales = random_e8m0(rng, lead + (n, cdiv(k, 32)))
    packed = pack_fp4_rows(codes)
    scale_f = scales.view(E8M0).astype(np.float32)
    deq = decode_e2m1(codes) * np.take(scale_f, np.arange(k) // 32, axis=-1)
    out = {"expect.dequant": deq.astype(np.float32)}
    if a.blocks:  # gpt-oss: *_blocks [..., N, K/32, 16], *_scales [..., N, K/32]
        assert k % 32 == 0
        out["W.weight_blocks"] = packed.reshape(lead + (n, k // 32, 16))
        out["W.weight_scales"] = scales
    else:
        out["W.weight_packed"] = packed
        out["W.weight_scale"] = scales
    return out


def mx_quantize_block(x):
    """OCP MX v1.0 section 6.3: X = 2^(floor(log2(amax)) - emax_elem),
    emax_elem = 2 for E2M1; elements x / X rounded to nearest even E2M1,
    saturating to +-6. An all-zero block gets code 0 (X = 2^-127), as
    plugins/mxfp8/quant_mx.h does."""
    amax = np.max(np.abs(x.astype(np.float32))) if x.size else np.float32(0)
    if amax == 0:
        e = -127
    else:
        # floor(log2(amax)) exactly: frexp gives amax = m * 2^p, m in [0.5, 1)
        e = int(np.frexp(np.float64(amax))[1]) - 1 - 2
        e = max(-127, min(127, e))
    scale = np.float32(2.0) ** np.float32(e) if e > -127 else np.float32(2.0**-127)
    q = np.clip(x.astype(np.float32) / scale, -6, 6).astype(E2M1)
    return np.uint8(e + 127), q.view(np.uint8) & 0xF


def cmd_mxfp4_online(a, rng):
    e, n, k = a.experts, a.n, a.k
    lead = (e,) if e else ()
    dt = {"bf16": BF16, "f16": np.float16, "f32": np.float32}[a.dtype]
    w = rng.normal(0, 1, size=lead + (n, k)).astype(np.float32)
    # a few outliers, zeros and a zero block to exercise the edges
    flat = w.reshape(-1, k)
    flat[0, :min(32, k)] = 0.0
    if flat.shape[0] > 1:
        flat[1, 0] = 1000.0
    w = flat.reshape(w.shape).astype(dt)
    blocks = cdiv(k, 32)
    codes = np.zeros(lead + (n, k), dtype=np.uint8)
    scales = np.zeros(lead + (n, blocks), dtype=np.uint8)
    wf = w.astype(np.float32).reshape(-1, n, k)
    cf = codes.reshape(-1, n, k)
    sf = scales.reshape(-1, n, blocks)
    for x in range(wf.shape[0]):
        for i in range(n):
            for b in range(blocks):
                s, q = mx_quantize_block(wf[x, i, b * 32:(b + 1) * 32])
                sf[x, i, b] = s
                cf[x, i, b * 32:(b + 1) * 32] = q
    return {"W.weight": w, "expect.packed": pack_fp4_rows(codes), "expect.scale": scales}


def cmd_fp4pack(a, rng):
    b = np.arange(256, dtype=np.uint8)
    lo, hi = b & 0xF, b >> 4
    return {"bytes": b, "expect.lo": decode_e2m1(lo), "expect.hi": decode_e2m1(hi)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--asym", action="store_true")
    ap.add_argument("--scale-dtype", default="bf16")
    ap.add_argument("--convention", default="modelopt")
    ap.add_argument("--no-input", action="store_true")
    ap.add_argument("--experts", type=int, default=0)
    ap.add_argument("--blocks", action="store_true")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    cmds = {"int4": cmd_int4, "nvfp4": cmd_nvfp4, "mxfp4": cmd_mxfp4,
            "mxfp4-online": cmd_mxfp4_online, "fp4pack": cmd_fp4pack,
            "nvfp4-online": cmd_nvfp4_online}
    cmds["int4-online"] = cmd_int4_online
    if a.cmd not in cmds:
        sys.exit(f"ref4.py: unknown command {a.cmd}")
    # np.array(copy) keeps 0-d scalars 0-d (ascontiguousarray would not)
    tensors = {k: np.array(v, order="C", copy=True) for k, v in cmds[a.cmd](a, rng).items()}
    save_file(tensors, a.out)


if __name__ == "__main__":
    main()
