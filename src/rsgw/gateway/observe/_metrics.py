"""The gateway's own Prometheus series (docs/original.md §6.1), one registry per gateway.

Each gateway instance owns a `CollectorRegistry`, so two gateways can run in one
process (tests do). The request path touches only cached label children: a
(rpc, model) pair resolves to its histogram child once, and model labels are
bounded (a name no worker serves is `_unknown_`, SHM calls use `model=""`), so a
client sending random names grows neither memory nor series.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from rsgw.base._methods import METHODS_BY_PATH
from rsgw.base._status import StatusCode
from rsgw.base._uploads import UploadBudget
from rsgw.coordination._records import CoordinationView
from rsgw.gateway.observe._collectors import (
    CoordinationSeries,
    ForecastSeries,
    InflightWorkSeries,
    PackingSeries,
    PackingView,
    ResidencySeries,
    ScalarCounter,
    ScalarGauge,
    UploadSeries,
    by_label,
    by_model,
)
from rsgw.runtime._exposition import LATENCY_BUCKETS, render_registry
from rsgw.runtime._hot_series import Count, CounterFamily, HistogramFamily, Latencies
from rsgw.scheduling.calls._forecast import DEADLINE, QUEUE

if TYPE_CHECKING:
    from prometheus_client.core import Metric

#: The model label of a request for a model no worker serves.
UNKNOWN_MODEL = "_unknown_"
#: `gateway_repacks_total{trigger}` values, exported from the start at 0.
REPACK_TRIGGERS = ("startup", "compute", "operator")


class GatewayMetrics:
    """The gateway's registry and the hot-path helpers that write to it."""

    def __init__(self, names: Callable[[str], str]) -> None:
        #: URL -> friendly worker label (`worker0`), or the URL itself when unnamed.
        self.worker_label = names
        #: Labels of workers that left (`forget_worker`), until one joins again.
        self._departed: set[str] = set()
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self._add_call_series(r)
        self._add_worker_series(r)
        self._add_admission_series(r)
        self._add_placement_series(r)
        self._latency_children: dict[tuple[str, str, str], Latencies] = {}
        self._count_children: dict[tuple[str, str, StatusCode, str], Count] = {}
        self._worker_children: dict[tuple[str, str], Latencies] = {}
        self._capability_labels: set[tuple[str, str]] = set()

    def _add_call_series(self, r: CollectorRegistry) -> None:
        """The series of the calls themselves, and the routing table's size."""
        # The three series every proxied call updates: lock-free children (`_hot_series`).
        self.requests = CounterFamily(
            "gateway_requests",
            "Count of gateway RPCs by method, model, gRPC status code and the door they "
            "came through (protocol: grpc or rest).",
            ["rpc", "model", "status", "protocol"],
            r,
        )
        self.request_latency = HistogramFamily(
            "gateway_request_latency_seconds",
            "Gateway-internal latency, by the door the call came through (protocol).",
            ["rpc", "model", "protocol"],
            r,
            LATENCY_BUCKETS,
        )
        self.worker_latency = HistogramFamily(
            "gateway_worker_latency_seconds",
            "Latency of calls from the gateway to each worker.",
            ["rpc", "worker"],
            r,
            LATENCY_BUCKETS,
        )
        self.routing_table_size = Gauge(
            "gateway_routing_table_size", "Models in the routing table.", registry=r
        )

    def _add_worker_series(self, r: CollectorRegistry) -> None:
        """Each worker's readiness, ejection, capabilities and metrics scrape."""
        self.worker_ready = Gauge(
            "gateway_worker_ready",
            "1 if the worker's last ServerReady probe said ready, else 0.",
            ["worker"],
            registry=r,
        )
        self.worker_ejected = Gauge(
            "gateway_worker_ejected",
            "1 while the worker is out of routing for not answering (a stall and a PING).",
            ["worker"],
            registry=r,
        )
        self.worker_ejections = Counter(
            "gateway_worker_ejections",
            "Times the worker was ejected from routing for not answering.",
            ["worker"],
            registry=r,
        )
        self.worker_capability = Gauge(
            "gateway_worker_capability",
            "1 if the worker implements this optional part of the API, 0 if it answered "
            "UNIMPLEMENTED (absent until learned).",
            ["worker", "capability"],
            registry=r,
        )
        self.worker_metrics_up = Gauge(
            "gateway_worker_metrics_up",
            "1 if the last scrape of the worker's metrics endpoint succeeded, else 0.",
            ["worker"],
            registry=r,
        )

    def _add_admission_series(self, r: CollectorRegistry) -> None:
        """What the inbound cap and deadline-aware admission refused."""
        self.shed = Counter(
            "gateway_requests_shed",
            "RPCs shed with RESOURCE_EXHAUSTED at the inbound cap, or refused at arrival "
            "as they would not finish in time.",
            registry=r,
        )
        self.spans_dropped = Counter(
            "gateway_trace_spans_dropped",
            "Spans the gateway made but did not export (tracing on): its export queue "
            "was full (queue_full) or the collector did not take them (export_failed).",
            ["reason"],
            registry=r,
        )
        refusals = Counter(
            "gateway_admission_refusals",
            "ModelInfer calls refused at arrival (also in gateway_requests_shed_total): "
            "predicted to wait over grpc.max_queue_seconds (queue), or to finish after "
            "their deadline (deadline).",
            ["reason"],
            registry=r,
        )
        #: By `rsgw.scheduling.calls._forecast` reason.
        self.refusals = {reason: refusals.labels(reason) for reason in (QUEUE, DEADLINE)}
        self.max_concurrent = Gauge(
            "gateway_max_concurrent_requests",
            "Configured inbound cap (per-worker cap x workers; 0 = uncapped).",
            registry=r,
        )

    def _add_placement_series(self, r: CollectorRegistry) -> None:
        """lpt_packing's failures and the loads and unloads of its placements."""
        self.repack_failures = Counter(
            "gateway_repack_failures",
            "lpt_packing failures: a tick that raised (placement kept), a worker's "
            "CompactMemory that failed after a repack, or a RepositoryModelLoad or "
            "Unload of a placement that failed. Always 0 in the other modes.",
            ["stage"],
            registry=r,
        )
        for stage in ("tick", "compaction", "load", "unload"):
            self.repack_failures.labels(stage)
        self.placement_actions = Counter(
            "gateway_placement_actions",
            "Models lpt_packing loaded on or unloaded from a worker to carry out a "
            "placement (workers placed through the repository extension).",
            ["action"],
            registry=r,
        )
        for action in ("load", "unload"):
            self.placement_actions.labels(action)
        self.residency_changes = Counter(
            "gateway_residency_changes",
            "Models loaded on or unloaded from a worker by the gateway, by why: demand "
            "(a call for a cold model), eviction (room made for one), repack (a "
            "placement), operator (a repack an operator asked for), startup (the "
            "first placement).",
            ["action", "reason"],
            registry=r,
        )
        for action in ("load", "unload"):
            for why in ("demand", "eviction", "repack", "operator", "startup"):
                self.residency_changes.labels(action, why)
        self.cold_starts = Counter(
            "gateway_cold_starts",
            "Calls that found their model loaded nowhere and waited for its load, by "
            "outcome: served, or refused (its deadline could not cover the load, or no "
            "worker could make room).",
            ["outcome"],
            registry=r,
        )
        for outcome in ("served", "refused"):
            self.cold_starts.labels(outcome)
        self.cold_start_wait = Histogram(
            "gateway_cold_start_wait_seconds",
            "How long calls for a cold model waited for its load (room made first).",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=r,
        )

    def track_residency(self, read: Callable[[], Mapping[str, tuple[int, int]]]) -> None:
        """Export each controlled worker's resident bytes of handed models against its
        budget, read at scrape time."""
        self.registry.register(ResidencySeries(read, self.worker_label))

    def track_inflight(self, read: Callable[[], int]) -> None:
        """Export `gateway_inflight_requests`, read at scrape time (cap enabled only)."""
        self.registry.register(
            ScalarGauge("gateway_inflight_requests", "In-flight RPCs (capped methods).", read)
        )

    def track_failovers(self, made: Callable[[], int], refused: Callable[[], int]) -> None:
        """Export `gateway_failovers_total` and `gateway_failovers_refused_total` (budget)."""
        self.registry.register(
            ScalarCounter("gateway_failovers", "ModelInfer calls sent on to another replica.", made)
        )
        self.registry.register(
            ScalarCounter(
                "gateway_failovers_refused",
                "Failovers not made because the retry budget was spent.",
                refused,
            )
        )

    def track_model_replicas(self, read: Callable[[], Mapping[str, int]]) -> None:
        """Export `gateway_model_ready_replicas{model}`, read at scrape time.

        Every model any worker has served since start, with the ready workers serving
        it now: 0 is the "no ready replica" an on-call pages on, where a model that
        simply vanished from the routing table would leave no series to alert on.
        """

        class _Replicas(Collector):
            def collect(self) -> Iterator[Metric]:
                yield by_model(
                    "gateway_model_ready_replicas",
                    "Ready, routable workers serving the model (0: none; calls fail).",
                    read(),
                )

        self.registry.register(_Replicas())

    def track_tenants(self, inflight: Callable[[], Mapping[str, int]]) -> CounterFamily:
        """Export `gateway_tenant_inflight_calls{tenant}`, read at scrape time, and return
        `gateway_tenant_calls_total{tenant,band,outcome}`, whose children the tenancy
        caches by (tenant label, band, outcome) as `observe` caches its own (issue 52).

        Tenant labels are bounded (`rsgw.scheduling.calls._quotas.TenantLabels`): a
        client making up names grows neither memory nor series.
        """

        class _Inflight(Collector):
            def collect(self) -> Iterator[Metric]:
                yield by_label(
                    "gateway_tenant_inflight_calls",
                    "ModelInfer calls each tenant holds now (admitted within its quota).",
                    "tenant",
                    inflight(),
                )

        self.registry.register(_Inflight())
        return CounterFamily(
            "gateway_tenant_calls",
            "ModelInfer calls by tenant, priority band (1 the highest) and outcome: "
            "admitted; refused_share, refused_band or refused_deadline at a full worker "
            "(its tenant's share taken, higher bands' places, its deadline); over_rate or "
            "over_concurrency (its tenant's quota).",
            ["tenant", "band", "outcome"],
            self.registry,
        )

    def track_inflight_work(
        self, basis: Callable[[], str], read: Callable[[], Mapping[str, float]]
    ) -> None:
        """Export `gateway_worker_inflight_work{worker,basis}`, read live at scrape time.

        The load the router compares when it picks a replica, so a routing decision
        can be explained afterwards; `basis` is read at the same time, since
        lpt_packing's work basis can change at runtime. Workers the scheduler no
        longer tracks are not emitted, rather than frozen at their last value.
        """
        self.registry.register(InflightWorkSeries(basis, read, self.worker_label))

    def track_forecast(self, estimates: Mapping[str, float], held: Callable[[str], int]) -> None:
        """Export `gateway_worker_forecast_seconds_per_call{worker}` and
        `gateway_worker_forecast_wait_seconds{worker}` (what a call sent there now is
        predicted to wait), read live at scrape time: why admission refuses."""
        self.registry.register(ForecastSeries(estimates, held, self.worker_label))

    def watch_coordination(
        self,
        view: Callable[[], CoordinationView],
        elections_won: Callable[[], int],
        publications: Callable[[], int],
    ) -> None:
        """Export coordination's series (`rsgw.gateway.placement._coordinator`), read at scrape
        time: `gateway_coordination_state{state}`, `_epoch`, `_members`,
        `_seconds_since_contact`, `_elections_won_total`, `_publications_total`."""
        self.registry.register(CoordinationSeries(view, elections_won, publications))

    def watch_uploads(self, budget: UploadBudget | None) -> None:
        """Export the upload budget's series (`rsgw.base._uploads`), read at scrape time:
        `gateway_unfinished_request_bytes{state}`, its `_limit`, and
        `gateway_large_requests_total{outcome}`. Nothing without a budget."""
        if budget is not None:
            self.registry.register(UploadSeries(budget))

    def track_packing(self, read: Callable[[], PackingView]) -> Counter:
        """Export lpt_packing's series (docs/original.md §6.1); returns the repack counter.

        Everything but the repack counter is read live at scrape time, so no gauge
        can be left stale by a code path that forgot to update it.
        """
        self.registry.register(PackingSeries(read, self.worker_label))
        repacks = Counter(
            "gateway_repacks",
            "lpt_packing repacks by trigger (startup, compute, operator).",
            ["trigger"],
            registry=self.registry,
        )
        for trigger in REPACK_TRIGGERS:
            repacks.labels(trigger)
        return repacks

    def observe(
        self,
        rpc: str,
        model: str,
        code: StatusCode,
        seconds: float | None,
        protocol: str = "grpc",
        exemplar: Exemplar | None = None,
    ) -> None:
        """Count one handled RPC; `seconds` None records no latency (rejected at parse).
        `exemplar` (a traced call's) goes with the latency into its bucket."""
        key = (rpc, model, code, protocol)
        counter = self._count_children.get(key)
        if counter is None:
            counter = self._count_children[key] = self.requests.labels(
                rpc, model, code.camel, protocol
            )
        counter.inc()
        if seconds is not None:
            triple = (rpc, model, protocol)
            latency = self._latency_children.get(triple)
            if latency is None:
                latency = self._latency_children[triple] = self.request_latency.labels(
                    rpc, model, protocol
                )
            if exemplar is None:
                latency.observe(seconds)
            else:
                latency.observe_exemplified(seconds, exemplar)

    def observer(self, rpc: str) -> Callable[[StatusCode, str, float | None, str], None]:
        """`observe` for one RPC, in the shape `rsgw.grpc._metering.metered` calls."""

        def observe(code: StatusCode, model: str, seconds: float | None, protocol: str) -> None:
            self.observe(rpc, model, code, seconds, protocol)

        return observe

    def traced_observer(
        self, rpc: str, trace: dict[str, str], clock: Callable[[], float]
    ) -> Callable[[StatusCode, str, float | None, str], None]:
        """`observer` for one traced call: its latency carries `trace` (the trace and
        span ids) as the bucket's exemplar, stamped with `clock`'s wall time, so a
        slow bucket on a dashboard leads to a trace that went into it."""

        def observe(code: StatusCode, model: str, seconds: float | None, protocol: str) -> None:
            exemplar = None if seconds is None else Exemplar(trace, seconds, clock())
            self.observe(rpc, model, code, seconds, protocol, exemplar)

        return observe

    def refused(self, path: bytes, code: StatusCode) -> None:
        """Count a call the listener refused before any handler ran.

        The rpc label is the method's name when it is one rsgw knows, else
        `_unknown_`: paths are client-chosen and must not grow the label set.
        """
        method = METHODS_BY_PATH.get(path)
        self.observe(method.rpc if method is not None else UNKNOWN_MODEL, "", code, None)

    def worker_joined(self, label: str) -> None:
        """A worker joined: its series exist from the next scrape, at 0."""
        self._departed.discard(label)
        self.worker_ejected.labels(label).set(0)
        self.worker_ejections.labels(label)

    def capabilities_learned(self, label: str, has: Iterable[str], lacks: Iterable[str]) -> None:
        """A worker's capabilities as last learned (`rsgw.scheduling.fleet._capabilities`)."""
        if label in self._departed:
            return
        for value, names in ((1, has), (0, lacks)):
            for name in names:
                self._capability_labels.add((label, name))
                self.worker_capability.labels(label, name).set(value)

    def metrics_scraped(self, label: str, up: bool) -> None:
        """Whether a worker's metrics endpoint answered the last scrape."""
        if label not in self._departed:  # not one that left during the scrape
            self.worker_metrics_up.labels(label).set(1 if up else 0)

    def forget_worker(self, label: str) -> None:
        """A worker left: its series go (none stays behind at its last value), and a
        call to it that ends later (a fan-out it was part of) records nothing."""
        self._departed.add(label)
        for family in (
            self.worker_ready,
            self.worker_ejected,
            self.worker_ejections,
            self.worker_metrics_up,
        ):
            with contextlib.suppress(KeyError):
                family.remove(label)
        for labels in [k for k in self._capability_labels if k[0] == label]:
            self._capability_labels.discard(labels)
            with contextlib.suppress(KeyError):
                self.worker_capability.remove(*labels)
        for key in [k for k in self._worker_children if self.worker_label(k[1]) == label]:
            del self._worker_children[key]
            with contextlib.suppress(KeyError):
                self.worker_latency.remove(key[0], label)

    def observe_worker(self, rpc: str, url: str, seconds: float) -> None:
        key = (rpc, url)
        child = self._worker_children.get(key)
        if child is None:
            label = self.worker_label(url)
            if label in self._departed:
                return
            child = self._worker_children[key] = self.worker_latency.labels(rpc, label)
        child.observe(seconds)

    def render(self) -> bytes:
        return render_registry(self.registry)
