"""A bare HTTP/2 client that sends what no gRPC library would, over one real connection.

`HostileConnection` writes raw header blocks (bytes, unvalidated, in any order) and
frames h2 itself would refuse to send, then reads how the server ended each
stream: its grpc-status, an RST_STREAM, or the whole connection going away. The
reliability tests use it to show a bad call costs that call alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import trio

Header = tuple[bytes, bytes]


def grpc_headers(path: bytes = b"/t.Test/Echo", **override: bytes) -> list[Header]:
    """A valid gRPC request header block, with any field replaced (`content_type=` ...)."""
    fields = {
        b":method": b"POST",
        b":scheme": b"http",
        b":path": path,
        b":authority": b"127.0.0.1",
        b"content-type": b"application/grpc",
        b"te": b"trailers",
    }
    for name, value in override.items():
        fields[name.replace("_", "-").encode()] = value
    return list(fields.items())


def framed(body: bytes, flag: int = 0) -> bytes:
    """One gRPC length-prefixed message."""
    return flag.to_bytes(1, "big") + len(body).to_bytes(4, "big") + body


@dataclass
class Outcome:
    """How the server ended one stream."""

    status: int | None = None
    message: str = ""
    reset: int | None = None
    data: bytes = b""
    fields: dict[bytes, bytes] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.status is not None or self.reset is not None


class HostileConnection:
    """One TCP connection driven by a permissive h2 client state machine."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=True,
                header_encoding=None,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
                validate_inbound_headers=False,
            )
        )
        self.outcomes: dict[int, Outcome] = {}
        self.terminated: h2.events.ConnectionTerminated | None = None
        self.closed = False
        self.h2.initiate_connection()

    @classmethod
    async def open(cls, port: int) -> HostileConnection:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def flush(self) -> None:
        """Send what h2 queued; a server that hung up is no error here (we are hostile)."""
        data = self.h2.data_to_send()
        if data and not self.closed:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.closed = True

    async def call(self, headers: list[Header], body: bytes | None = b"", end: bool = True) -> int:
        """Send one request (headers, then `body` framed unless None); its stream id."""
        stream_id = self.h2.get_next_available_stream_id()
        self.outcomes[stream_id] = Outcome()
        self.h2.send_headers(stream_id, headers, end_stream=body is None and end)
        if body is not None:
            self.h2.send_data(stream_id, framed(body), end_stream=end)
        await self.flush()
        return stream_id

    async def wait(self, *stream_ids: int) -> list[Outcome]:
        """Read until every one of `stream_ids` has ended (or the connection has)."""
        while not all(self.outcomes[s].ended for s in stream_ids) and self.terminated is None:
            if not await self.read():
                break
        return [self.outcomes[s] for s in stream_ids]

    async def read(self) -> bool:
        """Read once and answer what h2 must; False once the server hung up."""
        try:
            chunk = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        self.receive(bytes(chunk))
        await self.flush()
        return True

    async def until_closed(self) -> None:
        """Read until the server hangs up (it sent GOAWAY and closed)."""
        while await self.read():
            pass

    def receive(self, chunk: bytes) -> None:
        for event in self.h2.receive_data(chunk):
            stream_id = getattr(event, "stream_id", None)
            outcome = self.outcomes.get(stream_id) if stream_id else None
            if isinstance(event, h2.events.ConnectionTerminated):
                self.terminated = event
            elif outcome is None:
                continue
            elif isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                outcome.fields.update((bytes(k), bytes(v)) for k, v in event.headers)
                if b"grpc-status" in outcome.fields:
                    outcome.status = int(outcome.fields[b"grpc-status"])
                    message = outcome.fields.get(b"grpc-message", b"")
                    outcome.message = unquote(message.decode("ascii", "replace"))
            elif isinstance(event, h2.events.DataReceived):
                outcome.data += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                outcome.reset = int(event.error_code)
