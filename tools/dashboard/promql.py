"""The part of PromQL that docs/grafana-refit.json uses, evaluated over
series collected in memory, so that the dashboard's picture is drawn from
the queries themselves (tools/dashboard/render.py).

Supported, with Prometheus's semantics:
  selectors    name, name{label="v", label!="v"}, name[...][5s] (a range)
  functions    rate(sel[d]), increase(sel[d]) (counter resets, extrapolation
               to the window's edges as Prometheus does),
               histogram_quantile(q, expr)
  aggregations sum, max, min, count, avg; "by (labels)" before or after
  arithmetic   + - * / between vectors of equal label sets, and with numbers
  $__rate_interval, replaced by the rate_interval given to evaluate()
Anything else is a SyntaxError naming the query and the position."""
import math
import re

AGGREGATIONS = ("sum", "max", "min", "count", "avg")
FUNCTIONS = ("rate", "increase", "histogram_quantile")
_TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+(?:\.\d+)?(?:[smhd](?![a-zA-Z_]))?) |
    (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*) |
    (?P<var>\$__rate_interval) |
    (?P<str>"(?:[^"\\]|\\.)*") |
    (?P<op>!=|[-+*/(){}\[\],=]))""", re.X)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _tokens(text):
    pos, out = 0, []
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            raise SyntaxError("query %r: cannot read %r at %d" % (text, text[pos:pos + 10], pos))
        kind = m.lastgroup
        out.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    out.append(("end", "", len(text)))
    return out


def _duration(tok):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", tok)
    if not m:
        raise ValueError(tok)
    return float(m.group(1)) * _UNITS[m.group(2)]


class _Parser:
    """Recursive descent over the tokens; builds a tuple tree."""

    def __init__(self, text):
        self.text, self.toks, self.i = text, _tokens(text), 0

    def fail(self, what):
        pos = self.toks[self.i][2]
        raise SyntaxError("query %r: %s at %d" % (self.text, what, pos))

    def peek(self, value=None):
        kind, val, _ = self.toks[self.i]
        return val if value is None else val == value and kind != "str"

    def take(self, value=None):
        kind, val, _ = self.toks[self.i]
        if value is not None and (val != value or kind == "str"):
            self.fail("expected %r" % value)
        self.i += 1
        return kind, val

    def parse(self):
        e = self.sum_expr()
        if self.toks[self.i][0] != "end":
            self.fail("unexpected %r" % self.peek())
        return e

    def sum_expr(self):
        e = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()[1]
            e = ("binop", op, e, self.product())
        return e

    def product(self):
        e = self.atom()
        while self.peek() in ("*", "/"):
            op = self.take()[1]
            e = ("binop", op, e, self.atom())
        return e

    def labels(self):
        self.take("(")
        names = []
        while not self.peek(")"):
            kind, val = self.take()
            if kind != "name":
                self.fail("expected a label name")
            names.append(val)
            if self.peek(","):
                self.take(",")
        self.take(")")
        return tuple(names)

    def atom(self):
        kind, val, _ = self.toks[self.i]
        if kind == "num":
            self.take()
            return ("num", float(val))
        if val == "(" and kind == "op":
            self.take("(")
            e = self.sum_expr()
            self.take(")")
            return e
        if kind != "name":
            self.fail("expected an expression")
        self.take()
        if val in AGGREGATIONS:
            by = self.labels() if self.peek("by") and self.take("by") else None
            self.take("(")
            inner = self.sum_expr()
            self.take(")")
            if by is None and self.peek("by"):
                self.take("by")
                by = self.labels()
            return ("agg", val, by or (), inner)
        if val in FUNCTIONS:
            self.take("(")
            if val == "histogram_quantile":
                q = self.take()
                if q[0] != "num":
                    self.fail("histogram_quantile takes a number first")
                self.take(",")
                e = ("hq", float(q[1]), self.sum_expr())
            else:
                e = (val, self.selector(self.take()[1], need_range=True))
            self.take(")")
            return e
        return self.selector(val, need_range=False)

    def selector(self, name, need_range):
        matchers = []
        if self.peek("{"):
            self.take("{")
            while not self.peek("}"):
                label = self.take()[1]
                op = self.take()[1]
                kind, value = self.take()
                if op not in ("=", "!=") or kind != "str":
                    self.fail("expected label=\"value\" or label!=\"value\"")
                matchers.append((label, op, bytes(value[1:-1], "utf-8").decode("unicode_escape")))
                if self.peek(","):
                    self.take(",")
            self.take("}")
        rng = None
        if self.peek("["):
            self.take("[")
            kind, val = self.take()
            if kind not in ("num", "var"):
                self.fail("expected a duration")
            self.take("]")
            rng = val
        if need_range and rng is None:
            self.fail("%s needs a range [d]" % name)
        if not need_range and rng is not None:
            self.fail("a range outside rate() or increase()")
        return ("sel", name, tuple(matchers), rng)


def parse(text):
    """The query's tree; SyntaxError for what this subset does not read."""
    return _Parser(text).parse()


