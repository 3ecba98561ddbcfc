"""What one run measured, the figures from it, and the tables: bench/fleet and `rsgw
simulate` alike.

A run is a schedule of calls (`_scenario.Schedule`), what became of each (`Outcome`),
and the workers' counters at the start and the end of the measured window
(`Snapshot`): read from their `/metrics` by bench/fleet, from the simulated devices by
`rsgw simulate`. `summarise` turns them into a `RunResult` the same way for both, so a
prediction and a measurement are compared figure by figure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

OK = "OK"
UNANSWERED = "UNANSWERED"  # still in flight when the drain gave up


@dataclass
class Schedule:
    """Arrival times (seconds from the start of the load), model indices (0-based) and,
    from a trace, each call's rows (None: one each) and sender (an index into the
    scenario's `traffic`; None: drawn by share)."""

    times: list[float]
    models: list[int]
    rows: list[int] | None = None
    tenants: list[int] | None = None


@dataclass
class Outcome:
    """Per request: when it was due, how late it left, when it ended, and how."""

    schedule: Schedule
    lag: list[float]
    done: list[float]  # seconds from the start of the load; nan when never answered
    codes: list[str]
    marks: dict[str, Any] = field(default_factory=dict)  # snapshots taken at the marks
    mark_times: dict[str, float] = field(default_factory=dict)
    started_wall: float = 0.0  # time.time() at the start of the load


@dataclass
class Snapshot:
    """The fleet's counters and our processes' CPU at one instant."""

    workers: list[dict[str, float]]
    cpu: dict[str, float]
    machine: tuple[float, float]
    placement: dict[str, list[str]] | None  # lpt_packing's placement in force
    #: The gateway's cold starts so far (issue 49: calls that waited for a load), when
    #: the run loads models on demand.
    cold_starts: float | None = None


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
    #: Calls that found their model loaded nowhere and waited for its load (issue 49).
    cold_starts: int | None = None
    #: Issue 52: per tenant and band, what became of its calls (`_tenants.tenant_rows`).
    tenants: list[dict[str, Any]] | None = None
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

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> RunResult:
        """A row `to_json` wrote (a recorded run, to report or plot again)."""
        data = dict(row)
        data["rows_weighted"] = data.pop("rows_per_dispatch")
        data["rows_per_dispatch"] = data.pop("rows_per_dispatch_mean")
        data["evicts"] = data.pop("evictions")
        for key in ("p50_ms", "p99_ms"):  # a failing percentile was written as null
            if data.get(key) is None:
                data[key] = math.inf
        names = {f.name for f in fields(cls)}
        known: dict[str, Any] = {
            k: math.nan if v is None else v for k, v in data.items() if k in names
        }
        return cls(**known)


def summarise(
    run: tuple[str, str, float, int, int],
    slo_ms: float,
    outcome: Outcome,
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
        (outcome.done[i] - sched.times[i]) * 1000 for i in inside if outcome.codes[i] == OK
    )
    ranked = ok_lat + [math.inf] * (len(inside) - len(ok_lat))
    errors: dict[str, int] = {}
    for i in inside:
        if outcome.codes[i] != OK:
            errors[outcome.codes[i]] = errors.get(outcome.codes[i], 0) + 1
    lags = sorted(outcome.lag[i] * 1000 for i in inside if not math.isnan(outcome.lag[i]))

    start: Snapshot = outcome.marks["start"]
    end: Snapshot = outcome.marks["end"]
    span = outcome.mark_times["end"] - outcome.mark_times["start"]
    delta = [
        {k: b[k] - a.get(k, 0.0) for k in b}
        for a, b in zip(start.workers, end.workers, strict=True)
    ]
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
        cold_starts=(
            int(end.cold_starts - start.cold_starts)
            if end.cold_starts is not None and start.cold_starts is not None
            else None
        ),
        ok_latencies_ms=ok_lat,
    )


# --------------------------------------------------------------------------- tables


def fmt(value: float) -> str:
    """Three significant figures, no exponent; inf means every such request failed."""
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "fail"
    if value == int(value) and abs(value) >= 1:
        return f"{int(value):,}"
    if value == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{digits}f}"


def cell(values: Sequence[float]) -> str:
    """median (min-max) over the runs; the bare value for one run."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt(values[0])
    ordered = sorted(values)
    return f"{fmt(statistics.median(ordered))} ({fmt(ordered[0])}-{fmt(ordered[-1])})"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, padded so it reads in a terminal too."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def label(mode: str) -> str:
    return "least_outstanding (compute)" if mode == "least_outstanding" else mode


def by_mode(runs: Sequence[RunResult], modes: Sequence[str]) -> list[tuple[str, list[RunResult]]]:
    return [(m, [r for r in runs if r.mode == m]) for m in modes if any(r.mode == m for r in runs)]


def by_load_and_mode(
    runs: Sequence[RunResult], modes: Sequence[str]
) -> list[tuple[str, list[RunResult]]]:
    """(row label, runs) per load (ascending) and mode."""
    rows = []
    for load in sorted({r.load for r in runs}):
        for mode, group in by_mode([r for r in runs if r.load == load], modes):
            rows.append((f"{load:.0%} {label(mode)}", group))
    return rows


def results_table(runs: Sequence[RunResult], modes: Sequence[str]) -> str:
    """The issue's figures, one row per load and mode."""
    columns: list[tuple[str, Callable[[RunResult], float]]] = [
        ("offered req/s", lambda r: r.offered_rps),
        ("SLO goodput req/s", lambda r: r.goodput_rps),
        ("achieved req/s", lambda r: r.throughput_rps),
        ("p50 ms", lambda r: r.p50_ms),
        ("p99 ms", lambda r: r.p99_ms),
        ("rows/dispatch (row-weighted)", lambda r: r.rows_weighted),
        ("rows/dispatch (mean)", lambda r: r.rows_per_dispatch),
        ("shed %", lambda r: 100 * r.shed_fraction),
        ("failed %", lambda r: 100 * r.failed_fraction),
        ("weight loads", lambda r: r.loads),
        ("evictions", lambda r: r.evicts),
        ("GPU compute s min", lambda r: min(r.compute_s)),
        ("GPU compute s max", lambda r: max(r.compute_s)),
        ("compute spread", lambda r: r.compute_spread),
    ]
    rows = [
        [name, *(cell([get(r) for r in group]) for _, get in columns)]
        for name, group in by_load_and_mode(runs, modes)
    ]
    return table(["load, mode", *(name for name, _ in columns)], rows)


