"""rsgw's HTTP/2 connection against h2 as the oracle, and against garbage.

Differential: a script of client actions (open a call with headers, send DATA, end,
reset, ping) is played by a client, and the bytes it writes go, cut in random chunks,
to an h2 server and to an rsgw server; both must see the same calls, headers, data,
ends and resets. Both ways round: an h2 client's bytes, and an rsgw client's. Then
the answers go back the same way. Fuzzing: any bytes after a valid preface end in
events or in `ProtocolError`, never in another exception.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsgw.http2 import _http2 as http2
from rsgw.http2._http2_state import PREFACE
from tests.grpc.test_metadata import GOOD

REQUEST = GOOD  # a gRPC request's headers
RESPONSE = [(b":status", b"200"), (b"content-type", b"application/grpc")]
TRAILERS = [(b"grpc-status", b"0")]
COMPARED = (
    "RequestReceived",
    "ResponseReceived",
    "TrailersReceived",
    "DataReceived",
    "StreamEnded",
    "StreamReset",
    "PingReceived",
    "PingAckReceived",
    "ConnectionTerminated",
)


def h2_side(client_side: bool) -> h2.connection.H2Connection:
    config = h2.config.H2Configuration(
        client_side=client_side,
        header_encoding=None,
        validate_inbound_headers=False,
        validate_outbound_headers=False,
        normalize_inbound_headers=False,
        normalize_outbound_headers=False,
    )
    conn = h2.connection.H2Connection(config)
    conn.initiate_connection()
    return conn


def rsgw_side(client_side: bool) -> http2.Http2Connection:
    conn = http2.Http2Connection(client_side=client_side, window_bytes=1 << 20)
    conn.initiate_connection()
    return conn


def normal(events: list[Any]) -> list[tuple[object, ...]]:
    """What both must agree on, in order: the event kind and its fields."""
    out: list[tuple[object, ...]] = []
    data: dict[int, bytes] = {}
    for event in events:
        kind = type(event).__name__
        if kind not in COMPARED:
            continue
        if kind == "DataReceived":  # how DATA is cut into events may differ: join it
            data[event.stream_id] = data.get(event.stream_id, b"") + bytes(event.data)
            continue
        stream = getattr(event, "stream_id", 0)
        if stream in data:
            out.append(("DataReceived", stream, data.pop(stream)))
        if kind in ("RequestReceived", "ResponseReceived", "TrailersReceived"):
            out.append((kind, stream, [tuple(map(bytes, h)) for h in event.headers]))
        elif kind == "StreamReset":
            out.append((kind, stream, int(event.error_code)))
        elif kind in ("PingReceived", "PingAckReceived"):
            out.append((kind, bytes(event.ping_data)))
        elif kind == "ConnectionTerminated":
            out.append((kind, int(event.error_code), event.last_stream_id))
        else:
            out.append((kind, stream))
    out.extend(("DataReceived", stream, chunk) for stream, chunk in data.items())
    return out


def feed(conn: Any, data: bytes, cuts: list[int]) -> list[Any]:
    """`data` into `conn` in pieces cut at `cuts`; every event, or the error it raised."""
    events: list[Any] = []
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for start, end in itertools.pairwise(points):
        try:
            events += conn.receive_data(data[start:end])
        except (h2.exceptions.ProtocolError, http2.ProtocolError) as exc:
            events.append(("error", type(exc).__name__))
            break
    return events


def failed(events: list[Any]) -> bool:
    return bool(events) and isinstance(events[-1], tuple) and events[-1][0] == "error"


actions = st.lists(
    st.one_of(
        st.tuples(st.just("open"), st.booleans()),
        st.tuples(st.just("data"), st.binary(max_size=3000), st.booleans()),
        st.tuples(st.just("reset"), st.sampled_from([0, 8])),
        st.tuples(st.just("ping"), st.binary(min_size=8, max_size=8)),
        st.tuples(st.just("headers"), st.just(True)),  # trailers, ending the request
    ),
    max_size=20,
)


def play(client: Any, script: list[tuple[Any, ...]]) -> bytes:
    """Run `script` on a client connection (h2's or ours); the bytes it wrote."""
    stream_id = 0
    for action in script:
        with contextlib.suppress(h2.exceptions.ProtocolError, http2.ProtocolError, KeyError):
            if action[0] == "open":
                stream_id = client.get_next_available_stream_id()
                client.send_headers(stream_id, REQUEST, end_stream=action[1])
            elif action[0] == "data" and stream_id:
                room = min(client.local_flow_control_window(stream_id), 3000)
                client.send_data(stream_id, action[1][:room], end_stream=action[2])
            elif action[0] == "reset" and stream_id:
                client.reset_stream(stream_id, action[1])
            elif action[0] == "ping":
                client.ping(action[1])
            elif action[0] == "headers" and stream_id:
                client.send_headers(stream_id, [(b"x-trailer", b"1")], end_stream=True)
    return bytes(client.data_to_send())


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(actions, st.lists(st.integers(0, 100_000), max_size=6), st.booleans())
def test_a_server_sees_what_h2_sees(
    script: list[tuple[Any, ...]], cuts: list[int], ours: bool
) -> None:
    client = rsgw_side(True) if ours else h2_side(True)
    data = play(client, script)
    oracle, server = h2_side(False), rsgw_side(False)
    expected = feed(oracle, data, cuts)
    got = feed(server, data, cuts)
    assert normal(got) == normal(expected)
    assert failed(got) == failed(expected)


def feed_in_slices(
    conn: http2.Http2Connection, data: bytes, cuts: list[int], size: int
) -> list[Any]:
    """`feed`, but each piece parsed through `receive_some` in slices of about `size`."""
    events: list[Any] = []
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for start, end in itertools.pairwise(points):
        piece = memoryview(data)[start:end]
        try:
            while piece:
                got, taken = conn.receive_some(piece, size)
                assert 0 < taken <= len(piece)
                events += got
                piece = piece[taken:]
        except http2.ProtocolError as exc:
            events.append(("error", type(exc).__name__))
            break
    return events


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(actions, st.lists(st.integers(0, 100_000), max_size=6), st.integers(1, 5000))
def test_slices_cut_on_frame_boundaries_change_nothing(
    script: list[tuple[Any, ...]], cuts: list[int], size: int
) -> None:
    """What a flood guard's slicing (`receive_some`) sees is what one parse sees."""
    data = play(rsgw_side(True), script)
    whole = feed(rsgw_side(False), data, cuts)
    sliced = feed_in_slices(rsgw_side(False), data, cuts, size)
    assert normal(sliced) == normal(whole)
    assert failed(sliced) == failed(whole)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=2000), min_size=1, max_size=4), st.booleans())
