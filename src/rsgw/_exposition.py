"""Prometheus exposition: rendering a registry the way rsgw serves it.

Pure apart from prometheus_client's own text renderer. `_created` samples are
dropped at render time rather than with prometheus_client's process-wide switch,
so embedding rsgw never changes the host application's own metrics.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

#: Media type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: 1 ms doubling to about 8 s (REFERENCE.md §6.1): `0.001 * 2**k`, k = 0..13.
LATENCY_BUCKETS: tuple[float, ...] = tuple(0.001 * 2**k for k in range(14))


class _WithoutCreated(Collector):
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            kept = [s for s in metric.samples if not s.name.endswith("_created")]
            if len(kept) != len(metric.samples):
                metric = copy.copy(metric)
                metric.samples = kept
            yield metric


def render_registry(registry: CollectorRegistry) -> bytes:
    """The text exposition of `registry`, without `_created` series."""
    return generate_latest(_WithoutCreated(registry))
