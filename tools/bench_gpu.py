#!/usr/bin/env python3
"""PyTorch peers of refit-bench gpu (tools/bench_gpu.c execs this with a
spec file): the same reloads written the way an engine does them today.
Prints one JSON object on stdout (timings in ms, medians of `repeat` runs
after a warm-up).

  d2d          param.copy_(src) for every tensor of the Llama-shaped model
  safetensors  safetensors.torch.load_file(file) then param.copy_(t), every file
  moe100k      stack[e].copy_(src) for 100,000 small tensors
  quant        FP8 E4M3 quantization of the model's linear weights (every
               2-D tensor but the embedding and the head) per tensor, per
               channel and per 128x128 block, written in PyTorch ops the way
               an engine does it: amax, scale = amax / 448, (w / scale)
               clamped to +-448, cast
  mx           (a spec with mx_shapes, from tools/bench_gpu_mx.c) MXFP8 and
               MXFP4 in PyTorch ops (mx_quant), and their bytes against refit's
               on layer 0
  nvfp4        (a spec with nvfp4_shapes, from tools/bench_gpu_nvfp4.c) online
               NVFP4 in PyTorch ops (nvfp4_quant), and its bytes against
               refit's on layer 0
  int4         (a spec with int4_shapes, from tools/bench_gpu_int4.c) online
               INT4 in PyTorch ops (int4_quant), and its bytes against
               refit's on layer 0
"""
import glob
import json
import os
import statistics
import sys
import time

import torch


def timed(fn, repeat):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def quant(spec, dev, repeat):
    ws = [torch.randn(s, device=dev).to(torch.bfloat16) for n, s in spec["tensors"]
          if len(s) == 2 and "embed_tokens" not in n and n != "lm_head.weight"]
    f8 = torch.float8_e4m3fn

    def per_tensor():
        for w in ws:
            s = w.abs().amax().float() / 448.0
            s = torch.where(s > 0, s, torch.ones_like(s))
            (w.float() / s).clamp(-448.0, 448.0).to(f8)

    def per_channel():
        for w in ws:
            s = w.abs().amax(dim=1, keepdim=True).float() / 448.0
            s = torch.where(s > 0, s, torch.ones_like(s))
            (w.float() / s).clamp(-448.0, 448.0).to(f8)

    def block128():  # the shapes here are multiples of 128
        for w in ws:
            n, k = w.shape
            t = w.float().view(n // 128, 128, k // 128, 128)
            s = t.abs().amax(dim=(1, 3), keepdim=True) / 448.0
            s = torch.where(s > 0, s, torch.ones_like(s))
            (t / s).clamp(-448.0, 448.0).to(f8).view(n, k)

    out = {}
    for key, fn in (("fp8_per_tensor", per_tensor), ("fp8_per_channel", per_channel),
                    ("fp8_block128", block128)):
        out[key] = {"ms": timed(fn, repeat), "weights": len(ws)}
    return out


def mx_quant(w, bits):
    """OCP MX quantization of a 2-D BF16/F16/F32 tensor in PyTorch ops, the
    arithmetic of plugins/mxfp8/quant_mx.h: per 32-block of a row s = clamp(
    floor(log2 amax) - emax, -127, 127) + 127 (0 when amax is 0), elements
    x * 2^(127-s) (exact: the same value as x / 2^(s-127)) rounded to E4M3
    (clamp to +-448, cast) or to E2M1 (RNE thresholds), E2M1 packed two a
    byte, low nibble first. Returns (elements, scales) as uint8 tensors."""
    n, k = w.shape
    nb = (k + 31) // 32
    x = torch.nn.functional.pad(w.float(), (0, nb * 32 - k)).view(n, nb, 32)
    amax = x.abs().amax(dim=2)
    _, ex = torch.frexp(amax)  # amax = m * 2^ex, m in [0.5, 1): floor(log2) = ex - 1
    e = (ex - 1 - (8 if bits == 8 else 2)).clamp(-127, 127) + 127
    s = torch.where(amax > 0, e, torch.zeros_like(e)).to(torch.int32)
    inv = torch.where(s < 254, (254 - s) << 23, torch.full_like(s, 0x00400000)).view(torch.float32)
    v = (x * inv.unsqueeze(2)).view(n, nb * 32)[:, :k]
    if bits == 8:
        q = v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    else:
        a = v.abs()
        code = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int() +
                (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int())
        code = code | (torch.signbit(v).int() << 3)
        code = torch.nn.functional.pad(code, (0, k % 2))
        q = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return q, s.to(torch.uint8)


def quant_mx(spec, dev, repeat):
    """refit-bench gpu's MX peer (tools/bench_gpu_mx.c): mx_quant over the
    model's linear weights, timed; and its bytes against refit's on layer 0
    (the BF16 sources and refit's outputs, written by the bench)."""
    ws = [torch.randn(s, device=dev).to(torch.bfloat16) for s in spec["mx_shapes"]]
    out = {"torch": torch.__version__}
    raw = open(os.path.join(spec["dir"], "mx-layer0-x.bin"), "rb").read()
    xs, at = [], 0
    for n, k in spec["mx_shapes"][:spec["mx_layer0"]]:
        t = torch.frombuffer(bytearray(raw[at:at + n * k * 2]), dtype=torch.bfloat16)
        xs.append(t.view(n, k).to(dev))
        at += n * k * 2
    for bits in (8, 4):
        key = "mxfp%d" % bits

        def run():
            for w in ws:
                mx_quant(w, bits)
        ours = open(os.path.join(spec["dir"], "mx-layer0-%s.bin" % key), "rb").read()
        theirs = b"".join(bytes(q.cpu().numpy().tobytes()) + bytes(s.cpu().numpy().tobytes())
                          for q, s in (mx_quant(x, bits) for x in xs))
        out[key] = {"ms": timed(run, repeat), "weights": len(ws),
                    "bytes_equal": ours == theirs}
    return out


def nvfp4_quant(w):
    """Online NVFP4 of a 2-D tensor in PyTorch ops, the arithmetic of
    plugins/nvfp4/quant_nvfp4.h (compressed-tensors, round to nearest), every step
    in float32: gs = 2688 / amax (1 for 0, clamped to FLT_MAX); per 16-block
    of a row an E4M3 scale gs * (bmax / 6) clamped to 448 and cast (0 ->
    0.125); codes E2M1(x / (scale / gs)) by RNE thresholds, packed two a
    byte, low nibble first; scales in the 128x4 swizzled layout. Returns
    (packed, swizzled, alpha) as uint8 tensors."""
    n, k = w.shape
    nb = (k + 15) // 16
    x = torch.nn.functional.pad(w.float(), (0, nb * 16 - k)).view(n, nb, 16)
    amax = x.abs().amax()
    gs = torch.where(amax > 0, 2688.0 / amax, torch.ones_like(amax))
    gs = gs.clamp(max=torch.finfo(torch.float32).max)
    s = (gs * (x.abs().amax(dim=2) / 6.0)).clamp(0, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    s = torch.where(s == 0, torch.full_like(s, 0x20), s)
    div = s.view(torch.float8_e4m3fn).float() / gs
    y = x / div.unsqueeze(2)
    a = y.abs()
    c = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) +
         (a >= 3.5) + (a > 5.0)) | (torch.signbit(y).to(torch.uint8) << 3)
    c = c.view(n, nb * 16)[:, :k]
    if k % 2:
        c = torch.nn.functional.pad(c, (0, 1))
    packed = c[:, 0::2] | (c[:, 1::2] << 4)
    rp, cp = (n + 127) // 128 * 128, (nb + 3) // 4 * 4
    sw = torch.zeros(rp, cp, dtype=torch.uint8, device=w.device)
    sw[:n, :nb] = s
    sw = sw.view(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4).contiguous().view(-1)
    alpha = (1.0 / gs).reshape(1).view(torch.uint8)
    return packed, sw, alpha


