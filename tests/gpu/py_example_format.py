"""The out-of-tree example format (examples/example_format: scale2,
runtime = 2 x checkpoint, F32) on the GPU, as its author ships it: a
plugin built from an install prefix alone with its own CUDA kernel
embedded, found on REFIT_PLUGIN_PATH, loaded into a model whose runtime
tensors live on the device. Its kernel must give exactly the CPU
reference's bytes (2 x is exact in F32), reload over old values like a
cold start, keep a CUDA graph's addresses, and refuse a NaN at finalize
with the previous bytes kept, the message naming the tensor and the
element, in a module of any number of tensors.

The plugin folder: REFIT_EXAMPLE_PLUGIN_DIR, else example/ beside
REFIT_LIB (tests/gpu/stage.sh puts it there when given the example's build
folder)."""
import os

import torch

import refit

DEV = "cuda"
SHAPES = {"a.w": (1000, 257), "b.w": (64,), "c.w": (3, 5, 7)}


class Skip(Exception):
    pass


def plugin_dir():
    d = os.environ.get("REFIT_EXAMPLE_PLUGIN_DIR")
    if not d and os.environ.get("REFIT_LIB"):
        d = os.path.join(os.path.dirname(os.path.abspath(os.environ["REFIT_LIB"])), "example")
    if not d or not os.path.exists(os.path.join(d, "refit-fmt-scale2.so")):
        raise Skip("no example format build (REFIT_EXAMPLE_PLUGIN_DIR, or example/ beside "
                   "REFIT_LIB, holding refit-fmt-scale2.so)")
    return d


def engine(runtime_device):
    d = plugin_dir()
    old = os.environ.get("REFIT_PLUGIN_PATH", "")
    os.environ["REFIT_PLUGIN_PATH"] = d + (":" + old if old else "")
    try:
        ctx = refit.Context(worker_id="example-format")
    finally:
        os.environ["REFIT_PLUGIN_PATH"] = old
    m = ctx.create_model()
    rt = {}
    for name, shape in SHAPES.items():
        mod = name.split(".")[0]
        rt[name] = torch.full(shape, 7.0, dtype=torch.float32, device=runtime_device)
        m.add_module(mod, format="scale2")
        m.bind_runtime(mod, name, rt[name])
        m.expect(mod, name, torch.float32, list(shape))
    m.seal()
    return ctx, m, rt


def checkpoint(seed, device):
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(s, generator=g) * 100).to(device) for n, s in SHAPES.items()}


def update(m, ck, version):
    with m.update(version=version) as txn:
        txn.load_dict(ck)
    torch.cuda.synchronize()


def test_kernel_matches_cpu_reference_and_reloads_like_a_cold_start():
    ck1, ck2 = checkpoint(1, DEV), checkpoint(2, DEV)
    ctx_h, m_h, rt_h = engine("cpu")            # the plugin's CPU reference
    update(m_h, {n: t.cpu() for n, t in ck2.items()}, "v2")
    ctx, m, rt = engine(DEV)                    # its own kernel on the device
    ptrs = {n: t.data_ptr() for n, t in rt.items()}
    update(m, ck1, "v1")
    update(m, ck2, "v2")                        # over v1's bytes
    for n in SHAPES:
        assert rt[n].data_ptr() == ptrs[n]
        assert torch.equal(rt[n].cpu().view(torch.int32), rt_h[n].view(torch.int32)), n
        assert torch.equal(rt[n], ck2[n] * 2), n
    ctx_c, m_c, rt_c = engine(DEV)              # a cold start on v2
    update(m_c, ck2, "v2")
    for n in SHAPES:
        assert torch.equal(rt[n].view(torch.int32), rt_c[n].view(torch.int32)), n
    for c in (ctx_h, ctx, ctx_c):
        c.close()


def test_graph_replays_after_reload_and_nan_is_refused_at_finalize():
    ctx, m, rt = engine(DEV)
    update(m, checkpoint(3, DEV), "v1")
    out = torch.empty_like(rt["a.w"])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.copy_(rt["a.w"] * 0.5)
    ck = checkpoint(4, DEV)
    update(m, ck, "v2")
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ck["a.w"])          # (2 x) x 0.5, exact
    before = {n: t.clone() for n, t in rt.items()}
    bad = checkpoint(5, DEV)
    bad["c.w"][1, 2, 3] = float("nan")
    try:
        update(m, bad, "v3")
    except refit.RefitError as e:
        assert e.name == "REFIT_ECORRUPT", e
        # c.w[1, 2, 3] of a [3, 5, 7] tensor: flat element 52
        assert "module c, tensor c.w, element 52:" in e.message, e.message
    else:
        raise AssertionError("a NaN in c.w committed")
    for n in SHAPES:
        assert torch.equal(rt[n], before[n]), n
    assert ctx.version == "v2" and ctx.health() == refit.Health.READY
    ctx.close()


def test_nan_names_its_tensor_past_64_tensors():
    """scale2 once named at most 64 tensors a module: a NaN in the 70th
    was reported as the 64th's."""
    d = plugin_dir()
    old = os.environ.get("REFIT_PLUGIN_PATH", "")
    os.environ["REFIT_PLUGIN_PATH"] = d + (":" + old if old else "")
    try:
        ctx = refit.Context(worker_id="example-format-wide")
    finally:
        os.environ["REFIT_PLUGIN_PATH"] = old
    m = ctx.create_model()
    m.add_module("wide", format="scale2")
    names = ["wide.t%d" % i for i in range(70)]
    rt = {}
    for n in names:
        rt[n] = torch.zeros(4, 8, dtype=torch.float32, device=DEV)
        m.bind_runtime("wide", n, rt[n])
        m.expect("wide", n, torch.float32, [4, 8], target=n)
    m.seal()
    good = {n: torch.full((4, 8), float(i), device=DEV) for i, n in enumerate(names)}
    update(m, good, "v1")
    bad = {n: t.clone() for n, t in good.items()}
    bad["wide.t69"][2, 5] = float("inf")
    try:
        update(m, bad, "v2")
    except refit.RefitError as e:
        assert e.name == "REFIT_ECORRUPT", e
        assert "tensor wide.t69, element 21:" in e.message, e.message
    else:
        raise AssertionError("an infinity in wide.t69 committed")
    for i, n in enumerate(names):
        assert torch.equal(rt[n], torch.full((4, 8), 2.0 * i, device=DEV)), n
    assert ctx.version == "v1"
    ctx.close()
