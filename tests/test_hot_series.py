"""The request path's lock-free series against prometheus_client's own, as the oracle."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram

from rsgw.runtime._exposition import LATENCY_BUCKETS, render_registry
from rsgw.runtime._hot_series import CounterFamily, HistogramFamily

#: Observations at, around and beyond the bucket bounds.
seconds = st.one_of(
    st.sampled_from([0.0, *LATENCY_BUCKETS, 1e9]),
    st.floats(min_value=0.0, max_value=20.0, allow_nan=False),
)
observations = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), seconds), max_size=60)


@given(observations, st.sampled_from(["a", "b", "c", None]))
def test_the_exposition_is_prometheus_clients(
    observed: list[tuple[str, float]], removed: str | None
) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counters = (
        Counter("calls", "Calls.", ["model"], registry=theirs),
        CounterFamily("calls", "Calls.", ["model"], ours),
    )
    histograms = (
        Histogram("took_seconds", "Took.", ["model"], buckets=LATENCY_BUCKETS, registry=theirs),
        HistogramFamily("took_seconds", "Took.", ["model"], ours, LATENCY_BUCKETS),
    )
    for model, value in observed:
        for counter in counters:
            counter.labels(model).inc()
        for histogram in histograms:
            histogram.labels(model).observe(value)
    if removed is not None and any(model == removed for model, _ in observed):
        for family in (*counters, *histograms):
            family.remove(removed)
    assert render_registry(ours) == render_registry(theirs)


def test_wrong_label_counts_and_unknown_series_are_refused() -> None:
    family = CounterFamily("calls", "Calls.", ["rpc", "model"], CollectorRegistry())
    with pytest.raises(ValueError, match="takes labels"):
        family.labels("ModelInfer")
    with pytest.raises(KeyError):
        family.remove("ModelInfer", "never")
