"""The simulated worker's own spans: where a traced call's time went on the device.

Imported only when the worker has somewhere to send spans (`WorkerConfig.tracing`,
which `rsgw worker` reads from OpenTelemetry's variables as the gateway does), so a
worker with no collector neither loads the SDK nor pays more on a call than a test
for None (the service's tracer, the device's list of batches). How spans leave the
process (sampler, bounded export, drops counted in
`worker_trace_spans_dropped_total{reason}`) is the gateway's too
(`rsgw.runtime._spans`).

What a traced ModelInfer, or each request of a ModelStreamInfer, records:
- a SERVER span named for the RPC, the child of the caller's span when it sent a
  valid `traceparent` (behind rsgw: the gateway's `attempt` span), with `rsgw.model`,
  `rsgw.worker`, `rsgw.gpu`, `rsgw.batch.size` (the requests in the batch it ran in)
  and `rpc.grpc.status_code`; a failed call's status says why;
- for each batch it ran in (a meta's sub-models make one each): a `queue wait` span,
  from joining the queue to the batch starting, and a `batch` span with its size,
  its rows and `rsgw.batch.others` (the other calls in it), holding a `weights load`
  span when the model's weights had to come onto the device first, and a `compute`
  span.

Sampling follows the caller (parent-based): a sampled `traceparent` makes a sampled
span, an unsampled one makes none and the device records nothing for the call. A
call without a context starts a trace of its own, sampled as `OTEL_TRACES_SAMPLER`
says of new traces (always, by default; `parentbased_always_off` joins only callers'
traces). A call shed at the admission cap is refused before it is metered, and so
has no span: `worker_requests_shed_total` counts it, and the caller's span shows it.

The device keeps Trio's clock and a span wall-clock time: the device's moments are
moved by the difference between the two clocks, taken when the call ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

import trio
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

from rsgw.base._errors import RsgwError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode as GrpcCode
from rsgw.base._trace_context import trace_context
from rsgw.grpc._metering import Meter
from rsgw.runtime._spans import Dropped, Spans, TracingConfig, remote_parent

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.export import SpanExporter

    from rsgw.base._call import CallContext
    from rsgw.worker.device._batching import BatchSeen

#: What a meter reports a call's outcome to (`WorkerService._observe_infer`).
Observe = Callable[[GrpcCode, str, float | None, str], None]
#: What makes a call's meter: `Meter` itself, or `WorkerTracer.meter`.
MeterFactory = Callable[["CallContext", Observe, str], Meter]
#: The methods that make spans: a unary call, and each request of a stream.
_TRACED = (Method.MODEL_INFER, Method.MODEL_STREAM_INFER)


class WorkerTracer:
    """The worker's tracer: makes a `TracedMeter` of each sampled call."""

    def __init__(
        self,
        config: TracingConfig,
        worker: str,
        gpu: str,
        dropped: Dropped,
        *,
        exporter: SpanExporter | None = None,
    ) -> None:
        # The worker's name tells a node's workers apart, whatever they inherited.
        resource = {"service.name": config.service_name, "service.instance.id": worker}
        self.spans = Spans(config, dropped, resource, exporter=exporter)
        self._tracer = self.spans.tracer("rsgw.worker")
        common = {
            "rpc.system": "grpc",
            "rpc.service": "inference.GRPCInferenceService",
            "rsgw.worker": worker,
            "rsgw.gpu": gpu,
        }
        # A call's span name and first attributes, by its path (the SDK copies them).
        self._by_path = {m.path: (m.rpc, {**common, "rpc.method": m.rpc}) for m in _TRACED}

    def meter(self, call: CallContext, observe: Observe, label: str) -> Meter:
        """The call's meter: a `TracedMeter` when the call is sampled, else a plain one."""
        caller = trace_context(call.metadata) if call.metadata else None
        rpc, attributes = self._by_path[call.path]
        span = self._tracer.start_span(
            rpc,
            context=None if caller is None else remote_parent(caller),
            kind=SpanKind.SERVER,
            attributes=attributes,
        )
        if not span.is_recording():
            return Meter(call, observe, label)
        return TracedMeter(call, observe, label, span, self._tracer)

    def close(self) -> None:
        """The worker stops: what is queued is exported from the export thread."""
        self.spans.close()


class TracedMeter(Meter):
    """A sampled call's meter: counts it as any call, and ends its span with it.

    The device appends each batch the call runs in to `seen` (`BatchSeen`).
    """

    __slots__ = ("_tracer", "seen", "span")

    def __init__(
        self,
        call: CallContext,
        observe: Observe,
        label: str,
        span: trace.Span,
        tracer: trace.Tracer,
    ) -> None:
        super().__init__(call, observe, label)
        self.span = span
        self._tracer = tracer
        self.seen: list[BatchSeen] = []

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        super().__exit__(kind, exc, traceback)
        span, code = self.span, self.code
        span.set_attribute("rsgw.model", self.label)
        span.set_attribute("rpc.grpc.status_code", int(code))
        if self.seen:
            span.set_attribute("rsgw.batch.size", self.seen[-1].requests)
            # Trio's seconds -> wall-clock nanoseconds, as the SDK stamps spans.
            offset = time.time_ns() - round(trio.current_time() * 1e9)
            context = trace.set_span_in_context(span)
            for batch in self.seen:
                _batch_spans(self._tracer, context, batch, offset)
        if code is not GrpcCode.OK:
            why = exc.message if isinstance(exc, RsgwError) else ""
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {why}"))
        span.end()


def _batch_spans(tracer: trace.Tracer, parent: Context, batch: BatchSeen, offset: int) -> None:
    """The `queue wait` and `batch` spans of one batch a call ran in (module docstring)."""

    def at(moment: float) -> int:
        return round(moment * 1e9) + offset

    tracer.start_span("queue wait", parent, start_time=at(batch.queued)).end(at(batch.started))
    run = tracer.start_span(
        "batch",
        parent,
        start_time=at(batch.started),
        attributes={
            "rsgw.batch.size": batch.requests,
            "rsgw.batch.rows": batch.rows,
            "rsgw.batch.others": batch.requests - 1,
        },
    )
    inside = trace.set_span_in_context(run)
    if batch.computing > batch.started:
        load = tracer.start_span("weights load", inside, start_time=at(batch.started))
        load.end(at(batch.computing))
    tracer.start_span("compute", inside, start_time=at(batch.computing)).end(at(batch.ended))
    run.end(at(batch.ended))
