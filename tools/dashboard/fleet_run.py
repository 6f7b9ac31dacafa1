"""A small fleet of real refit workers on the host backend, driven through
a scripted run while their metrics are scraped: the data behind
docs/operators-dashboard.png (tools/dashboard/render.py).

Two groups (the scrape job of each: tp-a with 3 ranks, tp-b with 2), one
journal per group. Every round the trainer pushes a new version to each
worker, tensor by tensor with a pause between tensors (a transfer), and
between tensors the scraper reads every live worker's Context.metrics()
(parsed with prometheus_client's text parser) when a scrape is due. What
happens, round by round:
  3  tp-a rank 2's update is aborted by the caller (rolled back): tp-a
     holds two versions until round 4
  5  tp-b rank 1's update misses a tensor: finalize refuses it (rolled back)
  6  tp-b rank 0 loads a safetensors file without rollback and aborts:
     POISONED until round 8, when refit_replay finishes that update
  9  tp-a rank 1 restarts (a new context, EMPTY until its first update;
     its counters start again)"""
import os
import struct
import tempfile
import time

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

import refit

MODULES = 6
SHAPE = (128, 256)   # float32: 128 KiB a tensor
GROUPS = (("tp-a", 3), ("tp-b", 2))


def _write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    import json
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for a in tensors.values():
            f.write(a.tobytes())


class Worker:
    def __init__(self, job, rank, journal):
        self.job, self.rank, self.journal = job, rank, journal
        self.id = "%s-r%d" % (job, rank)
        self.start()

    def start(self):
        self.ctx = refit.Context(worker_id=self.id, rank=self.rank, journal_path=self.journal)
        self.model = self.ctx.create_model()
        self.runtime = {}
        for m in range(MODULES):
            name = "layers.%d.mlp" % m
            self.runtime[name] = np.zeros(SHAPE, dtype=np.float32)
            self.model.add_module(name)
            self.model.bind_runtime(name, "weight", self.runtime[name])
            self.model.expect(name, name + ".weight", "f32", list(SHAPE))
        self.model.seal()

    def restart(self):
        self.ctx.close()
        self.start()


class Run:
    """The fleet, the clock and the samples: store.add(t, name, labels, v)."""

    def __init__(self, store, interval, pause):
        self.store, self.interval, self.pause = store, interval, pause
        self.dir = tempfile.mkdtemp(prefix="refit-dashboard-")
        self.workers = [Worker(job, r, os.path.join(self.dir, job + ".db"))
                        for job, n in GROUPS for r in range(n)]
        self.next_scrape = 0.0
        self.weights = {"layers.%d.mlp.weight" % m: np.full(SHAPE, m, dtype=np.float32)
                        for m in range(MODULES)}

    def scrape(self, force=False):
        now = time.time()
        if now < self.next_scrape and not force:
            return
        self.next_scrape = now + self.interval
        for w in self.workers:
            for fam in text_string_to_metric_families(w.ctx.metrics()):
                for s in fam.samples:
                    labels = dict(s.labels, job=w.job, instance=w.id)
                    self.store.add(now, s.name, labels, float(s.value))

    def wait(self, seconds):
        end = time.time() + seconds
        while time.time() < end:
            self.scrape()
            time.sleep(min(0.05, max(0.0, end - time.time())))

    def load_all(self, txn, skip=None):
        for name, a in self.weights.items():
            if name == skip:
                continue
            txn.load(name, a + 0)
            self.wait(self.pause)

    def update(self, w, version, rnd):
        if (rnd, w.id) == (3, "tp-a-r2"):
            txn = w.model.begin(version=version)
            self.load_all(txn)
            assert txn.abort("the trainer dropped this rank's push") is True
            return
        if (rnd, w.id) == (5, "tp-b-r1"):
            txn = w.model.begin(version=version)
            self.load_all(txn, skip="layers.5.mlp.weight")
            try:
                txn.finalize()
                raise AssertionError("an incomplete update was committed")
            except refit.RefitError as err:
                assert err.name == "REFIT_EINCOMPLETE", err
            return
        if (rnd, w.id) == (6, "tp-b-r0"):
            path = os.path.join(self.dir, "step-6.safetensors")
            _write_safetensors(path, self.weights)
            txn = w.model.begin(version=version, source_uri="file://" + path, rollback=False)
            txn.load_safetensors(path)
            self.poisoned = (w, txn.journal_id)
            assert txn.abort("the trainer died after the copy") is False
            return
        if w.ctx.health() == refit.Health.POISONED:
            if rnd == 8:
                w.model.replay(self.poisoned[1])
            return
        if (rnd, w.id) == (9, "tp-a-r1"):
            w.restart()
            self.wait(1.5 * self.interval)  # EMPTY until its first update
        with w.model.update(version=version) as txn:
            self.load_all(txn)

    def run(self, rounds, period):
        t0 = time.time()
        self.scrape(force=True)
        for rnd in range(1, rounds + 1):
            start = time.time()
            for w in self.workers:
                self.update(w, "step-%d" % rnd, rnd)
            self.wait(max(0.0, start + period - time.time()))
        self.scrape(force=True)
        for w in self.workers:
            w.ctx.close()
        return t0, time.time()
