"""The tracer's parts without a fleet (rsgw.gateway.observe._tracing): the export
queue drops and counts rather than wait, and a call's spans nest as the caller said.

The exporter here is a stand-in whose export blocks until the test lets it go, or
fails: the queue's behaviour is decided by what the exporter does, so the test
controls that and waits on events, never on time.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from rsgw.base._status import StatusCode
from rsgw.base._trace_context import parse_traceparent
from rsgw.config._tracing import TracingConfig
from rsgw.gateway.observe._tracing import Tracer

CALLER = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Gate(SpanExporter):
    """Holds each export until `release`; answers `result`."""

    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.result = result
        self.entered = threading.Event()
        self.released = threading.Event()
        self.exported: list[ReadableSpan] = []
        self.done = threading.Condition()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.released.wait(10)
        with self.done:
            self.exported.extend(spans)
            self.done.notify_all()
        return self.result

    def shutdown(self) -> None:
        self.released.set()

    def wait_exported(self, count: int) -> list[ReadableSpan]:
        with self.done:
            assert self.done.wait_for(lambda: len(self.exported) >= count, 10)
            return list(self.exported)


class Drops:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.changed = threading.Condition()

    def __call__(self, reason: str, spans: int) -> None:
        with self.changed:
            self.counts[reason] = self.counts.get(reason, 0) + spans
            self.changed.notify_all()

    def wait(self, reason: str, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.counts.get(reason, 0) >= count, 10)


def _tracer(exporter: SpanExporter, drops: Drops, **settings: Any) -> Tracer:
    config = TracingConfig(endpoint="http://127.0.0.1:1/v1/traces", **settings)
    return Tracer(config, drops, mode="round_robin", exporter=exporter)


def _call(tracer: Tracer, metadata: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """One traced call with one attempt; the traceparent its worker would be sent."""
    call = tracer.server("ModelInfer", metadata, "grpc")
    attempt, forwarded = call.attempt("worker0", metadata)
    attempt.end(answered=True)
    call.end("simple", "worker0", StatusCode.OK)
    return dict(forwarded)[b"traceparent"]


def test_a_full_queue_drops_and_counts_and_never_waits() -> None:
    gate, drops = Gate(), Drops()
    tracer = _tracer(gate, drops, max_queue_size=4, max_export_batch_size=2)
    try:
        _call(tracer)  # two spans: a batch, which the export thread takes and holds
        assert gate.entered.wait(10)
        for _ in range(3):  # six spans more into a queue of four: two dropped
            _call(tracer)
        drops.wait("queue_full", 2)
        assert drops.counts == {"queue_full": 2}
        gate.released.set()
        assert len(gate.wait_exported(6)) == 6
    finally:
        tracer.close()


def test_a_failed_export_counts_its_spans_lost() -> None:
    gate, drops = Gate(SpanExportResult.FAILURE), Drops()
    gate.released.set()
    tracer = _tracer(gate, drops, max_export_batch_size=2)
    try:
        _call(tracer)
        drops.wait("export_failed", 2)
    finally:
        tracer.close()


def test_spans_nest_under_the_caller_and_the_worker_under_the_attempt() -> None:
    gate, drops = Gate(), Drops()
    gate.released.set()
    tracer = _tracer(gate, drops, max_export_batch_size=2)
    try:
        forwarded = _call(tracer, ((b"traceparent", CALLER), (b"tracestate", b"congo=t61")))
        server, attempt = sorted(gate.wait_exported(2), key=lambda s: s.name != "ModelInfer")
    finally:
        tracer.close()
    caller = parse_traceparent(CALLER)
    assert caller is not None and server.parent is not None and server.context is not None
    assert (server.context.trace_id, server.parent.span_id) == (caller.trace_id, caller.span_id)
    assert server.context.trace_state.get("congo") == "t61"
    assert attempt.parent is not None and attempt.parent.span_id == server.context.span_id
    worker_parent = parse_traceparent(forwarded)
    assert worker_parent is not None and attempt.context is not None
    assert (worker_parent.trace_id, worker_parent.span_id) == (
        caller.trace_id,
        attempt.context.span_id,
    )
    assert dict(server.attributes or {})["rsgw.mode"] == "round_robin"


def test_an_unsampled_caller_is_not_exported() -> None:
    gate, drops = Gate(), Drops()
    gate.released.set()
    tracer = _tracer(gate, drops, max_export_batch_size=1)
    unsampled = CALLER[:-2] + b"00"
    try:
        forwarded = _call(tracer, ((b"traceparent", unsampled),))
        _call(tracer)  # a sampled one after it, to wait on
        exported = gate.wait_exported(2)
    finally:
        tracer.close()
    caller = parse_traceparent(unsampled)
    assert caller is not None
    assert all(
        span.context is not None and span.context.trace_id != caller.trace_id for span in exported
    )
    # The worker still joins the caller's trace, unsampled as the caller decided.
    assert forwarded.startswith(CALLER[:36]) and forwarded.endswith(b"-00")
