"""Metrics (issue 33) through the binding on the host backend: ctx.metrics()
and refit.prometheus.Collector read by prometheus_client's own text parser,
counters moved by a scripted sequence (commit, refusal, rollback, a
poisoned worker, a replay), `refitctl metrics` over the same journal
agreeing with the live context (a snapshot restore added), many journals in one file, the textfile
written atomically, and `promtool check metrics` where promtool is found
(PATH or $PROMTOOL). TAP; skipped when the venv lacks prometheus_client.

usage: test_metrics.py   (env: REFIT_LIB, REFIT_SOURCE_ROOT, REFITCTL)"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.environ["REFIT_SOURCE_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

try:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("1..0 # SKIP prometheus_client is not in the venv: run scripts/deps.sh BUILD_DIR")
    sys.exit(0)

import numpy as np  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import refit  # noqa: E402
from refit.prometheus import Collector  # noqa: E402
import harness  # noqa: E402  (tests/python/harness.py)

TMP = tempfile.mkdtemp(prefix="refit-metrics-")
REFITCTL = os.environ["REFITCTL"]
# refitctl's own environment: under a sanitizer it carries its runtime
# itself; the one preloaded into python would clash with it
CTL_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
NAMES = ["a", "b", "c"]
SHAPE = (64, 16)
TB = 64 * 16 * 4  # bytes of one f32 [64, 16] tensor


class Worker:
    """Three modules of one f32 [64, 16] tensor each, journaled."""

    def __init__(self, journal, worker_id="py-metrics", rank=0):
        self.rt = {n: np.zeros(SHAPE, np.float32) for n in NAMES}
        self.ctx = refit.Context(worker_id=worker_id, rank=rank, journal_path=journal)
        m = self.model = self.ctx.create_model()
        for n in NAMES:
            m.add_module(n)
            m.bind_runtime(n, "w", self.rt[n])
            m.expect(n, n, np.float32, list(SHAPE))
        m.seal()


def ck(seed):
    r = np.random.default_rng(seed)
    return {n: r.standard_normal(SHAPE).astype(np.float32) for n in NAMES}


def samples(text):
    """{(sample name, labels without worker and rank, worker): value},
    through the reference parser."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = dict(s.labels)
            who = (labels.pop("worker"), labels.pop("rank"))
            key = (s.name, tuple(sorted(labels.items())), who)
            assert key not in out, "series twice: %r" % (key,)
            out[key] = s.value
    return out


def val(text, name, worker=("py-metrics", "0"), **labels):
    return samples(text).get((name, tuple(sorted(labels.items())), worker))


def refitctl(*args):
    return subprocess.run([REFITCTL, "metrics"] + list(args), capture_output=True, text=True,
                          env=CTL_ENV)


def scripted(journal):
    """The sequence both sides are checked on; returns the worker."""
    w = Worker(journal)
    with w.model.update(version="v1") as txn:
        txn.load_dict(ck(1))
    # a refusal: an unknown name fails the update closed; the caller aborts
    txn = w.model.begin(version="v2")
    harness.raises("REFIT_EUNEXPECTED", lambda: txn.load("nope", np.zeros(SHAPE, np.float32)))
    txn.abort()
    # a write rolled back
    txn = w.model.begin(version="v2")
    txn.load("a", ck(2)["a"])
    txn.abort()
    # poisoned: a file update without rollback, aborted after one tensor
    f = os.path.join(TMP, "v2-%d.safetensors" % len(os.listdir(TMP)))
    save_file(ck(2), f)
    with w.ctx.open_source(f) as src:
        uri, ident = src.uri, src.identity()
    txn = w.model.begin(version="v2", source_uri=uri, source_digest=ident, rollback=False)
    txn.load("a", ck(2)["a"])
    uid = txn.journal_id
    txn.abort("trainer lost")
    assert w.ctx.health() == refit.Health.POISONED
    w.model.replay(uid)
    assert w.ctx.health() == refit.Health.READY and w.ctx.version == "v2"
    return w


