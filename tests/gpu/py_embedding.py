"""docs/embedding.md, run: every `python run:NAME` block of the guide is
read out of the file and executed here against a transformers Llama on the
GPU. A vLLM-style engine model (fused qkv_proj and gate_up_proj, rank 1 of
TP 2, lm_head tied to the vocab-parallel embedding) is registered by the
guide's register_engine_model and loaded by the guide's vLLM worker
extension and SGLang handlers from save_pretrained checkpoints; every byte
is checked against the slices torch computes; a failed update is replayed
from its journal record. The guide's FP8 registration quantizes a BF16
weight online. The guide's RL loop trains a Llama and hands each step to a
second Llama, whose CUDA graph's logits then equal the trainer's."""
import os
import tempfile
import types

import torch

import refit
from embedding_doc import Skip, graphed
import embedding_doc

DEV = "cuda"
TP_RANK, TP = 1, 2


def guide(*names):
    """A namespace with the named blocks of the guide executed in order."""
    blocks = embedding_doc.blocks()
    mine = {n for n in blocks if not n.startswith(("moe", "delta"))}  # py_moe's, py_delta's
    assert mine == {"register", "fp8", "vllm", "sglang", "trainer"}, sorted(blocks)
    return embedding_doc.run(blocks, names, "embedding_guide")


def config(tied=True):
    try:
        from transformers import LlamaConfig
    except ImportError as e:
        raise Skip("transformers not installed: %s" % e)
    return LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=352,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=tied,
                       attn_implementation="sdpa")


def hf_model(cfg, seed):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(device=DEV, dtype=torch.bfloat16).eval()


