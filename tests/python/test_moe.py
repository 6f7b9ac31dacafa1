"""Stacked experts (refit.moe, refit.register_module) on the host backend,
numpy stand-ins, no torch, no GPU (TAP; every function test_* is one test
point). The model is Qwen3-MoE-shaped: two layers, layer 0 dense (an
mlp_only_layer), layer 1 MoE with 4 experts, its router and a shared
expert, in transformers 5's live layout (experts.gate_up_proj [E, 2I, H],
experts.down_proj [E, H, I]) and in vLLM FusedMoE's (w13_weight, w2_weight,
expert parallelism, TP of the intermediate dim, block FP8 scales).

usage: test_moe.py   (env: REFIT_LIB, the build's librefit.so;
REFIT_SOURCE_ROOT, the checkout)"""
import os
import sys
import tempfile
import types

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import refit  # noqa: E402
from refit import moe  # noqa: E402
import harness  # noqa: E402  (tests/python/harness.py)
from harness import raises  # noqa: E402

TMP = tempfile.mkdtemp(prefix="refit-moe-")
V, H, I_DENSE, I, E, I_SHARED = 32, 16, 24, 8, 4, 12


class P(np.ndarray):
    """A numpy array with torch's detach(), as register_module reads it."""

    def detach(self):
        return self


class NpModule:
    """The torch.nn.Module calls register_module makes, over numpy arrays."""

    def __init__(self, params, model_type=None):
        self.params = {n: np.zeros(s, dt).view(P) for n, (s, dt) in params.items()}
        if model_type:
            self.config = types.SimpleNamespace(model_type=model_type)

    def named_parameters(self, prefix="", remove_duplicate=False):
        return [((prefix + "." if prefix else "") + n, t) for n, t in self.params.items()]

    def named_buffers(self, prefix="", remove_duplicate=False):
        return []

    def state_dict(self, keep_vars=True):
        return dict(self.params)

    def __getitem__(self, name):
        return self.params[name]

    def snapshot(self):
        return {n: t.copy() for n, t in self.params.items()}

    def same(self, snap):
        return all(np.array_equal(self.params[n], v) for n, v in snap.items())


F32 = np.float32


