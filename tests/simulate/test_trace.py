"""Traces for `rsgw simulate --trace`: CSV, JSON Lines, the gateway's own access log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsgw.simulate._trace import TraceError, load_trace, write_csv
from tests.simulate.cli import SCENARIOS, simulate

MODELS = ["m01", "m02"]


def test_csv_and_json_lines_give_the_same_schedule(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("time,model,rows\n10.5,m02,3\n10.0,m01,1\n11,m01,2\n")
    lines = tmp_path / "t.jsonl"
    lines.write_text(
        "\n".join(
            json.dumps(c)
            for c in [
                {"time": 10.5, "model": "m02", "rows": 3},
                {"time": 10.0, "model": "m01"},
                {"time": 11, "model": "m01", "rows": 2},
            ]
        )
    )
    for path in (csv, lines):
        schedule = load_trace(path, MODELS)
        assert schedule.times == [0.0, 0.5, 1.0]  # sorted, from the first call
        assert schedule.models == [0, 1, 0] and schedule.rows == [1, 3, 2]
    out = tmp_path / "out.csv"
    write_csv(load_trace(csv, MODELS), MODELS, out)
    assert load_trace(out, MODELS) == load_trace(csv, MODELS)


def test_a_gateway_access_log_becomes_a_trace(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    entries = [
        {"ts": "2026-12-04T10:00:00.000Z", "event": "gateway serving", "grpc": "x"},
        {"ts": "2026-12-04T10:00:01.250Z", "event": "access", "rpc": "ModelInfer",
         "model": "m02", "duration_ms": 250.0},
        {"ts": "2026-12-04T10:00:01.500Z", "event": "access", "rpc": "ModelInfer",
         "model": "m01", "duration_ms": 100.0},
        {"ts": "2026-12-04T10:00:02.000Z", "event": "access", "rpc": "ModelMetadata",
         "model": "m01", "duration_ms": 1.0},
    ]  # fmt: skip
    log.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    schedule = load_trace(log, MODELS)
    assert schedule.models == [1, 0]  # started 1.000 and 1.400: ModelMetadata skipped
    assert schedule.times == pytest.approx([0.0, 0.4])


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("time,model\n1,m09\n", "models the scenario does not serve: m09"),
        ("when,what\n1,m01\n", "needs a header with time and model"),
        ("time,model\nsoon,m01\n", ":2: time must be a number"),
        ('{"time": 1, "model": "m01", "rows": 0}\n', ":1: needs a finite time"),
        ("time,model\n", "no calls"),
        ("{oops\n", ":1: not JSON"),
    ],
)
def test_a_bad_trace_names_the_file_line_and_problem(
    tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "bad.trace"
    path.write_text(text)
    with pytest.raises(TraceError, match=needle.replace("(", r"\(")) as caught:
        load_trace(path, MODELS)
    assert str(path) in str(caught.value)


def test_rsgw_simulate_replays_a_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    calls = [(i * 0.01, "m01" if i % 3 else "m02") for i in range(600)]
    trace.write_text("time,model\n" + "".join(f"{t},{m}\n" for t, m in calls))
    saved = tmp_path / "saved.csv"
    out = tmp_path / "rows.json"
    done = simulate(
        str(SCENARIOS / "compute_bound.yaml"),
        *("--trace", str(trace), "--write-trace", str(saved), "--modes", "lpt_packing"),
        *("--json", str(out)),
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())
    assert row["sent"] == 600 and row["failed_fraction"] == 0
    assert row["offered_rps"] == pytest.approx(600 / 5.99, rel=1e-3)
    assert saved.read_text().startswith("time,model,rows\n0.000000,m02,1\n")
