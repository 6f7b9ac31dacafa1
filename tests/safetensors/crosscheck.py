#!/usr/bin/env python3
"""Cross-check for the C safetensors reader, through the reference reader
(the `safetensors` package, whose deserialize() is the Rust implementation).

  crosscheck.py list PATH       one line per tensor, sorted by name:
                                name<TAB>dtype<TAB>d0,d1,..<TAB>bytes<TAB>sha256 of
                                the tensor's bytes<TAB>file name
  crosscheck.py files PATH      one line per file: file name<TAB>sha256 (hashlib)
  crosscheck.py verdict FILE..  one line per file: "ok N" (N tensors) or "error"

PATH is a .safetensors file or a directory with model.safetensors.index.json
(or exactly one .safetensors file). Only hashlib/json from the standard
library and safetensors itself are used, so the bytes are the reference's.
"""
import hashlib
import json
import os
import sys

from safetensors import deserialize

INDEX = "model.safetensors.index.json"


def shard_paths(path):
    if not os.path.isdir(path):
        return [path]
    index = os.path.join(path, INDEX)
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    else:
        names = [n for n in os.listdir(path) if n.endswith(".safetensors")]
    return [os.path.join(path, n) for n in names]


def cmd_list(path):
    rows = []
    for shard in shard_paths(path):
        with open(shard, "rb") as f:
            for name, t in deserialize(f.read()):
                data = bytes(t["data"])
                rows.append((name, t["dtype"], ",".join(str(d) for d in t["shape"]),
                             str(len(data)), hashlib.sha256(data).hexdigest(),
                             os.path.basename(shard)))
    for row in sorted(rows):
        print("\t".join(row))


def cmd_files(path):
    for shard in shard_paths(path):
        with open(shard, "rb") as f:
            print(os.path.basename(shard) + "\t" + hashlib.sha256(f.read()).hexdigest())


def cmd_verdict(files):
    for path in files:
        try:
            with open(path, "rb") as f:
                print("ok %d" % len(deserialize(f.read())))
        except Exception:  # the reference refused it: that is the verdict
            print("error")


def main(argv):
    if len(argv) >= 3 and argv[1] == "list":
        cmd_list(argv[2])
    elif len(argv) >= 3 and argv[1] == "files":
        cmd_files(argv[2])
    elif len(argv) >= 2 and argv[1] == "verdict":
        cmd_verdict(argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
