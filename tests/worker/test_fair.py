"""Fair sharing: weights, the decayed compute EMA, and the priority formula."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._errors import InvalidRequest
from rsgw.worker.device._fair import DEFAULT_WEIGHT, FairShare


def test_weights_default_to_one_and_must_be_positive() -> None:
    fair = FairShare()
    assert fair.weight("m") == DEFAULT_WEIGHT == 1.0
    fair.set_weight("m", 3.0)
    assert fair.weight("m") == 3.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(InvalidRequest, match="weight must be a finite number > 0"):
            fair.set_weight("m", bad)
    assert fair.weight("m") == 3.0


def test_recent_compute_halves_every_halflife() -> None:
    fair = FairShare(halflife_seconds=30.0)
    fair.record("m", 8.0, now=100.0)
    assert fair.recent("m", now=100.0) == 8.0
    assert fair.recent("m", now=130.0) == pytest.approx(4.0)
    fair.record("m", 1.0, now=160.0)
    assert fair.recent("m", now=160.0) == pytest.approx(3.0)


def test_priority_is_the_clamped_deficit_over_cost() -> None:
    fair = FairShare(recency_penalty_cap=0.25)
    fair.set_weight("a", 3.0)
    # Nothing ran yet: recent shares are 0, so a's deficit 0.75 is capped at 0.25.
    assert fair.priorities({"a": 0.01, "b": 0.01}, now=0.0) == pytest.approx({"a": 25.0, "b": 25.0})
    fair.record("a", 1.0, now=0.0)
    # a has all the recent compute: 0.75 - 1 = -0.25; b: 0.25 - 0 = 0.25.
    assert fair.priorities({"a": 0.01, "b": 0.02}, now=0.0) == pytest.approx(
        {"a": -25.0, "b": 12.5}
    )


def test_only_the_competing_models_share() -> None:
    fair = FairShare()
    fair.set_weight("idle", 100.0)
    fair.record("idle", 50.0, now=0.0)
    fair.record("a", 1.0, now=0.0)
    fair.record("b", 1.0, now=0.0)
    # Neither idle's weight nor its compute moves a and b off their even split.
    assert fair.priorities({"a": 0.01, "b": 0.01}, now=0.0) == pytest.approx({"a": 0, "b": 0})


def test_coalescing_is_discounted() -> None:
    fair = FairShare(coalescing_discount=0.1)
    assert fair.effective_cost(0.02, requests=1) == 0.02
    assert fair.effective_cost(0.02, requests=2) == pytest.approx(0.018)


def _simulate(
    weights: dict[str, float], costs: dict[str, float], dispatches: int
) -> dict[str, float]:
    """Every model always backlogged; run the highest priority each time."""
    fair = FairShare()
    for model, weight in weights.items():
        fair.set_weight(model, weight)
    used = dict.fromkeys(weights, 0.0)
    now = 0.0
    for _ in range(dispatches):
        priority = fair.priorities(costs, now)
        model = max(sorted(costs), key=lambda m: priority[m])
        now += costs[model]
        fair.record(model, costs[model], now)
        used[model] += costs[model]
    total = sum(used.values())
    return {m: u / total for m, u in used.items()}


@pytest.mark.parametrize(
    ("weights", "costs"),
    [
        ({"a": 3.0, "b": 1.0}, {"a": 0.01, "b": 0.01}),
        ({"a": 3.0, "b": 1.0}, {"a": 0.004, "b": 0.02}),
        ({"a": 1.0, "b": 1.0, "c": 2.0}, {"a": 0.01, "b": 0.03, "c": 0.005}),
    ],
)
def test_backlogged_models_split_compute_by_weight(
    weights: dict[str, float], costs: dict[str, float]
) -> None:
    split = _simulate(weights, costs, dispatches=2000)
    total = sum(weights.values())
    for model, weight in weights.items():
        assert split[model] == pytest.approx(weight / total, abs=0.02)


@given(
    st.dictionaries(st.sampled_from("abcd"), st.floats(0.1, 10), min_size=1, max_size=4),
    st.dictionaries(st.sampled_from("abcd"), st.floats(0, 100)),
)
def test_priorities_stay_within_the_cap(
    weights: dict[str, float], recent: dict[str, float]
) -> None:
    fair = FairShare(recency_penalty_cap=0.25)
    for model, weight in weights.items():
        fair.set_weight(model, weight)
    for model, seconds in recent.items():
        fair.record(model, seconds, now=0.0)
    cost = 0.01
    priorities = fair.priorities(dict.fromkeys(weights, cost), now=1.0)
    assert set(priorities) == set(weights)
    for value in priorities.values():
        assert -0.25 / cost - 1e-9 <= value <= 0.25 / cost + 1e-9
