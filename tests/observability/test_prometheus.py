"""The dashboards and alert rules against a real Prometheus scraping a real `rsgw node`.

`rsgw node` (three simulated GPUs, three small models, a 2 MiB weight budget per worker
so weights move) runs once per scheduling mode under load, with a Prometheus (Debian's
`prometheus`) scraping the gateway every 1 s (so a 1 s scrape timeout) through a file_sd
target that follows the node's port. Then every PromQL expression in
grafana/dashboards/*.json must return data over the run, every template variable must
have values, and every rule in grafana/alerts.yml must evaluate. In the last mode one
worker is SIGSTOPped: the gateway's scrape must stay fast (Prometheus keeps the target
up) and RsgwWorkerNotReady must fire. The rules are loaded with their `for:` shortened
to 1 s (the only change), so the test need not wait out a minute.

Skipped without a `prometheus` binary, except under CI (`CI=1`), where `.ci/run`
installs it and a skip would hide a broken dashboard.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tests.helpers import WorkerProcess, infer_request, simple_inputs, start_rsgw_process

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
MODES = ("round_robin", "least_outstanding", "lpt_packing")
MODELS = ("m1", "m2", "m3")
LOAD_SECONDS = 8.0
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def catalogue() -> dict[str, Any]:
    """Three copies of the built-in `simple` (1 MiB of weights each), named m1..m3."""
    builtin = ROOT / "src" / "rsgw" / "worker" / "builtin_models.yaml"
    (simple,) = [m for m in yaml.safe_load(builtin.read_text())["models"] if m["name"] == "simple"]
    return {"models": [{**simple, "name": name, "launch_ms": 2.0} for name in MODELS]}


pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None and not os.environ.get("CI"),
    reason="needs Debian's prometheus (installed by .ci/run)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A Prometheus server on loopback and its HTTP API."""

    def __init__(self, work: Path, features: tuple[str, ...] = ()) -> None:
        """`features`: Prometheus's `--enable-feature` flags (`exemplar-storage`)."""
        self.port = free_port()
        self.targets = work / "targets.json"
        self.targets.write_text("[]")
        #: The workers scraped directly too, as docs/operations.md "Scraping" says.
        self.direct = work / "direct.json"
        self.direct.write_text("[]")
        rules = GRAFANA.joinpath("alerts.yml").read_text()
        (work / "alerts.yml").write_text(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 1s", rules))
        config = {
            # Every second, so Prometheus's scrape timeout is 1 s too: the gateway must
            # answer within it while a worker hangs (X-Prometheus-Scrape-Timeout-Seconds).
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(work / "alerts.yml")],
            "scrape_configs": [
                {
                    "job_name": "rsgw",
                    "scrape_timeout": "1s",
                    "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}],
                },
                {
                    "job_name": "direct",
                    "scrape_timeout": "1s",
                    "file_sd_configs": [{"files": [str(self.direct)], "refresh_interval": "1s"}],
                },
            ],
        }
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (work / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *(f"--enable-feature={feature}" for feature in features),
            ],
            stdout=self.log,
            stderr=self.log,
        )
        deadline = time.monotonic() + 30
        while not self._ready():
            assert self.process.poll() is None, "prometheus exited"
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def scrape(self, node: WorkerProcess) -> None:
        """The node's gateway; and its workers directly, labelled as the docs say."""
        gateway = f"127.0.0.1:{node.metrics_port}"
        self.targets.write_text(json.dumps([{"targets": [gateway]}]))
        workers = serving_line(node)["workers"]
        direct = [
            {
                "targets": [f"127.0.0.1:{worker['metrics_port']}"],
                "labels": {"worker": name, "instance": gateway},
            }
            for name, worker in workers.items()
        ]
        self.direct.write_text(json.dumps(direct))

    def api(self, path: str, **params: str | float) -> Any:
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=30) as reply:
                body = json.load(reply)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        assert body["status"] == "success", (path, params, body)
        return body["data"]

    def wait_for(self, what: str, check: Any, seconds: float = 40.0) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.5)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path)
    yield server
    server.close()


