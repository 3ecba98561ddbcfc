"""The worker pool: one client channel per worker, their labels, the SHM register gate.

Workers are identified by URL (`host:port`) everywhere inside the gateway; the
friendly name (`worker0`) is only a metrics label. Workers join and leave at run time
(`add`, `retire`, `close`): `urls` is a tuple swapped by reference, so a reader that
took it keeps a consistent list across its awaits. Once a departed worker's channel
is closed the pool forgets it, so addresses that churn (DNS discovery, autoscaling)
cost nothing after they leave; a reader that took the URL before then finds a
closed channel under it and fails over.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar

import trio

from rsgw.base._errors import RsgwError
from rsgw.gateway.fleet._regions import RegionBook
from rsgw.grpc._client import Channel
from rsgw.scheduling.fleet._membership import Member

T = TypeVar("T")

#: Departed workers whose names the pool still knows, the newest: a call that outlived
#: its worker's drain still reads the name, and the metrics its label (to record
#: nothing for it). As many as the gateway may have workers (`_members.MAX_WORKERS`).
REMEMBERED_DEPARTURES = 1024


class RegisterGate:
    """Holds ModelInfer back from a worker while an SHM register/unregister runs on it.

    A region registered on some workers but not yet on this one must not be used
    here, so inference waits. Concurrent SHM operations on one worker are counted:
    the gate opens when the last of them ends (the original let the first finisher
    open it).
    """

    def __init__(self) -> None:
        self._busy: dict[str, tuple[int, trio.Event]] = {}

    def begin(self, url: str) -> None:
        count, event = self._busy.get(url, (0, trio.Event()))
        self._busy[url] = (count + 1, event)

    def end(self, url: str) -> None:
        count, event = self._busy[url]
        if count == 1:
            del self._busy[url]
            event.set()
        else:
            self._busy[url] = (count - 1, event)

    def closed(self, url: str) -> bool:
        return url in self._busy

    async def wait_open(self, url: str) -> None:
        while (entry := self._busy.get(url)) is not None:
            await entry[1].wait()


class Channels(dict[str, Channel]):
    """The workers' channels by URL, a departing worker's until it is closed.

    A URL not here belongs to a worker that left and whose channel is closed (or was
    never a worker): looking it up gives a closed channel, whose calls raise
    `WorkerUnavailable`, so a call that took the URL before the worker left fails
    over rather than raising KeyError. One is made per such lookup: they come only
    from calls that outlived their worker's drain.
    """

    def __init__(self, make_channel: Callable[[str], Channel]) -> None:
        super().__init__()
        self._make_channel = make_channel

    def __missing__(self, url: str) -> Channel:
        channel = self._make_channel(url)
        channel.close_nowait()
        return channel


class WorkerPool:
    """The workers: one channel each, their names, and their metrics endpoints.

    Built empty; `rsgw.gateway._members.Members` adds every worker, the configured ones
    first, as members of its `Membership` (so a worker's ordinal, and with it its
    public name, is the membership's).
    """

    def __init__(self, make_channel: Callable[[str], Channel]) -> None:
        #: The members, in the order they joined; retired workers are not among them.
        self.urls: tuple[str, ...] = ()
        self._members: dict[str, Member] = {}
        self._metrics: dict[str, str] = {}
        self._make_channel = make_channel
        #: Every worker's channel, retired ones included until they are closed; a URL
        #: looked up after that gives a closed channel (see `Channels`).
        self.channels = Channels(make_channel)
        #: Departing members whose address joined again before their channel closed:
        #: the address's entry is the newcomer's, so theirs waits here for `close`.
        self._leaving: dict[Member, Channel] = {}
        #: The last REMEMBERED_DEPARTURES workers closed, oldest first.
        self._departed: dict[str, Member] = {}
        self.gate = RegisterGate()
        #: Regions registered through the gateway: every new connection to a worker
        #: registers them again before it carries a call (a restarted worker has none).
        self.regions = RegionBook()

    def add(self, member: Member, metrics: str = "") -> None:
        """`member` joins: a new channel, which registers the pool's regions on connect.

        `metrics` is its metrics endpoint (host:port), scraped into /metrics; "" = none.

        Raises:
            ValueError: its URL is a member already.
        """
        url = member.url
        if url in self.urls:
            raise ValueError(f"{url} is already a worker")
        departing = self._members.get(url)
        if departing is not None:  # left, still draining: its channel closes with it
            self._leaving[departing] = self.channels[url]
        self._members[url] = member
        if metrics:
            self._metrics[url] = metrics
        channel = self._make_channel(url)
        channel.on_connect = partial(self.regions.replay, member.label)
        self.channels[url] = channel
        self.urls = (*self.urls, url)

    def retire(self, url: str) -> None:
        """`url` takes no new work: out of `urls`; its channel carries what it has."""
        self.urls = tuple(u for u in self.urls if u != url)
        self._metrics.pop(url, None)

    def channel_of(self, member: Member) -> Channel:
        """`member`'s own channel, also while it departs (its address may be back)."""
        leaving = self._leaving.get(member)
        return self.channels[member.url] if leaving is None else leaving

    async def close(self, member: Member) -> None:
        """A retired member's channel closes (calls still on it fail over), and the
        pool forgets it: its URL then looks up a closed channel (see `Channels`)."""
        await self.channel_of(member).aclose()
        if self._leaving.pop(member, None) is not None:
            return  # its address is back: the newcomer's entries stay
        url = member.url
        del self.channels[url]
        del self._members[url]
        self._departed.pop(url, None)
        self._departed[url] = member
        if len(self._departed) > REMEMBERED_DEPARTURES:
            del self._departed[next(iter(self._departed))]

    def label(self, url: str) -> str:
        """The metrics label of a worker: its friendly name, or its URL when unnamed."""
        member = self._members.get(url) or self._departed.get(url)
        return member.label if member is not None else url

    def public_name(self, url: str) -> str:
        """How client-facing messages name a worker: its name, never its address.

        Internal addresses go to the log and the metrics only; an unnamed worker is
        `worker<N>` by the order it joined in (the configured ones first). One that
        left long ago (see REMEMBERED_DEPARTURES) is "a removed worker".
        """
        member = self._members.get(url) or self._departed.get(url)
        return member.public_name if member is not None else "a removed worker"

    def member(self, url: str) -> Member:
        return self._members[url]

    def metrics_targets(self) -> dict[str, str]:
        """The members' metrics endpoints: metrics URL -> the worker's label."""
        return {metrics: self.label(url) for url, metrics in self._metrics.items()}

    async def aclose(self) -> None:
        for channel in (*self.channels.values(), *self._leaving.values()):
            await channel.aclose()


async def fan_out(
    urls: Sequence[str],
    call: Callable[[str], Awaitable[T]],
    on_done: Callable[[str, float], None] | None = None,
) -> dict[str, T | RsgwError]:
    """Run `call(url)` for every URL concurrently; each result or its `RsgwError`.

    A worker's failure (an `RsgwError`: unreachable, its status, its deadline) is
    one entry in the result, which is what every fan-out rule (all-or-nothing,
    any-succeeds, AND) needs to decide. Anything else is a bug, not a worker's
    answer: it cancels the other calls and is raised as itself (out of the
    nursery's group), so the server answers INTERNAL and logs it rather than
    passing it off as an unavailable worker. A caller whose calls can fail in other
    expected ways (an HTTP scrape) turns those into its own results first.
    `on_done(url, seconds)` observes each call's latency.

    Raises:
        Exception: the first bug a call raised (a note counts any others).
    """
    results: dict[str, T | RsgwError] = {}

    async def one(url: str) -> None:
        started = time.perf_counter()
        try:
            results[url] = await call(url)
        except RsgwError as exc:
            results[url] = exc
        if on_done is not None:
            on_done(url, time.perf_counter() - started)

    try:
        async with trio.open_nursery() as nursery:
            for url in urls:
                nursery.start_soon(one, url)
    except ExceptionGroup as group:  # bugs only: Cancelled would make it a BaseExceptionGroup
        first, *others = group.exceptions
        if others:
            first.add_note(f"and {len(others)} more calls of this fan-out raised")
        raise first from None
    return results
