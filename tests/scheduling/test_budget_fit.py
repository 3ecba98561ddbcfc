"""A repack's placement cut to the workers' budgets (issue 49): never over, by value."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.scheduling.placement._budget_fit import ResidencyFacts, fit_to_budgets
from rsgw.scheduling.placement._placement import Placement
from rsgw.scheduling.placement._repository_moves import uniform
from rsgw.scheduling.placement._residency import ModelTerms, ResidentCopy, WorkerMemory

W = ("w0", "w1", "w2")
GB = 1_000_000_000


def facts(
    sizes: dict[str, int],
    budgets: dict[str, int],
    *,
    loaded: dict[str, dict[str, float]] | None = None,
    terms: dict[str, ModelTerms] | None = None,
    min_residency: float = 0.0,
    now: float = 100.0,
    demand: dict[str, float] | None = None,
) -> ResidencyFacts:
    loaded = loaded or {}
    terms = dict(terms or {})
    for model, rate in (demand or {}).items():
        terms[model] = dataclasses.replace(terms.get(model, ModelTerms()), demand=rate)
    return ResidencyFacts(
        handed=frozenset(sizes),
        workers=MappingProxyType(
            {
                url: WorkerMemory(
                    url,
                    budget,
                    {m: ResidentCopy(m, sizes[m], at) for m, at in loaded.get(url, {}).items()},
                )
                for url, budget in budgets.items()
            }
        ),
        weights=MappingProxyType(sizes),
        terms=MappingProxyType(terms),
        min_residency_seconds=min_residency,
        now=now,
    )


def used(assignment: dict[str, Placement] | object, sizes: dict[str, int], url: str) -> int:
    assert isinstance(assignment, MappingProxyType | dict)
    return sum(sizes[m] for m, p in assignment.items() if url in p.urls and m in sizes)


def test_sixteen_models_on_two_workers_that_hold_four_each() -> None:
    # Issue 49's case: the packer stacks eight on each; the fit keeps four per worker,
    # and the other eight are cold.
    sizes = {f"m{i:02d}": 100 for i in range(16)}
    target = {m: uniform([W[i % 2]]) for i, m in enumerate(sizes)}
    fit = fit_to_budgets(target, facts(sizes, {"w0": 400, "w1": 400}))
    for url in ("w0", "w1"):
        assert used(dict(fit.assignment), sizes, url) == 400
    assert len(fit.cold) == 8
    assert set(fit.cold) | set(fit.assignment) == set(sizes)


def test_the_valuable_stay_and_the_rest_go_cold() -> None:
    sizes = {"hot": 100, "warm": 100, "tail": 100}
    target = {m: uniform(["w0"]) for m in sizes}
    demand = {"hot": 50.0, "warm": 5.0, "tail": 0.1}
    fit = fit_to_budgets(target, facts(sizes, {"w0": 200}, demand=demand))
    assert set(fit.assignment) == {"hot", "warm"}
    assert fit.cold == ("tail",)


def test_a_model_pushed_off_its_worker_moves_where_room_is() -> None:
    sizes = {"a": 100, "b": 100, "c": 100}
    target = {m: uniform(["w0"]) for m in sizes}
    demand = {"a": 3.0, "b": 2.0, "c": 1.0}
    fit = fit_to_budgets(target, facts(sizes, {"w0": 200, "w1": 100}, demand=demand))
    assert fit.assignment["c"].urls == ("w1",)
    assert fit.cold == ()


def test_min_copies_and_young_copies_stay_whatever_their_value() -> None:
    sizes = {"floor": 100, "young": 100, "hot": 100}
    loaded = {"w0": {"floor": 0.0, "young": 95.0}}
    target = {m: uniform(["w0"]) for m in sizes}
    fit = fit_to_budgets(
        target,
        facts(
            sizes,
            {"w0": 200},
            loaded=loaded,
            terms={"floor": ModelTerms(min_copies=1)},
            min_residency=10.0,
            demand={"hot": 1000.0},
        ),
    )
    assert set(fit.assignment) == {"floor", "young"}
    assert fit.cold == ("hot",)


def test_min_copies_adds_copies_where_room_is_and_max_copies_trims() -> None:
    sizes = {"a": 100, "b": 100}
    target = {"a": uniform(["w0"]), "b": uniform(["w0", "w1", "w2"])}
    fit = fit_to_budgets(
        target,
        facts(
            sizes,
            dict.fromkeys(W, 300),
            terms={"a": ModelTerms(min_copies=2), "b": ModelTerms(max_copies=2)},
        ),
    )
    assert len(fit.assignment["a"]) == 2
    assert len(fit.assignment["b"]) == 2


def test_models_not_handed_and_workers_without_a_budget_are_left_alone() -> None:
    sizes = {"a": 100, "b": 100}
    target = {
        "a": uniform(["w0", "free"]),
        "b": uniform(["w0"]),
        "theirs": uniform(["w0"]),
    }
    fit = fit_to_budgets(target, facts(sizes, {"w0": 100}, demand={"a": 1.0}))
    assert fit.assignment["theirs"] == target["theirs"]
    assert fit.assignment["a"].urls == ("free", "w0")
    assert fit.cold == ("b",)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.dictionaries(
        st.sampled_from([f"m{i}" for i in range(12)]), st.integers(1, 5 * GB), min_size=1
    ),
    budgets=st.dictionaries(st.sampled_from(W), st.integers(1, 12 * GB), min_size=1),
    spread=st.lists(st.sets(st.sampled_from(W), min_size=1), min_size=12, max_size=12),
    demand=st.lists(st.floats(0, 100), min_size=12, max_size=12),
    floors=st.lists(st.integers(0, 2), min_size=12, max_size=12),
    caps=st.lists(st.one_of(st.none(), st.integers(1, 3)), min_size=12, max_size=12),
)
def test_no_budget_is_ever_exceeded(
    sizes: dict[str, int],
    budgets: dict[str, int],
    spread: list[set[str]],
    demand: list[float],
    floors: list[int],
    caps: list[int | None],
) -> None:
    models = sorted(sizes)
    target = {m: uniform(spread[i]) for i, m in enumerate(models)}
    terms = {
        m: ModelTerms(min_copies=min(floors[i], caps[i] or 9), max_copies=caps[i])
        for i, m in enumerate(models)
    }
    rates = {m: demand[i] for i, m in enumerate(models)}
    fit = fit_to_budgets(target, facts(sizes, budgets, terms=terms, demand=rates))
    placed = dict(fit.assignment)
    for url, budget in budgets.items():
        assert used(placed, sizes, url) <= budget
    # Every model is placed or cold, never both; caps hold on the budgeted workers.
    assert set(placed) | set(fit.cold) == set(models)
    assert not set(placed) & set(fit.cold)
    for model, placement in placed.items():
        cap = terms[model].max_copies
        budgeted = [u for u in placement.urls if u in budgets]
        assert cap is None or len(budgeted) <= max(cap, 1) or not budgeted
    # Deterministic.
    again = fit_to_budgets(target, facts(sizes, budgets, terms=terms, demand=rates))
    assert again == fit


def test_after_start_up_a_repack_loads_no_model_that_is_loaded_nowhere() -> None:
    """A model's first copy is loaded by a call (the cold path): a repack widens or
    keeps loaded models and tops up min_copies, but leaves the rest cold, room or not."""
    sizes = {"loaded": 100, "tail": 100, "floor": 100}
    target = {m: uniform(["w0", "w1"]) for m in sizes}
    terms = {"floor": ModelTerms(min_copies=1)}
    base = facts(sizes, {"w0": 1000, "w1": 1000}, loaded={"w0": {"loaded": 0.0}}, terms=terms)
    later = fit_to_budgets(target, dataclasses.replace(base, loads_cold=False))
    assert set(later.assignment) == {"loaded", "floor"}
    assert set(later.assignment["loaded"].urls) == {"w0", "w1"}  # widened
    assert later.cold == ("tail",)
    at_start = fit_to_budgets(target, base)
    assert set(at_start.assignment) == set(sizes) and not at_start.cold
