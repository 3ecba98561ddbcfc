"""The sweep plot; the tables are `rsgw.simulate._results`' (shared with the simulator)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from rsgw.simulate._results import (
    RunResult,
    by_mode,
    context_table,
    describe_run,
    errors_line,
    fmt,
    label,
    results_table,
)

__all__ = [
    "cold_table",
    "context_table",
    "describe_run",
    "errors_line",
    "plot_sweep",
    "results_table",
]


def _spread(values: Sequence[float]) -> str:
    """median (min-max)."""
    finite = [v for v in values if math.isfinite(v)] or [math.nan]
    return f"{fmt(statistics.median(values))} ({fmt(min(finite))}-{fmt(max(finite))})"


def cold_table(runs: Sequence[RunResult], modes: Sequence[str]) -> str:
    """Issue 49's figures per load and mode: cold starts per 1,000 calls, weight loads
    per minute, SLO goodput and p99; then each figure of the LRU baseline over rsgw's."""
    header = ("load", "mode", "cold/1k calls", "loads/min", "goodput rps", "p99 ms")
    rows = [header]
    medians: dict[tuple[float, str], tuple[float, ...]] = {}
    for load in sorted({r.load for r in runs}):
        for mode, group in by_mode([r for r in runs if r.load == load], modes):
            cold = [1000 * (r.cold_starts or 0) / r.sent if r.sent else math.nan for r in group]
            loads = [60 * r.loads / r.window_s for r in group]
            good = [r.goodput_rps for r in group]
            p99 = [r.p99_ms for r in group]
            medians[(load, mode)] = tuple(statistics.median(v) for v in (cold, loads, good, p99))
            rows.append(
                (f"{load:.0%}", mode, _spread(cold), _spread(loads), _spread(good), _spread(p99))
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    for load in sorted({r.load for r in runs}):
        ours, theirs = medians.get((load, "lpt_packing")), medians.get((load, "lru_baseline"))
        if ours and theirs:
            fewer = 1 - ours[0] / theirs[0] if theirs[0] else math.nan
            lines.append(
                f"{load:.0%}: lpt_packing has {fewer:.0%} fewer cold starts per 1,000 calls than "
                f"the LRU baseline; goodput x{ours[2] / theirs[2] if theirs[2] else math.nan:.2f}, "
                f"p99 x{ours[3] / theirs[3] if theirs[3] else math.nan:.2f}, loads/min "
                f"x{ours[1] / theirs[1] if theirs[1] else math.nan:.2f}"
            )
    return "\n".join(lines)


def plot_sweep(runs: Sequence[RunResult], modes: Sequence[str], path: Path, title: str) -> None:
    """SLO goodput and p99 against offered load, one line per mode (medians over runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (good, tail) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110, layout="constrained")
    colors = {
        "round_robin": "C0",
        "least_outstanding": "C1",
        "lpt_packing": "C2",
        "lru_baseline": "C3",
    }
    ceiling = 0.0
    for index, (mode, group) in enumerate(by_mode(runs, modes)):
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
        if failing:  # more than 1% failed: an x near the top, one row per mode
            tail.plot(
                [], [], marker="x", linestyle="", color=color, label=f"{label(mode)}: >1% failed"
            )
            for x in failing:
                tail.annotate(
                    "x",
                    (x, 1.0 - 0.06 * index),
                    xycoords=("data", "axes fraction"),
                    color=color,
                    ha="center",
                    va="top",
                    fontsize=12,
                )
    tail.set_xlim(good.get_xlim())  # the same loads on both panels, failing ones too
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
