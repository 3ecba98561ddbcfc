"""A fleet over a day (or any span), round by round, with the gateway's own packer.

Where `_engine` follows every call, this follows every prober round: each round the
scenario's demand (its popularity, and its phases, at that time of the span; the load
following a daily curve) is split over the GPUs as the mode routes it, each GPU serves
its share as a fluid (`_fluid.FluidDevice`: the worker's cost model and weight cache in
closed form), and under lpt_packing the gateway's `Packer` takes the round's poll
(`summarize_poll` of the workers' counters, every catalogue model as a worker reports
them) and the round's arrivals, and repacks when its compute trigger fires, exactly as
the prober shell drives it. A round costs microseconds per (GPU, model) pair rather
than per call, so a day of a 64-GPU fleet takes minutes.

Routing per mode, in aggregate: round_robin and least_outstanding spread each model's
calls evenly over the workers that serve it (every worker here: on identical GPUs with
identical traffic, least outstanding work balances to the same split), so the fleet is
one GPU computed once and counted N times; lpt_packing splits each model's calls evenly
over its placed replicas (the fill router's runs rotate through them) and a worker
holds at most the admission cap, the rest shed, as its request path does.

No trio, no sockets, no clock; deterministic (the demand is its expected value). A
shell module only in that it drives `_engine`'s gateway configuration and reads scenarios.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from rsgw.config._config import parse_config
from rsgw.scheduling.calls._meta import ModelCounters, WorkerCounters
from rsgw.scheduling.placement._packer import Packer
from rsgw.scheduling.placement._reports import PollSummary, summarize_poll
from rsgw.simulate import _offered
from rsgw.simulate import _scenario as sc
from rsgw.simulate._engine import gateway_yaml, packer_knobs
from rsgw.simulate._fluid import FluidDevice, LatencyHistogram, RoundFigures
from rsgw.simulate._results import fmt, label, table
from rsgw.worker.models._catalogue import parse_catalogue

DAY_S = 86_400.0


@dataclass(frozen=True)
class Profile:
    """The offered load over the span, as a fraction of the scenario's capacity: a
    daily curve from `trough` to `peak` (at `peak_at`, a fraction of the span), or a
    constant when both are equal."""

    seconds: float = DAY_S
    trough: float = 0.25
    peak: float = 0.9
    peak_at: float = 15 / 24

    @property
    def trough_at(self) -> float:
        """Seconds into the span of the lowest load."""
        return ((self.peak_at + 0.5) % 1.0) * self.seconds

    def load_at(self, t: float) -> float:
        swing = (1 + math.cos(2 * math.pi * (t / self.seconds - self.peak_at))) / 2
        return self.trough + (self.peak - self.trough) * swing


def day_settings(step_s: float, workers: int) -> sc.RunSettings:
    """A fleet's repack settings, polled every `step_s`. The gateway's defaults (a
    first repack after 60 GPU-seconds, then every 300) suit a 4-GPU node; 64 GPUs
    spend 300 GPU-seconds in seconds, so the budget grows with the fleet: the first
    after 15 GPU-seconds per GPU, then every 300 per GPU (5 to 20 minutes of a day)."""
    return sc.RunSettings(
        warmup_s=0.0,
        measure_s=DAY_S,
        health_interval_s=step_s,
        first_repack_compute_s=15.0 * workers,
        repack_compute_s=300.0 * workers,
    )


@dataclass
class FluidRun:
    """A mode's span: totals, per-bucket figures, latencies and the packer's churn."""

    scenario: str
    mode: str
    gpus: int
    models: int
    profile: Profile
    step_s: float
    slo_ms: float
    totals: RoundFigures = field(default_factory=RoundFigures)
    buckets: list[RoundFigures] = field(default_factory=list)
    latencies: LatencyHistogram = field(default_factory=LatencyHistogram)
    repacks: list[tuple[float, str, int]] = field(default_factory=list)  # (t, trigger, moved)
    window_s: float = DAY_S  # the span after the warm-up: what the totals cover
    wall_s: float = 0.0  # set by the caller, which has a clock

    @property
    def goodput_share(self) -> float:
        return self.totals.good / self.totals.arrived if self.totals.arrived else math.nan

    @property
    def goodput_rps(self) -> float:
        return self.totals.good / self.window_s

    @property
    def depth(self) -> float:
        """Rows per dispatch, weighted by rows (as bench/fleet's `rows_per_dispatch`)."""
        return self.totals.depth_rows / self.totals.served if self.totals.served else math.nan

    def to_json(self) -> dict[str, Any]:
        t = self.totals
        return {
            "scenario": self.scenario,
            "mode": self.mode,
            "simulated": True,
            "engine": "fluid",
            "gpus": self.gpus,
            "models": self.models,
            "seconds": self.profile.seconds,
            "load_trough": self.profile.trough,
            "load_peak": self.profile.peak,
            "step_s": self.step_s,
            "slo_ms": self.slo_ms,
            "offered": t.arrived,
            "goodput_rps": self.goodput_rps,
            "goodput_share": self.goodput_share,
            "p50_ms": 1000 * self.latencies.quantile(0.5),
            "p99_ms": 1000 * self.latencies.quantile(0.99),
            "rows_per_dispatch": self.depth,
            "shed_fraction": t.shed / t.arrived if t.arrived else 0.0,
            "failed_fraction": t.late / t.arrived if t.arrived else 0.0,
            "weight_loads": round(t.loads),
            "evictions": round(t.evicts),
            "repacks": len(self.repacks),
            "models_moved": sum(moved for _, _, moved in self.repacks),
            "wall_s": self.wall_s,
            "buckets": [
                {
                    "offered": b.arrived,
                    "good": b.good,
                    "loads": round(b.loads),
                    "evictions": round(b.evicts),
                    "shed": b.shed,
                    "late": b.late,
                }
                for b in self.buckets
            ],
        }


class _Poller:
    """The workers' ModelControlStatus answers, as the prober reads them every round.

    A worker reports every catalogue model; the counters objects of models that served
    nothing since the last round are reused, since a 64-worker, 1,000-model poll is
    64,000 entries a round.
    """

    def __init__(self, devices: Mapping[str, FluidDevice]) -> None:
        self.devices = devices
        self.cache: dict[tuple[str, str], tuple[float, ModelCounters]] = {}

    def poll(self) -> dict[str, WorkerCounters]:
        answers = {}
        for url, device in self.devices.items():
            models = {}
            for model, (compute, requests, rows) in device.per_model.items():
                key = (url, model)
                seen = self.cache.get(key)
                if seen is None or seen[0] != compute:
                    spec = device.specs[model]
                    counters = ModelCounters(
                        total_compute_seconds=compute,
                        requests_served=int(requests),
                        rows_served=int(rows),
                        max_batch_size=spec.max_batch_size,
                        batch_input_name="INPUT0",
                        batch_axis=1,
                        weight_nbytes=spec.weight_bytes,
                    )
                    seen = self.cache[key] = (compute, counters)
                models[model] = seen[1]
            answers[url] = WorkerCounters(models, device.weight_cache_bytes, device.discipline)
        return answers


def run_fluid(
    scenario: sc.Scenario,
    mode: str,
    load: _offered.Load,
    profile: Profile,
    settings: sc.RunSettings,
    *,
    time_scale: float = 1.0,
    buckets: int = 24,
    admission_cap: int | None = None,
) -> FluidRun:
    """One mode over `profile.seconds` of the scenario, a prober round
    (`settings.health_interval_s`) at a time; the figures count from
    `settings.warmup_s` on. `time_scale` stretches every cost, the SLO and the
    deadline, and divides the rate, as bench/fleet's runs do (1 for a real fleet).
    """
    step_s = settings.health_interval_s
    catalogue = parse_catalogue(yaml.safe_load(scenario.catalogue_yaml()), source=scenario.name)
    specs = {m.name: m for m in catalogue.models}
    urls = [f"10.0.{k // 250}.{k % 250 + 1}:8001" for k in range(scenario.workers)]
    config = parse_config(gateway_yaml(mode, urls, settings, admission_cap), {})
    cap = float(config.grpc.max_concurrent_requests_per_worker)
    slo_s = scenario.slo_ms * time_scale / 1000
    deadline_s = settings.deadline(scenario, time_scale)
    spread = mode != "lpt_packing"
    # Spread modes: identical GPUs get identical traffic, so one is computed for all.
    devices = {
        url: FluidDevice(
            url, specs, scenario.budget_bytes, time_scale, discipline=scenario.discipline
        )
        for url in (urls[:1] if spread else urls)
    }
    run = FluidRun(
        scenario.name,
        mode,
        scenario.workers,
        scenario.count,
        profile,
        step_s,
        scenario.slo_ms * time_scale,
        buckets=[RoundFigures() for _ in range(buckets)],
    )
    packer = None if spread else Packer(scenario.names)
    knobs = packer_knobs(config.scheduling)
    poller = _Poller(devices)
    if packer is not None:
        report = packer.repack(summarize_poll(poller.poll()), knobs, 0.0, "startup")
        run.repacks.append((0.0, "startup", report.moved))
    names = scenario.names
    owed = dict.fromkeys(names, 0.0)  # arrivals not yet counted whole by the packer
    rounds = max(1, round(profile.seconds / step_s))
    for k in range(rounds):
        now = k * step_s
        rate = profile.load_at(now + step_s / 2) * load.capacity / time_scale
        shares = scenario.shares_at(now / profile.seconds)
        calls = {m: rate * s * step_s for m, s in zip(names, shares, strict=True) if s > 0}
        routed: dict[str, dict[str, float]] = {url: {} for url in devices}
        if packer is None:
            routed[urls[0]] = {m: c / scenario.workers for m, c in calls.items()}
        else:
            assignment = packer.assignment
            for model, c in calls.items():
                placement = assignment.get(model)
                where = placement.urls if placement is not None else urls
                for url in where:
                    routed[url][model] = c / len(where)
                owed[model] += c
                whole = int(owed[model])
                if whole:
                    packer.record_arrival(model, whole)
                    owed[model] -= whole
        window = profile.seconds - settings.warmup_s
        at = (now - settings.warmup_s) / window
        bucket = run.buckets[min(buckets - 1, int(at * buckets))] if at >= 0 else RoundFigures()
        times = float(scenario.workers) if spread else 1.0
        for url, device in devices.items():
            figures = device.step(
                routed[url], now, step_s, slo_s, deadline_s, cap, not spread, run.latencies
            )
            bucket.add(figures, times)  # (spread: one GPU's latencies stand for all)
        if packer is not None:
            fleet = sum(d.compute_s for d in devices.values())
            if packer.repack_due(fleet, knobs):
                poll = summarize_poll(poller.poll())
            else:  # no repack this round: the packer reads only the fleet's compute
                poll = PollSummary(polled=tuple(urls), fleet_compute=fleet)
            outcome = packer.tick(poll, knobs, urls, now + step_s)
            if outcome.repack is not None:
                run.repacks.append((now + step_s, outcome.repack.trigger, outcome.repack.moved))
    run.window_s = profile.seconds - settings.warmup_s
    for b in run.buckets:
        run.totals.add(b)
    return run


def day_table(runs: Sequence[FluidRun]) -> str:
    """Per mode: the span's goodput, latency, batching and churn."""
    header = [
        "mode",
        "offered calls",
        "within SLO %",
        "SLO goodput req/s",
        "p50 ms",
        "p99 ms",
        "rows/dispatch",
        "shed %",
        "failed %",
        "weight loads",
        "evictions",
        "repacks",
        "models moved",
        "wall s",
    ]
    rows = []
    for r in runs:
        t = r.totals
        arrived = t.arrived or 1.0
        rows.append(
            [
                label(r.mode),
                f"{t.arrived:,.0f}",
                fmt(100 * r.goodput_share),
                fmt(r.goodput_rps),
                fmt(1000 * r.latencies.quantile(0.5)),
                fmt(1000 * r.latencies.quantile(0.99)),
                fmt(r.depth),
                fmt(100 * t.shed / arrived),
                fmt(100 * t.late / arrived),
                f"{t.loads:,.0f}",
                f"{t.evicts:,.0f}",
                str(len(r.repacks)),
                str(sum(moved for _, _, moved in r.repacks)),
                f"{r.wall_s:.0f}",
            ]
        )
    return table(header, rows)


def bucket_table(runs: Sequence[FluidRun]) -> str:
    """Per bucket (an hour of a day): the offered load and each mode's share within the
    SLO and weight loads, so the peak and the churn around a shift show."""
    if not runs:
        return ""
    span = runs[0].window_s / len(runs[0].buckets)
    header = ["from", "offered req/s"]
    for r in runs:
        header += [f"{label(r.mode)} within SLO %", f"{label(r.mode)} loads"]
    rows = []
    for i, first in enumerate(runs[0].buckets):
        cells = [clock(i * span) if span * len(runs[0].buckets) == DAY_S else f"{i * span:,.0f} s"]
        cells.append(fmt(first.arrived / span))
        for r in runs:
            b = r.buckets[i]
            cells += [fmt(100 * b.good / b.arrived) if b.arrived else "-", f"{b.loads:,.0f}"]
        rows.append(cells)
    return table(header, rows)


def clock(t: float) -> str:
    """Seconds into a day as HH:MM."""
    return f"{int(t // 3600):02d}:{int(t % 3600 // 60):02d}"
