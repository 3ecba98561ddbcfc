"""Priority bands and fair shares at a full worker: the rule's promises, as properties.

Claims are set exactly: with a half-life of ln 2 a decayed arrival reads as one call a
second, so at `now` = 0 (nothing decays) and 0.1 s per call a tenant that arrived k
times claims k tenths of the worker.
"""

from __future__ import annotations

import copy
import math
import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.scheduling.calls._forecast import DEADLINE, AdmissionRule
from rsgw.scheduling.calls._shares import (
    BAND,
    HEADROOM,
    SHARE,
    Shares,
    ShareVerdict,
    band_keep,
    band_of,
    depth_for,
    describe_share,
    keep_fractions,
    places,
)

URL = "w0"
PER_CALL = 0.1
EXACT = math.log(2.0)  # the half-life at which claims are exact (module docstring)
TENANTS = ("a", "b", "c")
BANDS = (0, 1, 2)


def today(held: int, per_call: float, left: float, rule: AdmissionRule) -> bool:
    """Issue 38's rule as `_infer` asks it inline: admitted?"""
    if not held or not per_call:
        return True
    wait = held * per_call
    return not (wait > rule.queue_limit or wait + per_call + rule.margin > left)


@pytest.mark.parametrize(
    ("priority", "band"),
    [(None, 1), (0, 1), (1, 0), (2, 1), (3, 2), (4, 3), (5, 3), (2**64 - 1, 3)],
)
def test_priority_to_band(priority: int | None, band: int) -> None:
    assert band_of(priority, levels=4, default=2) == band


@pytest.mark.parametrize("priority", [-1, True, 1.0, "1", b"1", [1]])
def test_a_priority_that_is_not_a_non_negative_integer_is_refused(priority: object) -> None:
    with pytest.raises(ValueError, match="parameter 'priority' must be a non-negative integer"):
        band_of(priority, levels=4, default=2)


rules = st.builds(
    AdmissionRule,
    st.one_of(st.just(0.0), st.floats(1e-3, 100.0)),
    st.floats(0.0, 1.0),
)
per_calls = st.one_of(st.just(0.0), st.floats(1e-4, 10.0))
lefts = st.one_of(st.just(math.inf), st.floats(-1.0, 1000.0))


@given(per_calls, lefts, rules, st.integers(0, 2000))
def test_depth_is_where_the_deadline_rule_stops_admitting(
    per_call: float, left: float, rule: AdmissionRule, held: int
) -> None:
    assert (held + 1 <= depth_for(per_call, left, rule)) == today(held, per_call, left, rule)


@given(
    per_calls,
    lefts,
    rules,
    st.integers(0, 300),
    st.integers(0, 2),
    st.integers(0, 40),
)
def test_work_conservation_a_lone_tenant_is_admitted_as_before(
    per_call: float, left: float, rule: AdmissionRule, held: int, band: int, arrivals: int
) -> None:
    """Alone at a worker (others there long idle), whatever it holds and claims."""
    shares = Shares(half_life=EXACT)
    shares.arrived(URL, 0, "gone", now=-100.0)  # idle for far longer than it is remembered
    for _ in range(arrivals):
        shares.arrived(URL, band, "t", now=0.0)
    for _ in range(held):
        shares.hold(URL, band, "t", now=0.0)
    depth = depth_for(per_call, left, rule)
    verdict = shares.judge(URL, band, "t", held, depth, per_call, now=0.0)
    assert (verdict is None) == today(held, per_call, left, rule)


def book(arrivals: dict[tuple[int, str], int], weights: dict[str, float]) -> Shares:
    shares = Shares(weights, half_life=EXACT)
    for (band, tenant), count in arrivals.items():
        for _ in range(count):
            shares.arrived(URL, band, tenant, now=0.0)
    return shares


def claim(arrivals: dict[tuple[int, str], int], band: int, tenant: str) -> float:
    return min(1.0, arrivals.get((band, tenant), 0) * PER_CALL)


