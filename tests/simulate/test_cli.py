"""`rsgw simulate` as an operator runs it: a real process, its table, JSON and errors."""

from __future__ import annotations

import json
from pathlib import Path

from tests.simulate.cli import SCENARIOS, simulate


def test_a_run_prints_the_table_and_writes_bench_rows(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = simulate(
        str(SCENARIOS / "hot_replicas.yaml"),
        *("--load", "0.5", "--modes", "lpt_packing,round_robin"),
        *("--warmup", "2", "--duration", "8", "--json", str(out)),
    )
    assert done.returncode == 0, done.stderr
    assert "| 50% round_robin" in done.stdout and "| 50% lpt_packing" in done.stdout
    assert "virtual seconds in" in done.stdout
    rows = json.loads(out.read_text())
    assert [r["mode"] for r in rows] == ["round_robin", "lpt_packing"]
    keys = ["scenario", "mode", "load", "offered_rps", "goodput_rps", "slo_ms", "p50_ms"]
    keys += ["p99_ms", "rows_per_dispatch", "shed_fraction", "failed_fraction", "evictions"]
    assert all(list(r)[: len(keys)] == keys and r["simulated"] is True for r in rows)
    assert rows[0]["scenario"] == "hot_replicas" and rows[0]["load"] == 0.5


def test_bad_input_is_one_line_exit_1_for_files_and_2_for_usage(tmp_path: Path) -> None:
    """As the README says of every command: a file that cannot be used is one line and
    exit 1; arguments that cannot be used are 2."""
    missing = simulate(str(tmp_path / "nope.yaml"))
    assert missing.returncode == 1
    assert missing.stderr.strip().count("\n") == 0 and "No such file" in missing.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers: 4\n")
    broken = simulate(str(bad))
    assert broken.returncode == 1 and "missing or bad key" in broken.stderr
    unwritable = simulate(
        str(SCENARIOS / "hot_replicas.yaml"),
        *("--load", "0.5", "--modes", "round_robin", "--warmup", "1", "--duration", "1"),
        *("--json", str(tmp_path / "no-such-dir" / "rows.json")),
    )
    assert unwritable.returncode == 1 and "No such file" in unwritable.stderr
    assert unwritable.stderr.strip().count("\n") == 0
    fixed = simulate(str(SCENARIOS / "hot_replicas.yaml"), "--models", "20")
    assert fixed.returncode == 2 and "--models needs a zipf popularity" in fixed.stderr
    usage = simulate(str(SCENARIOS / "hot_replicas.yaml"), "--modes", "fastest")
    assert usage.returncode == 2 and "expected a comma list" in usage.stderr


def test_compare_replays_recorded_runs_alike(tmp_path: Path) -> None:
    """A simulated run's own rows, compared: the same seed and window give the same
    figures, so every error is zero and the modes rank alike."""
    rows = tmp_path / "rows.json"
    args = ["--load", "0.5", "--modes", "lpt_packing,round_robin", "--warmup", "2"]
    scenario = str(SCENARIOS / "hot_replicas.yaml")
    first = simulate(scenario, *args, "--duration", "8", "--json", str(rows))
    assert first.returncode == 0, first.stderr
    done = simulate(scenario, *args, "--compare", str(rows))
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("| 50%")]
    assert len(lines) == 2 and all("%" in ln for ln in lines)
    cells = [cell.strip() for ln in lines for cell in ln.split("|")[2:-1]]
    assert cells and all(cell.endswith(("+0%", "=")) for cell in cells)
    assert "50%: same" in done.stdout
    missing = simulate(str(SCENARIOS / "memory_bound.yaml"), "--compare", str(rows))
    assert missing.returncode == 1 and "no runs of memory_bound" in missing.stderr


def test_a_bigger_fleet_from_the_same_scenario(tmp_path: Path) -> None:
    """--gpus and --models resize a Zipf scenario; the reference placement is then greedy
    (more parts than the exhaustive search takes) and the run reports every GPU."""
    out = tmp_path / "rows.json"
    done = simulate(
        str(SCENARIOS / "memory_bound.yaml"),
        *("--gpus", "12", "--models", "36", "--load", "0.5", "--modes", "lpt_packing"),
        *("--warmup", "10", "--duration", "10", "--json", str(out)),
    )
    assert done.returncode == 0, done.stderr
    assert "12 workers (fifo), 36 models" in done.stdout
    (row,) = json.loads(out.read_text())
    assert len(row["compute_s"]) == 12 and row["sent"] > 0
    assert sum(len(models) for models in row["placement"].values()) >= 36
    # 40 models' weights need 40 slots where twelve GPUs hold 36: one line, exit 2.
    full = simulate(str(SCENARIOS / "memory_bound.yaml"), "--gpus", "12", "--models", "40")
    assert full.returncode == 2 and "no placement fits" in full.stderr
    assert full.stderr.strip().count("\n") == 0
