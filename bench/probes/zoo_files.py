#!/usr/bin/env python3
"""Where a zoo file row's time goes: one row's shards written once, then
each variant of the CUDA backend's environment in a fresh process (the
backend reads it once), loading the files with rollback off, round after
round so drift shows; the pinned H2D ceiling measured between rounds.

  python3 bench/probes/zoo_files.py OUT.json [--row qwen3_30b_a3b_fp8]
        [--dir DIR] [--layers 20] [--runs 3] [--rounds 2]
        [--trace DIR] [VAR=V[,VAR=V] | -] ...

Per run it keeps the backend's counters (refit._sys.cuda_stats: memcpy
calls, batch launches, fill and drain waits ...). With --trace, the first
round of each variant also runs with REFIT_CUDA_RING_TRACE into DIR and
the summary of bench/probes/ring_trace.py lands beside the variant. A
probe, not a benchmark: it steers defaults; bench/zoo.py gives the row."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import _setup  # noqa: E402,F401  (the binding and plugins, as zoo.py finds them)
import zoo  # noqa: E402


def parse(v):
    return {} if v == "-" else dict(kv.split("=", 1) for kv in v.split(","))


def plan_of(row, layers):
    spec = zoo.ROWS[row]
    cfg = dict(zoo.CONFIGS[spec["model"]])
    return zoo.build_plan(cfg, spec["quant"], layers or cfg["layers"], "gptq")


def child(a):
    import refit
    from refit import _sys
    B = zoo.backend("torch")
    plan = plan_of(a.row, a.layers)
    eng = zoo.Engine(B, plan)
    ctx = refit.Context(worker_id="probe")
    m, reg, seal = zoo.register(ctx, plan, eng)
    out = {"register_seconds": reg, "seal_seconds": seal, "seconds_all": [], "stats": []}
    for i in range(a.runs + 1):
        s0 = _sys.cuda_stats()
        B.sync()
        t0 = time.perf_counter()
        txn = m.begin(version="p%d" % i, rollback=False)
        txn.load_safetensors(a.dir)
        txn.finalize()
        B.sync()
        dt = time.perf_counter() - t0
        s1 = _sys.cuda_stats()
        if i:   # the first is a warm-up (ring and pools allocated)
            out["seconds_all"].append(dt)
            out["stats"].append({k: s1[k] - s0[k] for k in s1 if isinstance(s1[k], int)})
    m.destroy()
    ctx.close()
    out["seconds"] = statistics.median(out["seconds_all"])
    print("RESULT " + json.dumps(out), flush=True)


def run_variant(a, env_add, trace_path=None):
    env = dict(os.environ)
    env.update(env_add)
    if trace_path:
        env["REFIT_CUDA_RING_TRACE"] = trace_path
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--row", a.row, "--dir",
           a.dir, "--layers", str(a.layers), "--runs", str(a.runs), "x"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (p.stderr or p.stdout)[-2000:], "rc": p.returncode}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("variants", nargs="*")
    ap.add_argument("--row", default="qwen3_30b_a3b_fp8")
    ap.add_argument("--dir", default="/tmp/zoo-probe")
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--trace", default="")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_intermixed_args()
    if a.child:
        return child(a)
    B = zoo.backend("torch")
    plan = plan_of(a.row, a.layers)
    os.makedirs(a.dir, exist_ok=True)
    t0 = time.perf_counter()
    if not os.path.exists(os.path.join(a.dir, "model.safetensors.index.json")):
        zoo.write_checkpoint(B, plan, a.dir, int(5e9), seed=1)
    zoo.read_files([os.path.join(a.dir, f) for f in sorted(os.listdir(a.dir))
                    if f.endswith(".safetensors")])
    out = {"row": a.row, "layers": a.layers, "bytes": plan.bytes, "tensors": len(plan.ckpt),
           "device": B.device_name(), "write_seconds": time.perf_counter() - t0,
           "ceilings": [], "variants": []}
    B.empty_cache()
    chunk = min(4 << 30, plan.bytes)
    variants = a.variants or ["-"]
    res = {v: [] for v in variants}
    for r in range(a.rounds):
        out["ceilings"].append(B.h2d_seconds(plan.bytes, chunk))
        B.empty_cache()
        for v in variants:
            tp = None
            if a.trace and r == 0:
                os.makedirs(a.trace, exist_ok=True)
                tp = os.path.join(a.trace, "trace-%d.txt" % variants.index(v))
            x = run_variant(a, parse(v), tp)
            x["round"] = r
            if tp and os.path.exists(tp):
                s = subprocess.run([sys.executable, os.path.join(HERE, "ring_trace.py"), tp,
                                    "--json", tp + ".json"], capture_output=True, text=True)
                x["trace_summary"] = s.stdout[-3000:]
            res[v].append(x)
            print(json.dumps({"variant": v, "round": r, "seconds": x.get("seconds"),
                              "error": x.get("error", "")[-300:]}), flush=True)
    ceiling = min(out["ceilings"])
    for v in variants:
        secs = [x["seconds"] for x in res[v] if "seconds" in x]
        best = min(secs) if secs else None
        out["variants"].append({
            "env": v, "runs": res[v], "best_seconds": best,
            "ratio_to_ceiling": ceiling / best if best else None,
            "host_us_per_tensor": (best - ceiling) / len(plan.ckpt) * 1e6 if best else None})
    out["ceiling_seconds"] = ceiling
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for x in out["variants"]:
        print("%-60s %s ratio %s us/t %s" % (x["env"], x["best_seconds"],
                                             x["ratio_to_ceiling"], x["host_us_per_tensor"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
