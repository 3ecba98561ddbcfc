"""Closed-loop fairness properties of fill-quantum routing (docs/original.md §4.5).

A closed loop keeps `concurrency` one-item requests of one model in flight over its
replicas: each completion frees a slot and the next request is routed at once, until
`REQUESTS` requests have been routed. Every request is charged `weight = units`, so
`fill_least`'s worker loads track the model's own in-flight items.

Completion orders
-----------------

* FIFO: completions in routing order (replicas equally fast).
* Arbitrary: hypothesis picks which in-flight request completes at every completion.
  Under arbitrary orders no load-aware mode can promise a replica a share of the traffic:
  a replica that never completes keeps its in-flight work, so `spread` (fewest items),
  `run` (the behind rule, and the load key under `fill_least`) route around it. That is
  the design ("a slow replica loses its turn"), pinned by
  `test_a_stalled_replica_loses_its_turns_under_arbitrary_orders`. Smallest
  counterexample, for every mode and policy: two replicas, concurrency 2, Q = 1; the
  first request (on a) never completes, so b takes the other 399 of 400.
* Bounded overtaking: hypothesis still picks, but no request is overtaken (a younger
  request completes while it is in flight) more than `concurrency - 1` times; when the
  oldest in-flight request reaches that bound it completes next. A replica therefore
  cannot fall arbitrarily far behind the others (it is at worst a few times slower),
  and under that restriction every replica gets at least half an even share.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.scheduling.calls._fill import FillPlan, FillReservation, FillRouter
from rsgw.scheduling.knobs._knobs import FillMode, RoutingPolicy

A, B, C, D = "http://a", "http://b", "http://c", "http://d"
URLS = [A, B, C, D]
LEAST, RR = RoutingPolicy.FILL_LEAST, RoutingPolicy.FILL_RR
RUN, SPREAD, INFLIGHT = FillMode.RUN, FillMode.SPREAD, FillMode.INFLIGHT

#: Requests routed per closed-loop run.
REQUESTS = 400
#: The most requests a closed loop keeps in flight.
MAX_CONCURRENCY = 24
#: The largest fill quantum drawn (a typical max batch size at fill factor 1).
MAX_QUANTUM = 32

#: Each example routes up to 400 requests: a wall-clock deadline would only measure
#: machine load (the `ci` profile drops deadlines for the same reason).
CLOSED_LOOP = settings(max_examples=60, deadline=None)

fill_modes = pytest.mark.parametrize("mode", [RUN, SPREAD])
fill_policies = pytest.mark.parametrize("policy", [RR, LEAST])
replicas_st = st.integers(2, 4)
concurrency_st = st.integers(1, MAX_CONCURRENCY)
quantum_st = st.integers(1, MAX_QUANTUM)
#: One entry per completion (missing entries complete the oldest request).
picks_st = st.lists(st.integers(0, MAX_CONCURRENCY - 1), max_size=REQUESTS)
#: A replica the order tries to stall: its requests complete only when nothing else can.
stalled_st = st.none() | st.integers(0, 3)


def pick(
    router: FillRouter,
    urls: Sequence[str],
    fill: FillPlan,
    *,
    units: int = 1,
    weight: float | None = None,
    policy: RoutingPolicy = LEAST,
    model: str = "m",
) -> FillReservation:
    charge = float(units) if weight is None else weight
    _, reservation = router.select(model, urls, fill, policy, units, charge)
    return reservation


def closed_loop_fifo(
    urls: Sequence[str], fill: FillPlan, policy: RoutingPolicy, concurrency: int
) -> Counter[str]:
    """Requests routed per replica, completions in routing order."""
    router = FillRouter()
    held: deque[FillReservation] = deque()
    routed: Counter[str] = Counter(dict.fromkeys(urls, 0))
    for _ in range(REQUESTS):
        if len(held) >= concurrency:
            router.release(held.popleft())
        reservation = pick(router, urls, fill, policy=policy)
        held.append(reservation)
        routed[reservation.url] += 1
    return routed


def closed_loop_chosen(
    urls: Sequence[str],
    fill: FillPlan,
    policy: RoutingPolicy,
    concurrency: int,
    picks: Sequence[int],
    stalled: int | None,
    max_overtakes: int | None,
) -> Counter[str]:
    """Requests routed per replica, completions chosen by `picks`.

    At the k-th completion `picks[k]` (0 once exhausted) indexes the in-flight requests
    (oldest first), those on `urls[stalled]` left out while any other is in flight. With
    `max_overtakes`, the oldest in-flight request completes instead once it has been
    overtaken that many times (it is the most overtaken one: a completion overtakes
    every older in-flight request).
    """
    router = FillRouter()
    held: list[FillReservation] = []
    overtaken: list[int] = []
    routed: Counter[str] = Counter(dict.fromkeys(urls, 0))
    victim = None if stalled is None else urls[stalled % len(urls)]
    for k in range(REQUESTS):
        if len(held) >= concurrency:
            if max_overtakes is not None and overtaken[0] >= max_overtakes:
                index = 0
            else:
                free = [i for i, r in enumerate(held) if r.url != victim] or list(range(len(held)))
                index = free[(picks[k] if k < len(picks) else 0) % len(free)]
            for older in range(index):
                overtaken[older] += 1
            router.release(held.pop(index))
            overtaken.pop(index)
        reservation = pick(router, urls, fill, policy=policy)
        held.append(reservation)
        overtaken.append(0)
        routed[reservation.url] += 1
    return routed


# ---------------------------------------------------------------------------
# 1. FIFO completions: within one quantum


@fill_modes
@fill_policies
@CLOSED_LOOP
@given(replicas_st, concurrency_st, quantum_st)
def test_fifo_closed_loop_routes_within_one_quantum_per_replica(
    mode: FillMode, policy: RoutingPolicy, n: int, concurrency: int, quantum: int
) -> None:
    """400 one-item requests, `concurrency` (1-24) in flight, completions in routing
    order, quantum Q drawn from 1-32: max minus min requests routed per replica <= Q.
    (Checked exhaustively over the whole grid while writing this test.)"""
    routed = closed_loop_fifo(URLS[:n], FillPlan(mode, quantum), policy, concurrency)
    assert sum(routed.values()) == REQUESTS
    assert max(routed.values()) - min(routed.values()) <= quantum


# ---------------------------------------------------------------------------
# 2. Chosen completion orders


@fill_modes
@fill_policies
@CLOSED_LOOP
@given(replicas_st, concurrency_st, quantum_st, picks_st, stalled_st)
def test_every_replica_serves_at_least_one_request_under_arbitrary_orders(
    mode: FillMode,
    policy: RoutingPolicy,
    n: int,
    concurrency: int,
    quantum: int,
    picks: list[int],
    stalled: int | None,
) -> None:
    """Unrestricted orders, even one stalling a replica: nobody is never tried. An
    untried replica holds no items and no load, so it is never behind and always ties
    for the least; rotation reaches it within n runs (spread: n requests)."""
    fill = FillPlan(mode, quantum)
    routed = closed_loop_chosen(URLS[:n], fill, policy, concurrency, picks, stalled, None)
    assert min(routed.values()) >= 1


@fill_modes
@fill_policies
@CLOSED_LOOP
@given(replicas_st, concurrency_st, quantum_st, picks_st, stalled_st)
def test_every_replica_gets_half_an_even_share_under_bounded_overtaking(
    mode: FillMode,
    policy: RoutingPolicy,
    n: int,
    concurrency: int,
    quantum: int,
    picks: list[int],
    stalled: int | None,
) -> None:
    """Hypothesis-chosen orders (Q drawn from 1-32) in which no request is overtaken
    more than concurrency - 1 times: every replica serves at least one request and at
    least 0.5 * 400 / n. (Against the stalling order the worst share seen over the grid
    is 0.52 of even; allowing `concurrency` overtakes reaches exactly 0.5.)"""
    fill = FillPlan(mode, quantum)
    bound = concurrency - 1
    routed = closed_loop_chosen(URLS[:n], fill, policy, concurrency, picks, stalled, bound)
    assert min(routed.values()) >= 1
    assert min(routed.values()) >= 0.5 * REQUESTS / n


@fill_modes
@fill_policies
def test_a_stalled_replica_loses_its_turns_under_arbitrary_orders(
    mode: FillMode, policy: RoutingPolicy
) -> None:
    """Why the even-share property needs bounded overtaking: the smallest counterexample.
    Two replicas, concurrency 2, Q = 1; a's first request never completes."""
    routed = closed_loop_chosen([A, B], FillPlan(mode, 1), policy, 2, [], 0, None)
    assert routed == {A: 1, B: REQUESTS - 1}


