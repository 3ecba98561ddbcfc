"""least_outstanding with work_basis, end to end (issue 7, items 3-5).

These run on memory streams with the autojump clock (`open_fleet(memory=True)`):
what they test is how the gateway weighs and spreads work, which the socket and
the client do not change. The simulated workers' compute keeps its Trio-clock
duration (a replica three times slower still takes three times as long), so the
load the router compares is what it would be on a real fleet, only no wall time
passes while a 400 ms batch runs. The in-flight work is read from the gateway's
own registry (`GatewayMetrics.render()`, the text its /metrics starts with);
the merged scrape over HTTP is tested in test_gateway_metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pytest
import trio
import trio.testing
from trio.testing import MockClock

from rsgw.base._errors import GrpcError, RsgwError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.scheduling.calls._schedulers import LeastOutstandingScheduler
from rsgw.scheduling.knobs._knobs import SchedulingMode, WorkBasis
from rsgw.scheduling.knobs._settings import SchedulingConfig
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import catalogue_from_yaml, infer_request, wait_until_async

MODELS = """
models:
  - name: work
    max_batch_size: 1
    launch_ms: 6
    item_ms: 0
    inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
    outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
  - name: held
    max_batch_size: 32
    launch_ms: 400
    item_ms: 0
    inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
    outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
  - name: fixed
    max_batch_size: 0
    launch_ms: 400
    item_ms: 0
    inputs: [{name: x, datatype: FP32, shape: [8, 4]}]
    outputs: [{name: y, datatype: FP32, shape: [8, 4]}]
"""


def scheduling(
    basis: WorkBasis, mode: SchedulingMode = SchedulingMode.LEAST_OUTSTANDING
) -> SchedulingConfig:
    return SchedulingConfig(mode=mode, work_basis=basis)


def body(model: str, rows: int) -> bytes:
    shape = (8, 4) if model == "fixed" else (rows, 4)
    return infer_request(model, {"x": np.zeros(shape, dtype=np.float32)}).SerializeToString()


async def call(
    fleet: Fleet, request: bytes, *, channel: Channel | None = None, deadline: float = math.inf
) -> StatusCode:
    """One ModelInfer through the gateway; the status it ended with."""
    try:
        await (channel or fleet.channel()).unary(
            Method.MODEL_INFER.wire, request, deadline=deadline
        )
    except RsgwError as exc:
        return exc.code
    return StatusCode.OK


async def run_load(fleet: Fleet, model: str, total: int, concurrency: int) -> list[StatusCode]:
    """`total` calls from `concurrency` clients, each on its own connection, one at a time."""
    codes: list[StatusCode] = []

    async def client() -> None:
        channel = fleet.channel()
        for _ in range(total // concurrency):
            codes.append(await call(fleet, body(model, 1), channel=channel))

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(client)
    return codes


def served(fleet: Fleet, model: str) -> list[int]:
    return [w.service.device.counters[model].requests_served for w in fleet.workers]


def scheduler(fleet: Fleet) -> LeastOutstandingScheduler:
    found = fleet.gateway._service.scheduler
    assert isinstance(found, LeastOutstandingScheduler)
    return found


def loads(fleet: Fleet) -> Mapping[str, float]:
    return scheduler(fleet).loads()


def inflight_work(fleet: Fleet) -> dict[str, float]:
    """`gateway_worker_inflight_work` as the gateway's registry renders it, by label set."""
    text = fleet.gateway._service.metrics.render().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("gateway_worker_inflight_work{"):
            labels, value = line.rsplit(" ", 1)
            found[labels[len("gateway_worker_inflight_work") :]] = float(value)
    return found


@pytest.mark.parametrize(
    ("mode", "check"),
    [(SchedulingMode.LEAST_OUTSTANDING, "skewed"), (SchedulingMode.ROUND_ROBIN, "even")],
)
async def test_slow_replica_attracts_less_work(
    mode: SchedulingMode, check: str, autojump_clock: MockClock
) -> None:
    catalogue = catalogue_from_yaml(MODELS)
    async with open_fleet(
        2,
        memory=True,
        catalogues=[catalogue, catalogue],
        worker_overrides=[{"time_scale": 1.0}, {"time_scale": 3.0}],
        scheduling=scheduling(WorkBasis.COMPUTE, mode),
        health_interval_seconds=60,
    ) as fleet:
        codes = await run_load(fleet, "work", 304, 8)
        assert codes == [StatusCode.OK] * 304
        fast, slow = served(fleet, "work")
        assert fast + slow == 304
        if check == "skewed":
            # Three times slower, so ideally a quarter of the work (about 228:76 here).
            assert fast >= 2.5 * slow, (fast, slow)
            assert all(value == 0.0 for value in loads(fleet).values())
        else:
            assert fast == slow == 152, (fast, slow)


