"""What of a caller's metadata goes on to the worker: its request id and trace context.

A worker's logs can name a call only by the request id the client gave it, and its
spans join the client's trace only through `traceparent` / `tracestate`: the
gateway hands both on, over gRPC and REST alike (the REST door's headers are the
call's metadata). Nothing else of the caller's metadata is forwarded: a worker is
not the client's to configure.

The trace context is handed on as `rsgw.base._trace_context` reads it: a malformed
`traceparent` is dropped (with its `tracestate`), as the W3C spec asks of every hop,
and a valid one goes on byte for byte (version 00), so a Triton behind rsgw joins
the caller's trace even while the gateway traces nothing itself.

The hot path: one pass over the metadata, two comparisons a header; a call that
brings no trace context parses nothing.
"""

from __future__ import annotations

from rsgw.base._trace_context import TRACEPARENT, TRACESTATE, trace_context
from rsgw.gateway.observe._access import REQUEST_ID
from rsgw.grpc.protocol._metadata import HeaderBlock


def upstream_metadata(metadata: HeaderBlock) -> HeaderBlock:
    """The metadata a call to a worker carries for the caller's `metadata`."""
    rid: bytes | None = None
    traced = False
    for name, value in metadata:
        if name == REQUEST_ID:
            rid = value
        elif name in (TRACEPARENT, TRACESTATE):
            traced = True
    block: HeaderBlock = () if rid is None else ((REQUEST_ID, rid),)
    if traced and (context := trace_context(metadata)) is not None:
        return block + context.headers()
    return block