def water_filling(claims: list[float], weights: list[float]) -> list[float]:
    """Max-min fair division of 1 by weight, none given over its claim (the textbook loop)."""
    alloc = [0.0] * len(claims)
    hungry = set(range(len(claims)))
    left = 1.0
    while hungry and left > 1e-12:
        total = sum(weights[i] for i in hungry)
        level = {i: left * weights[i] / total for i in hungry}
        sated = {i for i in hungry if claims[i] - alloc[i] <= level[i]}
        if not sated:
            for i in hungry:
                alloc[i] += level[i]
            break
        for i in sated:
            left -= claims[i] - alloc[i]
            alloc[i] = claims[i]
        hungry -= sated
    return alloc


@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0), st.sampled_from([0.5, 1.0, 2.0, 3.0])),
        min_size=1,
        max_size=6,
    )
)
def test_keep_fractions_divide_the_room_max_min_fairly(pairs: list[tuple[float, float]]) -> None:
    claims = [c for c, _ in pairs]
    weights = [w for _, w in pairs]
    fractions = keep_fractions(claims, weights)
    assert sum(f for f, _ in fractions) <= 1.0 + 1e-9
    fair = water_filling(claims, weights)
    for (fraction, satisfied), c, alloc in zip(fractions, claims, fair, strict=True):
        if alloc >= c - 1e-9 and c > 0:  # the textbook loop satisfies it: so does this one
            assert satisfied
        if satisfied:  # its claim, with headroom while the satisfied ones fit
            assert c - 1e-9 <= fraction <= min(1.0, HEADROOM * c) + 1e-9
        else:  # over its share: no more than the textbook loop gives it
            assert fraction <= alloc + 1e-9


def view(
    shares: Shares, arrivals: dict[tuple[int, str], int], depth: int, band: int, tenant: str
) -> dict[str, tuple[int, bool]]:
    """Each tenant of `band` in `tenant`'s view: its places and whether it is satisfied."""
    active = [(b, t) for b, t, _ in _entries(shares)]
    above = sum(band_keep(claim(arrivals, b, t), depth) for b, t in active if b < band)
    room = max(0, depth - above)
    names = [t for b, t in active if b == band]
    if tenant not in names:
        names.append(tenant)
    fractions = keep_fractions(
        [claim(arrivals, band, t) for t in names], [shares.weights.get(t, 1.0) for t in names]
    )
    return {t: (places(f, room), ok) for t, (f, ok) in zip(names, fractions, strict=True)}


def _entries(shares: Shares) -> list[tuple[int, str, int]]:
    return [(u.band, u.tenant, u.held) for u in shares.usage(0.0)]


