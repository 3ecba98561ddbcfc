"""What a dispatch costs: the learned per-batch-size cost of each model.

Pure: no Trio, no clock, no logging. The dispatch loop records what each batch
took; the scheduler asks what a planned batch will take, to rank models under
`fair` and to drop requests that cannot make their deadline under `edf`
(docs/original.md §8.3).

Why learn a cost at all when the simulated device's cost model is known? The
scheduler must not read the cost model: a real worker cannot, and a scheduler
that peeks would behave better than the one it stands in for. It sees only
what batches took, exactly as the original does: an EWMA per batch size,
initialised to the first measurement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

#: The EWMA weight of a new measurement (the original's `cost_ema_alpha`).
DEFAULT_COST_ALPHA = 0.2
#: What a model that has never run is assumed to cost per dispatch, in seconds
#: (the original's default; a small model's launch on a GPU is of this order).
DEFAULT_COST_SECONDS = 0.01


class LearnedCosts:
    """Per model and batch size, an EWMA of measured dispatch seconds.

    Batch sizes are rows (the simulated device runs exactly the rows it is
    given, with no padding to compiled sizes). A size never measured borrows
    the nearest size that was: a batch of 7 rows is better predicted by the
    8-row batches that ran than by a flat default. Equally near sizes resolve
    to the larger, the more pessimistic guess.
    """

    def __init__(self, alpha: float = DEFAULT_COST_ALPHA) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self._costs: dict[str, dict[int, float]] = {}

    def record(self, model: str, rows: int, seconds: float) -> None:
        """Fold one measured dispatch into the model's cost for `rows`."""
        sizes = self._costs.setdefault(model, {})
        old = sizes.get(rows)
        sizes[rows] = seconds if old is None else old + self.alpha * (seconds - old)

    def learned(self, model: str, rows: int) -> float | None:
        """The learned cost of a `rows`-row dispatch, or None if `model` never ran."""
        sizes = self._costs.get(model)
        if not sizes:
            return None
        exact = sizes.get(rows)
        if exact is not None:
            return exact
        nearest = min(sizes, key=lambda size: (abs(size - rows), -size))
        return sizes[nearest]

    def estimate(self, model: str, rows: int, default: float = DEFAULT_COST_SECONDS) -> float:
        """The learned cost, or `default` for a model that never ran."""
        cost = self.learned(model, rows)
        return default if cost is None else cost

    def snapshot(self) -> Mapping[str, Mapping[int, float]]:
        """A copy of every learned cost, by model and batch size (tests, debugging)."""
        return {model: dict(sizes) for model, sizes in self._costs.items()}
