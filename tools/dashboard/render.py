"""Draw docs/grafana-refit.json's panels from a real run, as a PNG.

Grafana cannot be installed here, so this stands in for its renderer:
tools/dashboard/fleet_run.py runs real workers (host backend) and scrapes
their Context.metrics(); every panel's queries are evaluated over those
samples by tools/dashboard/promql.py (the PromQL the dashboard uses: rate,
increase, histogram_quantile, sum/max/count by, arithmetic) at each scrape
time, and drawn with matplotlib where the panel's gridPos puts it. The
look follows Grafana's dark theme; the numbers are the queries' own.

usage: render.py [--out PNG] [--dashboard JSON] [--rounds N] [--period S]
                 [--interval S] [--rate-interval S] [--pause S]
Run it with the venv of scripts/deps.sh (matplotlib, numpy,
prometheus_client) and the binding on the path (bindings/python, REFIT_LIB).
"""
import argparse
import datetime
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

import fleet_run  # noqa: E402
import promql  # noqa: E402

BG, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
COLORS = {"green": "#73bf69", "red": "#f2495c", "blue": "#5794f2", "text": "#9fa7b3",
          "yellow": "#fade2a", "orange": "#ff9830", "purple": "#b877d9"}
PALETTE = ["#73bf69", "#fade2a", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff",
           "#ff7383", "#96d98d", "#ffb357"]


def legend(fmt, labels):
    out = fmt
    for k, v in labels:
        out = out.replace("{{%s}}" % k, v)
    while "{{" in out:
        a, b = out.index("{{"), out.index("}}") + 2
        out = out[:a] + out[b:]
    return out.strip() or "value"


def series_over_time(expr, store, times, rate_interval):
    """{legend key (labels): ([t], [v])} of expr evaluated at each time."""
    tree = promql.parse(expr)
    out = {}
    for t in times:
        v = promql.evaluate(tree, store, t, rate_interval)
        if isinstance(v, float):
            v = {(): v}
        for labels, value in v.items():
            ts, vs = out.setdefault(labels, ([], []))
            ts.append(t)
            vs.append(value)
    return out


def scale_unit(unit, values):
    if unit == "Bps":
        top = max([v for v in values if not math.isnan(v)] or [0])
        for div, name in ((1 << 30, "GiB/s"), (1 << 20, "MiB/s"), (1 << 10, "KiB/s")):
            if top >= div:
                return div, name
        return 1, "B/s"
    return 1, {"s": "seconds", "short": ""}.get(unit, unit or "")


def style(ax, title):
    ax.set_facecolor(PANEL)
    for s in ax.spines.values():
        s.set_color(GRID)
    ax.tick_params(colors=TEXT, labelsize=7)
    ax.set_title(title, color=TEXT, fontsize=9, loc="left", fontweight="bold")
    ax.grid(True, color=GRID, linewidth=0.5)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=datetime.timezone.utc))


def draw_timeseries(ax, panel, store, times, ri):
    style(ax, panel["title"])
    unit = panel["fieldConfig"]["defaults"].get("unit")
    custom = panel["fieldConfig"]["defaults"].get("custom", {})
    lines, k = [], 0
    for target in panel["targets"]:
        for labels, (ts, vs) in sorted(series_over_time(target["expr"], store, times, ri).items()):
            lines.append((legend(target["legendFormat"], labels), ts, vs, PALETTE[k % len(PALETTE)]))
            k += 1
    allv = [v for _, _, vs, _ in lines for v in vs]
    div, name = scale_unit(unit, allv)
    step = custom.get("lineInterpolation") == "stepAfter"
    for label, ts, vs, color in lines:
        x = [datetime.datetime.fromtimestamp(t, datetime.timezone.utc) for t in ts]
        y = [v / div for v in vs]
        if step:
            ax.step(x, y, where="post", color=color, linewidth=1.5, label=label)
        else:
            ax.plot(x, y, color=color, linewidth=1.5, label=label)
            if custom.get("fillOpacity"):
                ax.fill_between(x, y, color=color, alpha=custom["fillOpacity"] / 100)
    if custom.get("thresholdsStyle", {}).get("mode") == "line":
        for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]:
            ax.axhline(step["value"] / div, color=COLORS.get(step["color"], step["color"]),
                       linestyle="--", linewidth=1)
    if custom.get("scaleDistribution", {}).get("type") == "log":
        ax.set_yscale("log")
    ax.set_ylabel(name, color=TEXT, fontsize=7)
    if lines:
        ax.legend(loc="upper left", fontsize=6, ncol=3, facecolor=PANEL, edgecolor=GRID,
                  labelcolor=TEXT, framealpha=0.8)


def threshold_color(panel, value):
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    color = steps[0]["color"]
    for s in steps[1:]:
        if value >= s["value"]:
            color = s["color"]
    return COLORS.get(color, color)


