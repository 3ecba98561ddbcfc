"""The exposition merge (one header pair per family, samples grouped) and relabelling."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from rsgw.runtime._exposition import escape_label_value, merge_expositions, relabel_exposition

GATEWAY = """# HELP gateway_requests_total Count.
# TYPE gateway_requests_total counter
gateway_requests_total{rpc="ModelInfer"} 3.0
"""
WORKER0 = """# HELP worker_dispatch_total Batches.
# TYPE worker_dispatch_total counter
worker_dispatch_total{worker="worker0",model="m"} 2.0
# HELP worker_request_latency_seconds Latency.
# TYPE worker_request_latency_seconds histogram
worker_request_latency_seconds_bucket{worker="worker0",le="+Inf"} 1.0
worker_request_latency_seconds_count{worker="worker0"} 1.0
# a stray comment
"""
WORKER1 = WORKER0.replace("worker0", "worker1").replace("Batches.", "Other help.")


def test_one_header_pair_per_family_and_grouped_samples() -> None:
    merged = merge_expositions([GATEWAY, WORKER0, WORKER1])
    lines = merged.splitlines()
    assert lines.count("# TYPE worker_dispatch_total counter") == 1
    assert "# HELP worker_dispatch_total Batches." in lines  # the first HELP wins
    assert "# HELP worker_dispatch_total Other help." not in lines
    assert "# a stray comment" not in lines
    start = lines.index("# TYPE worker_dispatch_total counter")
    assert lines[start + 1 : start + 3] == [
        'worker_dispatch_total{worker="worker0",model="m"} 2.0',
        'worker_dispatch_total{worker="worker1",model="m"} 2.0',
    ]
    hist = lines.index("# TYPE worker_request_latency_seconds histogram")
    assert all(
        line.startswith("worker_request_latency_seconds_") for line in lines[hist + 1 : hist + 5]
    )
    assert lines[0].startswith("# HELP gateway_requests_total")


def test_headerless_samples_form_their_own_family() -> None:
    merged = merge_expositions(["up 1\n", "up 0\nother 2\n"])
    assert merged == "up 1\nup 0\nother 2\n"


def test_empty() -> None:
    assert merge_expositions([]) == ""
    assert merge_expositions(["", "\n\n"]) == ""


families = st.sampled_from(["a_total", "b_seconds", "c"])


@st.composite
def exposition(draw: st.DrawFn) -> str:
    lines = []
    for name in draw(st.lists(families, max_size=4, unique=True)):
        lines.append(f"# HELP {name} help of {name}")
        lines.append(f"# TYPE {name} counter")
        for i in range(draw(st.integers(0, 3))):
            suffix = draw(st.sampled_from(["", "_bucket", "_count"]))
            lines.append(f'{name}{suffix}{{i="{i}"}} {i}')
    return "\n".join(lines) + "\n"


@given(st.lists(exposition(), max_size=4))
def test_merge_keeps_every_sample_and_one_header_each(texts: list[str]) -> None:
    merged = merge_expositions(texts).splitlines()
    originals = [ln for t in texts for ln in t.splitlines() if ln and not ln.startswith("#")]
    kept = [ln for ln in merged if not ln.startswith("#")]
    assert sorted(kept) == sorted(originals)
    headers = [ln for ln in merged if ln.startswith("# TYPE")]
    assert len(headers) == len(set(headers))
    assert merge_expositions([merge_expositions(texts)]) == merge_expositions(texts)


# -- relabelling a worker's text with the gateway's name for it -----------------------------


def test_relabel_sets_the_label_first_and_keeps_the_old_one_as_exported() -> None:
    text = (
        "# HELP m help\n# TYPE m counter\n"
        'm{worker="w",gpu="0"} 2.0\n'
        "plain 1.0\n"
        'odd{a="x,}\\"y",worker="q"} 3.0 1700000000\n'
    )
    assert relabel_exposition(text, "worker", "gw0").splitlines() == [
        "# HELP m help",
        "# TYPE m counter",
        'm{worker="gw0",exported_worker="w",gpu="0"} 2.0',
        'plain{worker="gw0"} 1.0',
        'odd{worker="gw0",a="x,}\\"y",exported_worker="q"} 3.0 1700000000',
    ]


label_names = st.sampled_from(["worker", "gpu", "model", "exported_worker", "le"])
label_texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)


@given(
    labels=st.dictionaries(label_names, label_texts, max_size=4),
    value=label_texts,
)
def test_relabel_agrees_with_prometheus_client_parser(labels: dict[str, str], value: str) -> None:
    pairs = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items())
    text = f"# TYPE m gauge\nm{{{pairs}}} 1.0\n"
    (sample,) = next(
        iter(text_string_to_metric_families(relabel_exposition(text, "worker", value)))
    ).samples
    expected = dict(labels)
    if "worker" in labels:
        expected["exported_worker"] = labels["worker"]
    expected["worker"] = value
    assert sample.labels == expected
