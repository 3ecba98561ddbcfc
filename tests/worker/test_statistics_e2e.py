"""Triton's ModelStatistics on the simulated worker agree with the work it did and its /metrics.

Memory streams and the autojump clock (`tests.worker.client`): requests one after
another are one dispatch each, a burst while the device is busy is batched, and
the statistics count rows, executions, batch sizes, successes and failures as the
worker's own /metrics counters do.
"""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.worker._worker import WorkerConfig
from tests.helpers import infer_request, simple_inputs
from tests.worker.client import WorkerClient, grpc_error, open_memory_worker, scrape_models


async def _statistics(client: WorkerClient, model: str) -> pb.ModelStatistics:
    request = pb.ModelStatisticsRequest(name=model)
    response = await client.call(Method.MODEL_STATISTICS, request, pb.ModelStatisticsResponse)
    [stats] = response.model_stats
    return stats


def _batches(stats: pb.ModelStatistics) -> dict[int, int]:
    return {b.batch_size: b.compute_infer.count for b in stats.batch_stats}


async def test_statistics_count_the_work_done(autojump_clock: MockClock) -> None:
    async with open_memory_worker(WorkerConfig(port=0, metrics_port=-1)) as client:
        untouched = await _statistics(client, "simple")
        assert (untouched.inference_count, untouched.execution_count) == (0, 0)
        assert not untouched.batch_stats and untouched.last_inference == 0

        for seed, rows in enumerate((1, 2, 4)):  # one after another: a dispatch each
            await client.check_simple(seed, rows)
        bad = infer_request("simple", simple_inputs(seed=9, rows=1))
        bad.inputs[0].shape[:] = [1, 15]  # does not match its 64 bytes
        assert (await grpc_error(client.infer(bad)))[0] is StatusCode.INVALID_ARGUMENT

        stats = await _statistics(client, "simple")
        assert (stats.name, stats.version) == ("simple", "1")
        assert stats.inference_count == 7  # rows
        assert stats.execution_count == 3  # dispatches
        assert _batches(stats) == {1: 1, 2: 1, 4: 1}
        inference = stats.inference_stats
        assert (inference.success.count, inference.fail.count) == (3, 1)
        assert inference.queue.count == inference.compute_infer.count == 3
        assert inference.compute_input.count == inference.compute_output.count == 3
        assert inference.compute_infer.ns > 0 and stats.last_inference > 0

        # The same work as /metrics counts it.
        worker = client.worker
        assert scrape_models(worker, "worker_rows_served_total")["simple"] == 7
        assert scrape_models(worker, "worker_dispatch_total")["simple"] == 3
        assert scrape_models(worker, "worker_requests_served_total")["simple"] == 3
        compute = scrape_models(worker, "worker_compute_seconds_total")["simple"]
        batch_ns = sum(b.compute_infer.ns for b in stats.batch_stats)
        assert batch_ns == pytest.approx(compute * 1e9, rel=1e-6, abs=3)


async def test_a_burst_is_counted_per_batch(autojump_clock: MockClock) -> None:
    async with open_memory_worker(WorkerConfig(port=0, metrics_port=-1)) as client:
        async with trio.open_nursery() as nursery:
            for seed in range(12):
                nursery.start_soon(client.check_simple, seed, 1)

        stats = await _statistics(client, "simple")
        batches = _batches(stats)
        assert stats.inference_count == 12
        assert sum(size * count for size, count in batches.items()) == 12
        assert sum(batches.values()) == stats.execution_count < 12  # some were batched
        assert stats.inference_stats.success.count == 12
        assert scrape_models(client.worker, "worker_dispatch_total")["simple"] == (
            stats.execution_count
        )
