"""`rsgw simulate`: a scenario (or a recorded trace) through the scheduling modes, in
virtual time, with the table and JSON rows bench/fleet prints for a real run.

    rsgw simulate bench/fleet/scenarios/hot_replicas.yaml --load 0.7 --json out.json
    rsgw simulate memory.yaml --load 0.3,0.7,1.1 --modes lpt_packing --repeat 3
    rsgw simulate memory.yaml --gpus 64 --models 1000 --load 0.7 --duration 3600
    rsgw simulate node.yaml --trace gateway.log --write-trace trace.csv
    rsgw simulate bench/fleet/scenarios/long_tail.yaml --eviction both --repeat 3
    rsgw simulate bench/fleet/scenarios/tenants.yaml --modes round_robin

Exit 0 with the table; 2 with one line on stderr when the scenario, the trace or an
argument is unusable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rsgw.base._usage import StrictParser
from rsgw.simulate import _day, _engine, _offered
from rsgw.simulate import _scenario as sc
from rsgw.simulate._results import (
    RunResult,
    cold_per_1k,
    cold_table,
    context_table,
    describe_run,
    errors_line,
    fmt,
    label,
    results_table,
    table,
)
from rsgw.simulate._tenants import tenants_table
from rsgw.simulate._trace import TraceError, load_trace, write_csv

#: bench/fleet's first seed: repetition k uses SEED + k, as there.
SEED = 1000


def modes_arg(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in _engine.MODES]
    if not modes or bad:
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(_engine.MODES)}")
    return [m for m in _engine.MODES if m in modes]


def loads_arg(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected fractions like 0.7 or 0.3,0.7, got {text!r}"
        ) from None
    if not loads or any(not 0 < x <= 3 for x in loads):
        raise argparse.ArgumentTypeError(f"loads must be fractions in (0, 3], got {text!r}")
    return loads


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = StrictParser(
        prog="rsgw simulate",
        description="Replay a bench/fleet scenario through the gateway's own scheduling "
        "cores and the worker's own cost model, in virtual time: SLO goodput, latency, "
        "batch depth, weight traffic and sheds per mode and load, as bench/fleet reports "
        "them. See docs/operations.md (planning a change).",
    )
    p.add_argument("scenario", type=Path, help="a scenario file (bench/fleet/scenarios/*.yaml)")
    p.add_argument("--load", type=loads_arg, help="fraction(s) of capacity (default: its sweep)")
    p.add_argument("--modes", type=modes_arg, help="default: all")
    p.add_argument("--repeat", type=_positive(int), default=1, help="runs per mode and load")
    p.add_argument("--warmup", type=_positive(float), help="seconds before the window (20)")
    p.add_argument("--duration", type=_positive(float), help="measured seconds (60)")
    p.add_argument("--gpus", type=_positive(int), help="workers (default: the scenario's)")
    p.add_argument("--models", type=_positive(int), help="models (default: the scenario's)")
    p.add_argument(
        "--admission-cap", type=_positive(int), help="calls in flight per worker (default 64)"
    )
    p.add_argument(
        "--trace",
        type=Path,
        help="replay these calls instead of Poisson arrivals: CSV (time,model[,rows]), "
        "JSON Lines, or a gateway JSON log with access lines (see rsgw.simulate._trace)",
    )
    p.add_argument("--write-trace", type=Path, help="save the trace's calls as CSV")
    p.add_argument(
        "--time-scale",
        type=_positive(float),
        help="multiply every device time (default: bench/fleet's for the scenario; 1 with --trace)",
    )
    p.add_argument(
        "--compare",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="simulate each run of these bench/fleet --json files (same mode, load, seed "
        "and window; --warmup as they ran) and print prediction against measurement",
    )
    p.add_argument(
        "--day",
        action="store_true",
        help="simulate a day (86,400 s) round by round with the fluid device model "
        "(rsgw.simulate._day): the load follows a daily curve from --trough to --peak; "
        "prints each mode's goodput and churn, and the hours",
    )
    p.add_argument("--peak", type=loads_arg, help="--day: load at the daily peak (0.9)")
    p.add_argument("--trough", type=loads_arg, help="--day: load at the night trough (0.25)")
    p.add_argument(
        "--step", type=_positive(float), help="--day: seconds per prober round (default 30)"
    )
    p.add_argument(
        "--eviction",
        choices=("value", "lru", "both"),
        help="more models than the GPUs hold (issue 49, the long_tail scenario), as "
        "bench/fleet --eviction: the workers start with nothing loaded and lpt_packing "
        "loads on demand, evicting by value (mode lpt_packing) or least recently used "
        "(mode lru_baseline), or both; prints cold starts per 1,000 calls too",
    )
    p.add_argument("--json", type=Path, help="write every run's row (a JSON list)")
    return p


#: Exit statuses, as every rsgw command: arguments that cannot be used (usage) are 2; a
#: file that cannot be read or used (scenario, trace, --compare rows, --json) is 1.
USAGE, FAILED = 2, 1


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except OSError as exc:  # writing --json or --write-trace
        print(f"rsgw simulate: {exc}", file=sys.stderr)
        return FAILED


def _modes(args: argparse.Namespace) -> str | None:
    """Resolve `args.modes` (under --eviction, its labels); why not, if they clash."""
    if args.eviction is None:
        args.modes = args.modes or list(_engine.MODES)
        return None
    if args.modes is not None:
        return "--eviction chooses the modes (lpt_packing, lru_baseline): leave out --modes"
    if args.day:
        return "--day has no cold path: leave out --eviction"
    chosen = {"value": ["value"], "lru": ["lru"]}.get(args.eviction, ["value", "lru"])
    args.modes = [_engine.EVICTION_MODES[e] for e in chosen]
    return None


def _main(args: argparse.Namespace) -> int:
    clash = _modes(args)
    if clash is not None:
        print(f"rsgw simulate: {clash}", file=sys.stderr)
        return USAGE
    cold = args.eviction is not None
    try:
        scenario = sc.load_scenario(args.scenario)
        load = _offered.derive_load(scenario, cold_starts=cold)
    except sc.ScenarioError as exc:
        print(f"rsgw simulate: {exc}", file=sys.stderr)
        return FAILED
    if args.gpus or args.models:
        try:
            scenario = scenario.resized(
                args.gpus or scenario.workers, args.models or scenario.count
            )
            load = _offered.derive_load(scenario, cold_starts=cold)
        except sc.ScenarioError as exc:
            print(f"rsgw simulate: {exc}", file=sys.stderr)
            return USAGE
    settings = sc.RunSettings()
    if args.warmup or args.duration:
        settings = sc.RunSettings(
            warmup_s=args.warmup or settings.warmup_s, measure_s=args.duration or settings.measure_s
        )
    schedule = None
    if args.trace:
        try:
            schedule = load_trace(args.trace, scenario.names)
        except TraceError as exc:
            print(f"rsgw simulate: {exc}", file=sys.stderr)
            return FAILED
        if args.write_trace:
            write_csv(schedule, scenario.names, args.write_trace)
        span = max(schedule.times[-1], 1e-3)
        warmup = args.warmup or 0.0
        # The window ends just after the last call, so every call after the warm-up counts.
        window = span - warmup + 1e-9
        settings = dataclasses.replace(settings, warmup_s=warmup, measure_s=window)
        load = dataclasses.replace(load, time_scale=args.time_scale or 1.0)
        args.load = [len(schedule.times) / span * load.time_scale / load.capacity]
        args.repeat = 1  # a trace is one run: every repetition would replay it alike
    elif args.time_scale:
        load = dataclasses.replace(load, time_scale=args.time_scale)
    if args.day:
        return day(args, scenario, load)
    print(_offered.describe(scenario, load))
    if args.compare:
        return compare(args, scenario, load, settings)
    loads = args.load or list(scenario.loads)
    print(
        f"simulated: loads {', '.join(f'{x:.0%}' for x in loads)}; modes "
        f"{', '.join(args.modes)}; {args.repeat} per mode and load; warm-up "
        f"{settings.warmup_s:g} s, measured {settings.measure_s:g} s (virtual)\n",
        flush=True,
    )
    runs = []
    started = time.monotonic()
    for rep in range(1, args.repeat + 1):
        for fraction in loads:
            for mode in args.modes:
                t0 = time.monotonic()
                run = _engine.run(
                    scenario,
                    mode,
                    fraction,
                    rep,
                    SEED + rep,
                    load,
                    settings,
                    admission_cap=args.admission_cap,
                    schedule=schedule,
                    eviction=_eviction(args, mode),
                )
                runs.append(run)
                print(describe_run(run, time.monotonic() - t0), flush=True)
    took = time.monotonic() - started
    virtual = len(runs) * (settings.warmup_s + settings.measure_s)
    print(f"\nSLO {scenario.slo_ms * load.time_scale:g} ms (scaled by {load.time_scale:g})\n")
    print(results_table(runs, args.modes))
    print("\n" + context_table(runs, args.modes))
    print("\n" + errors_line(runs, args.modes))
    if cold:
        print("\nCold starts (issue 49): median (min-max) over the runs\n")
        print(cold_table(runs, args.modes))
    if any(r.tenants for r in runs):
        print("\nPer tenant and priority (issue 52): median (min-max) over the runs\n")
        print(tenants_table(runs))
    print(f"\n{virtual:,.0f} virtual seconds in {took:.1f} s ({virtual / max(took, 1e-9):,.0f}x)")
    if args.json:
        rows = [{**r.to_json(), "simulated": True} for r in runs]
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"JSON: {args.json}")
    return 0


def _eviction(args: argparse.Namespace, mode: str) -> str | None:
    """The eviction a run of `mode` loads on demand with (None: every model resident)."""
    return None if args.eviction is None else _engine.eviction_of(mode)


def day(args: argparse.Namespace, scenario: sc.Scenario, load: _offered.Load) -> int:
    """A day of the scenario's fleet, each mode round by round (`_day`)."""
    peak = args.peak[0] if args.peak else 0.9
    trough = args.trough[0] if args.trough else min(0.25, peak)
    if args.trace or args.compare:
        print("rsgw simulate: --day takes neither --trace nor --compare", file=sys.stderr)
        return USAGE
    profile = _day.Profile(trough=trough, peak=peak)
    settings = _day.day_settings(args.step or 30.0, scenario.workers)
    load = dataclasses.replace(load, time_scale=1.0)
    described = _offered.describe(scenario, load).split("\n")
    print("\n".join(_short(line) for line in described if not line.startswith("  --time-scale")))
    print(
        f"  a day: load {trough:.0%} of capacity at {_day.clock(profile.trough_at)} to "
        f"{peak:.0%} at {_day.clock(profile.peak_at * profile.seconds)} "
        f"({trough * load.capacity:,.0f}-{peak * load.capacity:,.0f} req/s); a prober "
        f"round every {settings.health_interval_s:g} s; lpt_packing repacks every "
        f"{settings.repack_compute_s:g} GPU-s (300 per GPU)\n",
        flush=True,
    )
    runs = []
    for mode in args.modes:
        started = time.monotonic()
        run = _day.run_fluid(
            scenario, mode, load, profile, settings, admission_cap=args.admission_cap
        )
        run.wall_s = time.monotonic() - started
        runs.append(run)
        print(
            f"{label(mode)}: {100 * run.goodput_share:.1f}% within the SLO, "
            f"{run.totals.loads:,.0f} weight loads, {len(run.repacks)} repacks "
            f"({run.wall_s:.0f} s)",
            flush=True,
        )
    print(f"\nSLO {scenario.slo_ms:g} ms; {scenario.workers} GPUs, {scenario.count} models\n")
    print(_day.day_table(runs))
    print("\n" + _day.bucket_table(runs))
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in runs], indent=1) + "\n")
        print(f"JSON: {args.json}")
    return 0


