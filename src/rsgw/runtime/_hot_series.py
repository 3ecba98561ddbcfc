"""Counter and histogram families for a request path: children that are plain numbers.

prometheus_client's children take a lock per update (a histogram's observation two),
which is what threads need; the gateway updates its request series from its one Trio
thread, three times per proxied call, where those locks and checks were about 2% of a
small call. These children are a count, or bucket counts and a sum, updated without
a lock; they become samples (prometheus_client's own `*MetricFamily`) when the
registry is collected, so the exposition is the one prometheus_client's `Counter`
and `Histogram` give (less `_created`, which rsgw never serves).

A scrape from another thread may see an observation's bucket counted and its sum not
yet: one observation of skew, which prometheus_client's per-value locks do not rule
out either.

A histogram child keeps an exemplar per bucket (the last observation given one, as
prometheus_client's `observe(amount, exemplar=...)` does) only once one has been given:
a child observed only by `observe` holds no exemplar list, and its samples are the
plain pairs they always were.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.samples import Exemplar


class Count:
    """A counter child."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Latencies:
    """A histogram child: how many observations fell in each bucket, and their sum."""

    __slots__ = ("_bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        #: Per bucket, not cumulative; the last is +Inf's.
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        #: Per bucket, its last exemplar; None until `observe_exemplified` first runs.
        self.exemplars: list[Exemplar | None] | None = None

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # (a bucket holds <= its bound)
        self.sum += value

    def observe_exemplified(self, value: float, exemplar: Exemplar) -> None:
        """`observe`, with `exemplar` kept as its bucket's (a traced call's trace)."""
        bucket = bisect_left(self._bounds, value)
        self.counts[bucket] += 1
        self.sum += value
        exemplars = self.exemplars
        if exemplars is None:
            exemplars = self.exemplars = [None] * len(self.counts)
        exemplars[bucket] = exemplar


Child = TypeVar("Child", Count, Latencies)


class _Family(Collector, Generic[Child]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Child] = {}
        registry.register(self)

    def labels(self, *values: str) -> Child:
        """The child for these label values, made at first use."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = self._new()
        return child

    def remove(self, *values: str) -> None:
        """Drop a child's series (KeyError if it has none, as prometheus_client)."""
        del self._children[values]

    def _new(self) -> Child:
        raise NotImplementedError


class CounterFamily(_Family[Count]):
    """`<name>_total{labels}`, each child a `Count`."""

    def _new(self) -> Count:
        return Count()

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            family.add_metric(values, child.value)
        yield family


class HistogramFamily(_Family[Latencies]):
    """`<name>_bucket{...,le}`, `_count` and `_sum`, each child a `Latencies` over
    `buckets` (finite bounds, ascending; +Inf is added)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        buckets: Sequence[float],
    ) -> None:
        self._bounds = tuple(buckets)
        # The `le` values prometheus_client's own Histogram writes (its helper is untyped).
        les: list[str] = [floatToGoString(bound) for bound in self._bounds]  # type: ignore[no-untyped-call]
        self._les = [*les, "+Inf"]
        self._no_exemplars: list[Exemplar | None] = [None] * len(self._les)
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> Latencies:
        return Latencies(self._bounds)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            running = 0
            cumulative: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
            exemplars = child.exemplars or self._no_exemplars
            for le, count, exemplar in zip(self._les, child.counts, exemplars, strict=True):
                running += count
                if exemplar is None:
                    cumulative.append((le, float(running)))
                else:
                    cumulative.append((le, float(running), exemplar))
            family.add_metric(values, cumulative, child.sum)
        yield family
