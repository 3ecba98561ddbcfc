"""Headers, trailers and grpc-timeout: the pure half of the gRPC layer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode, status_from_wire
from rsgw.grpc.protocol._compression import Compressed, Deflated, Gzipped
from rsgw.grpc.protocol._metadata import (
    OK_TRAILERS,
    decode_message,
    encode_message,
    format_timeout,
    parse_request_headers,
    parse_status,
    parse_timeout,
    status_trailers,
    trailers_only,
)

GOOD = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"localhost"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"250m", 0.25), (b"7u", 7e-6), (b"9n", 9e-9)],
)
def test_parse_timeout_units(value: bytes, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"10", b"10x", b"-1S", b"123456789S", b"1.5S"])
def test_parse_timeout_rejects_malformed(value: bytes) -> None:
    with pytest.raises(GrpcError) as caught:
        parse_timeout(value)
    assert caught.value.code is StatusCode.INVALID_ARGUMENT


def test_format_timeout_keeps_precision() -> None:
    assert format_timeout(0.25) == b"250000u"
    assert format_timeout(0.0000001) == b"1u"  # never zero: at least one unit
    assert format_timeout(0) == b"1u"
    assert format_timeout(99.0) == b"99000000u"
    assert format_timeout(100.0) == b"100000m"
    assert format_timeout(10**6) == b"1000000S"


@given(st.floats(min_value=1e-6, max_value=1e9, allow_nan=False))
def test_format_timeout_round_trips_without_shortening(seconds: float) -> None:
    value = format_timeout(seconds)
    assert len(value) <= 9
    back = parse_timeout(value)
    assert back >= seconds * (1 - 1e-12)
    # never more than one unit of the chosen scale longer
    unit = {b"u": 1e-6, b"m": 1e-3, b"S": 1.0, b"M": 60.0, b"H": 3600.0}[value[-1:]]
    assert back - seconds <= unit * (1 + 1e-9)


def test_request_headers_parse() -> None:
    head = parse_request_headers([*GOOD, (b"grpc-timeout", b"5S"), (b"x-trace", b"abc")])
    assert head.path == b"/inference.GRPCInferenceService/ModelInfer"
    assert head.timeout == 5.0
    assert head.metadata == ((b"x-trace", b"abc"),)


def test_request_without_timeout() -> None:
    assert parse_request_headers(GOOD).timeout is None


@pytest.mark.parametrize(
    ("replace", "code"),
    [
        ((b":method", b"GET"), StatusCode.INTERNAL),
        ((b"content-type", b"text/plain"), StatusCode.INTERNAL),
        ((b"grpc-encoding", b"snappy"), StatusCode.UNIMPLEMENTED),
    ],
)
def test_request_headers_rejected(replace: tuple[bytes, bytes], code: StatusCode) -> None:
    headers = [h for h in GOOD if h[0] != replace[0]] + [replace]
    with pytest.raises(GrpcError) as caught:
        parse_request_headers(headers)
    assert caught.value.code is code


def test_unsupported_encoding_names_the_ones_read() -> None:
    with pytest.raises(GrpcError) as caught:
        parse_request_headers([*GOOD, (b"grpc-encoding", b"br")])
    assert caught.value.message == "message encoding 'br' not supported"
    assert caught.value.trailers == ((b"grpc-accept-encoding", b"identity,deflate,gzip"),)


@pytest.mark.parametrize(("name", "codec"), [(b"gzip", Gzipped), (b"deflate", Deflated)])
def test_request_encodings(name: bytes, codec: type[Compressed]) -> None:
    head = parse_request_headers(
        [*GOOD, (b"grpc-encoding", name), (b"grpc-accept-encoding", b"identity, GZIP,deflate")]
    )
    assert head.encoding is codec
    assert head.accept == {b"identity", b"gzip", b"deflate"}
    assert head.metadata == ()
    assert parse_request_headers([*GOOD, (b"grpc-encoding", b"identity")]).encoding is None


def test_trailers() -> None:
    assert status_trailers(StatusCode.OK, "") is OK_TRAILERS
    block = status_trailers(StatusCode.NOT_FOUND, "no 100% match\n", ((b"x-a", b"1"),))
    assert block == (
        (b"grpc-status", b"5"),
        (b"grpc-message", b"no 100%25 match%0A"),
        (b"x-a", b"1"),
    )
    only = trailers_only(StatusCode.UNAVAILABLE, "down")
    assert only[0] == (b":status", b"200")
    status = parse_status(list(only))
    assert (status.code, status.message, status.trailers) == (StatusCode.UNAVAILABLE, "down", ())


def test_status_without_grpc_status_is_unknown() -> None:
    status = parse_status([(b":status", b"200")])
    assert status.code is StatusCode.UNKNOWN
    assert "grpc-status" in status.message
    assert status_from_wire(b"junk") is StatusCode.UNKNOWN
    assert status_from_wire(None) is StatusCode.UNKNOWN
    assert status_from_wire(b"8") is StatusCode.RESOURCE_EXHAUSTED


@given(st.text())
def test_grpc_message_round_trips(text: str) -> None:
    encoded = encode_message(text)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    assert decode_message(encoded) == text.encode("utf-8", "surrogatepass").decode(
        "utf-8", "replace"
    )


def test_camel_labels() -> None:
    assert StatusCode.OK.camel == "OK"
    assert StatusCode.NOT_FOUND.camel == "NotFound"
    assert StatusCode.RESOURCE_EXHAUSTED.camel == "ResourceExhausted"
    assert StatusCode.UNAUTHENTICATED.camel == "Unauthenticated"


header_names = st.sampled_from(
    [
        b":method",
        b":path",
        b":scheme",
        b":authority",
        b"content-type",
        b"te",
        b"grpc-timeout",
        b"grpc-encoding",
        b"grpc-accept-encoding",
        b"user-agent",
        b"x-custom",
        b"grpc-status",
    ]
) | st.binary(max_size=12)


@given(st.lists(st.tuples(header_names, st.binary(max_size=40)), max_size=12))
def test_any_header_bytes_parse_or_fail_with_a_status(headers: list[tuple[bytes, bytes]]) -> None:
    """The header path's fuzz target: any bytes end in a RequestHead or a short GrpcError."""
    for block in ([*GOOD, *headers], headers):
        try:
            head = parse_request_headers(block)
        except GrpcError as exc:
            assert len(exc.message) <= 600
            exc.message.encode("utf-8")  # printable: escapes, never raw bytes
            continue
        assert isinstance(head.path, bytes)
        assert head.timeout is None or head.timeout >= 0
