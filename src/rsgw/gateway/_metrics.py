"""The gateway's own Prometheus series (REFERENCE.md §6.1), one registry per gateway.

Each gateway instance owns a `CollectorRegistry`, so two gateways can run in one
process (tests do). The request path touches only cached label children: a
(rpc, model) pair resolves to its histogram child once, and model labels are
bounded (a name no worker serves is `_unknown_`, SHM calls use `model=""`), so a
client sending random names grows neither memory nor series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rsgw._exposition import LATENCY_BUCKETS, render_registry
from rsgw.grpc._status import StatusCode

#: The model label of a request for a model no worker serves.
UNKNOWN_MODEL = "_unknown_"


class GatewayMetrics:
    """The gateway's registry and the hot-path helpers that write to it."""

    def __init__(self, names: Callable[[str], str]) -> None:
        #: URL -> friendly worker label (`worker0`), or the URL itself when unnamed.
        self.worker_label = names
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "gateway_requests",
            "Count of gateway RPCs by method, model, and gRPC status code.",
            ["rpc", "model", "status"],
            registry=r,
        )
        self.request_latency = Histogram(
            "gateway_request_latency_seconds",
            "Gateway-internal latency.",
            ["rpc", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.worker_latency = Histogram(
            "gateway_worker_latency_seconds",
            "Latency of calls from the gateway to each worker.",
            ["rpc", "worker"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.routing_table_size = Gauge(
            "gateway_routing_table_size", "Models in the routing table.", registry=r
        )
        self.worker_ready = Gauge(
            "gateway_worker_ready",
            "1 if the worker's last ServerReady probe said ready, else 0.",
            ["worker"],
            registry=r,
        )
        self.worker_metrics_up = Gauge(
            "gateway_worker_metrics_up",
            "1 if the last scrape of the worker's metrics endpoint succeeded, else 0.",
            ["worker"],
            registry=r,
        )
        self.shed = Counter(
            "gateway_requests_shed",
            "RPCs shed with RESOURCE_EXHAUSTED at the inbound cap.",
            registry=r,
        )
        self.max_concurrent = Gauge(
            "gateway_max_concurrent_requests",
            "Configured inbound cap (per-worker cap x workers; 0 = uncapped).",
            registry=r,
        )
        self._latency_children: dict[tuple[str, str], Histogram] = {}
        self._count_children: dict[tuple[str, str, StatusCode], Counter] = {}
        self._worker_children: dict[tuple[str, str], Histogram] = {}

    def track_inflight(self, read: Callable[[], int]) -> None:
        """Export `gateway_inflight_requests`, read at scrape time (cap enabled only)."""
        self.registry.register(
            _ScalarGauge("gateway_inflight_requests", "In-flight RPCs (capped methods).", read)
        )

    def track_inflight_work(self, basis: str, read: Callable[[], Mapping[str, float]]) -> None:
        """Export `gateway_worker_inflight_work{worker,basis}`, read live at scrape time.

        The load the router compares when it picks a replica, so a routing decision
        can be explained afterwards. Workers the scheduler no longer tracks are not
        emitted, rather than frozen at their last value.
        """
        self.registry.register(_InflightWork(basis, read, self.worker_label))

    def observe(self, rpc: str, model: str, code: StatusCode, seconds: float | None) -> None:
        """Count one handled RPC; `seconds` None records no latency (rejected at parse)."""
        key = (rpc, model, code)
        counter = self._count_children.get(key)
        if counter is None:
            counter = self._count_children[key] = self.requests.labels(rpc, model, code.camel)
        counter.inc()
        if seconds is not None:
            pair = (rpc, model)
            latency = self._latency_children.get(pair)
            if latency is None:
                latency = self._latency_children[pair] = self.request_latency.labels(rpc, model)
            latency.observe(seconds)

    def observe_worker(self, rpc: str, url: str, seconds: float) -> None:
        key = (rpc, url)
        child = self._worker_children.get(key)
        if child is None:
            child = self._worker_children[key] = self.worker_latency.labels(
                rpc, self.worker_label(url)
            )
        child.observe(seconds)

    def render(self) -> bytes:
        return render_registry(self.registry)


class _InflightWork(Collector):
    def __init__(
        self, basis: str, read: Callable[[], Mapping[str, float]], label: Callable[[str], str]
    ) -> None:
        self._basis = basis
        self._read = read
        self._label = label

    def collect(self) -> Iterator[Metric]:
        loads = sorted((self._label(url), value) for url, value in self._read().items())
        if not loads:
            return
        family = GaugeMetricFamily(
            "gateway_worker_inflight_work",
            "In-flight work per worker as the router compares it, in work_basis units.",
            labels=["worker", "basis"],
        )
        for worker, value in loads:
            family.add_metric([worker, self._basis], value)
        yield family


class _ScalarGauge(Collector):
    def __init__(self, name: str, doc: str, read: Callable[[], int]) -> None:
        self._name = name
        self._doc = doc
        self._read = read

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._doc, value=self._read())
