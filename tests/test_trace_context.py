"""W3C trace context (rsgw.base._trace_context): the headers read and written as the
spec says, a malformed one ignored and never an error.

The examples are the spec's own (https://www.w3.org/TR/trace-context/) and the cases
of its test suite (w3c/trace-context's test/test.py); the properties say that
anything rsgw writes it reads back, and that no input makes the reader raise.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._trace_context import (
    MAX_TRACESTATE_MEMBERS,
    TRACEPARENT,
    TRACESTATE,
    TraceContext,
    TraceParent,
    format_tracestate,
    parse_traceparent,
    parse_tracestate,
    trace_context,
)

SPEC_EXAMPLE = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN = 0x00F067AA0BA902B7

trace_ids = st.integers(min_value=1, max_value=2**128 - 1)
span_ids = st.integers(min_value=1, max_value=2**64 - 1)
flags = st.integers(min_value=0, max_value=255)

_KEY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_-*/"
simple_keys = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from("abcdefghijklmnopqrstuvwxyz"),
    st.text(_KEY_CHARS, max_size=255),
)
tenant_keys = st.builds(
    lambda tenant, rest, system, tail: f"{tenant}{rest}@{system}{tail}",
    st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789"),
    st.text(_KEY_CHARS, max_size=240),
    st.sampled_from("abcdefghijklmnopqrstuvwxyz"),
    st.text(_KEY_CHARS, max_size=13),
)
_NBLK = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in ",=")
values = st.builds(
    lambda body, last: body + last,
    st.text(_NBLK + " ", max_size=255),
    st.sampled_from(_NBLK),
)
states = st.lists(
    st.tuples(simple_keys | tenant_keys, values),
    max_size=MAX_TRACESTATE_MEMBERS,
    unique_by=lambda member: member[0],
).map(tuple)


def test_the_spec_example_is_read() -> None:
    parent = parse_traceparent(SPEC_EXAMPLE)
    assert parent == TraceParent(TRACE, SPAN, 0x01, 0)
    assert parent is not None and parent.sampled
    assert parent.format() == SPEC_EXAMPLE
    assert parse_traceparent(SPEC_EXAMPLE.decode()) == parent
    assert parse_traceparent(b" \t" + SPEC_EXAMPLE + b" ") == parent  # HTTP's OWS


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (b"", "empty"),
        (SPEC_EXAMPLE[:-1], "too short"),
        (SPEC_EXAMPLE + b"-", "version 00 is exactly 55 characters"),
        (SPEC_EXAMPLE + b"00", "version 00 is exactly 55 characters"),
        (b"ff" + SPEC_EXAMPLE[2:], "version ff is invalid"),
        (b"0g" + SPEC_EXAMPLE[2:], "version not hex"),
        (SPEC_EXAMPLE.upper(), "upper-case hex"),
        (b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "upper-case trace id"),
        (b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01", "all-zero trace id"),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-" + b"0" * 16 + b"-01", "all-zero parent id"),
        (b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "wrong delimiter"),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", "wrong delimiter"),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01", "wrong delimiter"),
        (b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-011", "short trace id"),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-011", "short parent id"),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x", "flags not hex"),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-\xff\xff", "not ASCII"),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\u00e9", "not ASCII"),
        (b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.what", "future, no dash"),
    ],
)
def test_a_malformed_traceparent_is_ignored(header: bytes | str, why: str) -> None:
    assert parse_traceparent(header) is None, why


@pytest.mark.parametrize("tail", [b"", b"-", b"-what-the-future-will-be-like"])
def test_a_future_version_is_read_by_its_version_00_prefix(tail: bytes) -> None:
    parent = parse_traceparent(b"cc" + SPEC_EXAMPLE[2:] + tail)
    assert parent == TraceParent(TRACE, SPAN, 0x01, 0xCC)
    # Handed on as the version rsgw can vouch for, without the fields it cannot.
    assert TraceContext(parent).headers() == ((TRACEPARENT, SPEC_EXAMPLE),)


@given(trace_ids, span_ids, flags)
def test_what_is_written_reads_back(trace_id: int, span_id: int, flag: int) -> None:
    parent = TraceParent(trace_id, span_id, flag)
    header = parent.format()
    assert len(header) == 55
    assert parse_traceparent(header) == parent


@given(st.binary(max_size=80) | st.text(max_size=80))
def test_no_input_makes_the_traceparent_reader_raise(header: bytes | str) -> None:
    parent = parse_traceparent(header)
    if parent is not None:  # whatever it accepts is a real context
        assert parent.trace_id and parent.span_id and parent.version != 0xFF


@given(trace_ids, span_ids, st.sampled_from(range(0xFE + 1)), st.binary(max_size=40))
def test_a_corrupted_character_is_refused_or_read_the_same(
    trace_id: int, span_id: int, position: int, junk: bytes
) -> None:
    # Version 00's grammar: any byte changed anywhere either leaves a valid header
    # naming exactly what it says, or makes the header invalid.
    header = bytearray(TraceParent(trace_id, span_id).format())
    if junk:
        header[position % len(header)] = junk[0]
    parent = parse_traceparent(bytes(header))
    if parent is not None:
        assert parent.format() == bytes(header) or parent.version != 0


def test_the_gateway_span_becomes_the_workers_parent() -> None:
    context = TraceContext(TraceParent(TRACE, SPAN, 0x01), (("congo", "t61rcWkgMzE"),))
    forwarded = dict(context.headers(0x1234))
    assert forwarded[TRACEPARENT] == b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000001234-01"
    assert forwarded[TRACESTATE] == b"congo=t61rcWkgMzE"
    unsampled = dict(context.headers(0x1234, sampled=False))[TRACEPARENT]
    assert unsampled.endswith(b"-00")
    # Tracing off: the caller's context goes on unchanged.
    assert context.headers() == ((TRACEPARENT, SPEC_EXAMPLE), (TRACESTATE, b"congo=t61rcWkgMzE"))


def test_the_spec_tracestate_examples_are_read() -> None:
    assert parse_tracestate([b"congo=t61rcWkgMzE"]) == (("congo", "t61rcWkgMzE"),)
    assert parse_tracestate([b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"]) == (
        ("rojo", "00f067aa0ba902b7"),
        ("congo", "t61rcWkgMzE"),
    )
    # Several headers are one list, in order; OWS and empty members are allowed.
    assert parse_tracestate([b"rojo=1 ,\t", b", congo=2", b""]) == (("rojo", "1"), ("congo", "2"))
    assert parse_tracestate([b"fw529a3039@dt=a b"]) == (("fw529a3039@dt", "a b"),)
    assert parse_tracestate([]) == ()


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (b"foo=1,foo=2", "duplicated key"),
        (b"Foo=1", "upper-case key"),
        (b"1foo=1", "simple key starting with a digit"),
        (b"foo", "no value"),
        (b"foo=", "empty value"),
        (b"foo=b\x00r", "a control character"),
        (b"fo o=1", "a space in a key"),
        (b"foo=a=b", "= in a value"),
        (b"a" * 257 + b"=1", "key too long"),
        (b"foo=" + b"v" * 257, "value too long"),
        (b"t" * 242 + b"@s=1", "tenant id too long"),
        (b"t@" + b"s" * 15 + b"=1", "system id too long"),
        (b"t@1s=1", "system id starting with a digit"),
        (",".join(f"k{i}=v" for i in range(33)).encode(), "more than 32 members"),
        (b"foo=\xe9", "not ASCII"),
    ],
)
def test_a_malformed_tracestate_is_dropped_whole(header: bytes, why: str) -> None:
    assert parse_tracestate([header]) is None, why
    assert parse_tracestate([b"rojo=1", header]) is None, why


def test_limits_are_inclusive() -> None:
    longest = (("a" * 256, "v" * 256), ("t" * 241 + "@" + "s" * 14, "x"))
    assert parse_tracestate([format_tracestate(longest)]) == longest
    members = tuple((f"k{i}", "v") for i in range(MAX_TRACESTATE_MEMBERS))
    assert parse_tracestate([format_tracestate(members)]) == members


@given(states)
def test_tracestate_written_reads_back(members: tuple[tuple[str, str], ...]) -> None:
    assert parse_tracestate([format_tracestate(members)]) == members


@given(st.lists(st.binary(max_size=60) | st.text(max_size=60), max_size=4))
def test_no_input_makes_the_tracestate_reader_raise(headers: list[bytes | str]) -> None:
    members = parse_tracestate(headers)
    if members is not None:  # whatever it accepts it writes back the same
        assert parse_tracestate([format_tracestate(members)]) == members


def test_a_calls_metadata_is_read() -> None:
    state = (TRACESTATE, b"congo=t61rcWkgMzE")
    other = (b"x-request-id", b"r1")
    context = trace_context([other, (TRACEPARENT, SPEC_EXAMPLE), state])
    assert context == TraceContext(TraceParent(TRACE, SPAN), (("congo", "t61rcWkgMzE"),))
    assert trace_context([other]) is None
    # Two traceparent headers: the caller's context is unclear, so there is none.
    assert trace_context([(TRACEPARENT, SPEC_EXAMPLE), (TRACEPARENT, SPEC_EXAMPLE)]) is None
    # A malformed traceparent takes its tracestate with it.
    assert trace_context([(TRACEPARENT, b"00-junk"), state]) is None
    # A malformed tracestate is dropped; the parent stays.
    context = trace_context([(TRACEPARENT, SPEC_EXAMPLE), (TRACESTATE, b"Bad=1")])
    assert context == TraceContext(TraceParent(TRACE, SPAN))
    assert context is not None and context.headers() == ((TRACEPARENT, SPEC_EXAMPLE),)
