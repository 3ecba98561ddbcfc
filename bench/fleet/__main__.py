#!/usr/bin/env python3
"""Fleet benchmark v2: does the scheduling make the GPUs batch better, across load?

Runs a scenario (`scenarios/NAME.yaml`: the fleet, the models, the SLO; see
`_scenario`) through `rsgw run` once per scheduling mode, offered load and repetition,
each on a fresh fleet, with open-loop Poisson arrivals at a fraction of the scenario's
capacity (derived from a simulation of the worker's cost model, printed with its
derivation). Per mode and load it reports the median and min-max over the runs of:
SLO goodput (requests answered within the SLO, from their scheduled send time), p50/p99,
rows per dispatch weighted by rows, shed and failed fractions by status, weight loads
and evictions, and how evenly compute fell on the GPUs; and plots goodput and p99
against offered load, one line per mode.

Run from the repository root, in the virtual environment of `pip install -e '.[test]'`:

    python bench/fleet --scenario memory_bound             # its sweep, 3 runs each
    python bench/fleet --scenario compute_bound --load 0.7 --repeat 3 --json out.json
    python bench/fleet --scenario hot_replicas --load 0.7 --quick
    python bench/fleet --scenario compute_bound --batcher-delay-us 2000   # dynamic batcher

See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rsgw.simulate import _offered
from rsgw.simulate import _scenario as sc
from rsgw.simulate._cli import loads_arg, modes_arg
from rsgw.simulate._engine import MODES

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
SETTINGS = sc.RunSettings()  # warm-up, window, prober round, repack budgets, deadline
REPEAT = 3
QUICK_WARMUP_S = 10.0
QUICK_MEASURE_S = 20.0
SEED = 1000  # repetition k uses SEED + k in every mode


def find_scenario(text: str) -> sc.Scenario:
    """`memory_bound` (from scenarios/) or a path to a YAML file."""
    path = Path(text)
    if not path.suffix:
        path = SCENARIOS / f"{text}.yaml"
    return sc.load_scenario(path, sorted(p.stem for p in SCENARIOS.glob("*.yaml")))


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python bench/fleet",
        description="A fleet scenario through rsgw, per scheduling mode and offered load: "
        "SLO goodput, latency, batch depth, weight traffic, sheds and GPU balance. "
        "See docs/benchmarks.md.",
    )
    p.add_argument("--scenario", default="memory_bound", help="scenarios/NAME.yaml or a path")
    p.add_argument("--load", type=loads_arg, help="fraction(s) of capacity (default: its sweep)")
    p.add_argument("--modes", type=modes_arg, default=list(MODES), help="default: all three")
    p.add_argument(
        "--repeat", type=int, help=f"runs per mode and load (default {REPEAT}; 1 with --quick)"
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 1 run, 10 s + 20 s")
    p.add_argument(
        "--warmup", type=positive, help=f"seconds before the window ({SETTINGS.warmup_s:g})"
    )
    p.add_argument("--duration", type=positive, help=f"measured seconds ({SETTINGS.measure_s:g})")
    p.add_argument(
        "--batcher-delay-us",
        type=int,
        default=None,
        help="give every model Triton's dynamic batcher with this max_queue_delay "
        "(unscaled microseconds; 0: eager); default: as the scenario says",
    )
    p.add_argument(
        "--admission-cap",
        type=int,
        help="calls in flight per worker: the gateway's grpc.max_concurrent_requests_per_worker "
        "and worker_client.max_concurrent_streams, and each worker's --max-concurrent-requests "
        "(default: their defaults)",
    )
    p.add_argument(
        "--api",
        choices=("reactant", "triton"),
        default="reactant",
        help="what the workers answer as: ReactantServer (lpt_packing places by routing, "
        "through the control plane) or stock Triton (lpt_packing places by loading and "
        "unloading every model: repository.models); default reactant",
    )
    p.add_argument(
        "--eviction",
        choices=("value", "lru", "both"),
        help="more models than the GPUs hold (issue 49; the long_tail scenario): workers start "
        "with nothing loaded and fail loads past their memory, and lpt_packing loads on "
        "demand, evicting by value (rsgw's, mode lpt_packing) or least recently used "
        "(what ModelMesh and Seldon Core do, mode lru_baseline), or both side by side",
    )
    p.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="gateways in front of the same workers, the load split between them; more than "
        "one coordinate through an etcd started for the run (issue 39); default 1",
    )
    p.add_argument("--plot", type=Path, help="goodput and p99 against load (PNG)")
    p.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="run nothing: report (and --plot) the rows of earlier --json files together",
    )
    p.add_argument("--json", type=Path, help="write every run's row to this file (a JSON list)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs)")
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else REPEAT
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    args.modes = [m for m in MODES if m in args.modes]  # tables and runs in one order
    if args.eviction:  # lpt_packing only, by value or least recently used (the baseline)
        chosen = {"value": ["lpt_packing"], "lru": ["lru_baseline"]}
        args.modes = chosen.get(args.eviction, ["lpt_packing", "lru_baseline"])
    args.warmup = args.warmup or (QUICK_WARMUP_S if args.quick else SETTINGS.warmup_s)
    args.duration = args.duration or (QUICK_MEASURE_S if args.quick else SETTINGS.measure_s)
    return args


def ensure_matplotlib() -> str | None:
    """matplotlib for the plot: pip-installs it into this environment when missing.

    Returns None when it is available, else why not (the tables are still printed).
    """
    if importlib.util.find_spec("matplotlib") is not None:
        return None
    print("installing matplotlib with pip (for the plot) ...", flush=True)
    install = [sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"]
    done = subprocess.run(install, capture_output=True, text=True, check=False)
    importlib.invalidate_caches()
    if done.returncode or importlib.util.find_spec("matplotlib") is None:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return f"pip install matplotlib failed: {lines[-1] if lines else done.returncode}"
    return None


def rsgw_source() -> str:
    """Where the rsgw under test comes from, with its git commit when it is a checkout."""
    import rsgw

    src = Path(rsgw.__file__).resolve().parent
    text = str(src)
    git = shutil.which("git")
    if git:
        head = subprocess.run(
            [git, "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
        if head.returncode == 0:
            status = subprocess.run(
                [git, "-C", str(src), "status", "--porcelain", "--", "."],
                capture_output=True,
                text=True,
                check=False,
            )
            dirty = ", with uncommitted changes" if status.stdout.strip() else ""
            text += f" (git {head.stdout.strip()}{dirty})"
    return text


def machine() -> str:
    import grpc

    from rsgw._version import __version__

    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return "\n".join(
        [
            f"machine: nproc {os.cpu_count()}, CPU {model}, {platform.system()} "
            f"{platform.release()}; python {platform.python_version()}, rsgw {__version__}, "
            f"grpcio {grpc.__version__}",
            f"rsgw under test: {rsgw_source()}",
        ]
    )


def repack_times(gateway: Any, started_wall: float) -> list[tuple[float, str]]:
    """(seconds from the start of the load, trigger) of each repack the gateway logged.

    The `startup` repack is the initial placement, made before any traffic; the issue's
    "first repack" is the first one after it (trigger `compute`, or `operator`).
    """
    import _fleet

    from rsgw.runtime._logging import timestamp

    times = []
    for record in _fleet.log_events(gateway, "lpt_packing: repack"):
        if isinstance(record.get("ts"), str):
            seconds = timestamp(record) - started_wall
            times.append((seconds, str(record.get("trigger", "?"))))
    return sorted(times)


def eviction_of(mode: str) -> str:
    """The `repository.eviction` a mode label stands for under --eviction."""
    return "lru" if mode == "lru_baseline" else "value"


def one_run(
    scenario: sc.Scenario,
    mode: str,
    fraction: float,
    rep: int,
    args: argparse.Namespace,
    load: _offered.Load,
    workdir: Path,
) -> Any:
    """A fresh fleet, the load, the figures."""
    import _fleet
    import _load
    import _measure

    rundir = workdir / f"{mode}-{fraction:g}-{rep}"
    rundir.mkdir()
    catalogue = workdir / "models.yaml"
    seed = SEED + rep
    total = args.warmup + args.duration
    schedule = sc.poisson_schedule(scenario, load.offered(fraction), total, seed)
    fleet = _fleet.start_fleet(
        scenario,
        mode,
        rundir,
        catalogue,
        load.time_scale,
        SETTINGS,
        args.admission_cap,
        api=args.api,
        gateways=args.gateways,
        eviction=eviction_of(mode) if args.eviction else None,
    )
    try:
        snap = lambda: _measure.snapshot(fleet)  # noqa: E731
        deadline = SETTINGS.deadline(scenario, load.time_scale)
        if args.eviction:  # a cold call waits for its load (and those queued before it)
            deadline = max(deadline, 10 * scenario.load_ms * load.time_scale / 1000)
        outcome = _load.drive(
            scenario.names,
            fleet.grpc_ports,
            schedule,
            deadline,
            deadline + 1.0,
            [("start", args.warmup, snap), ("end", total, snap)],
        )
        fleet.check_alive()
    finally:
        fleet.stop()
    repacks = sorted(t for g in fleet.gateways for t in repack_times(g, outcome.started_wall))
    slo_ms = scenario.slo_ms * load.time_scale
    run = (scenario.name, mode, fraction, rep, seed)
    return _measure.summarise(run, slo_ms, outcome, args.warmup, args.duration, repacks)


def report(
    runs: Sequence[Any],
    args: argparse.Namespace,
    scenario: sc.Scenario,
    load: _offered.Load,
    no_plot: str | None,
) -> None:
    """The tables, the repack line and the plot of `runs` (measured now or read back)."""
    import _report

    print()
    if runs:
        print("Results: median (min-max) over the runs; latency from the scheduled send time;")
        print(
            f"SLO {scenario.slo_ms * load.time_scale:g} ms; a call failed or unanswered counts "
            "as slower than any\n"
        )
        print(_report.results_table(runs, args.modes))
        print("\nContext (same format; CPUs are averages over the window):\n")
        print(_report.context_table(runs, args.modes))
        print("\n" + _report.errors_line(runs, args.modes))
        if args.eviction:
            print("\nCold starts (issue 49): median (min-max) over the runs\n")
            print(_report.cold_table(runs, args.modes))
        lpt = [r for r in runs if r.mode == "lpt_packing" and not args.eviction]
        if lpt:
            firsts = ", ".join(
                "none" if r.first_repack_s is None else f"{r.first_repack_s:.1f} s" for r in lpt
            )
            print(
                "lpt_packing: first repack after the startup placement, from the start of "
                f"the load: {firsts}; repacks in the window: "
                f"{', '.join(str(r.repacks_in_window) for r in lpt)}"
            )
        if not no_plot:
            batcher = (
                f", batcher {scenario.max_queue_delay_us} us" if scenario.max_queue_delay_us else ""
            )
            plot = args.plot or Path(tempfile.gettempdir()) / f"rsgw-fleet-{scenario.name}.png"
            title = (
                f"bench/fleet {scenario.name}: {scenario.workers} workers, {scenario.count} "
                f"models, capacity {load.capacity / load.time_scale:.0f} req/s at time scale "
                f"{load.time_scale:g}{batcher}"
            )
            draw = _report.plot_cold if args.eviction else _report.plot_sweep
            draw(runs, args.modes, plot, title)
            print(f"plot: {plot}")


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    try:
        import grpc  # noqa: F401

        import rsgw  # noqa: F401
    except ImportError as exc:
        print(
            f"bench/fleet: {exc}: run it in the virtual environment of "
            "`pip install -e '.[test]'` (the test extra brings grpcio)",
            file=sys.stderr,
        )
        return 2
    try:
        scenario = find_scenario(args.scenario)
    except sc.ScenarioError as exc:
        print(f"bench/fleet: {exc}", file=sys.stderr)
        return 2
    if args.batcher_delay_us is not None:
        scenario = scenario.with_batcher(args.batcher_delay_us)
    loads = args.load or list(scenario.loads)
    no_plot = ensure_matplotlib()
    if no_plot:
        print(f"bench/fleet: {no_plot}; no plot this time", file=sys.stderr)

    import _fleet
    import _report

    try:
        load = _offered.derive_load(scenario, cold_starts=args.eviction is not None)
    except sc.ScenarioError as exc:
        print(f"bench/fleet: {exc}", file=sys.stderr)
        return 2
    if args.from_json:
        import _measure

        try:
            rows = [row for path in args.from_json for row in json.loads(path.read_text())]
        except (OSError, ValueError) as exc:
            print(f"bench/fleet: --from-json: {exc}", file=sys.stderr)
            return 2
        recorded = [
            _measure.RunResult.from_json(row)
            for row in rows
            if row["scenario"] == scenario.name and row["mode"] in args.modes
        ]
        print(_offered.describe(scenario, load))
        print(f"{len(recorded)} recorded runs from {', '.join(map(str, args.from_json))}")
        report(recorded, args, scenario, load, no_plot)
        return 0
    print(machine())
    print(_offered.describe(scenario, load))
    print(
        f"runs: loads {', '.join(f'{x:.0%}' for x in loads)}; modes {', '.join(args.modes)}; "
        f"{args.repeat} per mode and load; warm-up {args.warmup:g} s, measured "
        f"{args.duration:g} s; prober every {SETTINGS.health_interval_s:g} s; lpt_packing "
        f"first repack after {SETTINGS.first_repack_compute_s:g} GPU-s, then every "
        f"{SETTINGS.repack_compute_s:g} GPU-s",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="rsgw-fleet-"))
    (workdir / "models.yaml").write_text(scenario.catalogue_yaml())
    print(f"work directory {workdir}\n", flush=True)

    runs = []
    failures: list[str] = []
    refused: set[str] = set()
    for rep in range(1, args.repeat + 1):
        for fraction in loads:
            for mode in args.modes:  # every mode once per repetition: noise hits them alike
                if mode in refused:
                    continue
                t0 = time.monotonic()
                try:
                    run = one_run(scenario, mode, fraction, rep, args, load, workdir)
                except Exception as exc:  # one failed run must not lose the others' results
                    text = str(exc) if isinstance(exc, _fleet.FleetError) else repr(exc)
                    failures.append(f"{fraction:.0%} rep {rep} {mode}: {text}")
                    print(f"{fraction:.0%} rep {rep} {mode} FAILED: {text}", flush=True)
                    if "not available in this version" in text:
                        refused.add(mode)  # the gateway refuses the mode: no use again
                    continue
                runs.append(run)
                print(_report.describe_run(run, time.monotonic() - t0), flush=True)

    total = time.monotonic() - started
    report(runs, args, scenario, load, no_plot)
    print(f"total time {total:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in runs], indent=1) + "\n")
        print(f"JSON: {args.json}")
    if failures:
        for line in failures:
            print(f"failed: {line.splitlines()[0]}", file=sys.stderr)
        print(f"logs kept in {workdir}", file=sys.stderr)
        return 1
    if args.keep:
        print(f"work directory kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
