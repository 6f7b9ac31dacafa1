"""A page-cached safetensors file into device tensors through the CUDA
backend's pinned ring: tensors at offsets that are no multiple of 16 and
of sizes that are no multiple of a page or of a staging slice, every
runtime byte equal to the file's after the default update (rollback on),
an update aborted back to the bytes before; the backend's counters say the
bytes went through the ring (prefaulted, staged, the ring's waits split
into its fill and drain parts), and with REFIT_CUDA_DRAIN_POLL=0 (a
blocking wait for each chunk) in a child process the bytes are the same."""
import json
import os
import subprocess
import sys
import tempfile

import torch

import refit
from refit._sys import cuda_stats as stats

DEV = "cuda"
# shapes: 8 MiB, an odd 4.4 MiB, 280 KB of fp32, a tiny one after them
SPEC = [("a.weight", (4096, 1024), torch.bfloat16), ("b.weight", (3001, 778), torch.bfloat16),
        ("c.bias", (70001,), torch.float32), ("d.scale", (3, 5), torch.bfloat16)]


def write_file(path, seed):
    """Tensors back to back after a header whose length puts the first one
    at an offset that is no multiple of 16."""
    g = torch.Generator().manual_seed(seed)
    tensors, header, off, blobs = {}, {}, 0, []
    for name, shape, dt in SPEC:
        t = torch.randn(*shape, generator=g).to(dt)
        tensors[name] = t
        b = t.contiguous().view(torch.uint8).numpy().tobytes()
        code = {torch.bfloat16: "BF16", torch.float32: "F32"}[dt]
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    if (8 + len(h)) % 16 == 0:
        h += b" " * 8                    # the first tensor at 8 mod 16
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    return tensors


def build():
    ctx = refit.Context(worker_id="py-file-read")
    m = ctx.create_model()
    rt = {}
    for name, shape, dt in SPEC:
        rt[name] = torch.zeros(shape, dtype=dt, device=DEV)
        m.add_module(name)
        m.bind_runtime(name, "w", rt[name])
        m.expect(name, name, dt, list(shape))
    m.seal()
    return ctx, m, rt


def equal(rt, tensors):
    torch.cuda.synchronize()
    return all(torch.equal(rt[n].cpu(), tensors[n]) for n in rt)


def load_and_check(path):
    """Two versions through the default update, then a third aborted."""
    ctx, m, rt = build()
    s0 = stats()
    try:
        for seed in (1, 2):
            tensors = write_file(path, seed)
            with m.update(version="v%d" % seed) as txn:
                txn.load_safetensors(path)
            assert equal(rt, tensors), "version %d differs from the file" % seed
        before = {n: t.clone() for n, t in rt.items()}
        write_file(path, 3)
        txn = m.begin(version="v3", rollback=True)
        txn.load_safetensors(path)
        txn.abort()
        torch.cuda.synchronize()
        assert all(torch.equal(rt[n], before[n]) for n in rt), "abort left the file's bytes"
    finally:
        m.destroy()
        ctx.close()
    s1 = stats()
    return {k: s1[k] - s0[k] for k in s0}


def test_file_through_the_ring():
    fd, path = tempfile.mkstemp(suffix=".safetensors")
    os.close(fd)
    try:
        d = load_and_check(path)
        total = sum(t.numel() * t.element_size() for t in write_file(path, 9).values())
        assert d["pageable_bytes"] >= 3 * (total - 30), d   # the tiny tensor may go inline
        assert d["prefault_ns"] > 0, "the mapping was not prefaulted: %s" % d
        assert d["ring_wait_ns"] == d["ring_fill_wait_ns"] + d["ring_drain_ns"], d
    finally:
        os.unlink(path)


def _load_in_child(extra):
    """load_and_check in a fresh process with extra in its environment (the
    backend reads its tunables once); its counters."""
    env = dict(os.environ, **extra)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.environ.get("REFIT_SOURCE_ROOT") or os.path.join(here, "..", "..")
    code = ("import sys; sys.path[:0] = [%r, %r]\n"
            "import py_file_read as t, tempfile, os, json\n"
            "fd, p = tempfile.mkstemp(suffix='.safetensors'); os.close(fd)\n"
            "try:\n    print(json.dumps(t.load_and_check(p)))\nfinally:\n    os.unlink(p)\n"
            % (here, os.path.join(root, "bindings", "python")))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["pageable_bytes"] > 0, d
    return d


def test_file_with_a_blocking_drain():
    _load_in_child({"REFIT_CUDA_DRAIN_POLL": "0"})


def test_file_with_the_caller_copying_and_a_short_ring():
    _load_in_child({"REFIT_CUDA_CALLER_COPIES": "1", "REFIT_CUDA_RING_CHUNKS": "2"})


def test_the_workers_copy_every_slice():
    """By default the caller only issues: every slice of the ring is copied
    by the worker threads, several of them (a worker asleep through a long
    tensor once left the caller copying it alone, at a twelfth of the
    speed). Read from REFIT_CUDA_RING_TRACE, written at the child's exit."""
    with tempfile.TemporaryDirectory() as tmp:
        _load_in_child({"REFIT_CUDA_RING_TRACE": os.path.join(tmp, "trace_%p.txt")})
        files = os.listdir(tmp)
        assert len(files) == 1, files
        fills = []
        with open(os.path.join(tmp, files[0])) as f:
            for line in f:
                if line.startswith("#"):
                    assert " 0 dropped" in line, line
                    continue
                kind, who = (int(x) for x in line.split()[:2])
                if kind == 0:
                    fills.append(who)
    assert fills, "no slice went through the ring"
    assert min(fills) >= 0, "the caller copied %d of %d slices" % (
        sum(w < 0 for w in fills), len(fills))
    if (os.cpu_count() or 1) >= 4:
        assert len(set(fills)) >= 2, "one worker copied all %d slices" % len(fills)
