"""docs/grafana-refit.json against what refit exports, and the PromQL
subset that draws its picture (tools/dashboard/), TAP.

- the dashboard is valid JSON, its panels tile Grafana's 24-column grid,
  and every query parses in tools/dashboard/promql.py (so the picture is
  drawn from the queries themselves);
- every metric the dashboard queries, every label it groups by or matches,
  and every label value it matches, is in a real exposition: a worker's
  Context.metrics() after commits, a caller's abort, a refused finalize and
  a POISONED abort, parsed with prometheus_client's text parser;
- promql.py's rate, increase, histogram_quantile, aggregations and
  arithmetic give Prometheus's numbers on series worked out by hand;
- tools/dashboard/render.py's run (real workers) shows the events the
  picture claims, and writes a PNG.

usage: test_dashboard.py   (env: REFIT_LIB, REFIT_SOURCE_ROOT; the venv of
scripts/deps.sh: numpy, prometheus_client, matplotlib)"""
import json
import math
import os
import sys
import tempfile

ROOT = os.environ.get("REFIT_SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools", "dashboard"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import harness  # noqa: E402
import promql  # noqa: E402
import refit  # noqa: E402

DASHBOARD = json.load(open(os.path.join(ROOT, "docs", "grafana-refit.json")))
EXPRS = [t["expr"] for p in DASHBOARD["panels"] for t in p["targets"]]
# Labels Prometheus attaches to every scraped series (the target's), not
# the exposition: the dashboard's group is the scrape job.
TARGET_LABELS = {"job", "instance"}


def parsed(text):
    samples = []
    for fam in text_string_to_metric_families(text):
        samples += [(s.name, dict(s.labels), s.value) for s in fam.samples]
    return samples


def exposition():
    """Samples of a real worker's metrics after each kind of update end:
    read once while it holds a version (after a commit, a caller's abort
    and a refused finalize), once when POISONED (it holds none then)."""
    with tempfile.TemporaryDirectory() as d:
        ctx = refit.Context(worker_id="dash-w0", rank=0, journal_path=os.path.join(d, "j.db"))
        model = ctx.create_model()
        rt = {n: np.zeros((16,), dtype=np.float32) for n in ("a", "b")}
        for n, a in rt.items():
            model.add_module(n)
            model.bind_runtime(n, "w", a)
            model.expect(n, n + ".w", "f32", [16])
        model.seal()
        src = np.ones((16,), dtype=np.float32)
        with model.update(version="v1") as txn:
            txn.load("a.w", src)
            txn.load("b.w", src)
        txn = model.begin(version="v2")
        txn.load("a.w", src)
        assert txn.abort("by the test") is True
        txn = model.begin(version="v2")
        txn.load("a.w", src)
        harness.raises("REFIT_EINCOMPLETE", txn.finalize)
        holding = parsed(ctx.metrics())
        txn = model.begin(version="v3", rollback=False)
        txn.load("a.w", src)
        assert txn.abort("by the test") is False
        poisoned = parsed(ctx.metrics())
        ctx.close()
    return holding, poisoned


HOLDING, POISONED = exposition()
SAMPLES = HOLDING + POISONED


def test_dashboard_is_valid_and_tiles_the_grid():
    assert DASHBOARD["title"] and DASHBOARD["uid"] and DASHBOARD["schemaVersion"] >= 36
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)), ids
    cells = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, "%s overlaps another panel" % p["title"]
                cells.add((x, y))
        assert p["type"] in ("timeseries", "stat", "state-timeline"), p["type"]
        assert p["targets"] and p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
    assert {i["name"] for i in DASHBOARD["__inputs"]} == {"DS_PROMETHEUS"}
    titles = " ".join(p["title"] for p in DASHBOARD["panels"]).lower()
    for what in ("updates", "phase", "health per worker", "version"):
        assert what in titles, what
    for e in EXPRS:
        promql.parse(e)  # raises on what the renderer cannot evaluate


def test_every_queried_metric_is_exported():
    names = {n for n, _, _ in SAMPLES}
    queried = {n for e in EXPRS for n in promql.metric_names(e)}
    assert len(queried) >= 8, queried
    missing = queried - names
    assert not missing, "queried but not exported: %s" % sorted(missing)


def test_every_label_grouped_or_matched_is_exported():
    labels = {k for _, ls, _ in SAMPLES for k in ls}
    for e in EXPRS:
        extra = promql.grouping_labels(e) - labels - TARGET_LABELS
        assert not extra, "%s groups by %s, which no series carries" % (e, extra)

    def matchers(tree):
        if tree[0] == "sel":
            yield tree[1], tree[2]
        for part in tree[1:]:
            if isinstance(part, tuple) and part and isinstance(part[0], str):
                yield from matchers(part)
    for e in EXPRS:
        for name, ms in matchers(promql.parse(e)):
            for label, op, value in ms:
                assert any(n == name and ls.get(label) == value for n, ls, _ in SAMPLES), \
                    "%s: no %s{%s=%r} exported" % (e, name, label, value)


def test_the_exposition_counts_what_happened():
    def value(name, samples=POISONED, **labels):
        vs = [v for n, ls, v in samples
              if n == name and all(ls.get(k) == x for k, x in labels.items())]
        return sum(vs)
    assert value("refit_version_info", HOLDING, version="v1") == 1
    assert value("refit_version_info") == 0  # a POISONED worker holds none
    assert value("refit_health", HOLDING, state="ready") == 1
    assert value("refit_updates_started_total") == 4
    assert value("refit_updates_committed_total") == 1
    assert value("refit_updates_aborted_total") == 3
    assert value("refit_updates_poisoned_total") == 1
    assert value("refit_health", state="poisoned") == 1
    assert value("refit_health", state="ready") == 0