class Load:
    """Closed-loop grpcio callers over the three models until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.answered = 0
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(4)]
        for thread in self.threads:
            thread.start()

    def run(self, index: int) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            call = channel.unary_unary(MODEL_INFER)
            n = 0
            while not self.stop.is_set():
                model = MODELS[(index + n) % len(MODELS)]
                body = infer_request(model, simple_inputs(n)).SerializeToString()
                try:
                    call(body, timeout=5)
                    self.answered += 1
                except grpc.RpcError:
                    pass  # a stopped worker's calls may fail over slowly; not tested here
                n += 1

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)


def start_node(work: Path, mode: str) -> WorkerProcess:
    catalogue_file = work / "models.yml"
    catalogue_file.write_text(yaml.safe_dump(catalogue()))
    node_file = work / f"node-{mode}.yml"
    node_file.write_text(
        yaml.safe_dump(
            {
                "model_repo": str(catalogue_file),
                "base_port": 0,
                "metrics_base_port": 0,
                "gpus": 3,
                "global": {"memory": {"weight_cache_bytes": "2MiB"}},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTANT_GATEWAY_")}
    env |= {
        "REACTANT_GATEWAY_SCHEDULING_MODE": mode,
        "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_METRICS": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_HTTP": "127.0.0.1:0",
        "REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS": "1",
        # Tenants told apart (issue 52): the dashboards' tenant panels have series.
        "REACTANT_GATEWAY_TENANCY_HEADER": "x-tenant",
        "REACTANT_GATEWAY_SCHEDULING_FIRST_REBALANCE_COMPUTE_SECONDS": "0.05",
    }
    return start_rsgw_process("node", str(node_file), event="node serving", env=env, timeout=60)


def serving_line(node: WorkerProcess) -> dict[str, Any]:
    """The node's "node serving" log entry: its ports and its workers'."""
    for line in node.log().splitlines():
        if line.startswith("{") and '"node serving"' in line:
            entry: dict[str, Any] = json.loads(line)
            return entry
    raise AssertionError("no node serving line")


def worker_pid(node: WorkerProcess, name: str) -> int:
    return int(serving_line(node)["workers"][name]["pid"])


def grafana_expressions() -> tuple[list[str], list[str]]:
    """Every panel query and every template variable query of the dashboards."""
    queries: list[str] = []
    variables: list[str] = []
    for path in sorted(GRAFANA.glob("dashboards/*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            queries += [target["expr"] for target in panel["targets"]]
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                variables.append(var["query"]["query"])
    return sorted(set(queries)), sorted(set(variables))


def as_promql(expr: str) -> str:
    """A dashboard query as Prometheus runs it with every variable at "All"."""
    for name in ("job", "instance", "model", "worker"):
        expr = expr.replace(f"${name}", ".*")
    return expr.replace("$__rate_interval", "5s")


def test_dashboards_and_alerts_against_a_real_prometheus(
    prometheus: Prometheus, tmp_path: Path
) -> None:
    started = time.time()
    scrapes: list[float] = []
    for mode in MODES:
        node = start_node(tmp_path, mode)
        try:
            assert node.metrics_port is not None
            prometheus.scrape(node)
            prometheus.wait_for(
                f"a scrape of the {mode} gateway",
                lambda m=mode: prometheus.api(
                    "query", query=f'gateway_build_info{{scheduling_mode="{m}"}}'
                )["result"],
            )
            load = Load(node.grpc_port)
            try:
                time.sleep(LOAD_SECONDS / 2)
                if mode == "lpt_packing":
                    ctl = subprocess.run(
                        [
                            *("python", "-m", "rsgw", "ctl"),
                            *("--gateway", f"127.0.0.1:{node.grpc_port}", "repack", "--wait", "30"),
                        ],
                        capture_output=True,
                        text=True,
                        timeout=60,
                    )
                    assert ctl.returncode == 0, ctl.stderr
                time.sleep(LOAD_SECONDS / 2)
                if mode == MODES[-1]:
                    assert_promtool_accepts_the_exposition(node)
                    assert_direct_scrapes_have_the_same_labels(prometheus)
                    scrapes = stop_a_worker(prometheus, node)
            finally:
                load.close()
            assert load.answered > 100, (mode, load.answered)
        finally:
            node.stop(timeout=30)
    end = time.time()

    # Acceptance 2: with a worker stopped, every scrape of the gateway answered fast.
    assert scrapes and max(scrapes) < 1.5, scrapes

    queries, variables = grafana_expressions()
    assert len(queries) > 40
    empty = []
    for expr in queries:
        data = prometheus.api("query_range", query=as_promql(expr), start=started, end=end, step=2)
        if not data["result"]:
            empty.append(expr)
    assert not empty, "queries without data:\n" + "\n".join(empty)

    for definition in variables:
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", definition)
        assert match, definition
        values = prometheus.api(
            f"label/{match[2]}/values",
            **{"match[]": as_promql(match[1])},
            start=started,
            end=end,
        )
        assert values, definition

    rules = yaml.safe_load(GRAFANA.joinpath("alerts.yml").read_text())
    for rule in rules["groups"][0]["rules"]:
        prometheus.api("query_range", query=rule["expr"], start=started, end=end, step=5)


def assert_promtool_accepts_the_exposition(node: WorkerProcess) -> None:
    """`promtool check metrics` on the gateway's merged /metrics and on a worker's own."""
    workers = serving_line(node)["workers"]
    for port in (node.metrics_port, workers["worker0"]["metrics_port"]):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read()
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
        assert check.returncode == 0, (port, check.stdout, check.stderr)


def assert_direct_scrapes_have_the_same_labels(prometheus: Prometheus) -> None:
    """A worker's series read through the gateway and scraped directly: the same labels."""

    def label_sets(job: str) -> set[tuple[tuple[str, str], ...]]:
        result = prometheus.api("query", query=f'worker_dispatch_total{{job="{job}"}}')["result"]
        return {tuple(sorted(r["metric"].items() - {("job", job)})) for r in result}

    prometheus.wait_for("direct scrapes", lambda: label_sets("direct"))
    assert label_sets("direct") == label_sets("rsgw")
    (one, *_) = label_sets("rsgw")
    assert {"worker", "exported_worker", "gpu", "model", "instance"} <= dict(one).keys()


