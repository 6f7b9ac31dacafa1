"""End to end on a transformers LlamaForCausalLM (random init, BF16, GPU):
a CUDA graph of a forward pass is captured once; new weights written with
save_pretrained are reloaded through refit, from the safetensors directory
(sharded, with an index) and from in-memory tensors; replaying the same
graph gives logits equal, bit for bit, to a fresh model loaded from the same
weights; no parameter's data_ptr moves; an aborted update with rollback
(whole, or half-way) leaves the previous logits exactly."""
import os
import tempfile

import torch

import refit

DEV = "cuda"


class Skip(Exception):
    pass


def config():
    try:
        from transformers import LlamaConfig
    except ImportError as e:
        raise Skip("transformers not installed: %s" % e)
    return LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=704,
                       num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4,
                       max_position_embeddings=128, tie_word_embeddings=False,
                       attn_implementation="sdpa")


def fresh(cfg, seed):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(device=DEV, dtype=torch.bfloat16).eval()


def logits_eager(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.clone()


class Graphed:
    """A CUDA graph of model(ids).logits, captured once."""

    def __init__(self, model, ids):
        self.ids = ids
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(2):
                model(input_ids=ids, use_cache=False)
        torch.cuda.current_stream().wait_stream(s)
        self.g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.g), torch.no_grad():
            self.out = model(input_ids=ids, use_cache=False).logits

    def __call__(self):
        self.g.replay()
        torch.cuda.synchronize()
        return self.out.clone()


def same_as(out, model, ids, what):
    """Bit-equal to a fresh model's logits (eager, else its own graph: the
    two paths may pick different kernels, the weights are what we check)."""
    ref = logits_eager(model, ids)
    if torch.equal(out, ref):
        return
    ref_g = Graphed(model, ids)()
    assert torch.equal(out, ref_g), "%s: logits differ (max |d| %g)" % (
        what, (out.float() - ref_g.float()).abs().max().item())


def params_equal(a, b, what):
    sa, sb = dict(a.named_parameters()), dict(b.named_parameters())
    for n, p in sa.items():
        assert torch.equal(p.view(torch.int16), sb[n].view(torch.int16)), "%s: %s" % (what, n)


def test_llama_graph_survives_reloads():
    cfg = config()
    model = fresh(cfg, 0)
    ids = torch.randint(0, cfg.vocab_size, (2, 48), device=DEV,
                        generator=torch.Generator(device=DEV).manual_seed(5))
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}

    ctx = refit.Context(worker_id="llama-e2e")
    rm = ctx.create_model()
    names = refit.register_module(rm, model)
    assert len(names) == len(list(model.parameters())), len(names)
    rm.seal()
    # cold start: the weights the model already holds
    with rm.update(version="init") as txn:
        txn.load_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    assert ctx.health() == refit.Health.READY
    graph = Graphed(model, ids)
    before = graph()

    with tempfile.TemporaryDirectory() as tmp:
        # B: a sharded safetensors directory written by save_pretrained
        mb = fresh(cfg, 1)
        try:
            mb.save_pretrained(os.path.join(tmp, "b"), safe_serialization=True,
                               max_shard_size="2MB")
        except TypeError:  # transformers without the option: always safetensors
            mb.save_pretrained(os.path.join(tmp, "b"), max_shard_size="2MB")
        assert os.path.exists(os.path.join(tmp, "b", "model.safetensors.index.json"))
        with rm.update(version="b", source_uri="file://" + tmp) as txn:
            txn.load_safetensors(os.path.join(tmp, "b"), strict=False)
        out_b = graph()
        # a fresh model, built as the served one was, loaded from that directory
        from safetensors.torch import load_file
        ref_b = fresh(cfg, 99)
        state = {}
        for f in sorted(os.listdir(os.path.join(tmp, "b"))):
            if f.endswith(".safetensors"):
                state.update(load_file(os.path.join(tmp, "b", f), device=DEV))
        ref_b.load_state_dict(state, strict=True)
        params_equal(model, ref_b, "from safetensors")
        same_as(out_b, ref_b, ids, "from safetensors")
        assert not torch.equal(out_b, before)

        # C: in-memory tensors on the GPU
        mc = fresh(cfg, 2)
        with rm.update(version="c") as txn:
            txn.load_dict({k: v.detach().clone() for k, v in mc.state_dict().items()})
        out_c = graph()
        params_equal(model, mc, "from memory")
        same_as(out_c, mc, ids, "from memory")

        # D, aborted whole and half-way, with rollback: C's logits exactly
        md = fresh(cfg, 3)
        sd = {k: v.detach().clone() for k, v in md.state_dict().items()}
        txn = rm.begin(version="d", rollback=True)
        txn.load_dict(sd)
        assert txn.abort()
        assert torch.equal(graph(), out_c)
        # half the tensors, and the first rows of one more: that module is
        # partly delivered, so finalize refuses and rolls everything back
        txn = rm.begin(version="d2", rollback=True)
        items = list(sd.items())
        for k, v in items[0::2]:
            txn.load(k, v)
        k, v = items[1]
        txn.load_part(k, 0, v[: v.shape[0] // 2])
        try:
            txn.finalize()
            raise AssertionError("a half update committed")
        except refit.RefitError as e:
            assert e.name == "REFIT_EINCOMPLETE", e
        assert ctx.health() == refit.Health.READY and ctx.version == "c"
        assert torch.equal(graph(), out_c)
        params_equal(model, mc, "after rollbacks")

    assert ptrs == {n: p.data_ptr() for n, p in model.named_parameters()}
    rm.destroy()
    ctx.close()
