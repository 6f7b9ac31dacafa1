#!/usr/bin/env python3
"""The zoo: real-size models reloaded through the Python binding, beside the
peer's way in the same process, against the ceiling measured in the same
run (issue 28, Deliver 3). Writes one JSON object to OUT and one line per
row on stdout.

  python3 bench/zoo.py OUT.json [--rows a,b,...] [--repeat N] [--layers N]
                       [--dir DIR] [--shard-gb G] [--int4-layout gptq|u8]
  python3 bench/zoo.py --tiny OUT.json     # every row at a tiny scale, on
                                           # the host: numpy, no torch, no GPU

librefit is found as the binding finds it (REFIT_LIB, else the source
tree's build folders); with REFIT_LIB set and no REFIT_PLUGIN_PATH, the
plugins/ folder beside it is used (as bench/python_path.py does).

Rows (random weights, the exact shapes of the public configs):
  qwen3_4b_bf16            Qwen3-4B (tied), page-cached safetensors, BF16
  llama31_8b_fp8           Llama-3.1-8B, FP8 per-channel serialized
                           (compressed-tensors: F8_E4M3 weight, BF16
                           weight_scale [N, 1]; runtime F32 scales)
  qwen3_30b_a3b_fp8        Qwen3-30B-A3B, block-128 FP8 serialized
                           (weight + weight_scale_inv), stacked experts
  qwen3_30b_a3b_int4       Qwen3-30B-A3B, compressed-tensors W4A16 group
                           128 (weight_packed, weight_scale, weight_shape)
  qwen3_30b_a3b_online_fp8 Qwen3-30B-A3B BF16 device tensors -> online
                           block-128 FP8, stacked; against a BF16 reload
                           of the same bytes (cost_vs_bf16)
  qwen3_30b_a3b_ipc        Qwen3-30B-A3B BF16, a colocated trainer process
                           over refit.ipc (CUDA IPC; host memory in --tiny)
  qwen3_30b_a3b_delta_bf16 (issue 31) a 3% delta (random indices, sorted per
                           tensor, pinned host int64; values BF16 device
                           tensors) into Qwen3-30B-A3B BF16 stacked runtime
                           tensors through txn.load_deltas at the defaults
                           (rollback on), beside a full reload from the
                           BF16 device sources (load_dict, defaults):
                           cost_vs_full; the peer's way is a torch loop
                           param.view(-1)[idx] = vals (vLLM's sparse path)
  qwen3_30b_a3b_delta_online_fp8  the same delta into online block-128 FP8
                           runtimes (their BF16 master kept within
                           delta_master_budget = the checkpoint's bytes),
                           beside a full online reload; "not built" where
                           the library refuses deltas into online modules
  table_costs              (issue 28 item 6) a fresh txn.load_dict of 100,000
                           small host tensors (1,000 stacked modules of 100
                           experts, [4, 8] F32 each) from torch CPU tensors,
                           numpy arrays and objects exposing only __dlpack__ /
                           __dlpack_device__ (torch's, else numpy's): us per
                           tensor, host backend

Runtime tensors are laid out as vLLM holds them: fused qkv_proj and
gate_up_proj, stacked experts (w13 [E, 2I, H], w2 [E, H, I]); FP8 weights
F8_E4M3 with F32 scales; INT4 attention in the checkpoint's row layout
(refit int4 layout u8: vLLM's WNA16 linear holds [N, K/8] words) and
experts transposed as vLLM's WNA16 MoE holds them ([E, K/8, N] words,
[E, K/128, N] scales: refit int4 layout gptq). Every runtime tensor is a
view carved from one flat buffer, so zeroing and digests are one pass.

On a card under 100 GB the 30B rows use the first 20 layers (the JSON
says so: layers_used, cut). --layers N forces N layers on every model.
Every figure is computed in the run; `definitions` in the JSON says what
each field is.

On the GPU machine (one H100/H200; torch and safetensors installed):

  REFIT_LIB=build/librefit.so python3 bench/zoo.py \
      bench/results/$(date -u +%Y-%m-%dT%H%MZ)-h100-zoo.json [--dir /path/on/disk]

One row's shards at a time go to --dir (default: the temp dir), removed
before the next row. At 20 layers the largest row on disk is
qwen3_30b_a3b_fp8 (13.7 GB in 3 shards); on the device the online row
holds 26.2 GB of BF16 sources with 13.7 GB of FP8 runtime, then 26.2 GB of
BF16 runtime, and the ipc row 26.2 GB in each of two processes.

Tested on the host: `--tiny` (numpy) and `--tiny --torch-cpu` (the torch
code on CPU tensors) run every row at tiny shapes through the host backend;
their timings mean nothing, their peer_equal and errors do."""
import argparse
import ctypes
import gc
import json
import os
import resource
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
import zlib

from _setup import ROOT  # noqa: E402,F401  (the binding on the path, REFIT_PLUGIN_PATH)

import refit  # noqa: E402
from refit import _ffi  # noqa: E402

GiB = 1 << 30
ALIGN = 256

# ---------------------------------------------------------------- configs
# Public config.json values (Hugging Face hub): hidden_size,
# intermediate_size, moe_intermediate_size, num_attention_heads,
# num_key_value_heads, head_dim, vocab_size, num_hidden_layers,
# num_experts, tie_word_embeddings. Qwen3 has q_norm/k_norm per layer.
CONFIGS = {
    "qwen3_4b": dict(hidden=2560, inter=9728, heads=32, kv=8, head_dim=128, vocab=151936,
                     layers=36, experts=0, tie=True, qk_norm=True),
    "llama31_8b": dict(hidden=4096, inter=14336, heads=32, kv=8, head_dim=128, vocab=128256,
                       layers=32, experts=0, tie=False, qk_norm=False),
    "qwen3_30b_a3b": dict(hidden=2048, inter=768, heads=32, kv=4, head_dim=128, vocab=151936,
                          layers=48, experts=128, tie=False, qk_norm=True),
}
# --tiny: the same structure at a scale the host runs in seconds (block
# and group 128 kept whole)
TINY = {
    "qwen3_4b": dict(hidden=256, inter=384, heads=4, kv=2, head_dim=64, vocab=512, layers=2,
                     experts=0, tie=True, qk_norm=True),
    "llama31_8b": dict(hidden=256, inter=512, heads=4, kv=2, head_dim=64, vocab=512, layers=2,
                       experts=0, tie=False, qk_norm=False),
    "qwen3_30b_a3b": dict(hidden=256, inter=128, heads=4, kv=2, head_dim=64, vocab=512,
                          layers=2, experts=4, tie=False, qk_norm=True),
}

# row: model, how the weights arrive, their format, the seed's vLLM
# figure (one H200, steady, "Broad local A/B" column B), the target
ROWS = {
    "qwen3_4b_bf16": dict(model="qwen3_4b", source="files", quant="bf16", seed=1.890,
                          target=("ratio_to_ceiling", ">=", 0.85)),
    "llama31_8b_fp8": dict(model="llama31_8b", source="files", quant="fp8c", seed=2.406,
                           target=("ratio_to_ceiling", ">=", 0.85)),
    "qwen3_30b_a3b_fp8": dict(model="qwen3_30b_a3b", source="files", quant="fp8b", seed=11.765,
                              target=("ratio_to_ceiling", ">=", 0.80)),
    "qwen3_30b_a3b_int4": dict(model="qwen3_30b_a3b", source="files", quant="int4",
                               seed=26.491, target=("ratio_to_ceiling", ">=", 0.80)),
    "qwen3_30b_a3b_online_fp8": dict(model="qwen3_30b_a3b", source="device", quant="fp8o",
                                     seed=None, target=("cost_vs_bf16", "<=", 1.3)),
    "qwen3_30b_a3b_ipc": dict(model="qwen3_30b_a3b", source="ipc", quant="bf16", seed=None,
                              target=("ratio_to_ceiling", ">=", 0.80)),
    "table_costs": dict(model=None, source="table", quant=None, seed=None,
                        target=("worst_ratio_to_torch", "<=", 2.0)),
    "qwen3_30b_a3b_delta_bf16": dict(model="qwen3_30b_a3b", source="delta", quant="bf16",
                                     seed=None, target=("cost_vs_full", "<=", 0.25)),
    "qwen3_30b_a3b_delta_online_fp8": dict(model="qwen3_30b_a3b", source="delta",
                                           quant="fp8o", seed=None,
                                           target=("cost_vs_full", "<=", 0.25)),
}

