"""Undo sources with device tensors (docs/core.md "Undo sources"): a
worker with a BF16 layer and an FP8 layer quantized online on the GPU
loads v1 from safetensors files; the next update (v2, other files) keeps
no undo log and its abort reloads v1 from the files held, the FP8
post-load run again on the GPU: every device byte comes back. A file
written in place before the abort poisons the worker, naming the file.
"""
import os
import tempfile

import torch

import refit

DEV = "cuda"
N, K = 384, 256


class Engine:
    def __init__(self, wid):
        self.up = torch.zeros(N, K, dtype=torch.bfloat16, device=DEV)
        self.q = torch.zeros(N, K, dtype=torch.float8_e4m3fn, device=DEV)
        self.q_scale = torch.zeros(N, 1, dtype=torch.float32, device=DEV)
        self.ctx = refit.Context(worker_id=wid, journal_path="")
        m = self.model = self.ctx.create_model()
        m.add_module("up")
        m.bind_runtime("up", "w", self.up)
        m.expect("up", "up.weight", torch.bfloat16, (N, K))
        m.add_module("q", "fp8", {"scheme": "per_channel", "online": True})
        m.bind_runtime("q", "weight", self.q)
        m.bind_runtime("q", "weight_scale", self.q_scale)
        m.expect("q", "q.weight", torch.bfloat16, (N, K), target="weight")
        m.seal()

    def raw(self):
        return [t.view(torch.uint8).clone() if t.dtype != torch.float32
                else t.view(torch.int32).clone() for t in (self.up, self.q, self.q_scale)]


def write(path, seed):
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    save_file({n: (torch.randn(N, K, generator=g) * 0.05).to(torch.bfloat16)
               for n in ("up.weight", "q.weight")}, path)


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_abort_reloads_the_previous_files_on_device():
    d = tempfile.mkdtemp(prefix="refit-gpu-undosrc-")
    p1, p2 = os.path.join(d, "v1.safetensors"), os.path.join(d, "v2.safetensors")
    write(p1, 1)
    write(p2, 2)
    e = Engine("gpu-undosrc")
    with e.model.update(version="v1") as txn:
        txn.load_safetensors(p1)
    torch.cuda.synchronize()
    want = e.raw()
    assert torch.any(want[1] != 0)
    txn = e.model.begin("v2")
    txn.load_safetensors(p2)
    st = txn.stats()
    assert st["undo_device_bytes"] == 0 and st["undo_host_bytes"] == 0, st
    torch.cuda.synchronize()
    assert not same(e.raw(), want)
    txn.abort()
    torch.cuda.synchronize()
    assert same(e.raw(), want), "the abort did not bring v1's device bytes back"
    assert e.ctx.version == "v1" and e.ctx.health() == refit.Health.READY

    txn = e.model.begin("v2")           # v1's file written in place before the abort
    txn.load_safetensors(p2)
    st1 = os.stat(p1)
    with open(p1, "r+b") as f:
        f.seek(st1.st_size - 1)
        f.write(b"\x5a")
    os.utime(p1, ns=(st1.st_atime_ns, st1.st_mtime_ns + 7_000_000_000))
    assert txn.abort() is False, "abort over a changed file did not poison"
    assert e.ctx.health() == refit.Health.POISONED
    assert "v1.safetensors" in e.ctx.errmsg(), e.ctx.errmsg()
    e.ctx.close()
