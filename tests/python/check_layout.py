"""The Python binding's ctypes structs match the C layouts (TAP).

usage: check_layout.py LAYOUT_EXE BINDINGS_DIR"""
import json
import subprocess
import sys

sys.path.insert(0, sys.argv[2])
import importlib  # noqa: E402
from refit import _ffi  # noqa: E402  (needs no torch, no library load)

c = json.loads(subprocess.check_output([sys.argv[1]]))
print(f"1..{len(c)}")
for i, (name, want) in enumerate(sorted(c.items()), 1):
    mod, _, short = name.rpartition(".")  # "transport.SendOpts": refit/transport.py
    cls = getattr(importlib.import_module("refit." + mod) if mod else _ffi, short)
    bad = []
    if want["size"] != __import__("ctypes").sizeof(cls):
        bad.append(f"size {__import__('ctypes').sizeof(cls)} != {want['size']}")
    for field, off in want["fields"].items():
        got = getattr(cls, field, None)
        if got is None:
            bad.append(f"no field {field}")
        elif got.offset != off:
            bad.append(f"{field} at {got.offset}, C has {off}")
    print(("not ok" if bad else "ok") + f" {i} - {name}" + (": " + "; ".join(bad) if bad else ""))
