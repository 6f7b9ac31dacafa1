#!/usr/bin/env python3
"""Run the Python GPU tests (tests/gpu/py_*.py: every function test_*) and
print TAP. Where torch, a CUDA device or librefit.so is missing, prints a
skipped plan ("1..0 # SKIP ...") so the run counts as skipped.

Usage: run_py.py [NAME_SUBSTRING ...]   (env: REFIT_LIB, REFIT_SOURCE_ROOT,
REFIT_GPU_OUT: a folder for logs and figures)"""
import importlib.util
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("REFIT_SOURCE_ROOT") or os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
sys.path.insert(0, HERE)


def why_skip():
    lib = os.environ.get("REFIT_LIB")
    if lib and not os.path.exists(lib):
        return "no library at REFIT_LIB=%s" % lib
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import refit
        refit.Context().close()
    except Exception as e:  # no library, or one without exports
        return "librefit unusable: %s" % e
    return None


def collect(filters):
    tests = []
    for fn in sorted(os.listdir(HERE)):
        if not (fn.startswith("py_") and fn.endswith(".py")):
            continue
        spec = importlib.util.spec_from_file_location(fn[:-3], os.path.join(HERE, fn))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for name in sorted(dir(mod)):
            if name.startswith("test_") and callable(getattr(mod, name)):
                full = "%s.%s" % (fn[:-3], name)
                if not filters or any(f in full for f in filters):
                    tests.append((full, getattr(mod, name)))
    return tests


def main():
    reason = why_skip()
    if reason:
        print("1..0 # SKIP %s" % reason)
        return 0
    tests = collect(sys.argv[1:])
    print("1..%d" % len(tests), flush=True)
    for i, (name, fn) in enumerate(tests, 1):
        t0 = time.time()
        try:
            fn()
        except Exception as e:
            if type(e).__name__ == "Skip":  # any test module's own Skip
                print("ok %d - %s # SKIP %s" % (i, name, e), flush=True)
                continue
            print("not ok %d - %s" % (i, name))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
            sys.stdout.flush()
            continue
        print("ok %d - %s (%.1f s)" % (i, name, time.time() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
