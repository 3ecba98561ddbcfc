"""`LogBudget`: a storm of one kind of line becomes a few lines and a count."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsgw.runtime._log_budget import MAX_KINDS, LogBudget


def test_a_storm_is_cut_to_the_burst_and_the_next_line_counts_the_rest() -> None:
    budget = LogBudget(burst=3, seconds=10.0)
    taken = [budget.take("worker error", 0.1 * i) for i in range(50)]
    assert taken[:3] == [0, 0, 0]
    assert taken[3:] == [None] * 47
    assert budget.take("worker error", 10.0) == 47  # a new window: the count comes with it
    assert budget.take("other", 10.0) == 0  # kinds are independent


def test_distinct_kinds_cannot_grow_the_table() -> None:
    budget = LogBudget()
    for i in range(MAX_KINDS * 3):
        budget.take(("model", i), 0.0)
    assert len(budget._kinds) == MAX_KINDS


@given(st.lists(st.floats(0, 100), max_size=200), st.integers(1, 5))
def test_never_more_than_the_burst_per_window(times: list[float], burst: int) -> None:
    budget = LogBudget(burst=burst, seconds=10.0)
    let_through = [t for t in sorted(times) if budget.take("k", t) is not None]
    suppressed = len(times) - len(let_through)
    assert suppressed >= 0
    windows: dict[int, int] = {}
    start = None
    for t in let_through:
        if start is None or t - start >= 10.0:
            start = t
        windows[int(start * 1000)] = windows.get(int(start * 1000), 0) + 1
    assert all(n <= burst for n in windows.values())