def test_counters_follow_the_sequence():
    w = scripted(os.path.join(TMP, "seq.db"))
    t = w.ctx.metrics()
    assert val(t, "refit_updates_started_total") == 5
    assert val(t, "refit_updates_committed_total") == 2
    assert val(t, "refit_updates_aborted_total", reason="caller") == 3
    assert val(t, "refit_updates_poisoned_total", reason="caller") == 1
    assert val(t, "refit_rollbacks_total") == 1
    assert val(t, "refit_replays_started_total") == 1
    assert val(t, "refit_replays_committed_total") == 1
    assert val(t, "refit_refusals_total", status="REFIT_EUNEXPECTED") == 1
    assert val(t, "refit_source_bytes_total", source="memory") == 3 * TB + TB
    assert val(t, "refit_source_bytes_total", source="file") == TB + 3 * TB
    assert val(t, "refit_health", state="ready") == 1
    assert val(t, "refit_health", state="poisoned") == 0
    assert val(t, "refit_version_info", version="v2") == 1
    assert val(t, "refit_update_duration_seconds_count", outcome="aborted") == 3
    assert val(t, "refit_update_phase_seconds_count", phase="post_load") == 5
    assert val(t, "refit_update_bytes_bucket", le="1024") == 1  # the refused update: 0 bytes
    assert val(t, "refit_update_bytes_bucket", le="4096") == 3  # and the one-tensor updates
    assert val(t, "refit_update_bytes_bucket", le="+Inf") == 5
    w.ctx.close()


def test_collector_serves_two_workers():
    a = Worker("", worker_id="wa", rank=0)
    b = Worker("", worker_id="wb", rank=1)
    with a.model.update(version="x") as txn:
        txn.load_dict(ck(3))
    reg = CollectorRegistry()
    reg.register(Collector(a.ctx, b.ctx))
    text = generate_latest(reg).decode()
    assert text.count("# TYPE refit_updates_committed_total counter") == 1, text[:400]
    s = samples(text)
    assert s[("refit_updates_committed_total", (), ("wa", "0"))] == 1
    assert s[("refit_updates_committed_total", (), ("wb", "1"))] == 0
    assert s[("refit_health", (("state", "empty"),), ("wb", "1"))] == 1
    try:
        Collector()
    except ValueError as err:
        assert "at least one" in str(err)
    else:
        raise AssertionError("Collector() accepted no context")


# What a journal cannot tell (docs/operators.md "Metrics": context only),
# and the figures whose clocks differ (the journal keeps milliseconds).
CONTEXT_ONLY = ("refit_refusals_total", "refit_route_bytes_total", "refit_update_phase_seconds",
                "refit_staging_peak_bytes")
TIMED = ("refit_update_duration_seconds_bucket", "refit_update_duration_seconds_sum",
         "refit_version_commit_time_seconds")


def test_refitctl_agrees_with_the_context():
    db = os.path.join(TMP, "agree.db")
    w = scripted(db)
    # and a restore from a snapshot (journaled with a snapshot:// source)
    snap = os.path.join(TMP, "agree.snap")
    w.model.snapshot(snap)
    with w.model.update(version="v3") as txn:
        txn.load_dict(ck(3))
    w.model.restore(snap)
    assert w.ctx.version == "v2"
    live = samples(w.ctx.metrics())
    r = refitctl("--db", db)
    assert r.returncode == 0, r.stderr
    from_journal = samples(r.stdout)
    assert from_journal, r.stdout[:300]
    for key, v in live.items():
        if key[0].startswith(CONTEXT_ONLY):
            assert key not in from_journal, key
        elif key[0] in TIMED:
            assert key in from_journal, key
        else:
            assert from_journal.get(key) == v, (key, v, from_journal.get(key))
    assert set(from_journal) <= set(live), set(from_journal) - set(live)
    who = ("py-metrics", "0")
    assert from_journal[("refit_restores_committed_total", (), who)] == 1
    assert from_journal[("refit_replays_committed_total", (), who)] == 1
    assert from_journal[("refit_updates_poisoned_total", (("reason", "caller"),), who)] == 1
    stamp = ("refit_version_commit_time_seconds", (), who)
    assert abs(from_journal[stamp] - live[stamp]) < 2, (from_journal[stamp], live[stamp])
    w.ctx.close()


