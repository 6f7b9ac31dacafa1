#!/usr/bin/env python3
"""PyTorch peers of refit-bench gpu (tools/bench_gpu.c execs this with a
spec file): the same reloads written the way an engine does them today.
Prints one JSON object on stdout (timings in ms, medians of `repeat` runs
after a warm-up).

  d2d          param.copy_(src) for every tensor of the Llama-shaped model
  safetensors  safetensors.torch.load_file(file) then param.copy_(t), every file
  moe100k      stack[e].copy_(src) for 100,000 small tensors
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


def main():
    spec = json.load(open(sys.argv[1]))
    repeat = int(spec.get("repeat", 5))
    dev = torch.device("cuda")
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
