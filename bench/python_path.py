#!/usr/bin/env python3
"""The engine's path, measured: refit through its Python binding against
PyTorch in the same process, on one GPU. Writes one JSON object to OUT.

  python3 bench/python_path.py OUT.json [--repeat N] [--only d2d,moe100k,...]
                               [--st-dir DIR] [--journal PATH]

librefit is found as the binding finds it (REFIT_LIB, else the source
tree's build folders); with REFIT_LIB set and no REFIT_PLUGIN_PATH, the
plugins/ folder beside it (tests/gpu/stage.sh's layout) is used.

Cases (medians of --repeat timed runs after one warm-up; every update is
begin .. finalize, finalize waiting for the stream):
  d2d                 Llama-3.2-1B shapes (147 BF16 tensors, untied head,
                      ~3.0 GB) from device tensors, a prepared SourceSet,
                      rollback off; against one device copy of the same
                      bytes (the ceiling) and a param.copy_ loop
  d2d_fresh           the same from txn.load_dict (descriptors built per call)
  moe100k             100,000 [64, 256] BF16 tensors into 1,000 stacked
                      [100, 64, 256] modules, prepared; against stack[e].copy_
  moe100k_fresh       the same from txn.load_dict
  d2d_rollback_device rollback on, undo_device_budget large enough for the
                      whole model (the undo log in device memory)
  d2d_rollback_host   rollback on, budget 0: every overwritten byte saved to
                      pinned host; against one pinned D2H copy of the bytes
                      (the faster of the copies timed before and after)
  safetensors         a page-cached file of the d2d model (written back:
                      fsynced once written) via txn.load_safetensors;
                      against one pinned H2D copy (the faster of the
                      copies timed before and after: the host's memory
                      moves from minute to minute). Beside it, reported
                      with no target, safetensors_default: the same from
                      `with model.update() as txn`, the defaults a new
                      user gets (rollback on, undo in pinned host memory,
                      the file's identity journaled)
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time

from _setup import ROOT  # noqa: E402,F401  (the binding on the path, REFIT_PLUGIN_PATH)

import torch  # noqa: E402

import refit  # noqa: E402
from refit import _ffi  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
ALIGN = 256


def llama_shapes():
    """Llama-3.2-1B: hidden 2048, 16 layers, 8 KV heads of 64, intermediate
    8192, vocab 128256, the head untied (147 tensors)."""
    H, KV, I, V, L = 2048, 512, 8192, 128256, 16
    out = [("model.embed_tokens.weight", (V, H))]
    for i in range(L):
        p = "model.layers.%d." % i
        out += [(p + "self_attn.q_proj.weight", (H, H)), (p + "self_attn.k_proj.weight", (KV, H)),
                (p + "self_attn.v_proj.weight", (KV, H)), (p + "self_attn.o_proj.weight", (H, H)),
                (p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                (p + "mlp.down_proj.weight", (H, I)), (p + "input_layernorm.weight", (H,)),
                (p + "post_attention_layernorm.weight", (H,))]
    return out + [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def carve(flat, shapes):
    """BF16 views of shapes in one uint8 buffer, each at a 256-byte offset."""
    out, off = [], 0
    for shape in shapes:
        nb = numel(shape) * 2
        out.append(flat[off:off + nb].view(BF16).view(shape))
        off += (nb + ALIGN - 1) // ALIGN * ALIGN
    return out


def layout_bytes(shapes):
    return sum((numel(s) * 2 + ALIGN - 1) // ALIGN * ALIGN for s in shapes)


def timed(fn, repeat):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def context(undo_device_budget=0, journal=""):
    return refit.Context(worker_id="bench", journal_path=journal,
                         undo_device_budget=undo_device_budget)


def update(model, body, rollback=False):
    def run():
        txn = model.begin(version="bench", rollback=rollback)
        try:
            body(txn)
        except BaseException:
            txn.abort()
            raise
        txn.finalize()
    return run


class Dense:
    """The Llama-shaped model: runtime and source tensors carved from two
    flat device buffers, so one copy of the flat buffer is the ceiling."""

    def __init__(self):
        self.spec = llama_shapes()
        shapes = [s for _, s in self.spec]
        self.bytes = layout_bytes(shapes)
        self.payload = sum(numel(s) * 2 for s in shapes)
        self.rt_flat = torch.zeros(self.bytes, dtype=torch.uint8, device=DEV)
        self.src_flat = torch.randint(0, 0x3f, (self.bytes,), dtype=torch.uint8, device=DEV)
        self.rt = carve(self.rt_flat, shapes)
        self.src = carve(self.src_flat, shapes)
        self.names = [n for n, _ in self.spec]
        self.srcs = dict(zip(self.names, self.src))

    def model(self, ctx):
        m = ctx.create_model()
        for (name, shape), t in zip(self.spec, self.rt):
            m.add_module(name)
            m.bind_runtime(name, "w", t)
            m.expect(name, name, BF16, list(shape))
        m.seal()
        return m

    def verify(self):
        ok = torch.equal(self.rt_flat, self.src_flat)
        self.rt_flat.zero_()
        return ok


def case(ms, ceiling_ms=None, torch_ms=None, ceiling_key="ratio_to_ceiling", nbytes=None,
         **extra):
    out = {"refit_ms": ms}
    if ceiling_ms is not None:
        out["ceiling_ms"] = ceiling_ms
        out[ceiling_key] = ceiling_ms / ms
    if torch_ms is not None:
        out["torch_copy_loop_ms"] = torch_ms
        out["speedup_vs_torch"] = torch_ms / ms
    if nbytes:
        out["bytes"] = nbytes
        out["refit_GBps"] = nbytes / ms / 1e6
    out.update(extra)
    return out


def bench_dense(res, want, repeat, journal):
    d = Dense()
    ceiling = timed(lambda: d.rt_flat.copy_(d.src_flat), repeat)
    res["ceiling_d2d_ms"] = ceiling

    def loop():
        with torch.no_grad():
            for p, s in zip(d.rt, d.src):
                p.copy_(s)
    torch_ms = timed(loop, repeat)
    d.rt_flat.zero_()
    ctx = context(journal=journal)
    m = d.model(ctx)
    common = dict(tensors=len(d.rt), nbytes=d.payload)
    if "d2d" in want:
        ss = m.source_set(d.srcs)
        ms = timed(update(m, lambda txn: txn.load_set(ss)), repeat)
        res["d2d"] = case(ms, ceiling, torch_ms, verified=d.verify(), **common)
    if "d2d_fresh" in want:
        ms = timed(update(m, lambda txn: txn.load_dict(d.srcs)), repeat)
        res["d2d_fresh"] = case(ms, ceiling, torch_ms, verified=d.verify(), **common)
    if "d2d_rollback_host" in want:
        ss = m.source_set(d.srcs)
        pinned = torch.empty(d.bytes, dtype=torch.uint8, pin_memory=True)
        d2h_before = timed(lambda: pinned.copy_(d.rt_flat, non_blocking=True), repeat)
        ms = timed(update(m, lambda txn: txn.load_set(ss), rollback=True), repeat)
        verified = d.verify()
        d2h_after = timed(lambda: pinned.copy_(d.rt_flat, non_blocking=True), repeat)
        del pinned
        res["d2d_rollback_host"] = case(ms, min(d2h_before, d2h_after),
                                        ceiling_key="ratio_to_d2h_ceiling", verified=verified,
                                        ceiling_before_ms=d2h_before,
                                        ceiling_after_ms=d2h_after, **common)
    m.destroy()
    ctx.close()
    if "d2d_rollback_device" in want:
        ctx = context(undo_device_budget=d.bytes + (64 << 20), journal=journal)
        m = d.model(ctx)
        ss = m.source_set(d.srcs)
        ms = timed(update(m, lambda txn: txn.load_set(ss), rollback=True), repeat)
        res["d2d_rollback_device"] = case(ms, ceiling, verified=d.verify(),
                                          undo_device_budget=d.bytes + (64 << 20), **common)
        m.destroy()
        ctx.close()
    if "safetensors" in want:
        bench_safetensors(res, d, repeat, journal)


def write_safetensors(path, d):
    """The d2d model as one safetensors file (header, then the bytes)."""
    header, off = {}, 0
    for name, shape in d.spec:
        nb = numel(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for t in d.src:
            host = t.contiguous().view(torch.uint8).cpu()
            f.write(ctypes.string_at(host.data_ptr(), host.numel()))
        f.flush()
        os.fsync(f.fileno())    # measured once written back: page-cached, not dirty


def bench_safetensors(res, d, repeat, journal):
    pinned = torch.empty(d.bytes, dtype=torch.uint8, pin_memory=True)
    h2d_before = timed(lambda: d.rt_flat.copy_(pinned, non_blocking=True), repeat)
    fd, path = tempfile.mkstemp(suffix=".safetensors", dir=res["_st_dir"])
    os.close(fd)
    try:
        write_safetensors(path, d)
        with open(path, "rb") as f:     # into the page cache
            while f.read(1 << 26):
                pass
        ctx = context(journal=journal)
        m = d.model(ctx)
        ms = timed(update(m, lambda txn: txn.load_safetensors(path)), repeat)
        verified = d.verify()
        # the host's memory moves from minute to minute: the ceiling is the
        # faster of the pinned copies timed before and after refit's loads
        h2d_after = timed(lambda: d.rt_flat.copy_(pinned, non_blocking=True), repeat)
        h2d = min(h2d_before, h2d_after)
        out = case(ms, h2d, ceiling_key="ratio_to_h2d_ceiling", verified=verified,
                   tensors=len(d.rt), nbytes=d.payload, file_bytes=os.path.getsize(path),
                   ceiling_before_ms=h2d_before, ceiling_after_ms=h2d_after)

        def default_update():     # what a new user writes: rollback on, identity journaled
            with m.update(version="bench") as txn:
                txn.load_safetensors(path)
        ms = timed(default_update, repeat)
        res["safetensors_default"] = case(ms, h2d, ceiling_key="ratio_to_h2d_ceiling",
                                          verified=d.verify(), tensors=len(d.rt),
                                          nbytes=d.payload, rollback=True)
        try:
            from safetensors.torch import load_file

            def st():
                with torch.no_grad():
                    for name, t in load_file(path).items():
                        d.srcs_rt[name].copy_(t)
            d.srcs_rt = dict(zip(d.names, d.rt))
            out["torch_load_file_copy_ms"] = timed(st, repeat)
        except ImportError:
            pass
        res["safetensors"] = out
        m.destroy()
        ctx.close()
    finally:
        os.unlink(path)
        del pinned


def bench_moe(res, want, repeat, journal):
    G, E, R, C = 1000, 100, 64, 256
    tb = R * C * 2
    rt = torch.zeros((G, E, R, C), dtype=BF16, device=DEV)
    src_flat = torch.randint(-64, 64, (G * E, R, C), dtype=torch.int8, device=DEV).to(BF16)
    stacks = [rt[g] for g in range(G)]
    names = ["model.layers.%d.mlp.experts.%d.down_proj.weight" % (g // 16, (g % 16) * E + e)
             for g in range(G) for e in range(E)]
    srcs = [src_flat[i] for i in range(G * E)]       # 100,000 tensor objects
    triples = [(stacks[i // E], i % E, srcs[i]) for i in range(G * E)]

    def loop():
        with torch.no_grad():
            for st, e, s in triples:
                st[e].copy_(s)
    torch_ms = timed(loop, repeat)
    rt.zero_()
    ctx = context(journal=journal)
    m = ctx.create_model()
    for g in range(G):
        mod = "model.layers.%d.mlp.experts.g%d" % (g // 16, g % 16)
        m.add_module(mod)
        m.bind_runtime(mod, "w", stacks[g])
        for e in range(E):
            m.expect(mod, names[g * E + e], BF16, [R, C], expert=e)
    m.seal()
    tensors = dict(zip(names, srcs))

    def verify():
        ok = torch.equal(rt.view(G * E, R, C), src_flat)
        rt.zero_()
        return ok
    common = dict(tensors=G * E, nbytes=G * E * tb)
    if "moe100k" in want:
        t0 = time.perf_counter()
        ss = m.source_set(tensors)
        build_ms = (time.perf_counter() - t0) * 1e3
        ms = timed(update(m, lambda txn: txn.load_set(ss)), repeat)
        res["moe100k"] = case(ms, None, torch_ms, verified=verify(), set_build_ms=build_ms,
                              us_per_tensor=ms * 1e3 / (G * E), **common)
    if "moe100k_fresh" in want:
        ms = timed(update(m, lambda txn: txn.load_dict(tensors)), repeat)
        res["moe100k_fresh"] = case(ms, None, torch_ms, verified=verify(),
                                    us_per_tensor=ms * 1e3 / (G * E), **common)
    m.destroy()
    ctx.close()


ALL = ["d2d", "d2d_fresh", "moe100k", "moe100k_fresh", "d2d_rollback_device",
       "d2d_rollback_host", "safetensors"]
TARGETS = {"d2d": ("ratio_to_ceiling", 0.90), "d2d.speedup": ("speedup_vs_torch", 1.5),
           "d2d_fresh": ("ratio_to_ceiling", 0.80), "moe100k": ("speedup_vs_torch", 15),
           "moe100k_fresh": ("speedup_vs_torch", 3),
           "d2d_rollback_device": ("ratio_to_ceiling", 0.45),
           "d2d_rollback_host": ("ratio_to_d2h_ceiling", 0.90),
           "safetensors": ("ratio_to_h2d_ceiling", 0.85)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--only", default=",".join(ALL))
    ap.add_argument("--st-dir", default=tempfile.gettempdir())
    ap.add_argument("--journal", default="", help="journal path (default: none)")
    a = ap.parse_args()
    want = set(a.only.split(","))
    bad = want - set(ALL)
    if bad:
        ap.error("unknown case(s): %s" % ", ".join(sorted(bad)))
    res = {"_st_dir": a.st_dir}
    dense = {"d2d", "d2d_fresh", "d2d_rollback_device", "d2d_rollback_host", "safetensors"}
    if want & dense:
        bench_dense(res, want, a.repeat, a.journal)
        torch.cuda.empty_cache()
    if want & {"moe100k", "moe100k_fresh"}:
        bench_moe(res, want, a.repeat, a.journal)
    del res["_st_dir"]
    met = {}
    for key, (field, target) in TARGETS.items():
        c = res.get(key.split(".")[0])
        if c and field in c:
            met[key.split(".")[0] + "." + field] = {"value": c[field], "target": target,
                                                    "met": c[field] >= target}
    out = {"bench": "python_path", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "refit_lib": getattr(_ffi.lib(), "_name", None), "repeat": a.repeat,
           "statistic": "median", "journal": bool(a.journal), "python": res, "targets": met}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for k, v in met.items():
        print("python.%-36s %8.3f  target %-5g %s" % (k, v["value"], v["target"],
                                                       "met" if v["met"] else "NOT MET"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
