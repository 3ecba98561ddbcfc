"""OpenMetrics exposition: the gateway's registry and its workers' text, as one answer.

Exemplars (a latency bucket's trace id) exist only in OpenMetrics, so a scraper that
asks for it (Prometheus does) gets the gateway's own registry from prometheus_client's
OpenMetrics renderer. The workers behind it (Triton, MLServer, rsgw's own) answer in
the text format, which is not valid OpenMetrics as it stands: a counter's family is
named for its `_total` series there, a counter without `_total` (Triton's
`nv_inference_request_success`) cannot be an OpenMetrics counter, `untyped` is
`unknown`, and timestamps are milliseconds. `openmetrics_families` reads a text
exposition into OpenMetrics families, declaring `unknown` whatever cannot be what it
said it was, and `merge_openmetrics` joins them under the gateway's, one family per
name and one `# EOF` at the end.

What the conversion does, so that the answer parses (prometheus_client's OpenMetrics
parser is the tests' oracle, a real Prometheus the acceptance test's):

- a counter `x_total` becomes the family `x` (series unchanged); a counter whose
  series lack `_total`, or hold a negative or NaN value, is `unknown`;
- a histogram or summary that breaks one of OpenMetrics' rules for it (a group's
  buckets out of order, no `+Inf` bucket, a `_count` that is not the `+Inf` bucket's
  or not whole, a negative or NaN `_sum`, its samples not together per label set,
  mixed timestamps) becomes one `unknown` family per series name;
- gauges are kept; a gauge `x_created` beside a counter, histogram or summary `x`
  (prometheus_client's text form of a created time) is dropped, as the gateway's own
  `_created` series are;
- a line that cannot be read is dropped, a repeated series keeps its first sample,
  and a family whose name or series names clash with an earlier family's is
  dropped: one odd worker costs its odd series, never the scrape.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample, Timestamp

#: Media type of the OpenMetrics exposition the gateway serves.
OPENMETRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

#: The series names each OpenMetrics type gives its family name (OpenMetrics 1.0).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "info": ("_info",),
}
#: The series names a text-format family of each type holds.
_TEXT_SUFFIXES = {"summary": ("", "_sum", "_count"), "histogram": ("_bucket", "_sum", "_count")}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_HELP_ESCAPES = {"\\": "\\", "n": "\n"}
_CLOSE = re.compile(r"\s*\}")
_AFTER_VALUE = re.compile(r"\s*(?:,\s*)?\}|\s*,")


def wants_openmetrics(accept: bytes | None) -> bool:
    """Whether a scraper's Accept header asks for OpenMetrics 1.0 (or its 0.0.1
    draft, which Prometheus also names), rather than leaving it out or refusing it
    with `q=0`."""
    if accept is None:
        return False
    for offer in accept.decode("latin-1").split(","):
        media, *params = (part.strip() for part in offer.split(";"))
        if media.lower() != "application/openmetrics-text":
            continue
        settings = dict(p.split("=", 1) for p in params if "=" in p)
        if settings.get("version", "1.0.0") not in ("1.0.0", "0.0.1"):
            continue
        try:
            if float(settings.get("q", "1")) > 0:
                return True
        except ValueError:
            continue
    return False


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def merge_openmetrics(own: Iterable[Metric], worker_texts: Sequence[str]) -> bytes:
    """The OpenMetrics exposition of the gateway's families (`own`, as collected)
    followed by every worker's text-format exposition, converted, in order."""
    groups = [list(own), *(openmetrics_families(text) for text in worker_texts)]
    # prometheus_client's OpenMetrics renderer is untyped.
    body: bytes = generate_latest(_Families(merged(groups)))  # type: ignore[no-untyped-call]
    return body


