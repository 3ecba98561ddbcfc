"""Deadline-aware admission under a device-bound overload (issue 38).

A real gateway in front of one real simulated worker whose device serves one call
at a time in 100 ms (capacity 10 calls/s), on memory streams under the autojump
clock: every party runs in this Trio run, so virtual time makes an overload of
many seconds deterministic and instant. An open-loop client offers 1.5x and 3x the
capacity, every call with a 2 s deadline. The gateway must keep the device busy
(goodput near capacity), answer what it admits within its queue limit, refuse the
rest at once (RESOURCE_EXHAUSTED in no time, not DEADLINE_EXCEEDED after 2 s), and
serve a call normally one second after the overload ends.
"""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.config._config import GrpcLimits
from rsgw.scheduling.calls._forecast import AdmissionRule, Forecast
from tests.gateway.fleet import open_fleet
from tests.gateway.test_gateway_limits import SLOW, simple_body
from tests.helpers import catalogue_from_yaml

SERVICE_S = 0.1
CAPACITY = 1 / SERVICE_S
DEADLINE_S = 2.0
SECONDS = 30.0


@pytest.mark.parametrize("load", [1.5, 3.0])
async def test_a_device_bound_overload_is_served_at_capacity_and_the_rest_refused_at_once(
    autojump_clock: MockClock, load: float
) -> None:
    catalogue = catalogue_from_yaml(SLOW.replace("launch_ms: 300", "launch_ms: 100"))
    async with open_fleet(
        1,
        memory=True,
        catalogues=[catalogue],
        grpc=GrpcLimits(max_concurrent_requests_per_worker=64, max_queue_seconds=1.0),
        health_interval_seconds=60,
    ) as fleet:
        ok: list[float] = []
        refused: list[float] = []
        late: list[float] = []

        async def one(seed: int) -> None:
            started = trio.current_time()
            try:
                await fleet.infer(simple_body(seed, "slow"), deadline=started + DEADLINE_S)
                ok.append(trio.current_time() - started)
            except GrpcError as exc:
                took = trio.current_time() - started
                if exc.code is StatusCode.RESOURCE_EXHAUSTED:
                    assert "not admitted" in exc.message
                    refused.append(took)
                else:
                    assert exc.code is StatusCode.DEADLINE_EXCEEDED, exc
                    late.append(took)

        gap = 1 / (load * CAPACITY)
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            seed = 0
            while trio.current_time() - start < SECONDS:
                nursery.start_soon(one, seed)
                seed += 1
                await trio.sleep(gap)
        offered = seed
        assert len(ok) + len(refused) + len(late) == offered

        goodput = len(ok) / SECONDS
        assert goodput >= 0.85 * CAPACITY, (goodput, len(refused), len(late))
        assert len(late) <= 0.01 * offered, late  # refused at arrival, not timed out
        ok.sort()
        p99 = ok[int(0.99 * (len(ok) - 1))]
        assert p99 <= 2 * SERVICE_S + 1.0, p99  # the service, and the queue allowed
        refused.sort()
        assert refused and refused[len(refused) // 2] < 0.01  # at arrival

        exposition = fleet.gateway._service.metrics.render().decode()
        by_reason = {
            line.split('"')[1]: float(line.rsplit(" ", 1)[1])
            for line in exposition.splitlines()
            if line.startswith("gateway_admission_refusals_total{")
        }
        assert by_reason["queue"] + by_reason["deadline"] == len(refused)
        assert 'gateway_worker_forecast_wait_seconds{worker="worker0"}' in exposition

        await trio.sleep(1.0)  # the overload is over: a second later, served as usual
        started = trio.current_time()
        await fleet.infer(simple_body(0, "slow"), deadline=started + DEADLINE_S)
        assert trio.current_time() - started <= 2 * SERVICE_S


def test_a_worker_is_forecast_from_its_busy_time_and_answers() -> None:
    forecast = Forecast()
    assert forecast.per_call("w") == 0.0 and forecast.typical() == 0.0
    # Ten calls sent at once at t=0 (held 1..10), answered one every 0.1 s, each as
    # foretold: 0.1 s a call.
    forecast.busy_from("w", 0.0)
    for k in range(10):
        forecast.answered("w", 0.1 * (k + 1), 10 - k, 0.1 * (k + 1), k + 1)
    assert forecast.per_call("w") == pytest.approx(0.1, rel=0.02)
    # Idle for a minute, then one call answered in 0.1 s: idle time is not busy time.
    forecast.busy_from("w", 60.0)
    forecast.answered("w", 60.1, 1, 0.1, 1)
    assert forecast.per_call("w") == pytest.approx(0.1, rel=0.02)
    # A batching worker: 20 calls answered together after 0.4 s cost 0.02 s each.
    for round_ in range(30):
        start = 100.0 + 0.4 * round_
        forecast.busy_from("b", start)
        for k in range(20):
            forecast.answered("b", start + 0.4, 20 - k, 0.4, 20 - k)
    per_call = forecast.per_call("b")
    # Drained, 0.02 s a call; but every one of these calls took the batch's 0.4 s,
    # where position x 0.02 s foretold less (up to 20 times less for the first
    # sent): the bias correction raises the forecast toward what the calls took.
    assert 0.02 < per_call < 0.2, per_call
    assert forecast.typical() == pytest.approx((per_call + forecast.per_call("w")) / 2)
    forecast.forget("w")
    assert forecast.per_call("w") == 0.0


def test_a_worker_loading_a_model_is_measured_afresh_after_the_load() -> None:
    # Issue 49: the gateway loads a model on w at t=10 (0.5 s of device time); the
    # calls queued behind the load are answered late, and say nothing of w's pace.
    forecast = Forecast()
    forecast.busy_from("w", 0.0)
    for k in range(10):
        forecast.answered("w", 0.01 * (k + 1), 10 - k, 0.01 * (k + 1), k + 1)
    assert forecast.per_call("w") == pytest.approx(0.01, rel=0.05)
    forecast.reset("w", 10.0)  # the load begins
    assert forecast.per_call("w") == 0.0  # unmeasured: no call refused for its queue
    forecast.reset("w", 10.5)  # and ends; the calls sent during it are answered late
    for k in range(4):
        forecast.answered("w", 10.5 + 0.01 * (k + 1), 4 - k, 0.5, k + 1)
    assert forecast.per_call("w") == 0.0
    forecast.busy_from("w", 11.0)  # a call sent after the load is measured
    forecast.answered("w", 11.01, 1, 0.01, 1)
    assert forecast.per_call("w") == pytest.approx(0.01, rel=0.05)


def test_the_rule_refuses_a_long_wait_and_a_late_finish() -> None:
    rule = AdmissionRule(max_queue_seconds=1.0, margin=0.25)
    assert rule.judge(0.5, 0.1, 5.0) is None
    queue = rule.judge(1.2, 0.1, 5.0)
    assert queue is not None and queue.reason == "queue"
    late = rule.judge(0.5, 0.1, 0.8)
    assert late is not None and late.reason == "deadline"
    assert AdmissionRule(0.0).judge(30.0, 0.1, float("inf")) is None  # no limit, no deadline
