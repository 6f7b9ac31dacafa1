"""Expected runtime tensors of one TP rank of the Llama fixture, computed
with safetensors + numpy alone, for test_llama_fixture.c to compare with.

usage: llama_expected.py CHECKPOINT_DIR CONFIG TP RANK OUT.safetensors
Writes one tensor per runtime tensor, named "<module>/<runtime>", as raw
bf16 bits (U16) so nothing is converted on the way.
"""
import json
import os
import sys

import ml_dtypes  # noqa: F401  (lets numpy name bfloat16)
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file


def load_all(ckpt):
    index = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))
    out = {}
    for name, shard in index["weight_map"].items():
        with safe_open(os.path.join(ckpt, shard), framework="numpy") as f:
            out[name] = f.get_tensor(name).view(np.uint16)
    return out


def rows(t, tp, rank, dim=0):
    n = t.shape[dim] // tp
    return np.take(t, range(rank * n, (rank + 1) * n), axis=dim)


def padded_rows(t, tp, rank, unit=64):
    step = unit * tp
    pad = -(-t.shape[0] // step) * step
    full = np.zeros((pad,) + t.shape[1:], dtype=t.dtype)
    full[: t.shape[0]] = t
    return rows(full, tp, rank)


def main():
    ckpt, config, tp, rank, out = sys.argv[1:6]
    tp, rank = int(tp), int(rank)
    cfg = json.load(open(config))
    w = load_all(ckpt)
    exp = {"embed/table": padded_rows(w["model.embed_tokens.weight"], tp, rank),
           "norm/weight": w["model.norm.weight"]}
    if not cfg.get("tie_word_embeddings"):
        exp["lm_head/weight"] = padded_rows(w["lm_head.weight"], tp, rank)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        exp[f"layers.{l}.attn/qkv"] = np.concatenate(
            [rows(w[a + x + "_proj.weight"], tp, rank) for x in "qkv"])
        exp[f"layers.{l}.attn/o"] = rows(w[a + "o_proj.weight"], tp, rank, dim=1)
        exp[f"layers.{l}.mlp/gate_up"] = np.concatenate(
            [rows(w[p + "mlp.gate_proj.weight"], tp, rank),
             rows(w[p + "mlp.up_proj.weight"], tp, rank)])
        exp[f"layers.{l}.mlp/down"] = rows(w[p + "mlp.down_proj.weight"], tp, rank, dim=1)
        exp[f"layers.{l}.norms/input"] = w[p + "input_layernorm.weight"]
        exp[f"layers.{l}.norms/post_attention"] = w[p + "post_attention_layernorm.weight"]
    save_file({k: np.ascontiguousarray(v) for k, v in exp.items()}, out)


if __name__ == "__main__":
    main()
