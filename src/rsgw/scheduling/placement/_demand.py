"""Each model's demand for residency: its calls, counted with an exponential decay.

Pure: no Trio, no clock (the caller passes `now`). Issue 49 values a resident copy by
its model's demand. The packer's arrival-rate EWMA cannot be that demand: it is
folded only at repacks, on the compute clock, and only for models called since the
last one, so a tail model called once keeps the rate of that one call (one call in a
5 s window reads 0.2 calls per second) until it is called again. Under a long tail
every model called once looked as valuable as the middle of the distribution, and
keeping by value did no better than least-recently-used.

Here every call counts one, and every count decays by half each `halflife` seconds,
for every model at once, called or not: a decayed count is a frequency with aging
(the LFU family of cache policies, which beats LRU when popularity is stable and
still follows it when it shifts). The rate is the decayed count scaled back to calls
per second (`ln 2 / halflife`), corrected for a meter younger than its half-life
(the correction is the same for every model, so it never favours a newcomer).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: A decayed count below this is forgotten (bounds the map to the models called lately).
FORGET_BELOW = 1e-3


class DecayedDemand:
    """Calls per second per model, from decayed call counts (see the module docstring).

    `count` is cheap (one dict update) and does not read the clock; the decay is
    applied when `rates` is read, to every model at once.
    """

    __slots__ = ("_halflife", "_pending", "_scores", "_since", "_started")

    def __init__(self, halflife: float, now: float | None = None) -> None:
        """`now`: when counting starts (None: at the first read; calls counted before
        it count as arriving then)."""
        if not halflife > 0:
            raise ValueError(f"halflife must be > 0, got {halflife!r}")
        self._halflife = halflife
        self._started = now
        self._since = now
        self._scores: dict[str, float] = {}
        self._pending: dict[str, int] = {}

    @property
    def halflife(self) -> float:
        return self._halflife

    def count(self, model: str, calls: int = 1) -> None:
        """`calls` calls for `model` arrived (folded at the next `rates`)."""
        self._pending[model] = self._pending.get(model, 0) + calls

    def rates(self, now: float) -> dict[str, float]:
        """model -> calls per second, as of `now` (a `now` before the last read is taken
        as the last read: the counts never grow back)."""
        if self._started is None or self._since is None:
            self._started = self._since = now
        self._fold(now)
        age = self._since - self._started
        seen = 1.0 - math.pow(2.0, -age / self._halflife) if age > 0 else 0.0
        # A meter younger than about a second has seen too little to scale up: read it
        # as a second old (a call in its first instant is not infinitely many per second).
        seen = max(seen, 1.0 - math.pow(2.0, -1.0 / self._halflife))
        scale = math.log(2.0) / self._halflife / seen
        return {model: score * scale for model, score in self._scores.items()}

    def _fold(self, now: float) -> None:
        assert self._since is not None
        elapsed = now - self._since
        if elapsed > 0:
            decay = math.pow(2.0, -elapsed / self._halflife)
            self._scores = {
                model: score * decay
                for model, score in self._scores.items()
                if score * decay >= FORGET_BELOW
            }
            self._since = now
        for model, calls in self._pending.items():
            self._scores[model] = self._scores.get(model, 0.0) + calls
        self._pending = {}

    def snapshot(self) -> Mapping[str, float]:
        """The decayed counts as of the last read (for tests and status)."""
        return dict(self._scores)
