"""The REST listener's own HTTP/1.1 head parser, checked against h11 as the oracle.

Whatever `parse_head` reads, h11 must read the same way (method, target, header
fields, version, body length or chunked); where h11 refuses, `parse_head` must
refuse too or say the head is not complete yet. Where h11 is more lenient (a bare
LF, obs-fold, two equal Content-Lengths, ...), `parse_head` refuses: never the other
way round. tests/rest/test_framing.py lists those divergences one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.rest._http1 import (
    NEED_DATA,
    TOO_LARGE,
    Head,
    Refusal,
    parse_head,
    response_bytes,
)

LIMIT = 16 * 1024


@dataclass
class H11Read:
    """What h11, as a server, makes of some bytes: `outcome` is "reads" (a request and
    its whole body), "refuses" (a RemoteProtocolError, `status` its hint) or "waits"
    (it needs more bytes; `request` is set if the head was read)."""

    outcome: str
    request: h11.Request | None = None
    body: bytes = b""
    status: int = 0


def h11_reads(data: bytes, limit: int = LIMIT) -> H11Read:
    """h11's reading of the request at the front of `data`, body and all."""
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=limit)
    connection.receive_data(data)
    request = None
    body = b""
    try:
        while True:
            event = connection.next_event()
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return H11Read("reads", request, body)
            else:
                return H11Read("waits", request, body)
    except h11.RemoteProtocolError as exc:
        return H11Read("refuses", request, body, exc.error_status_hint)


def h11_path(target: bytes) -> bytes:
    """The path and query of a target as h11 passes it on (absolute-form included)."""
    if target.startswith(b"/"):
        return target
    rest = target.partition(b"://")[2]
    path = rest[next((i for i, c in enumerate(rest) if c in b"/?"), len(rest)) :]
    return path if path.startswith(b"/") else b"/" + path


def agrees(data: bytes) -> None:
    """`parse_head` and h11 agree on `data` (see the module docstring)."""
    head = parse_head(data, LIMIT)
    read = h11_reads(data)
    if head is NEED_DATA:
        assert read.outcome == "waits" and read.request is None, (data, read)
        return
    if head is TOO_LARGE or isinstance(head, Refusal):
        return  # stricter than h11 is allowed (h11 may refuse too, or read it)
    assert isinstance(head, Head)
    assert read.request is not None, (data, read)
    request = read.request
    assert head.method == request.method
    assert head.target == h11_path(request.target)
    # h11 lower-cases a Transfer-Encoding value; it is read case-insensitively alike.
    ours = [(k, v.lower() if k == b"transfer-encoding" else v) for k, v in head.headers]
    assert ours == [(k, v) for k, v in request.headers]
    assert head.version == request.http_version
    fields = dict(request.headers)
    assert head.body_length == int(fields.get(b"content-length", b"0"))
    assert head.chunked == (b"transfer-encoding" in fields)
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
    assert (head.chunked, head.expect_continue, head.version) == (False, False, b"1.1")
    assert (b"x-spaces", b"a  b") in head.headers
    agrees(USUAL)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"GET / HTTP/1.0\r\n\r\n", (b"/", False, False, True)),
        (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", (b"/", False, False, False)),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            (b"/", True, False, False),
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  Chunked \r\n\r\n",
            (b"/", True, False, False),
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n",
            (b"/", False, True, False),
        ),
        (  # HTTP/1.0 cannot expect 100 Continue (RFC 9110 §10.1.1): ignored
            b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            (b"/", False, False, True),
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
            (b"/", False, False, False),
        ),
        (b"GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\nTrailer: X\r\n\r\n", (b"/", *[False] * 3)),
        (b"GET http://a/b?c HTTP/1.1\r\nHost: a\r\n\r\n", (b"/b?c", False, False, False)),
        (b"GET HTTPS://a:1?c HTTP/1.1\r\nHost: a\r\n\r\n", (b"/?c", False, False, False)),
        (b"GET http://a HTTP/1.1\r\nHost: a\r\n\r\n", (b"/", False, False, False)),
    ],
)
def test_unusual_requests_are_read(data: bytes, expected: tuple[bytes, bool, bool, bool]) -> None:
    head = parse_head(data, LIMIT)
    assert isinstance(head, Head), head
    assert (head.target, head.chunked, head.expect_continue, head.close) == expected
    agrees(data)


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1234567890123456789\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 501),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked,\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue, x\r\n\r\n", 417),
        (b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400),
        (b"GET / HTTP/1.1\nHost: a\n\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\x00\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\x7f\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX@Y: b\r\n\r\n", 400),
        (b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400),  # h11 refuses it too
        (b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
        (b"GET / http/1.1\r\nHost: a\r\n\r\n", 400),
    ],
)
def test_what_it_refuses(data: bytes, status: int) -> None:
    refusal = parse_head(data, LIMIT)
    assert isinstance(refusal, Refusal), refusal
    assert refusal.status == status
    assert refusal.message and "\n" not in refusal.message


