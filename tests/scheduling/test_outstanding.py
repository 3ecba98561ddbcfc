"""least_outstanding: quantized choice, tie rotation, exact release, basis charges."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.calls._outstanding import (
    LeastOutstanding,
    Reservation,
    charge_for,
    load_key,
    settle,
)
from rsgw.scheduling.knobs._knobs import WorkBasis

W = ("w0:1", "w1:1", "w2:1")


def test_smallest_load_wins_and_others_follow_in_given_order() -> None:
    lo = LeastOutstanding(WorkBasis.ITEMS)
    order, r0 = lo.select("m", W, 5.0)
    assert order == W and r0.url == "w0:1"
    order, _ = lo.select("m", W, 1.0)
    assert order == ("w1:1", "w0:1", "w2:1")
    order, _ = lo.select("m", W, 2.0)
    assert order == ("w2:1", "w0:1", "w1:1")
    # Loads 5, 1, 2: w1 is least, whatever the rotation would say.
    order, _ = lo.select("m", W, 1.0)
    assert order[0] == "w1:1"
    assert lo.loads() == {"w0:1": 5.0, "w1:1": 2.0, "w2:1": 2.0}


def test_every_candidate_gets_a_counter() -> None:
    lo = LeastOutstanding(WorkBasis.REQUESTS)
    lo.select("m", W, 1.0)
    assert lo.loads() == {"w0:1": 1.0, "w1:1": 0.0, "w2:1": 0.0}


def test_comparison_is_quantized() -> None:
    lo = LeastOutstanding(WorkBasis.COMPUTE)
    _, first = lo.select("m", W[:2], 1e-10)  # under one quantum: a tie with 0
    order, _ = lo.select("m", W[:2], 1.0)
    assert order[0] == "w1:1"  # rotation, not the (unquantized) smaller load
    lo.release(first)
    assert load_key(2e-9) < load_key(3e-9)
    assert load_key(0.4e-9) == load_key(0.0)


def test_exact_ties_rotate_instead_of_taking_the_smallest_url() -> None:
    lo = LeastOutstanding(WorkBasis.REQUESTS)
    firsts = []
    for _ in range(6):
        order, reservation = lo.select("m", W, 1.0)
        firsts.append(order[0])
        lo.release(reservation)
    assert firsts == [*W, *W]


def test_rotation_ignores_a_rotated_given_order() -> None:
    # The shell may pass a round-robin pick; the cycle of replicas is the same.
    lo = LeastOutstanding(WorkBasis.REQUESTS)
    firsts = []
    for i in range(6):
        given_order = W[i % 3 :] + W[: i % 3]
        order, reservation = lo.select("m", given_order, 1.0)
        assert sorted(order) == sorted(W)
        firsts.append(order[0])
        lo.release(reservation)
    assert Counter(firsts) == {url: 2 for url in W}


def test_rotation_skips_untied_replicas() -> None:
    lo = LeastOutstanding(WorkBasis.ITEMS)
    lo.select("other", ("w1:1",), 4.0)  # w1 busy with another model
    firsts = []
    for _ in range(4):
        order, reservation = lo.select("m", W, 1.0)
        firsts.append(order[0])
        lo.release(reservation)
    assert firsts == ["w0:1", "w2:1", "w0:1", "w2:1"]


@given(
    st.lists(st.sampled_from(W), min_size=2, max_size=3, unique=True),
    st.integers(1, 200),
    st.integers(0, 5),
)
def test_ties_rotate_fairly(replicas: list[str], n: int, held: int) -> None:
    # `held` requests stay in flight on every replica, so all are always tied.
    lo = LeastOutstanding(WorkBasis.REQUESTS)
    for _ in range(held * len(replicas)):
        lo.select("m", replicas, 1.0)
    counts: Counter[str] = Counter()
    for _ in range(n):
        order, reservation = lo.select("m", replicas, 1.0)
        counts[order[0]] += 1
        lo.release(reservation)
    assert set(counts) <= set(replicas)
    assert max(counts.values()) - min(counts[url] for url in replicas) <= 1


def test_release_is_exactly_once() -> None:
    lo = LeastOutstanding(WorkBasis.ITEMS)
    _, a = lo.select("m", W[:1], 3.0)
    _, b = lo.select("m", W[:1], 3.0)
    lo.release(a)
    lo.release(a)  # no-op
    assert lo.loads()["w0:1"] == 3.0
    lo.release(b)
    lo.release(b)
    assert lo.loads()["w0:1"] == 0.0


def test_settle_to_zero() -> None:
    assert settle(1e-10) == 0.0 and settle(-9e-10) == 0.0
    assert settle(2e-9) == 2e-9 and settle(-1e-9) == -1e-9
    assert settle(0.0) == 0.0


def test_residue_settles_while_other_work_is_held() -> None:
    lo = LeastOutstanding(WorkBasis.COMPUTE)
    _, a = lo.select("m", W[:1], 0.1)
    _, b = lo.select("m", W[:1], 0.2)
    _, c = lo.select("m", W[:1], 0.3)
    lo.release(b)
    lo.release(c)
    assert lo.loads()["w0:1"] == pytest.approx(0.1)  # 0.1 + 0.2 + 0.3 - 0.2 - 0.3
    lo.release(a)
    assert lo.loads()["w0:1"] == 0.0


def test_an_idle_worker_reads_exactly_zero_beyond_the_settle_quantum() -> None:
    # A huge charge leaves more than a nanosecond of rounding residue on a small one.
    assert abs((1e-3 + 1e8) - 1e8 - 1e-3) * 1e9 >= 1
    lo = LeastOutstanding(WorkBasis.COMPUTE)
    _, small = lo.select("m", W[:1], 1e-3)
    _, huge = lo.select("m", W[:1], 1e8)
    lo.release(huge)
    lo.release(small)
    assert lo.loads()["w0:1"] == 0.0


charges = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("select"), st.sampled_from(["m", "n"]), charges),
            st.tuples(st.just("release"), st.integers(0, 63), st.just(0.0)),
        ),
        max_size=80,
    ),
    st.randoms(use_true_random=False),
)
def test_every_counter_returns_to_exactly_zero(
    ops: list[tuple[str, object, float]], rnd: random.Random
) -> None:
    lo = LeastOutstanding(WorkBasis.COMPUTE)
    held: list[Reservation] = []
    for op, arg, charge in ops:
        if op == "select":
            replicas = W if arg == "m" else W[1:]
            order, reservation = lo.select(str(arg), replicas, charge)
            assert order[0] == reservation.url and sorted(order) == sorted(replicas)
            held.append(reservation)
        elif held:
            reservation = held.pop(int(str(arg)) % len(held))
            lo.release(reservation)
            lo.release(reservation)  # a second release never double-counts
        loads = lo.loads()
        for url in loads:
            expected = sum(r.charge for r in held if r.url == url)
            assert loads[url] == pytest.approx(expected, rel=1e-9, abs=1e-6)
    rnd.shuffle(held)
    for reservation in held:
        lo.release(reservation)
    assert all(load == 0.0 for load in lo.loads().values())
    assert all(str(load) == "0.0" for load in lo.loads().values())  # not -0.0


@pytest.mark.parametrize(
    ("basis", "units", "item_cost", "charge"),
    [
        (WorkBasis.REQUESTS, 32, 0.5, 1.0),
        (WorkBasis.REQUESTS, 0, 0.5, 1.0),
        (WorkBasis.ITEMS, 32, 0.5, 32.0),
        (WorkBasis.ITEMS, 0, 0.5, 1.0),
        (WorkBasis.COMPUTE, 32, 0.5, 16.0),
        (WorkBasis.COMPUTE, -3, 0.25, 0.25),
        ("items", 4, 9.0, 4.0),
    ],
)
def test_basis_charges(basis: WorkBasis, units: int, item_cost: float, charge: float) -> None:
    assert charge_for(basis, units, item_cost) == charge


def test_unknown_basis_is_an_argument_error() -> None:
    with pytest.raises(ValueError):
        LeastOutstanding("gpu")
    with pytest.raises(ValueError):
        charge_for("gpu", 1, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("basis", "polls"),
    [(WorkBasis.REQUESTS, False), (WorkBasis.ITEMS, True), (WorkBasis.COMPUTE, True)],
)
def test_only_requests_needs_no_routing_meta(basis: WorkBasis, polls: bool) -> None:
    lo = LeastOutstanding(basis)
    assert lo.basis is basis and lo.needs_routing_meta is polls


def test_no_replicas_is_an_error() -> None:
    with pytest.raises(ValueError, match="no replicas"):
        LeastOutstanding(WorkBasis.ITEMS).select("m", (), 1.0)


def test_forget_drops_idle_counters_only() -> None:
    lo = LeastOutstanding(WorkBasis.ITEMS)
    _, busy = lo.select("m", ("w0:1", "w1:1", "w2:1"), 2.0)  # w0 holds work
    lo.forget(["w1:1"])
    assert lo.loads() == {"w0:1": 2.0, "w1:1": 0.0}
    lo.release(busy)
    assert lo.loads() == {"w0:1": 0.0, "w1:1": 0.0}
    lo.forget(["w1:1"])
    assert lo.loads() == {"w1:1": 0.0}
    # The model's rotation cursor pointed at a forgotten URL: it starts over.
    order, _ = lo.select("m", ("w1:1", "w2:1"), 1.0)
    assert order[0] == "w1:1"


def test_loads_is_a_snapshot() -> None:
    lo = LeastOutstanding(WorkBasis.ITEMS)
    snapshot = lo.loads()
    lo.select("m", W, 1.0)
    assert snapshot == {}
    with pytest.raises(TypeError):
        lo.loads()["w0:1"] = 5.0  # type: ignore[index]
