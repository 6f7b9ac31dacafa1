#!/usr/bin/env python3
"""Where a page-cached safetensors load's time goes, run after run, with
the ceilings measured between the runs (not once before them).

  python3 bench/probes/st_timeline.py OUT.json [--runs N] [--procs P]
                                      [--variants VAR=V[,VAR=V] ...] [--file PATH]

Each of P fresh processes writes the Llama-shaped file of
bench/python_path.py, then N times in a row: one pinned H2D copy of the
bytes (the ceiling, now), refit's txn.load_safetensors (rollback off), the
pinned copy again, and a CPU-only copy of the mapped file into pinned
memory by PyTorch's own threads (the host side alone, now). With
--variants, the P processes run once per variant, round-robin, each with
that variant's environment added ("-": none), and a summary per variant;
with --file, the first process writes the file there and the others load
the same one (the sources are seeded, so every process has its bytes).
Per refit run
it keeps the CUDA backend's counters (fill waits, drain waits, and, with
REFIT_CUDA_TIME_DMA=1, the copy engine's own time for the ring's copies)
and the machine's: steal and idle time from /proc/stat, page faults,
reclaim and compaction from /proc/vmstat. So a slow run says whether the
copy engine was slow (drain waits, DMA rate), the host copies were
(fill waits), or the machine was (steal, reclaim), and whether the
pinned ceiling moved with it.
"""
import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)

VMSTAT = ("pgfault", "pgmajfault", "pgscan_kswapd", "pgscan_direct", "pgsteal_kswapd",
          "pgsteal_direct", "compact_stall", "compact_migrate_scanned", "thp_fault_alloc",
          "thp_collapse_alloc", "workingset_refault_file", "pgactivate", "pgdeactivate",
          "nr_free_pages")


