"""The REST listener's own HTTP/1.1 head parser, checked against h11.

Whatever `parse_head` accepts, h11 must read the same way (method, target, header
fields, body length); whatever h11 would refuse or frame otherwise, `parse_head`
must leave to h11 (`UNUSUAL`) or say is not complete yet.
"""

from __future__ import annotations

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.rest._http1 import NEED_DATA, TOO_LARGE, UNUSUAL, Head, parse_head, response_bytes

LIMIT = 16 * 1024


def h11_reads(data: bytes) -> tuple[h11.Request, int] | None:
    """h11's request and body length for `data`, or None if it refuses the head."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=LIMIT)
    connection.receive_data(data)
    try:
        event = connection.next_event()
    except h11.RemoteProtocolError:
        return None
    if not isinstance(event, h11.Request):
        return None
    length = next((int(v) for k, v in event.headers if k == b"content-length"), 0)
    return event, length


def agrees(data: bytes) -> None:
    head = parse_head(data, LIMIT)
    if head is NEED_DATA or head is UNUSUAL or head is TOO_LARGE:
        return
    assert isinstance(head, Head)
    read = h11_reads(data)
    assert read is not None, data
    request, length = read
    assert head.method == request.method
    assert head.target == request.target
    assert head.headers == [(k, v) for k, v in request.headers]
    assert head.body_length == length
    assert data[: head.body_start].endswith(b"\r\n\r\n")


USUAL = (
    b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: a:1\r\nContent-Length: 3\r\n"
    b"Content-Type: application/json\r\nX-Empty:\r\nX-Spaces:  a  b \t\r\n\r\nabc"
)


def test_the_usual_request_is_read_as_h11_reads_it() -> None:
    head = parse_head(USUAL, LIMIT)
    assert isinstance(head, Head)
    assert (head.method, head.target, head.body_length, head.close) == (
        b"POST",
        b"/v2/models/m/infer?x=1",
        3,
        False,
    )
    assert (b"x-spaces", b"a  b") in head.headers
    agrees(USUAL)


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.0\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",  # no Host
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\nHost: a\n\n",
        b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\x00\r\n\r\n",
        b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
    ],
)
def test_anything_unusual_is_left_to_h11(data: bytes) -> None:
    assert parse_head(data, LIMIT) is UNUSUAL


def test_incomplete_and_too_large_heads() -> None:
    assert parse_head(USUAL[:40], LIMIT) is NEED_DATA
    big = b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"a" * LIMIT + b"\r\n\r\n"
    assert parse_head(big, LIMIT) is TOO_LARGE
    closing = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n"
    head = parse_head(closing, LIMIT)
    assert isinstance(head, Head) and head.close


FIELD_NAMES = st.sampled_from(
    [b"Host", b"host", b"Content-Length", b"Connection", b"X-A", b"Authorization", b"X Y"]
)
FIELD_VALUES = st.one_of(
    st.sampled_from([b"1", b"0", b"12", b"close", b"keep-alive", b" a ", b"", b"a\tb", b"01"]),
    st.binary(max_size=8),
)


@given(
    method=st.sampled_from([b"GET", b"POST", b"HEAD", b"G@T", b"PUT"]),
    target=st.one_of(st.sampled_from([b"/", b"/v2?q=%20", b"*"]), st.binary(max_size=6)),
    version=st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"http/1.1"]),
    fields=st.lists(st.tuples(FIELD_NAMES, st.sampled_from([b": ", b":", b" : "]), FIELD_VALUES)),
)
def test_whatever_it_accepts_h11_reads_alike(
    method: bytes, target: bytes, version: bytes, fields: list[tuple[bytes, bytes, bytes]]
) -> None:
    head = method + b" " + target + b" " + version + b"\r\n"
    head += b"".join(name + sep + value + b"\r\n" for name, sep, value in fields)
    agrees(head + b"\r\n" + b"x" * 20)


def test_responses_are_what_h11_reads() -> None:
    data = response_bytes(200, [(b"content-length", b"2"), (b"x-a", b"b")], b"ok", True)
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "a")]))
    client.send(h11.EndOfMessage())
    client.receive_data(data)
    response = client.next_event()
    assert isinstance(response, h11.Response)
    assert (response.status_code, response.reason) == (200, b"OK")
    assert (b"connection", b"close") in list(response.headers)
    body = client.next_event()
    assert isinstance(body, h11.Data) and body.data == b"ok"
