"""The retry budget: failover may add at most a fixed share of calls to the fleet's load.

Pure. Failover sends a call that surely did not run to another replica. That is
what keeps a killed or hung worker from costing calls, and also what turns a
fleet-wide fault (every worker refusing) into a retry storm that doubles the load
exactly when the fleet can least take it. As in Envoy and Finagle, retries draw
from a budget: every call deposits `ratio` of a retry (capped), every retry
withdraws one, and a `reserve` lets a quiet gateway still fail over a burst (a
worker dying with its calls in flight). A retry the budget cannot pay for is not
made: the call ends with the failure it has.
"""

from __future__ import annotations

#: Retries allowed per call, in the long run.
DEFAULT_RATIO = 0.2
#: Retries always available after a quiet spell (more than a worker's calls in flight).
DEFAULT_RESERVE = 64.0


class RetryBudget:
    """Tokens for failover retries; see the module docstring."""

    __slots__ = ("cap", "ratio", "refused", "reserve", "spent", "tokens")

    def __init__(self, ratio: float = DEFAULT_RATIO, reserve: float = DEFAULT_RESERVE) -> None:
        self.ratio = ratio
        self.reserve = reserve
        #: The most tokens ever held: ten reserves' worth (at least ten retries).
        self.cap = max(reserve, 1.0) * 10
        self.tokens = reserve
        #: Retries made, and retries refused for want of budget.
        self.spent = 0
        self.refused = 0

    def deposit(self) -> None:
        """A call was admitted: it earns `ratio` of a retry."""
        tokens = self.tokens + self.ratio
        self.tokens = tokens if tokens < self.cap else self.cap

    def withdraw(self) -> bool:
        """Pay for one retry; False (and counted) if the budget cannot."""
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            self.spent += 1
            return True
        self.refused += 1
        return False
