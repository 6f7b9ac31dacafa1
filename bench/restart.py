#!/usr/bin/env python3
"""Warm restart, measured on one GPU (docs/restart.md): a worker with
Llama-3.2-1B-shaped BF16 layers (unquantized) and the same MLP weights as
FP8 quantized online from BF16 restores from a page-cached snapshot,
against one pinned H2D copy of the same bytes (the ceiling) and against
what a restart costs without one: a cold load of the BF16 checkpoint
(a page-cached safetensors file) with the online quantization. Writes one
JSON object to OUT.

  python3 bench/restart.py OUT.json [--repeat N] [--layers N]

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
        rest, rest_norb, d2d = [], [], []
        for r in range(a.repeat + 1):
            for rb, acc in ((True, rest), (False, rest_norb)):
                x = Worker(table, "keeper-restore-%d-%d" % (r, rb))
                acc.append(timed(lambda: refit.keeper.restore(x.model, sock, rollback=rb,
                                                              timeout=600)))
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
            "ratio_to_ceiling": med(d2d) / med(rest_norb), "target": 0.80}


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--keeper":
        return keeper_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=16)
    a = ap.parse_args()
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
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