def context_table(runs: Sequence[RunResult], modes: Sequence[str]) -> str:
    """What explains the figures, and whether the machine kept up."""
    columns: list[tuple[str, Callable[[RunResult], float]]] = [
        ("device time loading %", lambda r: 100 * r.load_share),
        ("dispatches", lambda r: r.dispatches),
        ("worker sheds", lambda r: r.worker_shed),
        ("sender lag p99 ms", lambda r: r.lag_p99_ms),
        ("gateway CPUs", lambda r: r.cpu["gateway"]),
        ("workers CPUs", lambda r: r.cpu["workers"]),
        ("generator CPUs", lambda r: r.cpu["generator"]),
        ("others CPUs", lambda r: r.cpu["others"]),
        ("steal CPUs", lambda r: r.cpu["steal"]),
    ]
    rows = [
        [name, *(cell([get(r) for r in group]) for _, get in columns)]
        for name, group in by_load_and_mode(runs, modes)
    ]
    return table(["load, mode", *(name for name, _ in columns)], rows)


def errors_line(runs: Sequence[RunResult], modes: Sequence[str]) -> str:
    parts = []
    for mode, group in by_mode(runs, modes):
        codes: dict[str, int] = {}
        for r in group:
            for code, n in r.errors.items():
                codes[code] = codes.get(code, 0) + n
        sent = sum(r.sent for r in group)
        text = ", ".join(f"{c} {n:,}" for c, n in sorted(codes.items())) or "none"
        parts.append(f"{label(mode)}: {text} (of {sent:,} sent)")
    return "failed requests by status, all runs: " + "; ".join(parts)


def describe_run(r: RunResult, took: float) -> str:
    """One line per run, printed as it finishes."""
    gpu = "/".join(f"{c:.0f}" for c in r.compute_s)
    rows = "/".join(f"{x:.1f}" for x in r.gpu_rows_per_dispatch)
    served = "/".join(str(n) for n in r.gpu_requests)
    repack = ""
    if r.mode == "lpt_packing":
        first = "none" if r.first_repack_s is None else f"{r.first_repack_s:.1f}s"
        placed = " ".join(f"{w}:{','.join(ms)}" for w, ms in (r.placement or {}).items())
        repack = f"  first repack {first}, {r.repacks_in_window} in window; placement {placed}"
    return (
        f"{r.load:4.0%} rep {r.rep} {label(r.mode):<27} goodput {r.goodput_rps:6.1f} "
        f"{r.throughput_rps:6.1f}/{r.offered_rps:5.1f} req/s  "
        f"p50 {fmt(r.p50_ms):>6} p99 {fmt(r.p99_ms):>6} ms  rows/dispatch "
        f"{r.rows_weighted:5.2f} weighted, {r.rows_per_dispatch:5.2f} mean (per GPU {rows}; "
        f"served {served})  loads {r.loads} "
        f"evicts {r.evicts}  compute s {gpu}  "
        f"failed {r.sent - r.ok}  lag p99 {r.lag_p99_ms:.1f} ms{repack}  ({took:.0f}s)"
    )


def cold_per_1k(r: RunResult) -> float:
    """Calls that waited for a load or were refused for one, per 1,000 sent."""
    return 1000 * (r.cold_starts or 0) / r.sent if r.sent else math.nan


def cold_table(runs: Sequence[RunResult], modes: Sequence[str]) -> str:
    """Issue 49's figures per load and mode (bench/fleet's cold-start table): cold starts
    per 1,000 calls, weight loads per minute, SLO goodput, p99 and failed calls; then,
    per load, rsgw's residency by value against the LRU baseline."""
    columns: list[tuple[str, Callable[[RunResult], float]]] = [
        ("cold/1k calls", cold_per_1k),
        ("loads/min", lambda r: 60 * r.loads / r.window_s),
        ("SLO goodput req/s", lambda r: r.goodput_rps),
        ("p99 ms", lambda r: r.p99_ms),
        ("failed", lambda r: r.sent - r.ok),
    ]
    rows = [
        [name, *(cell([get(r) for r in group]) for _, get in columns)]
        for name, group in by_load_and_mode(runs, modes)
    ]
    lines = [table(["load, mode", *(name for name, _ in columns)], rows)]
    for load in sorted({r.load for r in runs}):
        medians = {
            mode: [statistics.median(get(r) for r in group) for _, get in columns]
            for mode, group in by_mode([r for r in runs if r.load == load], modes)
        }
        ours, theirs = medians.get("lpt_packing"), medians.get("lru_baseline")
        if ours and theirs:
            fewer = 1 - ours[0] / theirs[0] if theirs[0] else math.nan
            lines.append(
                f"{load:.0%}: lpt_packing has {fewer:.0%} fewer cold starts per 1,000 calls "
                f"than the LRU baseline; goodput x{_ratio(ours[2], theirs[2])}, loads/min "
                f"x{_ratio(ours[1], theirs[1])}"
            )
    return "\n".join(lines)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"