# ---------------------------------------------------------------------------
# 3. run against inflight, deterministically


def test_fifo_concurrency_two_run_splits_evenly_while_inflight_parks_on_one_replica() -> None:
    """Concurrency 2 on two replicas, Q = 8, completions in routing order: `run` splits
    400 requests exactly 200/200; `inflight` never holds a quantum, so it parks all 400
    on one replica."""
    assert closed_loop_fifo([A, B], FillPlan(RUN, 8), LEAST, 2) == {A: 200, B: 200}
    assert closed_loop_fifo([A, B], FillPlan(RUN, 8), RR, 2) == {A: 200, B: 200}
    assert closed_loop_fifo([A, B], FillPlan(INFLIGHT, 8), LEAST, 2) == {A: 400, B: 0}
    assert closed_loop_fifo([A, B], FillPlan(INFLIGHT, 8), RR, 2) == {A: 400, B: 0}


# ---------------------------------------------------------------------------
# 4. Run boundaries (test_fill.py has the examples; these generalize them)


@pytest.mark.parametrize("policy", [RR, LEAST])
@given(st.integers(2, 4), st.integers(1, MAX_QUANTUM), st.booleans(), st.data())
def test_a_full_batch_request_closes_its_run_and_the_next_request_goes_elsewhere(
    policy: RoutingPolicy, n: int, quantum: int, levelled: bool, data: st.DataObject
) -> None:
    """A run has spent `spent` < Q one-item requests (all still in flight); a request of
    `units` >= Q joins it (or opens it, when nothing was in flight) and closes it: the
    next request goes to another replica.

    `levelled`: the other replicas first get a ballast of whole quanta so that the run's
    replica ends level with them (not behind), so only `run.units >= Q` can end the run.
    """
    spent = data.draw(st.integers(0, quantum - 1), label="spent")
    units = data.draw(st.integers(quantum, 3 * quantum), label="units")
    urls = URLS[:n]
    fill = FillPlan(RUN, quantum)
    router = FillRouter()
    if levelled:
        level = (spent + units) // quantum * quantum
        ballast = [pick(router, urls, fill, units=level, policy=policy) for _ in range(n)]
        assert sorted(r.url for r in ballast) == urls  # one full batch per replica
        router.release(ballast[0])  # a is empty, the others hold `level` items each
    run = [pick(router, urls, fill, policy=policy) for _ in range(spent)]
    assert len({r.url for r in run}) <= 1  # one open run
    full = pick(router, urls, fill, units=units, policy=policy)
    if run:
        assert full.url == run[0].url  # it joins the open run
    if levelled:
        assert full.url == A
        floors = {url: items // quantum for (_, url), items in router.outstanding().items()}
        assert len(set(floors.values())) == 1  # nobody is behind
    assert pick(router, urls, fill, policy=policy).url != full.url


@given(
    st.integers(2, 4),
    st.sampled_from([RUN, SPREAD, INFLIGHT]),
    st.sampled_from([RR, LEAST]),
    st.integers(1, MAX_QUANTUM),
    st.lists(st.integers(0, 3 * MAX_QUANTUM), min_size=1, max_size=20),
)
def test_an_idle_model_rotates_per_request_for_any_quantum_and_request_size(
    n: int, mode: FillMode, policy: RoutingPolicy, quantum: int, sizes: list[int]
) -> None:
    """Nothing in flight at each request (each completes before the next arrives): the
    model rotates through its sorted replicas one request at a time, whatever the
    quantum and the request sizes."""
    urls = URLS[:n]
    router = FillRouter()
    chosen = []
    for units in sizes:
        reservation = pick(
            router, list(reversed(urls)), FillPlan(mode, quantum), units=units, policy=policy
        )
        chosen.append(reservation.url)
        router.release(reservation)
    assert chosen == [urls[i % n] for i in range(len(sizes))]
