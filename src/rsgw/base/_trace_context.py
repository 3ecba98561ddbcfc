"""W3C trace context: the `traceparent` and `tracestate` headers, read and written.

A distributed trace crosses rsgw only if the gateway reads the caller's context and
hands one on to the worker (https://www.w3.org/TR/trace-context/). This module is
that wire format and nothing more: no clock, no random ids, no OpenTelemetry, so
every door (gRPC metadata, REST headers) and the worker client share one reading.

What the spec asks of a reader, and so of this one:
- a malformed header is *ignored*, never an error: the call goes on as if it came
  without a context (`parse_traceparent` answers None), and a `tracestate` whose
  `traceparent` is invalid is dropped with it;
- version `ff` is invalid, and so are an all-zero trace id or parent id;
- hex is lower-case only (`HEXDIGLC`);
- a *future* version (01 to fe) is read by its version-00 prefix: at least 55
  characters, the trace id, parent id and flags where version 00 has them, and
  after the flags either the end or a `-` (what follows is that version's own);
  version 00 itself is exactly 55 characters;
- two `traceparent` headers are as good as none (the caller's context is unclear);
  several `tracestate` headers are one list, joined by commas in order;
- a `tracestate` list-member is `key=value` with the spec's key and value grammar,
  empty members are skipped, a duplicated key or more than 32 members make the
  whole list invalid (the spec lets a vendor discard it; keeping half of a list
  another vendor wrote would be worse).

A context is forwarded as the version-00 header rsgw can vouch for (`format`), so a
future version's extra fields are not passed on as if rsgw understood them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: The header names, as HTTP/2 and gRPC metadata carry them (lower-case).
TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"

#: The sampled bit of `trace-flags`.
SAMPLED = 0x01
#: The spec's limit on `tracestate` list-members.
MAX_TRACESTATE_MEMBERS = 32

_VERSION_00_LENGTH = 55
_HEX = frozenset(b"0123456789abcdef")
# The key grammar: simple-key, or tenant-id "@" system-id (multi-tenant-key).
_KEY = re.compile(
    rb"[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}"
)
# value = 0*255(chr) nblk-chr; chr = %x20 / nblk-chr; nblk-chr excludes "," and "=".
_VALUE = re.compile(rb"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
_OWS = b" \t"


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A caller's span, as its `traceparent` names it.

    `trace_id` (128 bits) and `span_id` (64 bits) are integers, as OpenTelemetry
    holds them; neither is ever zero here.
    """

    trace_id: int
    span_id: int
    flags: int = SAMPLED
    version: int = 0

    @property
    def sampled(self) -> bool:
        """Whether the caller recorded its span (the flags' sampled bit)."""
        return bool(self.flags & SAMPLED)

    def child(self, span_id: int, sampled: bool | None = None) -> TraceParent:
        """The same trace under another span (the one a worker should nest in), with
        the flags kept, or the sampled bit set as the gateway decided."""
        flags = self.flags
        if sampled is not None:
            flags = flags | SAMPLED if sampled else flags & ~SAMPLED
        return TraceParent(self.trace_id, span_id, flags)

    def format(self) -> bytes:
        """This context as a version-00 `traceparent` value."""
        return b"00-%032x-%016x-%02x" % (self.trace_id, self.span_id, self.flags & 0xFF)


@dataclass(frozen=True, slots=True)
class TraceContext:
    """What a call brought of its caller's trace: its parent and the vendors' state."""

    parent: TraceParent
    #: The caller's `tracestate` list-members, in order (empty when it sent none).
    state: tuple[tuple[str, str], ...] = ()

    def headers(
        self, span_id: int | None = None, sampled: bool | None = None
    ) -> tuple[tuple[bytes, bytes], ...]:
        """The metadata that hands this context on: under `span_id` when rsgw made a
        span of its own (sampled as rsgw decided), else the caller's parent unchanged
        (a future version's as version 00, the one rsgw can vouch for)."""
        span = self.parent.span_id if span_id is None else span_id
        parent = (TRACEPARENT, self.parent.child(span, sampled).format())
        if self.state:
            return (parent, (TRACESTATE, format_tracestate(self.state)))
        return (parent,)


def _is_hex(field: bytes) -> bool:
    return all(byte in _HEX for byte in field)


def parse_traceparent(value: bytes | str) -> TraceParent | None:
    """The `traceparent` header's context, or None if the spec says to ignore it."""
    raw = value.encode("latin-1", "replace") if isinstance(value, str) else bytes(value)
    raw = raw.strip(_OWS)
    if len(raw) < _VERSION_00_LENGTH:
        return None
    version = raw[0:2]
    if not _is_hex(version) or version == b"ff" or raw[2:3] != b"-":
        return None
    trace, span, flags = raw[3:35], raw[36:52], raw[53:55]
    if raw[35:36] != b"-" or raw[52:53] != b"-":
        return None
    if not (_is_hex(trace) and _is_hex(span) and _is_hex(flags)):
        return None
    if version == b"00":
        if len(raw) != _VERSION_00_LENGTH:
            return None
    elif len(raw) > _VERSION_00_LENGTH and raw[55:56] != b"-":
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16), int(version, 16))


def parse_tracestate(values: Iterable[bytes | str]) -> tuple[tuple[str, str], ...] | None:
    """The `tracestate` list-members of one or more header values (joined in order),
    or None when the list is invalid and must be dropped whole."""
    members: list[tuple[str, str]] = []
    keys: set[bytes] = set()
    for value in values:
        raw = value.encode("latin-1", "replace") if isinstance(value, str) else bytes(value)
        for member in raw.split(b","):
            member = member.strip(_OWS)
            if not member:
                continue  # the grammar allows empty list-members
            key, equals, state = member.partition(b"=")
            if not equals or not _KEY.fullmatch(key) or not _VALUE.fullmatch(state):
                return None
            if key in keys:
                return None
            keys.add(key)
            members.append((key.decode("ascii"), state.decode("ascii")))
            if len(members) > MAX_TRACESTATE_MEMBERS:
                return None
    return tuple(members)


def format_tracestate(members: Iterable[tuple[str, str]]) -> bytes:
    """A `tracestate` value: the members, comma-separated, in order."""
    return b",".join(f"{key}={value}".encode("ascii") for key, value in members)


def trace_context(metadata: Iterable[tuple[bytes, bytes]]) -> TraceContext | None:
    """The caller's trace context in a call's metadata (names lower-case), or None
    when it sent none, sent a malformed or duplicated `traceparent`, or none at all.

    A valid `traceparent` with a malformed `tracestate` keeps the parent and drops
    the state (the spec's rule: state is never half-propagated).
    """
    parents: list[bytes] = []
    states: list[bytes] = []
    for name, value in metadata:
        if name == TRACEPARENT:
            parents.append(value)
        elif name == TRACESTATE:
            states.append(value)
    if len(parents) != 1:
        return None
    parent = parse_traceparent(parents[0])
    if parent is None:
        return None
    return TraceContext(parent, parse_tracestate(states) or ())
