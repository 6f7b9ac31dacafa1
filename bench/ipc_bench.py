#!/usr/bin/env python3
"""refit's CUDA IPC transport against PyTorch's own IPC paths, one GPU, two
processes (trainer spawned, this process the engine worker), same run:

  ceiling              one in-process copy of the bytes (flat D2D copy_)
  refit                refit.ipc: trainer's send() to every worker committed;
                       parameters shared as they are (no packing), steady
                       (median) and the first update (handles opened)
  refit rollback dev   the same with rollback, the undo log in device memory
                       (refit_options.undo_device_budget)
  torch per-tensor     one CUDA IPC handle per tensor (torch.multiprocessing
                       pickling), engine param.copy_ per tensor
  torch bucketed       parameters flattened into 1 GiB buckets, one handle
                       per bucket, engine copies each slice (SGLang/verl style)
  moe100k              100,000 [64, 256] BF16 tensors in 1,000 modules, packed
                       into buckets (refit) vs torch bucketed

Every refit path also records the steady update's profile: each phase on
the trainer (refit_ipc_send_profile) and on the worker
(refit_ipc_recv_profile, CUDA events for the GPU times) on the one
CLOCK_MONOTONIC both processes share; JSON "profile" (median per phase
over the steady updates) and printed. steady_ms is the trainer's send call
to the worker committed (the worker's clock read after refit_commit);
send_call_ms the trainer's call alone.

Usage: ipc_bench.py OUT.json [--iters N] [--quick]
Model: Llama-3.2-1B-shaped, 146 BF16 tensors, 3.0 GB (tied head not sent).
env: REFIT_LIB (librefit.so)."""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))

GiB = 1 << 30


def llama_1b_shapes():
    """Llama-3.2-1B: hidden 2048, 16 layers, 32 q / 8 kv heads of 64,
    intermediate 8192, vocab 128256: 1 embed + 16 x 9 + final norm = 146."""
    h, kv, inter, vocab = 2048, 512, 8192, 128256
    s = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(16):
        p = "model.layers.%d." % i
        s += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.k_proj.weight", (kv, h)),
              (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, h)),
              (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
              (p + "mlp.down_proj.weight", (h, inter)), (p + "input_layernorm.weight", (h,)),
              (p + "post_attention_layernorm.weight", (h,))]
    s.append(("model.norm.weight", (h,)))
    return s


