#!/usr/bin/env python3
"""Reference tables for the small-float codecs (kernels/minifloat.h), from
ml_dtypes' astype: test_minifloat reads them and compares bit for bit.

Usage: gen_minifloat_ref.py OUT.safetensors [--random N] [--seed S]
       gen_minifloat_ref.py OUT.safetensors --subnormals

--subnormals writes only enc.x and enc.<t>: every f32 subnormal of either
sign, both zeros, and the 64 smallest normals of either sign, so the codecs
are checked exhaustively where their rounding is subtlest.

Tensors written:
  dec.<t>          f32 bits (u32) of decoding every bit pattern of type t
                   (256 patterns; 16 for e2m1)
  enc.x            u32 f32 bit patterns to encode: every representable value
                   of every type, its f32 neighbours, the midpoints between
                   neighbours and their f32 neighbours, specials (+-0, +-inf,
                   NaNs with payloads), f32 subnormals, values around each
                   type's largest finite and overflow threshold, then a random
                   sweep over all f32 bits and over each type's range
  enc.<t>          u8 expected code of each enc.x under astype (e2m1: low nibble)
  enc.<t>_sat      u8 expected saturating code: NaN kept, everything else
                   clipped to +-max first (so +-inf -> +-max)
"""
import argparse

import ml_dtypes as md
import numpy as np
from safetensors.numpy import save_file

TYPES = {
    "e4m3": (md.float8_e4m3fn, 256),
    "e5m2": (md.float8_e5m2, 256),
    "e8m0": (md.float8_e8m0fnu, 256),
    "e2m1": (md.float4_e2m1fn, 16),
}
SAT = {"e4m3": 448.0, "e5m2": 57344.0}


def decode_tables():
    out = {}
    for name, (dt, n) in TYPES.items():
        codes = np.arange(n, dtype=np.uint8)
        vals = codes.view(dt).astype(np.float32)
        out["dec." + name] = vals.view(np.uint32).copy()
    return out


def f32_neighbours(v):
    v = np.asarray(v, dtype=np.float32)
    inf = np.float32(np.inf)
    up = np.nextafter(v, inf)
    dn = np.nextafter(v, -inf)
    return np.concatenate([v, up, dn, np.nextafter(up, inf), np.nextafter(dn, -inf)])


def edge_values():
    parts = []
    for name, (dt, n) in TYPES.items():
        vals = np.arange(n, dtype=np.uint8).view(dt).astype(np.float32)
        vals = np.unique(vals[np.isfinite(vals)])
        # midpoints in f64 are exact for these few-bit types; the f32
        # rounding of each and its neighbours probe the tie rules
        mids = ((vals[1:].astype(np.float64) + vals[:-1].astype(np.float64)) / 2).astype(np.float32)
        top = vals.max()
        beyond = np.array([top * 1.0625, top * 1.125, top * 1.5, top * 2, top * 4], np.float32)
        parts += [f32_neighbours(vals), f32_neighbours(mids), f32_neighbours(beyond)]
        # e8m0 rounds between powers of two at 1.5 * 2^e
        if name == "e8m0":
            e = np.arange(-149, 128, dtype=np.float64)
            parts.append(f32_neighbours((1.5 * np.exp2(e)).astype(np.float32)))
            parts.append(f32_neighbours(np.exp2(np.clip(e, -149, 127)).astype(np.float32)))
    sub = np.array([1, 2, 3, 0x3FFFFF, 0x400000, 0x400001, 0x600000, 0x7FFFFF, 0x800000],
                   np.uint32).view(np.float32)
    specials = np.array([0x00000000, 0x7F800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF,
                         0x7FA00000, 0x7F7FFFFF, 0x00000001], np.uint32)
    specials = np.concatenate([specials, specials | 0x80000000]).view(np.float32)
    parts += [sub, -sub, specials]
    x = np.concatenate(parts).astype(np.float32)
    return np.concatenate([x, -x])


def random_values(n, seed):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    parts = [bits.view(np.float32)]
    for top in (6.0, 448.0, 57344.0, 2.0 ** 127):
        parts.append((rng.uniform(-1.2, 1.2, n) * top).astype(np.float32))
    # log-uniform magnitudes reach the subnormals of every type
    mag = np.exp2(rng.uniform(-150, 128, n)).astype(np.float32)
    parts.append(mag * rng.choice([-1, 1], n).astype(np.float32))
    return np.concatenate(parts)


def subnormal_values():
    mag = np.arange(0, 0x00800000 + 64, dtype=np.uint32)
    return np.concatenate([mag, mag | np.uint32(0x80000000)]).view(np.float32)


def encode_tables(x):
    out = {"enc.x": x.view(np.uint32).copy()}
    with np.errstate(all="ignore"):
        for name, (dt, _) in TYPES.items():
            codes = x.astype(dt).view(np.uint8)
            if name == "e2m1":
                codes = codes & 0xF
            out["enc." + name] = codes.copy()
            if name in SAT:
                m = SAT[name]
                clipped = np.where(np.isnan(x), x, np.clip(x, -m, m)).astype(np.float32)
                out["enc.%s_sat" % name] = clipped.astype(dt).view(np.uint8).copy()
    return out


def main():
    np.seterr(all="ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--random", type=int, default=1 << 18)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--subnormals", action="store_true")
    a = ap.parse_args()
    if a.subnormals:
        tables = encode_tables(subnormal_values())
    else:
        x = np.concatenate([edge_values(), random_values(a.random, a.seed)])
        tables = decode_tables()
        tables.update(encode_tables(x))
    save_file(tables, a.out)


if __name__ == "__main__":
    main()
