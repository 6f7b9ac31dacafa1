#!/usr/bin/env python3
"""What building load_dict's descriptor table costs, getter by getter: each
of the torch calls refit._batch.Table makes, mapped over the 147 tensors
of bench/python_path.py's Dense model (as the table maps them), then the
whole table build. Microseconds per tensor, medians of 200 rounds; then
what an update costs around its loads (begin, stream look-ups).

  python3 bench/probes/table_getters.py [OUT.json]
"""
import ctypes
import json
import operator
import os
import statistics
import sys
import time

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def per_update(pp, d):
    """What an update costs on the host before and around its loads: begin,
    abort, the stream look-ups, an event record (microseconds, medians of
    400)."""
    import refit
    import torch
    from refit.torch_util import default_stream
    ctx = pp.context()
    m = d.model(ctx)
    ev = torch.cuda.Event(enable_timing=True)

    def us(fn):
        out = []
        for _ in range(400):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(out)

    def begin_abort():
        m.begin(version="bench", rollback=False).abort()
    lib = refit._ffi.lib()
    h = ctypes.c_void_p()

    def c_begin_abort():
        lib.refit_begin(ctypes.byref(h), m.handle, None)
        lib.refit_abort(h)
    dev = torch.cuda.current_device()
    out = {
        "Model.begin + Txn.abort": us(begin_abort),
        "refit_begin + refit_abort (ctypes)": us(c_begin_abort),
        "torch.cuda.current_stream().cuda_stream": us(
            lambda: torch.cuda.current_stream(dev).cuda_stream),
        "torch._C._cuda_getCurrentRawStream": us(
            lambda: torch._C._cuda_getCurrentRawStream(dev)),
        "torch_util.default_stream": us(lambda: default_stream((2, dev))),
        "Event.record": us(ev.record),
    }
    return out


def main():
    sys.path.insert(0, BENCH)
    import python_path as pp     # noqa: E402
    import torch
    from refit import _batch

    d = pp.Dense()
    ts = list(d.srcs.values())
    n = len(ts)
    getters = {
        "data_ptr()": operator.methodcaller("data_ptr"),
        "get_device()": operator.methodcaller("get_device"),
        ".dtype": operator.attrgetter("dtype"),
        ".shape": operator.attrgetter("shape"),
        "stride()": operator.methodcaller("stride"),
        "is_contiguous()": operator.methodcaller("is_contiguous"),
    }

    def per_tensor_us(fn, rounds=200):
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6 / n)
        return statistics.median(out)
    # the same fields read through the unbound descriptors (no bound
    # method made per tensor, no attribute look-up by name)
    T = torch.Tensor
    getters.update({
        "T.data_ptr": T.data_ptr, "T.get_device": T.get_device,
        "T.dtype.__get__": T.dtype.__get__, "T.shape.__get__": T.shape.__get__,
        "T.is_contiguous": T.is_contiguous, ".is_cuda": operator.attrgetter("is_cuda"),
        ".device": operator.attrgetter("device"),
    })
    res = {k: per_tensor_us(lambda g=g: list(map(g, ts))) for k, g in getters.items()}
    names, values = _batch.split(d.srcs)
    res["Table (whole build)"] = per_tensor_us(lambda: _batch.Table(names, values))
    res["split + Table (load_dict's Python)"] = per_tensor_us(
        lambda: _batch.Table(*_batch.split(d.srcs)))
    mine = _batch._getters      # the table as it was: every method looked up by name
    _batch._getters = lambda ts: _batch._BY_NAME
    res["Table, methods by name"] = per_tensor_us(lambda: _batch.Table(names, values))
    _batch._getters = mine
    for k, v in res.items():
        print("%-36s %6.3f us/tensor  %6.1f us for %d" % (k, v, v * n, n))
    upd = per_update(pp, d)
    for k, v in upd.items():
        print("%-36s %7.2f us" % (k, v))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"probe": "table_getters", "tensors": n, "us_per_tensor": res,
                       "us_per_update": upd}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
