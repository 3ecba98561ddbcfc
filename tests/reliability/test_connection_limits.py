"""What one client connection may cost the server: floods, slowloris, idle, size, buffers, a cap.

On memory streams with the autojump clock (the timers run in virtual time), with
the permissive raw-h2 client of `tests.reliability.hostile`; rsgw's own channel
plays the well-behaved client that must not notice any of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h2.errors
import h2.settings
import trio
from trio.testing import MockClock

from rsgw.base._call import CallContext
from rsgw.base._limits import ENHANCE_YOUR_CALM, ConnectionLimits
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from tests.memory import MemoryNetwork
from tests.reliability.hostile import HostileConnection, Outcome, framed, grpc_headers

ECHO = b"/t.Test/Echo"


async def _echo(request: bytes, call: CallContext) -> bytes:
    return request


class Served:
    def __init__(self, network: MemoryNetwork, target: str, nursery: trio.Nursery) -> None:
        self.network = network
        self.target = target
        self.nursery = nursery

    async def hostile(self) -> HostileConnection:
        conn = HostileConnection(await self.network.connect(self.target))
        await conn.flush()
        await conn.read()  # the server's SETTINGS and window: we may send as it allows
        return conn

    async def well_behaved_call(self, payload: bytes = b"ok") -> bytes:
        channel = Channel(self.target, self.nursery, network=self.network)
        try:
            return await channel.unary(ECHO, payload)
        finally:
            await channel.aclose()


@asynccontextmanager
async def serving(**limits: object) -> AsyncIterator[Served]:
    network = MemoryNetwork()
    server = GrpcServer({ECHO.decode(): _echo}, limits=ConnectionLimits(**limits))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("s", 0, network=network, **kw))
        yield Served(network, f"s:{port}", nursery)
        nursery.cancel_scope.cancel()


async def _flooded(send: str, count: int) -> HostileConnection:
    async with serving() as served:
        conn = await served.hostile()
        for i in range(count):
            if send == "ping":
                conn.h2.ping(i.to_bytes(8, "big"))
            elif send == "settings":
                conn.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535 + i})
            elif send == "window":
                conn.h2.increment_flow_control_window(1)
            if i % 500 == 0:
                await conn.flush()
        await conn.flush()
        with trio.fail_after(30):
            await conn.until_closed()
        assert await served.well_behaved_call() == b"ok"  # others never noticed
        return conn


async def test_a_ping_flood_is_told_to_calm_down(autojump_clock: MockClock) -> None:
    conn = await _flooded("ping", 5000)
    assert conn.terminated is not None and conn.terminated.error_code == ENHANCE_YOUR_CALM


async def test_a_settings_flood_is_told_to_calm_down(autojump_clock: MockClock) -> None:
    conn = await _flooded("settings", 5000)
    assert conn.terminated is not None and conn.terminated.error_code == ENHANCE_YOUR_CALM


async def test_a_window_update_flood_is_told_to_calm_down(autojump_clock: MockClock) -> None:
    conn = await _flooded("window", 5000)
    assert conn.terminated is not None and conn.terminated.error_code == ENHANCE_YOUR_CALM


async def test_rapid_reset_is_told_to_calm_down(autojump_clock: MockClock) -> None:
    async with serving() as served:
        conn = await served.hostile()
        for _ in range(1000):
            stream_id = conn.h2.get_next_available_stream_id()
            conn.h2.send_headers(stream_id, grpc_headers(ECHO))
            conn.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            await conn.flush()
        with trio.fail_after(30):
            await conn.until_closed()
        assert conn.terminated is not None and conn.terminated.error_code == ENHANCE_YOUR_CALM
        assert await served.well_behaved_call() == b"ok"


async def test_a_normal_client_never_runs_out_of_budget(autojump_clock: MockClock) -> None:
    """Thousands of calls with a PING now and then, over minutes: never cut off."""
    async with serving() as served:
        conn = await served.hostile()
        for i in range(3000):
            stream_id = await conn.call(grpc_headers(ECHO), b"x")
            if i % 50 == 0:
                conn.h2.ping(i.to_bytes(8, "big"))
            [outcome] = await conn.wait(stream_id)
            assert outcome.status == StatusCode.OK
            await trio.sleep(0.1)
        assert conn.terminated is None


async def test_oversized_headers_fail_their_call_only(autojump_clock: MockClock) -> None:
    async with serving(max_header_list_bytes=4096) as served:
        conn = await served.hostile()
        big = await conn.call([*grpc_headers(ECHO), (b"x-big", b"v" * 8000)], b"x")
        good = await conn.call(grpc_headers(ECHO), b"fine")
        bad_outcome, good_outcome = await conn.wait(big, good)
        assert bad_outcome.status == StatusCode.RESOURCE_EXHAUSTED
        assert "over the limit of 4096" in bad_outcome.message
        assert good_outcome.status == StatusCode.OK and conn.terminated is None
        settings = conn.h2.remote_settings
        assert settings[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] == 4096


async def test_unfinished_bodies_are_bounded_per_connection(autojump_clock: MockClock) -> None:
    """Three 2 MiB messages left one byte short: the one over 3 MiB in all fails alone."""
    mib = 1024 * 1024
    async with serving(max_buffered_bytes=3 * mib) as served:
        conn = await served.hostile()
        streams = []
        for _ in range(3):
            stream_id = conn.h2.get_next_available_stream_id()
            conn.outcomes[stream_id] = Outcome()
            conn.h2.send_headers(stream_id, grpc_headers(ECHO))
            body = framed(b"\x00" * (2 * mib))[:-1]
            for at in range(0, len(body), 16384):
                conn.h2.send_data(stream_id, body[at : at + 16384])
            streams.append(stream_id)
            await conn.flush()
            await trio.testing.wait_all_tasks_blocked()  # the server has read it
        with trio.fail_after(10):
            [second] = await conn.wait(streams[1])
        assert second.status == StatusCode.RESOURCE_EXHAUSTED
        assert "unfinished requests" in second.message
        assert not conn.outcomes[streams[0]].ended  # the first may still finish its message
        assert conn.terminated is None


async def test_a_slowloris_is_closed(autojump_clock: MockClock) -> None:
    async with serving(header_seconds=10) as served:
        conn = await served.hostile()  # the preface has gone, then a frame byte a second
        started = trio.current_time()
        headers = conn.h2
        stream_id = headers.get_next_available_stream_id()
        headers.send_headers(stream_id, grpc_headers(ECHO))
        frame = headers.data_to_send()
        with trio.fail_after(60):
            for byte in frame[:-1]:
                try:
                    await conn.stream.send_all(bytes([byte]))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                await trio.sleep(1)
        assert 10 <= trio.current_time() - started <= 15


async def test_a_silent_connection_is_closed_after_the_header_timeout(
    autojump_clock: MockClock,
) -> None:
    async with serving(header_seconds=10) as served:
        stream = await served.network.connect(served.target)  # not even a preface
        started = trio.current_time()
        with trio.fail_after(60):
            while await stream.receive_some(4096):
                pass
        assert 10 <= trio.current_time() - started <= 12


async def test_an_idle_connection_gets_goaway_and_is_closed(autojump_clock: MockClock) -> None:
    async with serving(idle_seconds=60) as served:
        conn = await served.hostile()
        [outcome] = await conn.wait(await conn.call(grpc_headers(ECHO), b"x"))
        assert outcome.status == StatusCode.OK
        started = trio.current_time()
        with trio.fail_after(120):
            await conn.until_closed()
        assert 60 <= trio.current_time() - started <= 62
        assert conn.terminated is not None and conn.terminated.error_code == 0


async def test_connections_past_the_cap_wait_for_a_free_one(autojump_clock: MockClock) -> None:
    async with serving(max_connections=2, idle_seconds=0) as served:
        first, second = await served.hostile(), await served.hostile()
        for conn in (first, second):
            [outcome] = await conn.wait(await conn.call(grpc_headers(ECHO), b"x"))
            assert outcome.status == StatusCode.OK
        third = HostileConnection(await served.network.connect(served.target))
        pending = await third.call(grpc_headers(ECHO), b"third")  # not accepted yet
        with trio.move_on_after(5):
            await third.wait(pending)
        assert not third.outcomes[pending].ended  # waiting in the backlog
        await first.stream.aclose()
        with trio.fail_after(5):
            [outcome] = await third.wait(pending)
        assert outcome.status == StatusCode.OK
