"""grafana/: the dashboards' JSON model, the alert rules and their runbooks (static checks).

The queries themselves run against a real Prometheus in tests/observability.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "grafana"
BOARDS = sorted(GRAFANA.glob("dashboards/*.json"))
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_the_committed_dashboards_are_what_the_builder_makes() -> None:
    tool = ROOT / "tools" / "grafana_dashboards.py"
    result = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True)
    assert result.returncode == 0, result.stderr.decode()


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_dashboard_json_model(path: Path) -> None:
    board: dict[str, Any] = json.loads(path.read_text())
    # The schema version grafana-foundation-sdk writes (Grafana 10.1's dashboard kind);
    # Grafana migrates an older one forward when it loads the dashboard.
    assert board["schemaVersion"] >= 36
    assert board["uid"].startswith("rsgw-") and len(board["uid"]) <= 40
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    names = [v["name"] for v in board["templating"]["list"]]
    assert {"datasource", "job", "instance"} <= set(names)
    # Grafana's (pre-Scenes) variable store keys variables by id: one id each, not the
    # schema's default nil UUID for all.
    assert [v["id"] for v in board["templating"]["list"]] == names
    for panel in board["panels"]:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert isinstance(panel["options"], dict), panel["title"]  # the schema wants an object
        assert panel["targets"] and panel["description"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
            assert 'job=~"$job"' in target["expr"] and 'instance=~"$instance"' in target["expr"]


def test_the_seeds_dashboards_and_panels_are_there() -> None:
    titles = {json.loads(p.read_text())["title"]: json.loads(p.read_text()) for p in BOARDS}
    assert {
        "rsgw / Fleet Overview",
        "rsgw / Scheduling & Placement",
        "rsgw / GPU Work Balance",
        "rsgw / Latency & Errors",
        "rsgw / Worker",
    } <= set(titles)
    balance = [p["title"] for p in titles["rsgw / GPU Work Balance"]["panels"]]
    assert balance[0] == "Work spread across GPUs"  # the seed: it leads with the spread
    assert "Planned vs actual work, per GPU" in balance
    assert any(p["type"] == "table" for p in titles["rsgw / Scheduling & Placement"]["panels"])


def test_every_alert_has_a_runbook_in_operations_md() -> None:
    rules = yaml.safe_load(GRAFANA.joinpath("alerts.yml").read_text())["groups"][0]["rules"]
    operations = ROOT.joinpath("docs", "operations.md").read_text()
    headings = set(re.findall(r"(?m)^### (Rsgw\w+)$", operations))
    for rule in rules:
        name = rule["alert"]
        assert name in headings, name
        assert rule["annotations"]["runbook"] == f"docs/operations.md#{name.lower()}"
        assert rule["labels"]["severity"] in ("page", "ticket")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs Debian's prometheus")
def test_promtool_accepts_the_rules_and_the_example_config() -> None:
    for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"]):
        result = subprocess.run(["promtool", *args], cwd=GRAFANA, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
