"""Prometheus exposition: rendering a registry the way rsgw serves it.

Pure apart from prometheus_client's own text renderer. `_created` samples are
dropped at render time rather than with prometheus_client's process-wide switch,
so embedding rsgw never changes the host application's own metrics.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.core import Metric

#: Media type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: 1 ms doubling to about 8 s (docs/original.md §6.1): `0.001 * 2**k`, k = 0..13.
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


def merge_expositions(texts: Sequence[str]) -> str:
    """Merge exposition texts so that each family has one HELP/TYPE pair.

    The gateway's own text comes first, then every worker's, in order. Families
    keep their first-seen order and their first HELP and TYPE lines; samples of
    one family from every text are grouped under it, in arrival order. A sample
    belongs to the current family when its name is the family's or extends it
    with `_` (histogram and summary series); otherwise its own name is a family.
    Comments other than HELP and TYPE are dropped. (docs/original.md §6.3.)
    """
    order: list[str] = []
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    samples: dict[str, list[str]] = {}

    def family(name: str) -> list[str]:
        found = samples.get(name)
        if found is None:
            found = samples[name] = []
            order.append(name)
        return found

    for text in texts:
        current: str | None = None
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = parts[2]
                    family(current)
                    seen = helps if parts[1] == "HELP" else types
                    seen.setdefault(current, line)
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if current is not None and (name == current or name.startswith(current + "_")):
                family(current).append(line)
            else:
                family(name).append(line)
    out: list[str] = []
    for name in order:
        if name in helps:
            out.append(helps[name])
        if name in types:
            out.append(types[name])
        out.extend(samples[name])
    return "\n".join(out) + "\n" if out else ""
