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


def int4_quant(w, group):
    """Online INT4 of a 2-D tensor in PyTorch ops, the arithmetic of
    kernels/quant_int4.h (compressed-tensors, symmetric, round to nearest),
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
