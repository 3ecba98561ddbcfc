"""Fair sharing of the device between models: weights and recent compute.

Pure: no Trio, no clock of its own (the shell passes `now`), no logging.

Theory of operation (docs/original.md §8.3, the `fair` discipline). Each model has a
weight (SetModelPolicy, default 1.0) and a decayed EMA of the device seconds it
used recently (halflife 30 s of wall time). When the device is free, each model
with queued work gets a priority

    clamp(share - recent_share, -cap, cap) / effective_cost

where `share` is its weight over the sum of weights and `recent_share` its EMA
over the sum of EMAs (0 when that sum is 0), and the highest priority runs. A
model below its share gains priority, one above it loses it; at equilibrium
every backlogged model's recent share equals its weight share, so compute splits
in the ratio of the weights. The cap keeps one long-idle model from starving
the others while it catches up. Dividing by the cost favours the cheaper
dispatch when two models are equally far below their share (more of the
deficit is repaid per second of device time).

Both sums run over the models *competing for this dispatch* (those with queued
requests), not over every model the worker knows. Over every model, an idle
model's weight would shrink the busy ones' shares and an idle model's decaying
EMA would shrink their recent shares, and the equilibrium would no longer be
the ratio of the weights (3:1 weights would split about 4:1 or 1.5:1 depending
on what sat idle). Among the competitors the equilibrium is exact.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rsgw.base._errors import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Mapping

#: The halflife of the recent-compute EMA, in seconds of wall time (the
#: original's `ema_halflife_seconds`).
DEFAULT_HALFLIFE_SECONDS = 30.0
#: How far a model's priority may lean on its deficit or surplus (the
#: original's `recency_penalty_cap`).
DEFAULT_RECENCY_PENALTY_CAP = 0.25
#: A dispatch that coalesces several requests counts as this much cheaper (the
#: original's `coalescing_discount`).
DEFAULT_COALESCING_DISCOUNT = 0.1
#: A model's weight until SetModelPolicy sets one.
DEFAULT_WEIGHT = 1.0


class FairShare:
    """Weights and decayed recent compute per model; ranks the models competing for a dispatch."""

    def __init__(
        self,
        *,
        halflife_seconds: float = DEFAULT_HALFLIFE_SECONDS,
        recency_penalty_cap: float = DEFAULT_RECENCY_PENALTY_CAP,
        coalescing_discount: float = DEFAULT_COALESCING_DISCOUNT,
    ) -> None:
        if not halflife_seconds > 0:
            raise ValueError(f"halflife_seconds must be > 0, got {halflife_seconds}")
        self.halflife_seconds = halflife_seconds
        self.recency_penalty_cap = recency_penalty_cap
        self.coalescing_discount = coalescing_discount
        self._weights: dict[str, float] = {}
        self._emas: dict[str, float] = {}
        # Every EMA is held decayed to this instant; advancing it decays all at once.
        self._at = -math.inf

    def weight(self, model: str) -> float:
        return self._weights.get(model, DEFAULT_WEIGHT)

    def set_weight(self, model: str, weight: float) -> None:
        """Set `model`'s fair weight.

        Raises:
            InvalidRequest: `weight` is not a finite number > 0 (a zero weight
                would never be chosen while anything else waits; a negative one
                inverts the ranking).
        """
        if not (math.isfinite(weight) and weight > 0):
            raise InvalidRequest(f"weight must be a finite number > 0, got {weight}")
        self._weights[model] = weight

    def _advance(self, now: float) -> None:
        if now <= self._at:
            return
        if self._emas and math.isfinite(self._at):
            factor = 0.5 ** ((now - self._at) / self.halflife_seconds)
            for model in self._emas:
                self._emas[model] *= factor
        self._at = now

    def record(self, model: str, seconds: float, now: float) -> None:
        """Count `seconds` of device time used by `model`, finishing at `now`."""
        self._advance(now)
        self._emas[model] = self._emas.get(model, 0.0) + seconds

    def recent(self, model: str, now: float) -> float:
        """`model`'s decayed recent compute at `now`, in seconds."""
        self._advance(now)
        return self._emas.get(model, 0.0)

    def effective_cost(self, cost: float, requests: int) -> float:
        """The cost a priority divides by: discounted when the dispatch coalesces.

        The spec multiplies every cost by (1 - discount); a factor common to
        every model changes no decision, so we read it as a reward for
        coalescing and apply it only to dispatches of more than one request.
        """
        if requests > 1:
            return cost * (1.0 - self.coalescing_discount)
        return cost

    def priorities(self, costs: Mapping[str, float], now: float) -> dict[str, float]:
        """Each competing model's priority (higher runs first).

        Args:
            costs: the effective cost of each competing model's planned batch,
                in seconds (> 0).
            now: the shell's clock, for the EMA decay.
        """
        self._advance(now)
        total_weight = sum(self.weight(m) for m in costs)
        total_ema = sum(self._emas.get(m, 0.0) for m in costs)
        cap = self.recency_penalty_cap
        result: dict[str, float] = {}
        for model, cost in costs.items():
            share = self.weight(model) / total_weight
            recent = self._emas.get(model, 0.0) / total_ema if total_ema > 0 else 0.0
            lean = min(max(share - recent, -cap), cap)
            result[model] = lean / max(cost, 1e-9)
        return result
