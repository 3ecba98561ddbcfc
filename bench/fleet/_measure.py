"""What one run measured: counters before and after the window, and the figures from them.

The workers' Prometheus counters (docs/models.md) are read straight from each worker's
`/metrics` at the start and the end of the measured window, so the batch, weight and
compute figures cover exactly the window, with the fleet under load at both ends.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import _fleet
import _load

CLK_TCK = os.sysconf("SC_CLK_TCK")
# Worker counters summed over models (and gpu labels), per worker.
COUNTERS = {
    "worker_dispatch_total": "dispatches",
    "worker_rows_served_total": "rows",
    "worker_requests_served_total": "requests",
    "worker_compute_seconds_total": "compute_s",
    "worker_weight_loads_total": "loads",
    "worker_weight_evicts_total": "evicts",
    "worker_weight_load_seconds_total": "load_s",
    "worker_requests_shed_total": "shed",
}


MODEL_LABEL = re.compile(r'model="([^"]*)"')


def worker_counters(text: str) -> dict[str, float]:
    """Sum each counter of interest over its label sets, from Prometheus text; and
    `rows@MODEL` / `dispatches@MODEL` per model, for the rows-weighted batch depth."""
    sums = dict.fromkeys(COUNTERS.values(), 0.0)
    for line in text.splitlines():
        if not line.startswith("worker_"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = COUNTERS.get(name)
        if key is not None:
            value = float(line.rsplit(" ", 1)[1])
            sums[key] += value
            if key in ("rows", "dispatches"):
                model = MODEL_LABEL.search(line)
                if model:
                    per = f"{key}@{model[1]}"
                    sums[per] = sums.get(per, 0.0) + value
    return sums


def rows_weighted_depth(deltas: Sequence[dict[str, float]]) -> float:
    """The batch depth the average row saw: per (GPU, model) rows/dispatch, weighted by
    rows. Unlike rows / dispatches, a light GPU's many one-row dispatches do not drag
    it down, and a hot model's deep batches count for every row in them."""
    total = 0.0
    weighted = 0.0
    for delta in deltas:
        for key, rows in delta.items():
            if key.startswith("rows@") and rows > 0:
                dispatches = delta.get("dispatches@" + key[5:], 0.0)
                if dispatches > 0:
                    total += rows
                    weighted += rows * rows / dispatches
    return weighted / total if total else math.nan


PLACEMENT_LINE = re.compile(
    r'^gateway_placement_weight\{model="(?P<model>[^"]*)",worker="(?P<worker>[^"]*)"\} (?P<v>\S+)'
)


def placement(text: str) -> dict[str, list[str]]:
    """worker -> models placed on it, from the gateway's lpt_packing gauges."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = PLACEMENT_LINE.match(line)
        if match and float(match["v"]) > 0:
            found.setdefault(match["worker"], []).append(match["model"])
    return {w: sorted(ms) for w, ms in sorted(found.items())}


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu() -> tuple[float, float]:
    """CPU-seconds the whole machine spent busy (steal excluded) and stolen, so far."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[:8])
    busy = user + nice + system + irq + softirq
    return busy / CLK_TCK, steal / CLK_TCK


@dataclass
class Snapshot:
    """The fleet's counters and our processes' CPU at one instant."""

    workers: list[dict[str, float]]
    cpu: dict[str, float]
    machine: tuple[float, float]
    placement: dict[str, list[str]] | None  # lpt_packing's placement in force


