"""The gateway's budget of unfinished request bytes: who may upload a large message now.

Pure: no Trio, no sockets. A request message arrives in pieces, and until its last
byte is here the gateway holds every piece. Left alone, a client that opens many
calls, sends most of a large message on each and stops would hold as much of the
gateway's memory as it likes (issue 38: 10 connections x 8 stalled 31 MiB calls took
372 MB). This module decides which unfinished messages may keep arriving; the
connections enforce it with the transport's own flow control (HTTP/2 stream windows
on the gRPC port, not reading the socket on the REST port), so an upload over its
share is slowed, not failed.

The rules:
- A message that will not arrive in one piece asks for a `Ticket` for its declared
  size. Until the ticket is granted, the connection stops giving that call window,
  so what it may send is what its window already allowed (`window_bytes`, one HTTP/2
  stream window).
- Tickets are granted first come, first served, while the granted sizes stay within
  `limit` (a message larger than `limit` alone is granted once nothing else is, so
  every message the size limit admits can finish).
- One connection (a `Share`) may hold tickets up to its own `limit` at once, and always
  one, whatever its size: the allowance for one large message is one call's at a time.
  A ticket its connection's rule holds back does not hold back other connections'.
- A ticket is asked for its declared size, not for the bytes it holds: two half-sent
  messages that each wait for the other's bytes to be freed would wait forever. A
  granted ticket's message can always finish.
- What calls hold before their ticket is granted is bounded too: each waiting ticket
  counts up to one window of bytes, and a new one that would take that count over
  `limit` is refused. That is the only refusal: it is what flow control cannot hold
  back (bytes the window had already allowed).

So the gateway holds at most `limit` bytes of granted messages (or one message
alone, when it is larger) plus `limit` of bytes waiting for a grant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class Share:
    """One connection's part of the budget: what its granted tickets hold."""

    __slots__ = ("granted", "limit")

    def __init__(self, limit: int) -> None:
        #: Bytes the connection's tickets may hold at once (one ticket may exceed it).
        self.limit = limit
        self.granted = 0

    def admits(self, size: int) -> bool:
        """Whether a ticket of `size` fits this connection's share."""
        return not self.granted or self.granted + size <= self.limit


@dataclass(slots=True, eq=False)
class Ticket:
    """A message's claim on the budget: granted, waiting, or released."""

    size: int
    share: Share
    budget: UploadBudget = field(repr=False)
    #: Called once when a waiting ticket is granted (never for one granted at once).
    wake: Callable[[Ticket], None] = field(repr=False)
    #: The bytes it counts against the waiting bound until granted.
    waiting_bytes: int = 0
    granted: bool = False
    released: bool = False

    def release(self) -> None:
        """The message is whole, or its call is over (`UploadBudget.release`)."""
        self.budget.release(self)


class UploadBudget:
    """The gateway's unfinished request bytes, across connections; see the module docstring.

    Args:
        limit: bytes of granted messages the gateway holds at once, and separately
            bytes held by messages waiting for a grant.
        window_bytes: what a call may have sent before its ticket is granted (the
            HTTP/2 stream window, or a REST read), counted per waiting ticket.
    """

    def __init__(self, limit: int, window_bytes: int) -> None:
        self.limit = limit
        self.window_bytes = window_bytes
        #: Bytes of granted tickets.
        self.granted = 0
        #: Bytes waiting tickets may hold (each at most a window).
        self.waiting = 0
        self._queue: deque[Ticket] = deque()
        #: Tickets granted at once, granted after waiting, and refused: for metrics.
        self.granted_at_once = 0
        self.granted_after_wait = 0
        self.refused = 0

    @property
    def waiting_tickets(self) -> int:
        return len(self._queue)

    def request(self, size: int, share: Share, wake: Callable[[Ticket], None]) -> Ticket | None:
        """Ask for `size` bytes; a ticket (maybe granted already), or None: refused.

        A ticket not granted at once is granted later through its `wake`, in order.
        """
        if not self._queue and self._fits(size) and share.admits(size):
            ticket = Ticket(size, share, self, wake)
            self._grant(ticket)
            self.granted_at_once += 1
            return ticket
        waiting_bytes = min(size, self.window_bytes)
        if self.waiting + waiting_bytes > self.limit:
            self.refused += 1
            return None
        ticket = Ticket(size, share, self, wake, waiting_bytes)
        self.waiting += waiting_bytes
        self._queue.append(ticket)
        self._grant_waiting(ticket)  # those ahead may all be held back by their connections
        return ticket

    def release(self, ticket: Ticket) -> None:
        """The message is whole, or its call is over: its bytes are free for others."""
        if ticket.released:
            return
        ticket.released = True
        if ticket.granted:
            self.granted -= ticket.size
            ticket.share.granted -= ticket.size
        else:
            self._queue.remove(ticket)
            self.waiting -= ticket.waiting_bytes
        self._grant_waiting()

    def describe(self) -> str:
        return (
            f"{self.granted} of {self.limit} bytes granted, "
            f"{len(self._queue)} messages waiting ({self.waiting} bytes)"
        )

    def _fits(self, size: int) -> bool:
        return self.granted + size <= self.limit or not self.granted

    def _grant(self, ticket: Ticket) -> None:
        ticket.granted = True
        self.granted += ticket.size
        ticket.share.granted += ticket.size

    def _grant_waiting(self, asking: Ticket | None = None) -> None:
        """Grant waiting tickets in order while they fit; a ticket its own connection
        holds back keeps its place without holding back the ones behind it. `asking`
        is being requested now: its caller sees it granted, it is not woken."""
        if not self._queue:
            return
        woken: list[Ticket] = []
        for ticket in list(self._queue):
            if not ticket.share.admits(ticket.size):
                continue
            if not self._fits(ticket.size):
                break
            self._queue.remove(ticket)
            self.waiting -= ticket.waiting_bytes
            self._grant(ticket)
            if ticket is asking:
                self.granted_at_once += 1
            else:
                self.granted_after_wait += 1
                woken.append(ticket)
        for ticket in woken:  # after the books are straight: a wake may release or ask again
            ticket.wake(ticket)


def unfinished_refusal(size: int, budget: UploadBudget) -> str:
    """Why a message of `size` bytes was refused (RESOURCE_EXHAUSTED, or REST's 429)."""
    return (
        f"the gateway holds too many unfinished requests to take a {size}-byte message "
        f"now ({budget.describe()}); retry later"
    )