def test_a_client_sees_answers_as_h2_sees_them(messages: list[bytes], ours: bool) -> None:
    """Calls from a client to a server (either kind), answered with headers, DATA and
    trailers; the answering bytes go to an h2 client and an rsgw client in step."""
    oracle_client, client = h2_side(True), rsgw_side(True)
    server = rsgw_side(False) if ours else h2_side(False)
    for conn in (oracle_client, client):
        for _ in messages:
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(stream_id, REQUEST, end_stream=True)
    request = client.data_to_send()
    assert normal(feed(server, oracle_client.data_to_send(), [])) == normal(
        feed(rsgw_side(False), request, [])
    )
    for index, message in enumerate(messages):
        stream_id = 1 + 2 * index
        server.send_headers(stream_id, RESPONSE)
        server.send_data(stream_id, message)
        server.send_headers(stream_id, TRAILERS, end_stream=True)
    answer = server.data_to_send()
    expected = normal(feed(oracle_client, answer, [7, 50, 999]))
    assert normal(feed(client, answer, [7, 50, 999])) == expected
    assert [e[0] for e in expected].count("TrailersReceived") == len(messages)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.booleans())
def test_garbage_after_the_preface_is_a_protocol_error_or_events(data: bytes, server: bool) -> None:
    conn = rsgw_side(not server)
    prefix = PREFACE if server else b""
    try:
        conn.receive_data(prefix + data)
    except http2.ProtocolError:
        assert conn._closed_by_error, "GOAWAY is queued"


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 10), st.integers(0, 255), st.integers(0, 7), st.binary(max_size=64)
        ),
        max_size=12,
    )
)
def test_well_framed_random_frames_end_in_events_or_a_protocol_error(
    frames: list[tuple[int, int, int, bytes]],
) -> None:
    """Frames with valid headers but random types, flags, streams and payloads."""
    data = PREFACE + b"".join(
        len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload
        for kind, flags, stream, payload in frames
    )
    conn = rsgw_side(False)
    with contextlib.suppress(http2.ProtocolError):
        conn.receive_data(data)


