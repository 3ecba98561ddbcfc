"""least_outstanding: send each request to the replica carrying the least in-flight work.

Pure: no trio, no sockets, no logging, no clock. "Select and reserve" is one
synchronous call, so no other request can slip in between reading the loads and
charging the winner; the shell awaits only after it returns, and releases the
reservation in a `finally` once the call is over (docs/original.md §4.2).

Theory of operation
-------------------

Each worker URL has a float load: the sum of the charges of the requests it holds in
flight, in the fleet's work basis (`charge_for`). Invariants:

* A URL gets a counter the first time it is a candidate, chosen or not, so the
  `gateway_worker_inflight_work` gauge shows every candidate (0 when idle).
* Loads are compared quantized, `round(load * 1e9)` (nanoseconds of GPU time under
  `compute`), so float noise left by earlier charges cannot decide between replicas.
* Exact ties rotate (docs/product.md §3.13) instead of always taking the smallest URL:
  the winner is the first tied replica after the model's previous winner, in the
  cyclic order of the replicas as given. Rotating the given order (the shell may pass
  a round-robin pick) does not change that cyclic order. Over a fixed set of tied
  replicas this is exact round robin, so an idle fleet is still spread evenly.
* Each reservation is released at most once; a second release is a no-op, so a
  `finally` and an error path may both release without double-counting.
* A load settles to exactly 0.0 whenever |load| * 1e9 < 1, and whenever its URL holds
  no reservation at all. The second rule goes beyond the original: float rounding after
  many interleaved charges of different sizes can leave more than a nanosecond of
  residue, and the gauge must read exactly 0 after every run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from rsgw.scheduling.knobs._knobs import WorkBasis

#: Load quantum: one nanosecond of GPU time under `compute` (docs/original.md §4.8).
LOAD_QUANTUM: Final = 1e9


def charge_for(basis: WorkBasis, units: int, item_cost: float) -> float:
    """What one request charges its replica's load.

    Args:
        basis: the fleet's work basis.
        units: the request's item count (`RoutingMeta.request_items`); values below
            1 count as 1, so no request is free.
        item_cost: the model's compute-seconds per item (`RoutingMeta.item_cost`,
            never 0); used only under `compute`.

    Raises:
        ValueError: `basis` is not a `WorkBasis`.
    """
    basis = WorkBasis(basis)
    if basis is WorkBasis.REQUESTS:
        return 1.0
    units = max(units, 1)
    if basis is WorkBasis.ITEMS:
        return float(units)
    return units * item_cost


def load_key(load: float) -> int:
    """A load quantized for comparison (ties-to-even, as the original's Julia `round`)."""
    return round(load * LOAD_QUANTUM)


def settle(load: float) -> float:
    """Exactly 0.0 for a residue under one quantum, else `load` unchanged."""
    return 0.0 if abs(load) * LOAD_QUANTUM < 1 else load


@dataclass(eq=False, slots=True)
class Reservation:
    """One request's charge on one worker, returned by `select`, given to `release`.

    Compared by identity: two requests with the same charge on the same worker are two
    reservations.
    """

    url: str
    charge: float
    released: bool = field(default=False, init=False)


class LeastOutstanding:
    """Per-URL in-flight load counters and the least-loaded choice.

    Args:
        basis: the work basis, fixed at startup for this mode (the shell charges with
            `charge_for(selector.basis, ...)`).

    Raises:
        ValueError: `basis` is not a work basis.
    """

    def __init__(self, basis: WorkBasis | str) -> None:
        self._basis = WorkBasis(basis)
        self._loads: dict[str, float] = {}
        self._held: dict[str, int] = {}  # URL -> reservations not yet released
        self._last: dict[str, str] = {}  # model -> its previous winner

    @property
    def basis(self) -> WorkBasis:
        return self._basis

    @property
    def needs_routing_meta(self) -> bool:
        """Whether the prober must poll ModelControlStatus (`requests` reads nothing)."""
        return self._basis is not WorkBasis.REQUESTS

    def select(
        self, model: str, replicas: Sequence[str], charge: float
    ) -> tuple[tuple[str, ...], Reservation]:
        """Choose the least-loaded replica and charge it, in one step.

        Args:
            model: the model; exact ties rotate per model.
            replicas: the candidate URLs, in failover order (non-empty, no duplicates).
            charge: this request's work (`charge_for`).

        Returns:
            `(order, reservation)`: the chosen URL followed by the other replicas in
            the given order, and the reservation to `release` once the call ends.

        Raises:
            ValueError: `replicas` is empty (the caller answers UNAVAILABLE first).
        """
        if not replicas:
            raise ValueError(f"no replicas to choose from for model {model!r}")
        for url in replicas:
            self._loads.setdefault(url, 0.0)
        keys = [load_key(self._loads[url]) for url in replicas]
        least = min(keys)
        last = self._last.get(model, "")
        start = replicas.index(last) + 1 if last in replicas else 0
        n = len(replicas)
        chosen = next(replicas[i % n] for i in range(start, start + n) if keys[i % n] == least)
        self._last[model] = chosen
        self._loads[chosen] += charge
        self._held[chosen] = self._held.get(chosen, 0) + 1
        order = (chosen, *(url for url in replicas if url != chosen))
        return order, Reservation(chosen, charge)

    def release(self, reservation: Reservation) -> None:
        """Give the reservation's charge back; a second release does nothing."""
        if reservation.released:
            return
        reservation.released = True
        url = reservation.url
        held = self._held.get(url, 0) - 1
        if held <= 0:
            self._held.pop(url, None)
            self._loads[url] = 0.0
        else:
            self._held[url] = held
            self._loads[url] = settle(self._loads.get(url, 0.0) - reservation.charge)

    def loads(self) -> Mapping[str, float]:
        """A snapshot of every counter, for the `gateway_worker_inflight_work` gauge."""
        return MappingProxyType(dict(self._loads))

    def forget(self, urls_still_present: Iterable[str]) -> None:
        """Drop the counters of URLs that are no longer candidates (bounded state).

        A URL that still holds reservations keeps its counter until they are
        released, so a late `release` always finds it and the gauge still shows the
        work in flight.
        """
        keep = set(urls_still_present)
        for url in [u for u in self._loads if u not in keep and u not in self._held]:
            del self._loads[url]
        for model in [m for m, url in self._last.items() if url not in self._loads]:
            del self._last[model]