def store_of(series, interval=1.0):
    st = promql.Store(interval)
    for (name, labels), points in series.items():
        for t, v in points:
            st.add(t, name, dict(labels), v)
    return st


def close(a, b):
    return abs(a - b) < 1e-9


def test_rate_and_increase_extrapolate_as_prometheus():
    # 1/s, sampled every second from t=1: the window (5, 10] holds 5..9
    st = store_of({("c_total", (("w", "a"),)): [(t, t - 1.0) for t in range(1, 11)]})
    inc = promql.evaluate(promql.parse("increase(c_total[5s])"), st, 10, 0)
    assert close(inc[(("w", "a"),)], 5.0), inc
    rate = promql.evaluate(promql.parse("rate(c_total[$__rate_interval])"), st, 10, 5)
    assert close(rate[(("w", "a"),)], 1.0), rate
    # a reset: 5 6 7 1 2 increases by 2 + 1 + 1 in 4 s, extrapolated to 5 s
    st = store_of({("c_total", ()): [(1, 5.0), (2, 6.0), (3, 7.0), (4, 1.0), (5, 2.0)]})
    inc = promql.evaluate(promql.parse("increase(c_total[5s])"), st, 5, 0)
    assert close(inc[()], 5.0), inc
    # one sample in the window: no value
    assert promql.evaluate(promql.parse("increase(c_total[1s])"), st, 5, 0) == {}


def test_histogram_quantile_interpolates_as_prometheus():
    b = {("h_bucket", (("le", le),)): [(1, c)] for le, c in
         (("1", 2.0), ("2", 6.0), ("+Inf", 8.0))}
    st = store_of(b)
    q = promql.evaluate(promql.parse("histogram_quantile(0.5, h_bucket)"), st, 1, 0)
    assert close(q[()], 1.5), q  # rank 4: halfway through the (1, 2] bucket
    q = promql.evaluate(promql.parse("histogram_quantile(0.9, h_bucket)"), st, 1, 0)
    assert close(q[()], 2.0), q  # in +Inf: the highest finite bound
    q = promql.evaluate(promql.parse("histogram_quantile(0.1, h_bucket)"), st, 1, 0)
    assert close(q[()], 0.4), q  # rank 0.8 of 2 in (0, 1]
    empty = store_of({("h_bucket", (("le", "1"),)): [(1, 0.0)],
                      ("h_bucket", (("le", "+Inf"),)): [(1, 0.0)]})
    q = promql.evaluate(promql.parse("histogram_quantile(0.5, h_bucket)"), empty, 1, 0)
    assert math.isnan(q[()]), q


def test_aggregations_arithmetic_and_staleness():
    st = store_of({
        ("v_info", (("job", "a"), ("version", "1"), ("worker", "0"))): [(1, 1.0), (2, 1.0)],
        ("v_info", (("job", "a"), ("version", "2"), ("worker", "1"))): [(1, 1.0), (2, 1.0)],
        ("v_info", (("job", "b"), ("version", "2"), ("worker", "2"))): [(1, 1.0)],
    })
    distinct = promql.parse("count by (job) (count by (job, version) (v_info))")
    assert promql.evaluate(distinct, st, 2, 0) == {(("job", "a"),): 2.0, (("job", "b"),): 1.0}
    # worker 2's last sample is older than 1.5 scrape intervals: stale
    assert promql.evaluate(distinct, st, 3, 0) == {(("job", "a"),): 2.0}
    folded = promql.parse('max by (worker) (v_info{version="2"}) + 2 * '
                          'max by (worker) (v_info{version!="2"})')
    assert promql.evaluate(folded, st, 2, 0) == {}  # no worker in both
    assert promql.evaluate(promql.parse("sum(v_info) - 1"), st, 2, 0) == {(): 2.0}
    for bad in ("irate(x[5m])", "sum without (a) (x)", "x[5m]", "rate(x)", "x{a=~\"b\"}"):
        try:
            promql.parse(bad)
        except SyntaxError as err:
            assert repr(bad) in str(err), err
        else:
            raise AssertionError("%s was accepted" % bad)


def test_the_pictures_run_shows_what_it_claims():
    import fleet_run
    import render
    st = promql.Store(0.25)
    run = fleet_run.Run(st, 0.25, 0.0)
    t0, t1 = run.run(10, 0.6)
    times = [t0 + 0.125 * i for i in range(int((t1 - t0) / 0.125) + 1)]

    def peak(expr):
        out = {}
        for t in times:
            v = promql.evaluate(promql.parse(expr), st, t, 2.0)
            for k, x in ({(): v} if isinstance(v, float) else v).items():
                out[k] = max(out.get(k, x), x)
        return out
    assert peak('sum(refit_health{state="poisoned"})') == {(): 1.0}
    # both groups mixed at some time (mid-rollout, and after the abort and
    # the refused finalize: up to three versions at once)
    mixed = peak("count by (job) (count by (job, version) (refit_version_info))")
    assert sorted(mixed) == [(("job", "tp-a"),), (("job", "tp-b"),)], mixed
    assert min(mixed.values()) >= 2, mixed
    assert peak('max by (worker) (refit_health{state="empty"})')[(("worker", "tp-a-r1"),)] == 1
    assert peak("sum(refit_replays_committed_total)") == {(): 1.0}
    reasons = peak("sum by (reason) (refit_updates_aborted_total)")
    for r in ("caller", "finalize"):
        assert reasons[(("reason", r),)] >= 1, reasons
    out = os.path.join(tempfile.mkdtemp(prefix="refit-dash-"), "d.png")
    render.render(DASHBOARD, st, t0, t1, 0.25, 2.0, out, "test")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(out) > 50000
    os.unlink(out)


harness.run(globals())
