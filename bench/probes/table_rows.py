#!/usr/bin/env python3
"""What a row of txn.load_dict costs the binding, by the kind of object in
the mapping, all in one process on the host backend: torch CPU tensors
(when torch imports), numpy arrays, objects that only speak DLPack (a
Python __dlpack__ over numpy, as a CuPy or JAX array reaches refit; and
torch tensors seen through __dlpack__ only, when torch imports), and a
torch-like stand-in whose data_ptr/get_device/is_contiguous are C
callables (the cheapest row the table has without torch); with CUDA, the
table alone of the same torch tensors on the device, and of CuPy and JAX
device arrays where those import (their own __dlpack__).

For each kind: the table build alone (refit._batch.Table: what Python
does per row, DLPack capsules consumed and their deleters called; for
DLPack kinds also the producer's own __dlpack__ call, the one the table
makes a row, the rest of the table beyond it, and its __dlpack_device__,
which the table does not ask), and a fresh txn.load_dict of the whole
mapping on a sealed host model (begin, the table, refit_load_many,
abort), microseconds per row, the best of ROUNDS, and the same update
in parts (begin, table, refit_load_many, abort, the table's release).
The model: one module whose runtime tensor is [N, 4] f32, N checkpoint
tensors of [1, 4] placed a row each.

  python3 bench/probes/table_rows.py [N] [OUT.json]     (REFIT_LIB: librefit;
  REFIT_BINDINGS: another bindings/python to time, e.g. an older checkout's)
"""
import json
import operator
import os
import sys
import time

sys.path.insert(0, os.environ.get("REFIT_BINDINGS") or os.path.join(os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bindings", "python"))

import numpy as np  # noqa: E402

import refit  # noqa: E402
from refit import _batch  # noqa: E402
from table_sources import DLPackOnly, row_model  # noqa: E402  (bench/probes/)

ROUNDS = int(os.environ.get("ROUNDS", "5"))


class CLike:
    """torch's fields as C callables (bound builtins), over a numpy array."""

    def __init__(self, a):
        self.a = a
        self.data_ptr = int(a.ctypes.data).__index__
        self.get_device = (-1).__index__
        self.is_contiguous = True.__bool__
        self.is_pinned = False.__bool__
        self.shape = a.shape
        self.dtype = "float32"


def best_us(fn, n):
    out = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6 / n)
    return min(out)


def parts(m, names, vals, n):
    """Where a load_dict's time goes, us a row, each part the best of
    ROUNDS: begin, the table (producer calls included), refit_load_many
    over it, abort, and the table's release after the update (DLPack
    rows: their deleters)."""
    out = {}
    for _ in range(ROUNDS):
        t = [time.perf_counter()]
        txn = m.begin(version="probe", rollback=False)
        t.append(time.perf_counter())
        table = _batch.Table(names, vals)
        t.append(time.perf_counter())
        txn._run("load_dict", _batch.lib().refit_load_many, table.n, table.names_ptr,
                 table.srcs_ptr, txn._stream(None, None))
        t.append(time.perf_counter())
        txn.abort()
        t.append(time.perf_counter())
        del table
        t.append(time.perf_counter())
        for key, a, b in zip(("begin", "table", "refit_load_many", "abort", "release"), t, t[1:]):
            out[key] = min(out.get(key, float("inf")), (b - a) * 1e6 / n)
    return out


def kinds(n):
    base = [np.full((1, 4), i, np.float32) for i in range(n)]
    out = {"numpy": base, "c-getters (torch-like stand-in)": [CLike(a) for a in base],
           "dlpack (Python __dlpack__ over numpy)": [DLPackOnly(a) for a in base]}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        ts = [torch.full((1, 4), float(i)) for i in range(n)]
        out["torch (cpu)"] = ts
        out["dlpack (Python __dlpack__ over torch cpu)"] = [DLPackOnly(t) for t in ts]
        if torch.cuda.is_available():   # the table alone: the model is on the host
            dev = [t.cuda() for t in ts]
            out["torch (cuda), table only"] = dev
            out["dlpack (Python __dlpack__ over torch cuda), table only"] = [DLPackOnly(t)
                                                                              for t in dev]
    for name, make in (("cupy", _cupy_rows), ("jax", _jax_rows)):
        try:
            rows = make(base)
        except Exception as err:  # noqa: BLE001 (not installed, no device: not timed)
            print("%-44s not timed (%s: %s)" % (name, type(err).__name__, err), flush=True)
            continue
        out["dlpack (%s cuda arrays), table only" % name] = rows
    return out


def _cupy_rows(base):
    """CuPy arrays on the device, one a row: views of one array."""
    import cupy
    whole = cupy.asarray(np.concatenate(base))
    return [whole[i:i + 1] for i in range(len(base))]


def _jax_rows(base):
    """JAX arrays on the GPU, one a row (each its own buffer)."""
    import jax
    gpu = jax.devices("gpu")[0]
    return jax.device_put(base, gpu)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
    ctx, m, w = row_model(refit, n, 4)
    names = ["t%d" % i for i in range(n)]
    res = {}
    for kind, vals in kinds(n).items():
        src = dict(zip(names, vals))

        def update():
            txn = m.begin(version="probe", rollback=False)
            try:
                txn.load_dict(src)
            finally:
                txn.abort()
        try:
            res[kind] = {"table_us_per_row": best_us(lambda: _batch.Table(names, vals), n)}
        except Exception as err:  # noqa: BLE001 (an older binding: say what it raised)
            res[kind] = {"error": "%s: %s" % (type(err).__name__, err)}
            print("%-44s %s" % (kind, res[kind]["error"]), flush=True)
            continue
        if kind.startswith("dlpack"):   # the producer's own calls, which any consumer makes
            ask = operator.methodcaller("__dlpack__", max_version=(1, 0))

            def producer():     # what the table asks: one __dlpack__ a row, no stream
                list(map(ask, vals))

            def device():       # asked by describe() (one load) to choose a stream
                list(map(operator.methodcaller("__dlpack_device__"), vals))
            res[kind]["producer_us_per_row"] = best_us(producer, n)
            res[kind]["dlpack_device_us_per_row"] = best_us(device, n)
            # what the table costs beyond the producer's one call a row
            res[kind]["refit_us_per_row"] = (res[kind]["table_us_per_row"]
                                             - res[kind]["producer_us_per_row"])
        if "table only" not in kind:
            update()    # once, checked: every row landed
            assert (w[n // 2] == n // 2).all(), (kind, w[n // 2])
            w[:] = 0
            res[kind]["load_dict_us_per_row"] = best_us(update, n)
            res[kind]["load_dict_parts_us_per_row"] = parts(m, names, vals, n)
        print("%-44s table %6.3f us/row   load_dict %6s us/row%s"
              % (kind, res[kind]["table_us_per_row"],
                 "%.3f" % res[kind]["load_dict_us_per_row"]
                 if "load_dict_us_per_row" in res[kind] else "-",
                 "   (the producer's __dlpack__: %.3f, the rest: %.3f; __dlpack_device__: %.3f)"
                 % (res[kind]["producer_us_per_row"], res[kind]["refit_us_per_row"],
                    res[kind]["dlpack_device_us_per_row"])
                 if "producer_us_per_row" in res[kind] else ""), flush=True)
    ctx.close()
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump({"probe": "table_rows", "rows": n, "rounds": ROUNDS, "kinds": res}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