def hf_params(mixtral=False):
    """transformers 5's live parameters of the tiny Qwen3-MoE (Mixtral:
    every layer MoE would be real; the names are what matters here)."""
    mlp = "mlp"
    p = {"model.embed_tokens.weight": ((V, H), F32), "model.norm.weight": ((H,), F32),
         "lm_head.weight": ((V, H), F32)}
    for L in (0, 1):
        a = "model.layers.%d." % L
        for n, s in (("q_proj", (H, H)), ("k_proj", (H // 2, H)), ("v_proj", (H // 2, H)),
                     ("o_proj", (H, H))):
            p[a + "self_attn.%s.weight" % n] = (s, F32)
        p[a + "input_layernorm.weight"] = ((H,), F32)
        p[a + "post_attention_layernorm.weight"] = ((H,), F32)
    a = "model.layers.0.%s." % mlp
    p[a + "gate_proj.weight"] = ((I_DENSE, H), F32)
    p[a + "up_proj.weight"] = ((I_DENSE, H), F32)
    p[a + "down_proj.weight"] = ((H, I_DENSE), F32)
    a = "model.layers.1.%s." % mlp
    p[a + "gate.weight"] = ((E, H), F32)
    p[a + "experts.gate_up_proj"] = ((E, 2 * I, H), F32)
    p[a + "experts.down_proj"] = ((E, H, I), F32)
    if not mixtral:
        for n, s in (("gate_proj", (I_SHARED, H)), ("up_proj", (I_SHARED, H)),
                     ("down_proj", (H, I_SHARED))):
            p[a + "shared_expert.%s.weight" % n] = (s, F32)
        p[a + "shared_expert_gate.weight"] = ((1, H), F32)
    return p


def checkpoint(seed, mixtral=False):
    """The hub layout save_pretrained writes: one tensor per expert."""
    r = np.random.default_rng(seed)
    out = {}
    for n, (s, dt) in hf_params(mixtral).items():
        if ".experts." in n:
            continue
        if mixtral:
            n = n.replace(".mlp.", ".block_sparse_moe.")
        out[n] = r.standard_normal(s).astype(dt)
    blk = "block_sparse_moe" if mixtral else "mlp"
    g, u, d = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for e in range(E):
        a = "model.layers.1.%s.experts.%d." % (blk, e)
        out[a + g + ".weight"] = r.standard_normal((I, H)).astype(F32)
        out[a + u + ".weight"] = r.standard_normal((I, H)).astype(F32)
        out[a + d + ".weight"] = r.standard_normal((H, I)).astype(F32)
    return out


def stacked(ck, names=("gate_proj", "up_proj", "down_proj"), blk="mlp", experts=range(E)):
    """numpy's stacking of the per-expert checkpoint: transformers' layout."""
    a = "model.layers.1.%s.experts." % blk
    g, u, d = names
    gate_up = np.stack([np.concatenate([ck[a + "%d.%s.weight" % (e, g)],
                                        ck[a + "%d.%s.weight" % (e, u)]]) for e in experts])
    down = np.stack([ck[a + "%d.%s.weight" % (e, d)] for e in experts])
    return gate_up, down


def world(worker="moe-test"):
    ctx = refit.Context(worker_id=worker, journal_path="")
    return ctx, ctx.create_model()


def assert_hf_holds(m, ck, mixtral=False):
    gu, dn = stacked(ck, ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj"),
                     "block_sparse_moe" if mixtral else "mlp")
    assert np.array_equal(m["model.layers.1.mlp.experts.gate_up_proj"], gu), "gate_up_proj"
    assert np.array_equal(m["model.layers.1.mlp.experts.down_proj"], dn), "down_proj"
    for n in m.params:
        if ".experts." in n:
            continue
        c = n.replace(".mlp.", ".block_sparse_moe.") if mixtral else n
        assert np.array_equal(m[n], ck[c]), n


def hf_world(mixtral=False, **kw):
    m = NpModule(hf_params(mixtral), "mixtral" if mixtral else "qwen3_moe")
    ctx, rm = world()
    names = refit.register_module(rm, m, **kw)
    rm.seal()
    return m, ctx, rm, names


def write(ck, name):
    path = os.path.join(TMP, name)
    save_file({k: np.ascontiguousarray(v) for k, v in ck.items()}, path)
    return path


# ---- transformers 5 layout ---------------------------------------------------

def test_per_expert_checkpoint_fills_the_stacks():
    m, ctx, rm, names = hf_world()
    ck = checkpoint(1)
    assert set(names) == set(ck), sorted(set(names) ^ set(ck))
    # one module per stacked parameter (all experts), one per ordinary parameter
    assert names["model.layers.1.mlp.experts.2.up_proj.weight"] == \
        "model.layers.1.mlp.experts.gate_up_proj"
    assert rm.stats()["modules"] == len(m.params), rm.stats()
    with rm.update(version="v1") as txn:
        txn.load_dict(ck)
    assert_hf_holds(m, ck)
    ck2 = checkpoint(2)
    with rm.update(version="v2") as txn:
        txn.load_safetensors(write(ck2, "hf-v2.safetensors"))
    assert_hf_holds(m, ck2)
    assert ctx.version == "v2" and ctx.health() == refit.Health.READY
    ctx.close()


def test_mixtral_names_as_save_pretrained_writes_them():
    m, ctx, rm, names = hf_world(mixtral=True)
    ck = checkpoint(3, mixtral=True)
    assert set(names) == set(ck), sorted(set(names) ^ set(ck))
    assert "model.layers.1.block_sparse_moe.gate.weight" in names
    with rm.update(version="v1") as txn:
        txn.load_safetensors(write(ck, "mixtral.safetensors"))
    assert_hf_holds(m, ck, mixtral=True)
    ctx.close()


def test_already_stacked_checkpoint():
    m, ctx, rm, names = hf_world(expert_ckpt="stacked")
    ck = checkpoint(4)
    gu, dn = stacked(ck)
    whole = {k: v for k, v in ck.items() if ".experts." not in k}
    whole["model.layers.1.mlp.experts.gate_up_proj"] = gu
    whole["model.layers.1.mlp.experts.down_proj"] = dn
    assert set(names) == set(whole), sorted(set(names) ^ set(whole))
    with rm.update(version="v1") as txn:
        txn.load_dict(whole)
    assert_hf_holds(m, ck)
    ctx.close()
    # a stacked state dict (a transformers 5 trainer's) into a per-expert
    # registration: per-expert views of the stacks, no copy
    m, ctx, rm, _ = hf_world()
    views = moe.per_expert(whole)
    assert set(views) == set(ck), sorted(set(views) ^ set(ck))
    assert np.shares_memory(views["model.layers.1.mlp.experts.3.up_proj.weight"], gu)
    with rm.update(version="v1") as txn:
        txn.load_dict(views)
    assert_hf_holds(m, ck)
    ctx.close()


def test_low_level_register_experts_numpy_and_dlpack():
    gate_up = np.zeros((E, 2 * I, H), F32)
    down = np.zeros((E, H, I), F32)
    ctx, rm = world()
    a = "layers.7.experts.{e}."
    names = refit.register_experts(rm, "gate_up", gate_up, [(a + "gate.weight", I),
                                                             (a + "up.weight", I)])
    names.update(refit.register_experts(rm, "down", down, [(a + "down.weight", None)]))
    assert len(names) == 3 * E and set(names.values()) == {"gate_up", "down"}
    rm.seal()
    r = np.random.default_rng(5)
    ck = {a.format(e=e) + p: r.standard_normal(s).astype(F32) for e in range(E)
          for p, s in (("gate.weight", (I, H)), ("up.weight", (I, H)), ("down.weight", (H, I)))}

    class DLPackOnly:
        def __init__(self, x):
            self.x = x

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

        def __dlpack__(self, stream=None, max_version=None, **kw):
            return self.x.__dlpack__(max_version=max_version)
    with rm.update(version="v1") as txn:
        txn.load_dict({k: DLPackOnly(v) if "up." in k else v for k, v in ck.items()})
    for e in range(E):
        p = a.format(e=e)
        assert np.array_equal(gate_up[e], np.concatenate([ck[p + "gate.weight"],
                                                          ck[p + "up.weight"]])), e
        assert np.array_equal(down[e], ck[p + "down.weight"]), e
    ctx.close()


def refused_from_dict_and_file(ck, bad, file_name, status, name, *words):
    """A model loaded from ck (v1), updated to v2 from bad, as a dict and
    then as the safetensors file file_name: both refused with status
    naming name (the dict's error every word too); the bytes, version and
    health stay v1's (and, after the dict, the fingerprint)."""
    m, ctx, rm, _ = hf_world()
    with rm.update(version="v1") as txn:
        txn.load_dict(ck)
    snap, fp = m.snapshot(), rm.fingerprint()

    def update():
        with rm.update(version="v2") as txn:
            txn.load_dict(bad)
    raises(status, update, name, *words)
    assert m.same(snap) and rm.fingerprint() == fp
    assert ctx.version == "v1" and ctx.health() == refit.Health.READY
    # from a file: the tensors before the bad one were written, then rolled back
    path = write(bad, file_name)

    def update_file():
        with rm.update(version="v2") as txn:
            txn.load_safetensors(path)
    raises(status, update_file, name)
    assert m.same(snap) and ctx.version == "v1" and ctx.health() == refit.Health.READY
    ctx.close()


def test_missing_expert_refused_naming_layer_and_expert():
    ck, gone = checkpoint(6), "model.layers.1.mlp.experts.2.up_proj.weight"
    bad = {k: v + 1 for k, v in ck.items() if k != gone}
    refused_from_dict_and_file(ck, bad, "missing-expert.safetensors", "REFIT_EINCOMPLETE",
                               gone, "missing", "layers.1", "experts.2")


def test_wrong_shaped_expert_refused():
    ck = checkpoint(7)
    bad = {k: v + 1 for k, v in ck.items()}
    bad["model.layers.1.mlp.experts.1.down_proj.weight"] = np.ones((H, I + 1), F32)
    refused_from_dict_and_file(ck, bad, "wrong-expert.safetensors", "REFIT_EMISMATCH",
                               "model.layers.1.mlp.experts.1.down_proj.weight")


def test_other_layouts_are_not_guessed():
    # transformers' Llama4 / GPT-OSS store [E, H, 2I]: not the per-expert
    # relation register_module knows; it says what to do instead
    m = NpModule({"x.experts.gate_up_proj": ((E, H, 2 * I), F32),
                  "x.experts.down_proj": ((E, I, H), F32)})
    ctx, rm = world()
    try:
        refit.register_module(rm, m)
        raise AssertionError("a transposed expert layout was registered")
    except ValueError as e:
        assert "expert_ckpt='stacked'" in str(e), e
    refit.register_module(rm, m, expert_ckpt="stacked")
    rm.seal()
    ctx.close()


# ---- vLLM FusedMoE: expert parallelism, TP, FP8 ------------------------------

def vllm_params(e_local, tp=1, scales=False):
    a = "model.layers.1.mlp."
    p = {a + "gate.weight": ((E, H), F32),
         a + "experts.w13_weight": ((e_local, 2 * I // tp, H), F32),
         a + "experts.w2_weight": ((e_local, H, I // tp), F32)}
    return p


def test_expert_map_rank_holds_2_to_4():
    assert moe.ExpertMap.linear(E, 1, 2).ids == [2, 3]
    assert moe.ExpertMap.linear(5, 0, 2).ids == [0, 1, 2]
    assert moe.ExpertMap.from_map([-1, -1, 0, 1]).ids == [2, 3]
    assert moe.ExpertMap.from_map(np.array([1, -1, -1, 0])).ids == [3, 0]
    m = NpModule(vllm_params(2))
    ctx, rm = world()
    names = refit.register_module(rm, m, experts=moe.ExpertMap(E, range(2, 4)))
    rm.seal()
    assert sorted(rm.foreign) == sorted("model.layers.1.mlp.experts.%d.%s.weight" % (e, p)
                                        for e in (0, 1)
                                        for p in ("gate_proj", "up_proj", "down_proj"))
    assert not set(names) & rm.foreign
    ck = {k: v for k, v in checkpoint(8).items() if k.startswith("model.layers.1.mlp.")
          and "shared" not in k}
    # the whole checkpoint, strict: the other rank's experts are skipped
    with rm.update(version="v1") as txn:
        txn.load_dict(ck)
    gu, dn = stacked(ck, experts=(2, 3))
    assert np.array_equal(m["model.layers.1.mlp.experts.w13_weight"], gu)
    assert np.array_equal(m["model.layers.1.mlp.experts.w2_weight"], dn)
    ck2 = {k: v * 2 for k, v in ck.items()}
    with rm.update(version="v2") as txn:
        txn.load_safetensors(write(ck2, "ep.safetensors"))
        txn.load("model.layers.1.mlp.experts.0.gate_proj.weight", np.ones((3, 3), F32))
    gu, dn = stacked(ck2, experts=(2, 3))
    assert np.array_equal(m["model.layers.1.mlp.experts.w13_weight"], gu)
    assert np.array_equal(m["model.layers.1.mlp.experts.w2_weight"], dn)
    # a name nobody expects is still refused under strict
    snap = m.snapshot()
    extra = dict(ck)
    extra["model.layers.1.mlp.experts.9.gate_proj.weight"] = np.ones((I, H), F32)

    def update():
        with rm.update(version="v3") as txn:
            txn.load_dict(extra)
    raises("REFIT_EUNEXPECTED", update, "model.layers.1.mlp.experts.9.gate_proj.weight")
    assert m.same(snap) and ctx.version == "v2"
    # this rank's own expert missing: refused, naming it
    mine = {k: v for k, v in ck.items() if "experts.3.down_proj" not in k}

    def update_missing():
        with rm.update(version="v3") as txn:
            txn.load_dict(mine)
    raises("REFIT_EINCOMPLETE", update_missing, "model.layers.1.mlp.experts.3.down_proj.weight")
    assert m.same(snap) and ctx.version == "v2" and ctx.health() == refit.Health.READY
    ctx.close()


def test_expert_parallel_rank_replays_from_the_whole_checkpoint():
    m = NpModule(vllm_params(2))
    ctx = refit.Context(worker_id="moe-replay", journal_path=os.path.join(TMP, "ep.db"))
    rm = ctx.create_model()
    refit.register_module(rm, m, experts=moe.ExpertMap.linear(E, 1, 2))
    rm.seal()
    ck = {k: v for k, v in checkpoint(11).items() if k.startswith("model.layers.1.mlp.")
          and "shared" not in k}
    with rm.update(version="v1") as txn:
        txn.load_dict(ck)
    ck2 = {k: v * 2 for k, v in ck.items()}
    try:
        with rm.update(version="v2") as txn:
            txn.load_safetensors(write(ck2, "ep-replay.safetensors"))
            raise RuntimeError("another rank failed")
    except RuntimeError:
        pass
    rm.replay(txn.journal_id)      # the file's experts 0 and 1 are another rank's: skipped
    gu, dn = stacked(ck2, experts=(2, 3))
    assert ctx.version == "v2"
    assert np.array_equal(m["model.layers.1.mlp.experts.w13_weight"], gu)
    assert np.array_equal(m["model.layers.1.mlp.experts.w2_weight"], dn)
    ctx.close()


def test_tp_shard_of_the_intermediate_dim():
    ck = {k: v for k, v in checkpoint(9).items() if k.startswith("model.layers.1.mlp.")
          and "shared" not in k}
    a = "model.layers.1.mlp.experts."
    for ep, tp_rank in ((None, 0), (None, 1), (moe.ExpertMap.linear(E, 1, 2), 1)):
        held = ep.ids if ep else list(range(E))
        m = NpModule(vllm_params(len(held), tp=2))
        ctx, rm = world()
        refit.register_module(rm, m, experts=ep, tp_rank=tp_rank, tp_size=2)
        rm.seal()
        with rm.update(version="v1") as txn:
            txn.load_dict(ck)
        r = slice(tp_rank * I // 2, (tp_rank + 1) * I // 2)
        for s, e in enumerate(held):
            want = np.concatenate([ck[a + "%d.gate_proj.weight" % e][r],
                                   ck[a + "%d.up_proj.weight" % e][r]])
            assert np.array_equal(m[a + "w13_weight"][s], want), (ep, tp_rank, e)
            assert np.array_equal(m[a + "w2_weight"][s], ck[a + "%d.down_proj.weight" % e][:, r])
        ctx.close()


def test_stacked_checkpoint_into_expert_parallel_rank():
    ck = checkpoint(10)
    gu, dn = stacked(ck)
    m = NpModule(vllm_params(2))
    ctx, rm = world()
    names = refit.register_module(rm, m, experts=moe.ExpertMap.linear(E, 1, 2),
                                  expert_ckpt="stacked")
    assert "model.layers.1.mlp.experts.gate_up_proj" in names, sorted(names)
    rm.seal()
    with rm.update(version="v1") as txn:
        txn.load_dict({"model.layers.1.mlp.gate.weight": ck["model.layers.1.mlp.gate.weight"],
                       "model.layers.1.mlp.experts.gate_up_proj": gu,
                       "model.layers.1.mlp.experts.down_proj": dn})
    assert np.array_equal(m["model.layers.1.mlp.experts.w13_weight"], gu[2:])
    assert np.array_equal(m["model.layers.1.mlp.experts.w2_weight"], dn[2:])
    ctx.close()
    # TP of fused gate/up cannot come from one stacked tensor: said at registration
    m = NpModule(vllm_params(E, tp=2))
    ctx, rm = world()
    try:
        refit.register_module(rm, m, tp_rank=0, tp_size=2, expert_ckpt="stacked")
        raise AssertionError("TP of a stacked fused checkpoint was registered")
    except ValueError as e:
        assert "per-expert" in str(e), e
    ctx.close()


E4M3 = ml_dtypes.float8_e4m3fn
HB, IB = 256, 256          # block-128 shapes: whole blocks, two of them per dim


def quant_block(x):
    """docs/formats-fp8.md's block-128 arithmetic over a [N, K] f32 matrix."""
    n, k = x.shape
    q = np.zeros((n, k), E4M3)
    s = np.zeros(((n + 127) // 128, (k + 127) // 128), F32)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            t = x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            sc = F32(np.abs(t).max()) / F32(448.0)
            sc = F32(1.0) if sc == 0 else sc
            s[i, j] = sc
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = \
                np.clip(t / sc, -448, 448).astype(E4M3)
    return q, s


def fp8_module(e_local):
    a = "model.layers.1.mlp.experts."
    return NpModule({a + "w13_weight": ((e_local, 2 * IB, HB), E4M3),
                     a + "w13_weight_scale_inv": ((e_local, 2 * IB // 128, HB // 128), F32),
                     a + "w2_weight": ((e_local, HB, IB), E4M3),
                     a + "w2_weight_scale_inv": ((e_local, HB // 128, IB // 128), F32)})


def bf16_experts(seed):
    r = np.random.default_rng(seed)
    a = "model.layers.1.mlp.experts.%d."
    out = {}
    for e in range(E):
        for p, s in (("gate_proj", (IB, HB)), ("up_proj", (IB, HB)), ("down_proj", (HB, IB))):
            out[a % e + p + ".weight"] = r.standard_normal(s).astype(ml_dtypes.bfloat16)
    return out


def fp8_loaded(ep, ck, **kw):
    """fp8_module(2) registered with expert map ep (and register_module's
    kw), sealed and loaded from ck as v1: (m, ctx, rm, names)."""
    m = fp8_module(2)
    ctx, rm = world()
    names = refit.register_module(rm, m, experts=ep, **kw)
    rm.seal()
    with rm.update(version="v1") as txn:
        txn.load_dict(ck)
    return m, ctx, rm, names


def test_fp8_block_experts_serialized_and_online():
    ep = moe.ExpertMap(E, [3, 1])      # slots in an explicit order
    a = "model.layers.1.mlp.experts."
    src = bf16_experts(11)
    # serialized: the checkpoint's fp8 weights and weight_scale_inv, 1:1
    ser = {}
    for k, v in src.items():
        q, s = quant_block(v.astype(F32))
        ser[k] = q
        ser[k + "_scale_inv"] = s
    m, ctx, rm, names = fp8_loaded(ep, ser)
    assert a + "3.gate_proj.weight_scale_inv" in names and a + "0.up_proj.weight" in rm.foreign
    for s, e in enumerate(ep.ids):
        p = a + "%d." % e
        want = np.concatenate([ser[p + "gate_proj.weight"], ser[p + "up_proj.weight"]])
        assert np.array_equal(m[a + "w13_weight"][s].view(np.uint8), want.view(np.uint8)), e
        assert np.array_equal(m[a + "w13_weight_scale_inv"][s],
                              np.concatenate([ser[p + "gate_proj.weight_scale_inv"],
                                              ser[p + "up_proj.weight_scale_inv"]])), e
        assert np.array_equal(m[a + "w2_weight"][s].view(np.uint8),
                              ser[p + "down_proj.weight"].view(np.uint8)), e
        assert np.array_equal(m[a + "w2_weight_scale_inv"][s], ser[p + "down_proj.weight_scale_inv"])
    ctx.close()
    # online: a BF16 checkpoint quantized into the same tensors at finalize
    m, ctx, rm, names = fp8_loaded(ep, src, ckpt_dtype=ml_dtypes.bfloat16)
    assert not any(n.endswith("scale_inv") for n in names)
    for s, e in enumerate(ep.ids):
        p = a + "%d." % e
        gu = np.concatenate([src[p + "gate_proj.weight"], src[p + "up_proj.weight"]])
        q, sc = quant_block(gu.astype(F32))
        assert np.array_equal(m[a + "w13_weight"][s].view(np.uint8), q.view(np.uint8)), e
        assert np.array_equal(m[a + "w13_weight_scale_inv"][s], sc), e
        q, sc = quant_block(src[p + "down_proj.weight"].astype(F32))
        assert np.array_equal(m[a + "w2_weight"][s].view(np.uint8), q.view(np.uint8)), e
        assert np.array_equal(m[a + "w2_weight_scale_inv"][s], sc), e
    ctx.close()


def test_fp8_per_channel_experts_tp_rank():
    # vLLM's per-channel FP8: w13_weight_scale [E, 2I/tp, 1] split with the
    # rows, w2_weight_scale [E, H, 1] whole on every rank
    a = "model.layers.1.mlp.experts."
    r = np.random.default_rng(12)
    ck = {}
    for e in range(E):
        for p, s in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            ck[a + "%d.%s.weight" % (e, p)] = r.standard_normal(s).astype(F32).astype(E4M3)
            ck[a + "%d.%s.weight_scale" % (e, p)] = r.random((s[0], 1)).astype(F32)
    m = NpModule({a + "w13_weight": ((E, I, H), E4M3), a + "w13_weight_scale": ((E, I, 1), F32),
                  a + "w2_weight": ((E, H, I // 2), E4M3), a + "w2_weight_scale": ((E, H, 1), F32)})
    ctx, rm = world()
    refit.register_module(rm, m, tp_rank=1, tp_size=2)
    rm.seal()
    with rm.update(version="v1") as txn:
        txn.load_dict(ck)
    h = slice(I // 2, I)
    for e in range(E):
        p = a + "%d." % e
        w13 = np.concatenate([ck[p + "gate_proj.weight"][h], ck[p + "up_proj.weight"][h]])
        assert np.array_equal(m[a + "w13_weight"][e].view(np.uint8), w13.view(np.uint8)), e
        assert np.array_equal(m[a + "w13_weight_scale"][e], np.concatenate(
            [ck[p + "gate_proj.weight_scale"][h], ck[p + "up_proj.weight_scale"][h]])), e
        assert np.array_equal(m[a + "w2_weight"][e].view(np.uint8),
                              ck[p + "down_proj.weight"][:, h].view(np.uint8)), e
        assert np.array_equal(m[a + "w2_weight_scale"][e], ck[p + "down_proj.weight_scale"]), e
    ctx.close()


def test_torch_never_imported():
    assert "torch" not in sys.modules


if __name__ == "__main__":
    sys.exit(harness.run(globals(), last="test_torch_never_imported"))
