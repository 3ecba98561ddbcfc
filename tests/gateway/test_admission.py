"""The admission queue at the inbound cap: who waits, who is refused, who gets a freed slot."""

from __future__ import annotations

import math

import pytest
import trio
from trio.testing import MockClock

from rsgw.gateway.calls import _admission
from rsgw.gateway.calls._admission import MAX_QUEUE_FACTOR, AdmissionQueue
from rsgw.scheduling.calls._forecast import wait_for_slot


def test_the_wait_for_a_slot_is_the_queue_times_how_often_a_slot_frees() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(cap=4)
    queue.service_seconds = 0.4  # a slot frees every 0.1 s
    # The first in line waits one slot's turn, then the slot's time but its own 0.4 s.
    assert wait_for_slot(queue.waiting, queue.cap, queue.service_seconds, 0.4) == pytest.approx(0.1)
    # When a call holds its slot 0.4 s but serving it takes 0.1, it waited 0.3 at the worker.
    assert wait_for_slot(0, 4, 0.4, 0.1) == pytest.approx(0.1 + 0.3)
    assert not queue.full
    assert AdmissionQueue[str](cap=0).full  # uncapped never queues


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


async def test_waiters_that_give_up_are_skipped_in_order(autojump_clock: MockClock) -> None:
    """Many waiters, every third gives up at its own deadline: `waiting` counts only
    the others, and freed slots go to them in arrival order, none to one that left."""
    queue: AdmissionQueue[int] = AdmissionQueue(cap=4)
    got: list[tuple[int, int]] = []
    given_back: list[int] = []

    async def wait(index: int) -> None:
        with trio.move_on_after(1 if index % 3 == 0 else math.inf):
            got.append((await queue.wait_turn(given_back.append), index))

    async with trio.open_nursery() as nursery:
        for index in range(300):
            nursery.start_soon(wait, index)
            await trio.testing.wait_all_tasks_blocked()
        assert queue.waiting == 300
        await trio.sleep(2)  # the impatient third gave up
        staying = [index for index in range(300) if index % 3]
        assert queue.waiting == len(staying)
        tickets = iter(range(1000))
        admitted = 0

        def admit() -> int:
            nonlocal admitted
            admitted += 1
            return next(tickets)

        for _ in range(len(staying) + 5):  # more slots than waiters: the rest stay free
            queue.hand_over(admit)
            await trio.testing.wait_all_tasks_blocked()
    assert got == list(enumerate(staying))
    assert admitted == len(staying), "no slot is taken for a waiter that left"
    assert queue.waiting == 0 and given_back == []


async def test_a_slot_handed_to_a_waiter_that_just_gave_up_goes_back(
    autojump_clock: MockClock,
) -> None:
    """Cancelled, then granted before it ran: the slot goes back, the next one waits on."""
    queue: AdmissionQueue[str] = AdmissionQueue(cap=1)
    given_back: list[str] = []
    got: list[str] = []

    async def wait(*, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            got.append(await queue.wait_turn(given_back.append))

    async with trio.open_nursery() as nursery:
        first = await nursery.start(wait)
        await nursery.start(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert queue.waiting == 2
        first.cancel()
        queue.hand_over(lambda: "t1")  # the first, before it has seen its cancellation
        await trio.testing.wait_all_tasks_blocked()
        assert given_back == ["t1"] and got == []
        assert queue.waiting == 1
        queue.hand_over(lambda: "t2")
    assert got == ["t2"] and queue.waiting == 0


async def test_only_waiters_still_waiting_fill_the_queue(autojump_clock: MockClock) -> None:
    """The queue's length limit (and its wait estimate) count the waiters that stay."""
    queue: AdmissionQueue[str] = AdmissionQueue(cap=1)
    queue.service_seconds = 0.0

    async def wait(seconds: float) -> None:
        with trio.move_on_after(seconds):
            await queue.wait_turn(lambda ticket: None)

    async with trio.open_nursery() as nursery:
        for index in range(MAX_QUEUE_FACTOR):
            nursery.start_soon(wait, 1.0 if index < 10 else math.inf)
        await trio.testing.wait_all_tasks_blocked()
        assert queue.full
        await trio.sleep(2)
        assert queue.waiting == MAX_QUEUE_FACTOR - 10
        assert not queue.full
        nursery.cancel_scope.cancel()
    assert queue.waiting == 0


async def test_waiters_that_gave_up_do_not_pile_up(autojump_clock: MockClock) -> None:
    """With no slot freed for a long while, waiters that give up are not kept."""
    queue: AdmissionQueue[str] = AdmissionQueue(cap=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.wait_turn, lambda ticket: None)  # one stays throughout
        for _ in range(1000):
            with trio.move_on_after(1):
                await queue.wait_turn(lambda ticket: None)
        assert queue.waiting == 1
        assert len(queue._waiters) <= 4
        queue.hand_over(lambda: "t")


async def test_giving_up_does_not_search_the_queue(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving costs the same at any queue length (the queue holds up to 64 x cap):
    the waiter that leaves is compared with no other, where a search of the queue
    compares it with every waiter ahead of it."""
    compared = 0

    class Counted(_admission._Waiter[str]):
        __slots__ = ()

        def __eq__(self, other: object) -> bool:
            nonlocal compared
            compared += 1
            return self is other

        __hash__ = object.__hash__

    monkeypatch.setattr(_admission, "_Waiter", Counted)
    queue: AdmissionQueue[str] = AdmissionQueue(cap=4)

    async def wait(seconds: float) -> None:
        with trio.move_on_after(seconds):
            await queue.wait_turn(lambda ticket: None)

    async with trio.open_nursery() as nursery:
        for index in range(200):
            nursery.start_soon(wait, 1.0 if index >= 100 else math.inf)
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(2)  # the last hundred gave up
        assert queue.waiting == 100
        assert compared == 0
        nursery.cancel_scope.cancel()
