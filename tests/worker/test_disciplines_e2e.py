"""The dispatch disciplines on a live worker (issue 3, acceptance 1).

In-process workers, grpcio clients in threads. `edf`: while a long batch of a
third model occupies the device, two models queue one request each, the later
one with the sooner deadline; edf runs it first and fifo does not. `fair`: two
equal models, both kept backlogged, weights 3:1 set with SetModelPolicy; over at
least 200 dispatches their compute splits about 3:1. The split is measured
between two snapshots of the device counters taken while both queues are
non-empty, so neither the ramp-up nor the drain skews it.
"""

from __future__ import annotations

import textwrap
from functools import partial

import grpc
import numpy as np
import pytest
import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.worker._batching import Discipline
from rsgw.worker._worker import RunningWorker, WorkerConfig, open_worker
from tests.helpers import (
    MODEL_INFER,
    catalogue_from_yaml,
    in_thread,
    infer_request,
    model_infer,
    model_status,
    wait_until_async,
)
from tests.worker.control import set_weight


def _model(name: str, launch_ms: float, max_batch: int = 8) -> str:
    return textwrap.dedent(
        f"""\
          - name: {name}
            inputs: [{{name: x, datatype: INT32, shape: [-1, 2]}}]
            outputs: [{{name: y, datatype: INT32, shape: [-1, 2]}}]
            max_batch_size: {max_batch}
            launch_ms: {launch_ms}
            item_ms: 0
        """
    )


CATALOGUE = catalogue_from_yaml(
    "models:\n"
    + _model("blocker", 400)
    + _model("a", 30)
    + _model("b", 30)
    + _model("gold", 3, max_batch=0)
    + _model("bronze", 3, max_batch=0),
    with_builtin=False,
)


def _request(model: str, deadline_s: float | None = None) -> pb.ModelInferRequest:
    params = {"reactant_timeout_ns": int(deadline_s * 1e9)} if deadline_s else None
    return infer_request(model, {"x": np.zeros((1, 2), np.int32)}, parameters=params)


def _target(worker: RunningWorker) -> str:
    return f"127.0.0.1:{worker.grpc_port}"


@pytest.mark.parametrize(
    ("discipline", "expected"),
    [(Discipline.EDF, ["b", "a"]), (Discipline.FIFO, ["a", "b"])],
)
async def test_edf_runs_the_sooner_deadline_first(
    discipline: Discipline, expected: list[str]
) -> None:
    config = WorkerConfig(port=0, metrics_port=-1, catalogue=CATALOGUE, discipline=discipline)
    async with open_worker(config) as worker:
        target = _target(worker)
        device = worker.service.device
        finished: list[str] = []

        async def infer(model: str, deadline_s: float | None) -> None:
            await in_thread(partial(model_infer, target, _request(model, deadline_s)))
            finished.append(model)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(infer, "blocker", None)
            await wait_until_async(
                lambda: worker.service.inflight == 1 and device.queue_depth("blocker") == 0,
                what="the blocker to start executing",
            )
            # Both deadlines inside grpcio's own 10 s timeout, which also bounds them.
            nursery.start_soon(infer, "a", 8.0)  # arrives first, deadline later
            await wait_until_async(lambda: device.queue_depth("a") == 1, what="a queued")
            nursery.start_soon(infer, "b", 3.0)  # arrives second, deadline sooner
            await wait_until_async(lambda: device.queue_depth("b") == 1, what="b queued")
            # Both queued behind the blocker, so the next choice is the discipline's.
            assert device.counters["blocker"].dispatch_count == 0
        assert finished == ["blocker", *expected]


def _flood(target: str, requests: list[pb.ModelInferRequest]) -> None:
    """Send everything on one channel at once; wait for every call to end, any way."""
    with grpc.insecure_channel(target) as channel:
        method = channel.unary_unary(MODEL_INFER)
        futures = [method.future(r.SerializeToString(), timeout=60) for r in requests]
        for future in futures:
            future.exception()  # waits; a call cut off at shutdown is fine


async def test_fair_splits_compute_three_to_one() -> None:
    config = WorkerConfig(
        port=0,
        metrics_port=-1,
        catalogue=CATALOGUE,
        discipline=Discipline.FAIR,
        max_concurrent_requests=0,
    )
    per_model = 400
    async with trio.open_nursery() as clients, open_worker(config) as worker:
        target = _target(worker)
        device = worker.service.device
        gold, bronze = device.counters["gold"], device.counters["bronze"]
        await in_thread(partial(set_weight, target, "gold", 3.0))
        assert (await in_thread(partial(model_status, target, "gold"))).weight == 3.0

        def arrived() -> int:
            # In the handler (queued or executing) or already answered.
            return worker.service.inflight + gold.requests_served + bronze.requests_served

        requests = [_request(m) for _ in range(per_model) for m in ("gold", "bronze")]
        # The flood outlives the worker: leaving the block stops the worker, which
        # fails what is still queued, and the client thread then returns.
        clients.start_soon(in_thread, partial(_flood, target, requests))
        await wait_until_async(lambda: arrived() == len(requests), what="every request to arrive")
        start = (gold.total_compute_seconds, bronze.total_compute_seconds)
        start_dispatches = gold.dispatch_count + bronze.dispatch_count
        await wait_until_async(
            lambda: gold.dispatch_count + bronze.dispatch_count >= start_dispatches + 240,
            what="240 more dispatches",
        )
        end = (gold.total_compute_seconds, bronze.total_compute_seconds)
        dispatches = gold.dispatch_count + bronze.dispatch_count - start_dispatches
        backlogged = device.queue_depth("gold") > 0 and device.queue_depth("bronze") > 0
    assert backlogged, "a queue ran dry inside the window; the split would mean nothing"
    gold_share = (end[0] - start[0]) / (end[0] - start[0] + end[1] - start[1])
    print(f"fair 3:1 over {dispatches} dispatches: gold share {gold_share:.3f}")
    assert dispatches >= 200
    assert gold_share == pytest.approx(0.75, abs=0.04)