class EngineLlama(torch.nn.Module):
    """The parameters of a vLLM Llama on one TP rank (no forward: the bytes
    are what is checked). lm_head is the embedding's Parameter (tied)."""

    def __init__(self, cfg, tp):
        super().__init__()
        hd = cfg.hidden_size // cfg.num_attention_heads
        q, kv, h, i = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd,
                       cfg.hidden_size, cfg.intermediate_size)
        P = lambda *s: torch.nn.Parameter(torch.zeros(*s, dtype=torch.bfloat16, device=DEV),  # noqa: E731
                                          requires_grad=False)
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Module()
        self.model.embed_tokens.weight = P(cfg.vocab_size // tp, h)
        self.model.layers = torch.nn.ModuleList()
        for _ in range(cfg.num_hidden_layers):
            L = torch.nn.Module()
            L.self_attn = torch.nn.Module()
            L.self_attn.qkv_proj = torch.nn.Module()
            L.self_attn.qkv_proj.weight = P((q + 2 * kv) // tp, h)
            L.self_attn.o_proj = torch.nn.Module()
            L.self_attn.o_proj.weight = P(h, q // tp)
            L.mlp = torch.nn.Module()
            L.mlp.gate_up_proj = torch.nn.Module()
            L.mlp.gate_up_proj.weight = P(2 * i // tp, h)
            L.mlp.down_proj = torch.nn.Module()
            L.mlp.down_proj.weight = P(h, i // tp)
            L.input_layernorm = torch.nn.Module()
            L.input_layernorm.weight = P(h)
            L.post_attention_layernorm = torch.nn.Module()
            L.post_attention_layernorm.weight = P(h)
            self.model.layers.append(L)
        self.model.norm = torch.nn.Module()
        self.model.norm.weight = P(h)
        self.lm_head = torch.nn.Module()
        self.lm_head.weight = self.model.embed_tokens.weight


def rank_slice(t, dim, rank, tp):
    n = t.shape[dim] // tp
    return t.narrow(dim, rank * n, n)


def expected_engine(sd, cfg, rank, tp):
    """What vLLM's weight loaders put in rank's parameters."""
    out = {"model.embed_tokens.weight": rank_slice(sd["model.embed_tokens.weight"], 0, rank, tp),
           "model.norm.weight": sd["model.norm.weight"]}
    for i in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % i
        out[p + "self_attn.qkv_proj.weight"] = torch.cat(
            [rank_slice(sd[p + "self_attn.%s_proj.weight" % x], 0, rank, tp) for x in "qkv"])
        out[p + "mlp.gate_up_proj.weight"] = torch.cat(
            [rank_slice(sd[p + "mlp.%s_proj.weight" % x], 0, rank, tp) for x in ("gate", "up")])
        out[p + "self_attn.o_proj.weight"] = rank_slice(sd[p + "self_attn.o_proj.weight"], 1,
                                                        rank, tp)
        out[p + "mlp.down_proj.weight"] = rank_slice(sd[p + "mlp.down_proj.weight"], 1, rank, tp)
        for n in ("input_layernorm", "post_attention_layernorm"):
            out[p + n + ".weight"] = sd[p + n + ".weight"]
    return out


def assert_engine_holds(engine, sd, cfg, what):
    params = dict(engine.named_parameters())
    want = expected_engine(sd, cfg, TP_RANK, TP)
    assert set(params) == set(want), sorted(set(params) ^ set(want))
    for n, w in want.items():
        assert torch.equal(params[n].view(torch.int16), w.contiguous().view(torch.int16)), \
            "%s: %s" % (what, n)
    assert engine.lm_head.weight.data_ptr() == engine.model.embed_tokens.weight.data_ptr()


def save(model, path):
    model.save_pretrained(path, safe_serialization=True)
    return path


def fake_vllm_worker(ns, engine, cfg):
    """What vLLM gives its workers, as the extension uses it."""
    cls = type("Worker", (ns["RefitWorkerExtension"],), {})
    w = cls()
    w.model_runner = types.SimpleNamespace(model=engine)
    w.model_config = types.SimpleNamespace(hf_config=cfg)
    w.parallel_config = types.SimpleNamespace(tensor_parallel_size=TP)
    w.rank = TP_RANK
    return w


def test_guide_vllm_extension_and_sglang_handlers():
    cfg = config(tied=True)
    ns = guide("register", "vllm", "sglang")
    engine = EngineLlama(cfg, TP)
    ptrs = {n: p.data_ptr() for n, p in engine.named_parameters()}
    with tempfile.TemporaryDirectory() as tmp:
        journal = os.path.join(tmp, "journal.db")
        m0, m1, m2 = hf_model(cfg, 0), hf_model(cfg, 1), hf_model(cfg, 2)
        sd = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in (m0, m1, m2)]
        w = fake_vllm_worker(ns, engine, cfg)
        r = w.refit_init(save(m0, os.path.join(tmp, "step-0")), journal)
        assert r["ok"] and r["version"] == "boot", r
        assert w.refit_ctx.health() == refit.Health.READY
        assert_engine_holds(engine, sd[0], cfg, "boot")
        r = w.refit_update(save(m1, os.path.join(tmp, "step-1")), "step-1")
        assert r["ok"] and r["version"] == "step-1", r
        assert_engine_holds(engine, sd[1], cfg, "step-1")

        # a checkpoint cut short: refused, rolled back, and replayed once whole
        bad = save(m2, os.path.join(tmp, "step-2"))
        from safetensors.torch import load_file, save_file
        f = os.path.join(bad, "model.safetensors")
        full = load_file(f)
        save_file({k: v for k, v in full.items() if "layers.1.mlp.up_proj" not in k}, f,
                  metadata={"format": "pt"})
        r = w.refit_update(bad, "step-2")
        assert not r["ok"] and r["serving"] == "step-1" and "REFIT_EINCOMPLETE" in r["error"], r
        assert_engine_holds(engine, sd[1], cfg, "after a refused update")
        save_file(full, f, metadata={"format": "pt"})  # the file, written again whole
        try:
            w.refit_replay(r["update_id"])
            raise AssertionError("a replay from a file that changed went through")
        except refit.RefitError as e:
            assert e.name == "REFIT_ECORRUPT" and "changed" in e.message, e
        os.rename(bad, bad + ".old")
        save(m2, bad)
        r2 = w.refit_update(bad, "step-2")
        assert r2["ok"], r2
        assert_engine_holds(engine, sd[2], cfg, "step-2")

        # SGLang's handlers, bound to a runner that holds the same refit model
        runner = types.SimpleNamespace(refit_model=w.refit_model, refit_ctx=w.refit_ctx)
        ok, msg = ns["update_weights_from_disk"](runner, os.path.join(tmp, "step-0"),
                                                 version="step-0")
        assert ok and msg == "serving step-0", msg
        assert_engine_holds(engine, sd[0], cfg, "from disk")
        ok, msg = ns["update_weights_from_tensor"](runner, list(sd[1].items()), version="t1")
        assert ok and msg == "serving t1", msg
        assert_engine_holds(engine, sd[1], cfg, "from tensors")
        broken = dict(sd[2])
        broken["model.norm.weight"] = broken["model.norm.weight"][:-1]
        ok, msg = ns["update_weights_from_tensor"](runner, list(broken.items()), version="t2")
        assert not ok and "REFIT_EMISMATCH" in msg and "still serving t1" in msg, msg
        assert_engine_holds(engine, sd[1], cfg, "after a refused tensor update")
    assert ptrs == {n: p.data_ptr() for n, p in engine.named_parameters()}
    w.refit_model.destroy()
    w.refit_ctx.close()


def test_guide_fp8_registration():
    if not hasattr(torch, "float8_e4m3fn"):
        raise Skip("this torch has no float8_e4m3fn")
    ns = guide("register", "fp8")
    n, k = 96, 128
    weight = torch.zeros(n, k, dtype=torch.float8_e4m3fn, device=DEV)
    scale = torch.zeros(n, 1, dtype=torch.float32, device=DEV)
    ctx = refit.Context(worker_id="fp8-guide", journal_path="")
    rm = ctx.create_model()
    ns["register_fp8_linear"](rm, "down", weight, scale, "down_proj.weight", (n, k))
    rm.seal()
    g = torch.Generator(device=DEV).manual_seed(3)
    w = torch.randn(n, k, generator=g, device=DEV).to(torch.bfloat16)
    with rm.update(version="fp8-1") as txn:
        txn.load("down_proj.weight", w)
    x = w.float()
    want_scale = torch.div(x.abs().amax(dim=1, keepdim=True), torch.full((n, 1), 448.0,
                                                                         device=DEV))
    assert torch.equal(scale, want_scale), (scale - want_scale).abs().max()
    want = torch.div(x, want_scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    assert torch.equal(weight.view(torch.uint8), want.view(torch.uint8))
    rm.destroy()
    ctx.close()


def test_guide_rl_loop():
    cfg = config(tied=False)
    ns = guide("trainer")
    policy = hf_model(cfg, 10)
    engine = hf_model(cfg, 11)
    ctx = refit.Context(worker_id="rl-engine", journal_path="")
    rm = ctx.create_model()
    refit.register_module(rm, engine)
    rm.seal()
    ids = torch.randint(0, cfg.vocab_size, (2, 32), device=DEV,
                        generator=torch.Generator(device=DEV).manual_seed(4))
    # the engine serves from a CUDA graph captured once, before any update
    generate = graphed(engine, ids)

    opt = torch.optim.SGD(policy.parameters(), lr=1e-2)

    def train_step(model, step):
        model.train()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.eval()

    outs = ns["rl_loop"](policy, rm, generate, train_step, steps=3)
    assert ctx.version == "step-3" and ctx.health() == refit.Health.READY
    pe, pp = dict(engine.named_parameters()), dict(policy.named_parameters())
    for n, p in pp.items():
        assert torch.equal(pe[n].view(torch.int16), p.detach().view(torch.int16)), n
    with torch.no_grad():
        ref = policy(input_ids=ids, use_cache=False).logits
    if not torch.equal(outs[-1], ref):  # eager and graphed forwards may pick other kernels
        ref = graphed(policy, ids)()
    assert torch.equal(outs[-1], ref), (outs[-1].float() - ref.float()).abs().max()
    assert not torch.equal(outs[0], outs[-1])
    rm.destroy()
    ctx.close()
