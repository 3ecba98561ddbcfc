"""The gateway's own spans: OpenTelemetry's SDK, exported over OTLP/HTTP.

Imported only when `tracing:` has an exporter endpoint (`rsgw.gateway._parts`), so a
gateway that traces nothing neither loads the SDK nor pays for it on a call: the
request path tests one attribute for None. The SDK is the `tracing` extra
(`pip install rsgw[tracing]`); without it a configured endpoint is a start-up error
that says so.

What a traced ModelInfer records (`CallSpan`): a SERVER span named for the RPC, the
child of the caller's span when it sent a valid `traceparent`
(`rsgw.base._trace_context` reads it, the caller's `tracestate` kept), with the model,
the scheduling mode, the worker that answered, the attempts and the gRPC status; an
event for a wait for admission; a `load wait` child span for a cold model's load; and a
CLIENT child span for each attempt at a worker (a failover makes two), whose id is the
parent the worker is told (`traceparent`), so Triton's `InferRequest` nests under it.

How spans leave the process is shared with the worker (`rsgw.runtime._spans`): the
sampler, the bounded export queue that never makes a call wait, and the caller's
context as a remote parent; what the export loses is counted in
`gateway_trace_spans_dropped_total{reason}`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

from rsgw.base._errors import RsgwError
from rsgw.base._status import StatusCode as GrpcCode
from rsgw.base._trace_context import (
    TRACEPARENT,
    TRACESTATE,
    TraceContext,
    TraceParent,
    trace_context,
)
from rsgw.grpc.protocol._metadata import HeaderBlock
from rsgw.runtime._spans import Dropped, Spans, TracingConfig, remote_parent

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

_TRACE_HEADERS = (TRACEPARENT, TRACESTATE)


class Tracer:
    """The gateway's tracer: makes `CallSpan`s (see the module docstring)."""

    def __init__(
        self,
        config: TracingConfig,
        dropped: Dropped,
        *,
        mode: str = "",
        exporter: SpanExporter | None = None,
    ) -> None:
        resource = {"service.name": config.service_name}
        self.spans = Spans(config, dropped, resource, exporter=exporter)
        self._tracer = self.spans.tracer("rsgw.gateway")
        # A call's first attributes, by its door (the SDK copies them into the span).
        self._rest = {"rsgw.protocol": "rest", "rsgw.mode": mode}
        self._grpc = {
            **self._rest,
            "rsgw.protocol": "grpc",
            "rpc.system": "grpc",
            "rpc.service": "inference.GRPCInferenceService",
            "rpc.method": "ModelInfer",
        }

    def server(self, rpc: str, metadata: HeaderBlock, protocol: str) -> CallSpan:
        """The span of one call, the child of the caller's when it sent a context."""
        caller = trace_context(metadata) if metadata else None
        parent = None if caller is None else remote_parent(caller)
        span = self._tracer.start_span(
            rpc,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=self._grpc if protocol == "grpc" else self._rest,
        )
        return CallSpan(self._tracer, span, caller)

    def close(self) -> None:
        """The gateway stops: what is queued is exported from the export thread,
        without keeping the stop waiting."""
        self.spans.close()


class CallSpan:
    """One call's spans: its own, and a child for each attempt at a worker."""

    __slots__ = ("_attempts", "_caller", "_error", "_tracer", "span")

    def __init__(self, tracer: trace.Tracer, span: trace.Span, caller: TraceContext | None) -> None:
        self._tracer = tracer
        self.span = span
        self._caller = caller
        self._attempts = 0
        self._error = ""

    def event(self, name: str, **attributes: str | int | float) -> None:
        """Something that happened in the call (an admission wait, a routing choice)."""
        self.span.add_event(name, attributes=attributes)

    def child(self, name: str, **attributes: str | int | float) -> trace.Span:
        """A child span of the call (a cold model's load wait); the caller ends it."""
        context = trace.set_span_in_context(self.span)
        return self._tracer.start_span(name, context=context, attributes=attributes)

    def attempt(self, worker: str, metadata: HeaderBlock) -> tuple[Attempt, HeaderBlock]:
        """A span for the next attempt at `worker`, and the metadata that names it as
        the worker's parent (`metadata` without any `traceparent` / `tracestate`)."""
        self._attempts += 1
        context = trace.set_span_in_context(self.span)
        span = self._tracer.start_span(
            "attempt",
            context=context,
            kind=SpanKind.CLIENT,
            attributes={"rsgw.worker": worker, "rsgw.attempt": self._attempts},
        )
        own = span.get_span_context()
        kept = tuple(h for h in metadata if h[0] not in _TRACE_HEADERS)
        caller = self._caller
        if caller is not None:
            headers = caller.headers(own.span_id, own.trace_flags.sampled)
        else:
            parent = TraceParent(own.trace_id, own.span_id, int(own.trace_flags))
            headers = TraceContext(parent).headers()
        return Attempt(span), kept + headers

    def failed(self, exc: BaseException) -> None:
        """Why the call failed, when it says (a refusal names its reason)."""
        if isinstance(exc, RsgwError):
            self._error = exc.message

    def end(self, model: str, worker: str, code: GrpcCode) -> None:
        """The call is over: its outcome on its span."""
        span = self.span
        if model:
            span.set_attribute("rsgw.model", model)
        if worker:
            span.set_attribute("rsgw.worker", worker)
        span.set_attribute("rsgw.attempts", self._attempts)
        span.set_attribute("rpc.grpc.status_code", int(code))
        if code is not GrpcCode.OK:
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {self._error}"))
        span.end()


class Attempt:
    """One attempt at a worker: its span, ended as the attempt was."""

    __slots__ = ("_code", "_error", "span")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self._code: GrpcCode | None = None
        self._error = ""

    def failed(self, exc: RsgwError) -> None:
        """The worker failed the attempt (or could not be reached): its status."""
        self._code, self._error = exc.code, exc.message

    def end(self, answered: bool) -> None:
        """The attempt is over: answered, failed, or cut short (the call's deadline)."""
        code = GrpcCode.OK if answered else self._code or GrpcCode.CANCELLED
        span = self.span
        span.set_attribute("rpc.grpc.status_code", int(code))
        if code is not GrpcCode.OK:
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {self._error}"))
        span.end()
