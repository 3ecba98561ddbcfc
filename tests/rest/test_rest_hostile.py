"""Hostile REST input: every bad request gets a clear 4xx or a closed connection, and
other clients go on being served.

Real gateway and workers on loopback, raw sockets for what no client library sends.
"""

from __future__ import annotations

import httpx
import trio

from rsgw.config._blocks import GrpcLimits
from tests.gateway.fleet import Fleet, open_fleet

BODY_LIMIT = 64 * 1024


async def served(fleet: Fleet) -> None:
    """A well-behaved client is answered."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{fleet.gateway.http_port}") as http:
        assert (await http.get("/v2/health/ready")).status_code == 200


async def closed_by_server(stream: trio.SocketStream, seconds: float) -> bytes:
    """Everything the server sends until it closes the connection (within `seconds`)."""
    received = b""
    with trio.fail_after(seconds):
        while chunk := await stream.receive_some(65536):
            received += chunk
    return received


async def test_oversize_bodies_and_bad_header_lengths_are_4xx() -> None:
    limits = GrpcLimits(max_recv_msg_bytes=BODY_LIMIT, max_send_msg_bytes=BODY_LIMIT)
    async with open_fleet(2, grpc=limits) as fleet:
        base = f"http://127.0.0.1:{fleet.gateway.http_port}"
        async with httpx.AsyncClient(base_url=base) as http:
            big = await http.post("/v2/models/simple/infer", content=b"x" * (BODY_LIMIT + 1))
            assert big.status_code == 413
            assert "larger than" in big.json()["error"]
            header = b'{"inputs": []}'
            past = await http.post(
                "/v2/models/simple/infer",
                content=header,
                headers={"inference-header-content-length": str(len(header) + 10)},
            )
            assert past.status_code == 400
            junk = await http.post(
                "/v2/models/simple/infer",
                content=header,
                headers={"inference-header-content-length": "many"},
            )
            assert junk.status_code == 400
            typed = await http.post(
                "/v2/models/simple/infer",
                json={"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT33"}]},
            )
            assert typed.status_code == 400
        await served(fleet)


async def test_a_slowloris_is_cut_off_and_others_are_served() -> None:
    async with open_fleet(1) as fleet:
        port = fleet.gateway.http_port
        assert port is not None
        slow = await trio.open_tcp_stream("127.0.0.1", port)
        await slow.send_all(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")
        await served(fleet)  # others are not held up meanwhile
        await closed_by_server(slow, 30)  # the keep-alive timer runs while the head dribbles
        await slow.aclose()


async def test_an_unfinished_body_costs_only_its_connection() -> None:
    async with open_fleet(1) as fleet:
        port = fleet.gateway.http_port
        assert port is not None
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
            b'Content-Length: 100000\r\n\r\n{"inputs": ['
        )
        await stream.aclose()  # gone mid-body
        await served(fleet)


async def test_many_idle_keep_alive_connections_are_closed_and_do_not_block_others() -> None:
    async with open_fleet(1) as fleet:
        port = fleet.gateway.http_port
        assert port is not None
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(300)]
        await served(fleet)
        async with trio.open_nursery() as nursery:
            for stream in idle:
                nursery.start_soon(closed_by_server, stream, 30)
        for stream in idle:
            await stream.aclose()
        await served(fleet)


async def test_malformed_http_is_answered_400_or_closed() -> None:
    async with open_fleet(1) as fleet:
        port = fleet.gateway.http_port
        assert port is not None
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"\x16\x03\x01 not http at all\r\n\r\n")
        answer = await closed_by_server(stream, 30)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
        await stream.aclose()
        huge = await trio.open_tcp_stream("127.0.0.1", port)
        await huge.send_all(
            b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
        )
        answer = await closed_by_server(huge, 30)
        assert answer == b"" or answer.split(b"\r\n")[0].split()[1] in (b"400", b"413", b"431")
        await huge.aclose()
        await served(fleet)