keys = st.tuples(st.sampled_from(BANDS), st.sampled_from(TENANTS))
counts = st.dictionaries(keys, st.integers(1, 12), min_size=2, max_size=9)
weight_maps = st.dictionaries(st.sampled_from(TENANTS), st.sampled_from([0.5, 1.0, 2.0, 3.0]))
#: Calls (True) three times as often as completions.
operations = st.lists(
    st.tuples(
        st.sampled_from([True, True, True, False]), st.sampled_from(BANDS), st.sampled_from(TENANTS)
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(counts, weight_maps, st.integers(1, 30), operations)
def test_no_starvation_a_satisfied_tenant_keeps_its_places(
    arrivals: dict[tuple[int, str], int],
    weights: dict[str, float],
    depth: int,
    ops: list[tuple[bool, int, str]],
) -> None:
    """Under any admissions and completions, with claims steady: right after a call of a
    tenant over its share or of a lower band is admitted, each satisfied tenant of the
    band can place as many calls as it keeps places, one after another."""
    shares = book(arrivals, weights)
    for is_call, band, tenant in ops:
        if not is_call:
            shares.unhold(URL, band, tenant)
            continue
        before = view(shares, arrivals, depth, band, tenant)
        if shares.judge(URL, band, tenant, shares.held(URL), depth, PER_CALL, now=0.0):
            continue
        shares.hold(URL, band, tenant, now=0.0)
        for high in range(band + 1):
            if high == band and before[tenant][1]:
                continue  # a satisfied tenant's call: it may use the others' places
            for other, (keep, satisfied) in view(shares, arrivals, depth, high, "").items():
                if (
                    satisfied
                    and other
                    and (high, other) in {(b, t) for b, t, _ in _entries(shares)}
                ):
                    _places_in_a_row(shares, high, other, keep, depth)


def _places_in_a_row(shares: Shares, band: int, tenant: str, keep: int, depth: int) -> None:
    trial = copy.deepcopy(shares)
    for placed in range(keep):
        verdict = trial.judge(URL, band, tenant, trial.held(URL), depth, PER_CALL, now=0.0)
        assert verdict is None, (band, tenant, placed, keep, verdict)
        trial.hold(URL, band, tenant, now=0.0)


@settings(max_examples=300)
@given(
    counts,
    weight_maps,
    st.dictionaries(
        st.tuples(st.sampled_from(BANDS), st.sampled_from(TENANTS)), st.integers(0, 8), max_size=9
    ),
    st.integers(1, 40),
)
def test_priority_order_a_higher_band_is_admitted_where_a_lower_one_is(
    arrivals: dict[tuple[int, str], int],
    weights: dict[str, float],
    holding: dict[tuple[int, str], int],
    depth: int,
) -> None:
    shares = worker_with(arrivals, holding, weights)
    total = shares.held(URL)
    for low in BANDS:
        for tenant in (*TENANTS, "new"):
            if shares.judge(URL, low, tenant, total, depth, PER_CALL, now=0.0) is None:
                for high in range(low):
                    for other in (*TENANTS, "new"):
                        verdict = shares.judge(URL, high, other, total, depth, PER_CALL, 0.0)
                        assert verdict is None, (low, tenant, high, other, verdict)


def worker_with(
    arrivals: dict[tuple[int, str], int],
    holding: dict[tuple[int, str], int],
    weights: dict[str, float] | None = None,
) -> Shares:
    """A book at `now` = 0 where each (band, tenant) arrived and holds so many calls."""
    shares = book(arrivals, weights or {})
    for (band, tenant), count in holding.items():
        for _ in range(count):
            shares.hold(URL, band, tenant, now=0.0)
    return shares


def refused(shares: Shares, expected: ShareVerdict, message: str) -> None:
    """`expected.tenant`'s call, with `expected.held` calls held of 10 places, is refused
    as `expected`, with `message` (for model 'm' at w0)."""
    verdict = shares.judge(
        URL, expected.band, expected.tenant, expected.held, 10, PER_CALL, now=0.0
    )
    assert verdict == expected
    assert describe_share(verdict, "m", "at w0") == message


def test_a_lower_band_is_told_the_higher_ones_claim_the_places() -> None:
    shares = worker_with({(0, "urgent"): 10, (1, "batch"): 1}, {(1, "batch"): 3})
    refused(
        shares,
        ShareVerdict(BAND, 1, "batch", 0.0, 0, 0, 0, 3, 10),
        "model 'm' not admitted: higher-priority calls claim the places at w0 "
        "(0 of 10 left to priority band 2, 3 held); retry later or elsewhere",
    )
    assert shares.judge(URL, 0, "urgent", 3, 10, PER_CALL, now=0.0) is None


def test_a_tenant_over_its_share_is_told_its_share() -> None:
    # x claims the whole worker, y 0.3 of it: within its share.
    shares = worker_with({(0, "x"): 10, (0, "y"): 3}, {(0, "x"): 6})
    refused(
        shares,
        ShareVerdict(SHARE, 0, "x", 0.5, 5, 6, 10, 6, 10),
        "model 'm' not admitted: tenant 'x' holds 6 calls at w0, its share (0.50 of "
        "priority band 1) keeps it 5 of the 10 places that finish in time, and the "
        "others' are taken; retry later or elsewhere",
    )
    assert shares.judge(URL, 0, "y", 6, 10, PER_CALL, now=0.0) is None


def test_a_tenant_within_its_share_is_not_refused_for_one_over_it() -> None:
    # x, over its share, keeps 5 places and holds 2: y may still take the last ones.
    shares = worker_with({(0, "x"): 10, (0, "y"): 3}, {(0, "x"): 2, (0, "y"): 6})
    assert shares.judge(URL, 0, "y", 8, 10, PER_CALL, now=0.0) is None
    assert shares.judge(URL, 0, "x", 8, 10, PER_CALL, now=0.0) is not None
    verdict = shares.judge(URL, 0, "y", 10, 10, PER_CALL, now=0.0)
    assert verdict is not None and verdict.reason == DEADLINE
    assert describe_share(verdict, "", "at w0") == (
        "call not admitted: at w0 10 calls are ahead of it, and it finishes before its "
        "deadline behind 9 at most; retry later or elsewhere"
    )


def test_idle_tenants_are_forgotten_and_held_ones_kept() -> None:
    shares = Shares(half_life=1.0)
    shares.arrived(URL, 0, "idle", now=0.0)
    shares.arrived(URL, 0, "busy", now=0.0)
    shares.hold(URL, 0, "busy", now=0.0)
    shares.arrived(URL, 1, "late", now=100.0)
    assert {(u.band, u.tenant, u.held) for u in shares.usage(100.0)} == {
        (0, "busy", 1),
        (1, "late", 0),
    }
    shares.unhold(URL, 0, "busy")
    shares.unhold(URL, 0, "busy")  # one too many: ignored
    assert shares.held(URL) == 0
    shares.forget(URL)
    assert list(shares.usage(100.0)) == []


def test_a_steady_rate_reads_as_itself() -> None:
    shares = Shares(half_life=2.0)
    for i in range(200):
        shares.arrived(URL, 0, "t", now=i * 0.25)
    (usage,) = shares.usage(200 * 0.25)
    assert usage.rate == pytest.approx(4.0, rel=0.05)


def simulate(
    offered: dict[str, float], bands: dict[str, int], until: float, deadline: float
) -> tuple[dict[str, int], dict[str, int], int]:
    """One worker draining a call per unit of time, FIFO; Poisson arrivals (seeded).

    Returns the calls offered and admitted per tenant, and those admitted that finished
    after their deadline."""
    rng = random.Random(52)
    arrivals = sorted(
        (t, tenant) for tenant, rate in offered.items() for t in _poisson(rng, rate, until)
    )
    shares = Shares(half_life=2 * deadline)
    rule = AdmissionRule(0.0, margin=0.25)
    queue: deque[tuple[float, str]] = deque()  # (finish time, tenant)
    free_at = 0.0
    offers = dict.fromkeys(offered, 0)
    admitted = dict.fromkeys(offered, 0)
    late = 0
    for now, tenant in arrivals:
        while queue and queue[0][0] <= now:
            _, done = queue.popleft()
            shares.unhold(URL, bands[done], done)
        offers[tenant] += 1
        band = bands[tenant]
        shares.arrived(URL, band, tenant, now)
        depth = depth_for(1.0, deadline, rule)
        if shares.judge(URL, band, tenant, len(queue), depth, 1.0, now) is None:
            shares.hold(URL, band, tenant, now)
            admitted[tenant] += 1
            free_at = max(free_at, now) + 1.0
            queue.append((free_at, tenant))
            late += free_at > now + deadline
    return offers, admitted, late


def _poisson(rng: random.Random, rate: float, until: float) -> list[float]:
    times, t = [], rng.expovariate(rate)
    while t < until:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def test_simulation_a_tenant_within_its_share_keeps_its_calls() -> None:
    """Tenant A offers 2.5x the worker, B 0.5x, equal weights, one band, deadline 10
    units: B keeps at least 95 % of its calls, and the worker stays at least 95 % busy
    (a lone flood would have taken every place, and most of B's calls refused)."""
    until = 4000.0
    offers, admitted, late = simulate({"A": 2.5, "B": 0.5}, {"A": 0, "B": 0}, until, 10.0)
    assert admitted["B"] >= 0.95 * offers["B"], (offers, admitted)
    assert sum(admitted.values()) >= 0.95 * until, (offers, admitted)
    assert late == 0


def test_a_depth_too_large_to_count_is_unbounded() -> None:
    assert depth_for(1e-300, 1e300, AdmissionRule(0.0)) == math.inf
    assert depth_for(0.1, math.inf, AdmissionRule(0.0)) == math.inf
    assert depth_for(0.1, math.inf, AdmissionRule(1.0, margin=0.0)) == 10  # 0.95 s: 9 ahead
