"""The device's queues: model choice under each discipline, batch plans, expiry, withdrawal."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.worker.device._batching import BatchPolicy, Discipline, Pending, RequestQueues


def req(
    model: str, t: float, rows: int = 1, variant: str = "v", deadline: float = math.inf
) -> Pending[str]:
    return Pending(model, rows, variant, t, deadline, payload=f"{model}@{t}")


def test_fifo_picks_the_model_with_the_oldest_request() -> None:
    queues: RequestQueues[str] = RequestQueues()
    queues.enqueue(req("b", 1.0))
    queues.enqueue(req("a", 2.0))
    queues.enqueue(req("b", 3.0))
    batch = queues.next_batch({"a": 8, "b": 8}, now=10)
    assert batch is not None
    assert batch.model == "b"
    assert [p.enqueued_at for p in batch.requests] == [1.0, 3.0]
    batch = queues.next_batch({"a": 8, "b": 8}, now=10)
    assert batch is not None and batch.model == "a"
    assert queues.next_batch({"a": 8, "b": 8}, now=10) is None


def test_equal_times_break_ties_by_arrival_order() -> None:
    queues: RequestQueues[str] = RequestQueues()
    queues.enqueue(req("z", 1.0))
    queues.enqueue(req("a", 1.0))
    batch = queues.next_batch({}, now=2)
    assert batch is not None and batch.model == "z"


def test_rows_fill_up_to_the_max_batch() -> None:
    queues: RequestQueues[str] = RequestQueues()
    for t, rows in enumerate([4, 4, 4, 8]):
        queues.enqueue(req("m", t, rows))
    batch = queues.next_batch({"m": 12}, now=10)
    assert batch is not None and batch.rows == 12 and len(batch.requests) == 3
    batch = queues.next_batch({"m": 12}, now=10)
    assert batch is not None and batch.rows == 8


def test_oversized_front_request_runs_alone() -> None:
    queues: RequestQueues[str] = RequestQueues()
    queues.enqueue(req("m", 0, rows=40))
    queues.enqueue(req("m", 1, rows=1))
    batch = queues.next_batch({"m": 16}, now=10)
    assert batch is not None and batch.rows == 40 and len(batch.requests) == 1


def test_unbatched_model_takes_one_request() -> None:
    queues: RequestQueues[str] = RequestQueues()
    queues.enqueue(req("m", 0))
    queues.enqueue(req("m", 1))
    batch = queues.next_batch({"m": 0}, now=10)
    assert batch is not None and len(batch.requests) == 1


def test_only_the_front_variant_coalesces() -> None:
    queues: RequestQueues[str] = RequestQueues()
    queues.enqueue(req("m", 0, variant="short"))
    queues.enqueue(req("m", 1, variant="short"))
    queues.enqueue(req("m", 2, variant="long"))
    queues.enqueue(req("m", 3, variant="short"))
    batch = queues.next_batch({"m": 8}, now=10)
    assert batch is not None and [p.enqueued_at for p in batch.requests] == [0, 1]


def test_expired_requests_are_dropped_before_planning() -> None:
    queues: RequestQueues[str] = RequestQueues()
    queues.enqueue(req("m", 0, deadline=5))
    queues.enqueue(req("m", 1, deadline=50))
    batch = queues.next_batch({"m": 8}, now=10)
    assert batch is not None
    assert [p.enqueued_at for p in batch.expired] == [0]
    assert [p.enqueued_at for p in batch.requests] == [1]


def test_all_expired_still_reports_them() -> None:
    queues: RequestQueues[str] = RequestQueues()
    queues.enqueue(req("m", 0, deadline=5))
    batch = queues.next_batch({"m": 8}, now=10)
    assert batch is not None and batch.requests == () and len(batch.expired) == 1
    assert queues.next_batch({"m": 8}, now=10) is None


def test_withdrawn_requests_never_run() -> None:
    queues: RequestQueues[str] = RequestQueues()
    first, second = req("m", 0), req("m", 1)
    queues.enqueue(first)
    queues.enqueue(second)
    assert queues.withdraw(first)
    assert not queues.withdraw(first)
    assert len(queues) == 1 and queues.depth("m") == 1
    batch = queues.next_batch({"m": 8}, now=10)
    assert batch is not None and batch.requests == (second,)
    assert not queues.withdraw(second)  # already taken
    assert len(queues) == 0


def test_drain_returns_what_is_queued() -> None:
    queues: RequestQueues[str] = RequestQueues()
    kept, gone = req("a", 0), req("b", 1)
    queues.enqueue(kept)
    queues.enqueue(gone)
    queues.withdraw(gone)
    assert list(queues.drain()) == [kept]
    assert queues.next_batch({}, now=0) is None


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.integers(1, 20),
            st.sampled_from(["x", "y"]),
            st.booleans(),
            st.booleans(),
        ),
        max_size=60,
    ),
    st.dictionaries(st.sampled_from("abc"), st.integers(0, 32)),
)
def test_every_request_leaves_exactly_once(
    specs: list[tuple[str, int, str, bool, bool]], caps: dict[str, int]
) -> None:
    queues: RequestQueues[str] = RequestQueues()
    everything = []
    withdrawn = set()
    for t, (model, rows, variant, expired, withdraw) in enumerate(specs):
        p = req(model, float(t), rows, variant, deadline=1.0 if expired else math.inf)
        queues.enqueue(p)
        everything.append(p)
        if withdraw:
            queues.withdraw(p)
            withdrawn.add(id(p))
    seen: list[int] = []
    while (batch := queues.next_batch(caps, now=2.0)) is not None:
        seen.extend(id(p) for p in batch.expired)
        seen.extend(id(p) for p in batch.requests)
        assert all(p.deadline > 2.0 for p in batch.requests)
        if batch.requests:
            cap = caps.get(batch.model, 0)
            assert len({p.variant for p in batch.requests}) == 1
            assert len(batch.requests) == 1 or (cap > 0 and batch.rows <= cap)
            times = [p.enqueued_at for p in batch.requests]
            assert times == sorted(times)
    assert len(seen) == len(set(seen))
    assert set(seen) == {id(p) for p in everything} - withdrawn
    assert len(queues) == 0


# ---------------------------------------------------------------------------
# edf


def test_edf_picks_the_model_with_the_sooner_deadline() -> None:
    queues: RequestQueues[str] = RequestQueues(Discipline.EDF)
    queues.enqueue(req("late", 1.0, deadline=100))
    queues.enqueue(req("soon", 2.0, deadline=50))
    queues.enqueue(req("never", 0.5))
    order = []
    while (batch := queues.next_batch({}, now=10)) is not None:
        order.append(batch.model)
    assert order == ["soon", "late", "never"]


def test_edf_looks_past_the_front_request() -> None:
    queues: RequestQueues[str] = RequestQueues(Discipline.EDF)
    queues.enqueue(req("a", 1.0, deadline=100))
    queues.enqueue(req("b", 2.0, deadline=90))
    queues.enqueue(req("a", 3.0, deadline=20))  # a's most urgent request is behind its front
    batch = queues.next_batch({"a": 8, "b": 8}, now=10)
    assert batch is not None and batch.model == "a" and len(batch.requests) == 2


def test_edf_with_uniform_deadlines_is_fifo() -> None:
    fifo: RequestQueues[str] = RequestQueues(Discipline.FIFO)
    edf: RequestQueues[str] = RequestQueues(Discipline.EDF)
    for t, model in enumerate("bacab"):
        fifo.enqueue(req(model, float(t), deadline=99))
        edf.enqueue(req(model, float(t), deadline=99))
    for _ in range(5):
        a, b = fifo.next_batch({}, now=0), edf.next_batch({}, now=0)
        assert a is not None and b is not None
        assert (a.model, [p.enqueued_at for p in a.requests]) == (
            b.model,
            [p.enqueued_at for p in b.requests],
        )


def test_edf_drops_requests_that_cannot_finish_within_the_learned_cost() -> None:
    queues: RequestQueues[str] = RequestQueues(Discipline.EDF)
    queues.record("m", rows=2, seconds=5.0, now=0)
    queues.enqueue(req("m", 1.0, deadline=13))  # 10 + 5 > 13: cannot make it
    queues.enqueue(req("m", 2.0, deadline=16))
    batch = queues.next_batch({"m": 8}, now=10)
    assert batch is not None
    assert [p.enqueued_at for p in batch.expired] == [1.0]
    assert [p.enqueued_at for p in batch.requests] == [2.0]


def test_edf_drops_nothing_before_a_cost_is_learned() -> None:
    queues: RequestQueues[str] = RequestQueues(Discipline.EDF)
    queues.enqueue(req("m", 1.0, deadline=10.001))
    batch = queues.next_batch({"m": 8}, now=10)
    assert batch is not None and len(batch.requests) == 1 and batch.expired == ()


def test_fifo_never_drops_by_laxity() -> None:
    queues: RequestQueues[str] = RequestQueues(Discipline.FIFO)
    queues.record("m", rows=1, seconds=5.0, now=0)
    queues.enqueue(req("m", 1.0, deadline=11))
    batch = queues.next_batch({"m": 8}, now=10)
    assert batch is not None and len(batch.requests) == 1


# ---------------------------------------------------------------------------
# fair


def _run_fair(
    queues: RequestQueues[str], cost: dict[str, float], dispatches: int
) -> dict[str, float]:
    """Keep every model backlogged; dispatch `dispatches` times on a simulated clock."""
    used = dict.fromkeys(cost, 0.0)
    now = 0.0
    for model in cost:
        for _ in range(4):
            queues.enqueue(req(model, now))
    for _ in range(dispatches):
        batch = queues.next_batch({}, now)
        assert batch is not None
        now += cost[batch.model]
        queues.record(batch.model, batch.rows, cost[batch.model], now)
        used[batch.model] += cost[batch.model]
        queues.enqueue(req(batch.model, now))
    return used


def test_fair_splits_compute_by_weight() -> None:
    queues: RequestQueues[str] = RequestQueues(Discipline.FAIR)
    queues.fair.set_weight("a", 3.0)
    used = _run_fair(queues, {"a": 0.01, "b": 0.01}, dispatches=400)
    assert used["a"] / (used["a"] + used["b"]) == pytest.approx(0.75, abs=0.01)


def test_fair_splits_compute_not_dispatches() -> None:
    queues: RequestQueues[str] = RequestQueues(Discipline.FAIR)
    used = _run_fair(queues, {"cheap": 0.002, "dear": 0.02}, dispatches=1000)
    assert used["cheap"] / (used["cheap"] + used["dear"]) == pytest.approx(0.5, abs=0.02)


def test_fair_ties_go_to_the_oldest_request() -> None:
    queues: RequestQueues[str] = RequestQueues(Discipline.FAIR)
    queues.enqueue(req("z", 1.0))
    queues.enqueue(req("a", 2.0))
    batch = queues.next_batch({}, now=3)
    assert batch is not None and batch.model == "z"


def test_fair_clears_a_model_holding_only_expired_requests() -> None:
    queues: RequestQueues[str] = RequestQueues(Discipline.FAIR)
    queues.enqueue(req("gone", 1.0, deadline=2))
    queues.enqueue(req("live", 3.0))
    batch = queues.next_batch({}, now=5)
    assert batch is not None and batch.model == "live"
    assert [p.model for p in batch.expired] == ["gone"]


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.integers(1, 8),
            st.sampled_from([1.0, 3.0, 6.0, math.inf]),
            st.booleans(),
        ),
        max_size=40,
    ),
    st.sampled_from(list(Discipline)),
)
def test_every_discipline_serves_each_request_exactly_once(
    specs: list[tuple[str, int, float, bool]], discipline: Discipline
) -> None:
    queues: RequestQueues[str] = RequestQueues(discipline)
    queues.record("a", 4, 1.5, now=0)
    everything = []
    for t, (model, rows, deadline, withdraw) in enumerate(specs):
        p = req(model, float(t), rows, deadline=deadline)
        queues.enqueue(p)
        if withdraw:
            queues.withdraw(p)
        else:
            everything.append(p)
    seen: list[int] = []
    now = 2.0
    while (batch := queues.next_batch({"a": 8, "b": 4, "c": 0}, now)) is not None:
        seen.extend(id(p) for p in (*batch.expired, *batch.requests))
        assert all(p.deadline > now for p in batch.requests)
        now += 0.5
    assert sorted(seen) == sorted(id(p) for p in everything)


# -- dynamic batching (Triton's max_queue_delay / preferred_batch_size) --------------------


def test_a_held_model_waits_for_its_delay_then_takes_what_is_there() -> None:
    queues: RequestQueues[str] = RequestQueues()
    policies = {"m": BatchPolicy(max_queue_delay=0.010)}
    queues.enqueue(req("m", 0.000))
    queues.enqueue(req("m", 0.004))
    assert queues.next_batch({"m": 8}, now=0.005, policies=policies) is None
    assert queues.wake_at(policies) == pytest.approx(0.010)
    batch = queues.next_batch({"m": 8}, now=0.010, policies=policies)
    assert batch is not None and batch.rows == 2
    assert queues.wake_at(policies) == math.inf


def test_woken_at_wake_at_the_held_batch_leaves_whatever_the_rounding() -> None:
    """`wake_at` is the sum enqueued + delay; `(a + d) - a` can round below `d` (here by
    one ulp), and a caller woken at that instant must find the delay over, or a virtual
    clock (rsgw simulate, the capacity search) would be woken at it forever."""
    enqueued, delay = 25.50690257394217, 0.022
    assert (enqueued + delay) - enqueued < delay
    queues: RequestQueues[str] = RequestQueues()
    policies = {"m": BatchPolicy(max_queue_delay=delay)}
    queues.enqueue(req("m", enqueued))
    batch = queues.next_batch({"m": 8}, now=queues.wake_at(policies), policies=policies)
    assert batch is not None and batch.rows == 1


def test_a_full_batch_leaves_at_once() -> None:
    queues: RequestQueues[str] = RequestQueues()
    policies = {"m": BatchPolicy(max_queue_delay=1.0)}
    for t in range(10):
        queues.enqueue(req("m", t * 0.001))
    batch = queues.next_batch({"m": 8}, now=0.01, policies=policies)
    assert batch is not None and batch.rows == 8
    assert queues.next_batch({"m": 8}, now=0.01, policies=policies) is None  # 2 left: wait


def test_the_largest_preferred_size_formed_leaves_at_once() -> None:
    queues: RequestQueues[str] = RequestQueues()
    policies = {"m": BatchPolicy(max_queue_delay=1.0, preferred_batch_size=(2, 4))}
    for t in range(5):
        queues.enqueue(req("m", t * 0.001))
    batch = queues.next_batch({"m": 8}, now=0.01, policies=policies)
    assert batch is not None and batch.rows == 4
    assert queues.next_batch({"m": 8}, now=0.01, policies=policies) is None  # 1 < 2: wait


def test_eager_models_are_not_held_behind_a_waiting_one() -> None:
    queues: RequestQueues[str] = RequestQueues()
    policies = {"held": BatchPolicy(max_queue_delay=1.0)}
    queues.enqueue(req("held", 0.0))
    queues.enqueue(req("eager", 0.5))
    batch = queues.next_batch({"held": 8, "eager": 8}, now=0.6, policies=policies)
    assert batch is not None and batch.model == "eager"


@given(
    arrivals=st.lists(
        st.tuples(st.sampled_from("abc"), st.floats(0, 1), st.integers(1, 4)), max_size=20
    ),
    delays=st.fixed_dictionaries({m: st.sampled_from([0.0, 0.01, 0.1]) for m in "abc"}),
    preferred=st.sampled_from([(), (2,), (3, 6)]),
    now=st.floats(0, 1.2),
)
def test_nothing_ready_is_held_and_nothing_waits_past_its_delay(
    arrivals: list[tuple[str, float, int]],
    delays: dict[str, float],
    preferred: tuple[int, ...],
    now: float,
) -> None:
    caps = {"a": 8, "b": 6, "c": 1}
    policies = {m: BatchPolicy(d, preferred if d else ()) for m, d in delays.items()}
    queues: RequestQueues[str] = RequestQueues()
    for model, t, rows in sorted(arrivals, key=lambda a: a[1]):
        if t <= now:
            queues.enqueue(req(model, t, rows))
    while (batch := queues.next_batch(caps, now, policies)) is not None:
        assert batch.rows <= max(caps[batch.model], batch.requests[0].rows)
    # Nothing left is ready: its delay has not run out, and wake_at says when it will.
    assert queues.wake_at(policies) > now or len(queues) == 0
    for model in "abc":
        if queues.depth(model):
            assert delays[model] > 0
