"""Prometheus exposition: rendering a registry the way rsgw serves it.

Pure apart from prometheus_client's own text renderer. `_created` samples are
dropped at render time rather than with prometheus_client's process-wide switch,
so embedding rsgw never changes the host application's own metrics.
"""

from __future__ import annotations

import copy
import platform
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Gauge,
    generate_latest,
)
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


def add_runtime_series(
    registry: CollectorRegistry,
    prefix: str,
    constant_labels: Mapping[str, str] | None = None,
    **info: str,
) -> None:
    """`process_*` and `python_*` series, and `<prefix>_build_info{version,python,...}` 1.

    The process-wide collectors are registered into rsgw's own registry, not the
    global one, so an application that embeds rsgw keeps its own untouched. Every
    sample gets `constant_labels` first (a worker's `worker` and `gpu`).
    """
    labels = dict(constant_labels or {})
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(_Labelled(collector, labels) if labels else collector)
    from rsgw._version import __version__

    info_labels = {**labels, "version": __version__, "python": platform.python_version(), **info}
    Gauge(
        f"{prefix}_build_info",
        "Always 1: the running rsgw's version and settings, as labels.",
        list(info_labels),
        registry=registry,
    ).labels(**info_labels).set(1)


class _Labelled(Collector):
    """Another collector's families, every sample with constant labels added first."""

    def __init__(self, inner: Collector, labels: Mapping[str, str]) -> None:
        self._inner = inner
        self._labels = dict(labels)

    def collect(self) -> Iterator[Metric]:
        for metric in self._inner.collect():
            metric = copy.copy(metric)
            metric.samples = [
                s._replace(labels={**self._labels, **s.labels}) for s in metric.samples
            ]
            yield metric


def render_registry(registry: CollectorRegistry) -> bytes:
    """The text exposition of `registry`, without `_created` series."""
    return generate_latest(_WithoutCreated(registry))


def served_families(registry: CollectorRegistry) -> Iterator[Metric]:
    """`registry`'s families as rsgw serves them (without `_created` series), for a
    renderer of another format (`rsgw.runtime._openmetrics`)."""
    return _WithoutCreated(registry).collect()


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


def escape_label_value(value: str) -> str:
    """A label value as the text format writes it between quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def relabel_exposition(text: str, label: str, value: str) -> str:
    """Every sample of `text` with `label="value"`; a label it had becomes `exported_<label>`.

    This is what Prometheus itself does to a target's label that clashes with a
    scraped one (`honor_labels: false`), so a worker's series look the same whether
    Prometheus scrapes the worker directly with that target label or reads them
    through the gateway's merged `/metrics`. Comment and blank lines pass unchanged.
    """
    pair = f'{label}="{escape_label_value(value)}"'
    return "\n".join(
        line if not line or line.startswith("#") else _relabel_sample(line, label, pair)
        for line in text.split("\n")
    )


def _relabel_sample(line: str, label: str, pair: str) -> str:
    brace = line.find("{")
    space = line.find(" ")
    if brace < 0 or 0 <= space < brace:  # no labels: `name value`
        return f"{line[:space]}{{{pair}}}{line[space:]}" if space > 0 else line
    found = _label_pairs(line, brace + 1)
    if found is None:
        return line  # not a sample we can read; Prometheus will say so
    pairs, end = found
    names = [raw.split("=", 1)[0].strip() for raw in pairs]
    kept = [pair]
    exported = "exported_" + label
    for name, raw in zip(names, pairs, strict=True):
        if name == label:
            kept.append("exported_" + raw.lstrip())
        elif name != exported or label not in names:
            kept.append(raw)
    return f"{line[:brace]}{{{','.join(kept)}}}{line[end + 1 :]}"


def _label_pairs(line: str, start: int) -> tuple[list[str], int] | None:
    """The raw `name="value"` pairs from `start` to the closing brace, and its index."""
    pairs: list[str] = []
    quoted = escaped = False
    begin = start
    for i in range(start, len(line)):
        char = line[i]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = quoted
        elif char == '"':
            quoted = not quoted
        elif not quoted and char in ",}":
            if line[begin:i].strip():
                pairs.append(line[begin:i])
            begin = i + 1
            if char == "}":
                return pairs, i
    return None
