"""The worker's Prometheus series (docs/original.md §6.4), labelled `worker` and `gpu`.

Per-model state (dispatches, compute, queue depth, residency) and the weight
cache's figures are read from the device when scraped, so the dispatch loop
updates plain integers and never a metric. Only the per-request outcome
(`worker_requests_total`, latency) is counted as it happens.

Models are the routable ones: a meta is one unit and its internal sub-models
are not listed (their device time is the meta's), so a sum over models counts
each device second once. The weight-cache series appear when the cache is
enabled or the control plane manages residency, as in the original. Every
series carries `worker` and `gpu` first, so a node-wide scrape through the
gateway needs no relabelling.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from rsgw.runtime._exposition import LATENCY_BUCKETS, add_runtime_series, render_registry
from rsgw.worker.device._weights import ResidencyMode

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from rsgw.base._status import StatusCode
    from rsgw.worker.device._device import Device


class AdmissionStats(Protocol):
    """What the metrics read from the request path's admission control."""

    inflight: int
    shed_total: int
    max_concurrent_requests: int


class WorkerMetrics:
    """One worker's registry: request outcomes plus a scrape-time view of the device."""

    def __init__(self, worker: str, gpu: str, device: Device) -> None:
        self.worker = worker
        self.gpu = gpu
        self.device = device
        self.admission: AdmissionStats | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests = Counter(
            "worker_requests",
            "ModelInfer requests by model and gRPC status code.",
            ["worker", "gpu", "model", "status"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "worker_request_latency_seconds",
            "ModelInfer latency inside the worker, queueing included.",
            ["worker", "gpu", "model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._spans_dropped = Counter(
            "worker_trace_spans_dropped",
            "Spans the worker made but did not export (tracing on): its export queue "
            "was full (queue_full) or the collector did not take them (export_failed).",
            ["worker", "gpu", "reason"],
            registry=self.registry,
        )
        self.registry.register(_DeviceCollector(self))
        add_runtime_series(self.registry, "worker", {"worker": worker, "gpu": gpu})

    def count_request(self, model: str, code: StatusCode, seconds: float) -> None:
        self._requests.labels(self.worker, self.gpu, model, code.name).inc()
        if seconds > 0:
            self._latency.labels(self.worker, self.gpu, model).observe(seconds)

    def count_spans_dropped(self, reason: str, spans: int) -> None:
        """Spans lost on their way to the collector (called from the export thread)."""
        self._spans_dropped.labels(self.worker, self.gpu, reason).inc(spans)

    def render(self) -> bytes:
        return render_registry(self.registry)


class _DeviceCollector(Collector):
    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._per_model()
        yield from self._memory()
        yield self._info()
        yield from self._admission()

    def _per_model(self) -> Iterator[Metric]:
        """Each routable model's dispatches, queue, residency and batch sizes."""
        m = self._metrics
        device = m.device
        base = [m.worker, m.gpu]
        per_model = ["worker", "gpu", "model"]

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=per_model)

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=per_model)

        dispatch = counter("worker_dispatch", "Batches dispatched to the device.")
        compute = counter("worker_compute_seconds", "Device seconds spent executing batches.")
        served = counter("worker_requests_served", "Requests completed in dispatched batches.")
        rows = counter("worker_rows_served", "Batch-axis rows completed (padding excluded).")
        depth = gauge("worker_queue_depth", "Requests waiting for the device.")
        wait = SummaryMetricFamily(
            "worker_queue_wait_seconds",
            "Queue wait before dispatch: quantiles of the recent waits, count and sum of all.",
            labels=per_model,
        )
        resident = gauge("worker_model_resident", "1 if the model's weights are on the device.")
        pinned = gauge("worker_model_pinned", "1 if the model is pinned on the device.")
        weight = gauge("worker_model_weight_bytes", "Weight footprint of the model.")
        max_batch = gauge("worker_model_max_batch_size", "Largest batch the model runs.")
        batch_sizes = HistogramMetricFamily(
            "worker_batch_size",
            "Batch size of each dispatch (Triton's batch statistics, as a histogram).",
            labels=per_model,
        )
        for spec in device.catalogue.routable:
            c = device.counters[spec.name]
            residence = device.memory.residence(spec.name)
            labels = [*base, spec.name]
            dispatch.add_metric(labels, c.dispatch_count)
            compute.add_metric(labels, c.total_compute_seconds)
            served.add_metric(labels, c.requests_served)
            rows.add_metric(labels, c.rows_served)
            depth.add_metric(labels, device.queue_depth(spec.name))
            waits = sorted(c.queue_waits)
            for q in ("0.5", "0.99"):
                names = {"worker": m.worker, "gpu": m.gpu, "model": spec.name, "quantile": q}
                value = _quantile(waits, float(q))
                wait.samples.append(Sample("worker_queue_wait_seconds", names, value))
            wait.add_metric(labels, c.queue_wait_count, c.queue_seconds)
            resident.add_metric(labels, int(residence.device_resident))
            pinned.add_metric(labels, int(residence.pinned))
            weight.add_metric(labels, residence.weight_nbytes)
            max_batch.add_metric(labels, 0 if spec.is_meta else spec.max_batch_size)
            batch_sizes.add_metric(labels, *_batch_histogram(c.batches))
        yield from (dispatch, compute, depth, wait, resident, pinned, weight, served, rows)
        yield max_batch
        yield batch_sizes

    def _memory(self) -> Iterator[Metric]:
        """The device's weights: models loaded and resident, and the weight cache."""
        m = self._metrics
        device = m.device
        base = [m.worker, m.gpu]
        weights = device.memory.cache
        on_device = list(weights.resident_models())
        scalars: list[tuple[str, str, float]] = [
            (
                "worker_models_loaded",
                "Models compiled and registered.",
                len(device.catalogue.models),
            ),
            ("worker_models_resident", "Models whose weights are on the device.", len(on_device)),
            (
                "worker_resident_weight_bytes",
                "Weight bytes on the device.",
                weights.pinned_bytes + weights.resident_bytes,
            ),
        ]
        if device.memory.cache_enabled or device.residency_mode is ResidencyMode.EXTERNALLY_MANAGED:
            moved = device.memory.counters
            scalars += [
                (
                    "worker_weight_cache_resident_bytes",
                    "On-demand (unpinned) weight bytes on the device.",
                    weights.resident_bytes,
                ),
                ("worker_weight_cache_max_bytes", "On-demand weight budget.", weights.max_bytes),
                (
                    "worker_weight_cache_pinned_bytes",
                    "Weight bytes pinned on the device (exempt from the budget).",
                    weights.pinned_bytes,
                ),
            ]
            for name, doc, total in (
                ("worker_weight_loads", "Weight loads onto the device.", moved.loads),
                ("worker_weight_evicts", "Weights evicted to make room.", moved.evicts),
                (
                    "worker_weight_load_seconds",
                    "Device seconds spent loading weights (not compute).",
                    moved.load_seconds,
                ),
                ("worker_weight_compactions", "CompactMemory runs.", moved.compactions),
            ):
                moved_family = CounterMetricFamily(name, doc, labels=["worker", "gpu"])
                moved_family.add_metric(base, total)
                yield moved_family
        for name, doc, value in scalars:
            family = GaugeMetricFamily(name, doc, labels=["worker", "gpu"])
            family.add_metric(base, value)
            yield family

    def _info(self) -> Metric:
        """`worker_info`: how the worker runs, as labels of a constant 1."""
        m = self._metrics
        device = m.device
        base = [m.worker, m.gpu]
        info = GaugeMetricFamily(
            "worker_info",
            "Constant 1, labelled with how the worker runs.",
            labels=[
                "worker",
                "gpu",
                "device_ordinal",
                "control_mode",
                "discipline",
                "residency_mode",
            ],
        )
        # control_mode as the original names it: "explicit" when the control
        # plane decides residency, "none" otherwise.
        externally = device.residency_mode is ResidencyMode.EXTERNALLY_MANAGED
        info.add_metric(
            [
                *base,
                m.gpu,
                "explicit" if externally else "none",
                device.discipline.value,
                device.residency_mode.value,
            ],
            1,
        )
        return info

    def _admission(self) -> Iterator[Metric]:
        """The ModelInfer admission cap, when the worker has one."""
        m = self._metrics
        base = [m.worker, m.gpu]
        admission = m.admission
        if admission is not None:
            inflight = GaugeMetricFamily(
                "worker_inflight_requests", "ModelInfer calls in flight.", labels=["worker", "gpu"]
            )
            inflight.add_metric(base, admission.inflight)
            shed = CounterMetricFamily(
                "worker_requests_shed",
                "ModelInfer calls shed at the admission cap.",
                labels=["worker", "gpu"],
            )
            shed.add_metric(base, admission.shed_total)
            cap = GaugeMetricFamily(
                "worker_max_concurrent_requests",
                "Admission cap (0 = uncapped).",
                labels=["worker", "gpu"],
            )
            cap.add_metric(base, admission.max_concurrent_requests)
            yield from (inflight, shed, cap)


#: Upper bounds of `worker_batch_size`: powers of two, as max batch sizes usually are.
BATCH_BUCKETS = tuple(2**k for k in range(9))


def _batch_histogram(
    batches: Mapping[int, tuple[int, float]],
) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets and the sum of batch sizes, from executions per batch size."""
    buckets = [
        (str(bound), float(sum(n for size, (n, _) in batches.items() if size <= bound)))
        for bound in BATCH_BUCKETS
    ]
    buckets.append(("+Inf", float(sum(n for n, _ in batches.values()))))
    return buckets, float(sum(size * n for size, (n, _) in batches.items()))


def _quantile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]
