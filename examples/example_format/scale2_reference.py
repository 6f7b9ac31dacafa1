#!/usr/bin/env python3
"""The reference of the example format scale2, for the conformance kit:

    refit-format-conformance --reference="python3 scale2_reference.py" \\
        refit-fmt-scale2.so scale2.yaml case.yaml

The kit runs `CMD REQUEST.json` for each rank and version of each case
(docs/conformance.md, "The reference"). The request names a safetensors
file of checkpoint tensors (this rank's slices), each module's params and
tensors, and the file to write: one tensor "MODULE/NAME" per runtime tensor,
holding the bytes the format must produce. The kit compares them with the
plugin's, byte for byte.

scale2's arithmetic, written apart from the plugin: runtime = 2 x checkpoint
in float32. Needs numpy; safetensors files are read and written here."""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
          "U8": np.uint8, "I16": np.int16, "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(body[a:b], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    names = {np.dtype(v): k for k, v in DTYPES.items()}
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main(request_path):
    with open(request_path) as f:
        req = json.load(f)
    ckpt = read_safetensors(req["checkpoint"])
    out = {}
    for mod in req["modules"]:
        runtime = {r["name"]: r for r in mod["runtime"]}
        for c in mod["checkpoint"]:
            if "tie" in c:
                continue
            rt = runtime[c["target"]] if c["target"] else next(iter(runtime.values()))
            if rt["dtype"] != "F32" or c["dtype"] != "F32":
                sys.exit("scale2 reference: %s: f32 into f32 only" % c["name"])
            x = ckpt[c["name"]].astype(np.float32)
            out[mod["name"] + "/" + rt["name"]] = (x * np.float32(2)).reshape(rt["shape"])
    write_safetensors(req["runtime"], out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: scale2_reference.py REQUEST.json")
    main(sys.argv[1])
