#!/usr/bin/env python3
"""Where the GPU sat idle in a torch.profiler chrome trace: for each
"update_*" annotation (bench/probes/st_timeline.py and d2d_split.py write
them), the wall time, the GPU's busy time (kernels and copies), when its
first work started, and the idle gaps between its operations, largest
first, each with what the host's CUDA calls were in it.

  python3 bench/probes/trace_gaps.py TRACE.json [--min-us 500]
"""
import argparse
import collections
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--min-us", type=float, default=500.0)
    a = ap.parse_args()
    with open(a.trace) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ann = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("update_")]
    gpu = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
    rt = sorted((e for e in ev if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    for u in ann:
        s, e = u["ts"], u["ts"] + u["dur"]
        g = [x for x in gpu if s <= x["ts"] <= e]
        if not g:
            print("%s: %.2f ms, no GPU work" % (u["name"], u["dur"] / 1e3))
            continue
        busy = sum(x["dur"] for x in g)
        gaps = []
        for i in range(len(g) - 1):
            w0, w1 = g[i]["ts"] + g[i]["dur"], g[i + 1]["ts"]
            if w1 - w0 >= a.min_us:
                calls = collections.Counter(x["name"] for x in rt
                                            if x["ts"] < w1 and x["ts"] + x["dur"] > w0)
                gaps.append((w1 - w0, (w0 - s) / 1e3, dict(calls)))
        print("%s: wall %.2f ms, GPU busy %.2f ms in %d ops, first at +%.2f ms, "
              "%d gaps >= %.0f us totalling %.2f ms"
              % (u["name"], u["dur"] / 1e3, busy / 1e3, len(g), (g[0]["ts"] - s) / 1e3,
                 len(gaps), a.min_us, sum(x[0] for x in gaps) / 1e3))
        for dur, at, calls in sorted(gaps, reverse=True)[:8]:
            print("   %.2f ms idle at +%.1f ms; host calls then: %s" % (dur / 1e3, at, calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
