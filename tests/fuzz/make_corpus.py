#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_safetensors into tests/fuzz/corpus/.

Byte 0 of each seed selects the parser (0: whole file, 1: index), as the
fuzz target expects. Seeds: the tiny-Llama fixture's shards and index, and
small files covering every dtype, rank 0, zero-size tensors, metadata and
an unpadded header. Plain Python (struct, json): no third-party package.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "data", "hf-tiny-llama-sharded")
OUT = os.path.join(HERE, "corpus")

BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8,
        "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
        "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
        "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
        "U64": 64}


def st_file(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape); data bytes are a counter."""
    header, pos = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        size = n * BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + size]}
        pos += size
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + bytes(i & 0xFF for i in range(pos))


def seeds():
    for name in sorted(os.listdir(FIXTURE)):
        with open(os.path.join(FIXTURE, name), "rb") as f:
            data = f.read()
        if name.endswith(".safetensors"):
            yield "fixture-" + name[:-12], b"\0" + data
        elif name.endswith(".index.json"):
            yield "fixture-index", b"\1" + data
    yield "all-dtypes", b"\0" + st_file([("t." + d, d, [2, 4]) for d in BITS])
    yield "rank0-zero", b"\0" + st_file([("scalar", "F32", []), ("empty", "BF16", [0, 7]),
                                         ("after", "I8", [3])])
    yield "metadata", b"\0" + st_file([("w", "F16", [2])], {"format": "pt", "k": "v"})
    yield "unpadded", b"\0" + st_file([("a", "U8", [3]), ("b", "F32", [1])], pad=False)
    yield "empty", b"\0" + st_file([])
    yield "index-min", b"\1" + json.dumps({"weight_map": {"a": "x.safetensors"}}).encode()
    yield "index-meta", b"\1" + json.dumps({
        "metadata": {"total_size": 12, "format": "pt"},
        "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s1.safetensors"},
    }).encode()


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in seeds():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