def _short(line: str, width: int = 400) -> str:
    """A describe line cut for a terminal (1,000 models' popularity is one line)."""
    return line if len(line) <= width else line[: width - 5] + " ..."


def compare(
    args: argparse.Namespace, scenario: sc.Scenario, load: _offered.Load, settings: sc.RunSettings
) -> int:
    """Each measured run of `--compare` simulated alike; the medians side by side."""
    try:
        measured = [
            RunResult.from_json(row)
            for path in args.compare
            for row in json.loads(path.read_text())
            if row["scenario"] == scenario.name and row["mode"] in args.modes
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"rsgw simulate: --compare: {exc}", file=sys.stderr)
        return FAILED
    if not measured:
        print(f"rsgw simulate: --compare: no runs of {scenario.name}", file=sys.stderr)
        return FAILED
    simulated = [
        _engine.run(
            scenario,
            m.mode,
            m.load,
            m.rep,
            m.seed,
            load,
            dataclasses.replace(settings, measure_s=m.window_s),
            admission_cap=args.admission_cap,
            eviction=_eviction(args, m.mode),
        )
        for m in measured
    ]
    print(comparison_table(measured, simulated, args.modes, cold=args.eviction is not None))
    return 0


def comparison_table(
    measured: Sequence[RunResult],
    simulated: Sequence[RunResult],
    modes: Sequence[str],
    *,
    cold: bool = False,
) -> str:
    """Per load and mode: measured median, simulated median, and the relative error;
    `cold` (--eviction): issue 49's figures in place of batch depth and evictions."""
    figures: list[tuple[str, Callable[[RunResult], float]]] = [
        ("SLO goodput req/s", lambda r: r.goodput_rps),
        ("rows/dispatch", lambda r: r.rows_weighted),
        ("evictions", lambda r: r.evicts),
        ("p50 ms", lambda r: r.p50_ms),
        ("p99 ms", lambda r: r.p99_ms),
    ]
    if cold:
        figures[1:3] = [
            ("cold/1k calls", lambda r: cold_per_1k(r)),
            ("loads/min", lambda r: 60 * r.loads / r.window_s),
            ("failed", lambda r: r.sent - r.ok),
        ]
    header = ["load, mode"] + [f"{name} (measured / simulated, error)" for name, _ in figures]
    rows = []
    for load in sorted({r.load for r in measured}):
        for mode in modes:
            real = [r for r in measured if r.load == load and r.mode == mode]
            sim = [r for r in simulated if r.load == load and r.mode == mode]
            if not real:
                continue
            cells = [f"{load:.0%} {label(mode)}"]
            for _, get in figures:
                a = statistics.median(get(r) for r in real)
                b = statistics.median(get(r) for r in sim)
                cells.append(f"{fmt(a)} / {fmt(b)}, {error(a, b)}")
            rows.append(cells)
    ranks = []
    for load in sorted({r.load for r in measured}):

        def order(runs: Sequence[RunResult], load: float = load) -> list[str]:
            medians = {
                m: statistics.median(r.goodput_rps for r in runs if r.mode == m and r.load == load)
                for m in modes
                if any(r.mode == m and r.load == load for r in runs)
            }
            return sorted(medians, key=lambda m: -medians[m])

        same = order(measured) == order(simulated)
        ranks.append(
            f"{load:.0%}: {'same' if same else 'DIFFERENT'} ({' > '.join(order(measured))})"
        )
    return (
        table(header, rows)
        + "\n\nmodes ranked by SLO goodput, measured vs simulated: "
        + ("; ".join(ranks))
    )


def error(measured: float, simulated: float) -> str:
    """The simulation's relative error, or the absolute one where the measure is 0."""
    if math.isinf(measured) or math.isinf(simulated):
        return "=" if measured == simulated else "fail vs finite"
    if measured == 0:
        return "=" if simulated == 0 else f"+{fmt(simulated)}"
    return f"{(simulated - measured) / measured:+.0%}"
