"""The sans-IO connection core, driven as two peers that pass bytes by hand.

No trio, no sockets: a client core and a server core exchange `data_to_send()`
through `receive_data()`, in chunks as small as one byte, as h11's tests drive
its connection. Hypothesis picks interleavings of calls, answers, cancellations
and byte deliveries, and every call must end exactly once, as the table says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import h2.connection
import h2.events
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsgw.base._body import Body
from rsgw.base._errors import GrpcError, WorkerUnavailable
from rsgw.base._status import StatusCode
from rsgw.grpc.protocol._calls import (
    CallEnded,
    CallStarted,
    ConnectionTerminated,
    EndCause,
    Event,
    HalfClosed,
    MessageReceived,
    PeerSettled,
    ResponseStarted,
)
from rsgw.grpc.protocol._client_connection import ClientConnection
from rsgw.grpc.protocol._connection import ConnectionState
from rsgw.grpc.protocol._server_connection import ServerConnection

PATH = b"/t.T/Echo"
HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":authority", b"test"),
    (b":path", PATH),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]
E = TypeVar("E", bound=Event)
#: HTTP/2's smallest window, so that modest messages exercise flow control.
SMALL_WINDOW = 65535


@dataclass
class Pair:
    """A client core and a server core connected by hand."""

    client: ClientConnection
    server: ServerConnection
    client_events: list[Event] = field(default_factory=list)
    server_events: list[Event] = field(default_factory=list)

    def pump(self, chunk: int = 1 << 30) -> None:
        """Deliver bytes both ways, `chunk` bytes at a time, until neither side has any."""
        while True:
            to_server = self.client.data_to_send()
            to_client = self.server.data_to_send()
            if not to_server and not to_client:
                return
            for start in range(0, len(to_server), chunk):
                self.server_events += self.server.receive_data(to_server[start : start + chunk])
            for start in range(0, len(to_client), chunk):
                self.client_events += self.client.receive_data(to_client[start : start + chunk])

    def server_of(self, kind: type[E]) -> list[E]:
        return [e for e in self.server_events if isinstance(e, kind)]

    def client_of(self, kind: type[E]) -> list[E]:
        return [e for e in self.client_events if isinstance(e, kind)]

    def ended(self, stream_id: int) -> list[CallEnded]:
        return [e for e in self.client_of(CallEnded) if e.stream_id == stream_id]


def new_pair(window: int = 32 * 1024 * 1024, max_receive: int = 4 * 1024 * 1024) -> Pair:
    pair = Pair(
        ClientConnection(
            peer="server:1",
            window_bytes=window,
            max_receive_message_bytes=max_receive,
        ),
        ServerConnection(window_bytes=window, max_receive_message_bytes=max_receive),
    )
    pair.pump()
    return pair


def messages_of(events: list[Event], stream_id: int) -> list[Body]:
    return [
        e.message for e in events if isinstance(e, MessageReceived) and e.stream_id == stream_id
    ]


def test_unary_round_trip() -> None:
    pair = new_pair()
    stream_id = pair.client.start_call(HEADERS, b"ping")
    pair.pump()
    (started,) = pair.server_of(CallStarted)
    assert started.stream_id == stream_id and started.head.path == PATH
    assert messages_of(pair.server_events, stream_id) == [b"ping"]
    assert any(isinstance(e, HalfClosed) for e in pair.server_events)
    pair.server.send_response(stream_id, b"pong")
    pair.pump()
    assert [type(e) for e in pair.client_events] == [
        PeerSettled,  # the server's first SETTINGS
        ResponseStarted,
        MessageReceived,
        CallEnded,
    ]
    assert pair.ended(stream_id) == [CallEnded(stream_id, EndCause.ANSWERED, None, True)]
    assert pair.client.active_calls == pair.server.active_calls == 0


def test_byte_at_a_time_gives_the_same_events() -> None:
    whole, split = new_pair(), new_pair()
    for pair, chunk in ((whole, 1 << 30), (split, 1)):
        stream_id = pair.client.start_call(HEADERS, b"x" * 300)
        pair.pump(chunk)
        pair.server.send_response(stream_id, b"y" * 300, StatusCode.OK)
        pair.pump(chunk)
    assert whole.client_events == split.client_events
    assert [type(e) for e in whole.server_events] == [type(e) for e in split.server_events]


def test_error_status_and_trailers_reach_the_client() -> None:
    pair = new_pair()
    stream_id = pair.client.start_call(HEADERS, b"")
    pair.pump()
    pair.server.send_response(stream_id, None, StatusCode.NOT_FOUND, "no model", ((b"x-w", b"0"),))
    pair.pump()
    (ended,) = pair.ended(stream_id)
    assert ended.cause is EndCause.ANSWERED
    assert isinstance(ended.error, GrpcError)
    assert (ended.error.code, ended.error.message) == (StatusCode.NOT_FOUND, "no model")
    assert ended.error.trailers == ((b"x-w", b"0"),)
    assert ended.response_started  # trailers-only still counts as an answer


def test_large_messages_wait_for_window_and_arrive_whole() -> None:
    pair = new_pair(window=SMALL_WINDOW, max_receive=1 << 22)
    payload = bytes(range(256)) * 2048  # 512 KiB: eight windows
    first = pair.client.start_call(HEADERS, payload)
    second = pair.client.start_call(HEADERS, b"small")
    assert pair.client.call(first).sending  # type: ignore[union-attr]
    pair.pump()
    assert messages_of(pair.server_events, first) == [payload]
    assert messages_of(pair.server_events, second) == [b"small"]
    pair.server.send_response(first, payload[::-1])
    pair.pump()
    assert messages_of(pair.client_events, first) == [payload[::-1]]


def test_an_oversized_message_fails_only_its_call() -> None:
    pair = new_pair(max_receive=100)
    big = pair.client.start_call(HEADERS, b"x" * 101)
    fine = pair.client.start_call(HEADERS, b"ok")
    pair.pump()
    (ended,) = pair.ended(big)
    assert ended.error is not None and ended.error.code is StatusCode.RESOURCE_EXHAUSTED
    assert "101 vs. 100" in ended.error.message
    server_end = next(e for e in pair.server_of(CallEnded) if e.stream_id == big)
    assert server_end.cause is EndCause.FAILED
    pair.server.send_response(fine, b"fine")
    pair.pump()
    assert pair.ended(fine)[0].error is None


def test_client_cancel_resets_and_ends_the_server_call() -> None:
    pair = new_pair()
    stream_id = pair.client.start_call(HEADERS, b"slow")
    pair.pump()
    pair.client.cancel(stream_id)
    pair.pump()
    (ended,) = pair.server_of(CallEnded)
    assert ended.cause is EndCause.RESET
    assert pair.ended(stream_id) == []  # the side that cancelled hears nothing
    pair.server.send_response(stream_id, b"late")  # ignored: the call is gone
    pair.pump()
    assert pair.client.active_calls == pair.server.active_calls == 0


def test_go_away_refuses_new_calls_and_follows_the_last_answer() -> None:
    pair = new_pair()
    first = pair.client.start_call(HEADERS, b"a")
    pair.pump()
    pair.server.go_away()
    assert pair.server.state.value == "draining"
    second = pair.client.start_call(HEADERS, b"b")
    pair.pump()
    (refused,) = pair.ended(second)
    assert refused.cause is EndCause.REFUSED and isinstance(refused.error, WorkerUnavailable)
    pair.server.send_response(first, b"A")
    assert pair.server.state.value == "closed"  # GOAWAY queued after the answer
    pair.pump()
    assert pair.ended(first)[0].error is None
    assert any(isinstance(e, ConnectionTerminated) for e in pair.client_events)
    assert not pair.client.usable
    with pytest.raises(WorkerUnavailable, match="going away"):
        pair.client.start_call(HEADERS, b"c")


def test_eof_ends_every_call_once() -> None:
    pair = new_pair()
    waiting = pair.client.start_call(HEADERS, b"a")
    answered = pair.client.start_call(HEADERS, b"b")
    pair.pump()
    pair.server.send_response(answered, b"B")
    pair.pump()
    (lost,) = pair.client.receive_data(b"")
    assert isinstance(lost, CallEnded)
    assert (lost.stream_id, lost.cause, lost.response_started) == (waiting, EndCause.LOST, False)
    assert isinstance(lost.error, WorkerUnavailable)
    assert pair.client.receive_data(b"") == []
    assert pair.client.closed_reason == "closed by the peer"


def test_garbage_ends_the_connection_with_h2s_goaway() -> None:
    server = ServerConnection()
    assert server.receive_data(b"GET / HTTP/1.1\r\n\r\n") == []
    assert server.state is ConnectionState.CLOSED
    assert server.closed_reason is not None and "HTTP/2" in server.closed_reason


def test_a_request_that_is_not_grpc_is_answered_without_an_event() -> None:
    server = ServerConnection()
    raw = h2.connection.H2Connection()  # plain h2, to send what no gRPC client would
    raw.initiate_connection()
    headers = [h for h in HEADERS if h[0] != b"content-type"] + [(b"content-type", b"text/html")]
    raw.send_headers(raw.get_next_available_stream_id(), headers, end_stream=True)
    assert server.receive_data(raw.data_to_send()) == []
    answer = raw.receive_data(server.data_to_send())
    response = next(e for e in answer if isinstance(e, h2.events.ResponseReceived))
    assert (b"grpc-status", b"13") in (response.headers or [])


# -- interleavings ---------------------------------------------------------------------------

ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 150_000)),
        st.tuples(st.just("answer"), st.integers(0, 7), st.integers(0, 150_000), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 7)),
        st.tuples(st.just("pump"), st.sampled_from([7, 1000, 1 << 30])),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(ACTIONS)
def test_every_call_ends_exactly_once_whatever_the_interleaving(
    actions: list[tuple[object, ...]],
) -> None:
    pair = new_pair(window=SMALL_WINDOW)
    requests: dict[int, bytes] = {}
    #: What the server answered, and whether it had the whole request by then.
    answers: dict[int, tuple[bytes, bool, bool]] = {}
    cancelled: set[int] = set()

    def answer(stream_id: int, size: int, ok: bool) -> None:
        call = pair.server.call(stream_id)
        if call is None or stream_id in answers:
            return  # not arrived yet, reset, or answered: the core ignores it too
        whole = any(e.stream_id == stream_id for e in pair.server_of(HalfClosed))
        reply = bytes([stream_id % 251]) * size
        pair.server.send_response(
            stream_id, reply if ok else None, StatusCode.OK if ok else StatusCode.ABORTED, "no"
        )
        answers[stream_id] = (reply, ok, whole)

    for action in actions:
        kind = action[0]
        if kind == "start":
            size = action[1]
            assert isinstance(size, int)
            stream_id = pair.client.start_call(HEADERS, bytes([len(requests) % 251]) * size)
            requests[stream_id] = bytes([len(requests) % 251]) * size
        elif kind == "answer" and requests:
            index, size, ok = action[1], action[2], action[3]
            assert isinstance(index, int) and isinstance(size, int) and isinstance(ok, bool)
            answer(sorted(requests)[index % len(requests)], size, ok)
        elif kind == "cancel" and requests:
            index = action[1]
            assert isinstance(index, int)
            stream_id = sorted(requests)[index % len(requests)]
            if not pair.ended(stream_id):
                pair.client.cancel(stream_id)
                cancelled.add(stream_id)
        elif kind == "pump":
            chunk = action[1]
            assert isinstance(chunk, int)
            pair.pump(chunk)
    # Let everything finish: answer whatever the server saw complete and has not answered.
    pair.pump()
    for event in pair.server_of(HalfClosed):
        answer(event.stream_id, 10, True)
    pair.pump()

    for stream_id, request in requests.items():
        ends = pair.ended(stream_id)
        if stream_id in cancelled:
            assert ends == []
            continue
        assert len(ends) == 1, (stream_id, ends)
        reply, ok, whole = answers[stream_id]
        if whole:
            assert messages_of(pair.server_events, stream_id) == [request]
        if ok:
            assert ends[0].error is None
            assert messages_of(pair.client_events, stream_id) == [reply]
        else:
            assert isinstance(ends[0].error, GrpcError)
            assert ends[0].error.code is StatusCode.ABORTED
    # The server never hears of a call twice, and both sides forget every call.
    started = [e.stream_id for e in pair.server_of(CallStarted)]
    assert len(started) == len(set(started))
    assert pair.client.active_calls == 0
    assert pair.server.active_calls == 0
