"""Which workers have stopped answering: the stall watch behind outlier ejection.

Pure: the shell (`rsgw.gateway.fleet._watchdog`) looks at every worker's connection a few
times a second and reports what it saw; this decides what to do about it.

A worker is *stalled* when calls are waiting on it and nothing at all has arrived
from it (no byte of any answer) for `stall_seconds`. That alone proves nothing: a
batch may simply take long. So a stall is answered with an HTTP/2 PING, which any
live gRPC server acknowledges at once, whatever its GPU is doing (grpc-core answers
PINGs on its own threads; rsgw's worker on its event loop, which device work never
blocks). No acknowledgement, nor any other byte, within `ping_timeout` means the
process is stopped, hung or cut off: the worker is *ejected* (out of routing at once,
its pending calls failed over), and comes back through the prober once it answers
again, no sooner than `ejection_seconds` later.

Invariants: one PING per stall (a new stall, after bytes arrived, may ping again);
a verdict never depends on the absolute time, only on intervals the shell reports;
time the gateway's own loop was too busy to look (so an acknowledgement may be
sitting unread) does not count towards `ping_timeout`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: Defaults: a stall is noticed within half a second and confirmed within one more.
DEFAULT_STALL_SECONDS = 0.5
DEFAULT_PING_TIMEOUT_SECONDS = 1.0
DEFAULT_EJECTION_SECONDS = 5.0


class Verdict(enum.Enum):
    """What the shell should do about one worker after a look."""

    FINE = "fine"
    PING = "ping"
    EJECT = "eject"


@dataclass(slots=True)
class _Watch:
    reads: int = -1
    stalled_since: float | None = None
    pinged_at: float | None = None


class StallWatch:
    """Per-worker stall bookkeeping; see the module docstring.

    Args:
        stall_seconds: how long calls may wait with no byte from the worker before
            it is pinged; 0 disables the watch.
        ping_timeout: how long the PING may go unanswered before ejection.
    """

    def __init__(
        self,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
        ping_timeout: float = DEFAULT_PING_TIMEOUT_SECONDS,
    ) -> None:
        self.stall_seconds = stall_seconds
        self.ping_timeout = ping_timeout
        self._watches: dict[str, _Watch] = {}

    @property
    def enabled(self) -> bool:
        return self.stall_seconds > 0

    def look(self, url: str, now: float, *, pending: int, reads: int, lag: float = 0.0) -> Verdict:
        """One look at `url`: `pending` calls wait on it, its connection has read `reads` times.

        `lag`: how much later than planned this look comes (the caller's loop was
        busy, so what arrived meanwhile may be unread); it extends the PING's time.
        """
        watch = self._watches.get(url)
        if watch is None:
            watch = self._watches[url] = _Watch()
        if pending == 0 or reads != watch.reads:
            watch.reads = reads
            watch.stalled_since = watch.pinged_at = None
            return Verdict.FINE
        if watch.stalled_since is None:
            watch.stalled_since = now
        if watch.pinged_at is None:
            if now - watch.stalled_since >= self.stall_seconds:
                watch.pinged_at = now
                return Verdict.PING
            return Verdict.FINE
        watch.pinged_at += lag
        if now - watch.pinged_at >= self.ping_timeout:
            return Verdict.EJECT
        return Verdict.FINE

    def forget(self, url: str) -> None:
        """Start over for `url` (its connection was replaced)."""
        self._watches.pop(url, None)

    def stalled_for(self, url: str, now: float) -> float:
        """Seconds `url` has been stalled (0 if it is not), for logs."""
        watch = self._watches.get(url)
        if watch is None or watch.stalled_since is None:
            return 0.0
        return now - watch.stalled_since
