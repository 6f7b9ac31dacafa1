#!/usr/bin/env python3
"""What building load_dict's descriptor table costs, getter by getter: each
of the torch calls refit._batch.Table makes, mapped over the 147 tensors
of bench/python_path.py's Dense model (as the table maps them), then the
whole table build. Microseconds per tensor, medians of 200 rounds.

  python3 bench/probes/table_getters.py [OUT.json]
"""
import json
import operator
import os
import statistics
import sys
import time

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    sys.path.insert(0, BENCH)
    import python_path as pp     # noqa: E402
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
    res = {k: per_tensor_us(lambda g=g: list(map(g, ts))) for k, g in getters.items()}
    names, values = _batch.split(d.srcs)
    res["Table (whole build)"] = per_tensor_us(lambda: _batch.Table(names, values))
    res["split + Table (load_dict's Python)"] = per_tensor_us(
        lambda: _batch.Table(*_batch.split(d.srcs)))
    for k, v in res.items():
        print("%-36s %6.3f us/tensor  %6.1f us for %d" % (k, v, v * n, n))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"probe": "table_getters", "tensors": n, "us_per_tensor": res}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
