"""The device's queues: model choice, batch plans, expiry, withdrawal."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from rsgw.worker._batching import Pending, RequestQueues


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
