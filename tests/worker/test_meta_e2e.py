"""A meta on a live worker: real sub-dispatches that coalesce, compute counted once.

Sixteen concurrent requests of the built-in `search_pipeline` meta each run
through `search_embedder` and then `search_scorer`. Their sub-calls queue like
any other requests of those models, so they leave in shared batches; the meta
reports one dispatch, one request and one row per request, and its compute is
exactly the device time its sub-calls used (each request's share of each
batch), so nothing is counted twice.
"""

from __future__ import annotations

from functools import partial

import grpc
import numpy as np
import pytest

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.worker._worker import WorkerConfig, open_worker
from tests.helpers import MODEL_INFER, in_thread, infer_request, model_status
from tests.worker.control import scrape_models


def _concurrently(target: str, requests: list[pb.ModelInferRequest]) -> list[bytes]:
    with grpc.insecure_channel(target) as channel:
        method = channel.unary_unary(MODEL_INFER)
        futures = [method.future(r.SerializeToString(), timeout=30) for r in requests]
        return [f.result() for f in futures]


async def test_meta_subcalls_coalesce_and_count_once() -> None:
    async with open_worker(WorkerConfig(port=0, metrics_port=0, time_scale=20.0)) as worker:
        target = f"127.0.0.1:{worker.grpc_port}"
        device = worker.service.device
        rows = [1 + i % 3 for i in range(16)]
        requests = [
            infer_request("search_pipeline", {"query_ids": np.zeros((r, 32), np.int64)})
            for r in rows
        ]
        bodies = await in_thread(partial(_concurrently, target, requests))
        for body, r in zip(bodies, rows, strict=True):
            response = pb.ModelInferResponse.FromString(body)
            assert response.model_name == "search_pipeline"
            assert [list(o.shape) for o in response.outputs] == [[r, 10]]

        embedder = device.counters["search_embedder"]
        scorer = device.counters["search_scorer"]
        assert embedder.requests_served == scorer.requests_served == 16
        assert embedder.rows_served == scorer.rows_served == sum(rows)
        # The first sub-call may leave alone; the others queue behind it and share.
        assert embedder.dispatch_count < 16 and scorer.dispatch_count < 16

        pipe = await in_thread(partial(model_status, target, "search_pipeline"))
        assert (pipe.requests_served, pipe.rows_served, pipe.dispatch_count) == (16, 16, 16)
        assert pipe.queue_depth == 0
        assert pipe.total_compute_seconds == pytest.approx(
            embedder.total_compute_seconds + scorer.total_compute_seconds
        )

        # /metrics shows the meta as one unit too; its sub-models are not listed.
        assert worker.metrics_port is not None
        port = worker.metrics_port
        compute = await in_thread(partial(scrape_models, port, "worker_compute_seconds_total"))
        assert "search_embedder" not in compute and "search_scorer" not in compute
        assert compute["search_pipeline"] == pytest.approx(pipe.total_compute_seconds)
        max_batch = await in_thread(partial(scrape_models, port, "worker_model_max_batch_size"))
        assert max_batch["search_pipeline"] == 0
        weights = await in_thread(partial(scrape_models, port, "worker_model_weight_bytes"))
        assert weights["search_pipeline"] == pipe.weight_nbytes
