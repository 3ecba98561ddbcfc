"""Fill plans and fill-quantum routing (docs/original.md §4.5 step 3, §4.8)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.calls._fill import (
    DEFAULT_FILL_PLAN,
    FillPlan,
    FillReservation,
    FillRouter,
    resolve_fill_plan,
)
from rsgw.scheduling.knobs._knobs import FillMode, RoutingPolicy

A, B, C, D = "http://a", "http://b", "http://c", "http://d"
LEAST, RR = RoutingPolicy.FILL_LEAST, RoutingPolicy.FILL_RR
RUN, SPREAD, INFLIGHT = FillMode.RUN, FillMode.SPREAD, FillMode.INFLIGHT


def plan(mode: FillMode = RUN, quantum: int = 4) -> FillPlan:
    return FillPlan(mode, quantum)


# ---------------------------------------------------------------------------
# resolve_fill_plan


@pytest.mark.parametrize(
    ("override_mode", "override_factor", "max_batch", "mode", "quantum"),
    [
        (None, None, 32, RUN, 32),  # inherit everything
        (FillMode.INHERIT, 0.0, 32, RUN, 32),  # explicit inherit / 0 = inherit
        (SPREAD, None, 32, SPREAD, 32),
        (INFLIGHT, 2.0, 32, INFLIGHT, 64),
        (None, -1.0, 8, RUN, 8),  # a non-positive factor inherits
        (None, 0.5, 5, RUN, 2),  # 2.5 rounds half to even
        (None, 0.5, 7, RUN, 4),  # 3.5 rounds half to even
        (None, 0.01, 8, RUN, 1),  # never below 1
        (SPREAD, 4.0, 0, SPREAD, 1),  # unbatched / unpolled: quantum 1
        (None, None, -3, RUN, 1),
    ],
)
def test_resolve_fill_plan(
    override_mode: FillMode | None,
    override_factor: float | None,
    max_batch: int,
    mode: FillMode,
    quantum: int,
) -> None:
    resolved = resolve_fill_plan(RUN, 1.0, override_mode, override_factor, max_batch, "x", 2)
    assert resolved == FillPlan(mode, quantum, "x", 2)


def test_resolve_fill_plan_uses_fleet_factor_and_mode() -> None:
    assert resolve_fill_plan(SPREAD, 1.5, None, None, 5) == FillPlan(SPREAD, 8)  # 7.5 -> 8


def test_fill_plan_checks() -> None:
    assert FillPlan(RUN, 1, "", 0) == DEFAULT_FILL_PLAN
    with pytest.raises(ValueError, match="inherit"):
        FillPlan(FillMode.INHERIT, 1)
    with pytest.raises(ValueError, match=">= 1"):
        FillPlan(RUN, 0)


# ---------------------------------------------------------------------------
# Examples


def pick(
    router: FillRouter,
    urls: list[str],
    fill: FillPlan,
    *,
    units: int = 1,
    weight: float = 1.0,
    policy: RoutingPolicy = LEAST,
    model: str = "m",
) -> FillReservation:
    _, reservation = router.select(model, urls, fill, policy, units, weight)
    return reservation


def test_empty_placement_raises() -> None:
    with pytest.raises(ValueError, match="no replicas"):
        FillRouter().select("m", [], plan(), LEAST, 1, 1.0)


def test_single_replica_takes_everything_and_counts() -> None:
    router = FillRouter()
    order, reservation = router.select("m", [A], plan(), LEAST, 0, 0.5)
    assert order == (A,)
    assert reservation.units == 1  # a request is never free
    assert router.outstanding() == {("m", A): 1}
    assert router.loads() == {A: 0.5}
    assert router.routed() == {("m", A): 1}


@pytest.mark.parametrize("policy", [LEAST, RR])
@pytest.mark.parametrize("mode", [RUN, SPREAD, INFLIGHT])
def test_idle_model_rotates_per_request(mode: FillMode, policy: RoutingPolicy) -> None:
    router = FillRouter()
    chosen = []
    for _ in range(7):
        reservation = pick(router, [C, A, B], plan(mode, 32), policy=policy)
        chosen.append(reservation.url)
        router.release(reservation)
    assert chosen == [A, B, C, A, B, C, A]


def test_run_concentrates_a_quantum_then_moves_on() -> None:
    router = FillRouter()
    chosen = [pick(router, [A, B], plan(RUN, 3)).url for _ in range(7)]
    assert chosen == [A, A, A, B, B, B, A]


def test_full_batch_request_closes_its_run() -> None:
    # Q = 4. Two full-batch requests leave a and b equally deep (neither behind); the
    # next request opens a new run (back on a) because b's run already spent Q.
    router = FillRouter()
    assert pick(router, [A, B], plan(), units=4).url == A
    assert pick(router, [A, B], plan(), units=4).url == B
    assert pick(router, [A, B], plan(), units=1).url == A
    # Contrast: a run short of Q keeps its replica.
    router = FillRouter()
    assert pick(router, [A, B], plan(), units=4).url == A
    assert pick(router, [A, B], plan(), units=3).url == B
    assert pick(router, [A, B], plan(), units=1).url == B


def test_replica_a_quantum_behind_cannot_keep_its_run() -> None:
    router = FillRouter()
    pick(router, [A, B], plan(), units=4)  # a: 4
    on_b = pick(router, [A, B], plan(), units=4)  # b: 4
    assert pick(router, [A, B], plan(), units=1).url == A  # a: 5, a new run of 1 unit
    router.release(on_b)  # b: 0, so a is a whole quantum deeper than b
    assert pick(router, [A, B], plan(), units=1).url == B


def test_replica_a_quantum_behind_cannot_open_a_run() -> None:
    router = FillRouter()
    pick(router, [A, B, C], plan(), units=4)  # a: 4 (run spent)
    # b and c are level; a is behind, so the rotation from the cursor (b) is not
    # needed to exclude it: the next runs open on b and then c, never a.
    assert pick(router, [A, B, C], plan(), units=4).url == B
    assert pick(router, [A, B, C], plan(), units=4).url == C


def test_max_batch_zero_is_pure_rotation() -> None:
    fill = resolve_fill_plan(RUN, 1.0, None, None, 0)
    assert fill.quantum == 1
    router = FillRouter()
    chosen = [pick(router, [A, B, C], fill).url for _ in range(7)]  # all held
    assert chosen == [A, B, C, A, B, C, A]


def test_spread_takes_the_fewest_items() -> None:
    router = FillRouter()
    pick(router, [A, B, C], plan(SPREAD), units=5)  # a: 5
    pick(router, [A, B, C], plan(SPREAD), units=2)  # b: 2
    assert pick(router, [A, B, C], plan(SPREAD), units=1).url == C
    assert pick(router, [A, B, C], plan(SPREAD), units=1).url == C
    assert pick(router, [A, B, C], plan(SPREAD), units=1).url == B  # b 2, c 2: tie rotates


def test_inflight_fills_until_a_quantum_is_held() -> None:
    router = FillRouter()
    chosen = [pick(router, [A, B], plan(INFLIGHT, 2)).url for _ in range(6)]
    # Within a quantum level the deeper replica keeps filling (prog = (floor, -outs));
    # at the 2/2 tie the cursor, moved past a by the first tie, rotates to b.
    assert chosen == [A, A, B, B, B, B]


def test_fill_least_prefers_the_less_loaded_worker_and_fill_rr_ignores_it() -> None:
    router = FillRouter()
    pick(router, [A], plan(), weight=5.0, model="other")  # a single-replica model on a
    assert pick(router, [A, B], plan(), policy=LEAST).url == B
    router = FillRouter()
    pick(router, [A], plan(), weight=5.0, model="other")
    assert pick(router, [A, B], plan(), policy=RR).url == A


def test_fill_least_compares_loads_quantized() -> None:
    # A residue below a nanosecond does not count: the tie rotates to a.
    router = FillRouter()
    pick(router, [A], plan(), weight=1e-10, model="other")
    assert pick(router, [A, B], plan(), policy=LEAST).url == A


def test_failover_order_uses_pre_increment_counts() -> None:
    router = FillRouter()
    pick(router, [A, B, C, D], plan(SPREAD), units=9)  # a: 9
    pick(router, [A, B, C, D], plan(SPREAD), units=2)  # b: 2
    pick(router, [A, B, C, D], plan(SPREAD), units=5)  # c: 5
    order, reservation = router.select("m", [D, C, B, A], plan(SPREAD), LEAST, 7, 1.0)
    assert reservation.url == D
    # Then (floor(outs/4), outs, URL): b (0, 2), c (1, 5), a (2, 9).
    assert order == (D, B, C, A)


def test_release_is_exact_and_idempotent() -> None:
    router = FillRouter()
    first = pick(router, [A, B], plan(), units=3, weight=0.1)
    second = pick(router, [A, B], plan(), units=1, weight=0.2)
    assert first.url == second.url == A
    router.release(first)
    router.release(first)
    assert router.outstanding()[("m", A)] == 1
    assert router.loads()[A] == pytest.approx(0.2)
    router.release(second)
    assert router.outstanding()[("m", A)] == 0
    assert router.loads()[A] == 0.0
    assert router.routed()[("m", A)] == 2  # never decremented


# ---------------------------------------------------------------------------
# Properties

urls_st = st.lists(st.sampled_from([A, B, C, D]), min_size=1, max_size=4, unique=True)
modes = st.sampled_from([RUN, SPREAD, INFLIGHT])
policies = st.sampled_from([LEAST, RR])


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[str, object]]:
    """A random interleaving of selects (model, units, weight) and releases (an index)."""
    ops: list[tuple[str, object]] = []
    for _ in range(draw(st.integers(0, 60))):
        if draw(st.booleans()):
            model = draw(st.sampled_from(["m", "n", "o"]))
            ops.append(("select", (model, draw(st.integers(0, 9)), draw(st.floats(0, 3)))))
        else:
            ops.append(("release", draw(st.integers(0, 1000))))
    return ops


@given(
    st.dictionaries(st.sampled_from(["m", "n", "o"]), urls_st, min_size=3),
    st.dictionaries(st.sampled_from(["m", "n", "o"]), st.tuples(modes, st.integers(1, 6))),
    policies,
    operations(),
)
def test_counters_return_to_zero_and_invariants_hold(
    placements: dict[str, list[str]],
    plans: dict[str, tuple[FillMode, int]],
    policy: RoutingPolicy,
    ops: list[tuple[str, object]],
) -> None:
    router = FillRouter()
    held: list[FillReservation] = []
    requests = 0
    for kind, arg in ops:
        if kind == "release":
            if held:
                assert isinstance(arg, int)
                reservation = held.pop(arg % len(held))
                router.release(reservation)
                router.release(reservation)  # a second release is a no-op
            continue
        assert isinstance(arg, tuple)
        model, units, weight = arg
        mode, quantum = plans.get(model, (RUN, 1))
        fill = FillPlan(mode, quantum)
        before = router.outstanding()
        outs = {u: before.get((model, u), 0) for u in placements[model]}
        order, reservation = router.select(model, placements[model], fill, policy, units, weight)
        requests += 1
        held.append(reservation)
        assert sorted(order) == sorted(placements[model])
        assert order[0] == reservation.url
        floors = {u: o // quantum for u, o in outs.items()}
        if mode is RUN:  # never a replica a whole quantum behind
            assert floors[reservation.url] == min(floors.values())
        elif mode is SPREAD:
            assert outs[reservation.url] == min(outs.values())
        rest = order[1:]
        assert list(rest) == sorted(rest, key=lambda u: (floors[u], outs[u], u))
    for reservation in held:
        router.release(reservation)
    assert all(v == 0 for v in router.outstanding().values())
    assert all(v == 0.0 for v in router.loads().values())
    assert sum(router.routed().values()) == requests


@given(
    st.integers(2, 4),
    st.integers(1, 8),
    st.integers(1, 12),
    policies,
    st.integers(0, 200),
)
def test_run_mode_even_share_at_steady_concurrency(
    n: int, quantum: int, concurrency: int, policy: RoutingPolicy, requests: int
) -> None:
    """One-item requests at a fixed concurrency, completed in arrival order (replicas
    equally fast): every replica's routed item count is within one quantum of the
    others'. (With uneven completion a slow replica loses turns, which is the point.)"""
    urls = [A, B, C, D][:n]
    router = FillRouter()
    held: deque[FillReservation] = deque()
    items = dict.fromkeys(urls, 0)
    for _ in range(requests):
        if len(held) >= concurrency:
            router.release(held.popleft())
        reservation = pick(router, urls, plan(RUN, quantum), policy=policy)
        held.append(reservation)
        items[reservation.url] += 1
    assert max(items.values()) - min(items.values()) <= quantum


