"""HTTP/1.1 request framing on the REST port, one table of cases run three ways.

Each case is a raw request, the answer rsgw gives it and what becomes of the
connection after ("keep": it serves the next request; "close": it ends after the
answer), and what h11 makes of the same bytes ("reads", "refuses", "waits"). Each
case runs against the pure reader (`parse_head`, `ChunkedBody`, and the listener's
one size rule: Content-Length past the body limit is 413), against the real listener
over loopback (the case's bytes, then a valid request on the same connection), and
against h11 as the oracle: where rsgw reads a request, h11 reads the same one, body
and all; where rsgw refuses and h11 does not, the case is in `STRICTER_THAN_H11`
with the reason. Every refusal closes the connection: after a framing error, where
the next request would start is not known, and a proxy in front may think otherwise.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._limits import ConnectionLimits
from rsgw.base._uploads import UploadBudget
from rsgw.rest._chunked import MAX_LINE_BYTES, ChunkedBody
from rsgw.rest._door import too_large
from rsgw.rest._http1 import NEED_DATA, TOO_LARGE, Head, Refusal, parse_head
from tests.rest.test_http1 import h11_path, h11_reads
from tests.rest.test_listener import LIVE, MAX_BODY, connect, listening

MAX_HEAD = ConnectionLimits().max_header_list_bytes

BODY = b'{"repository_name": "framed"}'
POST = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n"
CHUNKED = POST + b"Transfer-Encoding: chunked\r\n\r\n"
SIZED = POST + b"Content-Length: %d\r\n\r\n" % len(BODY)
#: BODY as one chunk, then the last chunk: what follows the size line.
ONE_CHUNK = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
GET = b"GET /v2/health/live HTTP/1.1\r\n"


@dataclass(frozen=True)
class Case:
    name: str
    raw: bytes
    status: int
    fate: str  # "keep" or "close"
    h11: str  # what h11 does: "reads", "refuses" or "waits"


def sized(length: bytes) -> bytes:
    return POST + b"Content-Length: " + length + b"\r\n\r\n" + BODY


def te(*values: bytes) -> bytes:
    """A POST with these Transfer-Encoding fields, then BODY as chunks."""
    fields = b"".join(b"Transfer-Encoding: %s\r\n" % value for value in values)
    return POST + fields + b"\r\n" + ONE_CHUNK


def chunks(after: bytes) -> bytes:
    """A chunked POST whose body is `after`."""
    return CHUNKED + after


def with_trailer(trailer: bytes) -> bytes:
    return CHUNKED + b"1d\r\n" + BODY + b"\r\n0\r\n" + trailer


def get(*fields: bytes, line: bytes = GET) -> bytes:
    return line + b"".join(fields) + b"\r\n"


H = b"Host: x\r\n"
BIG = b"X: " + b"a" * MAX_HEAD + b"\r\n"
H10 = b"GET /v2/health/live HTTP/1.0\r\n"
UPGRADE = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMA\r\n"
ABSOLUTE = b"POST http://x/v2/repository/index HTTP/1.1\r\nHost: x\r\n"

CASES = [
    # Content-Length
    Case("content-length", sized(b"29"), 200, "keep", "reads"),
    Case(
        "CL and TE", te(b"chunked").replace(H, H + b"Content-Length: 5\r\n"), 400, "close", "reads"
    ),
    Case("CL duplicate equal", sized(b"29\r\nContent-Length: 29"), 400, "close", "reads"),
    Case("CL list 1, 1", sized(b"29, 29"), 400, "close", "reads"),
    Case("CL duplicate different", sized(b"29\r\nContent-Length: 3"), 400, "close", "refuses"),
    Case("CL +1", sized(b"+29"), 400, "close", "refuses"),
    Case("CL -1", sized(b"-1"), 400, "close", "refuses"),
    Case("CL 0x1", sized(b"0x1d"), 400, "close", "refuses"),
    Case("CL 1 1", sized(b"2 9"), 400, "close", "refuses"),
    Case("CL 19 digits", sized(b"0000000000000000029"), 400, "close", "reads"),
    Case("CL past the body limit", sized(b"%d" % (MAX_BODY + 1)), 413, "close", "waits"),
    # Transfer-Encoding
    Case("TE chunked", te(b"chunked"), 200, "keep", "reads"),
    Case("TE Chunked", te(b"Chunked"), 200, "keep", "reads"),
    Case("TE gzip, chunked", te(b"gzip, chunked"), 501, "close", "refuses"),
    Case("TE chunked, chunked", te(b"chunked, chunked"), 400, "close", "refuses"),
    Case("two TE fields", te(b"chunked", b"chunked"), 400, "close", "refuses"),
    Case("TE identity", te(b"identity"), 501, "close", "refuses"),
    Case("TE xchunked", te(b"xchunked"), 501, "close", "refuses"),
    Case("TE folded", te(b"\r\n chunked"), 400, "close", "reads"),
    Case("HTTP/1.0 with TE", te(b"chunked").replace(b"1.1", b"1.0"), 400, "close", "reads"),
    # Chunk sizes, extensions, data, trailers
    Case("chunk size 20 digits", chunks(b"ffffffffffffffffffff\r\n"), 400, "close", "waits"),
    Case("chunk size over the limit", chunks(b"0000000000100000\r\n"), 413, "close", "waits"),
    Case(
        "chunks over the limit",
        chunks(b"800\r\n" + b" " * 0x800 + b"\r\n801\r\n"),
        413,
        "close",
        "waits",
    ),
    Case("chunk size bad hex", chunks(b"1g\r\n" + BODY), 400, "close", "refuses"),
    Case("chunk size not hex", chunks(b"zz\r\n" + BODY), 400, "close", "refuses"),
    Case("chunk size -1", chunks(b"-1\r\n"), 400, "close", "refuses"),
    Case(
        "chunk size with whitespace",
        chunks(ONE_CHUNK.replace(b"1d", b"1d ")),
        400,
        "close",
        "reads",
    ),
    Case(
        "chunk extension",
        chunks(ONE_CHUNK.replace(b"1d", b'1d;a;b=c ; d = "e \\" f"')),
        200,
        "keep",
        "reads",
    ),
    Case("chunk extension after whitespace", chunks(b"1d ;a\r\n"), 400, "close", "refuses"),
    Case(
        "chunk extension malformed",
        chunks(ONE_CHUNK.replace(b"1d", b"1d;=c")),
        400,
        "close",
        "reads",
    ),
    Case(
        "chunk extension unquoted space",
        chunks(ONE_CHUNK.replace(b"1d", b"1d;a=b c")),
        400,
        "close",
        "reads",
    ),
    Case(
        "chunk-size line too long",
        chunks(b"1d;a=" + b"b" * MAX_LINE_BYTES + b"\r\n"),
        400,
        "close",
        "waits",
    ),
    Case(
        "chunk data without CRLF",
        chunks(b"1d\r\n" + BODY + b"XX0\r\n\r\n"),
        400,
        "close",
        "refuses",
    ),
    Case("trailers", with_trailer(b"X-Sum: 1\r\nX-More: 2\r\n\r\n"), 200, "keep", "reads"),
    Case(
        "trailer Content-Length", with_trailer(b"Content-Length: 5\r\n\r\n"), 200, "keep", "reads"
    ),
    Case("trailer malformed", with_trailer(b"X-Sum : 1\r\n\r\n"), 400, "close", "refuses"),
    Case("trailers too large", with_trailer(BIG + b"\r\n"), 431, "close", "reads"),
    # Bare LF
    Case("bare LF in head", GET.replace(b"\r", b"") + b"Host: x\n\n", 400, "close", "reads"),
    Case("bare LF ending the head", GET + H + b"\n", 400, "close", "reads"),
    Case("bare LF after a chunk size", chunks(b"1d\n"), 400, "close", "waits"),
    Case(
        "bare LF after chunk data",
        chunks(b"1d\r\n" + BODY + b"\n0\r\n\r\n"),
        400,
        "close",
        "refuses",
    ),
    Case(
        "bare LF after the last chunk",
        with_trailer(b"\n").replace(b"0\r\n\n", b"0\n\n"),
        400,
        "close",
        "waits",
    ),
    Case("bare LF in a trailer", with_trailer(b"X: 1\n\r\n"), 400, "close", "reads"),
    # Field lines and the request line
    Case("obs-fold", get(H, b"X-A: 1\r\n 2\r\n"), 400, "close", "reads"),
    Case("space before colon", get(b"Host : x\r\n"), 400, "close", "refuses"),
    Case("CR in a value", get(H, b"X-A: 1\r2\r\n"), 400, "close", "refuses"),
    Case("NUL in a value", get(H, b"X-A: 1\x002\r\n"), 400, "close", "refuses"),
    Case("no Host", get(), 400, "close", "refuses"),
    Case("two Hosts", get(H, b"Host: y\r\n"), 400, "close", "refuses"),
    Case(
        "malformed request line", get(H, line=GET.replace(b" ", b"  ", 1)), 400, "close", "refuses"
    ),
    Case("HTTP/2.0 request line", get(H, line=GET.replace(b"1.1", b"2.0")), 505, "close", "reads"),
    Case("head too large", get(H, BIG), 431, "close", "reads"),
    # Served
    Case("HTTP/1.0", get(line=H10), 200, "close", "reads"),
    Case("HTTP/1.0 keep-alive", get(b"Connection: keep-alive\r\n", line=H10), 200, "keep", "reads"),
    Case(
        "absolute-form target",
        ABSOLUTE + b"Content-Length: 29\r\n\r\n" + BODY,
        200,
        "keep",
        "reads",
    ),
    Case("Upgrade h2c", get(H, UPGRADE), 200, "keep", "reads"),
    Case(
        "TE and Trailer fields", get(H, b"TE: trailers\r\nTrailer: X-Sum\r\n"), 200, "keep", "reads"
    ),
    Case("Expect: 100-continue", sized(b"29\r\nExpect: 100-continue"), 200, "keep", "reads"),
    Case("unknown Expect", sized(b"29\r\nExpect: 200-ok"), 417, "close", "reads"),
]

#: Refused here, not by h11 (which reads them, or waits for more), and why.
STRICTER_THAN_H11 = {
    # Request smuggling: a proxy that frames by Content-Length reads another request
    # where h11 reads chunks (RFC 9112 §6.1: reject, or at least close after).
    "CL and TE",
    # A proxy that takes the first (or the last) field, or the first list element,
    # frames alike only by luck; RFC 9110 §8.6 lets a recipient reject them.
    "CL duplicate equal",
    "CL list 1, 1",
    # More than 18 digits: a proxy may wrap or cap it; no body we take is that long.
    "CL 19 digits",
    # h11 has no body limit: it would read all of it (the listener counted it as it came).
    "CL past the body limit",
    # RFC 9112 §5.2: obs-fold may be rejected; a proxy may unfold it or not, and see
    # Transfer-Encoding where we would not (or the reverse).
    "TE folded",
    "obs-fold",
    # RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding is faulty framing.
    "HTTP/1.0 with TE",
    # h11 waits for 2^80 bytes of data that cannot fit the body limit, silently.
    "chunk size 20 digits",
    # h11 has no body limit; we refuse at the size line, before any of its data.
    "chunk size over the limit",
    "chunks over the limit",
    # The chunk grammar allows no whitespace after the size (BWS only before ";").
    "chunk size with whitespace",
    # h11 skips chunk extensions unread: a proxy that parses them may frame otherwise.
    "chunk extension malformed",
    "chunk extension unquoted space",
    # h11 takes a size line of any length up to its head limit (then waits for the
    # data); we hold it to 4 KiB.
    "chunk-size line too long",
    # h11 bounds a head or a trailer section only while it is incomplete: the whole
    # of either, arriving at once, it reads however long (431 here).
    "head too large",
    "trailers too large",
    # RFC 9112 §2.2 allows a bare LF as a line end; a proxy that does not reads the
    # lines otherwise (the classic smuggling vector). h11 waits after a size line
    # ending in a bare LF, and reads heads and trailers that use them.
    "bare LF in head",
    "bare LF ending the head",
    "bare LF after a chunk size",
    "bare LF after the last chunk",
    "bare LF in a trailer",
    # HTTP/2 over an HTTP/1 request line is not HTTP/1.1: 505 (h11 reads any 1-digit
    # major version as HTTP/1.1).
    "HTTP/2.0 request line",
    # RFC 9110 §10.1.1: an expectation we cannot meet is 417; h11 ignores it.
    "unknown Expect",
}


def test_the_table_is_consistent() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names))
    assert set(names) >= STRICTER_THAN_H11
    for case in CASES:
        assert case.fate in ("keep", "close")
        assert case.h11 in ("reads", "refuses", "waits")
        if case.status != 200:
            assert case.fate == "close", case.name  # every refusal closes


@dataclass
class Outcome:
    status: int
    fate: str
    body: bytes | None = None  # the body read, when served
    target: bytes = b""


def read_purely(raw: bytes) -> Outcome:
    """What the pure reader makes of `raw`: what the listener would answer (200 for a
    request it serves) and whether it would go on; never a wait."""
    head = parse_head(raw, MAX_HEAD)
    assert head is not NEED_DATA, "waits"
    if head is TOO_LARGE:
        return Outcome(431, "close")
    if isinstance(head, Refusal):
        assert head.message and "\n" not in head.message
        return Outcome(head.status, "close")
    assert isinstance(head, Head)
    if head.chunked:
        decoder = ChunkedBody(MAX_BODY, MAX_HEAD)
        refusal = decoder.feed(raw[head.body_start :])
        if refusal is not None:
            return Outcome(refusal.status, "close")
        assert decoder.done, "waits"
        assert decoder.rest == b""
        body = decoder.body()
    elif head.body_length > MAX_BODY:
        return Outcome(413, "close")
    else:
        body = raw[head.body_start :]
        assert len(body) == head.body_length
    return Outcome(200, "close" if head.close else "keep", body, head.target)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_pure_reader(case: Case) -> None:
    outcome = read_purely(case.raw)
    assert (outcome.status, outcome.fate) == (case.status, case.fate)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_pure_reader_byte_by_byte(case: Case) -> None:
    """Fed a byte at a time, the chunked decoder comes to the same end; a refusal
    comes no later than the whole case (nothing is waited on that is wrong already)."""
    head = parse_head(case.raw, MAX_HEAD)
    if not isinstance(head, Head) or not head.chunked:
        return
    decoder = ChunkedBody(MAX_BODY, MAX_HEAD)
    outcome = None
    for i in range(head.body_start, len(case.raw)):
        refusal = decoder.feed(case.raw[i : i + 1])
        if refusal is not None:
            outcome = refusal.status
            break
    assert outcome == (None if case.status == 200 else case.status)
    assert decoder.done == (case.status == 200)
    if decoder.done:
        assert decoder.body() == read_purely(case.raw).body


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_h11_as_the_oracle(case: Case) -> None:
    read = h11_reads(case.raw, MAX_HEAD)
    assert read.outcome == case.h11, read
    if case.status == 200:
        ours = read_purely(case.raw)
        assert read.request is not None
        assert read.body == ours.body
        assert h11_path(read.request.target) == ours.target
    elif case.h11 != "refuses":
        assert case.name in STRICTER_THAN_H11
    else:
        assert case.name not in STRICTER_THAN_H11


async def answers(stream: trio.SocketStream) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Every final answer the server sends until it closes the connection (a 100
    Continue skipped), or until two have come (then the connection is left open)."""
    buffer = b""
    found: list[tuple[int, dict[bytes, bytes], bytes]] = []
    with trio.fail_after(10):
        while len(found) < 2:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                line, *fields = buffer[:end].split(b"\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (f.partition(b":") for f in fields)}
                length = int(headers.get(b"content-length", b"0"))
                if len(buffer) >= end + 4 + length:
                    status = int(line.split()[1])
                    if status >= 200:
                        found.append((status, headers, buffer[end + 4 : end + 4 + length]))
                    buffer = buffer[end + 4 + length :]
                    continue
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:  # reset after the answer: closed all the same
                data = b""
            if not data:
                assert buffer == b"", buffer
                break
            buffer += data
    return found


async def test_the_listener_over_loopback() -> None:
    """Each case on its own connection, followed by a valid request: the first
    answer's status, and the second answered (keep) or the connection closed (close)."""
    async with listening() as (_, port):
        for case in CASES:
            stream, _ = await connect(port)
            await stream.send_all(case.raw + LIVE)
            found = await answers(stream)
            assert found, case.name
            status, headers, body = found[0]
            assert status == case.status, (case.name, body)
            if case.fate == "keep":
                assert len(found) == 2, case.name
                if case.raw.startswith(b"GET /v2/health/live HTTP/1.0"):  # else it would close
                    assert headers.get(b"connection") == b"keep-alive"
                assert found[1][0] == 200 and json.loads(found[1][2]) == {"live": True}
            else:
                assert len(found) == 1, case.name
                assert headers.get(b"connection") == b"close", case.name
            if status == 200 and case.raw.startswith(b"POST"):
                assert json.loads(body) == [{"name": "framed"}], case.name
            elif status == 413:
                assert json.loads(body)["error"] == too_large(MAX_BODY)
            elif status != 200:
                assert json.loads(body)["error"], case.name
            await stream.aclose()


async def test_a_chunked_body_in_pieces_is_charged_the_body_limit_and_continued() -> None:
    """A chunked body that is not all here waits for a ticket of `max_body_bytes` (it
    declares no size), gets its 100 Continue, and is decoded as its pieces come."""
    budget = UploadBudget(10 * MAX_BODY, MAX_BODY)
    async with listening(upload_budget=budget) as (_, port):
        stream, reader = await connect(port)
        await stream.send_all(CHUNKED.replace(H, H + b"Expect: 100-continue\r\n"))
        line, _, _ = await reader.response(head_only=True)
        assert line == b"HTTP/1.1 100 Continue"
        assert budget.granted == MAX_BODY
        for piece in (b"1", b"d;x=y\r", b"\n" + BODY[:10], BODY[10:] + b"\r\n", b"0\r\n\r"):
            await stream.send_all(piece)  # however TCP packs them: the pure tests split all
        await stream.send_all(b"\n" + LIVE)
        line, _, body = await reader.response()
        assert line == b"HTTP/1.1 200 OK" and json.loads(body) == [{"name": "framed"}]
        line, _, _ = await reader.response()
        assert line == b"HTTP/1.1 200 OK"
        assert budget.granted == 0


async def test_a_chunked_body_that_stalls_ends_its_connection() -> None:
    async with listening(limits=ConnectionLimits(header_seconds=0.3)) as (_, port):
        stream, reader = await connect(port)
        await stream.send_all(CHUNKED + b"1d\r\n" + BODY[:5])
        start = trio.current_time()
        assert await reader.closed(5)
        assert trio.current_time() - start < 2


@given(
    body=st.binary(max_size=300),
    sizes=st.lists(st.integers(1, 64), max_size=12),
    extension=st.sampled_from([b"", b";a", b";a=b", b';a = "b\\"c" ;d']),
    trailers=st.sampled_from([b"", b"X-Sum: 1\r\n", b"A: 1\r\nContent-Length: 9\r\n"]),
    upper=st.booleans(),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
    after=st.sampled_from([b"", LIVE]),
)
def test_any_chunking_of_any_body_is_decoded_in_any_pieces_as_h11_decodes_it(
    body: bytes,
    sizes: list[int],
    extension: bytes,
    trailers: bytes,
    upper: bool,
    cuts: list[int],
    after: bytes,
) -> None:
    encoded, start = b"", 0
    for size in [*sizes, len(body)]:
        piece = body[start : start + size]
        start += len(piece)
        if piece:
            size_text = b"%X" % len(piece) if upper else b"%x" % len(piece)
            encoded += size_text + extension + b"\r\n" + piece + b"\r\n"
    encoded += b"0" + extension + b"\r\n" + trailers + b"\r\n"
    decoder = ChunkedBody(MAX_BODY, MAX_HEAD)
    data = encoded + after
    bounds = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    right = 0
    for left, right in itertools.pairwise(bounds):
        assert decoder.feed(data[left:right]) is None
        if decoder.done:  # the rest is the listener's (the next request)
            break
    assert decoder.done and decoder.body() == body
    assert decoder.rest + data[right:] == after
    read = h11_reads(CHUNKED + encoded, MAX_HEAD)
    assert read.outcome == "reads" and read.body == body
