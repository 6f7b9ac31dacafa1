"""docs/embedding.md's MoE section, run: its `python run:moe_*` blocks are
read out of the guide and executed here against transformers 5 MoE models
on the GPU (Qwen3MoeForCausalLM with a dense mlp_only_layer, Mixtral,
whose checkpoints name block_sparse_moe.experts.E.w1/w2/w3, and
Qwen2MoeForCausalLM with its shared expert), small configs, random weights
written by save_pretrained. A reload equals a cold start (from_pretrained)
of the new checkpoint parameter for parameter and logit for logit; a CUDA
graph captured before the update replays the new weights with no data_ptr
moved; a missing expert and a wrong-shaped one are refused with bytes,
version and health unchanged. A vLLM-style FusedMoE stand-in (plain
parameters w13_weight / w2_weight, expert-parallel rank 1 of 2) loaded from
the per-expert checkpoint equals torch's own slicing.

Run by tests/gpu/run_py.py (run_all.sh). REFIT_TEST_DEVICE=cpu runs the
same checks but the graph on the CPU (host backend), for a machine without
a GPU: python3 tests/gpu/py_moe.py."""
import os
import re
import sys
import tempfile

import torch

DEV = os.environ.get("REFIT_TEST_DEVICE", "cuda")
ROOT = os.environ.get("REFIT_SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import refit  # noqa: E402
from embedding_doc import Skip, graphed  # noqa: E402
import embedding_doc  # noqa: E402


def guide(*names):
    blocks = embedding_doc.blocks()
    mine = {n: b for n, b in blocks.items() if n.startswith("moe")}
    assert set(mine) == {"moe_hf", "moe_vllm"}, sorted(mine)
    return embedding_doc.run(mine, names, "embedding_guide_moe")


def transformers():
    try:
        import transformers as tf
    except ImportError as e:
        raise Skip("transformers not installed: %s" % e)
    if int(tf.__version__.split(".")[0]) < 5:
        raise Skip("transformers %s: stacked experts came with 5" % tf.__version__)
    return tf


# batched_mm: the experts' forward with no host sync, so a CUDA graph holds it
IMPL = "batched_mm"


def configs():
    tf = transformers()
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, num_experts_per_tok=2,
                  tie_word_embeddings=False, attn_implementation="sdpa",
                  experts_implementation=IMPL)
    return {
        "qwen3_moe": (tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig(
            intermediate_size=96, moe_intermediate_size=32, num_experts=4, head_dim=16,
            mlp_only_layers=[0], decoder_sparse_step=1, **common)),
        "mixtral": (tf.MixtralForCausalLM, tf.MixtralConfig(
            intermediate_size=32, num_local_experts=4, **common)),
        "qwen2_moe": (tf.Qwen2MoeForCausalLM, tf.Qwen2MoeConfig(
            intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            num_experts=4, mlp_only_layers=[0], **common)),
    }


def build(cls, cfg, seed):
    torch.manual_seed(seed)
    return cls(cfg).to(device=DEV, dtype=torch.bfloat16).eval()


def save(model, path):
    model.save_pretrained(path)
    return path


