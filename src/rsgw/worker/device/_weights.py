"""Which models' weights are on the simulated device: pins and an LRU of on-demand loads.

Pure: no Trio, no clock of its own (the shell passes `now`), no logging. The
shell asks for a decision (`load`, `pin`, `unpin`, `free_unpinned`), applies the
time it costs, and counts what the returned `Load` says happened.

Theory of operation (docs/original.md §8.4). Every model has a residency *floor*:

- PINNED_DEVICE: always on the device, loaded at start or when pinned; exempt
  from the budget and never evicted.
- PINNED_SYSTEM: a host copy; loaded on the device on demand (the default of a
  self-managed worker with a weight cache).
- UNPINNED: no host copy; what an externally managed worker's models are until
  the control plane pins them.

On-demand residents live in an LRU bounded by `max_bytes`. Loading a model
evicts least-recently-used on-demand residents until it fits; a model larger
than the whole budget evicts everything and loads anyway (the caller warns),
since refusing would make the model unservable on this worker. Pinned bytes are
accounted separately and never count against the budget.

Invariants:
- A model is in at most one of `_pinned` and `_lru`; `pinned_bytes` and
  `resident_bytes` are the sums of their weights.
- `resident_bytes <= max_bytes` after every `load`, unless that load was of a
  single model larger than `max_bytes` (then it is the only on-demand resident).
- A model in `_pinned` has floor PINNED_DEVICE and vice versa.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


class Residency(enum.IntEnum):
    """A model's residency floor, ordered from least to most resident.

    The values are the wire values of `reactant_control.Residency`, and the
    order lets a meta report the least resident of its sub-models with `min`.
    """

    UNPINNED = 1
    PINNED_SYSTEM = 2
    PINNED_DEVICE = 3


class ResidencyMode(enum.Enum):
    """Who decides what is on the device."""

    # The worker loads on demand and evicts by LRU; every model is servable.
    SELF_MANAGED = "self_managed"
    # The control plane pins and unpins (SetModelResidency); only pinned models
    # are servable, and the worker never loads on its own.
    EXTERNALLY_MANAGED = "externally_managed"


@dataclass(frozen=True, slots=True)
class Load:
    """A load the shell must now pay for: `nbytes` of `model`, after evicting `evicted`."""

    model: str
    nbytes: int
    evicted: tuple[str, ...] = ()
    #: The model alone exceeds the budget; it was loaded after evicting everything.
    over_budget: bool = False


class WeightCache:
    """Device weights: pinned models plus an LRU of on-demand residents.

    Args:
        sizes: every model's weight bytes.
        max_bytes: the on-demand budget (pinned models are exempt).
        floors: each model's initial floor; PINNED_DEVICE models start
            resident (loaded with the worker, at no simulated cost). Models
            absent from `floors` start at PINNED_SYSTEM.
    """

    def __init__(
        self, sizes: Mapping[str, int], max_bytes: int, floors: Mapping[str, Residency]
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.sizes = dict(sizes)
        self.max_bytes = max_bytes
        self._floors = {m: floors.get(m, Residency.PINNED_SYSTEM) for m in self.sizes}
        self._pinned = {m for m, f in self._floors.items() if f is Residency.PINNED_DEVICE}
        # On-demand residents -> (last use, tie-breaking sequence).
        self._lru: dict[str, tuple[float, int]] = {}
        self._tick = itertools.count()
        self.pinned_bytes = sum(self.sizes[m] for m in self._pinned)
        self.resident_bytes = 0

    def floor(self, model: str) -> Residency:
        return self._floors[model]

    def is_pinned(self, model: str) -> bool:
        return model in self._pinned

    def is_resident(self, model: str) -> bool:
        """Whether `model`'s weights are on the device now."""
        return model in self._pinned or model in self._lru

    def resident_models(self) -> Iterable[str]:
        """Every model on the device, pinned first, then on-demand from least recently used."""
        yield from sorted(self._pinned)
        yield from sorted(self._lru, key=self._lru.__getitem__)

    def touch(self, model: str, now: float) -> None:
        """Mark an on-demand resident as just used (most recently used)."""
        if model in self._lru:
            self._lru[model] = (now, next(self._tick))

    def load(self, model: str, now: float) -> Load | None:
        """Make `model` resident for a dispatch at `now`.

        Returns None when it already is (and bumps it to most recently used);
        otherwise the `Load` to pay for, whose evictions have already happened.
        """
        if self.is_resident(model):
            self.touch(model, now)
            return None
        need = self.sizes[model]
        evicted: list[str] = []
        while self._lru and self.resident_bytes + need > self.max_bytes:
            victim = min(self._lru, key=self._lru.__getitem__)
            self._drop(victim)
            evicted.append(victim)
        self._lru[model] = (now, next(self._tick))
        self.resident_bytes += need
        return Load(model, need, tuple(evicted), over_budget=need > self.max_bytes)

    def pin(self, model: str) -> Load | None:
        """Pin `model` on the device (floor PINNED_DEVICE).

        Returns the `Load` to pay for, or None when its weights were already on
        the device (an on-demand resident is promoted in place). Pinned models
        are exempt from the budget, so pinning never evicts.
        """
        self._floors[model] = Residency.PINNED_DEVICE
        if model in self._pinned:
            return None
        self._pinned.add(model)
        self.pinned_bytes += self.sizes[model]
        if model in self._lru:
            del self._lru[model]
            self.resident_bytes -= self.sizes[model]
            return None
        return Load(model, self.sizes[model])

    def unpin(self, model: str, floor: Residency) -> bool:
        """Lower `model`'s floor to `floor` and free its device weights.

        Returns whether device weights were freed.
        """
        if floor is Residency.PINNED_DEVICE:
            raise ValueError("unpin needs a floor below PINNED_DEVICE")
        self._floors[model] = floor
        if model in self._pinned:
            self._pinned.discard(model)
            self.pinned_bytes -= self.sizes[model]
            return True
        if model in self._lru:
            self._drop(model)
            return True
        return False

    def free_unpinned(self) -> tuple[str, ...]:
        """Free every on-demand resident (compaction); pinned models stay. Returns the freed."""
        freed = tuple(sorted(self._lru, key=self._lru.__getitem__))
        self._lru.clear()
        self.resident_bytes = 0
        return freed

    def _drop(self, model: str) -> None:
        del self._lru[model]
        self.resident_bytes -= self.sizes[model]