@given(st.integers(2, 4), st.lists(st.integers(1, 5), max_size=60), policies)
def test_spread_equalizes_in_flight_items(n: int, units: list[int], policy: RoutingPolicy) -> None:
    """Nothing completes: after every request, in-flight items differ by at most the
    largest single request."""
    urls = [A, B, C, D][:n]
    router = FillRouter()
    for count in units:
        pick(router, urls, plan(SPREAD), units=count, policy=policy)
        outs = [router.outstanding().get(("m", u), 0) for u in urls]
        assert max(outs) - min(outs) <= max(units)


# ---------------------------------------------------------------------------
# rebuild after a repack (docs/original.md §4.6.4)


def test_rebuild_keeps_in_flight_work_of_pairs_that_stay() -> None:
    router = FillRouter()
    _, on_a = router.select("m", [A, B], plan(RUN, 4), LEAST, 3, 3.0)
    router.rebuild({"m": (A, C)})
    assert router.outstanding() == {("m", A): 3}
    assert router.loads() == {A: 3.0}
    router.release(on_a)
    assert router.outstanding() == {("m", A): 0}
    assert router.loads() == {A: 0.0}


def test_a_late_release_of_a_dropped_pair_touches_nothing_new() -> None:
    router = FillRouter()
    _, on_b = router.select("m", [B], plan(RUN, 4), LEAST, 2, 2.0)
    router.rebuild({"m": (A,)})
    assert router.outstanding() == {} and router.loads() == {}
    _, fresh = router.select("m", [B], plan(RUN, 4), LEAST, 1, 1.0)  # placed back on B
    router.release(on_b)  # lands on the dropped cells
    assert router.outstanding() == {("m", B): 1}
    assert router.loads() == {B: 1.0}
    router.release(fresh)
    assert router.outstanding() == {("m", B): 0} and router.loads() == {B: 0.0}


def test_rebuild_ends_the_open_run_but_keeps_the_cursor() -> None:
    router = FillRouter()
    held = [router.select("m", [A, B], plan(RUN, 8), RR, 1, 1.0) for _ in range(3)]
    assert {order[0] for order, _ in held} == {A}  # one run on A
    router.rebuild({"m": (A, B)})
    order, _ = router.select("m", [A, B], plan(RUN, 8), RR, 1, 1.0)
    # The run on A ended; A is a quantum behind nobody, so the new run starts at the
    # cursor, which had moved past A.
    assert order[0] == B
    for _, reservation in held:
        router.release(reservation)
