"""A meta on a live worker: real sub-dispatches that coalesce, compute counted once.

Sixteen concurrent requests of the built-in `search_pipeline` meta each run
through `search_embedder` and then `search_scorer`. Their sub-calls queue like
any other requests of those models, so they leave in shared batches; the meta
reports one dispatch, one request and one row per request, and its compute is
exactly the device time its sub-calls used (each request's share of each
batch), so nothing is counted twice.

Runs on memory streams with the autojump clock (`tests.worker.client`); the
metrics are the worker's /metrics exposition, read from its registry.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.worker._worker import WorkerConfig
from tests.helpers import infer_request
from tests.worker.client import WorkerClient, open_memory_worker, scrape_models


async def _concurrently(
    client: WorkerClient, requests: list[pb.ModelInferRequest]
) -> list[pb.ModelInferResponse]:
    """Start every call before waiting for any (one task per call, one channel)."""
    responses: dict[int, pb.ModelInferResponse] = {}

    async def infer(i: int) -> None:
        responses[i] = await client.infer(requests[i], time_limit=30)

    async with trio.open_nursery() as nursery:
        for i in range(len(requests)):
            nursery.start_soon(infer, i)
    return [responses[i] for i in range(len(requests))]


async def test_meta_subcalls_coalesce_and_count_once(autojump_clock: MockClock) -> None:
    async with open_memory_worker(WorkerConfig(port=0, metrics_port=-1, time_scale=20.0)) as client:
        device = client.device
        rows = [1 + i % 3 for i in range(16)]
        requests = [
            infer_request("search_pipeline", {"query_ids": np.zeros((r, 32), np.int64)})
            for r in rows
        ]
        started = trio.current_time()
        responses = await _concurrently(client, requests)
        elapsed = trio.current_time() - started
        for response, r in zip(responses, rows, strict=True):
            assert response.model_name == "search_pipeline"
            assert [list(o.shape) for o in response.outputs] == [[r, 10]]

        embedder = device.counters["search_embedder"]
        scorer = device.counters["search_scorer"]
        assert embedder.requests_served == scorer.requests_served == 16
        assert embedder.rows_served == scorer.rows_served == sum(rows)
        # The first sub-call may leave alone; the others queue behind it and share.
        assert embedder.dispatch_count < 16 and scorer.dispatch_count < 16

        pipe = await client.model_status("search_pipeline")
        assert (pipe.requests_served, pipe.rows_served, pipe.dispatch_count) == (16, 16, 16)
        assert pipe.queue_depth == 0
        assert pipe.total_compute_seconds == pytest.approx(
            embedder.total_compute_seconds + scorer.total_compute_seconds
        )
        # Nothing else ran and every request arrived at once, so the device was
        # busy exactly until the last answer, and the meta's compute is all of it.
        assert elapsed == pytest.approx(device.busy_seconds)
        assert pipe.total_compute_seconds == pytest.approx(device.busy_seconds)

        # /metrics shows the meta as one unit too; its sub-models are not listed.
        compute = scrape_models(client.worker, "worker_compute_seconds_total")
        assert "search_embedder" not in compute and "search_scorer" not in compute
        assert compute["search_pipeline"] == pytest.approx(pipe.total_compute_seconds)
        max_batch = scrape_models(client.worker, "worker_model_max_batch_size")
        assert max_batch["search_pipeline"] == 0
        weights = scrape_models(client.worker, "worker_model_weight_bytes")
        assert weights["search_pipeline"] == pipe.weight_nbytes
