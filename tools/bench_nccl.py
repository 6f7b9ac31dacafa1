"""The PyTorch peer of `refit-bench nccl`: the same Llama-shaped bf16 model
broadcast from GPU 0 to GPU 1 one tensor at a time with
torch.distributed.broadcast (what an RL trainer's weight sync loop does),
and one flat broadcast of all bytes, best of --repeat. Prints one JSON
object; tests/nccl/run_gpu.sh puts it beside refit's figures.

    python3 tools/bench_nccl.py [--layers 4] [--hidden 4096] [--inter 14336]
                                [--vocab 32000] [--repeat 3]
"""
import argparse
import json
import os
import sys
import tempfile
import time


def shapes(a):
    h, i = a.hidden, a.inter
    out = [(a.vocab, h)]
    for _ in range(a.layers):
        out += [(h,), (3 * h, h), (h, h), (h,), (2 * i, h), (h, i)]
    return out + [(h,), (a.vocab, h)]


def rank_main(rank, a, init, q):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=2)
    ts = [torch.empty(s, dtype=torch.bfloat16, device=rank) for s in shapes(a)]
    flat = torch.empty(sum(t.numel() for t in ts), dtype=torch.bfloat16, device=rank)
    best_loop = best_flat = 1e30
    for r in range(a.repeat + 1):  # the first is a warm-up
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for t in ts:
            dist.broadcast(t, 0)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        dist.broadcast(flat, 0)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if r:
            best_loop, best_flat = min(best_loop, t1 - t0), min(best_flat, t2 - t1)
    if rank == 1:
        q.put({"torch_per_tensor_broadcast_s": best_loop, "torch_flat_broadcast_s": best_flat,
               "tensors": len(ts), "bytes": 2 * flat.numel(), "torch": torch.__version__,
               "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for k, v in (("layers", 4), ("hidden", 4096), ("inter", 14336), ("vocab", 32000),
                 ("repeat", 3)):
        p.add_argument("--" + k, type=int, default=v)
    a = p.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(json.dumps({"skipped": "no torch: %s" % e}))
        return 0
    if torch.cuda.device_count() < 2:
        print(json.dumps({"skipped": "%d CUDA device(s)" % torch.cuda.device_count()}))
        return 0
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = "file://" + os.path.join(tempfile.mkdtemp(), "rendezvous")
    ps = [ctx.Process(target=rank_main, args=(r, a, init, q)) for r in range(2)]
    for x in ps:
        x.start()
    res = q.get(timeout=600)
    for x in ps:
        x.join()
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
