#!/usr/bin/env python3
"""The IPC transport on one GPU, two processes (TAP; skips without torch, a
CUDA device or librefit): a trainer process (torch.multiprocessing, spawn)
shares its parameters (REFIT_IPC_SHARE) and packs others; this process is
the worker. Checks: bit-exact against a fresh load of the same tensors; a
CUDA graph captured before the first update replays after each IPC update
with the new weights and every data_ptr unchanged; 10 updates with the
handles opened once; both ends' profiles stamped in order (the worker's
GPU times from CUDA events); a trainer stalled mid-update (stopped once the worker
had its index) -> abort at the deadline -> rolled back -> the next trainer's
update commits.

env: REFIT_LIB (librefit.so), REFIT_SOURCE_ROOT."""
import os
import signal
import sys
import tempfile
import time
import traceback

ROOT = os.environ.get("REFIT_SOURCE_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

SHAPES = [("embed", (1024, 256)), ("q", (256, 256)), ("k", (64, 256)), ("up", (512, 256)),
          ("down", (256, 512)), ("norm", (256,)), ("head", (1024, 256))]


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


def trainer(path, first, count, hold):
    """A trainer process: its parameters shared as they are (every other
    one packed), refreshed in place before each send."""
    import torch
    import refit
    import refit.ipc
    torch.cuda.set_device(0)
    ctx = refit.Context(worker_id="trainer", journal_path="")
    params = weights(first, "cuda")
    stream = torch.cuda.current_stream()
    s = refit.ipc.Sender(ctx, [path], device=0, timeout=60, stream=stream)
    for i, (n, t) in enumerate(params.items()):
        s.add(n, t, share=i % 2 == 0)
    for v in range(first, first + count):
        new = weights(v, "cuda")
        with torch.no_grad():
            for n, t in params.items():
                t.copy_(new[n])     # the optimizer's step, on the trainer's stream
        s.send(label="v%d" % v)
        pf = s.profile()
        at = [pf[k] for k in ("start_ns", "packed_ns", "encoded_ns", "results_ns", "posted_ns",
                              "voted_ns", "decided_ns", "end_ns")]
        assert pf["seq"] == v - first + 1 and at[0] > 0 and at == sorted(at), pf
    if hold:
        time.sleep(hold)
    s.close()
    ctx.close()


class Worker:
    def __init__(self, timeout=30.0, filter=None, profile_gpu=False):
        import torch
        import refit
        import refit.ipc
        self.ctx = refit.Context(worker_id="worker", journal_path="")
        self.m = self.ctx.create_model()
        self.rt = {n: torch.zeros(*s, dtype=torch.bfloat16, device="cuda") for n, s in SHAPES}
        for n, t in self.rt.items():
            self.m.add_module(n)
            self.m.bind_runtime(n, "w", t)
            self.m.expect(n, n, torch.bfloat16, t.shape)
        self.m.seal()
        self.path = os.path.join(tempfile.mkdtemp(), "w.sock")
        self.stream = torch.cuda.Stream()
        self.r = refit.ipc.Receiver(self.m, self.path, timeout=timeout, start_timeout=60,
                                    stream=self.stream, filter=filter,
                                    profile_gpu=profile_gpu)

    def receive(self, rollback=True):
        return self.r.receive_update(rollback=rollback)

    def close(self):
        self.r.close()
        self.ctx.close()


def fresh_fingerprint(version):
    """A fresh worker loaded in process from the same tensors."""
    import torch
    import refit
    ctx = refit.Context(journal_path="")
    m = ctx.create_model()
    rt = {n: torch.zeros(*s, dtype=torch.bfloat16, device="cuda") for n, s in SHAPES}
    for n, t in rt.items():
        m.add_module(n)
        m.bind_runtime(n, "w", t)
        m.expect(n, n, torch.bfloat16, t.shape)
    m.seal()
    with m.update(version="v%d" % version) as txn:
        txn.load_dict(weights(version, "cuda"))
    torch.cuda.synchronize()
    fp = m.fingerprint()
    ctx.close()
    return fp


def spawn(path, first, count, hold=0):
    import torch.multiprocessing as mp
    p = mp.get_context("spawn").Process(target=trainer, args=(path, first, count, hold))
    p.start()
    return p


WORKER_PHASES = ("call_ns", "update_ns", "checked_ns", "begun_ns", "waited_ns", "enqueued_ns",
                 "prepared_ns", "voted_ns", "decision_ns", "committed_ns", "result_ns")


def check_profile(pf, seq):
    """The worker's profile of update seq: every phase stamped, in order;
    the GPU's end of the copies (CUDA events) before the prepare returned."""
    at = [pf[k] for k in WORKER_PHASES]
    assert pf["seq"] == seq and at[0] > 0 and at == sorted(at), pf
    assert pf["gpu_copy_ms"] >= 0 and pf["gpu_wait_ms"] >= 0, pf  # -1: not measured
    assert pf["begun_ns"] < pf["copies_done_ns"] <= pf["prepared_ns"], pf


def test_updates_graph_and_handles():
    import torch
    w = Worker(profile_gpu=True)
    ptrs = {n: t.data_ptr() for n, t in w.rt.items()}
    # a graph over every runtime tensor, captured before the first update
    out = torch.zeros(len(SHAPES), dtype=torch.float32, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for i, t in enumerate(w.rt.values()):
                out[i] = t.float().sum()
    p = spawn(w.path, 1, 10)
    try:
        for v in range(1, 11):
            res = w.receive()
            assert res["decision"] == 0, res
            check_profile(w.r.profile(), v)
            torch.cuda.synchronize()
            want = weights(v, "cuda")
            for n, t in w.rt.items():
                assert t.data_ptr() == ptrs[n], n
                assert torch.equal(t, want[n]), "v%d %s not bit-exact" % (v, n)
            g.replay()
            torch.cuda.synchronize()
            ref = torch.stack([want[n].float().sum() for n, _ in SHAPES])
            assert torch.allclose(out, ref, rtol=1e-5, atol=1e-3), (v, out, ref)
            assert w.m.fingerprint() == fresh_fingerprint(v), "v%d differs from a fresh load" % v
        st = w.r.stats()
        assert st["updates"] == 10 and st["connections"] == 1, st
        assert st["handles_opened"] >= 1 and st["handles_closed"] == 0, st
        assert st["events_opened"] == 1 and st["source_sets_built"] == 1, st
    finally:
        p.join(60)
        w.close()
    assert p.exitcode == 0, p.exitcode


def test_stalled_trainer_rolls_back():
    import torch
    import refit
    state = {"pid": None, "stop": False}

    def stop_trainer(name):
        # the worker has the whole index, the trainer's memory is live:
        # freeze the trainer so no decision ever comes
        if state["stop"] and state["pid"]:
            os.kill(state["pid"], signal.SIGSTOP)
            state["stop"] = False
        return True

    w = Worker(timeout=1.0, filter=stop_trainer)
    p = spawn(w.path, 1, 2, hold=0)
    state["pid"] = p.pid
    try:
        assert w.receive()["decision"] == 0
        fp1 = w.m.fingerprint()
        state["stop"] = True
        t0 = time.time()
        try:
            w.receive()
            raise AssertionError("a stalled trainer's update committed")
        except refit.RefitError as e:
            assert e.name == "REFIT_ETIMEDOUT", e
            assert "no decision from the trainer" in str(e), e
        assert 0.9 < time.time() - t0 < 10
        assert w.ctx.health() == refit.Health.READY
        assert w.ctx.version == "v1"
        assert w.m.fingerprint() == fp1
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
    q = spawn(w.path, 3, 1)
    try:
        assert w.receive()["decision"] == 0
        torch.cuda.synchronize()
        assert w.ctx.version == "v3"
        assert w.m.fingerprint() == fresh_fingerprint(3)
    finally:
        q.join(60)
        w.close()
    assert q.exitcode == 0


def main():
    why = why_skip()
    if why:
        print("1..0 # SKIP %s" % why)
        return 0
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    print("1..%d" % len(tests))
    bad = 0
    for i, (n, f) in enumerate(tests, 1):
        t0 = time.time()
        try:
            f()
            print("ok %d - %s (%.1f s)" % (i, n, time.time() - t0))
        except Exception:
            bad += 1
            print("not ok %d - %s" % (i, n))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
        sys.stdout.flush()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