def proc_stat():
    """Summed jiffies over CPUs: user, system, idle, iowait, steal."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return {"user": v[0] + v[1], "system": v[2] + v[5] + v[6], "idle": v[3],
            "iowait": v[4], "steal": v[7] if len(v) > 7 else 0}


def vmstat():
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k in VMSTAT:
                out[k] = int(v)
    return out


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            if k in ("MemTotal", "MemFree", "Cached", "AnonPages", "Mlocked", "AnonHugePages",
                     "FileHugePages", "FilePmdMapped"):
                out[k] = int(v.split()[0])
    return out


def delta(a, b):
    return {k: b[k] - a[k] for k in a if k in b}


def child(a):
    sys.path.insert(0, BENCH)
    import python_path as pp          # noqa: E402  (sets REFIT_PLUGIN_PATH, imports refit)
    import torch
    from refit._sys import cuda_stats as stats

    torch.manual_seed(0)    # the same sources in every process: a --file is theirs
    d = pp.Dense()
    if a.file:
        path = a.file
    else:
        fd, path = tempfile.mkstemp(suffix=".safetensors", dir=a.dir)
        os.close(fd)
    out = {"pid": os.getpid(), "mem_start": meminfo(), "runs": [],
           "env": {k: v for k, v in os.environ.items() if k.startswith("REFIT_CUDA")}}
    try:
        if not (a.file and os.path.exists(path)):
            pp.write_safetensors(path, d)
        with open(path, "rb") as f:
            while f.read(1 << 26):
                pass
        pinned = torch.empty(d.bytes, dtype=torch.uint8, pin_memory=True)
        host_dst = torch.empty(d.bytes, dtype=torch.uint8, pin_memory=True)
        size = os.path.getsize(path)
        fmap = open(path, "rb")
        mm = mmap.mmap(fmap.fileno(), size, prot=mmap.PROT_READ)
        src = torch.frombuffer(mm, dtype=torch.uint8)[:d.bytes] if size >= d.bytes else None

        def h2d_ms():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            d.rt_flat.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3

        def host_ms():
            t0 = time.perf_counter()
            host_dst.copy_(src)
            return (time.perf_counter() - t0) * 1e3

        ctx = pp.context()
        m = d.model(ctx)
        run = pp.update(m, lambda txn: txn.load_safetensors(path))
        h2d_ms()
        run()
        torch.cuda.synchronize()
        out["verified"] = bool(d.verify())
        for i in range(a.runs):
            before = h2d_ms()
            s0, p0, v0 = stats(), proc_stat(), vmstat()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            s1, p1, v1 = stats(), proc_stat(), vmstat()
            out["verified"] = out["verified"] and bool(d.verify())  # before the next copy
            after = h2d_ms()
            host = host_ms() if src is not None else None
            ds = delta(s0, s1)
            r = {"i": i, "ms": ms, "h2d_before_ms": before, "h2d_after_ms": after,
                 "ratio_to_adjacent_ceiling": min(before, after) / ms,
                 "host_copy_torch_ms": host,
                 "host_copy_ms": ds["host_copy_ns"] / 1e6,
                 "prefault_ms": ds["prefault_ns"] / 1e6,
                 "ring_wait_ms": ds["ring_wait_ns"] / 1e6,
                 "ring_fill_wait_ms": ds["ring_fill_wait_ns"] / 1e6,
                 "ring_drain_ms": ds["ring_drain_ns"] / 1e6,
                 "ring_waits": ds["ring_waits"], "memcpy_calls": ds["memcpy_calls"],
                 "dma_ms": ds["ring_dma_ns"] / 1e6,
                 "dma_GBps": (ds["ring_dma_bytes"] / ds["ring_dma_ns"])
                 if ds["ring_dma_ns"] else None,
                 "cpu": delta(p0, p1), "vm": delta(v0, v1)}
            out["runs"].append(r)
        if a.trace:
            from torch.profiler import ProfilerActivity, profile, record_function
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for k in range(2):
                    torch.cuda.synchronize()
                    with record_function("update_st"):
                        run()
                        torch.cuda.synchronize()
            prof.export_chrome_trace(a.trace)
        out["mem_end"] = meminfo()
        m.destroy()
        ctx.close()
        del src
        mm.close()
        fmap.close()
    finally:
        if not a.file:
            os.unlink(path)
    json.dump(out, sys.stdout)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--variants", nargs="*", default=["-"],
                    help="environments to add, VAR=V[,VAR=V] each, '-' for none")
    ap.add_argument("--file", help="the safetensors file every process loads (written by "
                    "the first; removed at the end)")
    ap.add_argument("--trace", help="the first process also writes a torch.profiler chrome "
                    "trace of two loads here")
    a = ap.parse_args()
    if a.child:
        return child(a)
    env = dict(os.environ)
    env.setdefault("REFIT_CUDA_TIME_DMA", "1")
    procs = []
    variants = [{} if v == "-" else dict(kv.split("=", 1) for kv in v.split(","))
                for v in a.variants]
    for p in range(a.procs):
        for vi, var in enumerate(variants):
            extra = ["--trace", a.trace] if a.trace and p == 0 and vi == 0 else []
            extra += ["--file", a.file] if a.file else []
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                "--runs", str(a.runs), "--dir", a.dir] + extra,
                               env=dict(env, **var), capture_output=True, text=True,
                               timeout=300)
            try:
                row = json.loads(r.stdout)
            except ValueError:
                row = {"rc": r.returncode, "stderr": r.stderr[-2000:]}
            row["variant"] = a.variants[vi]
            procs.append(row)
            for x in row.get("runs", []):
                print("%s proc %d run %2d: %6.1f ms (h2d %5.1f/%5.1f) fill %6.1f drain %6.1f "
                      "dma %6.1f ms %5.1f GB/s host %6.1f torch-host %6.1f steal %d idle %d"
                      % (a.variants[vi], p, x["i"], x["ms"], x["h2d_before_ms"],
                         x["h2d_after_ms"], x["ring_fill_wait_ms"], x["ring_drain_ms"],
                         x["dma_ms"], x["dma_GBps"] or 0, x["host_copy_ms"],
                         x["host_copy_torch_ms"] or 0, x["cpu"]["steal"], x["cpu"]["idle"]),
                      flush=True)
            if "stderr" in row:
                print(row["stderr"])
    if a.file and os.path.exists(a.file):
        os.unlink(a.file)
    by_variant = {}
    for v in a.variants:
        rs = [x for p in procs if p["variant"] == v for x in p.get("runs", [])]
        if rs:
            by_variant[v] = {"n": len(rs), "ms_median": statistics.median(x["ms"] for x in rs),
                             "ms_min": min(x["ms"] for x in rs),
                             "ratio_median": statistics.median(
                                 x["ratio_to_adjacent_ceiling"] for x in rs),
                             "verified": all(p.get("verified") for p in procs
                                             if p["variant"] == v)}
    runs = [x for p in procs for x in p.get("runs", [])]
    summ = {"by_variant": by_variant} if len(a.variants) > 1 else {}
    if runs:
        fast = [x for x in runs if x["ratio_to_adjacent_ceiling"] >= 0.7]
        slow = [x for x in runs if x["ratio_to_adjacent_ceiling"] < 0.7]
        for name, rs in (("fast", fast), ("slow", slow)):
            if rs:
                summ[name] = {k: statistics.median([x[k] for x in rs if x[k] is not None] or [0])
                              for k in ("ms", "h2d_before_ms", "ring_fill_wait_ms",
                                        "ring_drain_ms", "dma_ms", "dma_GBps",
                                        "host_copy_ms", "host_copy_torch_ms")}
                summ[name]["n"] = len(rs)
    out = {"probe": "st_timeline", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "env": {k: v for k, v in env.items() if k.startswith("REFIT_CUDA")},
           "summary": summ, "procs": procs}
    print(json.dumps(summ, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