def snapshot(fleet: _fleet.Fleet) -> Snapshot:
    """Read every worker's /metrics, and CPU time; runs in the load generator's thread pool."""
    counters = [
        worker_counters(_fleet.http_get(int(w.info["metrics_port"]), "/metrics"))
        for w in fleet.workers
    ]
    times = os.times()
    cpu = {
        "gateway": proc_cpu_seconds(fleet.gateway.pid),
        "workers": sum(proc_cpu_seconds(w.pid) for w in fleet.workers),
        "generator": times.user + times.system,
    }
    placed = None
    if fleet.mode == "lpt_packing":
        placed = placement(_fleet.http_get(fleet.admin_port, "/metrics"))
    return Snapshot(counters, cpu, machine_cpu(), placed)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (inf entries allowed)."""
    if not values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(values)))
    return values[rank - 1]


@dataclass
class RunResult:
    """The figures of one run (one scenario, mode, load and repetition)."""

    scenario: str
    mode: str
    load: float  # the fraction of the scenario's capacity offered
    rep: int
    seed: int
    slo_ms: float  # scaled: what the latencies are held to
    goodput_rps: float  # requests answered OK within the SLO, per second of the window
    shed_fraction: float  # RESOURCE_EXHAUSTED, of the requests sent in the window
    failed_fraction: float  # any other failure or no answer, of the same
    rows_weighted: float  # rows per dispatch, weighted by rows (see rows_weighted_depth)
    window_s: float
    sent: int  # requests scheduled inside the window
    ok: int
    errors: dict[str, int]
    offered_rps: float
    throughput_rps: float
    p50_ms: float  # failed requests count as slower than any answer (inf)
    p99_ms: float
    rows_per_dispatch: float
    dispatches: int
    loads: int
    evicts: int
    load_share: float  # of the fleet's device time spent loading weights
    worker_shed: int  # calls the workers refused (RESOURCE_EXHAUSTED at their own cap)
    compute_s: list[float]  # per GPU, in the window
    gpu_rows_per_dispatch: list[float]  # per GPU: a hot GPU's batches against a light one's
    gpu_requests: list[int]  # per GPU, served in the window
    compute_spread: float  # (max - min) / mean of compute_s
    lag_p99_ms: float
    lag_max_ms: float
    cpu: dict[str, float]  # CPUs (average over the window): ours by process, others, steal
    first_repack_s: float | None = None  # lpt_packing: seconds from the start of the load
    placement: dict[str, list[str]] | None = None  # lpt_packing: at the end of the window
    repacks_in_window: int | None = None
    ok_latencies_ms: list[float] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        """One JSON row: the issue's keys first (`rows_per_dispatch` is the rows-weighted
        depth; the plain mean is `rows_per_dispatch_mean`), then the context."""
        data = asdict(self)
        del data["ok_latencies_ms"]
        data["rows_per_dispatch_mean"] = data.pop("rows_per_dispatch")
        data["rows_per_dispatch"] = data.pop("rows_weighted")
        data["evictions"] = data.pop("evicts")
        for key, value in data.items():
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = None
        first = (
            "scenario", "mode", "load", "offered_rps", "goodput_rps", "slo_ms", "p50_ms",
            "p99_ms", "rows_per_dispatch", "shed_fraction", "failed_fraction", "evictions",
        )  # fmt: skip
        return {**{k: data[k] for k in first}, **data}


def summarise(
    run: tuple[str, str, float, int, int],
    slo_ms: float,
    outcome: _load.Outcome,
    warmup: float,
    window: float,
    repacks: Sequence[tuple[float, str]],
) -> RunResult:
    """Turn one run's requests and snapshots into its figures; `run` is (scenario, mode,
    load, repetition, seed)."""
    scenario, mode, load, rep, seed = run
    sched = outcome.schedule
    inside = [i for i, t in enumerate(sched.times) if warmup <= t < warmup + window]
    ok_lat = sorted(
        (outcome.done[i] - sched.times[i]) * 1000 for i in inside if outcome.codes[i] == _load.OK
    )
    ranked = ok_lat + [math.inf] * (len(inside) - len(ok_lat))
    errors: dict[str, int] = {}
    for i in inside:
        if outcome.codes[i] != _load.OK:
            errors[outcome.codes[i]] = errors.get(outcome.codes[i], 0) + 1
    lags = sorted(outcome.lag[i] * 1000 for i in inside if not math.isnan(outcome.lag[i]))

    start: Snapshot = outcome.marks["start"]
    end: Snapshot = outcome.marks["end"]
    span = outcome.mark_times["end"] - outcome.mark_times["start"]
    delta = [{k: b[k] - a[k] for k in a} for a, b in zip(start.workers, end.workers, strict=True)]
    dispatches = sum(d["dispatches"] for d in delta)
    rows = sum(d["rows"] for d in delta)
    compute = [d["compute_s"] for d in delta]
    mean_compute = sum(compute) / len(compute)
    ours = sum(end.cpu[k] - start.cpu[k] for k in end.cpu)
    busy = end.machine[0] - start.machine[0]
    cpu = {k: (end.cpu[k] - start.cpu[k]) / span for k in end.cpu}
    cpu["others"] = max(0.0, busy - ours) / span
    cpu["steal"] = (end.machine[1] - start.machine[1]) / span
    traffic = [t for t, trigger in repacks if trigger != "startup"]
    first = traffic[0] if traffic else None
    in_window = (
        sum(1 for t in traffic if warmup <= t < warmup + window) if mode == "lpt_packing" else None
    )
    sent = len(inside)
    shed = errors.get("RESOURCE_EXHAUSTED", 0)
    return RunResult(
        scenario=scenario,
        mode=mode,
        load=load,
        rep=rep,
        seed=seed,
        slo_ms=slo_ms,
        goodput_rps=sum(1 for lat in ok_lat if lat <= slo_ms) / window,
        shed_fraction=shed / sent if sent else math.nan,
        failed_fraction=(sent - len(ok_lat) - shed) / sent if sent else math.nan,
        rows_weighted=rows_weighted_depth(delta),
        window_s=window,
        sent=len(inside),
        ok=len(ok_lat),
        errors=errors,
        offered_rps=len(inside) / window,
        throughput_rps=len(ok_lat) / window,
        p50_ms=percentile(ranked, 50),
        p99_ms=percentile(ranked, 99),
        rows_per_dispatch=rows / dispatches if dispatches else math.nan,
        dispatches=int(dispatches),
        loads=int(sum(d["loads"] for d in delta)),
        evicts=int(sum(d["evicts"] for d in delta)),
        load_share=sum(d["load_s"] for d in delta) / (len(delta) * span),
        worker_shed=int(sum(d["shed"] for d in delta)),
        compute_s=compute,
        gpu_rows_per_dispatch=[
            d["rows"] / d["dispatches"] if d["dispatches"] else math.nan for d in delta
        ],
        gpu_requests=[int(d["requests"]) for d in delta],
        compute_spread=(max(compute) - min(compute)) / mean_compute if mean_compute else math.nan,
        lag_p99_ms=percentile(lags, 99),
        lag_max_ms=lags[-1] if lags else math.nan,
        cpu=cpu,
        first_repack_s=first,
        repacks_in_window=in_window,
        placement=end.placement,
        ok_latencies_ms=ok_lat,
    )
