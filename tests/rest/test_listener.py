"""The REST listener's HTTP/1.1 (and its HTTP/2 hand-off), over real loopback sockets.

The door behind it is a real `RestDoor` with two stand-in handlers: ServerLive, and
RepositoryIndex answering one model named after the request's `repository_name`
(so a test can see that a body arrived whole). Raw sockets send what a test needs
byte for byte: pipelined requests, chunked bodies, `Expect: 100-continue`, a
slowloris; httpx checks that a real client (HTTP/1.1, and h2c with prior knowledge)
is served.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._call import CallContext
from rsgw.base._limits import ConnectionLimits
from rsgw.base._methods import Method
from rsgw.base._uploads import UploadBudget
from rsgw.rest._door import RestDoor
from rsgw.rest._listener import RestListener
from tests.helpers import wait_until_async

MAX_BODY = 4096


async def live(request: bytes, call: CallContext) -> bytes:
    return pb.ServerLiveResponse(live=True).SerializeToString()


#: A RepositoryIndex call for the repository "held" waits until this is set.
HELD: dict[str, trio.Event] = {}


async def index(request: bytes, call: CallContext) -> bytes:
    name = pb.RepositoryIndexRequest.FromString(request).repository_name
    if name == "held":
        HELD["entered"].set()
        await HELD["released"].wait()
    models = [pb.RepositoryIndexResponse.ModelIndex(name=name)]
    return pb.RepositoryIndexResponse(models=models).SerializeToString()


async def infer(request: Any, call: CallContext) -> bytes:
    raise AssertionError("not called")


@asynccontextmanager
async def listening(**options: Any) -> AsyncIterator[tuple[RestListener, int]]:
    door = RestDoor(
        {Method.SERVER_LIVE.path: live, Method.REPOSITORY_INDEX.path: index},
        {Method.MODEL_INFER.path: infer},
        time_limits={},
        max_body_bytes=options.pop("max_body", MAX_BODY),
    )
    limits = options.pop("limits", ConnectionLimits())
    listener = RestListener(door, limits=limits, **options)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(listener.serve, "127.0.0.1", 0)
        try:
            yield listener, port
        finally:
            for stream in OPENED:
                await stream.aclose()
            OPENED.clear()
            nursery.cancel_scope.cancel()


#: Every client connection a test opened, closed when its listener stops.
OPENED: list[trio.SocketStream] = []


LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def index_request(name: str, *extra: bytes) -> bytes:
    body = json.dumps({"repository_name": name}).encode()
    return (
        b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
        + b"".join(extra)
        + b"\r\n"
        + body
    )


class Reader:
    """Responses read one by one off a raw connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def _more(self) -> bool:
        data = await self.stream.receive_some(65536)
        self.buffer += data
        return bool(data)

    async def response(self, *, head_only: bool = False) -> tuple[bytes, dict[bytes, bytes], bytes]:
        """The next response's status line, headers and body (Content-Length framed)."""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in self.buffer:
                assert await self._more(), self.buffer
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            line, *fields = head.split(b"\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (f.partition(b":") for f in fields)}
            length = 0 if head_only else int(headers.get(b"content-length", b"0"))
            while len(self.buffer) < length:
                assert await self._more()
            body, self.buffer = self.buffer[:length], self.buffer[length:]
            return line, headers, body

    async def closed(self, seconds: float = 10) -> bool:
        """Whether the server closes the connection within `seconds` (sending nothing more)."""
        with trio.move_on_after(seconds):
            while await self._more():
                pass
            return True
        return False


async def connect(port: int) -> tuple[trio.SocketStream, Reader]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    OPENED.append(stream)
    return stream, Reader(stream)


async def test_keep_alive_serves_requests_one_after_another_on_one_connection() -> None:
    async with listening() as (listener, port):
        stream, reader = await connect(port)
        for name in ("a", "b", "c"):
            await stream.send_all(index_request(name))
            line, headers, body = await reader.response()
            assert line == b"HTTP/1.1 200 OK"
            assert headers[b"content-type"] == b"application/json"
            assert json.loads(body) == [{"name": name}]
        assert listener.connections == 1
        await stream.aclose()


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with listening() as (_, port):
        stream, reader = await connect(port)
        await stream.send_all(LIVE + index_request("one") + LIVE + index_request("two"))
        answers = [await reader.response() for _ in range(4)]
        assert [line for line, _, _ in answers] == [b"HTTP/1.1 200 OK"] * 4
        assert json.loads(answers[1][2]) == [{"name": "one"}]
        assert json.loads(answers[3][2]) == [{"name": "two"}]
        await stream.aclose()


async def test_a_request_split_across_packets_is_read_whole() -> None:
    async with listening() as (_, port):
        stream, reader = await connect(port)
        whole = index_request("split")
        for i in range(0, len(whole), 7):
            await stream.send_all(whole[i : i + 7])
            await trio.sleep(0.001)
        _, _, body = await reader.response()
        assert json.loads(body) == [{"name": "split"}]
        await stream.aclose()


async def test_chunked_bodies_and_100_continue_are_served_then_keep_alive_goes_on() -> None:
    async with listening() as (_, port):
        stream, reader = await connect(port)
        body = json.dumps({"repository_name": "chunky"}).encode()
        chunked = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 5]), body[i : i + 5])
            for i in range(0, len(body), 5)
        )
        await stream.send_all(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked
            + b"0\r\n\r\n"
        )
        _, _, answer = await reader.response()
        assert json.loads(answer) == [{"name": "chunky"}]
        # Expect: 100-continue: the interim answer comes before the body is sent.
        request = index_request("patient", b"Expect: 100-continue\r\n")
        head, _, rest = request.partition(b"\r\n\r\n")
        await stream.send_all(head + b"\r\n\r\n")
        line, _, _ = await reader.response(head_only=True)
        assert line.startswith(b"HTTP/1.1 100")
        await stream.send_all(rest)
        _, _, answer = await reader.response()
        assert json.loads(answer) == [{"name": "patient"}]
        # Then a plain request on the same connection.
        await stream.send_all(LIVE)
        line, _, _ = await reader.response()
        assert line == b"HTTP/1.1 200 OK"
        await stream.aclose()


