"""A process's spans: OpenTelemetry's SDK set up the one way every rsgw process uses it.

The gateway (`rsgw.gateway.observe._tracing`) and the simulated worker
(`rsgw.worker._tracing`) export spans alike: configured by the `tracing:` settings
(`rsgw.config._tracing`, read from OpenTelemetry's own variables), sampled by the
sampler `OTEL_TRACES_SAMPLER` names, sent over OTLP/HTTP from a bounded queue that
counts what it drops, under the caller's span when the call brought a `traceparent`.
What they record differs; how spans leave the process does not, so it lives here once.

Imported only when tracing is configured: this module loads the SDK (the `tracing`
extra), which a process with no collector never pays for.

Export never blocks or slows a call (`BoundedExport`): a finished span goes into a
bounded queue that a thread of its own empties in batches; a full queue drops the span
and an export that fails (the collector is away) loses its batch, both reported to the
`Dropped` callback the process counts in its metrics.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from rsgw.base._trace_context import TraceContext

#: reason -> spans lost; called from the export thread.
Dropped = Callable[[str, int], None]


class TracingConfig(Protocol):
    """What the spans read of the tracing settings (`rsgw.config._tracing.TracingConfig`,
    which the rooms that trace may not import: their wiring hands it in)."""

    @property
    def endpoint(self) -> str: ...
    @property
    def service_name(self) -> str: ...
    @property
    def sampler(self) -> str: ...
    @property
    def sampler_arg(self) -> float: ...
    @property
    def max_queue_size(self) -> int: ...
    @property
    def max_export_batch_size(self) -> int: ...
    @property
    def schedule_delay_millis(self) -> int: ...
    @property
    def export_timeout_millis(self) -> int: ...


def chosen_sampler(config: TracingConfig) -> sampling.Sampler:
    """The sampler `OTEL_TRACES_SAMPLER` / `tracing.sampler` names."""
    ratio = sampling.TraceIdRatioBased(config.sampler_arg)
    chosen: dict[str, sampling.Sampler] = {
        "always_on": sampling.ALWAYS_ON,
        "always_off": sampling.ALWAYS_OFF,
        "traceidratio": ratio,
        "parentbased_always_on": sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": sampling.ParentBased(ratio),
    }
    return chosen[config.sampler]


class BoundedExport(SpanProcessor):
    """Batches finished spans to an exporter from a thread, never making a call wait.

    The SDK's own batch processor drops silently when its queue is full; this one
    counts what it drops (`dropped`), and what an export that failed lost.
    """

    def __init__(self, exporter: SpanExporter, config: TracingConfig, dropped: Dropped) -> None:
        self._exporter = exporter
        self._max_queue = config.max_queue_size
        self._batch = config.max_export_batch_size
        self._delay = config.schedule_delay_millis / 1000
        self._timeout = config.export_timeout_millis / 1000
        self._dropped = dropped
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = threading.Lock()
        self._export_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="rsgw-span-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: object = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        """Queue a sampled span, or count it dropped when the queue is full."""
        context = span.context
        if context is None or not context.trace_flags.sampled or self._stopped:
            return
        with self._lock:
            if len(self._queue) >= self._max_queue:
                full = True
            else:
                full = False
                self._queue.append(span)
                batch_ready = len(self._queue) >= self._batch
        if full:
            self._dropped("queue_full", 1)
        elif batch_ready:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._export_queued()
        self._export_queued()  # what the stop left
        self._exporter.shutdown()

    def _export_queued(self) -> None:
        with self._export_lock:
            while True:
                with self._lock:
                    count = min(self._batch, len(self._queue))
                    batch = [self._queue.popleft() for _ in range(count)]
                if not batch:
                    return
                try:
                    result = self._exporter.export(batch)
                except Exception:  # an exporter's bug must not end the thread
                    result = SpanExportResult.FAILURE
                if result is not SpanExportResult.SUCCESS:
                    self._dropped("export_failed", len(batch))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued now (blocking: call it from a thread)."""
        self._export_queued()
        return True

    def close(self) -> None:
        """Stop taking spans; the thread exports what is queued, then ends (no wait)."""
        self._stopped = True
        self._wake.set()

    def shutdown(self) -> None:
        """`close`, and wait for the last export (at most its timeout; at exit)."""
        self.close()
        self._thread.join(self._timeout)


class Spans:
    """A process's tracer provider: its resource, its sampler and its bounded export.

    `resource` names the process (`service.name`, and for a worker its
    `service.instance.id`); it wins over `OTEL_RESOURCE_ATTRIBUTES`, so processes that
    inherit one environment (a node's workers) still tell themselves apart. `sampler`
    replaces the one the settings name: a process that decides sampling before it asks
    for spans (the gateway, `rsgw.base._sampling`) wants every span it asks for.
    """

    def __init__(
        self,
        config: TracingConfig,
        dropped: Dropped,
        resource: Mapping[str, str],
        *,
        exporter: SpanExporter | None = None,
        sampler: sampling.Sampler | None = None,
    ) -> None:
        chosen = chosen_sampler(config) if sampler is None else sampler
        self.provider = TracerProvider(resource=Resource.create(dict(resource)), sampler=chosen)
        if exporter is None:
            timeout = config.export_timeout_millis / 1000
            exporter = OTLPSpanExporter(endpoint=config.endpoint, timeout=timeout)
        self.export = BoundedExport(exporter, config, dropped)
        self.provider.add_span_processor(self.export)

    def tracer(self, name: str) -> trace.Tracer:
        """The tracer a part of the process makes its spans with (`name`: its module)."""
        return self.provider.get_tracer(name)

    def close(self) -> None:
        """The process stops: what is queued is exported from the export thread,
        without keeping the stop waiting."""
        self.export.close()


def remote_parent(caller: TraceContext) -> Context:
    """The context that makes a span the child of the caller's (its `traceparent`),
    sampled as the caller decided and with its `tracestate`."""
    parent = caller.parent
    context = SpanContext(
        parent.trace_id,
        parent.span_id,
        is_remote=True,
        trace_flags=TraceFlags(parent.flags & TraceFlags.SAMPLED),
        trace_state=TraceState(list(caller.state)),
    )
    return trace.set_span_in_context(NonRecordingSpan(context))