def draw_stat(ax, panel, store, t, ri):
    ax.set_facecolor(PANEL)
    ax.set_xticks([])
    ax.set_yticks([])
    for s in ax.spines.values():
        s.set_color(GRID)
    ax.set_title(panel["title"], color=TEXT, fontsize=9, loc="left", fontweight="bold")
    cells = []
    for target in panel["targets"]:
        v = promql.evaluate(promql.parse(target["expr"]), store, t, ri)
        v = {(): v} if isinstance(v, float) else v
        cells += [(legend(target["legendFormat"], k), x) for k, x in sorted(v.items())]
    if not cells:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", fontsize=12)
        return
    w = 1.0 / len(cells)
    for i, (name, value) in enumerate(cells):
        ax.add_patch(Rectangle((i * w + 0.01, 0.05), w - 0.02, 0.9,
                               color=threshold_color(panel, value), transform=ax.transAxes))
        ax.text(i * w + w / 2, 0.68, name, color="white", ha="center", va="center",
                fontsize=8, transform=ax.transAxes)
        ax.text(i * w + w / 2, 0.32, "%g" % value, color="white", ha="center", va="center",
                fontsize=18, fontweight="bold", transform=ax.transAxes)


def draw_state_timeline(ax, panel, store, times, ri):
    style(ax, panel["title"])
    mapping = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
    rows = []
    for target in panel["targets"]:
        for labels, (ts, vs) in sorted(series_over_time(target["expr"], store, times, ri).items()):
            rows.append((legend(target["legendFormat"], labels), ts, vs))
    for r, (name, ts, vs) in enumerate(reversed(rows)):
        for i, (t, v) in enumerate(zip(ts, vs)):
            end = ts[i + 1] if i + 1 < len(ts) else t + (ts[1] - ts[0] if len(ts) > 1 else 1)
            m = mapping.get("%d" % v) if not math.isnan(v) else None
            if m is None:
                continue
            x0 = mdates.date2num(datetime.datetime.fromtimestamp(t, datetime.timezone.utc))
            x1 = mdates.date2num(datetime.datetime.fromtimestamp(end, datetime.timezone.utc))
            ax.barh(r, x1 - x0, left=x0, height=0.8, color=COLORS.get(m["color"], m["color"]),
                    linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([name for name, _, _ in reversed(rows)], fontsize=7)
    ax.xaxis_date(tz=datetime.timezone.utc)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=datetime.timezone.utc))
    ax.grid(False)
    ax.legend(handles=[Patch(color=COLORS.get(m["color"], m["color"]), label=m["text"])
                       for _, m in sorted(mapping.items())],
              loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, fontsize=6,
              facecolor=PANEL, edgecolor=GRID, labelcolor=TEXT)


def render(dashboard, store, t0, t1, interval, ri, out, note):
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(16, rows * 0.42 + 0.9), facecolor=BG)
    top = 1 - 0.6 / (rows * 0.42 + 0.9)
    fig.text(0.01, top + 0.2 / (rows * 0.42 + 0.9), dashboard["title"], color=TEXT, fontsize=13,
             fontweight="bold")
    times = [t0 + ri + i * interval for i in range(int((t1 - t0 - ri) / interval) + 1)]
    times.append(t1)
    for p in panels:
        g = p["gridPos"]
        pad_x, pad_y = 0.045, 0.06
        x = g["x"] / 24 + pad_x * g["w"] / 24 * 0.25 + 0.01
        w = g["w"] / 24 - 0.035
        y = top - (g["y"] + g["h"]) / rows * (top - 0.04)
        h = g["h"] / rows * (top - 0.04) - pad_y * 0.35
        ax = fig.add_axes([x + 0.02, y + 0.025, w - 0.02, h - 0.03])
        if p["type"] == "timeseries":
            draw_timeseries(ax, p, store, times, ri)
        elif p["type"] == "stat":
            draw_stat(ax, p, store, t1, ri)
        elif p["type"] == "state-timeline":
            draw_state_timeline(ax, p, store, times, ri)
        else:
            raise ValueError("panel type %s is not drawn here" % p["type"])
    fig.text(0.01, 0.008, note, color=TEXT, fontsize=7)
    fig.savefig(out, dpi=90, facecolor=BG)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "operators-dashboard.png"))
    ap.add_argument("--dashboard", default=os.path.join(ROOT, "docs", "grafana-refit.json"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--period", type=float, default=8.0, help="seconds between pushes")
    ap.add_argument("--interval", type=float, default=1.0, help="scrape interval, seconds")
    ap.add_argument("--rate-interval", type=float, default=15.0, help="$__rate_interval, s")
    ap.add_argument("--pause", type=float, default=0.04, help="seconds between tensors")
    a = ap.parse_args()
    dashboard = json.load(open(a.dashboard))
    store = promql.Store(a.interval)
    run = fleet_run.Run(store, a.interval, a.pause)
    t0, t1 = run.run(a.rounds, a.period)
    note = ("Drawn by tools/dashboard/render.py from a real run (%s UTC, %d s): %d workers, "
            "refit %s host backend, metrics scraped every %g s from Context.metrics(), each "
            "panel's PromQL evaluated by tools/dashboard/promql.py; not a Grafana screenshot."
            % (datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
               round(t1 - t0), len(run.workers), fleet_run.refit.__version__, a.interval))
    render(dashboard, store, t0, t1, a.interval, a.rate_interval, a.out, note)
    print("wrote %s (%d series, %d samples)" % (a.out, len(store.series),
                                                 sum(len(s) for s in store.series.values())))


if __name__ == "__main__":
    main()
