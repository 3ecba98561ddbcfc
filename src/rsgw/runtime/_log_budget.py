"""How many lines of one kind a process may log: storms become a line now and then.

Pure (the caller passes the time). A worker that fails every call, or a client that
sends a thousand bad requests a second, would otherwise turn each call into a log
line: the log fills the disk and hides everything else. A `LogBudget` lets `burst`
lines of each kind through per `seconds`, counts the ones it holds back, and hands
that count to the next line let through, which says how many were suppressed.
"""

from __future__ import annotations

from collections.abc import Hashable

#: Kinds remembered at once; past it the oldest is forgotten (a flood of distinct
#: keys, such as client-chosen model names, cannot grow the table).
MAX_KINDS = 1024


class LogBudget:
    """At most `burst` lines per kind per `seconds` (see the module docstring)."""

    __slots__ = ("_burst", "_kinds", "_seconds")

    def __init__(self, burst: int = 10, seconds: float = 10.0) -> None:
        self._burst = burst
        self._seconds = seconds
        #: kind -> [window start, lines let through in it, lines held back since the last]
        self._kinds: dict[Hashable, list[float]] = {}

    def take(self, kind: Hashable, now: float) -> int | None:
        """None: hold this line back. Otherwise log it, saying this many were suppressed."""
        state = self._kinds.get(kind)
        if state is None:
            if len(self._kinds) >= MAX_KINDS:
                del self._kinds[next(iter(self._kinds))]
            state = self._kinds[kind] = [now, 0.0, 0.0]
        if now - state[0] >= self._seconds:
            state[0], state[1] = now, 0.0
        if state[1] >= self._burst:
            state[2] += 1
            return None
        state[1] += 1
        suppressed, state[2] = int(state[2]), 0.0
        return suppressed
