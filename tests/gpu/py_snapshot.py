"""Snapshots and restore with device tensors (docs/restart.md): a worker
with a BF16 layer and an FP8 layer quantized online on the GPU snapshots
its committed state; a fresh worker (new tensors, new context: a restart)
registers, seals and restores it bit for bit, without running the FP8
post-load; a CUDA graph captured after the restore replays the restored
weights, and still reads the right bytes after a later update, which
equals a cold start.
"""
import os
import tempfile

import torch

import refit

DEV = "cuda"
N, K = 384, 256


class Skip(Exception):
    pass


class Engine:
    def __init__(self, wid):
        if not hasattr(torch, "float8_e4m3fn"):
            raise Skip("this torch has no float8_e4m3fn")
        self.up = torch.zeros(N, K, dtype=torch.bfloat16, device=DEV)
        self.q = torch.zeros(N, K, dtype=torch.float8_e4m3fn, device=DEV)
        self.q_scale = torch.zeros(1, dtype=torch.float32, device=DEV)
        self.ctx = refit.Context(worker_id=wid, journal_path="")
        m = self.model = self.ctx.create_model()
        m.add_module("up")
        m.bind_runtime("up", "w", self.up)
        m.expect("up", "up.weight", torch.bfloat16, (N, K))
        m.add_module("q", "fp8", {"scheme": "per_tensor", "online": True})
        m.bind_runtime("q", "weight", self.q)
        m.bind_runtime("q", "weight_scale", self.q_scale)
        m.expect("q", "q.weight", torch.bfloat16, (N, K), target="weight")
        m.seal()

    def forward(self, x):
        a = x @ self.up.float().t()
        b = x @ (self.q.float() * self.q_scale).t()
        return a + b

    def raw(self):
        return [t.view(torch.uint8).clone() if t.dtype != torch.float32
                else t.view(torch.int32).clone() for t in (self.up, self.q, self.q_scale)]

    def close(self):
        self.ctx.close()


def checkpoint(seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return {name: (torch.randn(N, K, generator=g, device=DEV) * 0.05).to(torch.bfloat16)
            for name in ("up.weight", "q.weight")}


def update(e, seed, version):
    with e.model.update(version=version) as txn:
        txn.load_dict(checkpoint(seed))
    torch.cuda.synchronize()


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_restore_on_device_and_graph_replay():
    snap = os.path.join(tempfile.mkdtemp(prefix="refit-gpu-snap-"), "snap")
    a = Engine("gpu-snap-a")
    update(a, 1, "v1")
    a.model.snapshot(snap)
    want = a.raw()
    assert torch.any(want[1] != 0)
    a.close()

    b = Engine("gpu-snap-b")       # the restarted worker: new tensors, new context
    b.model.restore(snap)
    torch.cuda.synchronize()
    assert b.ctx.version == "v1"
    assert same(b.raw(), want), "restored device bytes differ from the snapshot's worker"

    x = torch.randn(16, K, device=DEV)
    static_x = x.clone()
    out = torch.empty(16, N, device=DEV)
    eager = b.forward(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):      # warm up off the default stream, as torch asks
        out.copy_(b.forward(static_x))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.copy_(b.forward(static_x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager), "the graph captured after the restore reads other bytes"

    update(b, 2, "v2")              # online FP8 quantized on the GPU again
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, b.forward(x)) and not torch.equal(out, eager)
    cold = Engine("gpu-snap-cold")
    update(cold, 2, "v2")
    assert same(b.raw(), cold.raw()), "an update after a restore differs from a cold start"
    b.close()
    cold.close()
