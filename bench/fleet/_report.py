"""The sweep and cold-start plots; the tables are `rsgw.simulate._results`' (shared
with the simulator)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from rsgw.simulate._results import (
    RunResult,
    by_mode,
    cold_table,
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
    "plot_cold",
    "plot_sweep",
    "results_table",
]


def plot_cold(runs: Sequence[RunResult], modes: Sequence[str], path: Path, title: str) -> None:
    """Issue 49's figures side by side per mode: cold starts per 1,000 calls and SLO
    goodput, a bar at the median and a dot per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, 2, figsize=(9, 4), dpi=110, layout="constrained")
    metrics = (
        ("cold starts per 1,000 calls", lambda r: 1000 * (r.cold_starts or 0) / max(r.sent, 1)),
        (
            f"SLO goodput, req/s within {fmt(runs[0].slo_ms if runs else math.nan)} ms",
            lambda r: r.goodput_rps,
        ),
    )
    groups = list(by_mode(runs, modes))
    for ax, (name, value) in zip(panels, metrics, strict=True):
        for x, (mode, group) in enumerate(groups):
            values = [value(r) for r in group]
            color = "C2" if mode == "lpt_packing" else "C3"
            ax.bar(x, statistics.median(values), color=color, alpha=0.5, width=0.6)
            ax.plot([x] * len(values), values, "o", color=color)
        ax.set_xticks(range(len(groups)), [label(mode) for mode, _ in groups])
        ax.set_ylabel(name)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


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
