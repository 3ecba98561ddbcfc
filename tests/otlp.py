"""An OTLP/HTTP traces receiver for tests: what a collector would have been sent.

A real HTTP server on loopback (port 0) that takes `POST /v1/traces`, decodes each
body as OpenTelemetry's own `ExportTraceServiceRequest` (opentelemetry-proto; or its
OTLP/JSON form, which Triton's C++ exporter sends) and keeps the spans, with their
service's name. The gateway's exporter and Triton's both send
here, so a test reads one trace from both. Tests wait for spans with `wait_for`
(a deadline, never a sleep).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver got it: ids as integers, attributes as plain values."""

    service: str
    name: str
    trace_id: int
    span_id: int
    parent_id: int  # 0 for a root span
    kind: int
    attributes: dict[str, object] = field(default_factory=dict)
    events: tuple[str, ...] = ()
    status_code: int = 0
    status_message: str = ""
    #: The exporting process's resource (`service.instance.id`, ...).
    resource: dict[str, object] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0


def _value(any_value: object) -> object:
    kind = any_value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one `ExportTraceServiceRequest`."""
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=service,
                        name=span.name,
                        trace_id=int.from_bytes(span.trace_id, "big"),
                        span_id=int.from_bytes(span.span_id, "big"),
                        parent_id=int.from_bytes(span.parent_span_id, "big")
                        if span.parent_span_id
                        else 0,
                        kind=span.kind,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        events=tuple(event.name for event in span.events),
                        status_code=span.status.code,
                        status_message=span.status.message,
                        resource=resource,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


def _json_value(value: dict[str, Any]) -> object:
    for kind, item in value.items():
        return int(item) if kind == "intValue" else item
    return None


def _json_id(text: str | None) -> int:
    return int(text, 16) if text else 0  # OTLP/JSON writes ids as hex


def decode_json(body: bytes) -> list[ReceivedSpan]:
    """The spans of one OTLP/JSON export (Triton's C++ exporter sends `http/json`)."""
    spans = []
    for resource_spans in json.loads(body).get("resourceSpans", []):
        attributes = resource_spans.get("resource", {}).get("attributes", [])
        resource = {a["key"]: _json_value(a["value"]) for a in attributes}
        scopes = resource_spans.get("scopeSpans") or resource_spans.get(
            "instrumentationLibrarySpans", []
        )
        for scope_spans in scopes:
            for span in scope_spans.get("spans", []):
                kind = span.get("kind", 0)
                status = span.get("status", {})
                spans.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=span.get("name", ""),
                        trace_id=_json_id(span.get("traceId")),
                        span_id=_json_id(span.get("spanId")),
                        parent_id=_json_id(span.get("parentSpanId")),
                        kind=kind if isinstance(kind, int) else _KINDS.get(kind, 0),
                        attributes={
                            a["key"]: _json_value(a["value"]) for a in span.get("attributes", [])
                        },
                        events=tuple(e.get("name", "") for e in span.get("events", [])),
                        status_code=int(status.get("code", 0) or 0)
                        if not isinstance(status.get("code"), str)
                        else 0,
                        status_message=status.get("message", ""),
                        resource=resource,
                        start_ns=int(span.get("startTimeUnixNano", 0)),
                        end_ns=int(span.get("endTimeUnixNano", 0)),
                    )
                )
    return spans


_KINDS = {"SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3}


class Receiver:
    """The spans received so far, and a wait for the ones a test expects."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/v1/traces"
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._changed = threading.Condition()

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._changed:
            self.spans.extend(spans)
            self.requests += 1
            self._changed.notify_all()

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 20.0
    ) -> list[ReceivedSpan]:
        """Block until `found(spans)` holds (for a thread: trio tests use `in_thread`)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not found(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [(s.service, s.name) for s in self.spans]
                    raise AssertionError(f"spans not received in {timeout} s; got {names}")
                self._changed.wait(left)
            return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A running receiver for the duration of the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    receiver = Receiver(server.server_address[1])
    server.receiver = receiver  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        as_json = self.headers.get("Content-Type", "").startswith("application/json")
        spans = decode_json(body) if as_json else decode(body)
        self.server.receiver.add(spans)  # type: ignore[attr-defined]
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass
