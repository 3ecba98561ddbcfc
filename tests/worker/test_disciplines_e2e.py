"""The dispatch disciplines on a live worker (issue 3, acceptance 1).

In-process workers, rsgw's own client. `edf`: while a long batch of a third
model occupies the device, two models queue one request each, the later one
with the sooner deadline; edf runs it first and fifo does not. `fair`: two equal
models, both kept backlogged, weights 3:1 set with SetModelPolicy; over at least
200 dispatches their compute splits about 3:1. The split is measured between
two snapshots of the device counters taken while both queues are non-empty, so
neither the ramp-up nor the drain skews it.

Runs on memory streams with the autojump clock (`tests.worker.client`): each
batch takes its exact simulated time on the Trio clock and no wall time, so the
edf test also checks when each answer came.
"""

from __future__ import annotations

import contextlib
import textwrap

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import RsgwError
from rsgw.worker._worker import WorkerConfig
from rsgw.worker.device._batching import Discipline
from tests.helpers import catalogue_from_yaml, infer_request, wait_until_async
from tests.worker.client import WorkerClient, open_memory_worker


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


BLOCKER_SECONDS = 0.4
AB_SECONDS = 0.03

CATALOGUE = catalogue_from_yaml(
    "models:\n"
    + _model("blocker", BLOCKER_SECONDS * 1000)
    + _model("a", AB_SECONDS * 1000)
    + _model("b", AB_SECONDS * 1000)
    + _model("gold", 3, max_batch=0)
    + _model("bronze", 3, max_batch=0),
    with_builtin=False,
)


def _request(model: str, deadline_s: float | None = None) -> pb.ModelInferRequest:
    params = {"reactant_timeout_ns": int(deadline_s * 1e9)} if deadline_s else None
    return infer_request(model, {"x": np.zeros((1, 2), np.int32)}, parameters=params)


@pytest.mark.parametrize(
    ("discipline", "expected"),
    [(Discipline.EDF, ["b", "a"]), (Discipline.FIFO, ["a", "b"])],
)
async def test_edf_runs_the_sooner_deadline_first(
    discipline: Discipline, expected: list[str], autojump_clock: MockClock
) -> None:
    config = WorkerConfig(port=0, metrics_port=-1, catalogue=CATALOGUE, discipline=discipline)
    async with open_memory_worker(config) as client:
        worker = client.worker
        device = client.device
        start = trio.current_time()
        finished: list[tuple[str, float]] = []

        async def infer(model: str, deadline_s: float | None) -> None:
            await client.infer(_request(model, deadline_s))
            finished.append((model, trio.current_time() - start))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(infer, "blocker", None)
            await wait_until_async(
                lambda: worker.service.inflight == 1 and device.queue_depth("blocker") == 0,
                what="the blocker to start executing",
            )
            # Both deadlines inside the client's own 10 s deadline, which also bounds them.
            nursery.start_soon(infer, "a", 8.0)  # arrives first, deadline later
            await wait_until_async(lambda: device.queue_depth("a") == 1, what="a queued")
            nursery.start_soon(infer, "b", 3.0)  # arrives second, deadline sooner
            await wait_until_async(lambda: device.queue_depth("b") == 1, what="b queued")
            # Both queued behind the blocker, so the next choice is the discipline's.
            assert device.counters["blocker"].dispatch_count == 0
        assert [model for model, _ in finished] == ["blocker", *expected]
        # Back to back from the first arrival: the blocker, then one batch each.
        assert [at for _, at in finished] == pytest.approx(
            [BLOCKER_SECONDS, BLOCKER_SECONDS + AB_SECONDS, BLOCKER_SECONDS + 2 * AB_SECONDS]
        )


async def _flood(client: WorkerClient, requests: list[pb.ModelInferRequest]) -> None:
    """Send everything on one channel at once; wait for every call to end, any way."""

    async def infer(request: pb.ModelInferRequest) -> None:
        with contextlib.suppress(RsgwError):  # a call cut off at shutdown is fine
            await client.infer(request, time_limit=60)

    async with trio.open_nursery() as nursery:
        for request in requests:
            nursery.start_soon(infer, request)


async def test_fair_splits_compute_three_to_one(autojump_clock: MockClock) -> None:
    config = WorkerConfig(
        port=0,
        metrics_port=-1,
        catalogue=CATALOGUE,
        discipline=Discipline.FAIR,
        max_concurrent_requests=0,
    )
    per_model = 400
    async with trio.open_nursery() as clients, open_memory_worker(config) as client:
        worker = client.worker
        device = client.device
        gold, bronze = device.counters["gold"], device.counters["bronze"]
        await client.set_policy("gold", 3.0)
        assert (await client.model_status("gold")).weight == 3.0

        def arrived() -> int:
            # In the handler (queued or executing) or already answered.
            return worker.service.inflight + gold.requests_served + bronze.requests_served

        requests = [_request(m) for _ in range(per_model) for m in ("gold", "bronze")]
        # The flood outlives the worker: leaving the block stops the worker, which
        # fails what is still queued, and the flood's calls then end.
        clients.start_soon(_flood, client, requests)
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