@pytest.mark.parametrize(
    ("basis", "model", "rows", "expected"),
    [
        (WorkBasis.ITEMS, "held", 32, 32.0),
        (WorkBasis.REQUESTS, "held", 32, 1.0),
        (WorkBasis.COMPUTE, "held", 32, None),  # 32 x the model's item cost (> 0)
        (WorkBasis.ITEMS, "fixed", 1, 1.0),  # no batch axis: one item per request
    ],
)
async def test_pre_batched_request_is_weighed_by_its_basis(
    basis: WorkBasis,
    model: str,
    rows: int,
    expected: float | None,
    autojump_clock: MockClock,
) -> None:
    catalogue = catalogue_from_yaml(MODELS)
    async with open_fleet(
        1,
        memory=True,
        catalogues=[catalogue],
        scheduling=scheduling(basis),
        health_interval_seconds=60,
    ) as fleet:
        label = f'{{basis="{basis}",worker="worker0"}}'
        codes: list[StatusCode] = []

        async def send() -> None:
            codes.append(await call(fleet, body(model, rows)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await wait_until_async(lambda: any(loads(fleet).values()), what="a held request")
            seen = inflight_work(fleet)[label]
        assert codes == [StatusCode.OK]
        if expected is None:
            assert seen > 0
            # compute = 32 items x the fleet's cost per item (cold: the fleet mean, else 1)
            assert seen == pytest.approx(32 * loads_item_cost(fleet, model))
        else:
            assert seen == expected
        assert inflight_work(fleet)[label] == 0.0


def loads_item_cost(fleet: Fleet, model: str) -> float:
    return scheduler(fleet)._meta.item_cost(model)


async def test_meta_counts_one_item(autojump_clock: MockClock) -> None:
    async with open_fleet(
        1,
        memory=True,
        worker_overrides={"time_scale": 200.0},
        scheduling=scheduling(WorkBasis.ITEMS),
        health_interval_seconds=60,
    ) as fleet:
        request = infer_request(
            "search_pipeline", {"query_ids": np.zeros((4, 32), dtype=np.int64)}
        ).SerializeToString()
        codes: list[StatusCode] = []

        async def send() -> None:
            codes.append(await call(fleet, request))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await wait_until_async(lambda: any(loads(fleet).values()), what="a held request")
            assert dict(loads(fleet)) == {fleet.worker_url(0): 1.0}
        assert codes == [StatusCode.OK]
        assert set(loads(fleet).values()) == {0.0}


async def test_every_counter_settles_to_zero_after_failures_and_cancels(
    autojump_clock: MockClock,
) -> None:
    catalogue = catalogue_from_yaml(MODELS)
    async with open_fleet(
        2,
        memory=True,
        catalogues=[catalogue, catalogue],
        worker_overrides=[{"max_concurrent_requests": 1}, {}],
        scheduling=scheduling(WorkBasis.COMPUTE),
        health_interval_seconds=60,
    ) as fleet:
        channel = fleet.channel()
        held: list[StatusCode] = []
        service = fleet.gateway._service

        async def hold() -> None:
            held.append(await call(fleet, body("held", 8), channel=channel))

        async with trio.open_nursery() as nursery:
            for _ in range(4):  # worker0 takes one at a time: sheds, failovers
                nursery.start_soon(hold)
            await wait_until_async(lambda: service.inflight == 4, what="four held calls")

            # A worker's INVALID_ARGUMENT.
            bad = infer_request("work", {"x": np.zeros((1, 3), dtype=np.float32)})
            with pytest.raises(GrpcError) as caught:
                await channel.unary(Method.MODEL_INFER.wire, bad.SerializeToString())
            assert caught.value.code is StatusCode.INVALID_ARGUMENT

            # A client cancellation, once the call holds a charge at the gateway.
            cancelled = trio.CancelScope()
            nursery.start_soon(cancelled_call, fleet, channel, cancelled)
            await wait_until_async(lambda: service.inflight == 5, what="the cancelled call")
            cancelled.cancel()
            await wait_until_async(lambda: service.inflight == 4, what="the cancel to land")

            # A client deadline, long before the 400 ms batch ends.
            short = await call(
                fleet, body("held", 8), channel=channel, deadline=trio.current_time() + 0.05
            )
            assert short is StatusCode.DEADLINE_EXCEEDED
        assert held == [StatusCode.OK] * 4
        await wait_until_async(
            lambda: all(value == 0.0 for value in loads(fleet).values()), what="settling"
        )
        assert fleet.gateway.statistics().inflight == 0
        assert all(value == 0.0 for value in inflight_work(fleet).values())


async def cancelled_call(fleet: Fleet, channel: Channel, scope: trio.CancelScope) -> None:
    """A held call that `scope` cancels from outside (the caller gives up on it)."""
    with scope:
        code = await call(fleet, body("held", 8), channel=channel)
        raise AssertionError(f"the call ended ({code.name}) before it was cancelled")


@pytest.mark.parametrize(("basis", "polls"), [(WorkBasis.REQUESTS, False), (WorkBasis.ITEMS, True)])
async def test_only_work_bases_that_need_costs_poll_the_workers(
    basis: WorkBasis, polls: bool, autojump_clock: MockClock
) -> None:
    async with open_fleet(
        1, memory=True, scheduling=scheduling(basis), health_interval_seconds=60
    ) as fleet:
        assert (fleet.gateway._service.prober.on_ready is not None) is polls


async def test_round_robin_exports_no_inflight_work(autojump_clock: MockClock) -> None:
    async with open_fleet(1, memory=True, health_interval_seconds=60) as fleet:
        assert inflight_work(fleet) == {}