def test_refitctl_many_journals_one_file():
    dbs = []
    for i in range(2):
        dbs.append(os.path.join(TMP, "many-%d.db" % i))
        w = Worker(dbs[-1], worker_id="rank%d" % i, rank=i)
        with w.model.update(version="s%d" % i) as txn:
            txn.load_dict(ck(i))
        w.ctx.close()
    r = refitctl("--db", dbs[0], "--db", dbs[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("# HELP refit_updates_started_total") == 1
    s = samples(r.stdout)
    for i in range(2):
        assert s[("refit_version_info", (("version", "s%d" % i),), ("rank%d" % i, str(i)))] == 1
    # the same worker twice: its series would collide, refused by name
    r = refitctl("--db", dbs[0], "--db", dbs[0])
    assert r.returncode == 1 and "rank0" in r.stderr and "collide" in r.stderr, r.stderr
    assert r.stdout == ""
    env = {k: v for k, v in CTL_ENV.items() if k != "REFIT_JOURNAL"}
    r = subprocess.run([REFITCTL, "metrics"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "which journal" in r.stderr, r.stderr
    env = dict(CTL_ENV, REFIT_JOURNAL=dbs[1])
    r = subprocess.run([REFITCTL, "metrics"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and 'worker="rank1"' in r.stdout, r.stderr
    r = refitctl("--db", os.path.join(TMP, "absent.db"))
    assert r.returncode == 1 and "absent.db" in r.stderr, r.stderr


def test_textfile_is_replaced_atomically():
    db = os.path.join(TMP, "atomic.db")
    w = Worker(db)
    with w.model.update(version="v1") as txn:
        txn.load_dict(ck(5))
    folder = os.path.join(TMP, "textfile")
    os.mkdir(folder)
    out = os.path.join(folder, "refit.prom")
    r = refitctl("--db", db, "--out", out)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    whole = open(out).read()
    last = whole.splitlines()[-1]
    assert last.startswith("refit_undo_bytes"), last  # the last family of a journal's file
    assert oct(os.stat(out).st_mode & 0o777) == "0o644"
    seen, bad, stop = [0], [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                with open(out) as f:
                    text = f.read()
            except FileNotFoundError:
                bad.append("missing")  # rename never leaves the path without a file
                continue
            seen[0] += 1
            if not text.endswith(last + "\n"):
                bad.append(text[-80:])

    th = threading.Thread(target=reader)
    th.start()
    inodes = set()
    try:
        for _ in range(25):
            r = refitctl("--db", db, "--out", out)
            assert r.returncode == 0, r.stderr
            inodes.add(os.stat(out).st_ino)
    finally:
        stop.set()
        th.join()
    assert not bad, bad[:3]
    assert seen[0] > 0
    assert len(inodes) > 1  # a new file renamed over the old, not rewritten in place
    assert os.listdir(folder) == ["refit.prom"], os.listdir(folder)  # no temporary left
    # a failure leaves the file as it was
    before = open(out).read()
    r = refitctl("--db", os.path.join(TMP, "absent.db"), "--out", out)
    assert r.returncode == 1 and open(out).read() == before
    r = refitctl("--db", db, "--out", os.path.join(TMP, "no-such-dir", "x.prom"))
    assert r.returncode == 1 and "no-such-dir" in r.stderr, r.stderr
    w.ctx.close()


def promtool():
    """$PROMTOOL, the venv's (scripts/deps.sh unpacks it there), or PATH's."""
    for p in (os.environ.get("PROMTOOL"), os.path.join(os.path.dirname(sys.executable),
                                                       "promtool"), shutil.which("promtool")):
        if p and os.access(p, os.X_OK):
            return p
    return None


def test_promtool_checks_both_outputs():
    tool = promtool()
    if not tool:
        print("# skip: no promtool (scripts/deps.sh puts one in the venv; or $PROMTOOL)")
        return
    db = os.path.join(TMP, "promtool.db")
    w = scripted(db)
    for text in (w.ctx.metrics(), refitctl("--db", db).stdout):
        r = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True,
                           text=True, env=CTL_ENV)
        assert r.returncode == 0, r.stdout + r.stderr
    w.ctx.close()


if __name__ == "__main__":
    sys.exit(harness.run(globals()))
