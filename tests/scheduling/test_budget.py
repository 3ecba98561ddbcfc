"""The retry budget: a reserve for bursts, a share of calls in the long run."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rsgw.scheduling.calls._budget import RetryBudget


def test_a_quiet_gateway_can_still_fail_over_a_burst() -> None:
    budget = RetryBudget(ratio=0.2, reserve=16)
    assert all(budget.withdraw() for _ in range(16))
    assert not budget.withdraw()
    assert (budget.spent, budget.refused) == (16, 1)


def test_calls_earn_retries_at_the_ratio() -> None:
    budget = RetryBudget(ratio=0.25, reserve=0)
    for _ in range(40):
        budget.deposit()
    assert sum(budget.withdraw() for _ in range(20)) == 10


def test_savings_are_capped() -> None:
    budget = RetryBudget(ratio=1.0, reserve=4)
    for _ in range(1000):
        budget.deposit()
    assert budget.tokens == budget.cap == 40


@given(st.lists(st.booleans(), max_size=400))
def test_retries_never_exceed_reserve_plus_ratio_of_calls(steps: list[bool]) -> None:
    budget = RetryBudget(ratio=0.2, reserve=8)
    calls = 0
    for is_call in steps:
        if is_call:
            budget.deposit()
            calls += 1
        else:
            budget.withdraw()
    assert budget.spent <= 8 + 0.2 * calls + 1e-9
