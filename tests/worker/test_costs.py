"""The learned per-batch-size dispatch cost (an EWMA per model and size)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.worker.device._costs import DEFAULT_COST_SECONDS, LearnedCosts


def test_first_measurement_is_adopted() -> None:
    costs = LearnedCosts()
    assert costs.learned("m", 4) is None
    assert costs.estimate("m", 4) == DEFAULT_COST_SECONDS
    costs.record("m", 4, 0.5)
    assert costs.learned("m", 4) == 0.5


def test_later_measurements_move_it_by_alpha() -> None:
    costs = LearnedCosts(alpha=0.2)
    costs.record("m", 4, 1.0)
    costs.record("m", 4, 2.0)
    assert costs.learned("m", 4) == pytest.approx(1.2)
    costs.record("m", 4, 2.0)
    assert costs.learned("m", 4) == pytest.approx(1.36)


def test_sizes_and_models_are_separate() -> None:
    costs = LearnedCosts()
    costs.record("m", 1, 0.1)
    costs.record("m", 8, 0.8)
    costs.record("n", 1, 5.0)
    assert costs.snapshot() == {"m": {1: 0.1, 8: 0.8}, "n": {1: 5.0}}


@pytest.mark.parametrize(
    ("rows", "expected"),
    [(1, 0.1), (3, 0.1), (5, 0.8), (6, 0.8), (100, 0.8)],
)
def test_an_unseen_size_borrows_the_nearest(rows: int, expected: float) -> None:
    costs = LearnedCosts()
    costs.record("m", 2, 0.1)
    costs.record("m", 6, 0.8)
    # 4 is as near to 2 as to 6: the larger, more pessimistic size wins.
    assert costs.learned("m", 4) == 0.8
    assert costs.learned("m", rows) == expected


def test_alpha_is_checked() -> None:
    with pytest.raises(ValueError, match="alpha"):
        LearnedCosts(alpha=0)


@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=50))
def test_the_ewma_stays_within_the_samples(samples: list[float]) -> None:
    costs = LearnedCosts()
    for seconds in samples:
        costs.record("m", 1, seconds)
    learned = costs.learned("m", 1)
    assert learned is not None
    assert min(samples) - 1e-9 <= learned <= max(samples) + 1e-9
