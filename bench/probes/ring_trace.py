#!/usr/bin/env python3
"""Read a REFIT_CUDA_RING_TRACE file: per load, where the ring's pageable
read stalled and who held it up.

  python3 bench/probes/ring_trace.py TRACE [--gap-ms 2] [--json OUT]

A load is the records up to a settle (the end of a load_safetensors).
For each: its time, the fills (a thread's copy of one slice into the
ring: median, slowest, the slowest ones with their thread and prefault
time), each thread's busy time, and every gap of --gap-ms or more between
two issues (the copy engine got nothing new), with what was going on in
it: the fills that were running, how many finished, and whether the
caller was waiting (fill wait, drain wait) or absent (no record at all:
descheduled, or in a slice of its own)."""
import argparse
import json
import statistics

KINDS = {0: "fill", 1: "issue", 2: "fill_wait", 3: "drain_wait", 4: "settle", 5: "gap",
         6: "copy"}


def read(path):
    recs = []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                continue
            k, who, t0, t1, a, b, c, cpu = (int(x) for x in line.split())
            recs.append({"kind": KINDS[k], "who": who, "t0": t0, "t1": t1, "a": a, "b": b, "c": c,
                         "cpu": cpu})
    recs.sort(key=lambda r: r["t0"])
    return recs


def loads(recs):
    """Split at the settles: a load ends with its settle record and starts
    with the first tensor it queues."""
    out, cur = [], []
    for r in recs:
        cur.append(r)
        if r["kind"] == "settle":
            out.append(cur)
            cur = []
    return out


def overlapping(rs, a, b):
    return [r for r in rs if r["t0"] < b and r["t1"] > a]


def one(load, gap_ms):
    t_start = min(r["t0"] for r in load if r["kind"] in ("copy", "fill"))
    load = [r for r in load if r["t1"] >= t_start]
    t_end = max(r["t1"] for r in load)
    ms = lambda ns: ns / 1e6            # noqa: E731
    rel = lambda t: round(ms(t - t_start), 3)  # noqa: E731
    fills = [r for r in load if r["kind"] == "fill"]
    issues = [r for r in load if r["kind"] == "issue"]
    waits = [r for r in load if r["kind"] in ("fill_wait", "drain_wait")]
    durs = [r["t1"] - r["t0"] for r in fills]
    bytes_ = sum(r["b"] for r in fills)
    threads = {}
    for r in fills:
        threads.setdefault(r["who"], 0)
        threads[r["who"]] += r["t1"] - r["t0"]
    slow = sorted(fills, key=lambda r: r["t0"] - r["t1"])[:8]
    gaps = []
    for x, y in zip(issues, issues[1:]):
        g = y["t0"] - x["t1"]
        if g < gap_ms * 1e6:
            continue
        a, b = x["t1"], y["t0"]
        running = overlapping(fills, a, b)
        done_in = [r for r in fills if a <= r["t1"] <= b]
        cw = overlapping(waits, a, b)
        caller_fills = [r for r in running if r["who"] < 0]
        gaps.append({
            "at_ms": rel(a), "ms": round(ms(g), 3),
            "fills_finished": len(done_in),
            "fills_running": [{"who": r["who"], "from_ms": rel(r["t0"]), "ms": round(ms(r["t1"] - r["t0"]), 3),
                               "prefault_ms": round(ms(r["c"]), 3)} for r in running
                              if r["t1"] - r["t0"] > 0.25 * g],
            "caller_waits": [{"kind": r["kind"], "from_ms": rel(r["t0"]), "ms": round(ms(r["t1"] - r["t0"]), 3)}
                             for r in cw],
            "caller_in_a_fill": bool(caller_fills),
        })
    return {
        "ms": round(ms(t_end - t_start), 3),
        "gb_per_s": round(bytes_ / max(1, t_end - t_start), 2),
        "fills": len(fills),
        "fill_ms_median": round(ms(statistics.median(durs)), 3) if durs else None,
        "fill_ms_max": round(ms(max(durs)), 3) if durs else None,
        "fills_over_2ms": sum(d > 2e6 for d in durs),
        "prefault_ms_total": round(ms(sum(r["c"] for r in fills)), 3),
        "fill_ms_total": round(ms(sum(durs)), 3),
        "issues": len(issues),
        "caller_fill_wait_ms": round(ms(sum(r["t1"] - r["t0"] for r in waits if r["kind"] == "fill_wait")), 3),
        "caller_drain_wait_ms": round(ms(sum(r["t1"] - r["t0"] for r in waits if r["kind"] == "drain_wait")), 3),
        "thread_busy_ms": {str(k): round(ms(v), 2) for k, v in sorted(threads.items())},
        "slowest_fills": [{"who": r["who"], "at_ms": rel(r["t0"]), "ms": round(ms(r["t1"] - r["t0"]), 3),
                           "prefault_ms": round(ms(r["c"]), 3), "kb": r["b"] // 1024} for r in slow],
        "issue_gaps": gaps,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--gap-ms", type=float, default=2.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = [one(ld, a.gap_ms) for ld in loads(read(a.trace))]
    for i, r in enumerate(res):
        print("load %d: %.1f ms, %.1f GB/s; %d fills (median %.3f ms, max %.3f ms, %d over 2 ms), "
              "prefault %.1f of %.1f ms; caller fill wait %.1f, drain wait %.1f ms; %d issue gaps"
              % (i, r["ms"], r["gb_per_s"], r["fills"], r["fill_ms_median"] or 0, r["fill_ms_max"] or 0,
                 r["fills_over_2ms"], r["prefault_ms_total"], r["fill_ms_total"], r["caller_fill_wait_ms"],
                 r["caller_drain_wait_ms"], len(r["issue_gaps"])))
        for g in r["issue_gaps"][:8]:
            print("   gap at %.1f ms: %.1f ms, %d fills finished in it; long fills %s; caller %s%s"
                  % (g["at_ms"], g["ms"], g["fills_finished"],
                     ["%d:%.1fms(pf %.1f)" % (f["who"], f["ms"], f["prefault_ms"]) for f in g["fills_running"]],
                     ["%s %.1fms" % (w["kind"], w["ms"]) for w in g["caller_waits"]] or "absent",
                     ", in a fill" if g["caller_in_a_fill"] else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
