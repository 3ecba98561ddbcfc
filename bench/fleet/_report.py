"""The tables (median and min-max per load and mode over the runs) and the sweep plot."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _measure import RunResult


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


def plot_sweep(runs: Sequence[RunResult], modes: Sequence[str], path: Path, title: str) -> None:
    """SLO goodput and p99 against offered load, one line per mode (medians over runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (good, tail) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    colors = {"round_robin": "C0", "least_outstanding": "C1", "lpt_packing": "C2"}
    ceiling = 0.0
    for mode, group in by_mode(runs, modes):
        loads = sorted({r.load for r in group})
        goodput = [statistics.median(r.goodput_rps for r in group if r.load == x) for x in loads]
        p99 = [statistics.median(r.p99_ms for r in group if r.load == x) for x in loads]
        color = colors.get(mode)
        good.plot([100 * x for x in loads], goodput, marker="o", color=color, label=label(mode))
        shown = [(100 * x, y) for x, y in zip(loads, p99, strict=True) if math.isfinite(y)]
        if shown:
            tail.plot(*zip(*shown, strict=True), marker="o", color=color, label=label(mode))
            ceiling = max(ceiling, max(y for _, y in shown))
        failing = [100 * x for x, y in zip(loads, p99, strict=True) if not math.isfinite(y)]
        if failing:  # more than 1% failed: drawn as x at the top of the panel
            tail.plot(
                [], [], marker="x", linestyle="", color=color, label=f"{label(mode)}: >1% failed"
            )
            for x in failing:
                tail.annotate(
                    "x",
                    (x, 1.0),
                    xycoords=("data", "axes fraction"),
                    color=color,
                    ha="center",
                    va="top",
                    fontsize=12,
                )
    slo = runs[0].slo_ms if runs else math.nan
    good.set_xlabel("offered load, % of capacity")
    good.set_ylabel(f"SLO goodput, req/s answered within {fmt(slo)} ms")
    tail.set_xlabel("offered load, % of capacity")
    tail.set_ylabel("p99 latency, ms (failures count as slowest)")
    tail.set_yscale("log")
    tail.axhline(slo, color="grey", linewidth=0.8, linestyle="--", label="SLO")
    for ax in (good, tail):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
