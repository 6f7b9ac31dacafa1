#!/usr/bin/env python3
"""Can the GPU read a page-cached file straight from the page cache?
Registers a read-only mapping of the file with cudaHostRegister (pinning
the page cache's own pages, no host copy) and times: the registration, one
H2D copy from the registered mapping, the unregistration, whole and in
64 MiB pieces pipelined (register piece k+1 while piece k crosses PCIe);
against one pinned H2D copy and a CPU copy of the mapping into pinned
memory, in the same process.

  python3 bench/probes/st_register.py OUT.json [--reps N] [--piece-mb M]
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROT_READ, MAP_SHARED = 1, 1
REG_PORTABLE, REG_READONLY = 1, 8


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--piece-mb", type=int, default=64)
    a = ap.parse_args()
    sys.path.insert(0, BENCH)
    import python_path as pp   # noqa: E402
    import torch

    cudart = torch.cuda.cudart()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    d = pp.Dense()
    fd, path = tempfile.mkstemp(suffix=".safetensors")
    os.close(fd)
    res = {"probe": "st_register", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        pp.write_safetensors(path, d)
        with open(path, "rb") as f:
            while f.read(1 << 26):
                pass
        size = os.path.getsize(path)
        n = d.bytes
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)

        def h2d_pinned():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            d.rt_flat.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3

        f = open(path, "rb")
        rows = []
        for rep in range(a.reps):
            base = libc.mmap(None, size, PROT_READ, MAP_SHARED, f.fileno(), 0)
            assert base and base != ctypes.c_void_p(-1).value, ctypes.get_errno()
            arr = (ctypes.c_uint8 * size).from_address(base)
            src = torch.frombuffer(arr, dtype=torch.uint8)[:n]
            row = {"h2d_pinned_ms": h2d_pinned()}
            t0 = time.perf_counter()
            pinned.copy_(src)
            row["cpu_copy_ms"] = (time.perf_counter() - t0) * 1e3
            # whole: register, copy, unregister
            t0 = time.perf_counter()
            err = cudart.cudaHostRegister(base, size, REG_PORTABLE | REG_READONLY)
            t1 = time.perf_counter()
            row["register_err"] = int(err)
            row["register_ms"] = (t1 - t0) * 1e3
            if int(err) == 0:
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                d.rt_flat.copy_(src, non_blocking=True)
                torch.cuda.synchronize()
                t3 = time.perf_counter()
                row["h2d_registered_ms"] = (t3 - t2) * 1e3
                row["equal"] = bool(torch.equal(d.rt_flat[:1 << 20].cpu(), src[:1 << 20]))
                err = cudart.cudaHostUnregister(base)
                row["unregister_ms"] = (time.perf_counter() - t3) * 1e3
                row["unregister_err"] = int(err)
            libc.munmap(base, size)
            # pieces, pipelined: register k, queue its copy, unregister k-2
            base = libc.mmap(None, size, PROT_READ, MAP_SHARED, f.fileno(), 0)
            arr = (ctypes.c_uint8 * size).from_address(base)
            src = torch.frombuffer(arr, dtype=torch.uint8)[:n]
            piece = a.piece_mb << 20
            regs, evs, t_reg, t_unreg = [], [], 0.0, 0.0
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ok = True
            for off in range(0, n, piece):
                ln = min(piece, n - off)
                r0 = time.perf_counter()
                e = cudart.cudaHostRegister(base + off, ln, REG_PORTABLE | REG_READONLY)
                t_reg += time.perf_counter() - r0
                if int(e):
                    ok = False
                    row["piece_register_err"] = int(e)
                    break
                d.rt_flat[off:off + ln].copy_(src[off:off + ln], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record()
                regs.append(base + off)
                evs.append(ev)
                if len(regs) > 2:
                    evs[0].synchronize()
                    u0 = time.perf_counter()
                    cudart.cudaHostUnregister(regs[0])
                    t_unreg += time.perf_counter() - u0
                    regs.pop(0)
                    evs.pop(0)
            torch.cuda.synchronize()
            for r in regs:
                u0 = time.perf_counter()
                cudart.cudaHostUnregister(r)
                t_unreg += time.perf_counter() - u0
            if ok:
                row["pieces_ms"] = (time.perf_counter() - t0) * 1e3
                row["pieces_register_ms"] = t_reg * 1e3
                row["pieces_unregister_ms"] = t_unreg * 1e3
                row["pieces_equal"] = bool(torch.equal(d.rt_flat[-(1 << 20):].cpu(),
                                                       src[-(1 << 20):]))
            del src, arr
            libc.munmap(base, size)
            rows.append(row)
            print(json.dumps(row), flush=True)
        f.close()
        res["rows"] = rows
        res["summary"] = {k: statistics.median(r[k] for r in rows if k in r)
                          for k in rows[0] if isinstance(rows[0][k], float)}
    finally:
        os.unlink(path)
    print(json.dumps(res.get("summary"), indent=1))
    if a.out:
        with open(a.out, "w") as fo:
            json.dump(res, fo, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