DEFINITIONS = {
    "seconds": "steady update, rollback off (model.begin(rollback=False) .. finalize, the "
               "stream synchronized): median of --repeat after the first",
    "first_seconds": "the first update after seal, rollback off",
    "default_seconds": "steady update at the defaults (`with model.update() as txn`: "
                       "rollback on, undo in pinned host memory, no undo device budget, "
                       "1 GiB staging): median of --repeat after the first, on a model "
                       "registered and sealed afresh",
    "default_first_seconds": "the first update after that seal, at the defaults",
    "first_rule": "default_first_seconds <= 1.2 * default_seconds (issue 28)",
    "ceiling_seconds": "files: pinned host -> device copies of `bytes` (a pinned chunk of "
                       "ceiling_chunk_bytes copied into a device chunk until `bytes` moved; "
                       "the faster of the runs before and after the row's loads); device "
                       "sources: device -> device copy of `bytes` (one copy_ where both "
                       "buffers fit, else chunks into a scratch buffer). --tiny: host "
                       "memcpy of the bytes",
    "ratio_to_ceiling": "ceiling_seconds / seconds",
    "bytes": "checkpoint payload bytes loaded per update (sum of the tensors' bytes)",
    "tensors": "checkpoint tensors loaded per update",
    "peer_seconds": "files: safetensors.torch.load_file(shard, device='cuda') + copy_ of "
                    "each tensor into its runtime view, every shard; online: a torch loop "
                    "quantizing each tensor to block-128 FP8 into its runtime view (scale = "
                    "amax/448, x/scale, clamp, cast); ipc: none. Median of the runs after a "
                    "warm-up",
    "peer_equal": "the runtime bytes after the peer's way equal those after refit's "
                  "(a digest of the flat runtime buffer)",
    "seal_seconds": "Model.seal() of the rollback-off model",
    "reserve_seconds": "after seal returned, the wait for its undo reservation (a background thread; the first update is timed after it, as an engine that seals at start meets it)",
    "undo_held": "[device, host] bytes of undo memory the model holds after the reservation",
    "register_seconds": "add_module/bind_runtime/expect of every module and tensor, Python",
    "device_peak_extra_bytes": "free device memory before the update minus the lowest free "
                               "figure seen (torch.cuda.mem_get_info sampled every ~2 ms on "
                               "a thread during an extra, untimed update): staging, undo "
                               "and refit's own buffers, which torch's allocator stats "
                               "cannot see",
    "host_rss_peak_extra_bytes": "VmHWM after the update minus VmRSS before, VmHWM reset "
                                 "through /proc/self/clear_refs (5) just before; file "
                                 "rows count the checkpoint's mapped page-cache pages",
    "host_anon_peak_extra_bytes": "highest RssAnon+RssShmem sampled during the update "
                                  "minus before (pinned and malloc'd memory, not file pages)",
    "undo_device_bytes/undo_host_bytes/staging_peak": "refit's txn.stats() before finalize "
                                                      "(staging_peak: its staging high-water "
                                                      "in bytes, where the binding has it)",
    "host_us_per_tensor": "(seconds - ceiling_seconds) / tensors * 1e6: the update's time "
                          "beyond moving its bytes at the ceiling, spread over its "
                          "tensors (an upper bound on refit's per-tensor host cost)",
    "table_us_per_tensor": "device rows: building the load_dict descriptor table "
                           "(_batch.split + _batch.Table) over the row's source dict, "
                           "median of 3, per tensor",
    "table_costs": "us per tensor of a fresh load_dict (rollback off, begin .. finalize) "
                   "and of its descriptor table alone (split + Table), per source kind; "
                   "ratio_to_torch: numpy's and dlpack's load_dict against torch's",
    "cost_vs_bf16": "online seconds / seconds of a BF16 reload of the same sources into "
                    "BF16 stacked runtime tensors (load_dict, rollback off)",
    "delta_rows": "rows with delta in the name (issue 31): `seconds` is a delta update at the "
                  "defaults (`with model.update(version=, base=) as txn: "
                  "txn.load_deltas(table)`, rollback on), median of --repeat after the "
                  "first, each against the version before it; `full_seconds` a full "
                  "reload of the same model from the BF16 device sources at the defaults "
                  "(load_dict), timed the same way in the same run; cost_vs_full = "
                  "seconds / full_seconds; `elements` the patched elements, `bytes` the "
                  "patch's payload (values plus int64 indices); `delta_equals_full`: the "
                  "runtime bytes after the deltas equal those after a full reload of the "
                  "patched sources; peer_seconds: a torch loop param.view(-1)[idx] = vals "
                  "per tensor (vLLM's sparse path: in place, no undo), indices on the "
                  "device there; rollback_off: the same full and delta updates with "
                  "model.update(rollback=False), medians",
}


# what the engine holds, per quant (the JSON's `runtime`)
RUNTIME = {
    "bf16": "BF16: fused qkv_proj [Q+2KV, H] and gate_up_proj [2I, H] (dense) or stacked "
            "experts w13 [E, 2I, H], w2 [E, H, I] (MoE); embed, norms, router, head BF16",
    "fp8c": "F8_E4M3 weight + F32 weight_scale [N, 1] per fused linear (qkv_proj, o_proj, "
            "gate_up_proj, down_proj; checkpoint scales BF16, cast); the rest BF16",
    "fp8b": "F8_E4M3 weight + F32 block scales [ceil(N/128), ceil(K/128)] per fused linear; "
            "experts stacked: w13 [E, 2I, H] + [E, 2I/128, H/128], w2 [E, H, I] + "
            "[E, H/128, I/128]; router, norms, embed, head BF16",
    "int4": "int4 group 128, one refit int4 module per checkpoint linear bound to views of "
            "the engine's tensors: attention qkv_proj/o_proj packed words in the checkpoint's "
            "row layout (u8 [N, K/2], BF16 scales [N, K/128]: vLLM WNA16 linear); experts "
            "stacked as vLLM's WNA16 MoE holds them (gptq: I32 w13 [E, H/8, 2I], BF16 scales "
            "[E, H/128, 2I], w2 [E, I/8, H], [E, I/128, H]; --int4-layout u8: [E, N, K/2]); "
            "weight_shape checked, not stored; router, norms, embed, head BF16",
    "fp8o": "as fp8b (F8_E4M3 + F32 block-128 scales, experts stacked), quantized online from "
            "BF16 by refit's fp8 plugin (scheme block128, online)",
}


def cdiv(a, b):
    return (a + b - 1) // b


def numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


# ---------------------------------------------------------------- dtypes
# key: (safetensors name, bytes, refit dtype for expect, safetensors sort rank)
# safetensors writes a file's tensors sorted by dtype (descending, its enum
# order) then name, as save_file does
DT = {
    "bf16": ("BF16", 2, "bf16", 12), "f8": ("F8_E4M3", 1, "float8_e4m3fn", 7),
    "f32": ("F32", 4, "f32", 15), "i32": ("I32", 4, "i32", 13), "i64": ("I64", 8, "i64", 17),
    "u8": ("U8", 1, "u8", 4),
}


# ---------------------------------------------------------------- the plan
class Plan:
    """A model as refit registers it and as its checkpoint lists it.

    engine: runtime tensors the engine holds, name -> (dt, shape), carved
    from one flat buffer; mods: module -> (format, params, binds: role ->
    (engine name, view)); ckpt: checkpoint tensors in the order a trainer's
    state_dict lists them (name, dt, shape); where: name -> (module,
    target, expert, dst_offset, peer) with peer (engine name, view, mode)
    or None. A view is (expert, rows, cols) slicing an engine tensor."""

    def __init__(self):
        self.engine, self.mods, self.ckpt, self.where, self.values = {}, {}, [], {}, {}

    def eng(self, name, dt, shape):
        self.engine[name] = (dt, [int(s) for s in shape])
        return name

    def module(self, mod, fmt, params, binds):
        self.mods[mod] = (fmt, params, binds)

    def tensor(self, name, dt, shape, mod, target, expert=None, dst=None, mode=None,
               peer=True, value=None):
        self.ckpt.append((name, dt, [int(s) for s in shape]))
        p = None
        if peer:
            ename, base = self.mods[mod][2][target]
            if expert is None and dst is None:
                view = base
            else:
                rows = (dst[0], dst[0] + shape[0]) if dst else None
                cols = (dst[1], dst[1] + shape[1]) if dst and len(shape) > 1 else None
                view = (expert, rows, cols)
            p = (ename, view, mode)
        self.where[name] = (mod, target, expert, dst, p)
        if value is not None:
            self.values[name] = value

    @property
    def bytes(self):
        return sum(numel(s) * DT[d][1] for _, d, s in self.ckpt)

    def engine_bytes(self):
        return sum(pad(numel(s) * DT[d][1]) for d, s in self.engine.values())


