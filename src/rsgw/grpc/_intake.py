"""`Intake`: whether the server's connections may read more requests now.

Shared by the server (which counts running calls) and each connection's transport
(which stops reading while the intake is closed). An embedding application (the
gateway) may build it first and give it to the server, as it does the upload budget,
so that what changes the cap (workers joining and leaving) needs only the intake, not
the server.
"""

from __future__ import annotations

from collections.abc import Callable

import trio


class Intake:
    """Whether connections may read more requests: closed while too many calls run.

    Closes at `limit` running calls and opens again at nine tenths of it, so a
    server at its limit alternates between reading a batch and working it off.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: An intake built without a limit stays without one (`resize` leaves it be).
        self.capped = limit > 0
        #: Told when the intake closes (the server's `StreamShare`).
        self.on_full: Callable[[], None] | None = None
        #: Told of a new limit (the server's `StreamShare` follows it).
        self.on_resize: Callable[[int], None] | None = None
        self._reopen_at = max(0, limit - max(1, limit // 10))
        self.running = 0
        self.open = True
        self._reopened = trio.Event()

    def resize(self, limit: int) -> None:
        """A new limit (the gateway's workers changed); reopens at once if now below it.

        An intake built without a limit stays without one.
        """
        if not self.capped:
            return
        self.limit = limit
        self._reopen_at = max(0, limit - max(1, limit // 10))
        if not self.open and self.running <= self._reopen_at:
            self.open = True
            self._reopened.set()
            self._reopened = trio.Event()
        if self.on_resize is not None:
            self.on_resize(limit)

    def started(self) -> None:
        self.running += 1
        if self.limit and self.running >= self.limit and self.open:
            self.open = False
            if self.on_full is not None:
                self.on_full()

    def ended(self) -> None:
        self.running -= 1
        if not self.open and self.running <= self._reopen_at:
            self.open = True
            self._reopened.set()
            self._reopened = trio.Event()

    async def wait(self) -> None:
        await self._reopened.wait()
