#!/usr/bin/env python3
"""Why bench/python_path.py's safetensors case is bimodal from one process
to the next (0.85-0.88 or 0.36-0.45 of the pinned H2D ceiling, the same
build): the machine's topology, then the case under placement variants,
each in its own process, round after round (shuffled) until the time
budget is spent.

  python3 bench/probes/st_placement.py OUT.json [--budget S] [--rounds N]
          [--repeat N] [--st-dir DIR] [--with-bench] [--no-micro]

Variants: default; numa_off (REFIT_CUDA_NUMA=0; only where the default
pins, else it runs what default runs); numa_force (REFIT_CUDA_NUMA=2:
pinned and the ring registered even when that narrows nothing);
taskset_<g>, the whole process on CPU group g (each NUMA node's CPUs, or
each half of the CPU list when there is one node) with |g|-1 copy
threads; workers_<g>, only the copy threads on g (REFIT_CUDA_CPUS);
threads_8 and threads_15 (REFIT_CUDA_COPY_THREADS); fresh_file, a file
written by the process that loads it, as python_path.py does (its page
cache lands where that process ran; the other variants share one file
written once). --with-bench adds python_path.py itself (`--only
safetensors --repeat N`: its median only).

A child times the case as python_path.py does (its Dense model, file
layout, context and update; rollback off) and keeps every run: ms, ratio
to that process's pinned H2D copy, the backend's counters (host copy,
prefault, ring-wait time), the backend's placement line, each copy
thread's allowed and last CPU; with more than one node the nodes of the
file's page cache and of the large mappings (/proc/self/numa_maps); and,
unless --no-micro, one-thread memcpy and H2D rates of sixteen 16 MiB
pinned buffers and the memcpy rate from each CPU (two clusters there mean
two memory or CPU nodes, even where the guest sees one). OUT gets the
topology and every row; printed: one line per run, then a line per
variant (median, min, max of the ratio), the counters of fast and slow
processes, and the micro figures. A failing variant records its error and
the probe goes on. A probe, not a benchmark.
"""
import argparse
import ctypes
import glob
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..")
ROOT = os.path.abspath(os.path.join(BENCH, ".."))


# ---- the machine ----

def sh(cmd, timeout=20):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return {"rc": p.returncode, "out": p.stdout[-20000:], "err": p.stderr[-2000:]}
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": "%s: %s" % (" ".join(cmd), e)}


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return "unreadable: %s" % e.strerror


def cpulist(s):
    """A Linux cpulist ("0-3,8-11") as a sorted list; [] when malformed."""
    out = []
    try:
        for part in s.strip().split(","):
            if part:
                lo, _, hi = part.partition("-")
                out += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        return []
    return sorted(set(out))


def as_cpulist(cpus):
    runs, cpus = [], sorted(cpus)
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join("%d-%d" % (a, b) if a != b else str(a) for a, b in runs)


