#!/usr/bin/env python3
"""The CUDA backend's tunables against one bench/python_path.py case: each
variant runs the case in its own process (the backend reads its
environment once), round after round so drift between runs shows.

  python3 bench/probes/env_sweep.py OUT.json CASE ROUNDS [VAR=V[,VAR=V]]...

A variant of "-" is the defaults. Prints one JSON line a run; OUT gets all
of them. A probe, not a benchmark: its figures steer the defaults."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIELD = {"safetensors": "ratio_to_h2d_ceiling", "d2d_rollback_host": "ratio_to_d2h_ceiling"}


def parse(v):
    if v == "-":
        return {}
    return dict(kv.split("=", 1) for kv in v.split(","))


def main():
    out, case, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    variants = [parse(v) for v in sys.argv[4:]] or [{}]
    rows = []
    for r in range(rounds):
        for v in variants:
            fd, tmp = tempfile.mkstemp(suffix=".json")
            os.close(fd)
            p = subprocess.run([sys.executable, os.path.join(HERE, "..", "python_path.py"), tmp,
                                "--only", case, "--repeat", "5"], env=dict(os.environ, **v),
                               capture_output=True, text=True, timeout=300)
            row = {"round": r, "case": case, "env": v}
            try:
                with open(tmp) as f:
                    c = json.load(f)["python"][case]
                row.update({k: c[k] for k in ("refit_ms", FIELD.get(case, "ratio_to_ceiling"),
                                              "verified") if k in c})
            except (OSError, ValueError, KeyError):
                row["error"] = (p.stderr or p.stdout)[-400:]
            os.unlink(tmp)
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(out, "w") as f:
        json.dump({"probe": "env_sweep", "case": case, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
