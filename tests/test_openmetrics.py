"""The OpenMetrics answer: workers' text expositions turned into OpenMetrics and merged
under the gateway's registry, checked against prometheus_client's OpenMetrics parser
(the oracle: strict about names, types, histogram shape and `# EOF`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar, Timestamp
from prometheus_client.utils import floatToGoString

from rsgw.runtime._exposition import escape_label_value, relabel_exposition, served_families
from rsgw.runtime._hot_series import HistogramFamily
from rsgw.runtime._openmetrics import merge_openmetrics, openmetrics_families, wants_openmetrics

PROMETHEUS_ACCEPT = (
    b"application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    b"version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
TRITON = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="simple",version="1"} 12
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-1"} 0.25
"""
PYTHON_WORKER = """# HELP worker_dispatch_total Batches "dispatched".
# TYPE worker_dispatch_total counter
worker_dispatch_total{model="m"} 2.0
# HELP worker_dispatch_created Batches "dispatched".
# TYPE worker_dispatch_created gauge
worker_dispatch_created{model="m"} 1.7e+09
# HELP worker_seconds Latency.
# TYPE worker_seconds histogram
worker_seconds_bucket{le="0.5"} 1.0
worker_seconds_bucket{le="+Inf"} 2.0
worker_seconds_count 2.0
worker_seconds_sum 0.75
"""


def oracle(text: str) -> list[Metric]:
    """prometheus_client's OpenMetrics parser (untyped): raises on invalid OpenMetrics."""
    return list(text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


def parsed(exposition: bytes) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    """The oracle's reading: family -> (type, samples); it raises on invalid OpenMetrics."""
    text = exposition.decode()
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    families = oracle(text)
    names = [f.name for f in families]
    assert len(names) == len(set(names)), names
    return {f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples]) for f in families}


def test_prometheus_asks_for_openmetrics_and_others_do_not() -> None:
    assert wants_openmetrics(PROMETHEUS_ACCEPT)
    assert wants_openmetrics(b"application/openmetrics-text")
    assert not wants_openmetrics(None)
    assert not wants_openmetrics(b"*/*")
    assert not wants_openmetrics(b"text/plain;version=0.0.4")
    assert not wants_openmetrics(b"application/openmetrics-text;q=0,text/plain")
    assert not wants_openmetrics(b"application/openmetrics-text;version=2.0.0")
    assert not wants_openmetrics(b"application/openmetrics-text;q=high")


def test_triton_and_a_python_worker_become_openmetrics() -> None:
    families = parsed(merge_openmetrics([], [TRITON, PYTHON_WORKER]))
    # A counter without `_total` cannot be an OpenMetrics counter: its series stay.
    assert families["nv_inference_request_success"] == (
        "unknown",
        [("nv_inference_request_success", {"model": "simple", "version": "1"}, 12.0)],
    )
    assert families["nv_gpu_utilization"][0] == "gauge"
    assert families["worker_dispatch"] == (
        "counter",
        [("worker_dispatch_total", {"model": "m"}, 2.0)],
    )
    assert "worker_dispatch_created" not in families  # the created time, as ours: dropped
    assert families["worker_seconds"][0] == "histogram"
    assert len(families["worker_seconds"][1]) == 4


def test_timestamps_become_seconds_and_unreadable_lines_are_dropped() -> None:
    text = 'up{a="1"} 1 1700000000123\nnot a sample\nbroken{a="1} 2\nup{a="2"} 1\n'
    out = merge_openmetrics([], [text]).decode()
    assert 'up{a="1"} 1.0 1700000000.123' in out
    assert "broken" not in out and "not" not in out
    assert parsed(out.encode())["up"][0] == "unknown"


def test_the_gateways_families_come_first_with_their_exemplars() -> None:
    registry = CollectorRegistry(auto_describe=False)
    Counter("gateway_requests", "Calls.", registry=registry).inc()
    Gauge("gateway_build_info", "Always 1.", ["version"], registry=registry).labels("1").set(1)
    latency = HistogramFamily("gateway_latency_seconds", "Latency.", ["rpc"], registry, (0.1, 1))
    trace = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"}
    latency.labels("ModelInfer").observe_exemplified(0.5, Exemplar(trace, 0.5, 1.7e9))
    worker = relabel_exposition(PYTHON_WORKER, "worker", "worker0")
    out = merge_openmetrics(served_families(registry), [worker, TRITON])
    assert out.startswith(b"# HELP gateway_requests Calls.\n")
    assert b"gateway_requests_created" not in out
    text = out.decode()
    (family,) = [f for f in oracle(text) if f.name == "gateway_latency_seconds"]
    (bucket,) = [s for s in family.samples if s.exemplar is not None]
    assert bucket.labels["le"] == "1.0"
    assert bucket.exemplar == Exemplar(trace, 0.5, Timestamp(1_700_000_000, 0))
    assert parsed(out)["worker_dispatch"][1][0][1] == {"worker": "worker0", "model": "m"}


# Property tests: any text exposition becomes valid OpenMetrics, what is valid keeps
# its series, and a merge of several stays valid.