def moe_shapes(n=100000):
    return [("model.experts.%d.%d.weight" % (i // 100, i % 100), (64, 256)) for i in range(n)]


def make_ctx(undo_device_budget=0):
    import refit
    return refit.Context(journal_path="", undo_device_budget=undo_device_budget)


def alloc(shapes, device="cuda", fill=None):
    import torch
    out = {}
    for n, s in shapes:
        t = torch.empty(*s, dtype=torch.bfloat16, device=device)
        if fill is not None:
            t.fill_(fill)
        out[n] = t
    return out


# ---- trainer process ----

def trainer_main(conn, shapes_name, path, iters):
    import torch
    import torch.multiprocessing  # noqa: F401  (CUDA tensors pickle as IPC handles)
    import refit
    import refit.ipc
    torch.cuda.set_device(0)
    shapes = llama_1b_shapes() if shapes_name == "llama" else moe_shapes()
    params = alloc(shapes)
    for i, t in enumerate(params.values()):
        t.normal_(generator=None).mul_(0.02 + 1e-4 * (i % 7))
    torch.cuda.synchronize()
    out = {}
    while True:
        cmd = conn.recv()
        if cmd == "quit":
            break
        if cmd[0] == "refit":
            _, share, bucket_bytes = cmd
            ctx = refit.Context(worker_id="trainer", journal_path="")
            s = refit.ipc.Sender(ctx, [path], device=0, timeout=120,
                                 stream=torch.cuda.current_stream(), bucket_bytes=bucket_bytes)
            for n, t in params.items():
                s.add(n, t, share=share)
            times, profs = [], []
            for k in range(iters + 1):
                # the optimizer's step on the stream (so the worker's copies
                # order after it by the shared event), done before the clock
                # starts, as the torch paths' steps are
                params[next(iter(params))].add_(0)
                torch.cuda.synchronize()
                t0 = time.monotonic_ns()  # CLOCK_MONOTONIC, as the profiles
                s.send(label="step-%d" % k)
                t1 = time.monotonic_ns()
                times.append((t1 - t0) * 1e-9)
                p = s.profile()
                p["call_ns"], p["return_ns"] = t0, t1
                profs.append(p)
            s.close()
            ctx.close()
            conn.send({"first_ms": times[0] * 1e3, "steady_ms": statistics.median(times[1:]) * 1e3,
                       "all_ms": [x * 1e3 for x in times], "profiles": profs})
        elif cmd[0] == "torch_per_tensor":
            times = []
            for k in range(iters + 1):
                t0 = time.perf_counter()
                torch.cuda.synchronize()
                conn.send(list(params.items()))     # one CUDA IPC handle per tensor
                conn.recv()
                times.append(time.perf_counter() - t0)
            conn.send({"first_ms": times[0] * 1e3, "steady_ms": statistics.median(times[1:]) * 1e3})
        elif cmd[0] == "torch_bucketed":
            names = list(params)
            buckets, cur, size = [], [], 0
            for n in names:
                b = params[n].numel() * 2
                if cur and size + b > GiB:
                    buckets.append(cur)
                    cur, size = [], 0
                cur.append(n)
                size += b
            buckets.append(cur)
            flats = [torch.empty(sum(params[n].numel() for n in b), dtype=torch.bfloat16,
                                 device="cuda") for b in buckets]
            times = []
            for k in range(iters + 1):
                t0 = time.perf_counter()
                msg = []
                for b, flat in zip(buckets, flats):
                    torch.cat([params[n].reshape(-1) for n in b], out=flat)
                    msg.append((flat, [(n, tuple(params[n].shape)) for n in b]))
                torch.cuda.synchronize()
                conn.send(msg)                      # one handle per bucket
                conn.recv()
                times.append(time.perf_counter() - t0)
            conn.send({"first_ms": times[0] * 1e3, "steady_ms": statistics.median(times[1:]) * 1e3})


# ---- worker (this process) ----

def worker_model(shapes, undo_device_budget=0, per_module=1):
    import torch
    ctx = make_ctx(undo_device_budget)
    m = ctx.create_model()
    rt = alloc(shapes, fill=0)
    names = list(rt)
    for i in range(0, len(names), per_module):
        mod = "m%d" % (i // per_module)
        m.add_module(mod)
        for n in names[i:i + per_module]:
            m.bind_runtime(mod, n, rt[n])
            m.expect(mod, n, torch.bfloat16, rt[n].shape, target=n)
    m.seal()
    return ctx, m, rt


def run_refit(conn, path, shapes, iters, rollback, share, undo_device_budget=0, per_module=1,
              bucket_bytes=0):
    import torch
    import refit.ipc
    ctx, m, rt = worker_model(shapes, undo_device_budget, per_module)
    stream = torch.cuda.Stream()
    r = refit.ipc.Receiver(m, path, timeout=120, start_timeout=300, stream=stream,
                           profile_gpu=True)
    conn.send(("refit", share, bucket_bytes))
    wprofs = []
    for _ in range(iters + 1):
        r.receive_update(rollback=rollback)
        wprofs.append(r.profile())
    res = conn.recv()
    res["stats"] = r.stats()
    res.update(profile_of(res.pop("profiles"), wprofs))
    r.close()
    ctx.close()
    del rt
    torch.cuda.empty_cache()
    return res


# The phases of one update, in the order they happen: (name, side, field).
# t: trainer (its send's profile; call_ns/return_ns are the Python call's
# clock reads), w: the worker's profile.
PHASES = [("send_call", "t", "call_ns"), ("send_start", "t", "start_ns"),
          ("packed", "t", "packed_ns"), ("encoded", "t", "encoded_ns"),
          ("results_read", "t", "results_ns"), ("update_written", "t", "posted_ns"),
          ("w_update_read", "w", "update_ns"), ("w_checked", "w", "checked_ns"),
          ("w_begun", "w", "begun_ns"), ("w_event_wait_queued", "w", "waited_ns"),
          ("w_copies_queued", "w", "enqueued_ns"), ("w_copies_done_gpu", "w", "copies_done_ns"),
          ("w_prepared", "w", "prepared_ns"), ("w_vote_written", "w", "voted_ns"),
          ("votes_read", "t", "voted_ns"), ("decision_written", "t", "decided_ns"),
          ("send_end", "t", "end_ns"), ("send_returned", "t", "return_ns"),
          ("w_decision_read", "w", "decision_ns"), ("w_committed", "w", "committed_ns"),
          ("w_result_written", "w", "result_ns")]


def profile_of(tprofs, wprofs):
    """Median over the steady updates (all but the first) of each phase's
    time since the trainer's send call (ms, one clock for both processes),
    of each step from the phase before it, and of the GPU times; plus the
    steady figure the target names: send call to the worker committed."""
    by_seq = {p["seq"]: p for p in wprofs[1:]}
    pairs = [(t, by_seq[t["seq"]]) for t in tprofs[1:] if t["seq"] in by_seq]
    if not pairs:
        return {}
    at, step = {}, {}
    for name, side, field in PHASES:
        xs = [((w if side == "w" else t)[field] - t["call_ns"]) * 1e-6 for t, w in pairs
              if (w if side == "w" else t)[field]]
        if xs:
            at[name] = statistics.median(xs)
    where = {n: (sd, f) for n, sd, f in PHASES}

    def stamp(t, w, name):
        sd, f = where[name]
        return (w if sd == "w" else t)[f]

    # each step from the phase before it in time (median over updates)
    names = sorted(at, key=lambda n: (at[n], [x for x, _, _ in PHASES].index(n)))
    for a, b in zip(names, names[1:]):
        xs = [(stamp(t, w, b) - stamp(t, w, a)) * 1e-6 for t, w in pairs
              if stamp(t, w, a) and stamp(t, w, b)]
        if xs:
            step[a + " -> " + b] = statistics.median(xs)
    gpu = {k: statistics.median([w[k] for _, w in pairs if w[k] >= 0])
           for k in ("gpu_wait_ms", "gpu_copy_ms") if any(w[k] >= 0 for _, w in pairs)}
    committed = [(w["committed_ns"] - t["call_ns"]) * 1e-6 for t, w in pairs]
    return {"committed_ms": statistics.median(committed),
            "profile": {"updates": len(pairs), "at_ms": at, "step_ms": step, "gpu_ms": gpu}}


def run_torch_per_tensor(conn, shapes, iters):
    import torch
    rt = alloc(shapes, fill=0)
    conn.send(("torch_per_tensor",))
    for _ in range(iters + 1):
        items = conn.recv()
        with torch.no_grad():
            for n, t in items:
                rt[n].copy_(t)
        torch.cuda.synchronize()
        del items
        conn.send("done")
    return conn.recv()


def run_torch_bucketed(conn, shapes, iters):
    import torch
    rt = alloc(shapes, fill=0)
    conn.send(("torch_bucketed",))
    for _ in range(iters + 1):
        msg = conn.recv()
        with torch.no_grad():
            for flat, meta in msg:
                off = 0
                for n, shape in meta:
                    k = rt[n].numel()
                    rt[n].copy_(flat[off:off + k].view(shape))
                    off += k
        torch.cuda.synchronize()
        del msg
        conn.send("done")
    return conn.recv()


def ceiling_ms(nbytes, iters=20):
    import torch
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    del a, b
    torch.cuda.empty_cache()
    return statistics.median(ts)


def session(shapes_name, iters, plan):
    """Spawn a trainer holding shapes_name's parameters and run plan(conn, path)."""
    import torch.multiprocessing as mp
    path = os.path.join(tempfile.mkdtemp(), "worker.sock")
    parent, child = mp.get_context("spawn").Pipe()
    p = mp.get_context("spawn").Process(target=trainer_main,
                                        args=(child, shapes_name, path, iters))
    p.start()
    try:
        return plan(parent, path)
    finally:
        parent.send("quit")
        p.join(120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="skip moe100k")
    a = ap.parse_args()
    import torch
    torch.cuda.set_device(0)
    dense = llama_1b_shapes()
    nbytes = sum(2 * (s[0] * (s[1] if len(s) > 1 else 1)) for _, s in dense)
    ceil = ceiling_ms(nbytes)
    r = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
         "model": {"tensors": len(dense), "bytes": nbytes, "dtype": "bf16"},
         "iters": a.iters, "ceiling_copy_ms": ceil}

    def dense_plan(conn, path):
        out = {}
        out["refit"] = run_refit(conn, path, dense, a.iters, rollback=False, share=True)
        out["refit_packed"] = run_refit(conn, path, dense, a.iters, rollback=False, share=False)
        out["refit_rollback_device"] = run_refit(conn, path, dense, a.iters, rollback=True,
                                                 share=True, undo_device_budget=nbytes + GiB)
        out["torch_per_tensor"] = run_torch_per_tensor(conn, dense, a.iters)
        out["torch_bucketed"] = run_torch_bucketed(conn, dense, a.iters)
        return out

    d = session("llama", a.iters, dense_plan)
    r.update(d)
    # steady: the trainer's send call to the worker committed (both clock
    # reads on CLOCK_MONOTONIC); send_call_ms: the trainer's call alone (it
    # returns once the commit decision is written)
    for k in ("refit", "refit_packed", "refit_rollback_device"):
        d[k]["send_call_ms"] = d[k]["steady_ms"]
        d[k]["steady_ms"] = d[k].get("committed_ms", d[k]["steady_ms"])
    ipc = {"ratio_to_ceiling": ceil / d["refit"]["steady_ms"],
           "steady_ms": d["refit"]["steady_ms"],
           "send_call_ms": d["refit"]["send_call_ms"],
           "first_update_ms": d["refit"]["first_ms"],
           "packed.ratio_to_ceiling": ceil / d["refit_packed"]["steady_ms"],
           "speedup_vs_torch_bucketed": d["torch_bucketed"]["steady_ms"] / d["refit"]["steady_ms"],
           "speedup_vs_torch_per_tensor":
               d["torch_per_tensor"]["steady_ms"] / d["refit"]["steady_ms"],
           "rollback_device.ratio_to_ceiling": ceil / d["refit_rollback_device"]["steady_ms"],
           "torch_per_tensor_ms": d["torch_per_tensor"]["steady_ms"],
           "torch_per_tensor_first_ms": d["torch_per_tensor"]["first_ms"],
           "torch_bucketed_ms": d["torch_bucketed"]["steady_ms"]}
    if not a.quick:
        moe = moe_shapes()
        mi = max(3, a.iters // 4)

        def moe_plan(conn, path):
            return {"refit": run_refit(conn, path, moe, mi, rollback=False, share=False,
                                       per_module=100),
                    "torch_bucketed": run_torch_bucketed(conn, moe, mi)}

        m = session("moe", mi, moe_plan)
        r["moe100k"] = m
        m["refit"]["send_call_ms"] = m["refit"]["steady_ms"]
        m["refit"]["steady_ms"] = m["refit"].get("committed_ms", m["refit"]["steady_ms"])
        ipc["moe100k_ms"] = m["refit"]["steady_ms"]
        ipc["moe100k_torch_bucketed_ms"] = m["torch_bucketed"]["steady_ms"]
    r["ipc"] = ipc
    r["profile"] = {k: d[k].get("profile", {}) for k in ("refit", "refit_packed",
                                                          "refit_rollback_device")}
    with open(a.out, "w") as f:
        json.dump(r, f, indent=1)
    print(json.dumps({"ipc": ipc}, indent=1))
    for k, p in r["profile"].items():
        print_profile(k, p)


def print_profile(name, p):
    """The steady update's phases, one line each: time since the send call,
    and the step from the phase before."""
    if not p:
        return
    print("profile %s (median of %d steady updates, ms since the trainer's send call):"
          % (name, p["updates"]))
    prev = None
    for n, t in sorted(p["at_ms"].items(), key=lambda kv: kv[1]):
        st = p["step_ms"].get("%s -> %s" % (prev, n)) if prev else None
        print("  %-22s %8.3f%s" % (n, t, "   +%.3f" % st if st is not None else ""))
        prev = n
    for k, v in p["gpu_ms"].items():
        print("  %-22s %8.3f" % (k, v))


if __name__ == "__main__":
    main()
