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
Every other RPC the gateway answers (the fan-outs: shared-memory registration, model
control; the model RPCs) and each ModelStreamInfer gets a SERVER span of its own
(`handled`, `streamed`), current while it runs, and each call or stream it makes to a
worker a CLIENT span under it (`worker_call`).

How spans leave the process is shared with the worker (`rsgw.runtime._spans`): the
sampler, the bounded export queue that never makes a call wait, and the caller's
context as a remote parent; what the export loses is counted in
`gateway_trace_spans_dropped_total{reason}`.
"""

from __future__ import annotations

import contextlib
import random
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.trace import sampling
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind
from opentelemetry.trace.status import Status, StatusCode

from rsgw.base._errors import RsgwError
from rsgw.base._sampling import Sampling
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

    from rsgw.base._call import CallContext, UnaryHandler
    from rsgw.grpc._streams import ServerStream, StreamHandler

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
        #: Which calls get spans, decided before the SDK is asked for any (so the
        #: SDK's own sampler samples every span it is asked for).
        self.sampling = Sampling.named(config.sampler, config.sampler_arg)
        self.spans = Spans(config, dropped, resource, exporter=exporter, sampler=sampling.ALWAYS_ON)
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

    def server(self, rpc: str, metadata: HeaderBlock, protocol: str) -> CallSpan | UnsampledCall:
        """The span of one call, the child of the caller's when it sent a context; for a
        call the sampler leaves out, no span at all (`rsgw.base._sampling`)."""
        caller = trace_context(metadata) if metadata else None
        if caller is None:
            trace_id = _random_id()
            if not self.sampling.sampled(None, trace_id):
                return UnsampledCall.root(trace_id)
            parent = None
        elif not self.sampling.sampled(caller.parent, caller.parent.trace_id):
            return UnsampledCall.under(caller)
        else:
            parent = remote_parent(caller)
        span = self._tracer.start_span(
            rpc,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=self._grpc if protocol == "grpc" else self._rest,
        )
        return CallSpan(self._tracer, span, caller)

    def handled(self, rpc: str, handler: UnaryHandler) -> UnaryHandler:
        """`handler` with a SERVER span around each call (a fan-out, a model RPC),
        current while it runs so that its calls to the workers nest under it
        (`worker_call`)."""

        async def traced(body: bytes, call: CallContext) -> bytes:
            span = self._own_span(rpc, call)
            if not span.is_recording():  # not sampled: its workers are told so
                with trace.use_span(span, end_on_exit=False):
                    return await handler(body, call)
            with trace.use_span(span, end_on_exit=False):
                try:
                    reply = await handler(body, call)
                except BaseException as exc:
                    _ended(span, call.status_for(exc), _why(exc))
                    raise
            _ended(span, GrpcCode.OK)
            return reply

        return traced

    def streamed(self, rpc: str, handler: StreamHandler) -> StreamHandler:
        """`handled` for a stream: one span from its opening to its end."""

        async def traced(stream: ServerStream) -> None:
            span = self._own_span(rpc, stream.call)
            if not span.is_recording():
                with trace.use_span(span, end_on_exit=False):
                    await handler(stream)
                return
            with trace.use_span(span, end_on_exit=False):
                try:
                    await handler(stream)
                except BaseException as exc:
                    _ended(span, stream.call.status_for(exc), _why(exc))
                    raise
            _ended(span, GrpcCode.OK)

        return traced

    def worker_call(
        self, worker: str, metadata: HeaderBlock
    ) -> tuple[Attempt | Untraced, HeaderBlock]:
        """A CLIENT span for a call to `worker` on behalf of the current span (a
        fan-out's, a stream's), and `metadata` naming it as the worker's parent; when
        the current span records nothing (not sampled, or none: a fan-out of the
        gateway's own), no span, and the metadata as it was."""
        if not trace.get_current_span().is_recording():
            current = trace.get_current_span().get_span_context()
            if not current.is_valid:
                return UNTRACED, metadata
            unsampled = TraceParent(current.trace_id, current.span_id, 0)
            return UNTRACED, _naming(metadata, TraceContext(unsampled).headers())
        span = self._tracer.start_span(
            "worker call", kind=SpanKind.CLIENT, attributes={"rsgw.worker": worker}
        )
        own = span.get_span_context()
        parent = TraceParent(own.trace_id, own.span_id, int(own.trace_flags))
        state = tuple(own.trace_state.items())
        return Attempt(span), _naming(metadata, TraceContext(parent, state).headers())

    def _own_span(self, rpc: str, call: CallContext) -> trace.Span:
        """A SERVER span for a call, or a span that records nothing (but names its
        trace, unsampled) when the sampler leaves the call out."""
        caller = trace_context(call.metadata) if call.metadata else None
        trace_id = _random_id() if caller is None else caller.parent.trace_id
        if not self.sampling.sampled(None if caller is None else caller.parent, trace_id):
            unsampled = SpanContext(trace_id, _random_id() & _SPAN_BITS, is_remote=False)
            return NonRecordingSpan(unsampled)
        return self._tracer.start_span(
            rpc,
            context=None if caller is None else remote_parent(caller),
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.method": rpc, "rsgw.protocol": call.protocol},
        )

    def close(self) -> None:
        """The gateway stops: what is queued is exported from the export thread,
        without keeping the stop waiting."""
        self.spans.close()


def _ended(span: trace.Span, code: GrpcCode, why: str = "") -> None:
    """End `span` with a call's outcome: its gRPC status, and why when it failed."""
    span.set_attribute("rpc.grpc.status_code", int(code))
    if code is not GrpcCode.OK:
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {why}"))
    span.end()


def _why(exc: BaseException) -> str:
    return exc.message if isinstance(exc, RsgwError) else ""


class CallSpan:
    """One call's spans: its own, and a child for each attempt at a worker."""

    __slots__ = ("_attempts", "_caller", "_error", "_tracer", "span")
    #: Its span records what the call does (`UnsampledCall`'s does not).
    recording = True

    def __init__(self, tracer: trace.Tracer, span: trace.Span, caller: TraceContext | None) -> None:
        self._tracer = tracer
        self.span = span
        self._caller = caller
        self._attempts = 0
        self._error = ""

    def ids(self) -> dict[str, str] | None:
        """The call's trace and span ids as OpenMetrics exemplars and the access log
        name them, when its trace is sampled (else None: an unsampled trace is not
        exported, so nothing could be found by its id)."""
        context = self.span.get_span_context()
        if not context.trace_flags.sampled:
            return None
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}

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
        caller = self._caller
        if caller is not None:
            headers = caller.headers(own.span_id, own.trace_flags.sampled)
        else:
            parent = TraceParent(own.trace_id, own.span_id, int(own.trace_flags))
            headers = TraceContext(parent).headers()
        return Attempt(span), _naming(metadata, headers)

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
        _ended(span, code, self._error)


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

    def ended_by(self, exc: BaseException) -> None:
        """The attempt failed with `exc` (or was cut short): over."""
        if isinstance(exc, RsgwError):
            self.failed(exc)
        self.end(answered=False)

    def end(self, answered: bool) -> None:
        """The attempt is over: answered, failed, or cut short (the call's deadline)."""
        code = GrpcCode.OK if answered else self._code or GrpcCode.CANCELLED
        _ended(self.span, code, self._error)