def quant_nvfp4(spec, dev, repeat):
    """(tools/bench_gpu_nvfp4.c) nvfp4_quant on every shape, timed, and its
    bytes against refit's on layer 0."""
    out = {"torch": torch.__version__}
    ws = [torch.randn(s, device=dev).to(torch.bfloat16) for s in spec["nvfp4_shapes"]]

    def run():
        for w in ws:
            nvfp4_quant(w)
    res = {"ms": timed(run, repeat), "weights": len(ws)}
    try:
        with open(os.path.join(spec["dir"], "nvfp4-layer0-x.bin"), "rb") as f:
            xb = f.read()
        with open(os.path.join(spec["dir"], "nvfp4-layer0-q.bin"), "rb") as f:
            qb = f.read()
        mine, at = [], 0
        for n, k in spec["nvfp4_shapes"][:spec["nvfp4_layer0"]]:
            x = torch.frombuffer(bytearray(xb[at:at + 2 * n * k]), dtype=torch.bfloat16)
            at += 2 * n * k
            parts = nvfp4_quant(x.view(n, k).to(dev))
            mine.append(torch.cat([p.reshape(-1) for p in parts]).cpu().numpy().tobytes())
        res["bytes_equal"] = b"".join(mine) == qb
    except OSError as e:
        res["bytes_equal"] = "no layer-0 files: " + str(e)
    out["nvfp4"] = res
    return out