def gpu_bus_ids():
    q = sh(["nvidia-smi", "--query-gpu=index,pci.bus_id,name", "--format=csv,noheader"])
    ids = []
    for line in q.get("out", "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            dom, _, rest = parts[1].partition(":")
            ids.append({"index": parts[0], "nvidia_smi": parts[1],
                        "sysfs": (dom[-4:] + ":" + rest).lower(), "name": ",".join(parts[2:])})
    return ids


def topology():
    nodes = {}
    for d in sorted(glob.glob("/sys/devices/system/node/node[0-9]*")):
        n = os.path.basename(d)
        mem = read(d + "/meminfo")
        free = re.search(r"MemFree:\s+(\d+) kB", mem)
        nodes[n] = {"cpulist": read(d + "/cpulist"), "distance": read(d + "/distance"),
                    "mem_free_kb": int(free.group(1)) if free else None}
    gpus = gpu_bus_ids()
    for g in gpus:
        dev = "/sys/bus/pci/devices/" + g["sysfs"]
        g.update({"numa_node": read(dev + "/numa_node"), "local_cpulist": read(dev + "/local_cpulist"),
                  "max_link_speed": read(dev + "/max_link_speed"),
                  "current_link_speed": read(dev + "/current_link_speed"),
                  "current_link_width": read(dev + "/current_link_width")})
    siblings = sorted({read(p) for p in
                       glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list")})
    status = read("/proc/self/status")
    return {
        "nodes": nodes, "gpus": gpus, "thread_siblings": siblings,
        "affinity": as_cpulist(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
        "cpus_allowed_list": " ".join(re.findall(r"Cpus_allowed_list:\s*(\S+)", status)),
        "mems_allowed_list": " ".join(re.findall(r"Mems_allowed_list:\s*(\S+)", status)),
        "thp": read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "numa_balancing": read("/proc/sys/kernel/numa_balancing"),
        "kernel": read("/proc/sys/kernel/osrelease"),
        "nvidia_smi_topo": sh(["nvidia-smi", "topo", "-m"]),
        "lscpu": sh(["lscpu"]),
        "numactl_H": sh(["numactl", "-H"]),
    }


def cpu_groups(topo):
    """Each NUMA node's allowed CPUs, or the halves of the allowed list."""
    allowed = set(os.sched_getaffinity(0))
    groups = []
    for name, n in topo["nodes"].items():
        cpus = sorted(allowed & set(cpulist(n["cpulist"])))
        if cpus:
            groups.append((name, cpus))
    if len(groups) < 2:
        a = sorted(allowed)
        h = len(a) // 2
        groups = [("half0", a[:h]), ("half1", a[h:])] if h else []
    return groups


def auto_pins(topo):
    """Whether the backend's default placement pins anything here: the
    first GPU's local CPUs a strict subset of the allowed ones."""
    allowed = set(os.sched_getaffinity(0))
    local = set(cpulist(topo["gpus"][0]["local_cpulist"])) if topo["gpus"] else set()
    return bool(local & allowed) and not allowed <= local


def variants(topo, with_bench):
    v = [("fresh_file", {}, None), ("default", {}, None)]
    if auto_pins(topo):     # else numa_off runs what default runs
        v.append(("numa_off", {"REFIT_CUDA_NUMA": "0"}, None))
    v.append(("numa_force", {"REFIT_CUDA_NUMA": "2"}, None))
    for name, cpus in cpu_groups(topo):
        # as many copy threads as workers_<name> gets: contention is not the variable
        v.append(("taskset_" + name, {"REFIT_CUDA_COPY_THREADS": str(max(1, len(cpus) - 1))},
                  cpus))
        v.append(("workers_" + name, {"REFIT_CUDA_CPUS": as_cpulist(cpus)}, None))
    v += [("threads_8", {"REFIT_CUDA_COPY_THREADS": "8"}, None),
          ("threads_15", {"REFIT_CUDA_COPY_THREADS": "15"}, None)]
    if with_bench:
        v.append(("python_path", {}, None))
    return v


# ---- one process: the case, every run kept ----

def tasks():
    out = {}
    for t in glob.glob("/proc/self/task/*"):
        try:
            with open(t + "/stat") as f:
                stat = f.read()
            with open(t + "/status") as f:
                allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", f.read()).group(1)
        except (OSError, AttributeError):
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(os.path.basename(t))] = {"last_cpu": int(fields[36]), "allowed": allowed}
    return out


def numa_maps(path):
    """The nodes of the file's mapped pages and of every mapping with 8 MiB
    or more present (pinned chunks, tensors, libraries)."""
    rows = []
    try:
        with open("/proc/self/numa_maps") as f:
            lines = f.read().splitlines()
    except OSError as e:
        return [{"error": str(e)}]
    for line in lines:
        nodes = {k: int(v) for k, v in re.findall(r"\b(N\d+)=(\d+)", line)}
        if path in line or sum(nodes.values()) * 4096 >= 8 << 20:
            kind = re.search(r"file=(\S+)", line)
            rows.append({"policy": line.split()[1], "file": kind.group(1) if kind else "anon",
                         "pages": nodes, "huge": "huge" in line})
    return rows


def page_cache_nodes(path):
    import mmap
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    try:
        m.madvise(22)   # MADV_POPULATE_READ: map the cached pages, read nothing
    except (OSError, AttributeError, ValueError):
        for off in range(0, len(m), 1 << 12):
            m[off]
    rows = [r for r in numa_maps(path) if r.get("file") == path]
    m.close()
    return rows


def micro(torch, path, dev_dst, n_buf=16, mb=16, reps=3):
    """Within one process: 16 MiB pinned buffers, each timed for a
    one-thread memcpy from the file's page cache and for an H2D copy; then
    the same memcpy from each allowed CPU. Two clusters among the buffers
    or the CPUs say the memory or the vCPUs sit on two (host) nodes, even
    where the guest sees one."""
    import mmap
    size = mb << 20
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # reads the page cache
    keep = ctypes.c_char.from_buffer(m)
    src = ctypes.addressof(keep)
    spans = max(1, len(m) // size - 1)
    bufs = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(n_buf)]
    dst = dev_dst[:size]

    def memcpy_gbps(buf, k):
        t = []
        for r in range(reps):
            off = ((k * reps + r) % spans) * size
            t0 = time.perf_counter()
            ctypes.memmove(buf.data_ptr(), src + off, size)
            t.append(time.perf_counter() - t0)
        return size / statistics.median(t) / 1e9

    def h2d_gbps(buf):
        t = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(buf, non_blocking=True)
            torch.cuda.synchronize()
            t.append(time.perf_counter() - t0)
        return size / statistics.median(t) / 1e9
    out = {"buffers": [{"memcpy_GBps": memcpy_gbps(b, i), "h2d_GBps": h2d_gbps(b)}
                       for i, b in enumerate(bufs)], "cpus": {}}
    mine = os.sched_getaffinity(0)
    try:
        for i, c in enumerate(sorted(mine)):
            os.sched_setaffinity(0, {c})
            out["cpus"][str(c)] = memcpy_gbps(bufs[0], i)
    finally:
        os.sched_setaffinity(0, mine)
    del keep
    m.close()
    return out


def child(a):
    sys.path.insert(0, BENCH)
    import torch
    import python_path as pp
    from refit._sys import cuda_stats

    t_start = time.time()
    d = pp.Dense()
    path = a.file
    if a.write:
        pp.write_safetensors(path, d)
        with open(path, "rb") as f:     # as python_path.py: into the page cache
            while f.read(1 << 26):
                pass
    pinned = torch.empty(d.bytes, dtype=torch.uint8, pin_memory=True)
    h2d = []
    for i in range(a.repeat + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        d.rt_flat.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize()
        if i:
            h2d.append((time.perf_counter() - t0) * 1e3)
    del pinned
    ceiling = statistics.median(h2d)
    ctx = pp.context()
    m = d.model(ctx)
    run = pp.update(m, lambda txn: txn.load_safetensors(path))
    before = set(tasks())
    run()                               # warm-up: starts the copy threads, maps the ring
    torch.cuda.synchronize()
    verified = bool(d.verify()) if a.write else None  # a shared file holds another process's tensors
    runs = []
    for _ in range(a.repeat):
        torch.cuda.synchronize()
        s0 = cuda_stats()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        s1 = cuda_stats()
        delta = {f: s1[f] - s0[f] for f in s0}
        runs.append({"ms": ms, "ratio": ceiling / ms,
                     "host_copy_ms": delta["host_copy_ns"] / 1e6,
                     "prefault_ms": delta["prefault_ns"] / 1e6,
                     "ring_wait_ms": delta["ring_wait_ns"] / 1e6,
                     "ring_waits": delta["ring_waits"], "memcpy_calls": delta["memcpy_calls"],
                     "pageable_bytes": delta["pageable_bytes"]})
    verified = verified and bool(d.verify()) if a.write else None
    now = tasks()
    out = {"ceiling_ms": ceiling, "h2d_ms": h2d, "runs": runs, "verified": verified,
           "main_thread": now.get(os.getpid()),
           "copy_threads": [now[t] for t in sorted(set(now) - before)],
           "affinity": as_cpulist(os.sched_getaffinity(0))}
    try:
        pr = torch.cuda.get_device_properties(0)
        out["torch_pci"] = "%04x:%02x:%02x.0" % (pr.pci_domain_id, pr.pci_bus_id, pr.pci_device_id)
    except (AttributeError, RuntimeError):
        pass
    if a.numa_maps:
        out["page_cache"] = page_cache_nodes(path)
        out["large_maps"] = [r for r in numa_maps(path)      # anonymous and driver memory
                             if r.get("file") == "anon" or r.get("file", "").startswith("/dev/")]
    m.destroy()
    ctx.close()
    if not a.no_micro:
        try:
            out["micro"] = micro(torch, path, d.rt_flat)
        except Exception as e:      # a diagnostic: its failure must not lose the runs
            out["micro_error"] = "%s: %s" % (type(e).__name__, e)
    out["child_s"] = time.time() - t_start
    with open(a.result, "w") as f:
        json.dump(out, f)


# ---- the parent ----

def run_variant(name, env, cpus, shared, a, multi_node, timeout):
    fd, res = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    row = {"variant": name, "env": env, "taskset": as_cpulist(cpus) if cpus else None}
    fresh = None                        # a file this child writes
    if name == "python_path":
        cmd = [sys.executable, os.path.join(BENCH, "python_path.py"), res, "--only",
               "safetensors", "--repeat", str(a.repeat), "--st-dir", a.st_dir]
    else:
        if not os.path.exists(shared):  # the first child writes the shared file
            fresh = shared
        elif name == "fresh_file":
            fd, fresh = tempfile.mkstemp(suffix=".safetensors", dir=a.st_dir)
            os.close(fd)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--result", res,
               "--file", fresh or shared, "--repeat", str(a.repeat)]
        cmd += ["--write"] if fresh else []
        cmd += ["--numa-maps"] if multi_node else []
        cmd += ["--no-micro"] if a.no_micro else []
    t0, p = time.time(), None
    try:
        p = subprocess.run(cmd, env=dict(os.environ, REFIT_CUDA_NUMA_LOG="1", **env),
                           capture_output=True, text=True,
                           timeout=timeout,
                           preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        row["rc"] = p.returncode
        with open(res) as f:
            got = json.load(f)
        if name == "python_path":
            c = got["python"]["safetensors"]
            row.update({"ratio": c["ratio_to_h2d_ceiling"], "ms": c["refit_ms"],
                        "ceiling_ms": c["ceiling_ms"], "verified": c.get("verified")})
        else:
            row.update(got)
            row["ms"] = statistics.median(r["ms"] for r in got["runs"])
            row["ratio"] = got["ceiling_ms"] / row["ms"]
        if p.stderr.strip():
            row["stderr"] = p.stderr[-1500:]
        placed = re.findall(r"refit: CUDA device .*", p.stderr)
        row["placement"] = placed[0] if placed else None
    except subprocess.TimeoutExpired:
        row["error"] = "timed out after %.0f s" % timeout
    except (OSError, ValueError, KeyError, TypeError, statistics.StatisticsError) as e:
        row["error"] = "%s: %s; stderr: %s" % (type(e).__name__, e,
                                                 (p.stderr if p else "")[-1500:])
    finally:
        os.unlink(res)
        if fresh and fresh != shared and os.path.exists(fresh):
            os.unlink(fresh)
    row["wall_s"] = time.time() - t0
    return row


def summary(rows, names):
    lines = []
    for name in names:
        rs = [r for r in rows if r["variant"] == name]
        ok = [r["ratio"] for r in rs if "ratio" in r]
        if not ok:
            lines.append("%-22s %s" % (name, "no result (%d errors)" % len(rs) if rs else
                                       "not run (no time left)"))
            continue
        per_run = [x["ratio"] for r in rs for x in r.get("runs", [])]
        lines.append("%-22s n=%d median %.3f min %.3f max %.3f  fast(>=0.7) %d/%d  "
                     "runs %.3f-%.3f%s" % (
                         name, len(ok), statistics.median(ok), min(ok), max(ok),
                         sum(x >= 0.7 for x in ok), len(ok),
                         min(per_run or ok), max(per_run or ok),
                         "  errors %d" % (len(rs) - len(ok)) if len(rs) > len(ok) else ""))
    runs = [(r["ratio"] >= 0.7, x) for r in rows if "ratio" in r for x in r.get("runs", [])]
    for fast in (True, False):
        xs = [x for f, x in runs if f == fast]
        if xs:
            lines.append("%s processes' runs (%d): median ms %.1f, host copy %.1f ms, prefault "
                         "%.1f ms, ring wait %.1f ms (%.0f waits)" % (
                             "fast" if fast else "slow", len(xs),
                             *(statistics.median(x[k] for x in xs) for k in (
                                 "ms", "host_copy_ms", "prefault_ms", "ring_wait_ms",
                                 "ring_waits"))))
    mic = [r["micro"] for r in rows if "micro" in r]
    if mic:
        mc = [b["memcpy_GBps"] for m in mic for b in m["buffers"]]
        hd = [b["h2d_GBps"] for m in mic for b in m["buffers"]]
        cpus = {}
        for m in mic:
            for c, v in m["cpus"].items():
                cpus.setdefault(int(c), []).append(v)
        lines.append("micro (%d processes): 16 MiB pinned buffers, 1-thread memcpy from the page "
                     "cache %.1f/%.1f/%.1f GB/s, H2D %.1f/%.1f/%.1f (min/median/max)" % (
                         len(mic), min(mc), statistics.median(mc), max(mc),
                         min(hd), statistics.median(hd), max(hd)))
        lines.append("micro per CPU, median GB/s: " + " ".join(
            "%d:%.1f" % (c, statistics.median(v)) for c, v in sorted(cpus.items())))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--budget", type=float, default=140, help="seconds for the whole probe")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--st-dir", default=tempfile.gettempdir())
    ap.add_argument("--with-bench", action="store_true")
    ap.add_argument("--rounds", type=int, default=6, help="at most this many rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--numa-maps", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-micro", action="store_true",
                    help="skip the per-buffer and per-CPU copy timings in each process")
    a = ap.parse_args()
    if a.child:
        return child(a)
    if not a.out:
        ap.error("OUT.json is required")
    t_start = time.time()
    deadline = t_start + a.budget
    topo = topology()
    multi_node = len(topo["nodes"]) > 1
    vs = variants(topo, a.with_bench)
    print("topology: %d node(s) %s; affinity %s; gpus %s" % (
        len(topo["nodes"]), {k: n["cpulist"] for k, n in topo["nodes"].items()},
        topo["affinity"], [(g["sysfs"], g["numa_node"], g["local_cpulist"]) for g in topo["gpus"]]),
        flush=True)
    fd, shared = tempfile.mkstemp(suffix=".safetensors", dir=a.st_dir)
    os.close(fd)
    os.unlink(shared)                   # the first child writes it and keeps it
    rng = random.Random(a.seed)
    rows, cost, rnd, failed = [], {}, 0, {}
    try:
        while rnd < a.rounds:
            order = vs[:1] + rng.sample(vs[1:], len(vs) - 1) if rnd == 0 else rng.sample(vs, len(vs))
            ran = 0
            for name, env, cpus in order:
                left = deadline - time.time()
                guess = cost.get(name, 35.0 if name == "python_path" else
                                 max(cost.values(), default=25.0))
                if left < guess * 1.1 or left < 5 or failed.get(name, 0) >= 2:
                    continue
                row = run_variant(name, env, cpus, shared, a, multi_node, min(left, 120))
                row["round"] = rnd
                rows.append(row)
                cost[name] = max(cost.get(name, 0), row["wall_s"])
                failed[name] = failed.get(name, 0) + ("ratio" not in row)
                ran += 1
                brief = {k: row.get(k) for k in ("round", "variant", "ratio", "ms", "ceiling_ms",
                                                 "verified", "placement") if row.get(k) is not None}
                if "error" in row:
                    brief["error"] = row["error"].strip().splitlines()[-1][-300:]
                print(json.dumps(brief), flush=True)
            rnd += 1
            if ran == 0:
                break
    finally:
        if os.path.exists(shared):
            os.unlink(shared)
    names = [n for n, _, _ in vs]
    lines = summary(rows, names)
    with open(a.out, "w") as f:
        json.dump({"probe": "st_placement", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime()),
                   "repeat": a.repeat, "budget_s": a.budget, "auto_pins": auto_pins(topo), "wall_s": time.time() - t_start,
                   "topology": topo, "summary": lines, "rows": rows}, f, indent=1)
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
