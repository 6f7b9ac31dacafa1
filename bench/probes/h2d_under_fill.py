#!/usr/bin/env python3
"""Pinned H2D bandwidth while host threads copy memory, as refit's file
ring does (fill threads copy page-cached bytes into pinned chunks while
the copy engine reads earlier chunks). Answers whether a file reload that
reaches less than the idle pinned-H2D ceiling is held back by host memory
traffic rather than by refit's own work (issue 28, the zoo's file rows).
  python3 bench/probes/h2d_under_fill.py OUT.json [--gib 4] [--threads 0,2,4,8]
Each point: N threads each copy a 256 MiB pageable buffer into a pinned one
in a loop (numpy copyto, which releases the GIL) while one pinned buffer of
--gib GiB goes to the device three times; reports the H2D GB/s (best of 3)
and the threads' copy GB/s over the same time. Needs torch with CUDA."""
import argparse
import json
import threading
import time

import numpy as np
import torch


def filler(stop, src, dst, done):
    n = 0
    while not stop.is_set():
        np.copyto(dst, src)
        n += src.nbytes
    done.append(n)


def h2d(pinned, dev, reps=3):
    best = None
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--threads", default="0,2,4,8")
    a = ap.parse_args()
    nbytes = int(a.gib * (1 << 30))
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d(pinned, dev, 1)
    chunk = 256 << 20
    points = []
    for k in [int(x) for x in a.threads.split(",")]:
        srcs = [np.ones(chunk, dtype=np.uint8) for _ in range(k)]
        dsts = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True).numpy() for _ in range(k)]
        stop, done = threading.Event(), []
        th = [threading.Thread(target=filler, args=(stop, srcs[i], dsts[i], done))
              for i in range(k)]
        t0 = time.perf_counter()
        for t in th:
            t.start()
        time.sleep(0.2 if k else 0)
        t1 = time.perf_counter()
        sec = h2d(pinned, dev)
        t2 = time.perf_counter()
        stop.set()
        for t in th:
            t.join()
        t3 = time.perf_counter()
        fill = sum(done) / (t3 - t0) / 1e9 if k else 0.0
        points.append({"fill_threads": k, "h2d_seconds": sec, "h2d_gbps": nbytes / sec / 1e9,
                       "fill_gbps": fill, "window_seconds": t2 - t1})
        print("threads %d: H2D %.1f GB/s, fill %.1f GB/s" % (k, nbytes / sec / 1e9, fill),
              flush=True)
    res = {"probe": "h2d_under_fill", "device": torch.cuda.get_device_name(0),
           "bytes": nbytes, "chunk_bytes": chunk, "points": points,
           "definitions": {"h2d_gbps": "one pinned buffer to the device, best of 3, "
                           "while fill_threads threads copy pageable -> pinned",
                           "fill_gbps": "bytes the fill threads copied per second over "
                           "their whole run"}}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