def int4_quant(w, group):
    """Online INT4 of a 2-D tensor in PyTorch ops, the arithmetic of
    plugins/int4/quant_int4.h (compressed-tensors, symmetric, round to nearest),
    every step in float32: per row and group of `group` columns scale =
    amax / 7.5 cast to BF16 (0 -> BF16 epsilon); q = round(clamp(x / scale,
    -8, 7)) (ties to even), codes q + 8 packed 8 an int32 along K, low
    nibble first, a ragged last word padded with code 0. Returns (qweight
    I32 [ceil(K/8), N], scales BF16 [G, N]): the GPTQ layout the plugin
    writes."""
    n, k = w.shape
    g = group if group > 0 else k
    ng = (k + g - 1) // g
    x = torch.nn.functional.pad(w.float(), (0, ng * g - k)).view(n, ng, g)
    s = (x.abs().amax(dim=2) / 7.5).to(torch.bfloat16)
    s = torch.where(s == 0, torch.full_like(s, torch.finfo(torch.bfloat16).eps), s)
    q = torch.round((x / s.float().unsqueeze(2)).clamp(-8.0, 7.0)).to(torch.int64) + 8
    q = q.view(n, ng * g)[:, :k]
    words = (k + 7) // 8
    q = torch.nn.functional.pad(q, (0, words * 8 - k)).view(n, words, 8)
    shifts = torch.arange(0, 32, 4, device=w.device, dtype=torch.int64)
    packed = (q << shifts).sum(dim=2)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.t().contiguous(), s.t().contiguous()


def quant_int4(spec, dev, repeat):
    """(tools/bench_gpu_int4.c) int4_quant on every shape, timed, and its
    bytes against refit's on layer 0."""
    out = {"torch": torch.__version__}
    group = spec["int4_group"]
    ws = [torch.randn(s, device=dev).to(torch.bfloat16) for s in spec["int4_shapes"]]

    def run():
        for w in ws:
            int4_quant(w, group)
    res = {"ms": timed(run, repeat), "weights": len(ws)}
    try:
        with open(os.path.join(spec["dir"], "int4-layer0-x.bin"), "rb") as f:
            xb = f.read()
        with open(os.path.join(spec["dir"], "int4-layer0-q.bin"), "rb") as f:
            qb = f.read()
        mine, at = [], 0
        for n, k in spec["int4_shapes"][:spec["int4_layer0"]]:
            x = torch.frombuffer(bytearray(xb[at:at + 2 * n * k]), dtype=torch.bfloat16)
            at += 2 * n * k
            qw, sc = int4_quant(x.view(n, k).to(dev), group)
            mine.append(qw.cpu().numpy().tobytes() + sc.view(torch.int16).cpu().numpy().tobytes())
        res["bytes_equal"] = b"".join(mine) == qb
    except OSError as e:
        res["bytes_equal"] = "no layer-0 files: " + str(e)
    out["int4"] = res
    return out


def main():
    spec = json.load(open(sys.argv[1]))
    repeat = int(spec.get("repeat", 5))
    dev = torch.device("cuda")
    if "int4_shapes" in spec:
        json.dump(quant_int4(spec, dev, repeat), sys.stdout)
        sys.stdout.write("\n")
        return
    if "nvfp4_shapes" in spec:
        json.dump(quant_nvfp4(spec, dev, repeat), sys.stdout)
        sys.stdout.write("\n")
        return
    if "mx_shapes" in spec:
        json.dump(quant_mx(spec, dev, repeat), sys.stdout)
        sys.stdout.write("\n")
        return
    res = {"torch": torch.__version__}
    params = {n: torch.empty(s, dtype=torch.bfloat16, device=dev) for n, s in spec["tensors"]}
    srcs = {n: torch.randn(s, device=dev).to(torch.bfloat16) for n, s in spec["tensors"]}

    def d2d():
        for n, p in params.items():
            p.copy_(srcs[n])
    res["d2d"] = {"copy_loop_ms": timed(d2d, repeat)}
    del srcs

    files = sorted(glob.glob(os.path.join(spec["dir"], "*.safetensors")))
    if files:
        from safetensors.torch import load_file

        def st():
            for f in files:
                for n, t in load_file(f).items():
                    params[n].copy_(t)
        res["safetensors"] = {"load_file_copy_ms": timed(st, repeat), "files": len(files)}
    del params

    if spec.get("quant") and hasattr(torch, "float8_e4m3fn"):
        res["quant"] = quant(spec, dev, repeat)

    moe = spec["moe"]
    stacks = [torch.empty(moe["per"], moe["rows"], moe["cols"], dtype=torch.bfloat16, device=dev)
              for _ in range(moe["modules"])]
    arena = torch.randn(moe["modules"] * moe["per"], moe["rows"], moe["cols"],
                        device=dev).to(torch.bfloat16)
    pairs = [(s[e], arena[g * moe["per"] + e]) for g, s in enumerate(stacks)
             for e in range(moe["per"])]

    def moe_loop():
        for d, s in pairs:
            d.copy_(s)
    res["moe100k"] = {"copy_loop_ms": timed(moe_loop, max(1, min(repeat, 3))),
                      "tensors": len(pairs)}
    json.dump(res, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