async def test_head_gets_the_length_and_no_body() -> None:
    async with listening() as (_, port):
        stream, reader = await connect(port)
        await stream.send_all(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" + LIVE)
        line, headers, _ = await reader.response(head_only=True)
        assert line == b"HTTP/1.1 200 OK"
        assert int(headers[b"content-length"]) > 0
        line, _, body = await reader.response()  # the next answer follows at once
        assert line == b"HTTP/1.1 200 OK" and body
        await stream.aclose()


async def test_connection_close_and_http_1_0_end_the_connection_after_the_answer() -> None:
    async with listening() as (_, port):
        stream, reader = await connect(port)
        await stream.send_all(
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        _, headers, _ = await reader.response()
        assert headers[b"connection"] == b"close"
        assert await reader.closed()
        stream, reader = await connect(port)
        await stream.send_all(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        line, _, _ = await reader.response()
        assert line.startswith(b"HTTP/1.1 200")
        assert await reader.closed()


async def test_bodies_past_the_limit_are_413_and_the_connection_ends() -> None:
    async with listening() as (_, port):
        stream, reader = await connect(port)
        big = b"x" * (MAX_BODY + 1)
        await stream.send_all(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            % (len(big), big)
        )
        line, _, body = await reader.response()
        assert line.startswith(b"HTTP/1.1 413")
        assert b"larger than" in json.loads(body)["error"].encode()
        assert await reader.closed()
        stream, reader = await connect(port)
        chunk = b"y" * 1000
        await stream.send_all(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 5
        )
        line, _, _ = await reader.response()
        assert line.startswith(b"HTTP/1.1 413")
        assert await reader.closed()


def padded_index_request(name: str, size: int) -> tuple[bytes, bytes]:
    """A RepositoryIndex request whose JSON body is padded with spaces to `size` bytes:
    its head, and its body."""
    body = json.dumps({"repository_name": name}).encode()
    body += b" " * (size - len(body))
    head = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    return head % size, body


def asked(budget: UploadBudget, count: int) -> bool:
    """Whether `count` bodies have asked `budget` for a grant past the first."""
    return budget.waiting_tickets + budget.refused == count


async def send_quietly(stream: trio.SocketStream, data: bytes) -> None:
    """Send what the server reads of `data` (a refused body is not all read)."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(data)


async def test_large_bodies_wait_for_the_upload_budget_and_past_it_are_429() -> None:
    """A 2 MiB budget held by a body that stalls: the next large body is not read until
    the budget frees (then answered), and one past the waiting bound is 429."""
    mib = 1024 * 1024
    budget = UploadBudget(2 * mib, mib)
    async with listening(upload_budget=budget, max_body=8 * mib) as (_, port):
        holder, holder_reader = await connect(port)
        head, body = padded_index_request("held-up", 2 * mib)
        await holder.send_all(head + body[: mib // 2])
        await wait_until_async(lambda: budget.granted == 2 * mib)
        waiters = [await connect(port) for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for number, (stream, _) in enumerate(waiters):
                head, body = padded_index_request(f"waiter-{number}", mib)
                nursery.start_soon(send_quietly, stream, head + body)
                await wait_until_async(functools.partial(asked, budget, number + 1))
            line, _, refusal = await waiters[2][1].response()
            assert line.startswith(b"HTTP/1.1 429")
            assert "too many unfinished requests" in json.loads(refusal)["error"]
            assert await waiters[2][1].closed()
            assert budget.waiting_tickets == 2
            await holder.send_all(padded_index_request("held-up", 2 * mib)[1][mib // 2 :])
            line, _, answer = await holder_reader.response()
            assert line.startswith(b"HTTP/1.1 200")
            assert json.loads(answer)[0]["name"] == "held-up"
            for number in range(2):
                line, _, answer = await waiters[number][1].response()
                assert line.startswith(b"HTTP/1.1 200")
                assert json.loads(answer)[0]["name"] == f"waiter-{number}"
        assert budget.granted == budget.waiting == 0


async def test_large_heads_and_malformed_requests_are_4xx_and_closed() -> None:
    limits = ConnectionLimits(max_header_list_bytes=2048)
    async with listening(limits=limits) as (_, port):
        stream, reader = await connect(port)
        await stream.send_all(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4000 + b"\r\n\r\n")
        line, _, _ = await reader.response()
        assert line.startswith(b"HTTP/1.1 431")
        assert await reader.closed()
        stream, reader = await connect(port)
        await stream.send_all(b"GET /v2 HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n")
        line, _, body = await reader.response()
        assert line.startswith(b"HTTP/1.1 400")
        assert "error" in json.loads(body)
        assert await reader.closed()


async def test_a_slowloris_and_an_idle_keep_alive_connection_are_closed() -> None:
    limits = ConnectionLimits(header_seconds=0.5)
    async with listening(limits=limits, keep_alive_seconds=0.3) as (listener, port):
        slow, slow_reader = await connect(port)
        await slow.send_all(b"GET /v2/health/live HTTP/1.1\r\n")
        idle, idle_reader = await connect(port)
        await idle.send_all(LIVE)
        await idle_reader.response()
        start = trio.current_time()
        assert await idle_reader.closed(5)
        assert trio.current_time() - start < 2
        assert await slow_reader.closed(5)
        _, silent_reader = await connect(port)  # says nothing at all
        assert await silent_reader.closed(5)
        await trio.sleep(0.1)
        assert listener.connections == 0


async def test_at_the_connection_cap_the_longest_idle_connection_makes_room() -> None:
    async with listening(limits=ConnectionLimits(max_connections=2)) as (listener, port):
        first, first_reader = await connect(port)
        second, second_reader = await connect(port)
        for stream, reader in ((first, first_reader), (second, second_reader)):
            await stream.send_all(LIVE)
            await reader.response()
        # Both idle: a third client is served at once, and the first (idle longest) goes.
        third, third_reader = await connect(port)
        await third.send_all(LIVE)
        with trio.fail_after(5):
            line, _, _ = await third_reader.response()
            assert line == b"HTTP/1.1 200 OK"
            assert await first.receive_some(100) == b""  # closed by the listener
        assert listener.evicted == 1
        for stream in (first, second, third):
            await stream.aclose()


async def test_at_the_connection_cap_busy_connections_are_never_cut() -> None:
    async with listening(limits=ConnectionLimits(max_connections=2)) as (listener, port):
        busy = []
        for _ in range(2):  # each in the middle of a request's body: a call in progress
            stream, _ = await connect(port)
            await stream.send_all(
                b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{"
            )
            busy.append(stream)
        third, third_reader = await connect(port)  # the kernel takes it into the backlog
        await third.send_all(LIVE)
        with trio.move_on_after(0.5) as waited:
            await third_reader.response()
        assert waited.cancelled_caught
        assert listener.evicted == 0
        await busy[0].aclose()  # one leaves: the third is served
        with trio.fail_after(5):
            line, _, _ = await third_reader.response()
        assert line == b"HTTP/1.1 200 OK"
        await busy[1].aclose()
        await third.aclose()


async def test_a_graceful_stop_closes_idle_connections_and_lets_a_call_finish() -> None:
    HELD.update(entered=trio.Event(), released=trio.Event())
    async with listening() as (listener, port):
        idle, idle_reader = await connect(port)
        await idle.send_all(LIVE)
        await idle_reader.response()
        busy, busy_reader = await connect(port)
        await busy.send_all(index_request("held"))
        await HELD["entered"].wait()
        async with trio.open_nursery() as nursery:
            cut: list[int] = []
            nursery.start_soon(lambda: _record(cut, listener.aclose(10)))
            assert await idle_reader.closed()
            with trio.fail_after(5):  # no new connections
                while True:
                    try:
                        (await trio.open_tcp_stream("127.0.0.1", port)).socket.close()
                    except OSError:
                        break
                    await trio.sleep(0.01)
            HELD["released"].set()
            line, headers, body = await busy_reader.response()
            assert line == b"HTTP/1.1 200 OK" and json.loads(body) == [{"name": "held"}]
            assert headers[b"connection"] == b"close"
            assert await busy_reader.closed()
        assert cut == [0]
        assert listener.connections == 0


async def test_a_call_still_running_when_the_grace_is_up_is_answered_503() -> None:
    HELD.update(entered=trio.Event(), released=trio.Event())
    async with listening() as (listener, port):
        busy, busy_reader = await connect(port)
        await busy.send_all(index_request("held"))
        await HELD["entered"].wait()
        assert await listener.aclose(0.1) == 1
        line, headers, body = await busy_reader.response()
        assert line == b"HTTP/1.1 503 Service Unavailable"
        assert "server shutting down" in json.loads(body)["error"]
        assert headers[b"connection"] == b"close"
        assert await listener.aclose(0.1) == 0  # a second call waits for the first


async def test_a_graceful_stop_ends_idle_http_2_connections() -> None:
    async with (
        listening() as (listener, port),
        httpx.AsyncClient(http1=False, http2=True) as h2c,
    ):
        answer = await h2c.get(f"http://127.0.0.1:{port}/v2/health/live")
        assert answer.http_version == "HTTP/2"
        with trio.fail_after(5):
            assert await listener.aclose(10) == 0
        assert listener.connections == 0


async def _record(into: list[int], stopping: Any) -> None:
    into.append(await stopping)


async def test_h2c_goes_to_hypercorn_and_an_upgrade_is_answered_in_http_1_1() -> None:
    async with listening() as (_, port):
        async with httpx.AsyncClient(http1=False, http2=True) as h2c:
            answer = await h2c.post(
                f"http://127.0.0.1:{port}/v2/repository/index", json={"repository_name": "h2"}
            )
            assert answer.http_version == "HTTP/2"
            assert answer.json() == [{"name": "h2"}]
        stream, reader = await connect(port)
        await stream.send_all(
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
        )
        line, _, _ = await reader.response()
        assert line == b"HTTP/1.1 200 OK"
        await stream.send_all(LIVE)  # still HTTP/1.1
        line, _, _ = await reader.response()
        assert line == b"HTTP/1.1 200 OK"
        await stream.aclose()


async def test_httpx_over_http_1_1() -> None:
    async with listening() as (listener, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for name in ("p", "q"):
                answer = await http.post("/v2/repository/index", json={"repository_name": name})
                assert answer.http_version == "HTTP/1.1"
                assert answer.json() == [{"name": name}]
            assert (await http.get("/v2/nowhere")).status_code == 404
        assert listener.connections <= 1