def state(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def assert_same_state(got, want, what):
    assert set(got) == set(want), (what, sorted(set(got) ^ set(want)))
    for n, w in want.items():
        g = got[n]
        assert g.dtype == w.dtype and g.shape == w.shape, (what, n, g.shape, w.shape)
        assert torch.equal(g.view(torch.uint8) if g.is_floating_point() else g,
                           w.view(torch.uint8) if w.is_floating_point() else w), (what, n)


def ids_for(cfg):
    g = torch.Generator(device=DEV).manual_seed(4)
    return torch.randint(0, cfg.vocab_size, (2, 16), device=DEV, generator=g)


def ptrs(model):
    return {n: t.data_ptr() for n, t in model.state_dict().items()}


def expert_tensor(ckpt_dir):
    """The checkpoint's file and the name of expert 2's up projection of the
    last layer (Mixtral: w3)."""
    from safetensors import safe_open
    f = os.path.join(ckpt_dir, "model.safetensors")
    with safe_open(f, "pt") as s:
        names = list(s.keys())
    ups = [n for n in names if re.search(r"layers\.1\.\w+\.experts\.2\.(up_proj|w3)\.weight$", n)]
    assert len(ups) == 1, ups
    return f, ups[0]


def refused(reload, rm, ctx, m, path, status, *words):
    """An update from path (the guide's reload) is refused with status,
    naming words; the worker keeps its bytes, version and health."""
    before, fp, version = state(m), rm.fingerprint(), ctx.version
    try:
        reload(rm, path, "bad")
        raise AssertionError("an update from %s went through" % path)
    except refit.RefitError as e:
        assert e.name == status, e
        for w in words:
            assert w in e.message, (w, e.message)
    assert_same_state(state(m), before, "after a refused update")
    assert rm.fingerprint() == fp and ctx.version == version
    assert ctx.health() == refit.Health.READY


def cold_start(cls, path):
    """What an engine loads: from_pretrained (the rotary tables stay f32)."""
    return cls.from_pretrained(path, dtype=torch.bfloat16, experts_implementation=IMPL).to(
        DEV).eval()


def check_family(kind):
    cls, cfg = configs()[kind]
    ns = guide("moe_hf")
    reload = ns["reload"]
    ids = ids_for(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        engine = cold_start(cls, save(build(cls, cfg, 0), os.path.join(tmp, "step-0")))
        ctx, rm = ns["register_moe_model"](engine, worker_id="moe-" + kind)
        assert any(re.search(r"\.experts\.\d+\.", n) for n in rm.expected), "no per-expert name"
        # the engine serves from a CUDA graph captured once, before any update
        replay = graphed(engine, ids) if DEV == "cuda" else None
        out_before = replay() if replay else None
        before = ptrs(engine)
        trained = build(cls, cfg, 1)
        step1 = save(trained, os.path.join(tmp, "step-1"))
        reload(rm, step1, "step-1")
        assert ctx.version == "step-1" and ctx.health() == refit.Health.READY
        cold = cold_start(cls, step1)
        assert_same_state(state(engine), state(cold), kind + ": reload against a cold start")
        assert_same_state(state(engine), state(trained), kind + ": reload against the trainer")
        with torch.no_grad():
            got = engine(input_ids=ids, use_cache=False).logits
            want = cold(input_ids=ids, use_cache=False).logits
        assert torch.equal(got, want), (kind, (got.float() - want.float()).abs().max())
        if replay is not None:
            out = replay()
            ref = graphed(cold, ids)()
            assert torch.equal(out, ref), (kind, (out.float() - ref.float()).abs().max())
            assert not torch.equal(out, out_before), kind + ": the graph saw no update"
        assert ptrs(engine) == before, kind + ": a data_ptr moved"

        # a missing expert, a wrong-shaped expert: refused, nothing changes
        from safetensors.torch import load_file, save_file
        bad = save(build(cls, cfg, 2), os.path.join(tmp, "step-2"))
        f, up = expert_tensor(bad)
        full = load_file(f)
        save_file({k: v for k, v in full.items() if k != up}, f, metadata={"format": "pt"})
        refused(reload, rm, ctx, engine, bad, "REFIT_EINCOMPLETE", up, "layers.1", "experts.2")
        wrong = dict(full)
        wrong[up] = torch.zeros(full[up].shape[0] + 1, full[up].shape[1], dtype=full[up].dtype)
        save_file(wrong, f, metadata={"format": "pt"})
        refused(reload, rm, ctx, engine, bad, "REFIT_EMISMATCH", up)
        assert ptrs(engine) == before
    rm.destroy()
    ctx.close()


def test_moe_qwen3_reload_equals_cold_start():
    check_family("qwen3_moe")


def test_moe_mixtral_reload_equals_cold_start():
    check_family("mixtral")


def test_moe_qwen2_shared_expert_reload_equals_cold_start():
    check_family("qwen2_moe")


class FusedMoEStandIn(torch.nn.Module):
    """A vLLM model's MoE parameters on one expert-parallel rank: the router
    and FusedMoE's w13_weight [E_local, 2I, H], w2_weight [E_local, H, I]
    (no forward: the bytes are what is checked)."""

    def __init__(self, cfg, layers, e_local):
        super().__init__()
        h, i = cfg.hidden_size, cfg.moe_intermediate_size
        P = lambda *s: torch.nn.Parameter(torch.zeros(*s, dtype=torch.bfloat16, device=DEV),  # noqa: E731
                                          requires_grad=False)
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList()
        for L in range(cfg.num_hidden_layers):
            layer = torch.nn.Module()
            if L in layers:
                layer.mlp = torch.nn.Module()
                layer.mlp.gate = torch.nn.Module()
                layer.mlp.gate.weight = P(cfg.num_experts, h)
                layer.mlp.experts = torch.nn.Module()
                layer.mlp.experts.w13_weight = P(e_local, 2 * i, h)
                layer.mlp.experts.w2_weight = P(e_local, h, i)
            self.model.layers.append(layer)


def test_moe_vllm_fused_moe_expert_parallel():
    ns = guide("moe_hf", "moe_vllm")
    cls, cfg = configs()["qwen3_moe"]
    E, ep_rank, ep_size = cfg.num_experts, 1, 2
    lo, hi = 2, 4                       # vLLM's linear placement: rank 1 of 2 holds [2, 4)
    engine = FusedMoEStandIn(cfg, [1], hi - lo)
    ctx, rm = ns["register_fused_moe"](engine, E, ep_rank, ep_size)
    assert len(rm.foreign) == 3 * (E - (hi - lo)), sorted(rm.foreign)
    before = ptrs(engine)
    with tempfile.TemporaryDirectory() as tmp:
        for step in (1, 2):
            trained = build(cls, cfg, 10 + step)
            path = save(trained, os.path.join(tmp, "step-%d" % step))
            with rm.update(version="step-%d" % step) as txn:
                txn.load_safetensors(path, strict=False)   # attention etc.: not this stand-in's
            sd = trained.state_dict()
            a = "model.layers.1.mlp."
            gate_up, down = sd[a + "experts.gate_up_proj"], sd[a + "experts.down_proj"]
            w13 = engine.model.layers[1].mlp.experts.w13_weight
            w2 = engine.model.layers[1].mlp.experts.w2_weight
            assert torch.equal(w13.view(torch.int16), gate_up[lo:hi].view(torch.int16))
            assert torch.equal(w2.view(torch.int16), down[lo:hi].view(torch.int16))
            assert torch.equal(engine.model.layers[1].mlp.gate.weight, sd[a + "gate.weight"])
            # torch's own slicing of the per-expert checkpoint, as vLLM's loader does
            from safetensors.torch import load_file
            ck = load_file(os.path.join(path, "model.safetensors"), device=str(DEV))
            for s, g in enumerate(range(lo, hi)):
                p = a + "experts.%d." % g
                want = torch.cat([ck[p + "gate_proj.weight"], ck[p + "up_proj.weight"]])
                assert torch.equal(w13[s], want), g
                assert torch.equal(w2[s], ck[p + "down_proj.weight"]), g
    assert ptrs(engine) == before
    rm.destroy()
    ctx.close()


if __name__ == "__main__":
    import traceback
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    print("1..%d" % len(tests), flush=True)
    bad = 0
    for i, (name, fn) in enumerate(tests, 1):
        try:
            fn()
        except Skip as e:
            print("ok %d - %s # SKIP %s" % (i, name, e), flush=True)
            continue
        except Exception:
            bad += 1
            print("not ok %d - %s" % (i, name))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
            continue
        print("ok %d - %s" % (i, name), flush=True)
    sys.exit(1 if bad else 0)