def metric_names(text):
    """The metric names a query selects (a histogram's as name_bucket)."""
    out = []

    def walk(e):
        if e[0] == "sel":
            out.append(e[1])
        for part in e[1:]:
            if isinstance(part, tuple) and part and isinstance(part[0], str):
                walk(part)
    walk(parse(text))
    return out


def grouping_labels(text):
    """Every label a query's aggregations group by."""
    out = set()

    def walk(e):
        if e[0] == "agg":
            out.update(e[2])
        for part in e[1:]:
            if isinstance(part, tuple) and part and isinstance(part[0], str):
                walk(part)
    walk(parse(text))
    return out


class Store:
    """Scraped samples: (name, labels) -> [(t, value), ...] in time order,
    and the scrape interval (a series missing from a scrape is stale after
    it, as Prometheus's staleness markers make it)."""

    def __init__(self, interval):
        self.interval = interval
        self.series = {}

    def add(self, t, name, labels, value):
        key = (name, tuple(sorted(labels.items())))
        self.series.setdefault(key, []).append((t, value))

    def select(self, name, matchers):
        for (n, labels), samples in self.series.items():
            if n != name:
                continue
            d = dict(labels)
            if all((d.get(k, "") == v) == (op == "=") for k, op, v in matchers):
                yield d, samples


def _window(samples, start, end):
    return [(t, v) for t, v in samples if start < t <= end]


def _increase(samples, start, end, is_rate):
    """Prometheus's extrapolatedRate over the samples of (start, end]."""
    if len(samples) < 2:
        return None
    first_t, first_v = samples[0]
    last_t, last_v = samples[-1]
    result, prev = last_v - first_v, first_v
    for _, v in samples[1:]:
        if v < prev:
            result += prev  # a counter reset: the run before it counts whole
        prev = v
    sampled = last_t - first_t
    if sampled <= 0:
        return None
    avg = sampled / (len(samples) - 1)
    to_start, to_end = first_t - start, end - last_t
    if result > 0 and first_v >= 0:
        to_zero = sampled * (first_v / result)
        to_start = min(to_start, to_zero)
    threshold = avg * 1.1
    span = sampled + (to_start if to_start < threshold else avg / 2)
    span += to_end if to_end < threshold else avg / 2
    result *= span / sampled
    return result / (end - start) if is_rate else result


def _quantile(q, buckets):
    """Prometheus's bucketQuantile over [(le, cumulative count)]."""
    buckets = sorted(buckets)
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return math.nan
    total = buckets[-1][1]
    if total == 0:
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    rank = q * total
    b = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    lower_le, start = (0.0, 0.0) if b == 0 else buckets[b - 1]
    count = buckets[b][1] - start
    rank -= start
    return lower_le + (buckets[b][0] - lower_le) * (rank / count)


def _key(labels):
    return tuple(sorted(labels.items()))


def evaluate(tree, store, t, rate_interval):
    """The instant vector of tree at time t: {label tuple: value}."""
    op = tree[0]
    if op == "num":
        return tree[1]
    if op == "sel":
        _, name, matchers, _ = tree
        out = {}
        for labels, samples in store.select(name, matchers):
            last = [(st, v) for st, v in samples if st <= t]
            if last and t - last[-1][0] <= store.interval * 1.5:
                out[_key({k: v for k, v in labels.items()})] = last[-1][1]
        return out
    if op in ("rate", "increase"):
        _, name, matchers, rng = tree[1]
        d = rate_interval if rng == "$__rate_interval" else _duration(rng)
        out = {}
        for labels, samples in store.select(name, matchers):
            v = _increase(_window(samples, t - d, t), t - d, t, op == "rate")
            if v is not None:
                out[_key(labels)] = v
        return out
    if op == "hq":
        groups = {}
        for labels, v in evaluate(tree[2], store, t, rate_interval).items():
            d = dict(labels)
            le = float(d.pop("le"))
            groups.setdefault(_key(d), []).append((le, v))
        return {k: _quantile(tree[1], b) for k, b in groups.items()}
    if op == "agg":
        _, fn, by, inner = tree
        groups = {}
        for labels, v in evaluate(inner, store, t, rate_interval).items():
            d = dict(labels)
            groups.setdefault(_key({k: d[k] for k in by if k in d}), []).append(v)
        f = {"sum": sum, "max": max, "min": min, "count": len,
             "avg": lambda vs: sum(vs) / len(vs)}[fn]
        return {k: float(f(vs)) for k, vs in groups.items()}
    if op == "binop":
        return _binop(tree[1], evaluate(tree[2], store, t, rate_interval),
                      evaluate(tree[3], store, t, rate_interval))
    raise ValueError(tree)


def _binop(op, a, b):
    f = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
         "/": lambda x, y: x / y if y else math.nan}[op]
    if isinstance(a, float) and isinstance(b, float):
        return f(a, b)
    if isinstance(a, float):
        return {k: f(a, v) for k, v in b.items()}
    if isinstance(b, float):
        return {k: f(v, b) for k, v in a.items()}
    return {k: f(v, b[k]) for k, v in a.items() if k in b}