class Untraced:
    """An attempt or worker call that records nothing (its call is not sampled)."""

    __slots__ = ()

    def failed(self, exc: RsgwError) -> None:
        pass

    def ended_by(self, exc: BaseException) -> None:
        pass

    def end(self, answered: bool) -> None:
        pass


UNTRACED = Untraced()


class UnsampledCall:
    """A call the sampler left out: no span, but its workers are told the trace and
    that it is not sampled, so they leave it out too (as W3C asks of a participant).

    Made for most calls at a low sampling rate, so it costs one object and, for a
    call without a context, one formatted header: no span, no dataclass."""

    __slots__ = ("_headers",)
    #: Nothing is recorded: the call path skips what would only feed a span.
    recording = False

    def __init__(self, headers: HeaderBlock) -> None:
        self._headers = headers

    @classmethod
    def root(cls, trace_id: int) -> UnsampledCall:
        """A trace that begins here, unsampled."""
        span_id = random.getrandbits(64) or 1
        return cls(((TRACEPARENT, b"00-%032x-%016x-00" % (trace_id, span_id)),))

    @classmethod
    def under(cls, caller: TraceContext) -> UnsampledCall:
        """The caller's span stays the worker's parent: the gateway made none."""
        return cls(caller.headers(sampled=False))

    def ids(self) -> None:
        return None

    def event(self, name: str, **attributes: str | int | float) -> None:
        pass

    def child(self, name: str, **attributes: str | int | float) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def attempt(self, worker: str, metadata: HeaderBlock) -> tuple[Untraced, HeaderBlock]:
        return UNTRACED, _naming(metadata, self._headers)

    def failed(self, exc: BaseException) -> None:
        pass

    def end(self, model: str, worker: str, code: GrpcCode) -> None:
        pass


_SPAN_BITS = (1 << 64) - 1


def _naming(metadata: HeaderBlock, headers: HeaderBlock) -> HeaderBlock:
    """`metadata` for a worker, its trace headers replaced by `headers` (the span that
    is to be the worker's parent, or the call's context handed on unsampled)."""
    return tuple(h for h in metadata if h[0] not in _TRACE_HEADERS) + headers


def _random_id() -> int:
    """A new trace id (128 random bits; never zero, which W3C reserves)."""
    return random.getrandbits(128) or 1


#: A call's tracing, sampled or not, and an attempt's.
Traced = CallSpan | UnsampledCall
AnyAttempt = Attempt | Untraced
