"""What one run measured: counters before and after the window (the figures from them
are `rsgw.simulate._results.summarise`, shared with the simulator).

The workers' Prometheus counters (docs/models.md) are read straight from each worker's
`/metrics` at the start and the end of the measured window, so the batch, weight and
compute figures cover exactly the window, with the fleet under load at both ends.
"""

from __future__ import annotations

import math
import os
import re

import _fleet

from rsgw.simulate._results import RunResult, Snapshot, summarise

__all__ = ["RunResult", "Snapshot", "snapshot", "summarise"]

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


def snapshot(fleet: _fleet.Fleet) -> Snapshot:
    """Read every worker's /metrics, and CPU time; runs in the load generator's thread pool."""
    counters = [
        worker_counters(_fleet.http_get(int(w.info["metrics_port"]), "/metrics"))
        for w in fleet.workers
    ]
    times = os.times()
    cpu = {
        "gateway": sum(proc_cpu_seconds(g.pid) for g in fleet.gateways),
        "workers": sum(proc_cpu_seconds(w.pid) for w in fleet.workers),
        "generator": times.user + times.system,
    }
    placed = cold = None
    if fleet.mode in LPT_LABELS:
        text = _fleet.http_get(fleet.admin_port, "/metrics")
        placed = placement(text)
        cold = cold_starts(text)
    return Snapshot(counters, cpu, machine_cpu(), placed, cold)


#: The bench's names of runs under lpt_packing: with the LRU baseline's eviction too.
LPT_LABELS = frozenset({"lpt_packing", "lru_baseline"})


def cold_starts(text: str) -> float:
    """Calls that waited for a load (`gateway_cold_starts_total`, served or refused)."""
    prefix = "gateway_cold_starts_total{"
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )
