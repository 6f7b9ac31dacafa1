#!/usr/bin/env python3
"""Warm restart, measured on one GPU (docs/restart.md): a worker with
Llama-3.2-1B-shaped BF16 layers (unquantized) and the same MLP weights as
FP8 quantized online from BF16 restores from a page-cached snapshot,
against one pinned H2D copy of the same bytes (the ceiling) and against
what a restart costs without one: a cold load of the BF16 checkpoint
(a page-cached safetensors file) with the online quantization. Writes one
JSON object to OUT.

  python3 bench/restart.py OUT.json [--repeat N] [--layers N]
  python3 bench/restart.py OUT.json --file-undo-only [--file-undo-layers N] [--dir D]

Row file_undo (issue 30 item 4, docs/core.md "Undo sources"): the zoo's
qwen3_30b_a3b_fp8 row (bench/zoo.py's plan and sharded checkpoint writer,
imported; block-128 FP8 serialized, stacked experts; 20 of 48 layers on a
card under 100 GB) reloaded from its page-cached files into one model per
series, registered and sealed afresh (seal's undo reservation waited for):
  file_undo.off_*             rollback off
  file_undo.files_*           the defaults: the previous update's files are
                              the undo source (no undo log; undo bytes 0)
  file_undo.log_*             rollback with undo_source="undo-log" (the
                              undo log, as before), for reference
  *_first_s                   the first update after the cold load (update
                              2: the first the files serve), *_s the median
                              of --repeat after it; cold_s the cold load
  file_undo.cost_vs_rollback_off  files_s / off_s (target <= 1.3), and
                              first_cost_vs_rollback_off the same of *_first_s
  file_undo.abort_s           an update loaded then aborted at the defaults:
                              the files reloaded; abort_restores_bytes: the
                              runtime bytes after it equal those before

Every restore goes into a fresh worker (new context, new tensors), as a
restart would. Figures: medians of --repeat runs after one warm-up.
  snapshot.restore_s          refit_restore with its defaults (rollback on)
  snapshot.restore_norb_s     rollback off (an EMPTY worker has nothing to keep)
  snapshot.ratio_to_ceiling   pinned H2D time / restore_norb_s
  cold.load_s                 load_safetensors + online FP8 post-load
  snapshot.write_s            refit_snapshot_write (D2H, fsync, rename)
  keeper.restore_s            refit.keeper.restore from a keeper process on the
                              same GPU (rollback on); restore_norb_s: off
  keeper.ratio_to_ceiling     one D2D copy of the runtime bytes / restore_norb_s
  keeper.*_noverify           the same without the worker's fingerprint pass
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from _setup import ROOT  # noqa: E402,F401  (the binding on the path, REFIT_PLUGIN_PATH)

import torch  # noqa: E402

import refit  # noqa: E402

DEV = "cuda"
H, I, KV = 2048, 8192, 512


def shapes(layers):
    """name -> (module, format, runtime shape, runtime dtype)."""
    out = {}
    for i in range(layers):
        p = "model.layers.%d." % i
        for n, s in (("self_attn.q_proj", (H, H)), ("self_attn.k_proj", (KV, H)),
                     ("self_attn.v_proj", (KV, H)), ("self_attn.o_proj", (H, H))):
            out[p + n + ".weight"] = (p + n, "unquantized", s, torch.bfloat16)
        for n, s in (("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)),
                     ("mlp.down_proj", (H, I))):
            out[p + n + ".weight"] = (p + n, "fp8", s, torch.float8_e4m3fn)
    return out


class Worker:
    def __init__(self, table, wid):
        self.ctx = refit.Context(worker_id=wid, journal_path="")
        m = self.model = self.ctx.create_model()
        self.keep = []
        for name, (mod, fmt, shape, dt) in table.items():
            w = torch.empty(shape, dtype=dt, device=DEV)
            self.keep.append(w)
            if fmt == "fp8":
                s = torch.empty(1, dtype=torch.float32, device=DEV)
                self.keep.append(s)
                m.add_module(mod, "fp8", {"scheme": "per_tensor", "online": True})
                m.bind_runtime(mod, "weight", w)
                m.bind_runtime(mod, "weight_scale", s)
                m.expect(mod, name, torch.bfloat16, shape, target="weight")
            else:
                m.add_module(mod)
                m.bind_runtime(mod, "w", w)
                m.expect(mod, name, torch.bfloat16, shape)
        m.seal(prepare=False)

    def runtime_bytes(self):
        return sum(t.numel() * t.element_size() for t in self.keep)

    def close(self):
        self.ctx.close()
        self.keep = []


def write_checkpoint(table, path):
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(0)
    save_file({n: (torch.randn(s, generator=g) * 0.05).to(torch.bfloat16)
               for n, (_, _, s, _) in table.items()}, path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def page_in(path):
    for root, _, files in os.walk(path) if os.path.isdir(path) else [("", [], [path])]:
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def keeper_main(sock, ck, layers):
    """The keeper process: the worker's model at the checkpoint's version."""
    import refit.keeper
    w = Worker(shapes(layers), "keeper")
    with w.model.update(version="v1", rollback=False) as txn:
        txn.load_safetensors(ck)
    torch.cuda.synchronize()
    refit.keeper.Keeper(w.model, sock, timeout=120).run(1800)
    return 0


def keeper_row(table, ck, a, tmp):
    """Restores from a keeper process into fresh workers, against one
    device-to-device copy of the same bytes."""
    import subprocess
    import refit.keeper
    sock = os.path.join(tmp, "keeper.sock")
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--keeper", sock, ck,
                          str(a.layers)])
    try:
        rest, rest_norb, rest_nv, d2d = [], [], [], []
        for r in range(a.repeat + 1):
            for rb, v, acc in ((True, True, rest), (False, True, rest_norb),
                               (False, False, rest_nv)):
                x = Worker(table, "keeper-restore-%d-%d-%d" % (r, rb, v))
                acc.append(timed(lambda: refit.keeper.restore(x.model, sock, rollback=rb,
                                                              timeout=600, verify=v)))
                nbytes = x.runtime_bytes()
                x.close()
            src = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
            dst = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
            d2d.append(timed(lambda: dst.copy_(src)))
            del src, dst
    finally:
        p.terminate()
        p.wait()
    med = lambda v: statistics.median(v[1:])  # noqa: E731
    return {"restore_s": med(rest), "restore_norb_s": med(rest_norb), "d2d_s": med(d2d),
            "ratio_to_ceiling": med(d2d) / med(rest_norb), "target": 0.80,
            "restore_norb_noverify_s": med(rest_nv),
            "ratio_to_ceiling_noverify": med(d2d) / med(rest_nv)}


def file_undo_series(zoo, B, plan, eng, d, a, rollback, undo_source):
    """One model, freshly registered and sealed: a cold load, then
    --repeat + 1 reloads of the files in d. Returns (seconds of each, the
    last update's txn.stats(), the model's context, the model)."""
    ctx = refit.Context(worker_id="file-undo", journal_path="")
    m, _, _ = zoo.register(ctx, plan, eng)
    zoo.wait_reserve(m)
    times, stats = [], None
    for k in range(a.repeat + 2):
        B.sync()
        t0 = time.perf_counter()
        with m.update(version="v%d" % k, rollback=rollback, undo_source=undo_source) as txn:
            txn.load_safetensors(d)
            stats = txn.stats()
        B.sync()
        times.append(time.perf_counter() - t0)
    return times, stats, ctx, m


def file_undo_row(a, zoo=None, B=None, cfg=None):
    """The file_undo row (module docstring). zoo, B, cfg: the bench/zoo.py
    module, its backend and model config (tests pass the host's)."""
    if zoo is None:
        import zoo
        B = zoo.backend("torch")
        cfg = dict(zoo.CONFIGS["qwen3_30b_a3b"])
    total = B.device_total()
    layers = a.file_undo_layers or (cfg["layers"] if total is None or total >= 100e9 else 20)
    plan = zoo.build_plan(cfg, "fp8b", layers)
    d = tempfile.mkdtemp(prefix="refit-file-undo-", dir=a.dir)
    res = {"model": "qwen3_30b_a3b", "quant": "fp8b", "layers": layers,
           "bytes": plan.bytes, "tensors": len(plan.ckpt), "modules": len(plan.mods),
           "target": "cost_vs_rollback_off <= 1.3 (first and steady)"}
    try:
        paths = zoo.write_checkpoint(B, plan, d, int(5e9), seed=11765)
        res["shards"] = len(paths)
        zoo.read_files(paths)
        eng = zoo.Engine(B, plan)
        med = statistics.median
        for key, rb, src in (("off", False, "auto"), ("files", True, "auto"),
                             ("log", True, "undo-log")):
            t, st, ctx, m = file_undo_series(zoo, B, plan, eng, d, a, rb, src)
            res[key + "_cold_s"], res[key + "_first_s"] = t[0], t[1]
            res[key + "_s"], res[key + "_all_s"] = med(t[2:]), t[2:]
            res[key + "_undo_bytes"] = st["undo_device_bytes"] + st["undo_host_bytes"]
            if key == "files":
                before = eng.digest()
                B.sync()
                txn = m.begin(version="aborted")
                txn.load_safetensors(d)   # the same bytes: any difference is the restore's
                B.sync()
                t0 = time.perf_counter()
                txn.abort()
                B.sync()
                res["abort_s"] = time.perf_counter() - t0
                res["abort_restores_bytes"] = eng.digest() == before
                res["abort_version"] = ctx.version
            m.destroy()
            ctx.close()
        res["cost_vs_rollback_off"] = res["files_s"] / res["off_s"]
        res["first_cost_vs_rollback_off"] = res["files_first_s"] / res["off_first_s"]
        res["log_cost_vs_rollback_off"] = res["log_s"] / res["off_s"]
        res["met"] = max(res["cost_vs_rollback_off"], res["first_cost_vs_rollback_off"]) <= 1.3
        del eng
    finally:
        shutil.rmtree(d, ignore_errors=True)
        B.empty_cache()
    return res


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--keeper":
        return keeper_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--file-undo-only", action="store_true", help="only the file_undo row")
    ap.add_argument("--file-undo-layers", type=int, default=0,
                    help="file_undo: layers of Qwen3-30B-A3B (default: all, 20 under 100 GB)")
    ap.add_argument("--dir", default=None, help="file_undo: where its shards go")
    a = ap.parse_args()
    if a.file_undo_only:
        out = {"device": torch.cuda.get_device_name(), "repeat": a.repeat,
               "file_undo": file_undo_row(a)}
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
        print(json.dumps(out, indent=1))
        return 0
    table = shapes(a.layers)
    tmp = tempfile.mkdtemp(prefix="refit-restart-")
    try:
        ck = os.path.join(tmp, "model.safetensors")
        write_checkpoint(table, ck)
        page_in(ck)
        cold, wsnap, rest, rest_norb, h2d = [], [], [], [], []
        src = None
        for r in range(a.repeat + 1):
            w = Worker(table, "cold-%d" % r)

            def load():
                with w.model.update(version="v1", rollback=False) as txn:
                    txn.load_safetensors(ck)
            cold.append(timed(load))
            snap = os.path.join(tmp, "snap-%d" % r)
            wsnap.append(timed(lambda: w.model.snapshot(snap)))
            nbytes = w.runtime_bytes()
            w.close()
            page_in(snap)
            for rb, acc in ((True, rest), (False, rest_norb)):
                x = Worker(table, "restore-%d-%d" % (r, rb))
                acc.append(timed(lambda: x.model.restore(snap, rollback=rb)))
                x.close()
            if src is None:
                src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
                dst = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
            h2d.append(timed(lambda: dst.copy_(src, non_blocking=True)))
            shutil.rmtree(snap)
        med = lambda v: statistics.median(v[1:])  # noqa: E731  (the first is the warm-up)
        out = {"device": torch.cuda.get_device_name(), "layers": a.layers,
               "runtime_bytes": nbytes, "repeat": a.repeat,
               "cold": {"load_s": med(cold)},
               "snapshot": {"write_s": med(wsnap), "restore_s": med(rest),
                            "restore_norb_s": med(rest_norb), "h2d_pinned_s": med(h2d),
                            "ratio_to_ceiling": med(h2d) / med(rest_norb),
                            "target": 0.85},
               "restore_vs_cold": med(rest) / med(cold)}
        out["keeper"] = keeper_row(table, ck, a, tmp)
        out["file_undo"] = file_undo_row(a)
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