def test_a_protocol_error_sends_goaway_with_its_code() -> None:
    conn = rsgw_side(False)
    conn.data_to_send()
    bad_window = (4).to_bytes(3, "big") + bytes((8, 0)) + (0).to_bytes(4, "big") + bytes(4)
    try:
        conn.receive_data(PREFACE + bad_window)
    except http2.ProtocolError as exc:
        assert exc.error_code is http2.ErrorCodes.PROTOCOL_ERROR
    else:
        raise AssertionError("a WINDOW_UPDATE of 0 on the connection was accepted")
    events = h2_side(True).receive_data(conn.data_to_send())
    (goaway,) = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR


def big_request(size: int) -> tuple[http2.Http2Connection, bytes, bytes]:
    """A server, the client's preface and headers for stream 1, and one DATA frame of
    `size` bytes ending the stream (the server allows frames that large)."""
    server = http2.Http2Connection(client_side=False, window_bytes=1 << 22, max_frame_bytes=1 << 20)
    server.initiate_connection()
    client = rsgw_side(True)
    client.receive_data(server.data_to_send())  # its SETTINGS: big frames, big windows
    client.send_headers(1, REQUEST)
    head = client.data_to_send()
    payload = bytes(range(256)) * (size // 256)
    # Length, type DATA, flags END_STREAM, stream 1.
    frame = len(payload).to_bytes(3, "big") + b"\x00\x01" + (1).to_bytes(4, "big")
    return server, head, frame + payload


def test_a_large_data_frame_is_passed_on_as_it_arrives_not_joined() -> None:
    server, head, frame = big_request(60_000)
    server.receive_data(head)
    reads = [frame[i : i + 7_000] for i in range(0, len(frame), 7_000)]
    events: list[Any] = []
    for read in reads:
        got = server.receive_data(read)
        assert any(type(e).__name__ == "DataReceived" for e in got)  # every read, at once
        events += got
    data = [e for e in events if type(e).__name__ == "DataReceived"]
    assert all(isinstance(e.data, memoryview) for e in data)  # views of the reads
    assert b"".join(bytes(e.data) for e in data) == frame[9:]
    assert sum(e.flow_controlled_length for e in data) == len(frame) - 9
    assert type(events[-1]).__name__ == "StreamEnded"
    assert data[-1].stream_ended is events[-1]


def test_the_rest_of_a_frame_for_a_reset_stream_is_given_back() -> None:
    server, head, frame = big_request(60_000)
    server.receive_data(head)
    server.receive_data(frame[:1000])
    server.reset_stream(1, http2.ErrorCodes.CANCEL)
    server.data_to_send()
    window = server._inbound_window + server._processed
    assert server.receive_data(frame[1000:]) == []
    # Every byte of the frame counts as received and given back: nothing was lost.
    assert server._inbound_window + server._processed == window + (len(frame) - 1000)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 100_000), min_size=1, max_size=8), st.integers(1, 200_000))
def test_an_outbox_goes_in_full_frames_as_far_as_the_window_allows(
    sizes: list[int], window: int
) -> None:
    """`send_data_from` to an h2 client whose stream window is `window`: the bytes in
    order, in as few frames as the peer's frame size allows, the rest left in the
    outbox (a piece cut in two stays as its rest), END_STREAM with the last byte."""
    client = h2_side(True)
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
    client.increment_flow_control_window(1 << 20)
    server = rsgw_side(False)
    server.receive_data(client.data_to_send())
    stream_id = client.get_next_available_stream_id()
    client.send_headers(stream_id, REQUEST, end_stream=True)
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    data = bytes(i % 251 for i in range(sum(sizes)))
    outbox: list[bytes | memoryview] = []
    start = 0
    for size in sizes:
        outbox.append(memoryview(data)[start : start + size])
        start += size
    server.send_headers(stream_id, RESPONSE)
    server.send_data_from(stream_id, outbox, end_stream=True)
    events = client.receive_data(server.data_to_send())
    frames = [e for e in events if isinstance(e, h2.events.DataReceived)]
    sent = min(len(data), window)
    assert b"".join(e.data for e in frames) == data[:sent]
    assert b"".join(bytes(piece) for piece in outbox) == data[sent:]
    assert len(frames) == max(1, -(-sent // 16384))  # full frames but the last
    ended = any(isinstance(e, h2.events.StreamEnded) for e in events)
    assert ended == (sent == len(data))
