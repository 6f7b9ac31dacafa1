#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_ipc into tests/fuzz/corpus-ipc/.

Each seed is byte 0 (the decoder: 0 HELLO, 1 a member's HELLO, 2 MEMS,
3 INDEX, 4 UPDATE, 5 a status message, 6 K_OFFER; top bit: byte 1 is the
frame's type), byte 1 (the decoder's argument, see fuzz_ipc.c) and the
payload: frames laid out as transports/ipc/msg.h and keeper_msg.h describe them,
each accepted by its decoder unless its name says "refused". INDEX seeds
leave the announce's checksum zero: an odd argument has the harness write
it. Plain Python (struct): no third-party package.
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus-ipc")
HELLO, MEMBER, MEMS, INDEX, UPDATE, STATUS, OFFER = range(7)


def hello(role, pid=4242, rank=0, workers=2):
    return struct.pack("<IIiI", role, pid, rank, workers)


def mem(mid, kind, device, nbytes, gen=1):
    return struct.pack("<IIHHiQ", mid, gen, kind, 0, device, nbytes) + bytes(range(64))


def mems(epoch, recs, event=False):
    head = struct.pack("<IIII", epoch, len(recs), 1 if event else 0, 0)
    return head + (bytes(64) if event else b"") + b"".join(recs)


def announce(n_buckets, header, total, index_bytes):
    a = struct.pack("<IHHIIQQQQQQQ", 0x4E415452, 5, 0, n_buckets, header, 0x1234,
                    total, total, total - header, 1, index_bytes, 0)
    return a + bytes(128 - len(a))   # reserved bytes, then the checksum (zero)


def index(iid, epoch, refs, header=80):
    n = len(refs)
    body = struct.pack("<IIII", iid, epoch, n, 0)
    body += b"".join(struct.pack("<IIQ", m, 0, off) for m, off in refs)
    return body + announce(n, header, header + 16, header * n) + bytes(header * n)


def update(seq, epoch, iid, n, label, sums=None):
    flags = (1 if seq % 2 else 0) | (2 if sums is not None else 0)
    lb = label.encode()
    body = struct.pack("<QIIIIHHI", seq, epoch, flags, iid, n, len(lb), 0, 0) + lb
    return body + b"".join(struct.pack("<Q", s) for s in (sums or []))


def status(seq, st, msg):
    m = msg.encode()
    return struct.pack("<QiH", seq, st, len(m)) + m


def offer_refusal(st, msg):
    m = msg.encode()
    return struct.pack("<iHH", st, len(m), 0) + m


def offer(label, worker, sig, fps, places, update_id=7, pid=99):
    lb, wk, sg = label.encode(), worker.encode(), sig.encode()
    body = struct.pack("<iHH", 0, 0, 0)
    body += struct.pack("<IIIHHqII", len(fps), len(places), len(sg), len(lb), len(wk),
                        update_id, pid, 0)
    body += lb + wk + sg + b"".join(struct.pack("<Q", f) for f in fps)
    body += b"".join(struct.pack("<IIQQQ", m, 0, d, s, b) for m, d, s, b in places)
    return body


SEEDS = {
    "hello-trainer": (HELLO, 0, hello(1)),
    "hello-worker": (HELLO, 1, hello(2, rank=1)),
    "hello-member-keeper": (MEMBER, 0, hello(4, rank=-1, workers=0)),
    "hello-wrong-type-refused": (HELLO | 0x80, 2, hello(1)),
    "mems-cuda-event": (MEMS, 0, mems(1, [mem(1, 1, 0, 1 << 20), mem(2, 1, 1, 4096)], True)),
    "mems-host-fd": (MEMS, 1, mems(2, [mem(5, 2, -1, 65536)])),
    "mems-mixed": (MEMS, 2, mems(3, [mem(1, 2, -1, 8), mem(9, 1, 0, 8), mem(4, 2, -1, 8)])),
    "mems-empty": (MEMS, 0, mems(4, [])),
    "index-one": (INDEX, 41, index(1, 1, [(1, 0)])),
    "index-three": (INDEX, 41, index(2, 3, [(1, 0), (1, 4096), (2, 0)])),
    "update-plain": (UPDATE, 0, update(2, 1, 1, 1, "step-7")),
    "update-sums": (UPDATE, 0, update(3, 1, 2, 3, "v3", [1, 2, 0xFFFFFFFFFFFFFFFF])),
    "update-no-label": (UPDATE, 0, update(4, 2, 1, 2, "")),
    "status-vote-ok": (STATUS, 0, status(0, 0, "")),
    "status-decision-abort": (STATUS, 9, status(12, -5, "worker 1: checksum mismatch")),
    "status-k-done": (STATUS, 3, status(0, -3, "tensor w: no room")),
    "offer-refusal": (OFFER, 0, offer_refusal(-2, "no such model")),
    "offer-whole": (OFFER, 0x44, offer("step-7", "w0", '{"a":1}', [1, 2],
                                       [(1, 0, 0, 64), (2, 128, 64, 256)])),
    "offer-no-runtime": (OFFER, 0x01, offer("", "keeper-a", "{}", [0xABCDEF], [])),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else OUT
    os.makedirs(out, exist_ok=True)
    for name, (dec, arg, payload) in sorted(SEEDS.items()):
        with open(os.path.join(out, name), "wb") as fp:
            fp.write(bytes([dec, arg]) + payload)


if __name__ == "__main__":
    main()
