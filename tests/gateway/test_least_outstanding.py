"""least_outstanding with work_basis, end to end (issue 7, items 3-5)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping

import grpc
import httpx
import numpy as np
import pytest
import trio

from rsgw.scheduling._knobs import SchedulingMode, WorkBasis
from rsgw.scheduling._schedulers import LeastOutstandingScheduler
from rsgw.scheduling._settings import SchedulingConfig
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import MODEL_INFER, catalogue_from_yaml, infer_request, wait_until_async

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


def run_load(target: str, model: str, total: int, concurrency: int) -> list[grpc.StatusCode]:
    codes: list[grpc.StatusCode] = []
    lock = threading.Lock()
    per_thread = total // concurrency

    def client() -> None:
        with grpc.insecure_channel(target) as channel:
            call = channel.unary_unary(MODEL_INFER)
            for _ in range(per_thread):
                try:
                    call(body(model, 1), timeout=30)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as exc:
                    code = exc.code()
                with lock:
                    codes.append(code)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return codes


def served(fleet: Fleet, model: str) -> list[int]:
    return [w.service.device.counters[model].requests_served for w in fleet.workers]


def loads(fleet: Fleet) -> Mapping[str, float]:
    scheduler = fleet.gateway._service.scheduler
    assert isinstance(scheduler, LeastOutstandingScheduler)
    return scheduler.loads()


async def inflight_work(fleet: Fleet) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{fleet.gateway.admin_port}/metrics")).text
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
async def test_slow_replica_attracts_less_work(mode: SchedulingMode, check: str) -> None:
    catalogue = catalogue_from_yaml(MODELS)
    async with open_fleet(
        2,
        catalogues=[catalogue, catalogue],
        worker_overrides=[{"time_scale": 1.0}, {"time_scale": 3.0}],
        scheduling=scheduling(WorkBasis.COMPUTE, mode),
        health_interval_seconds=60,
    ) as fleet:
        codes = await trio.to_thread.run_sync(run_load, fleet.target, "work", 304, 8)
        assert set(codes) == {grpc.StatusCode.OK}
        fast, slow = served(fleet, "work")
        assert fast + slow == 304
        if check == "skewed":
            assert fast >= 1.5 * slow, (fast, slow)
            assert all(value == 0.0 for value in loads(fleet).values())
        else:
            assert abs(fast - slow) <= 1, (fast, slow)


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
    basis: WorkBasis, model: str, rows: int, expected: float | None
) -> None:
    catalogue = catalogue_from_yaml(MODELS)
    async with open_fleet(
        1, catalogues=[catalogue], scheduling=scheduling(basis), health_interval_seconds=60
    ) as fleet:
        label = f'{{basis="{basis}",worker="worker0"}}'
        future_done = trio.Event()

        def send() -> None:
            try:
                call = grpc.insecure_channel(fleet.target).unary_unary(MODEL_INFER)
                call(body(model, rows), timeout=30)
            finally:
                trio.from_thread.run_sync(future_done.set)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, send)
            await wait_until_async(lambda: any(loads(fleet).values()), what="a held request")
            seen = (await inflight_work(fleet))[label]
            await future_done.wait()
        if expected is None:
            assert seen > 0
            # compute = 32 items x the fleet's cost per item (cold: the fleet mean, else 1)
            assert seen == pytest.approx(32 * loads_item_cost(fleet, model))
        else:
            assert seen == expected
        assert (await inflight_work(fleet))[label] == 0.0


def loads_item_cost(fleet: Fleet, model: str) -> float:
    scheduler = fleet.gateway._service.scheduler
    assert isinstance(scheduler, LeastOutstandingScheduler)
    return scheduler._meta.item_cost(model)


async def test_meta_counts_one_item() -> None:
    async with open_fleet(
        1,
        worker_overrides={"time_scale": 200.0},
        scheduling=scheduling(WorkBasis.ITEMS),
        health_interval_seconds=60,
    ) as fleet:
        request = infer_request(
            "search_pipeline", {"query_ids": np.zeros((4, 32), dtype=np.int64)}
        ).SerializeToString()
        done = trio.Event()

        def send() -> None:
            try:
                grpc.insecure_channel(fleet.target).unary_unary(MODEL_INFER)(request, timeout=30)
            finally:
                trio.from_thread.run_sync(done.set)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, send)
            await wait_until_async(lambda: any(loads(fleet).values()), what="a held request")
            assert dict(loads(fleet)) == {f"127.0.0.1:{fleet.workers[0].grpc_port}": 1.0}
            await done.wait()
        assert set(loads(fleet).values()) == {0.0}


async def test_every_counter_settles_to_zero_after_failures_and_cancels() -> None:
    catalogue = catalogue_from_yaml(MODELS)
    async with open_fleet(
        2,
        catalogues=[catalogue, catalogue],
        worker_overrides=[{"max_concurrent_requests": 1}, {}],
        scheduling=scheduling(WorkBasis.COMPUTE),
        health_interval_seconds=60,
    ) as fleet:

        def mixed() -> None:
            with grpc.insecure_channel(fleet.target) as channel:
                call = channel.unary_unary(MODEL_INFER)
                held = [
                    call.future(body("held", 8), timeout=30) for _ in range(4)
                ]  # sheds, failovers
                bad = infer_request("work", {"x": np.zeros((1, 3), dtype=np.float32)})
                try:
                    call(bad.SerializeToString(), timeout=30)  # a worker's INVALID_ARGUMENT
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                cancelled = call.future(body("held", 8), timeout=30)
                cancelled.cancel()  # a client cancellation
                short = call.future(body("held", 8), timeout=0.05)  # a client deadline
                for future in [*held, short]:
                    with contextlib.suppress(grpc.RpcError):
                        future.result()

        await trio.to_thread.run_sync(mixed)
        await wait_until_async(
            lambda: all(value == 0.0 for value in loads(fleet).values()), what="settling"
        )
        assert all(value == 0.0 for value in (await inflight_work(fleet)).values())


@pytest.mark.parametrize(("basis", "polls"), [(WorkBasis.REQUESTS, False), (WorkBasis.ITEMS, True)])
async def test_only_work_bases_that_need_costs_poll_the_workers(
    basis: WorkBasis, polls: bool
) -> None:
    async with open_fleet(1, scheduling=scheduling(basis), health_interval_seconds=60) as fleet:
        assert (fleet.gateway._service.prober.on_ready is not None) is polls


async def test_round_robin_exports_no_inflight_work() -> None:
    async with open_fleet(1, health_interval_seconds=60) as fleet:
        assert await inflight_work(fleet) == {}
