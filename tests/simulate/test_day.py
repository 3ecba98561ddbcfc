"""The fleet over a day (`rsgw.simulate._day`), and `rsgw simulate --day` as run."""

from __future__ import annotations

import json
from pathlib import Path

from rsgw.config._config import parse_config
from rsgw.scheduling.calls._meta import ModelCounters, WorkerCounters
from rsgw.scheduling.placement._packer import Packer
from rsgw.scheduling.placement._reports import summarize_poll
from rsgw.simulate import _day, _offered
from rsgw.simulate import _scenario as sc
from rsgw.simulate._engine import packer_knobs
from tests.simulate.cli import SCENARIOS, simulate


def steady(name: str, mode: str, fraction: float) -> _day.FluidRun:
    scenario = sc.load_scenario(SCENARIOS / f"{name}.yaml")
    load = _offered.derive_load(scenario)
    settings = sc.RunSettings(warmup_s=20, measure_s=60)
    profile = _day.Profile(seconds=80, trough=fraction, peak=fraction)
    return _day.run_fluid(
        scenario, mode, load, profile, settings, time_scale=load.time_scale, buckets=1
    )


def test_the_fluid_fleet_ranks_the_modes_as_measured() -> None:
    # docs/benchmarks.md "Fleet": on A at 70%, lpt_packing answers ~250 req/s within
    # the SLO, round_robin none (it thrashes the weight cache).
    lpt = steady("memory_bound", "lpt_packing", 0.7)
    spread = steady("memory_bound", "round_robin", 0.7)
    assert 220 < lpt.goodput_rps < 280 and lpt.goodput_share > 0.95
    assert spread.goodput_rps == 0 and spread.totals.loads > 50
    assert lpt.repacks[0][1] == "startup" and len(lpt.repacks) > 1
    again = steady("memory_bound", "lpt_packing", 0.7)
    assert again.to_json() | {"wall_s": 0} == lpt.to_json() | {"wall_s": 0}  # deterministic


def test_repack_due_is_what_tick_decides() -> None:
    config = parse_config(
        {
            "endpoints": ["127.0.0.1:1", "127.0.0.1:2"],
            "scheduling": {
                "mode": "lpt_packing",
                "first_rebalance_compute_seconds": 5,
                "rebalance_compute_seconds": 20,
            },
        },
        {},
    )
    knobs = packer_knobs(config.scheduling)
    packer = Packer(["m"])
    urls = ["127.0.0.1:1", "127.0.0.1:2"]
    decided = []
    for k in range(1, 40):
        compute = 1.5 * k
        poll = summarize_poll(
            {
                url: WorkerCounters({"m": ModelCounters(compute / 2, k, k, 8)}, 0, "fifo")
                for url in urls
            }
        )
        due = packer.repack_due(poll.fleet_compute, knobs)
        outcome = packer.tick(poll, knobs, urls, float(k))
        assert due == (outcome.repack is not None), k
        decided.append(due)
    assert sum(decided) >= 3  # the first after 5 GPU-s, then every 20


def test_a_day_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "day.json"
    done = simulate(
        str(SCENARIOS / "shifting.yaml"),
        *("--day", "--step", "600", "--modes", "round_robin,lpt_packing", "--json", str(out)),
    )
    assert done.returncode == 0, done.stderr
    assert "a day: load 25% of capacity at 03:00 to 90% at 15:00" in done.stdout
    assert "| lpt_packing " in done.stdout and "| 23:00 " in done.stdout
    rows = json.loads(out.read_text())
    assert [r["mode"] for r in rows] == ["round_robin", "lpt_packing"]
    assert all(r["simulated"] and r["engine"] == "fluid" and len(r["buckets"]) == 24 for r in rows)
    assert rows[1]["goodput_share"] > rows[0]["goodput_share"]
    assert rows[1]["repacks"] >= 2  # the shift at noon moves the placement
    bad = simulate(str(SCENARIOS / "shifting.yaml"), "--day", "--peak", "7")
    assert bad.returncode == 2 and "--peak: loads must be fractions in (0, 3]" in bad.stderr
