"""Unfinished request bodies under the upload budget (`rsgw.base._uploads`): flow control,
not refusals.

A server with a budget gives a call's stream window back only once its unfinished
message is granted: a client over its share waits in its own flow control and is
slowed, not failed; only bytes that flow control could not hold back are refused.
Raw h2 clients (`tests.reliability.hostile`) stall on purpose; rsgw's own channel
is the honest client. Memory streams, autojump clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing
from trio.testing import MockClock

from rsgw.base._call import CallContext
from rsgw.base._limits import ConnectionLimits
from rsgw.base._status import StatusCode
from rsgw.base._uploads import UploadBudget
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from tests.helpers import wait_until_async
from tests.memory import MemoryNetwork
from tests.reliability.hostile import HostileConnection, Outcome, framed, grpc_headers

ECHO = b"/t.Test/Echo"
MIB = 1024 * 1024


async def _size(request: bytes, call: CallContext) -> bytes:
    return str(len(request)).encode()


class Served:
    def __init__(
        self, network: MemoryNetwork, target: str, nursery: trio.Nursery, budget: UploadBudget
    ) -> None:
        self.network = network
        self.target = target
        self.nursery = nursery
        self.budget = budget

    async def hostile(self) -> HostileConnection:
        conn = HostileConnection(await self.network.connect(self.target))
        await conn.flush()
        await conn.read()  # the server's SETTINGS and connection window
        return conn

    async def honest_call(self, size: int) -> bytes:
        channel = Channel(
            self.target, self.nursery, network=self.network, max_send_message_bytes=64 * MIB
        )
        try:
            return await channel.unary(ECHO, b"\x00" * size)
        finally:
            await channel.aclose()


@asynccontextmanager
async def serving(limit: int, *, per_connection: int = 64 * MIB) -> AsyncIterator[Served]:
    network = MemoryNetwork()
    budget = UploadBudget(limit, MIB)
    server = GrpcServer(
        {ECHO.decode(): _size},
        limits=ConnectionLimits(max_buffered_bytes=per_connection),
        upload_budget=budget,
        window_bytes=MIB,
        connection_window_bytes=32 * MIB,
        max_receive_message_bytes=64 * MIB,
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("s", 0, network=network, **kw))
        yield Served(network, f"s:{port}", nursery, budget)
        nursery.cancel_scope.cancel()


class Upload:
    """One message sent on a raw stream as the server's windows allow, up to `stop_at`."""

    def __init__(self, conn: HostileConnection, size: int, stop_at: int | None = None) -> None:
        self.conn = conn
        self.body = framed(b"\x00" * size)
        self.stop_at = len(self.body) if stop_at is None else stop_at
        self.sent = 0
        self.stream_id = conn.h2.get_next_available_stream_id()
        conn.outcomes[self.stream_id] = Outcome()
        conn.h2.send_headers(self.stream_id, grpc_headers(ECHO))

    @property
    def outcome(self) -> Outcome:
        return self.conn.outcomes[self.stream_id]

    def push(self) -> None:
        """Queue what the windows take now (END_STREAM with the last byte)."""
        h2 = self.conn.h2
        while self.sent < self.stop_at and not self.outcome.ended:
            room = min(
                h2.local_flow_control_window(self.stream_id),
                h2.max_outbound_frame_size,
                self.stop_at - self.sent,
            )
            if room <= 0:
                return
            end = self.sent + room == len(self.body)
            h2.send_data(self.stream_id, self.body[self.sent : self.sent + room], end_stream=end)
            self.sent += room


async def settle(conn: HostileConnection, *uploads: Upload) -> None:
    """Send and read until nothing moves: every upload as far as its window lets it."""
    while True:
        before = [u.sent for u in uploads]
        for upload in uploads:
            upload.push()
        await conn.flush()
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0.01):  # read whatever the server has said
            await conn.read()
        for upload in uploads:
            upload.push()
        if [u.sent for u in uploads] == before:
            return


