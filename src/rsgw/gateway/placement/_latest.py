"""`Latest`: a mailbox of capacity one that keeps the newest post.

The packing shell's polls and the placer's moves both want this: a producer posts
synchronously from the request or prober path and never waits; the consumer, when it
is free, takes the newest post, and older ones it never got to are dropped (a stale
poll or an overtaken placement is worth nothing once a newer one exists).
"""

from __future__ import annotations

from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class Latest(Generic[T]):
    """See the module docstring."""

    __slots__ = ("_arrived", "_item")

    def __init__(self) -> None:
        self._item: T | None = None
        self._arrived = trio.Event()

    def post(self, item: T) -> None:
        """Replace whatever is waiting with `item`; never blocks."""
        self._item = item
        self._arrived.set()

    @property
    def pending(self) -> bool:
        """Whether a post waits that the consumer has not taken yet."""
        return self._item is not None

    async def take(self) -> T:
        """The newest post, waiting for one if none waits."""
        while True:
            await self._arrived.wait()
            self._arrived = trio.Event()
            item, self._item = self._item, None
            if item is not None:
                return item
