#!/usr/bin/env python3
"""Patches over the IPC transport on one GPU, two processes (TAP; skips
without torch, a CUDA device or librefit): a trainer process sends 3% of
each bf16 tensor's elements per step (Sender.add_delta, values in CUDA
memory, one tensor in the run form), three steps; this process's worker
(CUDA runtime tensors) takes each in a delta update
(receive_update(base=...)): its indices arrive in device memory and are
read on the host. Each step's bytes equal the reference patched in place
with torch, bit for bit; a fourth step's index past its tensor is refused
on both sides, bytes, version and health unchanged.

env: REFIT_LIB (librefit.so), REFIT_SOURCE_ROOT."""
import os
import sys
import tempfile
import traceback

ROOT = os.environ.get("REFIT_SOURCE_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

SHAPES = [("embed", (1024, 256)), ("q", (256, 256)), ("up", (512, 256)), ("norm", (256,))]


def why_skip():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import refit
        refit.Context(journal_path="").close()
    except Exception as e:
        return "librefit unusable: %s" % e
    return None


def weights(version, device):
    import torch
    g = torch.Generator().manual_seed(1000 + version)
    return {n: torch.randn(*s, generator=g).to(torch.bfloat16).to(device) for n, s in SHAPES}


def patches(step):
    """name -> (indices, values, counts or None) of step (values of version
    step + 1, on the GPU); "up" as runs of whole rows."""
    import torch
    new = weights(step + 1, "cuda")
    g = torch.Generator().manual_seed(7 + step)
    out = {}
    for n, s in SHAPES:
        flat = new[n].reshape(-1)
        if n == "up":
            rows = torch.randperm(s[0], generator=g)[: max(1, s[0] * 3 // 100)].sort().values
            starts = rows * s[1]
            vals = new[n][rows.cuda()].reshape(-1).contiguous()
            out[n] = (starts, vals, torch.full_like(starts, s[1]))
        else:
            k = max(1, flat.numel() * 3 // 100)
            idx = torch.randperm(flat.numel(), generator=g)[:k]
            out[n] = (idx, flat[idx.cuda()].contiguous(), None)
    return out


def trainer(path, steps, bad_step):
    import torch
    import refit
    import refit.ipc
    torch.cuda.set_device(0)
    ctx = refit.Context(worker_id="trainer", journal_path="")
    s = refit.ipc.Sender(ctx, [path], device=0, timeout=60,
                         stream=torch.cuda.current_stream())
    for step in range(1, steps + 1):
        for n, (idx, vals, counts) in patches(step).items():
            if step == bad_step and n == "norm":
                idx = idx.clone()
                idx[0] = 256               # norm has 256 elements
            s.add_delta(n, idx, vals, counts)
        torch.cuda.current_stream().synchronize()
        try:
            s.send(label="v%d" % (step + 1))
            assert step != bad_step, "a patch past its tensor was committed"
        except refit.RefitError as err:
            assert step == bad_step and "is outside" in err.message, err.message
    s.close()
    ctx.close()


def test_patches_from_device_memory():
    import torch
    import torch.multiprocessing as mp
    import refit
    import refit.ipc
    ctx = refit.Context(worker_id="worker", journal_path="")
    m = ctx.create_model()
    rt = {n: torch.zeros(*s, dtype=torch.bfloat16, device="cuda") for n, s in SHAPES}
    for n, t in rt.items():
        m.add_module(n)
        m.bind_runtime(n, "w", t)
        m.expect(n, n, torch.bfloat16, t.shape)
    m.seal()
    with m.update(version="v1") as txn:
        txn.load_dict(weights(1, "cuda"))
    ref = {n: t.clone() for n, t in weights(1, "cuda").items()}
    path = os.path.join(tempfile.mkdtemp(), "w.sock")
    stream = torch.cuda.Stream()
    r = refit.ipc.Receiver(m, path, timeout=30, start_timeout=60, stream=stream)
    p = mp.get_context("spawn").Process(target=trainer, args=(path, 4, 4))
    p.start()
    try:
        for step in range(1, 4):
            res = r.receive_update(base="v%d" % step)
            assert res["decision"] == 0, res
            for n, (idx, vals, counts) in patches(step).items():
                flat = ref[n].view(-1)
                if counts is None:
                    flat[idx.cuda()] = vals
                else:
                    for j, (a, c) in enumerate(zip(idx.tolist(), counts.tolist())):
                        flat[a:a + c] = vals[j * c:(j + 1) * c]
            torch.cuda.synchronize()
            for n, t in rt.items():
                assert torch.equal(t, ref[n]), "step %d: %s differs from the patched reference" % (step, n)
            assert ctx.version == "v%d" % (step + 1)
        try:
            r.receive_update(base="v4")
            raise AssertionError("a patch past its tensor was taken")
        except refit.RefitError as err:
            assert "index 0 (256) is outside" in err.message, err.message
        torch.cuda.synchronize()
        for n, t in rt.items():
            assert torch.equal(t, ref[n]), "%s changed by a refused update" % n
        assert ctx.version == "v4" and ctx.health() == refit.Health.READY
    finally:
        p.join(60)
        r.close()
        ctx.close()
    assert p.exitcode == 0, p.exitcode


def main():
    why = why_skip()
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    print("1..%d" % len(tests))
    bad = 0
    for i, (n, f) in enumerate(tests, 1):
        try:
            f()
            print("ok %d - %s" % (i, n))
        except Exception:
            bad += 1
            print("not ok %d - %s" % (i, n))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
        sys.stdout.flush()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