def stop_a_worker(prometheus: Prometheus, node: WorkerProcess) -> list[float]:
    """SIGSTOP worker1 until RsgwWorkerNotReady fires; the scrape durations meanwhile."""
    pid = worker_pid(node, "worker1")
    os.kill(pid, signal.SIGSTOP)
    stopped = time.time()
    try:

        def firing() -> bool:
            alerts = prometheus.api("alerts")["alerts"]
            return any(
                a["labels"]["alertname"] == "RsgwWorkerNotReady"
                and a["labels"].get("worker") == "worker1"
                and a["state"] == "firing"
                for a in alerts
            )

        try:
            prometheus.wait_for("RsgwWorkerNotReady to fire", firing)
        except AssertionError:
            ready = prometheus.api("query", query="gateway_worker_ready")["result"]
            rules = prometheus.api("rules")
            raise AssertionError(f"no alert; ready={ready}; rules={rules}") from None
        time.sleep(3)  # a few more scrapes with the worker still stopped
        window = f"[{int(time.time() - stopped) + 1}s]"
        gateway = '{job="rsgw"}'
        up = prometheus.api("query", query=f"min_over_time(up{gateway}{window})")["result"]
        assert up and all(float(r["value"][1]) == 1 for r in up), up
        query = f"scrape_duration_seconds{gateway}{window}"
        durations = prometheus.api("query", query=query)["result"]
        return [float(value) for series in durations for _, value in series["values"]]
    finally:
        os.kill(pid, signal.SIGCONT)
