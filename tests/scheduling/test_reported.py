"""Work counters from what a worker reports, or from what the gateway measures."""

from __future__ import annotations

import pytest

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.scheduling.calls._reported import MeasuredCounters, from_statistics


def test_triton_statistics_count_a_batch_once_and_read_the_batch_axis() -> None:
    stats = pb.ModelStatisticsResponse()
    m = stats.model_stats.add(name="m", version="1", inference_count=12, execution_count=3)
    m.inference_stats.success.count = 10
    m.inference_stats.compute_infer.ns = 99_000_000_000  # per request: a batch counted N times
    for size, ns in ((4, 1_000_000_000), (8, 2_000_000_000)):
        batch = m.batch_stats.add(batch_size=size)
        batch.compute_infer.ns = ns
        batch.compute_input.ns = ns // 10
    m.memory_usage.add(type="GPU", id=0, byte_size=4096)
    config = pb.ModelConfig(name="m", max_batch_size=8)
    config.input.add(name="x")
    counters = from_statistics(stats, {"m": config}).models["m"]
    assert counters.total_compute_seconds == pytest.approx(3.3)
    assert (counters.requests_served, counters.rows_served) == (10, 12)
    assert (counters.max_batch_size, counters.batch_input_name, counters.batch_axis) == (8, "x", 1)
    assert counters.weight_nbytes == 4096


def test_an_unbatched_or_unconfigured_model_has_no_batch_axis() -> None:
    stats = pb.ModelStatisticsResponse()
    m = stats.model_stats.add(name="m", inference_count=2)
    m.inference_stats.success.count = 2
    m.inference_stats.compute_infer.ns = 500_000_000
    counters = from_statistics(stats, {}).models["m"]
    assert counters.total_compute_seconds == pytest.approx(0.5)
    assert (counters.batch_input_name, counters.batch_axis) == ("", 0)
    unbatched = pb.ModelConfig(name="m", max_batch_size=0)
    unbatched.input.add(name="x")
    assert from_statistics(stats, {"m": unbatched}).models["m"].batch_axis == 0


def test_measured_counters_are_cumulative_per_worker_and_model() -> None:
    measured = MeasuredCounters()
    for seconds in (0.1, 0.3):
        measured.record("a:1", "m", seconds)
    measured.record("b:1", "m", 1.0)
    counters = measured.counters("a:1").models["m"]
    assert counters.total_compute_seconds == pytest.approx(0.4)
    assert (counters.requests_served, counters.rows_served) == (2, 2)
    assert measured.counters("c:1").models == {}
    measured.forget("a:1")
    assert measured.counters("a:1").models == {}
    assert measured.counters("b:1").models["m"].requests_served == 1
