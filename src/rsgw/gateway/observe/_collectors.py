"""The gateway's series read at scrape time: collectors over live state.

What `GatewayMetrics` (`rsgw.gateway.observe._metrics`) registers for state that is not
counted call by call: work in flight per worker, the admission forecast, coordination,
the upload budget, lpt_packing's placement (`PackingView`), and scalars read from a
callable. Each reads its source when Prometheus scrapes, so nothing on the request
path writes to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rsgw.base._uploads import UploadBudget
from rsgw.coordination._records import CoordinationView


@dataclass(frozen=True, slots=True)
class PackingView:
    """lpt_packing's state as its metrics show it, built at scrape time.

    Models and (model, worker URL) pairs that were placed once and are not any more
    are listed with 0, so their gauges fall to zero instead of freezing.
    """

    replicas: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    placement_weight: Mapping[tuple[str, str], float] = field(
        default_factory=lambda: MappingProxyType({})
    )
    outstanding: Mapping[tuple[str, str], int] = field(default_factory=lambda: MappingProxyType({}))
    routed: Mapping[tuple[str, str], int] = field(default_factory=lambda: MappingProxyType({}))
    fill_quantum: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    utilization: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


class InflightWorkSeries(Collector):
    def __init__(
        self,
        basis: Callable[[], str],
        read: Callable[[], Mapping[str, float]],
        label: Callable[[str], str],
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
        basis = self._basis()
        for worker, value in loads:
            family.add_metric([worker, basis], value)
        yield family


class ForecastSeries(Collector):
    def __init__(
        self,
        estimates: Mapping[str, float],
        held: Callable[[str], int],
        label: Callable[[str], str],
    ) -> None:
        self._estimates = estimates
        self._held = held
        self._label = label

    def collect(self) -> Iterator[Metric]:
        rows = sorted(
            (self._label(url), value, value * self._held(url))
            for url, value in list(self._estimates.items())
        )
        if not rows:
            return
        per_call = GaugeMetricFamily(
            "gateway_worker_forecast_seconds_per_call",
            "Seconds each call a worker holds costs a newcomer (deadline-aware admission's "
            "forecast, from its busy time and answers).",
            labels=["worker"],
        )
        wait = GaugeMetricFamily(
            "gateway_worker_forecast_wait_seconds",
            "The wait a call sent to the worker now is predicted (calls held x seconds per "
            "call); over grpc.max_queue_seconds, calls are refused.",
            labels=["worker"],
        )
        for worker, value, waiting in rows:
            per_call.add_metric([worker], value)
            wait.add_metric([worker], waiting)
        yield per_call
        yield wait


class CoordinationSeries(Collector):
    def __init__(
        self,
        view: Callable[[], CoordinationView],
        elections_won: Callable[[], int],
        publications: Callable[[], int],
    ) -> None:
        self._view = view
        self._elections_won = elections_won
        self._publications = publications

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        state = GaugeMetricFamily(
            "gateway_coordination_state",
            "1 for how this gateway stands among the coordinating gateways: placer (it "
            "places for all), follower (it routes by the placer's placement) or "
            "disconnected (etcd unreachable: the last placement, no repacks).",
            labels=["state"],
        )
        for name in ("placer", "follower", "disconnected"):
            state.add_metric([name], 1.0 if view.state == name else 0.0)
        yield state
        yield GaugeMetricFamily(
            "gateway_coordination_epoch",
            "The placement in force: its etcd revision (the same on every gateway).",
            value=view.epoch,
        )
        yield GaugeMetricFamily(
            "gateway_coordination_members", "Gateways registered in etcd.", value=len(view.members)
        )
        since = trio.current_time() - view.last_contact if view.last_contact else 0.0
        yield GaugeMetricFamily(
            "gateway_coordination_seconds_since_contact",
            "Seconds since etcd last answered this gateway.",
            value=since,
        )
        yield CounterMetricFamily(
            "gateway_coordination_elections_won",
            "Times this gateway became the placer.",
            value=self._elections_won(),
        )
        yield CounterMetricFamily(
            "gateway_coordination_publications",
            "Placements this gateway published as the placer.",
            value=self._publications(),
        )


class UploadSeries(Collector):
    def __init__(self, budget: UploadBudget) -> None:
        self._budget = budget

    def collect(self) -> Iterator[Metric]:
        budget = self._budget
        held = GaugeMetricFamily(
            "gateway_unfinished_request_bytes",
            "Bytes of request messages not yet whole: granted (their declared sizes, "
            "arriving) and waiting (at most a stream window each, held back by flow "
            "control until granted).",
            labels=["state"],
        )
        held.add_metric(["granted"], budget.granted)
        held.add_metric(["waiting"], budget.waiting)
        yield held
        yield GaugeMetricFamily(
            "gateway_unfinished_request_bytes_limit",
            "connections.max_buffered_bytes_total: the granted bytes the gateway holds at "
            "once (one larger message alone), and again the waiting ones.",
            value=budget.limit,
        )
        outcomes = CounterMetricFamily(
            "gateway_large_requests",
            "Request messages that did not arrive in one read, by how the upload budget "
            "took them: granted at once, after waiting, or refused (RESOURCE_EXHAUSTED).",
            labels=["outcome"],
        )
        outcomes.add_metric(["at_once"], budget.granted_at_once)
        outcomes.add_metric(["after_wait"], budget.granted_after_wait)
        outcomes.add_metric(["refused"], budget.refused)
        yield outcomes


class PackingSeries(Collector):
    def __init__(self, read: Callable[[], PackingView], label: Callable[[str], str]) -> None:
        self._read = read
        self._label = label

    def collect(self) -> Iterator[Metric]:
        view = self._read()
        yield by_model(
            "gateway_model_replicas",
            "Replicas in the model's placement (0 once unplaced).",
            view.replicas,
        )
        yield self._by_replica(
            GaugeMetricFamily,
            "gateway_placement_weight",
            "Placement weight of the replica (1/k; 0 once unplaced).",
            view.placement_weight,
        )
        yield self._by_replica(
            GaugeMetricFamily,
            "gateway_replica_outstanding",
            "In-flight items routed to the replica.",
            view.outstanding,
        )
        if view.routed:  # no family while nothing was routed (docs/original.md §6.1)
            yield self._by_replica(
                CounterMetricFamily,
                "gateway_replica_routed",
                "Requests routed to the replica since it was placed.",
                view.routed,
            )
        yield by_model(
            "gateway_model_fill_quantum", "The model's fill quantum, in items.", view.fill_quantum
        )
        yield by_model(
            "gateway_model_utilization",
            "Arrival rate x cost per request at the last repack (GPU-seconds per second).",
            view.utilization,
        )

    def _by_replica(
        self,
        kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
        name: str,
        doc: str,
        values: Mapping[tuple[str, str], float] | Mapping[tuple[str, str], int],
    ) -> Metric:
        family = kind(name, doc, labels=["model", "worker"])
        for (model, worker), value in sorted(
            ((m, self._label(url)), v) for (m, url), v in values.items()
        ):
            family.add_metric([model, worker], value)
        return family


def by_model(
    name: str, doc: str, values: Mapping[str, float] | Mapping[str, int]
) -> GaugeMetricFamily:
    return by_label(name, doc, "model", values)


def by_label(
    name: str, doc: str, label: str, values: Mapping[str, float] | Mapping[str, int]
) -> GaugeMetricFamily:
    """A gauge of one label, a sample per key of `values`, in key order."""
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class ScalarGauge(Collector):
    def __init__(self, name: str, doc: str, read: Callable[[], int]) -> None:
        self._name = name
        self._doc = doc
        self._read = read

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self._name, self._doc, value=self._read())


class ScalarCounter(ScalarGauge):
    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self._name, self._doc, value=self._read())


class ResidencySeries(Collector):
    """`gateway_worker_resident_bytes` and `gateway_worker_budget_bytes` (issue 49)."""

    def __init__(
        self, read: Callable[[], Mapping[str, tuple[int, int]]], label: Callable[[str], str]
    ) -> None:
        self._read = read
        self._label = label

    def collect(self) -> Iterator[Metric]:
        resident = GaugeMetricFamily(
            "gateway_worker_resident_bytes",
            "Bytes of handed models the worker holds (loading and unloading included), "
            "as the gateway counts them against its budget.",
            labels=["worker"],
        )
        budget = GaugeMetricFamily(
            "gateway_worker_budget_bytes",
            "The worker's budget for handed models' weights (0: unbounded).",
            labels=["worker"],
        )
        for url, (used, limit) in sorted(self._read().items()):
            resident.add_metric([self._label(url)], used)
            budget.add_metric([self._label(url)], limit)
        yield resident
        yield budget