def merged(groups: Iterable[Iterable[Metric]]) -> list[Metric]:
    """Families of one name joined (first HELP, samples in arrival order, a repeated
    series dropped); a family that clashes with an earlier one (another type, or a
    name among its series names) is dropped."""
    by_name: dict[str, Metric] = {}
    claimed: dict[str, str] = {}  # series or family name -> the family that holds it
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for families in groups:
        for family in families:
            kept = by_name.get(family.name)
            if kept is None:
                names = {family.name, *(family.name + s for s in _SUFFIXES.get(family.type, ()))}
                if any(name in claimed for name in names):
                    continue
                claimed.update(dict.fromkeys(names, family.name))
                kept = by_name[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            elif kept.type != family.type:
                continue
            for sample in family.samples:
                series = (sample.name, tuple(sorted(sample.labels.items())))
                if series not in seen:
                    seen.add(series)
                    kept.samples.append(sample)
    return list(by_name.values())


def openmetrics_families(text: str) -> list[Metric]:
    """A text-format exposition's families as OpenMetrics families (module docstring)."""
    read = list(_text_families(text))
    aggregates = {name for name, kind, _, _ in read if kind in ("counter", "histogram", "summary")}
    families: list[Metric] = []
    for name, kind, help_text, samples in read:
        if kind == "gauge" and name.endswith("_created") and name[: -len("_created")] in aggregates:
            continue
        families.extend(_as_openmetrics(name, kind, help_text, _first_of_each(samples)))
    return merged([families])


def _first_of_each(samples: list[Sample]) -> list[Sample]:
    """A family's samples, a repeated series dropped (the first is kept)."""
    unique = {(s.name, tuple(sorted(s.labels.items()))): s for s in reversed(samples)}
    return [s for s in samples if unique[(s.name, tuple(sorted(s.labels.items())))] is s]


def _as_openmetrics(name: str, kind: str, help_text: str, samples: list[Sample]) -> list[Metric]:
    if kind == "counter" and name.endswith("_total") and _counter_ok(name, samples):
        return [_family(name[: -len("_total")], help_text, "counter", samples)]
    if kind == "gauge":
        return [_family(name, help_text, "gauge", samples)]
    if kind == "histogram" and _histogram_ok(name, samples):
        return [_family(name, help_text, "histogram", samples)]
    if kind == "summary" and _summary_ok(name, samples):
        return [_family(name, help_text, "summary", samples)]
    by_series: dict[str, list[Sample]] = {}
    for sample in samples:
        by_series.setdefault(sample.name, []).append(sample)
    return [_family(series, help_text, "unknown", kept) for series, kept in by_series.items()]


def _family(name: str, help_text: str, kind: str, samples: list[Sample]) -> Metric:
    family = Metric(name, help_text, kind)
    family.samples = samples
    return family


def _counter_like(value: float) -> bool:
    return not math.isnan(value) and value >= 0


def _whole(value: float) -> bool:
    return _counter_like(value) and value.is_integer()


def _counter_ok(name: str, samples: list[Sample]) -> bool:
    return all(s.name == name and _counter_like(s.value) for s in samples)


def _groups(samples: list[Sample], apart: str) -> list[list[Sample]] | None:
    """Samples by label set less `apart` (a histogram's `le`, a summary's
    `quantile`), or None when a group's samples are not together or mix timestamps."""
    groups: list[list[Sample]] = []
    keys: list[tuple[tuple[str, str], ...]] = []
    for sample in samples:
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != apart))
        if keys and keys[-1] == key:
            if groups[-1][0].timestamp != sample.timestamp:
                return None
            groups[-1].append(sample)
        elif key in keys:
            return None
        else:
            keys.append(key)
            groups.append([sample])
    return groups


def _histogram_ok(name: str, samples: list[Sample]) -> bool:
    groups = _groups(samples, "le")
    return groups is not None and all(_histogram_group_ok(name, group) for group in groups)


def _histogram_group_ok(name: str, group: list[Sample]) -> bool:
    bound, last = -math.inf, 0.0
    count = total = None
    for sample in group:
        if sample.name == name + "_bucket":
            le = sample.labels.get("le", "")
            try:
                edge = float(le)
            except ValueError:
                return False
            if math.isnan(edge) or edge <= bound or edge < 0 or (edge == math.inf and le != "+Inf"):
                return False
            if not _whole(sample.value) or sample.value < last:
                return False
            bound, last = edge, sample.value
        elif sample.name == name + "_count":
            count = sample.value
        elif sample.name == name + "_sum":
            total = sample.value
        else:
            return False
    if bound != math.inf or (count is None) != (total is None):
        return False
    return count is None or (count == last and total is not None and _counter_like(total))