NAMES = ("a", "a_total", "a_bucket", "a_count", "a_sum", "a_created", "b", "b_total", "c")
SUFFIXES = ("", "_total", "_bucket", "_count", "_sum", "_created")
TYPES = ("counter", "gauge", "untyped", "histogram", "summary", "gaugehistogram", None)
label_values = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
labels = st.dictionaries(st.sampled_from(["x", "y", "le", "quantile"]), label_values, max_size=3)
values = st.floats() | st.integers(-5, 10**6).map(float)


def number(value: float) -> str:
    """A value as an exporter might write it in the text format."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value) if not value.is_integer() else str(int(value))


def text_sample(name: str, labelled: dict[str, str], value: float, stamp: int | None) -> str:
    pairs = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labelled.items())
    body = f"{name}{{{pairs}}}" if labelled else name
    return f"{body} {number(value)}" + ("" if stamp is None else f" {stamp}")


def text_family(name: str, kind: str | None, help_text: str | None, samples: Sequence[str]) -> str:
    head = []
    if help_text is not None:
        escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        head.append(f"# HELP {name} {escaped}")
    if kind is not None:
        head.append(f"# TYPE {name} {kind}")
    return "\n".join([*head, *samples]) + "\n"


@st.composite
def any_family(draw: st.DrawFn) -> str:
    """A family of any shape the text format can hold, sense or not."""
    name = draw(st.sampled_from(NAMES))
    samples = [
        text_sample(
            name + draw(st.sampled_from(SUFFIXES)),
            draw(labels),
            draw(values),
            draw(st.none() | st.integers(0, 2**40)),
        )
        for _ in range(draw(st.integers(0, 4)))
    ]
    return text_family(name, draw(st.sampled_from(TYPES)), draw(st.none() | label_values), samples)


@st.composite
def histogram(draw: st.DrawFn, name: str) -> tuple[str, int]:
    """A well-formed text histogram: per label set, cumulative buckets, +Inf, count, sum."""
    lines = []
    groups = draw(st.lists(label_values, min_size=1, max_size=2, unique=True))
    for group in groups:
        bounds = sorted(set(draw(st.lists(st.floats(0, 1e6), max_size=3))))
        counts = sorted(draw(st.lists(st.integers(0, 1000), min_size=len(bounds) + 1)))
        counts = counts[: len(bounds) + 1]
        for bound, count in zip([*bounds, math.inf], counts, strict=True):
            le = "+Inf" if bound == math.inf else floatToGoString(bound)  # type: ignore[no-untyped-call]
            lines.append(text_sample(name + "_bucket", {"g": group, "le": le}, count, None))
        lines.append(text_sample(name + "_count", {"g": group}, counts[-1], None))
        lines.append(text_sample(name + "_sum", {"g": group}, draw(st.floats(0, 1e9)), None))
    return text_family(name, "histogram", "A histogram.", lines), len(lines)


@st.composite
def well_formed(draw: st.DrawFn) -> tuple[str, dict[str, tuple[str, int]]]:
    """A text exposition of distinct, valid families, and what each should become."""
    text, expected = "", {}
    for index, kind in enumerate(draw(st.lists(st.sampled_from(TYPES[:4]), max_size=5))):
        name = f"family{index}"
        count = draw(st.integers(1, 3))
        series = [{"n": str(n)} for n in range(count)]
        if kind == "histogram":
            family, count = draw(histogram(name))
            expected[name] = ("histogram", count)
            text += family
            continue
        sample_name = name + "_total" if kind == "counter" and draw(st.booleans()) else name
        good = st.floats(0, 1e12) if kind == "counter" else values
        samples = [text_sample(sample_name, s, draw(good), None) for s in series]
        text += text_family(sample_name, kind, draw(label_values), samples)
        if kind == "counter" and sample_name.endswith("_total"):
            expected[name] = ("counter", count)
        else:
            expected[sample_name] = ("gauge" if kind == "gauge" else "unknown", count)
    return text, expected


@given(st.lists(any_family(), max_size=6))
def test_any_text_exposition_becomes_valid_openmetrics(families: list[str]) -> None:
    parsed(merge_openmetrics([], ["".join(families)]))


@given(well_formed())
def test_valid_families_keep_their_series(case: tuple[str, dict[str, tuple[str, int]]]) -> None:
    text, expected = case
    families = parsed(merge_openmetrics([], [text]))
    assert {name: (kind, len(samples)) for name, (kind, samples) in families.items()} == expected


@given(st.lists(st.lists(any_family(), max_size=4).map("".join), max_size=4))
def test_a_merge_of_workers_under_the_gateway_is_valid(texts: list[str]) -> None:
    registry = CollectorRegistry(auto_describe=False)
    Counter("a", "The gateway's own a.", registry=registry).inc()
    relabelled = [relabel_exposition(t, "worker", f"worker{i}") for i, t in enumerate(texts)]
    families = parsed(merge_openmetrics(served_families(registry), relabelled))
    assert families["a"][0] == "counter"  # the gateway's family wins its name


@given(st.lists(any_family(), max_size=6))
def test_conversion_alone_gives_unique_families(families: list[str]) -> None:
    names = [f.name for f in openmetrics_families("".join(families))]
    assert len(names) == len(set(names))
