"""The gateway's books: every call it holds, counted once.

Pure. A call the gateway admits takes a `Ticket`. While it runs, the ticket may
carry a scheduler reservation (the work charged to its replica) and a worker it
is held for (sent, or queued at that worker's register gate or stream cap). The
three things the gateway limits are read off these books: calls admitted against
the gateway-wide cap, calls held per worker against the per-worker share, and
the scheduler's per-replica load. Closing a ticket settles all three exactly
once, so no failure path can leak a slot or double-release a reservation.

Everything here is synchronous, so "is there room, then take it" is never split
by an `await`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

R = TypeVar("R")


@dataclass(slots=True, eq=False)
class Ticket(Generic[R]):
    """One admitted call's entries in the ledger."""

    reservation: R | None = None
    worker: str | None = None
    closed: bool = False


class Ledger(Generic[R]):
    """Admission and per-worker holds, and the scheduler reservations to release.

    Args:
        max_inflight: calls admitted at once; 0 = uncapped.
        max_per_worker: calls held for one worker at once; 0 = uncapped.
        release: hands a reservation back to the scheduler that made it.
    """

    def __init__(
        self, max_inflight: int, max_per_worker: int, release: Callable[[R], None]
    ) -> None:
        self.max_inflight = max_inflight
        self.max_per_worker = max_per_worker
        self._release = release
        self.inflight = 0
        self._held: dict[str, int] = {}

    def admit(self) -> Ticket[R] | None:
        """A ticket for a new call, or None when the gateway holds its limit."""
        if self.max_inflight and self.inflight >= self.max_inflight:
            return None
        self.inflight += 1
        return Ticket()

    def reserve(self, ticket: Ticket[R], reservation: R | None) -> None:
        """Record the scheduler's charge for this call (released when it closes)."""
        ticket.reservation = reservation

    def held(self, url: str) -> int:
        return self._held.get(url, 0)

    def is_full(self, url: str) -> bool:
        """The worker holds its share of calls (never, when uncapped)."""
        return bool(self.max_per_worker) and self._held.get(url, 0) >= self.max_per_worker

    def with_room(self, replicas: tuple[str, ...]) -> tuple[str, ...]:
        """The replicas below their share (all of them, and no new tuple, when none is full)."""
        if self.max_per_worker:
            for url in replicas:
                if self.is_full(url):  # rare: only then build a new tuple
                    return tuple(u for u in replicas if not self.is_full(u))
        return replicas

    def hold(self, ticket: Ticket[R], url: str) -> int:
        """The call is now held for `url` (before any wait: a queue counts too); the
        calls `url` holds now, this one included."""
        if ticket.worker is not None:
            self.unhold(ticket)
        count = self._held.get(url, 0) + 1
        self._held[url] = count
        ticket.worker = url
        return count

    def unhold(self, ticket: Ticket[R]) -> int:
        """The call is no longer held; the calls its worker held until now (0: none)."""
        url = ticket.worker
        if url is None:
            return 0
        ticket.worker = None
        count = self._held[url]
        if count > 1:
            self._held[url] = count - 1
        else:
            del self._held[url]
        return count

    def close(self, ticket: Ticket[R]) -> None:
        """The call is over: settle its hold, its reservation and its admission, once."""
        if ticket.closed:
            return
        ticket.closed = True
        if ticket.worker is not None:
            self.unhold(ticket)
        reservation, ticket.reservation = ticket.reservation, None
        if reservation is not None:
            self._release(reservation)
        self.inflight -= 1
