"""What one client may cost a server: the limits of a connection, and the flood guard.

Pure. `ConnectionLimits` is the configuration (`GrpcServer(limits=...)`); the
connection core enforces the per-call and per-byte ones, the server shell the
timers and the connection cap.

`FloodGuard` is the HTTP/2 flood defence (the 2019 "ping flood", "settings flood",
"reset flood" and 2023 "rapid reset" advisories). Every control frame a peer sends
(PING, SETTINGS, WINDOW_UPDATE, PRIORITY, an empty DATA frame) costs us work and
often an answer, and a reset of a call we run costs a handler. So each one spends
from a budget; calls the peer opens earn a little back, and the shell refills it to
its base every `refill_seconds`. A peer that overdraws it is told ENHANCE_YOUR_CALM
and disconnected. A well-behaved client never comes near: grpc-core sends a few
control frames per call, and a PING a minute.

A WINDOW_UPDATE that gives back window our own DATA used is an acknowledgment, not
a flood, however many a client sends: grpc-core acknowledges a streamed reply with
two per window (its 5-byte prefix as it is read, then the rest), four frames a
reply, which perf_analyzer's streams at concurrency 4 turned into a GOAWAY when
each reply paid for two. So what we send opens an allowance (its bytes, twice: the
stream's window and the connection's; and a few frames per message), and a
WINDOW_UPDATE within it is free; one past it (a window grown beyond what we used,
or a trickle of one-byte increments) costs like any control frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

#: RFC 9113 §7: "the endpoint ... is being asked to slow down" (flood or abuse).
ENHANCE_YOUR_CALM = 0xB


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The limits of one client connection; see the module docstring.

    Attributes:
        max_header_list_bytes: a request's header block, counted as HTTP/2 does
            (name + value + 32 per field); larger ones fail RESOURCE_EXHAUSTED.
        max_buffered_bytes: bytes of unfinished request messages a connection may
            hold across its calls; one call alone may still send one message up to
            the message limit.
        flood_budget: control frames (and calls reset as soon as opened, which
            cost more) a connection may send per refill period.
        refill_seconds: how often the flood budget is restored.
        idle_seconds: a connection with no call for this long is closed (GOAWAY
            first); 0 keeps idle connections forever.
        header_seconds: a connection that sends bytes completing no frame for this
            long (a slowloris), or no HTTP/2 preface at all, is closed; a call whose
            message was granted upload budget and stops arriving for this long fails.
        max_connections: connections served at once; more wait in the listen
            backlog. 0: no cap.
    """

    max_header_list_bytes: int = 16 * 1024
    max_buffered_bytes: int = 64 * 1024 * 1024
    flood_budget: int = 1000
    refill_seconds: float = 10.0
    idle_seconds: float = 300.0
    header_seconds: float = 10.0
    max_connections: int = 10_000


#: What a call the peer opens earns back, and what resetting it at once costs.
CALL_CREDIT = 10
RESET_COST = 15
#: How many acknowledging WINDOW_UPDATEs each message we send allows: two windows
#: (the stream's, the connection's), each acknowledged in up to two pieces.
ACKNOWLEDGMENTS_PER_MESSAGE = 4
#: A gRPC message's length prefix, which the peer's window counts too.
PREFIX_BYTES = 5


class FloodGuard:
    """A connection's control-frame budget (see the module docstring)."""

    __slots__ = ("_ack_bytes", "_ack_frames", "base", "budget")

    def __init__(self, base: int) -> None:
        self.base = base
        self.budget = base
        #: Window our DATA used that the peer has not yet given back, and how many
        #: WINDOW_UPDATE frames may still give it back for free.
        self._ack_bytes = 0
        self._ack_frames = 0

    def spend(self, cost: int = 1) -> bool:
        """Charge one control frame (or `cost`); False once the budget is overdrawn."""
        self.budget -= cost
        return self.budget >= 0

    def earn(self) -> None:
        """The peer opened a call: useful work buys a little more room."""
        self.budget += CALL_CREDIT

    def sent(self, size: int) -> None:
        """We sent a message of `size` bytes: the peer may acknowledge it for free."""
        self._ack_bytes += 2 * (size + PREFIX_BYTES)
        self._ack_frames += ACKNOWLEDGMENTS_PER_MESSAGE

    def window_update(self, delta: int) -> bool:
        """Charge a WINDOW_UPDATE of `delta` bytes unless it acknowledges our DATA."""
        if self._ack_frames > 0 and delta <= self._ack_bytes:
            self._ack_frames -= 1
            self._ack_bytes -= delta
            return True
        return self.spend()

    def refill(self) -> None:
        """A new period: back to the base if below it."""
        self.budget = max(self.budget, self.base)


def header_list_size(headers: list[tuple[bytes, bytes]]) -> int:
    """A header block's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 9113 §6.5.2)."""
    return sum(map(len, chain.from_iterable(headers))) + 32 * len(headers)


class StreamShare:
    """How many calls each client connection may open while the server is saturated.

    A server that stops reading at its running-call cap (`GrpcServer(max_running_calls=)`)
    keeps its goodput, but every client still has its full stream limit open: with
    sixteen clients at 128 streams each, 2,048 calls wait in the sockets, and a call
    answered at capacity C has waited 2,048 / C seconds (Little's law) although the
    server works only the cap's worth at once. So when the cap is first reached, each
    busy connection is told (SETTINGS_MAX_CONCURRENT_STREAMS) it may open only its
    share of the cap; the backlog then waits in the clients, before its calls start,
    and a call that starts is answered in about cap / C. Once the server has run at
    most half its cap for `relax_seconds`, the full limit comes back. Pure: the shell
    reports saturation and samples, and sends what this returns.
    """

    __slots__ = ("_full", "_low_since", "_relax_seconds", "_running_cap", "current")

    def __init__(self, running_cap: int, full_streams: int, relax_seconds: float = 2.0) -> None:
        self._running_cap = running_cap
        self._full = full_streams
        self._relax_seconds = relax_seconds
        self._low_since: float | None = None
        #: The stream limit every connection should have now.
        self.current = full_streams

    @property
    def sharing(self) -> bool:
        return self.current != self._full

    def resize(self, running_cap: int) -> None:
        """A new running-call cap; the next saturation or sample shares it."""
        self._running_cap = running_cap

    def saturated(self, busy_connections: int) -> int | None:
        """The cap was reached: the new per-connection limit, or None if unchanged."""
        self._low_since = None
        return self._set(self._share(busy_connections))

    def sample(self, now: float, running: int, busy_connections: int) -> int | None:
        """A periodic look while sharing: the new limit, or None if unchanged."""
        if not self.sharing:
            return None
        if running * 2 > self._running_cap:
            self._low_since = None
            return self._set(self._share(busy_connections))
        if self._low_since is None:
            self._low_since = now
        if now - self._low_since < self._relax_seconds:
            return None
        self._low_since = None
        return self._set(self._full)

    def _share(self, busy_connections: int) -> int:
        share = -(-self._running_cap // max(1, busy_connections))
        return max(1, min(self._full, share))

    def _set(self, limit: int) -> int | None:
        if limit == self.current:
            return None
        self.current = limit
        return limit
