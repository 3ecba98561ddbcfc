"""The admission queue at the inbound cap: who waits, who is refused, who gets a freed slot."""

from __future__ import annotations

import math

import trio
from trio.testing import MockClock

from rsgw.gateway._admission import DEADLINE_MARGIN, AdmissionQueue


def test_a_wait_that_outlives_the_deadline_is_hopeless() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(cap=4)
    queue.service_seconds = 0.4  # a slot frees every 0.1 s
    assert not queue.hopeless(0.0, math.inf)
    assert not queue.hopeless(0.0, 0.1 + DEADLINE_MARGIN + 0.01)
    assert queue.hopeless(0.0, 0.1 + DEADLINE_MARGIN - 0.01)
    assert AdmissionQueue[str](cap=0).hopeless(0.0, math.inf)  # uncapped never queues


def test_the_estimate_follows_measured_service_times() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(cap=1)
    for _ in range(200):
        queue.observe(0.5)
    assert abs(queue.service_seconds - 0.5) < 0.01


async def test_freed_slots_go_to_waiters_in_order(autojump_clock: MockClock) -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(cap=1)
    got: list[str] = []
    given_back: list[str] = []

    async def wait(name: str) -> None:
        got.append(await queue.wait_turn(given_back.append) + ":" + name)

    async with trio.open_nursery() as nursery:
        for name in ("a", "b", "c"):
            nursery.start_soon(wait, name)
            await trio.testing.wait_all_tasks_blocked()
        assert queue.waiting == 3
        tickets = iter(["t1", "t2", "t3"])
        for _ in range(3):
            queue.hand_over(lambda: next(tickets))
            await trio.testing.wait_all_tasks_blocked()
    assert got == ["t1:a", "t2:b", "t3:c"]
    assert given_back == []


async def test_a_waiter_that_gives_up_leaves_the_queue(autojump_clock: MockClock) -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(cap=1)
    with trio.move_on_after(1):
        await queue.wait_turn(lambda ticket: None)
    assert queue.waiting == 0
    queue.hand_over(lambda: "unused")  # nobody waits: nothing is admitted