async def test_a_connections_second_large_upload_waits_for_its_first(
    autojump_clock: MockClock,
) -> None:
    """Two 3 MiB messages on one connection whose share is 4 MiB: the second gets no
    window past its first one until the first is whole, then finishes too. None fails."""
    async with serving(64 * MIB, per_connection=4 * MIB) as served:
        conn = await served.hostile()
        first, second = Upload(conn, 3 * MIB), Upload(conn, 3 * MIB)
        second.stop_at = first.stop_at - 1  # the second may not finish before the first
        first.stop_at = MIB + 1000  # the first stops a little past its window
        await settle(conn, first, second)
        assert first.sent == MIB + 1000  # granted: it got window past its first
        assert second.sent <= MIB  # held back: only the window it was given to start
        assert served.budget.waiting_tickets == 1
        first.stop_at = len(first.body)
        second.stop_at = len(second.body)
        await settle(conn, first, second)
        outcomes = await conn.wait(first.stream_id, second.stream_id)
        assert [o.status for o in outcomes] == [StatusCode.OK, StatusCode.OK]
        assert [o.data[5:] for o in outcomes] == [str(3 * MIB).encode()] * 2
        assert served.budget.granted == served.budget.waiting == 0


async def test_stalled_uploads_slow_large_calls_and_never_small_ones(
    autojump_clock: MockClock,
) -> None:
    """A client holds 6 of an 8 MiB budget with a stalled upload, another waits behind it:
    a small call goes through at once, an honest 3 MiB one waits its turn and succeeds
    once the stalled client goes."""
    async with serving(8 * MIB) as served:
        staller = await served.hostile()
        stalled = Upload(staller, 6 * MIB, stop_at=5 * MIB)
        await settle(staller, stalled)
        assert stalled.sent == 5 * MIB and served.budget.granted == 6 * MIB
        behind = await served.hostile()
        waiting = Upload(behind, 6 * MIB)
        await settle(behind, waiting)
        assert waiting.sent <= MIB and served.budget.waiting_tickets == 1

        assert await served.honest_call(10_000) == b"10000"
        results: list[bytes] = []

        async def large() -> None:
            results.append(await served.honest_call(3 * MIB))

        served.nursery.start_soon(large)
        await trio.testing.wait_all_tasks_blocked()
        assert not results and served.budget.waiting_tickets == 2  # slowed, not failed
        await staller.aclose()  # the staller goes: its 6 MiB are free
        await settle(behind, waiting)
        [outcome] = await behind.wait(waiting.stream_id)
        assert outcome.status == StatusCode.OK
        await wait_until_async(lambda: bool(results), 30, what="the 3 MiB call's answer")
        assert results == [str(3 * MIB).encode()]
        assert served.budget.granted == 0 and served.budget.granted_after_wait == 2


async def test_only_what_flow_control_cannot_hold_back_is_refused(
    autojump_clock: MockClock,
) -> None:
    """A 2 MiB budget held by one stalled upload: calls waiting behind it hold up to a
    window each, two of them fill the waiting bound, and the third is refused with the
    reason; the connection and the others go on."""
    async with serving(2 * MIB) as served:
        conn = await served.hostile()
        holder = Upload(conn, 2 * MIB, stop_at=MIB)
        await settle(conn, holder)
        others = [Upload(conn, 2 * MIB, stop_at=MIB) for _ in range(3)]
        await settle(conn, holder, *others)
        [refused] = await conn.wait(others[2].stream_id)
        assert refused.status == StatusCode.RESOURCE_EXHAUSTED
        assert "too many unfinished requests to take a 2097152-byte message" in refused.message
        assert not any(o.outcome.ended for o in (holder, *others[:2]))
        assert served.budget.refused == 1 and conn.terminated is None
        for upload in (holder, *others[:2]):
            upload.stop_at = len(upload.body)
        await settle(conn, holder, *others[:2])
        outcomes = await conn.wait(holder.stream_id, others[0].stream_id, others[1].stream_id)
        assert [o.status for o in outcomes] == [StatusCode.OK] * 3


async def test_an_upload_that_stalls_holding_its_grant_fails_and_frees_it(
    autojump_clock: MockClock,
) -> None:
    """A granted upload that stops for `header_seconds` fails (the connection and its
    other calls go on), and the upload waiting behind it is granted and finishes."""
    async with serving(4 * MIB) as served:
        staller = await served.hostile()
        stalled = Upload(staller, 4 * MIB, stop_at=2 * MIB)
        await settle(staller, stalled)
        behind = await served.hostile()
        waiting = Upload(behind, 4 * MIB)
        await settle(behind, waiting)
        assert served.budget.waiting_tickets == 1
        started = trio.current_time()
        [outcome] = await staller.wait(stalled.stream_id)
        assert 10 <= trio.current_time() - started <= 12
        assert outcome.status == StatusCode.RESOURCE_EXHAUSTED
        assert "stopped for 10 s with 2097147 bytes of its 4194304-byte message" in outcome.message
        assert staller.terminated is None
        await settle(behind, waiting)
        [finished] = await behind.wait(waiting.stream_id)
        assert finished.status == StatusCode.OK
