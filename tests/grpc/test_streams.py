"""Streaming calls through rsgw's server and channel, on memory streams with the autojump clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from rsgw.base._errors import GrpcError, WorkerUnavailable
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from rsgw.grpc._streams import ServerStream
from tests.memory import MemoryNetwork

MIB = 1024 * 1024
BIG = 64 * MIB


@dataclass
class Handlers:
    sent: int = 0
    cancelled: trio.Event = field(default_factory=trio.Event)
    started: trio.Event = field(default_factory=trio.Event)

    async def echo(self, stream: ServerStream) -> None:
        async for message in stream:
            await stream.send(message.upper())

    async def fan(self, stream: ServerStream) -> None:
        """One request "n": n responses, then OK (a decoupled model's shape)."""
        request = await stream.receive()
        assert request is not None
        for i in range(int(request)):
            await stream.send(b"%d" % i)

    async def fail_midway(self, stream: ServerStream) -> None:
        await stream.send(b"one")
        await stream.send(b"two")
        raise GrpcError(StatusCode.ABORTED, "sequence reset")

    async def hang(self, stream: ServerStream) -> None:
        self.started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled.set()
            raise

    async def flood(self, stream: ServerStream) -> None:
        await stream.receive()  # "go"
        for _ in range(64):
            await stream.send(b"x" * MIB)
            self.sent += 1

    async def count(self, stream: ServerStream) -> None:
        seen = 0
        async for _ in stream:
            seen += 1
        await stream.send(b"%d" % seen)


@dataclass
class Served:
    handlers: Handlers
    network: MemoryNetwork
    target: str
    nursery: trio.Nursery

    def channel(self) -> Channel:
        return Channel(
            self.target,
            self.nursery,
            network=self.network,
            max_receive_message_bytes=BIG,
            max_send_message_bytes=BIG,
        )


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    handlers = Handlers()
    streams = {
        f"/t.S/{name}": getattr(handlers, name.lower())
        for name in ("Echo", "Fan", "Fail_Midway", "Hang", "Flood", "Count")
    }
    server = GrpcServer(
        {}, stream_handlers=streams, max_receive_message_bytes=BIG, max_send_message_bytes=BIG
    )
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("s", 0, network=network, **kw))
        yield Served(handlers, network, f"s:{port}", nursery)
        nursery.cancel_scope.cancel()


async def replies(channel: Channel, method: str, requests: list[bytes]) -> list[bytes]:
    async with channel.stream(f"/t.S/{method}".encode()) as stream:
        for request in requests:
            await stream.send(request)
        stream.end()
        return [reply async for reply in stream]


async def test_a_bidirectional_stream_echoes_in_order(
    served: Served, autojump_clock: MockClock
) -> None:
    assert await replies(served.channel(), "Echo", [b"a", b"bc", b""]) == [b"A", b"BC", b""]


async def test_one_request_many_responses(served: Served, autojump_clock: MockClock) -> None:
    assert await replies(served.channel(), "Fan", [b"5"]) == [b"0", b"1", b"2", b"3", b"4"]
    assert await replies(served.channel(), "Fan", [b"0"]) == []


async def test_a_handler_error_ends_the_stream_after_what_it_sent(
    served: Served, autojump_clock: MockClock
) -> None:
    got: list[bytes] = []
    with pytest.raises(GrpcError) as caught:
        async with served.channel().stream(b"/t.S/Fail_Midway") as stream:
            stream.end()
            async for reply in stream:
                got.append(reply)
    assert got == [b"one", b"two"]
    assert (caught.value.code, caught.value.message) == (StatusCode.ABORTED, "sequence reset")


async def test_leaving_early_resets_the_call_and_cancels_the_handler(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    async with channel.stream(b"/t.S/Hang") as stream:
        await stream.send(b"x")
        await served.handlers.started.wait()
    with trio.fail_after(1):
        await served.handlers.cancelled.wait()
    assert await replies(channel, "Echo", [b"ok"]) == [b"OK"]  # the connection lives on


async def test_a_half_close_with_no_message_reaches_the_handler(
    served: Served, autojump_clock: MockClock
) -> None:
    assert await replies(served.channel(), "Count", []) == [b"0"]
    assert await replies(served.channel(), "Count", [b"a"] * 100) == [b"100"]


async def test_a_sender_waits_for_a_peer_that_does_not_read(
    served: Served, autojump_clock: MockClock
) -> None:
    channel = served.channel()
    async with channel.stream(b"/t.S/Flood") as stream:
        await stream.send(b"go")
        stream.end()
        served.network.stall_clients(served.target)  # the client stops reading
        await trio.testing.wait_all_tasks_blocked()
        held = served.handlers.sent
        assert 16 < held < 40  # about the 32 MiB stream window, not all 64 MiB
        served.network.resume_clients(served.target)
        received = [reply async for reply in stream]
    assert len(received) == 64
    assert served.handlers.sent == 64


async def test_an_unknown_streaming_method_is_unimplemented(
    served: Served, autojump_clock: MockClock
) -> None:
    with pytest.raises(GrpcError) as caught:
        await replies(served.channel(), "Nope", [b"x"])
    assert caught.value.code is StatusCode.UNIMPLEMENTED


async def test_a_dead_server_ends_the_stream_unavailable(autojump_clock: MockClock) -> None:
    handlers = Handlers()
    server = GrpcServer({}, stream_handlers={"/t.S/Hang": handlers.hang})
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[int]) -> None:
            with scope:
                await server.serve("s", 0, network=network, task_status=task_status)

        port = await nursery.start(run)
        channel = Channel(f"s:{port}", nursery, network=network)
        with pytest.raises(WorkerUnavailable):
            async with channel.stream(b"/t.S/Hang") as stream:
                await stream.send(b"x")
                await handlers.started.wait()
                scope.cancel()  # the server dies mid-stream
                await stream.receive()  # never a hang: the call ends
        nursery.cancel_scope.cancel()