def test_a_head_that_cannot_become_valid_is_refused_before_it_ends() -> None:
    for start in (
        b"GET / HTTP/1.1\nHost",  # a bare LF: never waited on
        b"GET / HTTP/1.1\r\nHost: a\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n",  # a TLS hello, say
        b"GET / HTTP/9.9\r\n",
    ):
        assert isinstance(parse_head(start, LIMIT), Refusal), start
    assert parse_head(b"GET / HTTP/1.1\r\nHost: a\r", LIMIT) is NEED_DATA


def test_incomplete_and_too_large_heads() -> None:
    assert parse_head(USUAL[:40], LIMIT) is NEED_DATA
    big = b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"a" * LIMIT + b"\r\n\r\n"
    assert parse_head(big, LIMIT) is TOO_LARGE
    closing = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n"
    head = parse_head(closing, LIMIT)
    assert isinstance(head, Head) and head.close


FIELD_NAMES = st.sampled_from(
    [
        b"Host",
        b"host",
        b"Content-Length",
        b"Connection",
        b"Transfer-Encoding",
        b"Expect",
        b"Upgrade",
        b"X-A",
        b"Authorization",
        b"X Y",
        b" X",
        b"\tX",
    ]
)
FIELD_VALUES = st.one_of(
    st.sampled_from(
        [
            b"1",
            b"0",
            b"12",
            b"1, 1",
            b"+1",
            b"close",
            b"keep-alive",
            b"Upgrade, HTTP2-Settings",
            b"chunked",
            b"Chunked ",
            b"gzip, chunked",
            b"chunked, chunked",
            b"identity",
            b"100-continue",
            b" a ",
            b"",
            b"a\tb",
            b"01",
        ]
    ),
    st.binary(max_size=8),
)


@given(
    method=st.sampled_from([b"GET", b"POST", b"HEAD", b"G@T", b"PUT"]),
    target=st.one_of(
        st.sampled_from([b"/", b"/v2?q=%20", b"*", b"http://a/b", b"http://a", b"a:1"]),
        st.binary(max_size=6),
    ),
    version=st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"http/1.1"]),
    fields=st.lists(
        st.tuples(
            FIELD_NAMES,
            st.sampled_from([b": ", b":", b" : "]),
            FIELD_VALUES,
            st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n"]),
        )
    ),
    body=st.sampled_from([b"x" * 20, b"0\r\n\r\n", b"1\r\nx\r\n0\r\n\r\n"]),
)
def test_whatever_it_reads_h11_reads_alike(
    method: bytes,
    target: bytes,
    version: bytes,
    fields: list[tuple[bytes, bytes, bytes, bytes]],
    body: bytes,
) -> None:
    head = method + b" " + target + b" " + version + b"\r\n"
    head += b"".join(name + sep + value + end for name, sep, value, end in fields)
    agrees(head + b"\r\n" + body)
    agrees(head)  # incomplete: NEED_DATA only where h11 waits too


def test_responses_are_what_h11_reads() -> None:
    for close, keep_alive in ((True, False), (False, True), (False, False)):
        data = response_bytes(
            200, [(b"content-length", b"2"), (b"x-a", b"b")], b"ok", close, keep_alive
        )
        client = h11.Connection(h11.CLIENT)
        client.send(h11.Request(method="GET", target="/", headers=[("Host", "a")]))
        client.send(h11.EndOfMessage())
        client.receive_data(data)
        response = client.next_event()
        assert isinstance(response, h11.Response)
        assert (response.status_code, response.reason) == (200, b"OK")
        connection = dict(response.headers).get(b"connection")
        assert connection == (b"close" if close else b"keep-alive" if keep_alive else None)
        body = client.next_event()
        assert isinstance(body, h11.Data) and body.data == b"ok"
