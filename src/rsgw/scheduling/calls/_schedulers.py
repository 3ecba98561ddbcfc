"""The replica choosers the request path calls, one per scheduling mode.

Each turns (model, replicas, request body) into a failover order and, for the
work-aware modes, a reservation to release when the call ends. "Select and
reserve" is one synchronous call with no `await`, so two requests can never both
see the same least-loaded replica. The pure decisions live in
`rsgw.scheduling`; this module only adapts them to the request path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeAlias

from rsgw.scheduling.calls._fill import FillReservation
from rsgw.scheduling.calls._meta import RoutingMeta
from rsgw.scheduling.calls._outstanding import LeastOutstanding, Reservation, charge_for
from rsgw.scheduling.calls._routing import RoundRobin, RoutingTable
from rsgw.scheduling.knobs._knobs import WorkBasis

#: What a scheduler's `select` hands out and takes back in `release`.
AnyReservation: TypeAlias = Reservation | FillReservation


class Scheduler(Protocol):
    """What GatewayService needs from a scheduling mode."""

    #: Whether the prober must poll ModelControlStatus for routing metadata.
    needs_routing_meta: bool

    def arrived(self, model: str) -> None:
        """A call for `model` reached the gateway, before admission.

        Demand is what clients offer, not what the replicas had room for: a packer
        that counted only admitted calls would see a saturated model as no busier
        than its replicas' caps, and never give it the replica it lacks.
        """

    def select(
        self, model: str, replicas: tuple[str, ...], body: bytes
    ) -> tuple[tuple[str, ...], AnyReservation | None]:
        """The failover order (chosen replica first) and the charge to release.

        `replicas` are the model's discovered replicas with room for another call
        (never empty). An empty order sheds the call.
        """

    def release(self, reservation: AnyReservation | None) -> None: ...

    def table_swapped(self, table: RoutingTable) -> None: ...

    def meta_refreshed(self, meta: RoutingMeta) -> None: ...


class RoundRobinScheduler:
    """Uniform rotation; tracks no load, polls nothing."""

    needs_routing_meta = False

    def __init__(self) -> None:
        self._rr = RoundRobin()

    def arrived(self, model: str) -> None:
        pass

    def select(
        self, model: str, replicas: tuple[str, ...], body: bytes
    ) -> tuple[tuple[str, ...], Reservation | None]:
        return self._rr.select(model, replicas), None

    def release(self, reservation: AnyReservation | None) -> None:
        pass

    def table_swapped(self, table: RoutingTable) -> None:
        self._rr.forget_missing(table)

    def meta_refreshed(self, meta: RoutingMeta) -> None:
        pass


class LeastOutstandingScheduler:
    """Sends each request to the replica carrying the least in-flight work.

    Work is denominated by `work_basis` (fixed at startup in this mode): requests
    (a count; the body is never read), items (the request's extent along its
    model's batch axis), or compute (items times the model's measured cost per
    item). The last two read routing metadata, which the prober refreshes every
    round and hands over as an immutable snapshot.
    """

    def __init__(self, basis: WorkBasis) -> None:
        self._core = LeastOutstanding(basis)
        self.basis = basis
        self.needs_routing_meta = basis is not WorkBasis.REQUESTS
        self._meta = RoutingMeta()

    def arrived(self, model: str) -> None:
        pass

    def select(
        self, model: str, replicas: tuple[str, ...], body: bytes
    ) -> tuple[tuple[str, ...], Reservation | None]:
        if self.basis is WorkBasis.REQUESTS:
            charge = 1.0
        else:
            meta = self._meta
            charge = charge_for(self.basis, meta.request_items(model, body), meta.item_cost(model))
        return self._core.select(model, replicas, charge)

    def release(self, reservation: AnyReservation | None) -> None:
        if isinstance(reservation, Reservation):
            self._core.release(reservation)

    def table_swapped(self, table: RoutingTable) -> None:
        present = {url for urls in table.models.values() for url in urls}
        self._core.forget(present)

    def meta_refreshed(self, meta: RoutingMeta) -> None:
        self._meta = meta

    def loads(self) -> Mapping[str, float]:
        """Live per-worker in-flight work, in `basis` units (for the metrics)."""
        return self._core.loads()
