"""compute_assignment: LPT packing over compute and memory (docs/original.md §4.6.6)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.scheduling.knobs._knobs import ALL, Replicas
from rsgw.scheduling.placement._assignment import (
    PLAN_GAIN_FLOOR,
    AssignmentResult,
    compute_assignment,
    replica_count,
)
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._replicas import auto_replicas

W = ["http://w0", "http://w1", "http://w2", "http://w3"]
W4 = W
GB = 1 << 30


def assign(
    utilization: Mapping[str, float],
    *,
    workers: list[str] = W,
    memory: Mapping[str, int] | None = None,
    mem_cap: Mapping[str, int] | None = None,
    replicas: Mapping[str, Replicas] | None = None,
    default_replicas: Replicas = 1,
    previous: Mapping[str, Placement] | None = None,
    hysteresis: float = 0.0,
    forbid: bool = False,
    max_share: float = 0.0,
) -> AssignmentResult:
    return compute_assignment(
        workers,
        utilization,
        memory or {},
        mem_cap or {},
        replicas or {},
        default_replicas,
        previous or {},
        hysteresis,
        forbid,
        max_share=max_share,
    )


def single(url: str) -> Placement:
    return Placement(((url, 1.0),))


def test_no_workers_gives_empty_result() -> None:
    result = assign({"a": 0.5}, workers=[])
    assert result.assignment == {}
    assert result.stats.placed == 0


def test_placement_must_be_sorted_distinct_positive() -> None:
    with pytest.raises(ValueError, match="sorted"):
        Placement((("b", 0.5), ("a", 0.5)))
    with pytest.raises(ValueError, match="sorted"):
        Placement((("a", 0.5), ("a", 0.5)))
    with pytest.raises(ValueError, match="positive"):
        Placement((("a", 0.0),))


def test_heaviest_first_onto_least_pressured_worker() -> None:
    # Heaviest first: "big" takes w0 (first of the empty, tied workers), then the two
    # lighter ones avoid it; the lightest goes where pressure is least.
    result = assign({"small": 0.1, "big": 0.6, "mid": 0.3}, workers=W[:2])
    assert result.assignment["big"].urls == ("http://w0",)
    assert result.assignment["mid"].urls == ("http://w1",)
    assert result.assignment["small"].urls == ("http://w1",)
    assert result.compute_load == pytest.approx({"http://w0": 0.6, "http://w1": 0.4})


def test_equal_utilization_orders_by_memory_then_name() -> None:
    # Same compute: the model with more memory chooses first and gets w0.
    result = assign(
        {"a": 0.2, "b": 0.2},
        workers=W[:2],
        memory={"b": 4 * GB},
        mem_cap=dict.fromkeys(W[:2], 8 * GB),
    )
    assert result.assignment["b"].urls == ("http://w0",)
    assert result.assignment["a"].urls == ("http://w1",)


@given(st.integers(1, 6), st.integers(0, 30))
def test_a_cold_start_spreads_models_over_the_workers(workers: int, models: int) -> None:
    """No demand measured and no memory budget: every score is 0, so the model count
    decides, and no worker hosts two more models than another (the original stacked
    them all on the first worker)."""
    urls = [f"http://w{i}" for i in range(workers)]
    result = assign({f"m{j:02}": 0.0 for j in range(models)}, workers=urls)
    hosted = [sum(url in p.urls for p in result.assignment.values()) for url in urls]
    assert max(hosted) - min(hosted) <= 1


ZIPF = {f"m{i:02}": 0.6 / i for i in range(1, 13)}  # twelve models, Zipf demand
STRIPED = {f"m{i:02}": single(W4[(i - 1) % 4]) for i in range(1, 13)}


def packed(demand: Mapping[str, float] = ZIPF, **kwargs: object) -> AssignmentResult:
    """Twelve models of 300 bytes on four 1000-byte workers: three fit on each."""
    return assign(
        demand,
        workers=W4,
        memory=dict.fromkeys(ZIPF, 300),
        mem_cap=dict.fromkeys(W4, 1000),
        forbid=True,
        **kwargs,  # type: ignore[arg-type]
    )


def test_memory_bound_ties_are_broken_by_compute() -> None:
    """Every worker ends at the same memory fraction, so pressure ties everywhere; the
    compute tie-break still pairs the hottest model with the coldest ones (striping
    in name order would put m01, m05 and m09 together)."""
    result = packed()
    striped = max(sum(u for m, u in ZIPF.items() if STRIPED[m].urls == (w,)) for w in W4)
    assert max(result.compute_load.values()) < striped
    hot = result.assignment["m01"].urls[0]
    # The exhaustive best (issue 21): 37.8% of the traffic where the greedy put 40.3%.
    assert sorted(m for m, p in result.assignment.items() if p.urls == (hot,)) == [
        "m01",
        "m11",
        "m12",
    ]
    memory, caps = dict.fromkeys(ZIPF, 300), dict.fromkeys(W4, 1000)
    greedy = compute_assignment(
        W4, ZIPF, memory, caps, {}, 1, {}, 0.0, True, refine=False
    ).assignment
    assert sorted(m for m, p in greedy.items() if p.urls == greedy["m01"].urls) == [
        "m01",
        "m08",
        "m12",
    ]


def test_hysteresis_compares_compute_when_memory_ties() -> None:
    moved = packed(previous=STRIPED, hysteresis=0.1)
    assert moved.stats.moved > 0
    assert max(moved.compute_load.values()) < max(
        sum(u for m, u in ZIPF.items() if STRIPED[m].urls == (w,)) for w in W4
    )
    held = packed(previous=STRIPED, hysteresis=100.0)
    assert held.stats.moved == 0 and held.assignment == STRIPED


def test_a_zero_demand_model_does_not_move_for_a_memory_tie() -> None:
    """Both workers at the same memory fraction; moving `idle` (no demand) to the
    worker without compute load relieves nothing, so the hysteresis keeps it."""
    previous = {"hot": single(W[0]), "idle": single(W[0]), "other": single(W[1])}
    result = assign(
        {"hot": 0.2, "idle": 0.0, "other": 0.0},
        workers=W[:2],
        memory={"hot": 0, "idle": 500, "other": 500},
        mem_cap=dict.fromkeys(W[:2], 1000),
        previous=previous,
        hysteresis=100.0,
    )
    assert result.assignment == previous
    assert result.stats.moved == 0


def test_memory_pressure_counts() -> None:
    # Compute alone ties w0 and w1 for "y" (0.4 each, so w0 by name); w0's weights are
    # 7/8 full, so its pressure is higher and "y" goes to w1.
    result = assign(
        {"heavy_mem": 0.3, "x": 0.3, "y": 0.1},
        workers=W[:2],
        memory={"heavy_mem": 7 * GB, "y": 1 * GB},
        mem_cap=dict.fromkeys(W[:2], 8 * GB),
    )
    assert result.assignment["heavy_mem"].urls == ("http://w0",)
    assert result.assignment["x"].urls == ("http://w1",)
    assert result.assignment["y"].urls == ("http://w1",)


@pytest.mark.parametrize(
    ("replicas", "workers", "k"),
    [(1, 4, 1), (3, 4, 3), (9, 4, 4), (0, 4, 1), (-2, 4, 1), (ALL, 4, 4), (ALL, 1, 1), (ALL, 0, 1)],
)
def test_replica_count_clamps(replicas: Replicas, workers: int, k: int) -> None:
    assert replica_count(replicas, workers) == k


def test_k_clamped_and_all_is_every_worker() -> None:
    result = assign(
        {"many": 0.4, "every": 0.2, "dflt": 0.1},
        replicas={"many": 10, "every": ALL},
        default_replicas=2,
    )
    assert len(result.assignment["many"]) == 4
    assert result.assignment["every"].urls == tuple(W)
    assert len(result.assignment["dflt"]) == 2


def test_multi_replica_weights_compute_share_and_full_memory() -> None:
    result = assign(
        {"m": 0.6},
        workers=W[:3],
        memory={"m": 2 * GB},
        replicas={"m": 3},
    )
    placement = result.assignment["m"]
    assert placement.urls == tuple(W[:3])
    assert [weight for _, weight in placement] == [pytest.approx(1 / 3)] * 3
    assert result.compute_load == pytest.approx(dict.fromkeys(W[:3], 0.2))
    assert result.memory_load == dict.fromkeys(W[:3], 2 * GB)


def test_multi_replica_prefers_previous_members_on_ties() -> None:
    previous = {"m": Placement((("http://w1", 0.5), ("http://w3", 0.5)))}
    result = assign({"m": 0.5}, replicas={"m": 2}, previous=previous)
    assert result.assignment["m"] == previous["m"]
    assert result.stats.moved == 0


def test_hysteresis_holds_single_replica_model() -> None:
    # "b" sits on w0 beside "a"; w1 is empty. Moving improves b's pressure from 0.6 to
    # 0.2, i.e. by 2.0; a threshold above that holds it, one below moves it.
    previous = {"a": single("http://w0"), "b": single("http://w0")}
    held = assign({"a": 0.4, "b": 0.2}, workers=W[:2], previous=previous, hysteresis=2.5)
    assert held.assignment["b"].urls == ("http://w0",)
    assert held.stats.held_by_hysteresis == 1
    assert held.stats.moved == 0
    assert held.stats.max_improvement == pytest.approx(2.0)
    moved = assign({"a": 0.4, "b": 0.2}, workers=W[:2], previous=previous, hysteresis=1.5)
    assert moved.assignment["b"].urls == ("http://w1",)
    assert moved.stats.held_by_hysteresis == 0
    assert moved.stats.moved == 1


def test_hysteresis_ignores_a_previous_worker_that_left() -> None:
    result = assign({"a": 0.4}, workers=W[:2], previous={"a": single("http://gone")})
    assert result.assignment["a"].urls == ("http://w0",)
    assert result.stats.moved == 1
    assert result.stats.max_improvement == 0.0


def test_forbid_keeps_weights_resident_when_possible() -> None:
    # "other" (hot, no weights) is held on w1, so w0 is far less pressured for "m" even
    # with its weights overflowing w0's small budget; forbid sends "m" to w1 instead.
    def place(forbid: bool) -> AssignmentResult:
        return assign(
            {"m": 0.5, "other": 3.0},
            workers=W[:2],
            memory={"m": 2 * GB},
            mem_cap={"http://w0": 1 * GB, "http://w1": 8 * GB},
            previous={"other": single("http://w1")},
            forbid=forbid,
        )

    loose = place(False)
    assert loose.assignment["other"].urls == ("http://w1",)
    assert loose.assignment["m"].urls == ("http://w0",)
    assert loose.oversubscribed == {"http://w0"}
    assert loose.over_budget_models == ()  # only forbid's fallback is worth a warning
    strict = place(True)
    assert strict.assignment["m"].urls == ("http://w1",)
    assert strict.oversubscribed == frozenset()
    assert strict.over_budget_models == ()


def test_forbid_degrades_with_a_warning_when_nothing_fits() -> None:
    result = assign(
        {"huge": 0.5},
        workers=W[:2],
        memory={"huge": 16 * GB},
        mem_cap=dict.fromkeys(W[:2], 8 * GB),
        forbid=True,
    )
    assert result.assignment["huge"].urls == ("http://w0",)
    assert result.over_budget_models == ("huge",)
    assert result.oversubscribed == {"http://w0"}


def test_missing_or_zero_cap_is_unlimited() -> None:
    result = assign(
        {"m": 0.1},
        workers=W[:2],
        memory={"m": 100 * GB},
        mem_cap={"http://w0": 0},
        forbid=True,
    )
    assert result.oversubscribed == frozenset()
    assert result.over_budget_models == ()


# ---------------------------------------------------------------------------
# Properties.

names = st.sampled_from([f"m{i}" for i in range(8)])
workers_st = st.lists(st.sampled_from([*W, "http://w4", "http://w5"]), min_size=1, unique=True)
replicas_st: st.SearchStrategy[Replicas] = st.one_of(st.integers(1, 7), st.just(ALL))


@dataclass(frozen=True)
class Problem:
    workers: list[str]
    utilization: dict[str, float]
    memory: dict[str, int]
    mem_cap: dict[str, int]
    replicas: dict[str, Replicas]
    default_replicas: Replicas
    hysteresis: float
    forbid: bool

    def run(self, previous: Mapping[str, Placement], *, refine: bool = True) -> AssignmentResult:
        return compute_assignment(
            self.workers,
            self.utilization,
            self.memory,
            self.mem_cap,
            self.replicas,
            self.default_replicas,
            previous,
            self.hysteresis,
            self.forbid,
            refine=refine,
        )


@st.composite
def problems(draw: st.DrawFn, forbid: bool | None = None) -> Problem:
    workers = draw(workers_st)
    models = draw(st.lists(names, unique=True, max_size=8))
    return Problem(
        workers=workers,
        utilization={m: draw(st.floats(0, 2)) for m in models},
        memory={m: draw(st.integers(0, 10)) for m in models},
        mem_cap={w: draw(st.integers(0, 20)) for w in workers},
        replicas={m: draw(replicas_st) for m in models if draw(st.booleans())},
        default_replicas=draw(replicas_st),
        hysteresis=draw(st.sampled_from([0.0, 0.1, 0.5])),
        forbid=draw(st.booleans()) if forbid is None else forbid,
    )


@given(problems())
def test_deterministic_and_stable(problem: Problem) -> None:
    first = problem.run({})
    assert problem.run({}) == first
    # Fed back as `previous` with unchanged inputs, nothing moves, and the repeat is
    # itself a fixed point.
    again = problem.run(first.assignment)
    assert again.stats.moved == 0
    assert again.stats.held_by_hysteresis == 0
    assert again.assignment == first.assignment
    assert problem.run(again.assignment) == again


@given(problems())
def test_shape_of_every_placement(problem: Problem) -> None:
    result = problem.run({})
    workers = set(problem.workers)
    assert set(result.assignment) == set(problem.utilization)
    assert result.stats.placed == len(problem.utilization)
    for model, placement in result.assignment.items():
        k = replica_count(problem.replicas.get(model, problem.default_replicas), len(workers))
        assert len(placement) == k
        assert set(placement.urls) <= workers
        assert all(weight == 1 / k for _, weight in placement)
    for w in workers:
        hosted = [m for m, p in result.assignment.items() if w in p.urls]
        assert result.memory_load[w] == sum(problem.memory[m] for m in hosted)
        share = sum(problem.utilization[m] / len(result.assignment[m]) for m in hosted)
        assert result.compute_load[w] == pytest.approx(share)


@given(problems(forbid=True))
def test_forbid_places_on_fitting_workers_whenever_enough_fit(problem: Problem) -> None:
    """What forbid guarantees, replayed heaviest first from the result.

    At each model's turn, with the memory of the models placed before it: if at least
    k workers could still hold its weights, it got only such workers (and no warning);
    otherwise it got every worker that could. And when one worker could hold every
    model at once, no worker is oversubscribed and nothing is warned about.
    """
    result = problem.run({})
    memory, utilization = problem.memory, problem.utilization
    cap = {w: c if c > 0 else math.inf for w, c in problem.mem_cap.items()}
    used = dict.fromkeys(cap, 0)
    order = sorted(utilization, key=lambda m: (-utilization[m], -memory[m], m))
    for model in order:
        placement = result.assignment[model]
        fitting = {w for w in cap if used[w] + memory[model] <= cap[w]}
        if len(fitting) >= len(placement):
            assert set(placement.urls) <= fitting, model
            assert model not in result.over_budget_models
        else:
            assert fitting <= set(placement.urls)
            assert model in result.over_budget_models
        for w in placement.urls:
            used[w] += memory[model]
    assert dict(result.memory_load) == used
    assert result.oversubscribed == {w for w in cap if used[w] > cap[w]}
    if sum(memory.values()) <= min(cap.values()):
        assert result.oversubscribed == frozenset()
        assert result.over_budget_models == ()


@st.composite
def with_previous(draw: st.DrawFn) -> tuple[Problem, dict[str, Placement]]:
    """A problem and a previous placement putting some models on one worker each."""
    problem = draw(problems())
    previous = {
        m: single(draw(st.sampled_from(problem.workers)))
        for m in problem.utilization
        if draw(st.booleans())
    }
    return problem, previous


@settings(max_examples=500)
@given(with_previous())
def test_single_replica_models_stay_within_the_hysteresis_band(
    case: tuple[Problem, dict[str, Placement]],
) -> None:
    """Replayed heaviest first from the result: a single-replica model whose previous
    worker is still a candidate stays there whenever moving would improve its pressure
    by no more than `hysteresis` (relatively). When the two pressures are equal (the
    memory-bound case), the band is measured on compute load instead, as the choice
    itself breaks that tie. (The greedy's contract; the refinement after it moves models
    only for a fleet-wide gain above `hysteresis`, checked below.)"""
    problem, previous = case
    result = problem.run(previous, refine=False)
    workers = sorted(set(problem.workers))
    cap = {w: c if (c := problem.mem_cap.get(w, 0)) > 0 else math.inf for w in workers}
    cload = dict.fromkeys(workers, 0.0)
    mload = dict.fromkeys(workers, 0)
    utilization, memory = problem.utilization, problem.memory
    for model in sorted(utilization, key=lambda m: (-utilization[m], -memory[m], m)):
        u, wm = utilization[model], memory[model]
        placement = result.assignment[model]
        before = previous.get(model)
        if len(placement) == 1 and before is not None and before.urls[0] in cload:

            def score(w: str, u: float = u, wm: int = wm) -> float:
                mem = (mload[w] + wm) / cap[w] if cap[w] != math.inf else 0.0
                return max(cload[w] + u, mem)

            fitting = [w for w in workers if mload[w] + wm <= cap[w]]
            candidates = fitting if problem.forbid and fitting else workers
            wp = before.urls[0]
            best = min(score(w) for w in candidates)
            if math.isclose(score(wp), best, rel_tol=1e-9):
                tied = [w for w in candidates if score(w) == best]
                floor = min(cload[w] + u for w in tied)
                within = floor <= 0 or cload[wp] + u <= floor * (1 + problem.hysteresis)
            else:
                within = score(wp) <= best * (1 + problem.hysteresis)
            if wp in candidates and within:
                assert placement.urls == (wp,), model
        for w in placement.urls:
            cload[w] += u / len(placement)
            mload[w] += wm


# -- replicas for a model one worker cannot carry -------------------------------------------


def test_a_model_above_the_max_share_gets_the_replicas_it_needs() -> None:
    result = assign({"hot": 2.1, "a": 0.3, "b": 0.2}, max_share=0.8)
    assert len(result.assignment["hot"]) == 3  # ceil(2.1 / 0.8)
    assert len(result.assignment["a"]) == 1
    assert max(result.compute_load.values()) <= 1.0


def test_extra_replicas_only_where_memory_allows() -> None:
    caps = dict.fromkeys(W, 100)
    memory = {"hot": 60, "a": 60, "b": 60, "c": 60}
    # Four workers of 100 bytes hold four 60-byte weight sets: no room for a second copy.
    result = assign(
        {"hot": 1.5, "a": 0.2, "b": 0.2, "c": 0.2},
        memory=memory,
        mem_cap=caps,
        forbid=True,
        max_share=0.8,
    )
    assert len(result.assignment["hot"]) == 1
    assert not result.oversubscribed


def test_an_operators_replica_count_is_kept() -> None:
    result = assign({"hot": 2.5}, replicas={"hot": 1}, max_share=0.8)
    assert len(result.assignment["hot"]) == 1


def test_auto_replicas_drop_the_least_useful_extra_first() -> None:
    demand = {"x": 3.0, "y": 1.7}
    weights = {"x": 10, "y": 10}
    # Wanted x: 4, y: 3 (70 bytes on distinct workers); four workers of 20 hold them.
    assert auto_replicas({"x": 1, "y": 1}, demand, weights, [20] * 4, 0.8) == {"x": 4, "y": 3}
    # Four workers of 10 hold four copies: y's third goes first (1.7/2 < 3.0/3), then x's
    # fourth and third (3.0/3 and 3.0/2 < 1.7/1): the busiest replica carries 1.5, not 1.7.
    assert auto_replicas({"x": 1, "y": 1}, demand, weights, [10] * 4, 0.8) == {"x": 2, "y": 2}


# -- the refinement against brute force ------------------------------------------------------


def brute_force_busiest(problem: Problem) -> float:
    """The lightest busiest-worker compute load of any placement of single-replica models
    that overfills no budget (inf when none fits)."""
    workers = sorted(set(problem.workers))
    cap = {w: c if (c := problem.mem_cap.get(w, 0)) > 0 else math.inf for w in workers}
    models = sorted(problem.utilization)
    best = math.inf
    for choice in itertools.product(workers, repeat=len(models)):
        load = dict.fromkeys(workers, 0.0)
        mem = dict.fromkeys(workers, 0)
        for model, w in zip(models, choice, strict=True):
            load[w] += problem.utilization[model]
            mem[w] += problem.memory[model]
        if all(mem[w] <= cap[w] for w in workers):
            best = min(best, max(load.values()))
    return best


@settings(max_examples=300, deadline=None)
@given(problems(forbid=True))
def test_the_packing_is_within_a_few_percent_of_the_exhaustive_optimum(
    problem: Problem,
) -> None:
    """Small instances (up to 7 models on up to 3 workers), one replica each, fresh
    (no previous placement, no hysteresis): the busiest worker carries at most 2% more
    than in the best placement a brute force finds, whenever the greedy fits at all."""
    workers = sorted(set(problem.workers))[:3]
    models = sorted(problem.utilization)[:7]
    problem = dataclasses.replace(
        problem,
        workers=workers,
        utilization={m: problem.utilization[m] for m in models},
        memory={m: problem.memory[m] for m in models},
        mem_cap={w: problem.mem_cap.get(w, 0) for w in workers},
        replicas={},
        default_replicas=1,
        hysteresis=0.0,
    )
    result = problem.run({})
    if result.oversubscribed:
        return  # memory decided, not balance: the refinement leaves it to the greedy
    optimum = brute_force_busiest(problem)
    busiest = max(result.compute_load.values(), default=0.0)
    assert busiest <= optimum * 1.02 + 1e-9


# -- a repack moves weights only for a gain worth the reloads ----------------------------------


def busiest_under(assignment: Mapping[str, Placement], utilization: Mapping[str, float]) -> float:
    load: dict[str, float] = {}
    for model, placement in assignment.items():
        for url, weight in placement:
            load[url] = load.get(url, 0.0) + utilization[model] * weight
    return max(load.values(), default=0.0)


@settings(max_examples=300, deadline=None)
@given(problems(), st.lists(st.floats(0.98, 1.02), min_size=8, max_size=8))
def test_a_wobble_in_demand_moves_nothing_unless_the_busiest_gains_the_floor(
    problem: Problem, wobble: list[float]
) -> None:
    """Demand re-measured within 2% of the last repack's: the placement in force stays,
    or the new one lightens the busiest worker by more than PLAN_GAIN_FLOOR. (A
    placement over a weight budget is not kept: memory, not balance, decides there.)"""
    first = problem.run({})
    if first.oversubscribed:
        return
    noisy = dataclasses.replace(
        problem,
        utilization={
            m: u * f for (m, u), f in zip(problem.utilization.items(), wobble, strict=False)
        },
    )
    again = noisy.run(first.assignment)
    if again.assignment != first.assignment:
        kept = busiest_under(first.assignment, noisy.utilization)
        assert kept > max(again.compute_load.values()) * (1 + PLAN_GAIN_FLOOR)


def test_the_zipf_node_keeps_its_packing_through_seven_percent_noise() -> None:
    """The measured churn (bench/fleet hot_replicas: 4-6 of 8 models moved per repack)
    came from re-packing noisy demand; here eight repacks of the twelve Zipf models with
    +-7% noise on each model's demand move nothing, while the shift that reverses the
    ranks moves models at once."""
    result = packed()
    for step in range(8):
        noise = {
            m: u * (1 + 0.07 * math.sin(7 * step + i)) for i, (m, u) in enumerate(ZIPF.items())
        }
        again = packed(noise, previous=result.assignment)
        assert again.stats.moved == 0 and again.assignment == result.assignment
    reversed_demand = dict(zip(ZIPF, reversed(list(ZIPF.values())), strict=True))
    shifted = packed(reversed_demand, previous=result.assignment)
    assert shifted.stats.moved > 0
    assert max(shifted.compute_load.values()) * (1 + PLAN_GAIN_FLOOR) < busiest_under(
        result.assignment, reversed_demand
    )


def test_demand_hovering_at_the_replica_threshold_keeps_the_replica() -> None:
    """A model raised to two replicas at 0.9 of a GPU keeps them when its demand dips
    to 0.78 (under max_share 0.8); it goes back to one when its demand falls to where no
    rule would split it; an operator's count always holds."""
    workers = W[:2]
    first = assign({"hot": 0.9, "cold": 0.1}, workers=workers, max_share=0.8)
    assert len(first.assignment["hot"]) == 2
    dip = assign(
        {"hot": 0.78, "cold": 0.1}, workers=workers, max_share=0.8, previous=first.assignment
    )
    assert dip.assignment == first.assignment and dip.stats.moved == 0
    fell = assign(
        {"hot": 0.3, "cold": 0.1}, workers=workers, max_share=0.8, previous=first.assignment
    )
    assert len(fell.assignment["hot"]) == 1
    pinned = assign(
        {"hot": 0.78, "cold": 0.1},
        workers=workers,
        max_share=0.8,
        replicas={"hot": 1},
        previous=first.assignment,
    )
    assert len(pinned.assignment["hot"]) == 1


def test_a_model_heavier_than_the_mean_is_split_while_that_lightens_the_busiest() -> None:
    """The hot_replicas node: m01 takes 55% of 2.4 GPUs of demand. ceil(u / max_share)
    gives it two replicas (0.66 each, the busiest worker); a third brings every worker
    near the mean, as the exhaustive best does. A fourth would not help and is not
    added; nor is a model under half of max_share ever split."""
    shares = [0.55, 0.15, 0.09, 0.07, 0.05, 0.04, 0.03, 0.02]
    demand = {f"m0{i + 1}": 2.4 * share for i, share in enumerate(shares)}
    result = assign(demand, workers=W4, max_share=0.8)
    assert len(result.assignment["m01"]) == 3
    assert all(len(p) == 1 for m, p in result.assignment.items() if m != "m01")
    assert max(result.compute_load.values()) < 0.66
    light = assign({m: u / 4 for m, u in demand.items()}, workers=W4, max_share=0.8)
    assert len(light.assignment["m01"]) == 1  # 0.33 of a GPU: one replica batches deepest