def _summary_ok(name: str, samples: list[Sample]) -> bool:
    groups = _groups(samples, "quantile")
    if groups is None:
        return False
    for sample in samples:
        if sample.name == name:
            try:
                quantile = float(sample.labels.get("quantile", ""))
            except ValueError:
                return False
            if not 0 <= quantile <= 1 or sample.value < 0:
                return False
        elif sample.name == name + "_count":
            if not _whole(sample.value):
                return False
        elif sample.name != name + "_sum" or not _counter_like(sample.value):
            return False
    return True


def _text_families(text: str) -> Iterator[tuple[str, str, str, list[Sample]]]:
    """(name, type, help, samples) of each family of a text exposition, in order; a
    sample outside the family above it is an `untyped` family of its own."""
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    name, samples = "", list[Sample]()  # the family the lines above declared
    for line in text.split("\n"):
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE") or not _NAME.fullmatch(parts[2]):
                continue
            if parts[2] != name:
                if name:
                    yield name, types.get(name, "untyped"), helps.get(name, ""), samples
                name, samples = parts[2], []
            if parts[1] == "HELP":
                helps.setdefault(name, _unescape_help(parts[3] if len(parts) > 3 else ""))
            else:
                types.setdefault(name, parts[3].strip() if len(parts) > 3 else "untyped")
            continue
        sample = _sample(line)
        if sample is None:
            continue
        kind = types.get(name, "untyped")
        if name and sample.name in (name + s for s in _TEXT_SUFFIXES.get(kind, ("",))):
            samples.append(sample)
        else:
            if name:
                yield name, kind, helps.get(name, ""), samples
            name, samples = "", []
            yield sample.name, "untyped", "", [sample]
    if name:
        yield name, types.get(name, "untyped"), helps.get(name, ""), samples


def _sample(line: str) -> Sample | None:
    """One text-format sample line, or None when it is blank or cannot be read."""
    line = line.strip()
    match = _NAME.match(line)
    if match is None:
        return None
    rest = line[match.end() :]
    labels: dict[str, str] = {}
    if rest.lstrip().startswith("{"):
        read = _labels(rest.lstrip())
        if read is None:
            return None
        labels, rest = read
    fields = rest.split()
    if not rest[:1].isspace() or not 1 <= len(fields) <= 2 or "_" in rest:
        return None
    try:
        value = float(fields[0])
        stamp = int(fields[1]) if len(fields) == 2 else None
    except ValueError:
        return None
    timestamp = None if stamp is None else Timestamp(stamp // 1000, stamp % 1000 * 1_000_000)
    return Sample(match.group(), labels, value, timestamp)


def _labels(text: str) -> tuple[dict[str, str], str] | None:
    """`{name="value",...}` at the start of `text`: the labels, unescaped, and what
    follows the closing brace; None when it is not a label set."""
    labels: dict[str, str] = {}
    closing = _CLOSE.match(text, 1)
    if closing is not None:
        return labels, text[closing.end() :]
    at = 1
    while True:
        match = _LABEL.match(text, at)
        if match is None or match.group(1) in labels:
            return None
        value: list[str] = []
        at = match.end()
        while at < len(text) and text[at] != '"':
            if text[at] == "\\" and at + 1 < len(text):
                at += 1
                value.append(_ESCAPES.get(text[at], "\\" + text[at]))
            else:
                value.append(text[at])
            at += 1
        if at >= len(text):
            return None
        labels[match.group(1)] = "".join(value)
        after = _AFTER_VALUE.match(text, at + 1)
        if after is None:
            return None
        if after.group().endswith("}"):
            return labels, text[after.end() :]
        at = after.end()


def _unescape_help(text: str) -> str:
    """A text-format HELP (it escapes only `\\` and newlines)."""
    return re.sub(r"\\(.)", lambda m: _HELP_ESCAPES.get(m.group(1), m.group()), text)
