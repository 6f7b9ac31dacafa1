"""refit's metrics for prometheus_client users.

    from prometheus_client import REGISTRY
    from refit.prometheus import Collector
    REGISTRY.register(Collector(ctx))          # or Collector(ctx0, ctx1, ...)

The collector reads each context's Context.metrics() (the Prometheus text
of refit_metrics_text, docs/operators.md "Metrics") at every scrape and
hands its families to the registry, the series of several workers of one
process merged under one family each. prometheus_client is imported only
when a collector is made: refit itself does not need it."""
from typing import Any, Dict, Iterator, List

from .core import Context


class Collector:
    """A prometheus_client collector over the metrics of contexts."""

    def __init__(self, *contexts: Context) -> None:
        if not contexts:
            raise ValueError("Collector: give at least one refit.Context")
        try:
            from prometheus_client import parser
        except ImportError as err:
            raise ImportError("refit.prometheus.Collector needs the prometheus_client "
                              "package (pip install prometheus_client)") from err
        self._parse = parser.text_string_to_metric_families
        self._contexts = contexts

    def describe(self) -> List[Any]:
        # nothing up front: registering reads no context (one collector
        # per registry serves every worker of the process)
        return []

    def collect(self) -> Iterator[Any]:
        families: Dict[str, Any] = {}
        for ctx in self._contexts:
            for fam in self._parse(ctx.metrics()):
                if fam.name in families:
                    families[fam.name].samples.extend(fam.samples)
                else:
                    families[fam.name] = fam
        yield from families.values()
