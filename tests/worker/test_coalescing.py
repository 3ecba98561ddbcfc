"""The simulated device coalesces concurrent requests into batches (issue acceptance 4).

An in-process worker with a model whose launch cost (200 ms) dwarfs its
per-row cost, so while one batch executes the next requests queue up and leave
together. We check the outcome through ModelControlStatus, as the gateway reads
it, and check every response's numbers, so coalescing can never mix up whose
outputs are whose. The requests come from one thread with grpcio futures: all
64 are on the wire before the first answer, which a loop of blocking calls
could never guarantee.
"""

from __future__ import annotations

import textwrap
from functools import partial

import grpc
import numpy as np
import pytest
import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.worker._worker import WorkerConfig, open_worker
from tests.helpers import (
    MODEL_INFER,
    catalogue_from_yaml,
    in_thread,
    infer_request,
    model_infer,
    model_status,
    output_array,
)

LAUNCH_SECONDS = 0.2
ITEM_SECONDS = 0.001
MAX_BATCH = 16

CATALOGUE = catalogue_from_yaml(
    textwrap.dedent(
        f"""\
        models:
          - name: batched
            inputs:
              - {{name: INPUT0, datatype: INT32, shape: [-1, 4]}}
              - {{name: INPUT1, datatype: INT32, shape: [-1, 4]}}
            outputs:
              - {{name: OUTPUT0, datatype: INT32, shape: [-1, 4]}}
              - {{name: OUTPUT1, datatype: INT32, shape: [-1, 4]}}
            max_batch_size: {MAX_BATCH}
            launch_ms: {LAUNCH_SECONDS * 1000}
            item_ms: {ITEM_SECONDS * 1000}
            compute: add_sub
          - name: scaled
            inputs:
              - {{name: INPUT0, datatype: INT32, shape: [-1, 4]}}
              - {{name: INPUT1, datatype: INT32, shape: [-1, 4]}}
            outputs:
              - {{name: OUTPUT0, datatype: INT32, shape: [-1, 4]}}
              - {{name: OUTPUT1, datatype: INT32, shape: [-1, 4]}}
            max_batch_size: 8
            launch_ms: 20
            item_ms: 5
            compute: add_sub
        """
    ),
    with_builtin=False,
)


def _config(*, time_scale: float = 1.0) -> WorkerConfig:
    return WorkerConfig(port=0, metrics_port=-1, catalogue=CATALOGUE, time_scale=time_scale)


def _request(model: str, index: int, rows: int = 1) -> pb.ModelInferRequest:
    """Request `index`: INPUT0 is all `index`, so its answer is recognisably its own."""
    a = np.full((rows, 4), index, dtype=np.int32)
    b = np.arange(rows * 4, dtype=np.int32).reshape(rows, 4)
    return infer_request(model, {"INPUT0": a, "INPUT1": b}, request_id=str(index))


def _check_answer(response: pb.ModelInferResponse, index: int, rows: int = 1) -> None:
    a = np.full((rows, 4), index, dtype=np.int32)
    b = np.arange(rows * 4, dtype=np.int32).reshape(rows, 4)
    assert response.id == str(index)
    np.testing.assert_array_equal(output_array(response, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(response, "OUTPUT1"), a - b)


def _infer_concurrently(target: str, requests: list[pb.ModelInferRequest]) -> list[bytes]:
    """Start every call before waiting for any (grpcio futures on one channel)."""
    with grpc.insecure_channel(target) as channel:
        method = channel.unary_unary(MODEL_INFER)
        futures = [method.future(r.SerializeToString(), timeout=30) for r in requests]
        return [f.result() for f in futures]


async def test_concurrent_requests_coalesce() -> None:
    async with open_worker(_config()) as worker:
        target = f"127.0.0.1:{worker.grpc_port}"
        requests = [_request("batched", i) for i in range(64)]

        bodies = await in_thread(partial(_infer_concurrently, target, requests))

        for i, body in enumerate(bodies):
            _check_answer(pb.ModelInferResponse.FromString(body), i)
        status = await in_thread(partial(model_status, target, "batched"))
        assert status.requests_served == 64
        assert status.rows_served == 64
        # At least ceil(64 / 16) = 4 batches. At most 5: the first dispatch may
        # leave with only the first arrival, and the other 63 queue behind it
        # for 200 ms, which is ample for them to arrive, and leave in four.
        assert 4 <= status.dispatch_count <= 5
        assert status.max_batch_size == MAX_BATCH
        assert status.queue_depth == 0
        assert status.total_compute_seconds == pytest.approx(
            status.dispatch_count * LAUNCH_SECONDS + 64 * ITEM_SECONDS
        )

        # A pre-batched request: 8 rows, one request, one dispatch.
        before = status
        response = await in_thread(partial(model_infer, target, _request("batched", 99, rows=8)))
        _check_answer(response, 99, rows=8)
        after = await in_thread(partial(model_status, target, "batched"))
        assert after.rows_served == before.rows_served + 8
        assert after.requests_served == before.requests_served + 1
        assert after.dispatch_count == before.dispatch_count + 1
        assert after.total_compute_seconds - before.total_compute_seconds == pytest.approx(
            LAUNCH_SECONDS + 8 * ITEM_SECONDS
        )


async def _compute_seconds(time_scale: float, rows: int) -> tuple[float, float]:
    """Run one `rows`-row request on a fresh worker; its compute seconds and wall time."""
    async with open_worker(_config(time_scale=time_scale)) as worker:
        target = f"127.0.0.1:{worker.grpc_port}"
        started = trio.current_time()
        response = await in_thread(partial(model_infer, target, _request("scaled", 3, rows)))
        elapsed = trio.current_time() - started
        _check_answer(response, 3, rows)
        status = await in_thread(partial(model_status, target, "scaled"))
    assert status.dispatch_count == 1
    return status.total_compute_seconds, elapsed


async def test_time_scale_multiplies_compute_time() -> None:
    rows = 4
    unscaled = 0.020 + 0.005 * rows  # launch_ms 20, item_ms 5
    once, once_elapsed = await _compute_seconds(1.0, rows)
    twice, twice_elapsed = await _compute_seconds(2.0, rows)
    assert once == pytest.approx(unscaled)
    assert twice == pytest.approx(2 * once)
    # The device really is busy that long: neither call can return any sooner.
    assert once_elapsed >= unscaled
    assert twice_elapsed >= 2 * unscaled
