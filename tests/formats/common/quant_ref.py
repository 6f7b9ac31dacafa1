#!/usr/bin/env python3
"""Reference quantization for the FP8, INT8 and MXFP8 kernels, in numpy and
ml_dtypes: an independent statement of the arithmetic in plugins/fp8/quant_fp8.h,
quant_int8.h and quant_mx.h that the C tests compare with bit for bit.

Usage: quant_ref.py OUT.safetensors --n N --k K [--dtype bf16|f16|f32]
                    [--seed S] [--prefix P] [--specials]

Writes, for an input x [N, K] (random, plus with --specials: a zero row, a
zero 128x128 tile, a zero MX block, tiny values and subnormals, values at
the E4M3 limit):
  P.x                     x in --dtype
  P.fp8.<scheme>.q        u8 E4M3 codes   (scheme: per_tensor, per_channel,
  P.fp8.<scheme>.s        f32 scales       block128)
  P.fp8.<scheme>.rq       u8 E4M3 codes of arithmetic: reciprocal (vLLM's
                          scaled_fp8_quant: x * (1 / scale) in f32, clamped
                          with fmin/fmax), the same scales
  P.int8.<scheme>.q       i8              (per_tensor, per_channel)
  P.int8.<scheme>.s       f32
  P.mxfp8.q               u8 E4M3 codes
  P.mxfp8.s               u8 E8M0 scales [N, ceil(K/32)]
"""
import argparse

import ml_dtypes as md
import numpy as np
from safetensors.numpy import save_file

F32 = np.float32
DTYPES = {"bf16": md.bfloat16, "f16": np.float16, "f32": np.float32}


def tiles(n, k, th, tw):
    """Row/column ranges of a grid of th x tw tiles (ragged at the edges)."""
    rows = [(i, min(i + th, n)) for i in range(0, max(n, 1), max(th, 1))] if n else [(0, 0)]
    cols = [(j, min(j + tw, k)) for j in range(0, max(k, 1), max(tw, 1))] if k else [(0, 0)]
    return rows, cols


def amax(t):
    return F32(np.max(np.abs(t))) if t.size else F32(0)


def fp8_reciprocal(t, sc):
    """vLLM's scaled_fp8_conversion<true>: r = 1.0f / scale rounded once,
    x * r rounded to f32, fmax(-448, fmin(., 448)) (NaN -> +448), RNE."""
    inv = F32(1) / sc
    p = (t * inv).astype(F32)
    return np.fmax(F32(-448), np.fmin(p, F32(448))).astype(md.float8_e4m3fn)


def fp8(x, scheme, reciprocal=False):
    n, k = x.shape
    th = {"per_tensor": n, "per_channel": 1, "block128": 128}[scheme]
    tw = 128 if scheme == "block128" else k
    rows, cols = tiles(n, k, th, tw)
    if scheme == "per_channel":
        rows = [(i, i + 1) for i in range(n)]
    if scheme != "block128":
        cols = [(0, k)]
    q = np.zeros((n, k), md.float8_e4m3fn)
    s = np.zeros((len(rows), len(cols)), F32)
    for bi, (r0, r1) in enumerate(rows):
        for bj, (c0, c1) in enumerate(cols):
            t = x[r0:r1, c0:c1]
            sc = amax(t) / F32(448)  # f32 / f32: one rounding
            sc = F32(1) if sc == 0 else sc
            s[bi, bj] = sc
            if reciprocal:
                q[r0:r1, c0:c1] = fp8_reciprocal(t, sc)
            else:
                q[r0:r1, c0:c1] = np.clip(t / sc, -448, 448).astype(md.float8_e4m3fn)
    return q.view(np.uint8), s


def int8(x, scheme):
    n, k = x.shape
    groups = [(i, i + 1) for i in range(n)] if scheme == "per_channel" else [(0, n)]
    q = np.zeros((n, k), np.int8)
    s = np.zeros((len(groups), 1), F32)
    for g, (r0, r1) in enumerate(groups):
        sc = amax(x[r0:r1]) / F32(127.5)
        sc = F32(1) if sc == 0 else sc
        s[g, 0] = sc
        q[r0:r1] = np.clip(np.rint(x[r0:r1] / sc), -128, 127).astype(np.int8)
    return q, s


def mx_scale(a, emax):
    """E8M0 code: clamp(floor(log2(a)) - emax, -127, 127) + 127; 0 for a == 0."""
    if a == 0:
        return 0
    _, e = np.frexp(a)  # a = m * 2^e, m in [0.5, 1): floor(log2 a) = e - 1
    return int(np.clip(int(e) - 1 - emax, -127, 127)) + 127


def mxfp8(x):
    n, k = x.shape
    nb = (k + 31) // 32
    q = np.zeros((n, k), md.float8_e4m3fn)
    s = np.zeros((n, nb), np.uint8)
    for i in range(n):
        for b in range(nb):
            blk = x[i, b * 32:(b + 1) * 32]
            code = mx_scale(amax(blk), 8)
            s[i, b] = code
            scale = F32(np.ldexp(1.0, code - 127))  # exact, 2^-127 a subnormal
            q[i, b * 32:(b + 1) * 32] = np.clip(blk / scale, -448, 448).astype(md.float8_e4m3fn)
    return q.view(np.uint8), s


def make_x(n, k, dtype, seed, specials):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * rng.uniform(0.01, 4.0, (n, 1))).astype(F32)
    if specials and n >= 4 and k >= 4:
        x[1, :] = 0                                   # a zero row (per-channel)
        x[2, :] *= F32(1e-39)                         # subnormal magnitudes
        x[3, : min(k, 40)] = F32(448.0) * rng.choice([-1, 1], min(k, 40))
        if n > 128 and k > 128:
            x[128:256, 128:256] = 0                   # a zero 128x128 tile
        x[0, 32:64] = 0                               # a zero MX block
        x[0, :4] = [F32(2.0 ** -140), F32(-(2.0 ** -149)), F32(3e-41), F32(6e4)]
    return x.astype(DTYPES[dtype])


def main():
    np.seterr(all="ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prefix", default="t")
    ap.add_argument("--specials", action="store_true")
    a = ap.parse_args()
    x = make_x(a.n, a.k, a.dtype, a.seed, a.specials)
    x32 = x.astype(F32)
    p = a.prefix
    out = {p + ".x": x}
    for scheme in ("per_tensor", "per_channel", "block128"):
        out["%s.fp8.%s.q" % (p, scheme)], out["%s.fp8.%s.s" % (p, scheme)] = fp8(x32, scheme)
        out["%s.fp8.%s.rq" % (p, scheme)] = fp8(x32, scheme, reciprocal=True)[0]
    for scheme in ("per_tensor", "per_channel"):
        out["%s.int8.%s.q" % (p, scheme)], out["%s.int8.%s.s" % (p, scheme)] = int8(x32, scheme)
    out[p + ".mxfp8.q"], out[p + ".mxfp8.s"] = mxfp8(x32)
    save_file({key: np.ascontiguousarray(v) for key, v in out.items()}, a.out)


if __name__ == "__main__":
    main()
