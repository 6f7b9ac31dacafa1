"""The keeper with device tensors (docs/restart.md, "The keeper"): a keeper
process holds a worker's committed state in ordinary torch CUDA tensors
(a BF16 layer, an FP8 layer quantized online), shared with CUDA IPC; a
fresh worker process restores it bit for bit at its version, without the
FP8 post-load; a CUDA graph captured after the restore replays the
restored weights; a later update equals a cold start.

The keeper runs as `python3 py_keeper.py --keeper SOCKET` (a process of
its own: CUDA does not survive fork).
"""
import os
import subprocess
import sys
import tempfile

import torch

import refit
import refit.keeper

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
        return x @ self.up.float().t() + x @ (self.q.float() * self.q_scale).t()

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


def keeper_main(sock):
    e = Engine("gpu-keeper")
    update(e, 1, "v1")
    k = refit.keeper.Keeper(e.model, sock, timeout=60)
    k.run(120)
    return 0


def test_restore_from_keeper_on_device():
    sock = os.path.join(tempfile.mkdtemp(prefix="refit-gpu-keeper-"), "k.sock")
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    root = env.get("REFIT_SOURCE_ROOT") or os.path.join(here, "..", "..")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "bindings", "python"), here,
                                         env.get("PYTHONPATH", "")])
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--keeper", sock], env=env)
    try:
        cold = Engine("gpu-keeper-cold")
        update(cold, 1, "v1")
        want = cold.raw()
        b = Engine("gpu-keeper-b")   # the restarted worker: new tensors, new context
        refit.keeper.restore(b.model, "keeper://" + sock, timeout=120)
        torch.cuda.synchronize()
        assert b.ctx.version == "v1", b.ctx.version
        assert same(b.raw(), want), "restored device bytes differ from the keeper's version"

        x = torch.randn(16, K, device=DEV)
        static_x = x.clone()
        out = torch.empty(16, N, device=DEV)
        eager = b.forward(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            out.copy_(b.forward(static_x))
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out.copy_(b.forward(static_x))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), "the graph captured after the restore reads other bytes"

        update(b, 2, "v2")
        update(cold, 2, "v2")
        assert same(b.raw(), cold.raw()), "an update after a restore differs from a cold start"
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, b.forward(x)) and not torch.equal(out, eager)
        b.close()
        cold.close()
    finally:
        p.terminate()
        p.wait()


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--keeper":
    sys.exit(keeper_main(sys.argv[2]))
