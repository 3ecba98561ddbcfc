"""Routing table construction and round-robin fairness across swaps."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.calls._routing import (
    RoundRobin,
    RoutingTable,
    build_routing_table,
    is_ready_state,
)

W = ["w0:1", "w1:1", "w2:1"]


def test_table_follows_worker_order_and_skips_silent_workers() -> None:
    table = build_routing_table({"w2:1": ["b", "a"], "w0:1": ["a"]}, W, generation=3)
    assert table.replicas("a") == ("w0:1", "w2:1")
    assert table.replicas("b") == ("w2:1",)
    assert table.replicas("c") == ()
    assert len(table) == 2 and table.generation == 3
    assert list(table.models) == ["a", "b"]


@pytest.mark.parametrize(
    ("state", "ready"),
    [
        ("READY", True),  # Triton, rsgw's worker
        ("State.READY", True),  # MLServer 1.7 (its enum's str)
        ("ready", True),
        ("UNAVAILABLE", False),
        ("State.UNAVAILABLE", False),
        ("NOT_READY", False),
        ("UNREADY", False),
        ("", False),
    ],
)
def test_ready_states_in_the_spellings_servers_use(state: str, ready: bool) -> None:
    assert is_ready_state(state) is ready


def test_empty_table() -> None:
    assert len(RoutingTable()) == 0
    assert RoutingTable().replicas("x") == ()


def test_round_robin_rotates_and_lists_failover_order() -> None:
    rr = RoundRobin()
    replicas = tuple(W)
    picks = [rr.select("m", replicas) for _ in range(4)]
    assert picks[0] == ("w0:1", "w1:1", "w2:1")
    assert picks[1] == ("w1:1", "w2:1", "w0:1")
    assert picks[2] == ("w2:1", "w0:1", "w1:1")
    assert picks[3] == picks[0]


def test_single_replica_always_goes_there() -> None:
    rr = RoundRobin()
    assert all(rr.select("m", ("w1:1",)) == ("w1:1",) for _ in range(5))


def test_cursor_survives_an_unchanged_swap_and_resets_on_change() -> None:
    rr = RoundRobin()
    replicas = tuple(W)
    rr.select("m", replicas)
    table = build_routing_table({u: ["m"] for u in W}, W, 2)
    rr.forget_missing(table)
    assert rr.select("m", table.replicas("m"))[0] == "w1:1"  # continued, not restarted
    assert rr.select("m", ("w0:1", "w2:1"))[0] == "w0:1"  # a changed list starts over
    rr.forget_missing(RoutingTable())
    assert rr._cursors == {}


@given(st.integers(1, 6), st.integers(1, 200), st.integers(0, 5))
def test_round_robin_counts_differ_by_at_most_one(workers: int, calls: int, swaps: int) -> None:
    rr = RoundRobin()
    replicas = tuple(f"w{i}:1" for i in range(workers))
    counts: Counter[str] = Counter()
    for i in range(calls):
        if swaps and i % max(1, calls // swaps) == 0:
            rr.forget_missing(build_routing_table({u: ["m"] for u in replicas}, replicas, i))
        counts[rr.select("m", replicas)[0]] += 1
    values = [counts[u] for u in replicas]
    assert max(values) - min(values) <= 1