def pad(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


FMT = {"bf16": "unquantized", "fp8c": "fp8", "fp8b": "fp8", "fp8o": "fp8"}


def fused_module(P, mod, fmt, N, K, E=0):
    """A fused (and, with E, stacked) weight of N rows and K columns."""
    lead = [E] if E else []
    if fmt == "bf16":
        P.module(mod, "unquantized", None, {"w": (P.eng(mod + ".weight", "bf16", lead + [N, K]),
                                                  None)})
        return
    sshape = [N, 1] if fmt == "fp8c" else [cdiv(N, 128), cdiv(K, 128)]
    params = {"scheme": "block128", "online": True} if fmt == "fp8o" else None
    P.module(mod, "fp8", params,
             {"weight": (P.eng(mod + ".weight", "f8", lead + [N, K]), None),
              "weight_scale": (P.eng(mod + ".weight_scale", "f32", lead + sshape), None)})


def part(P, W, mod, fmt, n, K, row, expert=None):
    """Checkpoint linear W ([n, K]) at row `row` of module mod (and expert)."""
    if fmt == "bf16":
        P.tensor(W + ".weight", "bf16", [n, K], mod, "w", expert, [row, 0])
    elif fmt == "fp8c":
        P.tensor(W + ".weight", "f8", [n, K], mod, "weight", expert, [row, 0])
        P.tensor(W + ".weight_scale", "bf16", [n, 1], mod, "weight_scale", expert, [row, 0])
    elif fmt == "fp8b":
        P.tensor(W + ".weight", "f8", [n, K], mod, "weight", expert, [row, 0])
        P.tensor(W + ".weight_scale_inv", "f32", [cdiv(n, 128), cdiv(K, 128)], mod,
                 "weight_scale", expert, [row // 128, 0])
    elif fmt == "fp8o":
        P.tensor(W + ".weight", "bf16", [n, K], mod, "weight", expert, [row, 0], mode="quant")
    else:
        raise ValueError(fmt)


def bf16_tensor(P, name, shape):
    mod = name.rsplit(".", 1)[0]
    P.module(mod, "unquantized", None, {"w": (P.eng(name, "bf16", shape), None)})
    P.tensor(name, "bf16", shape, mod, "w")


def int4_linear(P, W, n, K, wbind, sbind, layout):
    """A compressed-tensors W4A16 group-128 linear: one int4 module, its
    runtime tensors views of the engine's fused/stacked ones."""
    P.module(W, "int4", {"group_size": 128, "layout": layout},
             {"weight": wbind, "weight_scale": sbind})
    mode = "T" if layout == "gptq" else "u8"
    P.tensor(W + ".weight_packed", "i32", [n, K // 8], W, "weight", mode=mode)
    P.tensor(W + ".weight_scale", "bf16", [n, cdiv(K, 128)], W, "weight_scale",
             mode="T" if layout == "gptq" else None)
    P.tensor(W + ".weight_shape", "i64", [2], W, "weight", peer=False, value=(n, K))


def int4_fused(P, mod, parts, K, layout, E=0):
    """Engine tensors of a fused weight (parts: [(W, rows)]) in int4: the
    u8 row layout [E?, N, K/2] or the transposed gptq one [E?, K/8, N]."""
    N = sum(r for _, r in parts)
    lead = [E] if E else []
    if layout == "u8":
        ew = P.eng(mod + ".weight_packed", "u8", lead + [N, K // 2])
        es = P.eng(mod + ".weight_scale", "bf16", lead + [N, cdiv(K, 128)])
    else:
        ew = P.eng(mod + ".weight_packed", "i32", lead + [K // 8, N])
        es = P.eng(mod + ".weight_scale", "bf16", lead + [cdiv(K, 128), N])
    return ew, es, N


def int4_parts(P, ew, es, parts, K, layout, expert=None):
    row = 0
    for W, n in parts:
        if layout == "u8":
            v = (expert, (row, row + n), None)
        else:
            v = (expert, None, (row, row + n))
        int4_linear(P, W, n, K, (ew, v), (es, v), layout)
        row += n


def build_plan(cfg, quant, layers, int4_layout="gptq", moe_int4_layout=None):
    """The checkpoint in Hugging Face's state_dict order (embed, then per
    layer: attention, mlp (router, then experts one by one: gate, up,
    down), norms; final norm, head) and the engine's modules."""
    P = Plan()
    H, I, E = cfg["hidden"], cfg["inter"], cfg["experts"]
    Q, KV = cfg["heads"] * cfg["head_dim"], cfg["kv"] * cfg["head_dim"]
    bf16_tensor(P, "model.embed_tokens.weight", [cfg["vocab"], H])
    for L in range(layers):
        p = "model.layers.%d." % L
        a = p + "self_attn."
        attn = [(a + "q_proj", Q), (a + "k_proj", KV), (a + "v_proj", KV)]
        if quant == "int4":
            ew, es, _ = int4_fused(P, a + "qkv_proj", attn, H, "u8")
            int4_parts(P, ew, es, attn, H, "u8")
            ew, es, _ = int4_fused(P, a + "o_proj", [(a + "o_proj", H)], Q, "u8")
            int4_parts(P, ew, es, [(a + "o_proj", H)], Q, "u8")
        else:
            fused_module(P, a + "qkv_proj", quant, Q + 2 * KV, H)
            row = 0
            for W, n in attn:
                part(P, W, a + "qkv_proj", quant, n, H, row)
                row += n
            fused_module(P, a + "o_proj", quant, H, Q)
            part(P, a + "o_proj", a + "o_proj", quant, H, Q, 0)
        if cfg["qk_norm"]:
            bf16_tensor(P, a + "q_norm.weight", [cfg["head_dim"]])
            bf16_tensor(P, a + "k_norm.weight", [cfg["head_dim"]])
        m = p + "mlp."
        if E:
            bf16_tensor(P, m + "gate.weight", [E, H])     # the router stays BF16
            x = m + "experts."
            if quant == "int4":
                lay = moe_int4_layout or int4_layout
                w13 = [None, None]
                w13[0], w13[1], _ = int4_fused(P, x + "w13", [("g", I), ("u", I)], H, lay, E)
                w2 = int4_fused(P, x + "w2", [("d", H)], I, lay, E)
                for e in range(E):
                    pe = x + "%d." % e
                    int4_parts(P, w13[0], w13[1], [(pe + "gate_proj", I), (pe + "up_proj", I)],
                               H, lay, expert=e)
                    int4_parts(P, w2[0], w2[1], [(pe + "down_proj", H)], I, lay, expert=e)
            else:
                fused_module(P, x + "w13", quant, 2 * I, H, E)
                fused_module(P, x + "w2", quant, H, I, E)
                for e in range(E):
                    pe = x + "%d." % e
                    part(P, pe + "gate_proj", x + "w13", quant, I, H, 0, e)
                    part(P, pe + "up_proj", x + "w13", quant, I, H, I, e)
                    part(P, pe + "down_proj", x + "w2", quant, H, I, 0, e)
        else:
            q = quant
            fused_module(P, m + "gate_up_proj", q, 2 * I, H)
            part(P, m + "gate_proj", m + "gate_up_proj", q, I, H, 0)
            part(P, m + "up_proj", m + "gate_up_proj", q, I, H, I)
            fused_module(P, m + "down_proj", q, H, I)
            part(P, m + "down_proj", m + "down_proj", q, H, I, 0)
        bf16_tensor(P, p + "input_layernorm.weight", [H])
        bf16_tensor(P, p + "post_attention_layernorm.weight", [H])
    bf16_tensor(P, "model.norm.weight", [H])
    if not cfg["tie"]:
        bf16_tensor(P, "lm_head.weight", [cfg["vocab"], H])
    return P


def apply_view(t, view):
    if view is None:
        return t
    e, rows, cols = view
    if e is not None:
        t = t[e]
    if rows is not None:
        t = t[rows[0]:rows[1]]
    if cols is not None:
        t = t[:, cols[0]:cols[1]]
    return t


# ---------------------------------------------------------------- backends
class TorchBackend:
    """CUDA tensors through torch; ceilings by copies timed here. dev="cpu"
    (--tiny --torch-cpu) runs the same torch code on host tensors, to test
    it where there is no GPU."""
    name = "torch"

    def __init__(self, dev="cuda"):
        import torch
        self.torch = torch
        self.dev = dev
        self.cuda = dev == "cuda"
        if not self.cuda:
            self.name = "torch-cpu"
        self.dt = {"bf16": torch.bfloat16, "f8": torch.float8_e4m3fn, "f32": torch.float32,
                   "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}
        self._pinned = None

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def device_name(self):
        return self.torch.cuda.get_device_name(0) if self.cuda else "host (torch cpu, --tiny)"

    def device_total(self):
        return self.torch.cuda.mem_get_info()[1] if self.cuda else None

    def mem_free(self):
        return self.torch.cuda.mem_get_info()[0] if self.cuda else None

    def flat(self, nbytes, device=True):
        return self.torch.zeros(nbytes, dtype=self.torch.uint8,
                                device=self.dev if device else "cpu")

    def carve(self, flat, off, dt, shape):
        nb = numel(shape) * DT[dt][1]
        return flat[off:off + nb].view(self.dt[dt]).view(shape)

    def zero(self, flat):
        flat.zero_()

    def fill_random(self, t, dt, gen):
        """Finite random values of dt (no NaN or infinity: casts and
        quantization read them); f32 scales positive."""
        torch = self.torch
        if t.numel() == 0:
            return
        if dt == "bf16":
            t.view(torch.int16).random_(-32768, 32767, generator=gen)
            t.view(torch.int16).bitwise_and_(-16385)     # clear the exponent's top bit
        elif dt == "f8":
            t.view(torch.uint8).random_(0, 256, generator=gen)
            t.view(torch.uint8).bitwise_and_(0xBF)       # no NaN code
        elif dt == "f32":
            t.uniform_(1e-4, 1e-2, generator=gen)
        elif dt in ("i32", "u8"):
            t.view(torch.uint8).random_(0, 256, generator=gen)
        else:
            t.zero_()

    def randn_bf16(self, t, gen):
        t.normal_(0, 0.02, generator=gen)

    def generator(self, seed):
        g = self.torch.Generator(device=self.dev)
        g.manual_seed(seed)
        return g

    def to_host_bytes(self, flat):
        return flat.cpu().numpy()

    def set_values(self, t, value):
        t.copy_(self.torch.tensor(value, dtype=t.dtype))

    def digest(self, flat):
        """Sum of the int32 words of flat, and of them times their index
        mod 65521: enough to tell a missed or misplaced byte range."""
        torch = self.torch
        w = flat.view(torch.int32)
        s0 = s1 = 0
        step = 64 << 20
        for i in range(0, w.numel(), step):
            c = w[i:i + step].to(torch.int64)
            idx = torch.arange(i, i + c.numel(), device=c.device, dtype=torch.int64) % 65521
            s0 += int(c.sum())
            s1 += int((c * idx).sum())
            del c, idx
        return "%x:%x" % (s0 & (2**64 - 1), s1 & (2**64 - 1))

    def pinned_chunk(self, nbytes):
        if self._pinned is None or self._pinned.numel() < nbytes:
            self._pinned = None
            self._pinned = self.torch.empty(nbytes, dtype=self.torch.uint8,
                                            pin_memory=self.cuda)
            self._pinned.fill_(7)
        return self._pinned[:nbytes]

    def h2d_seconds(self, nbytes, chunk, repeat=3):
        torch = self.torch
        chunk = min(chunk, nbytes)
        src = self.pinned_chunk(chunk)
        dst = torch.empty(chunk, dtype=torch.uint8, device=self.dev)
        dst.copy_(src, non_blocking=True)
        self.sync()
        out = []
        for _ in range(repeat):
            self.sync()
            t0 = time.perf_counter()
            left = nbytes
            while left > 0:
                k = min(chunk, left)
                dst[:k].copy_(src[:k], non_blocking=True)
                left -= k
            self.sync()
            out.append(time.perf_counter() - t0)
        del dst
        return min(out)

    def d2d_seconds(self, src, dst, nbytes, repeat=5):
        """One copy of nbytes from src into dst (flat uint8); when dst is
        smaller, chunks of dst's size until nbytes moved."""
        torch = self.torch
        chunk = min(dst.numel(), nbytes)
        dst[:chunk].copy_(src[:chunk])
        self.sync()
        out = []
        for _ in range(repeat):
            self.sync()
            t0 = time.perf_counter()
            off = 0
            while off < nbytes:
                k = min(chunk, nbytes - off)
                dst[:k].copy_(src[off:off + k])
                off += k
            self.sync()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    def peer_load_shard(self, path):
        from safetensors.torch import load_file
        return load_file(path, device=self.dev)

    def peer_copy(self, dst, src, mode):
        if mode == "T":
            src = src.t()
        elif mode == "u8":
            src = src.view(self.torch.uint8)
        dst.copy_(src)

    def peer_scatter(self, param, idx, vals):
        param.view(-1)[idx] = vals

    def quant_block(self, x, wdst, sdst):
        """Block-128 FP8 of x [n, K] into wdst (f8 [n, K]) and sdst (f32
        [n/128, K/128]), as a torch loop would: amax/448, x/scale."""
        torch = self.torch
        n, K = x.shape
        xb = x.float().view(n // 128, 128, K // 128, 128)
        amax = xb.abs().amax(dim=(1, 3))
        # a tensor divisor: torch's CUDA division by a Python scalar multiplies
        # by its reciprocal (amax * (1/448)), which is not amax / 448
        scale = amax / amax.new_tensor(448.0)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = (xb / scale[:, None, :, None]).clamp_(-448, 448).view(n, K)
        wdst.copy_(q.to(torch.float8_e4m3fn))
        sdst.copy_(scale)

    def empty_cache(self):
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()

    def no_grad(self):
        return self.torch.no_grad()


class NumpyBackend:
    """--tiny: host memory through numpy and ml_dtypes; the same code path,
    host copies for ceilings, a minimal safetensors reader for the peer."""
    name = "numpy"

    def __init__(self):
        import ml_dtypes
        import numpy as np
        self.np = np
        self.dt = {"bf16": ml_dtypes.bfloat16, "f8": ml_dtypes.float8_e4m3fn,
                   "f32": np.float32, "i32": np.int32, "i64": np.int64, "u8": np.uint8}

    def sync(self):
        pass

    def device_name(self):
        return "host (numpy, --tiny)"

    def device_total(self):
        return None

    def mem_free(self):
        return None

    def flat(self, nbytes, device=True):
        # 64-byte aligned, as refit's in-place staging wants it
        raw = self.np.zeros(nbytes + 64, dtype=self.np.uint8)
        off = (-raw.ctypes.data) % 64
        return raw[off:off + nbytes]

    def carve(self, flat, off, dt, shape):
        nb = numel(shape) * DT[dt][1]
        return flat[off:off + nb].view(self.dt[dt]).reshape(shape)

    def zero(self, flat):
        flat[...] = 0

    def generator(self, seed):
        return self.np.random.default_rng(seed)

    def fill_random(self, t, dt, gen):
        """As TorchBackend's, in chunks (host memory is the machine's)."""
        np = self.np
        if t.size == 0:
            return
        flat = t.reshape(-1)
        step = 1 << 24
        for i in range(0, flat.size, step):
            c = flat[i:i + step]
            if dt == "bf16":
                u = c.view(np.uint16)
                u[...] = gen.integers(0, 1 << 16, size=u.shape, dtype=np.uint16) & 0xBFFF
            elif dt == "f8":
                u = c.view(np.uint8)
                u[...] = gen.integers(0, 256, size=u.shape, dtype=np.uint8) & 0xBF
            elif dt == "f32":
                c[...] = gen.uniform(1e-4, 1e-2, size=c.shape)
            elif dt in ("i32", "u8"):
                u = c.view(np.uint8)
                u[...] = gen.integers(0, 256, size=u.shape, dtype=np.uint8)
            else:
                c[...] = 0

    def randn_bf16(self, t, gen):
        flat = t.reshape(-1)
        step = 1 << 24
        for i in range(0, flat.size, step):
            c = flat[i:i + step]
            c[...] = (gen.standard_normal(size=c.shape, dtype=self.np.float32) *
                      self.np.float32(0.02)).astype(self.dt["bf16"])

    def to_host_bytes(self, flat):
        return flat

    def set_values(self, t, value):
        t[...] = self.np.array(value, dtype=t.dtype)

    def digest(self, flat):
        np = self.np
        w = flat.view(np.int32)
        s0 = s1 = 0
        step = 16 << 20
        for i in range(0, w.size, step):
            c = w[i:i + step].astype(np.int64)
            idx = np.arange(i, i + c.size, dtype=np.int64) % 65521
            s0 += int(c.sum())
            s1 += int((c * idx).sum())
        return "%x:%x" % (s0 & (2**64 - 1), s1 & (2**64 - 1))

    def h2d_seconds(self, nbytes, chunk, repeat=3):
        chunk = min(chunk, nbytes)
        src = self.np.full(chunk, 7, dtype=self.np.uint8)
        dst = self.np.empty_like(src)
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            left = nbytes
            while left > 0:
                k = min(chunk, left)
                self.np.copyto(dst[:k], src[:k])
                left -= k
            out.append(time.perf_counter() - t0)
        return min(out)

    def d2d_seconds(self, src, dst, nbytes, repeat=5):
        chunk = min(dst.size, nbytes)
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            off = 0
            while off < nbytes:
                k = min(chunk, nbytes - off)
                self.np.copyto(dst[:k], src[off:off + k])
                off += k
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    def peer_load_shard(self, path):
        """safetensors' own format read with numpy (its numpy API has no
        bf16 or fp8): every tensor a view of the file's bytes."""
        np = self.np
        with open(path, "rb") as f:
            buf = f.read()
        n = struct.unpack("<Q", buf[:8])[0]
        hdr = json.loads(buf[8:8 + n])
        data = np.frombuffer(buf, dtype=np.uint8, offset=8 + n)
        by_st = {v[0]: k for k, v in DT.items()}
        out = {}
        for name, d in hdr.items():
            if name == "__metadata__":
                continue
            a, b = d["data_offsets"]
            out[name] = data[a:b].view(self.dt[by_st[d["dtype"]]]).reshape(d["shape"])
        return out

    def peer_copy(self, dst, src, mode):
        if mode == "T":
            src = src.T
        elif mode == "u8":
            src = src.view(self.np.uint8)
        dst[...] = src.astype(dst.dtype) if src.dtype != dst.dtype else src

    def peer_scatter(self, param, idx, vals):
        flat = param.reshape(-1)
        if not self.np.shares_memory(flat, param):
            raise ValueError("peer_scatter: not a contiguous view")
        flat[idx] = vals

    def quant_block(self, x, wdst, sdst):
        np = self.np
        n, K = x.shape
        xb = x.astype(np.float32).reshape(n // 128, 128, K // 128, 128)
        amax = np.abs(xb).max(axis=(1, 3))
        scale = (amax / np.float32(448.0)).astype(np.float32)
        scale[scale == 0] = 1
        q = np.clip(xb / scale[:, None, :, None], -448, 448).reshape(n, K)
        wdst[...] = q.astype(self.dt["f8"])
        sdst[...] = scale

    def empty_cache(self):
        gc.collect()

    def no_grad(self):
        import contextlib
        return contextlib.nullcontext()


# ---------------------------------------------------------------- engine
class Engine:
    """The plan's runtime tensors, carved from one flat buffer."""

    def __init__(self, B, plan):
        self.B = B
        self.nbytes = plan.engine_bytes()
        self.flat = B.flat(self.nbytes)
        self.t, off = {}, 0
        for name, (dt, shape) in plan.engine.items():
            self.t[name] = B.carve(self.flat, off, dt, shape)
            off += pad(numel(shape) * DT[dt][1])

    def view(self, name, view):
        return apply_view(self.t[name], view)

    def zero(self):
        self.B.zero(self.flat)
        self.B.sync()

    def digest(self):
        return self.B.digest(self.flat)


def register(ctx, plan, eng):
    """One refit module per plan module, its runtime tensors bound, every
    checkpoint tensor expected; then seal. Returns (model, register s,
    seal s)."""
    t0 = time.perf_counter()
    m = ctx.create_model()
    for mod, (fmt, params, binds) in plan.mods.items():
        m.add_module(mod, fmt, params)
        for role, (ename, view) in binds.items():
            m.bind_runtime(mod, role, eng.view(ename, view))
    for name, dt, shape in plan.ckpt:
        mod, target, expert, dst, _ = plan.where[name]
        m.expect(mod, name, DT[dt][2], shape, target=target,
                 expert=-1 if expert is None else expert, dst_offset=dst)
    t1 = time.perf_counter()
    m.seal()
    return m, t1 - t0, time.perf_counter() - t1


# ---------------------------------------------------------------- measuring
def _status():
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "RssAnon", "RssShmem"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


class Sampler:
    """Free device memory and anonymous RSS, sampled on a thread."""

    def __init__(self, B, period=0.002):
        self.B, self.period = B, period

    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")        # reset VmHWM to VmRSS
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        st = _status()
        self.rss0 = st.get("VmRSS")
        self.anon0 = st.get("RssAnon", 0) + st.get("RssShmem", 0)
        self.free0 = self.B.mem_free()
        self.min_free, self.max_anon = self.free0, self.anon0
        self.stop = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()
        return self

    def _run(self):
        while not self.stop.is_set():
            f = self.B.mem_free()
            if f is not None and f < self.min_free:
                self.min_free = f
            st = _status()
            a = st.get("RssAnon", 0) + st.get("RssShmem", 0)
            if a > self.max_anon:
                self.max_anon = a
            time.sleep(self.period)

    def __exit__(self, *exc):
        self.stop.set()
        self.th.join()
        st = _status()
        a = st.get("RssAnon", 0) + st.get("RssShmem", 0)
        self.max_anon = max(self.max_anon, a)
        f = self.B.mem_free()
        if f is not None and self.min_free is not None:
            self.min_free = min(self.min_free, f)

    def result(self):
        out = {}
        if self.free0 is not None:
            out["device_peak_extra_bytes"] = self.free0 - self.min_free
        st = _status()
        if self.hwm_reset and self.rss0 is not None and "VmHWM" in st:
            out["host_rss_peak_extra_bytes"] = st["VmHWM"] - self.rss0
        out["host_anon_peak_extra_bytes"] = self.max_anon - self.anon0
        return out


class Updater:
    """Timed updates of one model: body(txn) loads; rollback off through
    begin/finalize, defaults through `with model.update()`."""

    def __init__(self, B, model):
        self.B, self.m, self.n = B, model, 0
        self.stats = None

    def __call__(self, body, default):
        self.n += 1
        v = "zoo-%d" % self.n
        self.B.sync()
        t0 = time.perf_counter()
        if default:
            with self.m.update(version=v) as txn:
                body(txn)
                self.stats = txn.stats()
        else:
            txn = self.m.begin(version=v, rollback=False)
            try:
                body(txn)
                self.stats = txn.stats()
            except BaseException:
                txn.abort()
                raise
            txn.finalize()
        self.B.sync()
        return time.perf_counter() - t0

    def series(self, body, default, repeat):
        first = self(body, default)
        steady = [self(body, default) for _ in range(repeat)]
        return first, statistics.median(steady), steady

    def probe(self, body, default):
        with Sampler(self.B) as s:
            secs = self(body, default)
        out = s.result()
        out["seconds"] = secs
        for k in ("undo_device_bytes", "undo_host_bytes", "staging_peak"):
            if k in self.stats:     # staging_peak: refit's own high-water, where reported
                out[k] = self.stats[k]
        return out


def err(e):
    return {"error": "%s: %s" % (type(e).__name__, e)}


def context(args, staging_budget=0):
    return refit.Context(worker_id="zoo", journal_path=args.journal,
                         staging_budget=staging_budget or args.staging_budget)


def wait_reserve(m):
    """Seal reserves the undo log's memory on a thread of its own (an engine
    seals at start and updates minutes later); wait for it, so the first
    update is timed as an engine meets it. Returns (seconds waited after
    seal returned, (device bytes, host bytes) held)."""
    t0 = time.perf_counter()
    held = m.undo_held(wait=True) if hasattr(m, "undo_held") else (0, 0)
    return time.perf_counter() - t0, list(held)


def measure_model(B, args, plan, eng, body, staging_budget=0, verify=True):
    """seal, first and steady (rollback off), then a fresh model at the
    defaults (first and steady); memory probes of each. Errors land in
    the dict, per phase."""
    out = {"staging_budget": staging_budget or args.staging_budget or GiB,
           "undo_device_budget": 0}
    ctx = context(args, staging_budget)
    try:
        m, reg, seal = register(ctx, plan, eng)
        out.update(register_seconds=reg, seal_seconds=seal)
        out["reserve_seconds"], out["undo_held"] = wait_reserve(m)
        u = Updater(B, m)
        eng.zero()
        out["first_seconds"], out["seconds"], out["seconds_all"] = u.series(body, False,
                                                                           args.repeat)
        if verify:
            out["_digest"] = eng.digest()
        out["probe_rollback_off"] = u.probe(body, False)
        m.destroy()
    except refit.RefitError as e:
        out.update(err(e))
        return out
    finally:
        ctx.close()
    ctx = context(args, staging_budget)
    try:
        m, _, seal = register(ctx, plan, eng)
        out["default_seal_seconds"] = seal
        out["default_reserve_seconds"], out["default_undo_held"] = wait_reserve(m)
        u = Updater(B, m)
        (out["default_first_seconds"], out["default_seconds"],
         out["default_seconds_all"]) = u.series(body, True, args.repeat)
        out["probe_default"] = u.probe(body, True)
        m.destroy()
    except refit.RefitError as e:
        out["default_error"] = err(e)["error"]
    finally:
        ctx.close()
    return out


def summarize(row, res, ceiling):
    """Derived fields: ratio, host us per tensor, targets."""
    spec = ROWS[row]
    if "seconds" in res and ceiling:
        res["ratio_to_ceiling"] = ceiling / res["seconds"]
        res["host_us_per_tensor"] = max(0.0, res["seconds"] - ceiling) / res["tensors"] * 1e6
    if "default_seconds" in res and "default_first_seconds" in res:
        res["first_over_steady_default"] = res["default_first_seconds"] / res["default_seconds"]
        res["first_rule_met"] = res["default_first_seconds"] <= 1.2 * res["default_seconds"]
    if "seal_seconds" in res:
        res["seal_rule_met"] = res["seal_seconds"] <= 1.0 * max(1.0, res["tensors"] / 40000)
    field, op, val = spec["target"]
    res["target"] = "%s %s %g" % (field, op, val)
    if field in res:
        res["met"] = res[field] >= val if op == ">=" else res[field] <= val
    else:
        res["met"] = False
    if spec["seed"] is not None:
        res["seed_vllm_seconds"] = spec["seed"]
        if "seconds" in res:
            res["speedup_vs_seed_vllm"] = spec["seed"] / res["seconds"]
    d = res.pop("_digest", None)
    pd = res.pop("_peer_digest", None)
    if d and pd:
        res["peer_equal"] = d == pd
    return res


# ---------------------------------------------------------------- files
def st_sort_key(item):
    name, dt, _ = item
    return (-DT[dt][3], name)


def shards_of(plan, shard_bytes):
    """Hugging Face's sharding: checkpoint order, a new shard when the next
    tensor would pass shard_bytes."""
    shards, cur, size = [], [], 0
    for name, dt, shape in plan.ckpt:
        nb = numel(shape) * DT[dt][1]
        if cur and size + nb > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, dt, shape))
        size += nb
    if cur:
        shards.append(cur)
    return shards


def write_checkpoint(B, plan, d, shard_bytes, seed):
    """Sharded safetensors with model.safetensors.index.json: each shard's
    tensors generated (random, finite) in one device buffer laid out as
    the file's data section, copied to the host once and written, then
    fsynced (page-cached, not dirty)."""
    shards = shards_of(plan, shard_bytes)
    gen = B.generator(seed)
    wmap, n = {}, len(shards)
    for i, sh in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        items = sorted(sh, key=st_sort_key)
        hdr, off = {"__metadata__": {"format": "pt"}}, 0
        for name, dt, shape in items:
            nb = numel(shape) * DT[dt][1]
            hdr[name] = {"dtype": DT[dt][0], "shape": shape, "data_offsets": [off, off + nb]}
            off += nb
            wmap[name] = fname
        flat = B.flat(off + (-off) % 8)
        o = 0
        for name, dt, shape in items:
            t = B.carve(flat, o, dt, shape)
            if name in plan.values:
                B.set_values(t, plan.values[name])
            else:
                B.fill_random(t, dt, gen)
            o += numel(shape) * DT[dt][1]
        host = B.to_host_bytes(flat[:off])
        del flat
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(os.path.join(d, fname), "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            f.write(memoryview(host).cast("B"))
            f.flush()
            os.fsync(f.fileno())
        del host
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": plan.bytes}, "weight_map": wmap}, f)
    return [os.path.join(d, "model-%05d-of-%05d.safetensors" % (i + 1, n)) for i in range(n)]


def read_files(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 26):
                pass


def peer_files(B, plan, eng, paths):
    """The peer's way: load_file(shard, device) + copy_ per tensor."""
    with B.no_grad():
        for p in paths:
            tensors = B.peer_load_shard(p)
            for name, t in tensors.items():
                peer = plan.where[name][4]
                if peer is not None:
                    ename, view, mode = peer
                    B.peer_copy(eng.view(ename, view), t, mode)
            del tensors
    B.sync()


def timed_runs(B, fn, repeat):
    fn()
    B.sync()
    out = []
    for _ in range(repeat):
        B.sync()
        t0 = time.perf_counter()
        fn()
        B.sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out), out


def row_files(B, args, row, cfg, layers):
    spec = ROWS[row]
    plan = build_plan(cfg, spec["quant"], layers, args.int4_layout)
    res = {"bytes": plan.bytes, "tensors": len(plan.ckpt), "modules": len(plan.mods),
           "engine_bytes": plan.engine_bytes(), "source": "page-cached safetensors",
           "runtime": RUNTIME[spec["quant"]]}
    if spec["quant"] == "int4":
        res["int4_layout"] = {"attention": "u8", "experts": args.int4_layout}
    d = tempfile.mkdtemp(prefix="zoo-%s-" % row, dir=args.dir)
    try:
        t0 = time.perf_counter()
        paths = write_checkpoint(B, plan, d, args.shard_bytes, seed=zlib.crc32(row.encode()))
        res["write_seconds"] = time.perf_counter() - t0
        res["shards"] = len(paths)
        res["file_bytes"] = sum(os.path.getsize(p) for p in paths)
        B.empty_cache()
        read_files(paths)
        eng = Engine(B, plan)
        chunk = min(args.ceiling_chunk, plan.bytes)
        res["ceiling_chunk_bytes"] = chunk
        before = B.h2d_seconds(plan.bytes, chunk)

        def body(txn):
            txn.load_safetensors(d)
        res.update(measure_model(B, args, plan, eng, body))
        B.empty_cache()
        try:
            if args.no_peer:
                raise RuntimeError("--no-peer")
            eng.zero()
            peer_files(B, plan, eng, paths)
            res["_peer_digest"] = eng.digest()
            res["peer_seconds"], res["peer_seconds_all"] = timed_runs(
                B, lambda: peer_files(B, plan, eng, paths), max(1, args.repeat - 1))
        except Exception as e:   # noqa: BLE001  (the peer is reported, not required)
            res["peer_error"] = err(e)["error"]
        B.empty_cache()
        after = B.h2d_seconds(plan.bytes, chunk)
        res.update(ceiling_seconds=min(before, after), ceiling_before_seconds=before,
                   ceiling_after_seconds=after,
                   ceiling="pinned H2D" if B.name == "torch" else "host memcpy (--tiny)")
        del eng
    finally:
        shutil.rmtree(d, ignore_errors=True)
        B.empty_cache()
    return summarize(row, res, res.get("ceiling_seconds"))


# ---------------------------------------------------------------- device sources
class Sources:
    """Checkpoint tensors as device tensors (a trainer's parameters),
    carved in checkpoint order from one flat buffer."""

    def __init__(self, B, plan, seed):
        self.nbytes = sum(pad(numel(s) * DT[d][1]) for _, d, s in plan.ckpt)
        self.flat = B.flat(self.nbytes)
        self.t, off = {}, 0
        gen = B.generator(seed)
        for name, dt, shape in plan.ckpt:
            t = B.carve(self.flat, off, dt, shape)
            if dt == "bf16":
                B.randn_bf16(t, gen)
            else:
                B.fill_random(t, dt, gen)
            self.t[name] = t
            off += pad(numel(shape) * DT[dt][1])
        B.sync()


def table_us(srcs):
    from refit import _batch
    out = []
    for _ in range(3):
        t0 = time.perf_counter()
        names, values = _batch.split(srcs)
        _batch.Table(names, values)
        out.append(time.perf_counter() - t0)
    return statistics.median(out) / max(1, len(srcs)) * 1e6


def peer_online(B, plan, eng, srcs):
    """A torch loop doing the same quantization: per checkpoint tensor,
    block-128 FP8 into its views of the stacked runtime tensors."""
    with B.no_grad():
        for name, x in srcs.items():
            mod, target, expert, dst, peer = plan.where[name]
            ename, view, mode = peer
            if mode != "quant":
                B.peer_copy(eng.view(ename, view), x, mode)
                continue
            fmt, params, binds = plan.mods[mod]
            sname = binds["weight_scale"][0]
            n, K = x.shape
            sview = (expert, (dst[0] // 128, dst[0] // 128 + n // 128), (0, K // 128))
            B.quant_block(x, eng.view(ename, view), eng.view(sname, sview))
    B.sync()


def row_online(B, args, row, cfg, layers):
    plan = build_plan(cfg, "fp8o", layers)
    res = {"bytes": plan.bytes, "tensors": len(plan.ckpt), "modules": len(plan.mods),
           "engine_bytes": plan.engine_bytes(), "source": "BF16 device tensors (load_dict)",
           "runtime": RUNTIME["fp8o"]}
    src = Sources(B, plan, seed=11)
    try:
        try:
            res["table_us_per_tensor"] = table_us(src.t)
        except Exception as e:   # noqa: BLE001  (private helpers: report, go on)
            res["table_error"] = err(e)["error"]

        def body(txn):
            txn.load_dict(src.t)
        eng = Engine(B, plan)
        r = measure_model(B, args, plan, eng, body)
        if "error" in r and "EBUDGET" in r["error"]:
            # the default budget cannot hold what the plan stages at once:
            # say so, and measure at a budget that can
            res["error"] = r["error"]
            big = args.fallback_staging_gib * GiB
            r2 = measure_model(B, args, plan, eng, body, staging_budget=big)
            res["at_staging_budget"] = r2
            r = {k: v for k, v in r2.items() if k in ("_digest",)}
            for k in ("seconds", "first_seconds", "default_seconds", "default_first_seconds",
                      "seal_seconds"):
                if k in r2:
                    r[k + "_at_budget"] = r2[k]
        res.update(r)
        B.empty_cache()
        try:
            if args.no_peer:
                raise RuntimeError("--no-peer")
            eng.zero()
            peer_online(B, plan, eng, src.t)
            res["_peer_digest"] = eng.digest()
            res["peer_seconds"], res["peer_seconds_all"] = timed_runs(
                B, lambda: peer_online(B, plan, eng, src.t), max(1, args.repeat - 1))
        except Exception as e:   # noqa: BLE001
            res["peer_error"] = err(e)["error"]
        del eng
        B.empty_cache()
        # the same bytes into BF16 stacked runtime tensors
        plan16 = build_plan(cfg, "bf16", layers)
        eng16 = Engine(B, plan16)
        r16 = measure_model(B, args, plan16, eng16, body, verify=False)
        res["bf16_reload"] = {k: v for k, v in r16.items()
                              if not k.startswith("probe") and not k.endswith("_all")}
        n = min(src.nbytes, eng16.nbytes)
        res["ceiling_seconds"] = B.d2d_seconds(src.flat, eng16.flat, n)
        res["ceiling"] = "one D2D copy of the BF16 source bytes"
        if "seconds" in r16:
            # the target is at the default budget; a figure at the larger
            # budget is reported beside it, never in its place
            if "seconds" in res:
                res["cost_vs_bf16"] = res["seconds"] / r16["seconds"]
            if "seconds_at_budget" in res:
                res["cost_vs_bf16_at_budget"] = res["seconds_at_budget"] / r16["seconds"]
                res["ratio_to_ceiling_at_budget"] = (res["ceiling_seconds"] /
                                                     res["seconds_at_budget"])
        del eng16
    finally:
        del src
        B.empty_cache()
    return summarize(row, res, res.get("ceiling_seconds"))


# ---------------------------------------------------------------- deltas
DELTA_FRACTION = 0.03


def delta_table(B, plan, frac, seed):
    """Per checkpoint tensor about frac of its elements: sorted unique
    random flat indices (int64, host memory: pinned with torch on CUDA, as
    refit_load_delta reads them on the host) and new BF16 values (device).
    Returns ({name: (indices, values)}, elements, payload bytes)."""
    table, elements, nbytes = {}, 0, 0
    if B.name == "numpy":
        np = B.np
        gen = np.random.default_rng(seed)
        for name, dt, shape in plan.ckpt:
            n = numel(shape)
            k = max(1, int(round(n * frac)))
            idx = np.unique(gen.integers(0, n, size=k, dtype=np.int64))
            vals = np.empty(idx.size, dtype=B.dt[dt])
            B.fill_random(vals, dt, gen)
            table[name] = (idx, vals)
            elements += idx.size
            nbytes += idx.size * (8 + DT[dt][1])
        return table, elements, nbytes
    torch = B.torch
    gen = B.generator(seed)
    for name, dt, shape in plan.ckpt:
        n = numel(shape)
        k = max(1, int(round(n * frac)))
        idx = torch.unique(torch.randint(0, n, (k,), generator=gen, device=B.dev))
        vals = torch.empty(idx.numel(), dtype=B.dt[dt], device=B.dev)
        if dt == "bf16":
            B.randn_bf16(vals, gen)
        else:
            B.fill_random(vals, dt, gen)
        host = idx.to("cpu")
        if B.cuda:
            host = host.pin_memory()
        table[name] = (host, vals)
        elements += idx.numel()
        nbytes += idx.numel() * (8 + DT[dt][1])
    B.sync()
    return table, elements, nbytes


def peer_delta(B, plan, eng, table, dev_idx):
    """vLLM's sparse path: param.view(-1)[idx] = vals per tensor, in place."""
    with B.no_grad():
        for name, (idx, vals) in table.items():
            ename, view, _ = plan.where[name][4]
            B.peer_scatter(eng.view(ename, view), dev_idx[name], vals)
    B.sync()


def delta_context(args, plan, quant):
    """The row's context: online runtimes get a delta master budget of the
    checkpoint's BF16 bytes (refit keeps the master it patches)."""
    if quant == "bf16":
        return context(args)
    return refit.Context(worker_id="zoo", journal_path=args.journal,
                         staging_budget=args.staging_budget,
                         delta_master_budget=plan.bytes + (64 << 20))


def online_delta_refusal(B, args):
    """None when a delta into an online-quantized module is taken, else
    why not (this build keeps no BF16 master of online modules)."""
    plan = build_plan(TINY["qwen3_30b_a3b"], "fp8o", 1)
    src = Sources(B, plan, seed=5)
    eng = Engine(B, plan)
    try:
        ctx = delta_context(args, plan, "fp8o")
    except TypeError as e:     # a binding without delta_master_budget
        return str(e)
    try:
        m, _, _ = register(ctx, plan, eng)
        with m.update(version="p1") as txn:
            txn.load_dict(src.t)
        name = next(n for n, (_, _, _, _, p) in plan.where.items() if p and p[2] == "quant")
        idx = B.np.array([0], dtype=B.np.int64) if B.name == "numpy" else \
            B.torch.tensor([0], dtype=B.torch.int64)
        try:
            with m.update(version="p2", base="p1") as txn:
                txn.load_delta(name, idx, src.t[name].reshape(-1)[:1])
        except refit.RefitError as e:
            return str(e)
        return None
    finally:
        ctx.close()


def row_delta(B, args, row, cfg, layers):
    """A 3% delta through txn.load_deltas beside a full reload of the same
    model from device tensors, both at the defaults (rollback on)."""
    spec = ROWS[row]
    field, op, val = spec["target"]
    if spec["quant"] != "bf16":
        why = online_delta_refusal(B, args)
        if why is not None:
            return {"not_built": "deltas into online-quantized modules are refused "
                                 "(refit keeps no BF16 master yet): " + why,
                    "target": "%s %s %g" % (field, op, val), "met": False}
    plan = build_plan(cfg, spec["quant"], layers)
    res = {"tensors": len(plan.ckpt), "modules": len(plan.mods),
           "checkpoint_bytes": plan.bytes, "engine_bytes": plan.engine_bytes(),
           "fraction": DELTA_FRACTION, "runtime": RUNTIME[spec["quant"]],
           "source": "BF16 %s tensors (values), int64 host indices (%s)" % (
               "host" if B.name == "numpy" or not B.cuda else "device",
               "pinned" if B.name != "numpy" and B.cuda else "pageable"),
           "full_source": "the BF16 sources whole (load_dict)"}
    src = Sources(B, plan, seed=17)
    table, res["elements"], res["bytes"] = delta_table(B, plan, DELTA_FRACTION, 19)
    eng = Engine(B, plan)
    ctx = delta_context(args, plan, spec["quant"])
    if spec["quant"] != "bf16":
        res["delta_master_budget"] = plan.bytes + (64 << 20)
    n = [0]

    def update(body, **kw):
        n[0] += 1
        v = "zoo-%d" % n[0]
        B.sync()
        t0 = time.perf_counter()
        with m.update(version=v, **kw) as txn:
            body(txn)
            st = txn.stats()
        B.sync()
        return time.perf_counter() - t0, v, st

    def series(body, delta, rollback=True):
        out, st = [], None
        for _ in range(1 + args.repeat):
            kw = {"base": "zoo-%d" % n[0]} if delta else {}
            secs, v, st = update(body, rollback=rollback, **kw)
            out.append(secs)
        return out, st

    try:
        m, res["register_seconds"], res["seal_seconds"] = register(ctx, plan, eng)
        res["reserve_seconds"], res["undo_held"] = wait_reserve(m)
        full, _ = series(lambda txn: txn.load_dict(src.t), False)
        res["full_first_seconds"], res["full_seconds"] = full[0], statistics.median(full[1:])
        res["full_seconds_all"] = full[1:]
        delta, st = series(lambda txn: txn.load_deltas(table), True)
        res["first_seconds"], res["seconds"] = delta[0], statistics.median(delta[1:])
        res["seconds_all"] = delta[1:]
        res["delta_stats"] = {k: st[k] for k in ("undo_device_bytes", "undo_host_bytes",
                                                 "delta_elements", "delta_tensors")
                              if k in st}
        res["cost_vs_full"] = res["seconds"] / res["full_seconds"]
        # the undo's share: the same updates with rollback off
        full_off, _ = series(lambda txn: txn.load_dict(src.t), False, False)
        delta_off, _ = series(lambda txn: txn.load_deltas(table), True, False)
        res["rollback_off"] = {"full_seconds": statistics.median(full_off[1:]),
                               "seconds": statistics.median(delta_off[1:])}
        res["rollback_off"]["cost_vs_full"] = (res["rollback_off"]["seconds"] /
                                               res["rollback_off"]["full_seconds"])
        after_delta = eng.digest()
        # the peer's way, from the base, indices on the device
        dev_idx = {k: (i.to(B.dev, non_blocking=True) if B.name != "numpy" else i)
                   for k, (i, _) in table.items()}
        try:
            if args.no_peer:
                raise RuntimeError("--no-peer")
            if spec["quant"] != "bf16":
                raise RuntimeError("no peer: vLLM's sparse path patches BF16 parameters in "
                                   "place, not online-quantized ones")
            update(lambda txn: txn.load_dict(src.t))
            peer_delta(B, plan, eng, table, dev_idx)
            res["peer_equal"] = eng.digest() == after_delta
            res["peer_seconds"], res["peer_seconds_all"] = timed_runs(
                B, lambda: peer_delta(B, plan, eng, table, dev_idx), args.repeat)
            res["peer_cost_vs_full"] = res["peer_seconds"] / res["full_seconds"]
        except Exception as e:   # noqa: BLE001  (the peer is reported, not required)
            res["peer_error"] = err(e)["error"]
        # the patched checkpoint whole: the same bytes as the deltas gave
        eng.zero()
        for name, (idx, vals) in table.items():
            B.peer_scatter(src.t[name], dev_idx[name], vals)
        update(lambda txn: txn.load_dict(src.t))
        res["delta_equals_full"] = eng.digest() == after_delta
        del dev_idx
        m.destroy()
    except refit.RefitError as e:
        res.update(err(e))
    finally:
        ctx.close()
        del eng, src, table
        B.empty_cache()
    res["target"] = "%s %s %g" % (field, op, val)
    res["met"] = field in res and res[field] <= val and res.get("delta_equals_full") is True
    return res


# ---------------------------------------------------------------- ipc
def backend(mode):
    """"numpy" (--tiny), "torch-cpu" (--tiny --torch-cpu) or "torch" (CUDA)."""
    if mode == "numpy":
        return NumpyBackend()
    return TorchBackend("cpu" if mode == "torch-cpu" else "cuda")


def _trainer(conn, cfg, layers, path, mode, iters):
    """The colocated trainer: the checkpoint's tensors on its device, sent
    over refit.ipc; timings on its clock."""
    import refit.ipc
    B = backend(mode)
    host = mode != "torch"
    plan = build_plan(cfg, "bf16", layers)
    src = Sources(B, plan, seed=13)
    ctx = refit.Context(worker_id="trainer", journal_path="")
    conn.send("ready")
    s = None
    while True:
        cmd = conn.recv()
        if cmd == "quit":
            break
        if s is None:   # connects: the worker answers from inside receive_update
            s = refit.ipc.Sender(ctx, [path], device=None if host else 0, timeout=600)
            for name, t in src.t.items():
                s.add(name, t, share=not host)
        out = []
        for k in range(cmd):
            B.sync()
            t0 = time.perf_counter()
            try:
                s.send(label="step-%d" % k)
            except Exception as e:   # noqa: BLE001
                out.append(err(e)["error"])
                break
            out.append(time.perf_counter() - t0)
        conn.send(out)
    if s is not None:
        s.close()
    ctx.close()


def row_ipc(B, args, row, cfg, layers):
    import multiprocessing as mp
    import refit.ipc
    plan = build_plan(cfg, "bf16", layers)
    res = {"bytes": plan.bytes, "tensors": len(plan.ckpt), "modules": len(plan.mods),
           "engine_bytes": plan.engine_bytes(), "runtime": RUNTIME["bf16"],
           "source": "trainer process, BF16 %s tensors, refit.ipc (share=%s)" % (
               "host" if args.tiny else "device", not args.tiny),
           "default_first_note": "default_first_seconds: the first rollback update, on the "
                                 "model the rollback-off updates ran on (not a fresh seal)",
           "timing": "the trainer's Sender.send() call: returns once every worker voted "
                     "and the commit decision is written"}
    eng = Engine(B, plan)
    path = os.path.join(tempfile.mkdtemp(prefix="zoo-ipc-"), "worker.sock")
    mpc = mp.get_context("spawn")
    parent, child = mpc.Pipe()
    p = mpc.Process(target=_trainer, args=(child, cfg, layers, path, args.mode, 0))
    p.start()
    ctx = context(args)
    recv = None
    try:
        m, reg, seal = register(ctx, plan, eng)
        res.update(register_seconds=reg, seal_seconds=seal)
        recv = refit.ipc.Receiver(m, path, timeout=600, start_timeout=600)
        t0 = time.perf_counter()
        while not parent.poll(1.0):
            if not p.is_alive() or time.perf_counter() - t0 > 600:
                raise RuntimeError("the trainer process did not start (exit code %s)"
                                   % p.exitcode)
        parent.recv()
        for label, rollback in (("", False), ("default_", True)):
            n = 1 + args.repeat
            parent.send(n)
            got = []
            for _ in range(n):
                try:
                    recv.receive_update(rollback=rollback)
                except refit.RefitError as e:
                    got.append(err(e)["error"])
                    break
            times = parent.recv()
            errs = [t for t in times if isinstance(t, str)] + [g for g in got
                                                               if isinstance(g, str)]
            if errs:
                res[label + "error"] = errs[0]
                continue
            res[label + "first_seconds"] = times[0]
            res[label + "seconds"] = statistics.median(times[1:])
            res[label + "seconds_all"] = times[1:]
        res["receiver_stats"] = recv.stats()
    except Exception as e:   # noqa: BLE001
        res.update(err(e))
    finally:
        if recv is not None:
            recv.close()
        parent.send("quit")
        p.join(120)
        ctx.close()
    scratch = B.flat(min(args.ceiling_chunk, eng.nbytes))
    res["ceiling_seconds"] = B.d2d_seconds(eng.flat, scratch, plan.bytes)
    res["ceiling"] = "D2D copy of the bytes (chunks of %d bytes)" % min(args.ceiling_chunk,
                                                                        eng.nbytes)
    del scratch, eng
    B.empty_cache()
    return summarize(row, res, res.get("ceiling_seconds"))


# ---------------------------------------------------------------- table costs
class DLPackOnly:
    """A producer seen only through DLPack (CuPy, JAX): refit must read the
    capsule, no torch or numpy fast path."""
    __slots__ = ("_t",)

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, *args, **kwargs):
        return self._t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def row_table_costs(B, args, row, cfg, layers):
    """A fresh load_dict of n small host tensors from each kind of source,
    into 1,000 stacked host modules (host backend: the copies are 128 B)."""
    import numpy as np
    n = args.table_tensors
    G, E, R, C = n // 100, 100, 4, 8
    res = {"tensors": G * E, "bytes": G * E * R * C * 4, "tensor_shape": [R, C],
           "dtype": "f32", "modules": G, "backend": "host"}
    rt = np.zeros((G, E, R, C), dtype=np.float32)
    names = ["model.layers.%d.mlp.experts.%d.g%d.weight" % (g // 16, e, g % 16)
             for g in range(G) for e in range(E)]
    kinds = {}
    src_np = np.arange(G * E * R * C, dtype=np.float32).reshape(G * E, R, C)
    kinds["numpy"] = [src_np[i] for i in range(G * E)]
    try:
        import torch
        src_t = torch.from_numpy(src_np.copy())
        kinds["torch"] = [src_t[i] for i in range(G * E)]
        kinds["dlpack"] = [DLPackOnly(t) for t in kinds["torch"]]
        res["dlpack_producer"] = "torch (CPU tensors)"
    except ImportError:
        kinds["dlpack"] = [DLPackOnly(a) for a in kinds["numpy"]]
        res["dlpack_producer"] = "numpy (torch not installed)"
    ctx = refit.Context(worker_id="zoo-table", journal_path="")
    try:
        m = ctx.create_model()
        for g in range(G):
            mod = "m%d" % g
            m.add_module(mod)
            m.bind_runtime(mod, "w", rt[g])
            for e in range(E):
                m.expect(mod, names[g * E + e], "f32", [R, C], expert=e)
        t0 = time.perf_counter()
        m.seal()
        res["seal_seconds"] = time.perf_counter() - t0
        per = {}
        for kind, vals in kinds.items():
            d = dict(zip(names, vals))

            def upd():
                txn = m.begin(version="t", rollback=False)
                txn.load_dict(d)
                txn.finalize()
            try:
                ms, _ = _host_timed(upd, args.repeat)
                ok = bool(np.array_equal(rt.reshape(G * E, R, C), src_np))
                rt[...] = 0
                per[kind] = {"load_dict_us_per_tensor": ms / (G * E) * 1e6,
                             "table_us_per_tensor": table_us(d), "verified": ok}
            except Exception as e:   # noqa: BLE001
                per[kind] = err(e)
        res["kinds"] = per
        base = per.get("torch", {}).get("load_dict_us_per_tensor")
        if base:
            for kind, r in per.items():
                if "load_dict_us_per_tensor" in r:
                    r["ratio_to_torch"] = r["load_dict_us_per_tensor"] / base
            res["worst_ratio_to_torch"] = max(r.get("ratio_to_torch", 0) for r in per.values())
        else:
            res["note"] = "no torch: ratios to torch not measured"
        m.destroy()
    finally:
        ctx.close()
    field, op, val = ROWS[row]["target"]
    res["target"] = "%s %s %g" % (field, op, val)
    res["met"] = field in res and res[field] <= val
    return res


def _host_timed(fn, repeat):
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out), out


# ---------------------------------------------------------------- main
def line(row, r):
    if "kinds" in r:
        return "zoo.%-26s %s  %s %s" % (row, "  ".join(
            "%s %.2f us" % (k, v["load_dict_us_per_tensor"]) for k, v in r["kinds"].items()
            if "load_dict_us_per_tensor" in v), r["target"], "met" if r["met"] else "NOT MET")
    if "not_built" in r:
        return "zoo.%-26s not built: %s" % (row, r["not_built"])
    if "cost_vs_full" in r:
        return ("zoo.%-26s %8.3f s  full %.3f s  cost_vs_full %.3f  peer %s  %s %s  "
                "%d elements %.2f GB  equal %s" % (
                    row, r["seconds"], r["full_seconds"], r["cost_vs_full"],
                    "%.3f s" % r["peer_seconds"] if "peer_seconds" in r else "-", r["target"],
                    "met" if r.get("met") else "NOT MET", r["elements"], r["bytes"] / 1e9,
                    r.get("delta_equals_full")))
    if "seconds" not in r:
        s = "zoo.%-26s %s" % (row, r.get("error", "no figure"))
        if "seconds_at_budget" in r:
            s += "; at a %d GiB staging budget %.3f s, cost_vs_bf16 %s" % (
                r["at_staging_budget"]["staging_budget"] >> 30, r["seconds_at_budget"],
                "%.3f" % r["cost_vs_bf16_at_budget"] if "cost_vs_bf16_at_budget" in r else "-")
        return s
    f = lambda k, fmt="%.3f": (fmt % r[k]) if isinstance(r.get(k), (int, float)) else "-"
    return ("zoo.%-26s %8.3f s  first %s  default %s / first %s  ratio %s  peer %s  seed %s  "
            "%s %s  %d tensors %.1f GB" % (
                row, r["seconds"], f("first_seconds"), f("default_seconds"),
                f("default_first_seconds"), f("ratio_to_ceiling"), f("peer_seconds"),
                f("seed_vllm_seconds"), r["target"], "met" if r.get("met") else "NOT MET",
                r["tensors"], r["bytes"] / 1e9))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layers", type=int, default=0,
                    help="layers of every model (default: all; 20 for 30B rows on a card "
                         "under 100 GB)")
    ap.add_argument("--dir", default=None, help="where the shards are written (default: "
                    "the temp dir)")
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--int4-layout", default="gptq", choices=("gptq", "u8"),
                    help="the INT4 experts' runtime layout (gptq: vLLM's WNA16 MoE)")
    ap.add_argument("--fallback-staging-gib", type=int, default=8,
                    help="online row: the budget tried when the default one is refused")
    ap.add_argument("--journal", default="", help="journal path (default: none)")
    ap.add_argument("--table-tensors", type=int, default=100000,
                    help="table_costs: tensors per load_dict (a multiple of 100)")
    ap.add_argument("--real-shapes", action="store_true",
                    help="with --tiny: the public configs' shapes on the host (use --layers)")
    ap.add_argument("--vocab", type=int, default=0,
                    help="override the vocabulary (host tests of real layer shapes)")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer's way (time)")
    ap.add_argument("--staging-budget", type=int, default=0,
                    help="refit_options.staging_budget in bytes (default 0: refit's 1 GiB)")
    ap.add_argument("--tiny", action="store_true",
                    help="host backend, numpy, tiny shapes: the same code path, no GPU")
    ap.add_argument("--torch-cpu", action="store_true",
                    help="with --tiny: torch CPU tensors instead of numpy (tests the torch "
                         "code where there is no GPU)")
    a = ap.parse_args()
    rows = [r for r in a.rows.split(",") if r]
    bad = set(rows) - set(ROWS)
    if bad:
        ap.error("unknown row(s): %s" % ", ".join(sorted(bad)))
    if a.torch_cpu and not a.tiny:
        ap.error("--torch-cpu goes with --tiny")
    a.mode = "torch-cpu" if a.torch_cpu else "numpy" if a.tiny else "torch"
    B = backend(a.mode)
    a.shard_bytes = int(a.shard_gb * 1e9) if not a.tiny else 256 << 10
    if a.tiny and a.table_tensors == 100000:
        a.table_tensors = 10000     # the 2-core host: seconds, not minutes
    a.ceiling_chunk = 4 * GiB if not a.tiny else 1 << 20
    cfgs = TINY if a.tiny and not a.real_shapes else CONFIGS
    total = B.device_total()
    out = {"bench": "zoo", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": B.device_name(), "device_total_bytes": total, "backend": B.name,
           "tiny": a.tiny, "refit_lib": getattr(_ffi.lib(), "_name", None),
           "repeat": a.repeat, "statistic": "median", "journal": bool(a.journal),
           "shard_bytes": a.shard_bytes, "argv": sys.argv[1:], "definitions": DEFINITIONS,
           "rows": {}}
    if a.tiny:
        out["note"] = ("--tiny: tiny shapes on the host, to test the code path; no timing, "
                       "ratio or `met` here means anything")
    if a.mode != "numpy":
        import torch
        out["torch"] = torch.__version__
        try:
            import safetensors
            out["safetensors"] = safetensors.__version__
        except ImportError:
            pass
    for row in rows:
        spec = ROWS[row]
        cfg = dict(cfgs[spec["model"]]) if spec["model"] else {"layers": 0, "experts": 0}
        if a.vocab and spec["model"]:
            cfg["vocab"] = a.vocab
        layers, cut = cfg["layers"], None
        if not spec["model"]:
            pass
        elif a.layers:
            layers, cut = min(a.layers, cfg["layers"]), "--layers %d" % a.layers
        elif cfg["experts"] and total is not None and total < 100e9:
            layers = 20
            cut = "first 20 of %d layers: the card has %.0f GB (< 100 GB)" % (
                cfg["layers"], total / 1e9)
        t0 = time.perf_counter()
        try:
            fn = {"files": row_files, "device": row_online, "ipc": row_ipc,
                  "table": row_table_costs, "delta": row_delta}[spec["source"]]
            r = fn(B, a, row, cfg, layers)
        except Exception as e:   # noqa: BLE001  (one row's failure is that row's result)
            import traceback
            traceback.print_exc()
            r = err(e)
        r.update(model=spec["model"], config=cfg, layers_used=layers, cut=cut,
                 row_wall_seconds=time.perf_counter() - t0)
        out["rows"][row] = r
        print(line(row, r), flush=True)
        B.empty_cache()
        with open(a.out, "w") as f:       # after every row: a crash keeps what ran
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
