#!/usr/bin/env python3
"""Where a Python d2d update's time goes: the GPU's copy against the
calls around it, run after run, with the ceiling copy interleaved.

  python3 bench/probes/d2d_split.py OUT.json [--runs N]

The model and sources are bench/python_path.py's Dense (Llama-3.2-1B
shapes, ~3.0 GB). Each run times, on the host clock: begin(), load_set(),
load_dict() and load_dict's C call on a table built before
(refit_load_many), finalize(), and the Python table build alone; and on
the GPU's clock (events on the current stream, which refit copies on):
from before begin() to the end of load_set(), which holds refit's copy
launches. Between runs, one copy of the flat buffer (the ceiling) and a
torch copy_ loop. So the
update's wall time splits into the copy's GPU time, the host time before
the first launch, and finalize's time after the copy is done.
"""
import argparse
import json
import os
import statistics
import sys
import time

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--trace", help="also write a torch.profiler chrome trace of 3 updates "
                    "of each kind here (kernels and copies on the GPU's timeline)")
    a = ap.parse_args()
    sys.path.insert(0, BENCH)
    import python_path as pp     # noqa: E402
    import torch

    d = pp.Dense()
    ctx = pp.context()
    m = d.model(ctx)
    ss = m.source_set(d.srcs)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    from refit import _batch
    prebuilt = _batch.Table(*_batch.split(d.srcs))

    def table_ms():
        t0 = time.perf_counter()
        for _ in range(20):
            _batch.Table(*_batch.split(d.srcs))
        return (time.perf_counter() - t0) * 1e3 / 20

    def ceiling():
        ev[0].record()
        d.rt_flat.copy_(d.src_flat)
        ev[1].record()
        torch.cuda.synchronize()
        return ev[0].elapsed_time(ev[1])

    def loop():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            for p, s in zip(d.rt, d.src):
                p.copy_(s)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def one(kind):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ev[0].record()
        txn = m.begin(version="bench", rollback=False)
        t1 = time.perf_counter()
        if kind == "set":
            txn.load_set(ss)
        elif kind == "table":   # load_dict's C call on a table built before
            rc = _batch.lib().refit_load_many(txn.handle, prebuilt.n, prebuilt.names_ptr,
                                              prebuilt.srcs_ptr, txn._stream(None, None))
            m._check(rc, "load_many")
        else:
            txn.load_dict(d.srcs)
        t2 = time.perf_counter()
        ev[1].record()
        txn.finalize()
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        return {"wall_ms": (t4 - t0) * 1e3, "begin_ms": (t1 - t0) * 1e3,
                "load_ms": (t2 - t1) * 1e3, "finalize_ms": (t3 - t2) * 1e3,
                "gpu_ms": ev[0].elapsed_time(ev[1])}

    for _ in range(3):
        one("set")
        one("dict")
        one("table")
        ceiling()
    rows = []
    for i in range(a.runs):
        c = ceiling()
        s = one("set")
        f = one("dict")
        tb = one("table")
        lp = loop()
        c2 = ceiling()
        rows.append({"ceiling_ms": c, "ceiling_after_ms": c2, "set": s, "dict": f,
                     "table": tb, "torch_loop_ms": lp, "table_build_ms": table_ms()})
        print("run %2d: ceiling %.3f/%.3f  set wall %.3f gpu %.3f (begin %.3f load %.3f fin %.3f)"
              "  dict wall %.3f gpu %.3f load %.3f  prebuilt-table load %.3f  table %.3f"
              "  torch %.3f"
              % (i, c, c2, s["wall_ms"], s["gpu_ms"], s["begin_ms"], s["load_ms"],
                 s["finalize_ms"], f["wall_ms"], f["gpu_ms"], f["load_ms"], tb["load_ms"],
                 rows[-1]["table_build_ms"], lp), flush=True)
    if a.trace:
        from torch.profiler import ProfilerActivity, profile, record_function
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for kind in ("set", "set", "set", "dict", "dict", "dict", "ceiling", "loop"):
                torch.cuda.synchronize()
                with record_function("update_" + kind):
                    if kind == "ceiling":
                        ceiling()
                    elif kind == "loop":
                        loop()
                    else:
                        one(kind)
                    torch.cuda.synchronize()
        prof.export_chrome_trace(a.trace)
    ok = d.verify()

    def med(f):
        return statistics.median(f(r) for r in rows)
    summ = {"ceiling_ms": med(lambda r: r["ceiling_ms"]),
            "torch_loop_ms": med(lambda r: r["torch_loop_ms"]),
            "table_build_ms": med(lambda r: r["table_build_ms"]), "verified": ok}
    for k in ("set", "dict", "table"):
        summ[k] = {f: med(lambda r: r[k][f]) for f in rows[0][k]}
        summ[k]["ratio_wall"] = summ["ceiling_ms"] / summ[k]["wall_ms"]
        summ[k]["ratio_gpu"] = summ["ceiling_ms"] / summ[k]["gpu_ms"]
    print(json.dumps(summ, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"probe": "d2d_split", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime()),
                       "summary": summ, "rows": rows}, f, indent=1)
    m.destroy()
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
