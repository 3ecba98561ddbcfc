"""docs/tutorial.md, walked as written: two MLServer workers, `rsgw run` in lpt_packing in
front of them, a real Prometheus scraping it (issue 40's first acceptance).

The page's shell blocks are run as they are, from the repository root, by bash (only
the MLServer executable is swapped for `RSGW_MLSERVER` when that is not the page's
`.venv-mlserver`); what the page says they show is checked: the placement carried out
by load and unload at start-up, the REST answer, `rsgw ctl status`, the Prometheus
target and queries, what another host may do (a network namespace: the REST call and
`rsgw ctl status` work, `set-replicas` is refused), and a model widened to both workers
with `rsgw ctl`. The page uses
fixed ports (8000-8002, 9001-9003, 9011-9013, 9090): they are checked free first.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import tritonclient.grpc as triton

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.scheduling.calls._routing import is_ready_state
from tests.helpers import unary_call, wait_until
from tests.netns import other_host
from tests.thirdparty.servers import MLSERVER, available, missing
from tests.thirdparty.test_third_party_workers import infer

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "tutorial.md"
PORTS = (8000, 8001, 8002, 9001, 9002, 9003, 9011, 9012, 9013, 9090)
#: MLServer imports a lot; Prometheus and the gateway are quick.
START_SECONDS = 120.0
#: Each worker's gRPC target and its REST health URL, as the page starts them.
WORKERS = {
    "gpu0": ("127.0.0.1:9001", "http://127.0.0.1:9002/v2/health/ready"),
    "gpu1": ("127.0.0.1:9011", "http://127.0.0.1:9012/v2/health/ready"),
}


def shell_blocks(page: Path) -> list[str]:
    """Every ```sh block of the page, in order, with its continuation lines joined."""
    blocks = re.findall(r"^```sh\n(.*?)^```", page.read_text(), flags=re.M | re.S)
    return [block.replace("\\\n", " ") for block in blocks]


def block(blocks: list[str], starting: str) -> str:
    """The one block whose first command starts with `starting` (the page's order may
    change; its commands may not without this test noticing)."""
    found = [b for b in blocks if b.lstrip().startswith(starting)]
    assert len(found) == 1, f"docs/tutorial.md: expected one block starting {starting!r}"
    return found[0]


class Shell:
    """The page's long-running commands, each in its own process group, stopped at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, command: str) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-c", command],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.started.append((name, process, log))
        return process

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def run(self, command: str) -> str:
        done = subprocess.run(
            ["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def stop(self) -> dict[str, int | None]:
        """SIGINT (Ctrl-C) to every group, SIGKILL after a grace; the exit codes."""
        codes: dict[str, int | None] = {}
        for _, process, _ in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
        for name, process, _ in self.started:
            try:
                codes[name] = process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
                codes[name] = None
        return codes


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        # As servers bind: a port in TIME_WAIT after an earlier server is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def http_get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bytes(reply.read())
    except OSError:
        return None


def answers(url: str) -> bool:
    return http_get(url) is not None


def query(expression: str) -> dict[str, float]:
    """Prometheus's instant answer: each series' labels (as a sorted string) -> value."""
    url = "http://127.0.0.1:9090/api/v1/query?query=" + urllib.parse.quote(expression)
    body = http_get(url)
    if body is None:
        return {}
    result = json.loads(body)["data"]["result"]
    return {
        ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items()) if k != "__name__"): float(
            r["value"][1]
        )
        for r in result
    }


def holders(model: str) -> list[str]:
    """The workers whose own RepositoryIndex says `model` is loaded."""
    found = []
    for name, (target, _) in WORKERS.items():
        reply = unary_call(
            target,
            Method.REPOSITORY_INDEX.path,
            pb.RepositoryIndexRequest(ready=False).SerializeToString(),
        )
        index = pb.RepositoryIndexResponse.FromString(reply)
        if any(m.name == model and is_ready_state(m.state) for m in index.models):
            found.append(name)
    return found


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    if not available("mlserver"):
        pytest.skip(missing("mlserver"))
    if shutil.which("prometheus") is None:
        pytest.skip("no prometheus executable (Debian: apt install prometheus)")
    busy = [port for port in PORTS if not port_free(port)]
    assert not busy, f"docs/tutorial.md needs these ports free: {busy}"
    shell = Shell(tmp_path)
    try:
        yield shell
    finally:
        shell.stop()


def test_the_tutorial_as_written(shell: Shell) -> None:
    blocks = shell_blocks(PAGE)
    assert block(blocks, "python3 -m venv .venv &&")  # the install: done by the test run
    mlserver = "../../.venv-mlserver/bin/mlserver"
    workers = [b for b in blocks if mlserver in b]
    assert len(workers) == 2, "docs/tutorial.md: expected two MLServer blocks"
    for i, command in enumerate(workers):
        shell.start(f"mlserver{i}", command.strip().replace(mlserver, str(MLSERVER)))
    for target, health in WORKERS.values():
        wait_until(partial(answers, health), START_SECONDS, what=f"MLServer at {target}")

    gateway = shell.start("gateway", block(blocks, ". .venv/bin/activate && rsgw run").strip())
    wait_until(
        lambda: (
            http_get("http://127.0.0.1:8000/v2/health/ready") is not None
            or gateway.poll() is not None
        ),
        START_SECONDS,
        what="the gateway serving",
    )
    assert gateway.poll() is None, shell.log("gateway")
    # Start-up: what step 4 says the log shows, and each model on one worker only.
    wait_until(
        lambda: "placement carried out by load and unload" in shell.log("gateway"),
        30,
        what="the start-up placement carried out",
    )
    log = shell.log("gateway")
    for line in ("no authentication:", "lpt_packing: placing these workers' models"):
        assert line in log
    carried = next(
        json.loads(line)
        for line in log.splitlines()
        if "placement carried out by load and unload" in line
    )
    assert carried["unloaded"] == ["simple@gpu1", "twin@gpu0"]
    assert (holders("simple"), holders("twin")) == (["gpu0"], ["gpu1"])

    # Step 5: the REST call answers as the page says.
    answer = json.loads(shell.run(block(blocks, "curl -s 127.0.0.1:8000/v2/models/simple/infer")))
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    assert outputs == {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}

    # Step 6.
    status = shell.run(". .venv/bin/activate && " + block(blocks, "rsgw ctl status"))
    assert status.startswith("mode: lpt_packing")
    assert "repository_index,streaming,model_control" in status and "gateway" in status

    # Step 7: Prometheus scrapes the gateway, whose scrape carries both workers' series.
    shell.start("prometheus", block(blocks, "prometheus --config.file").strip())
    wait_until(
        lambda: (
            query('up{job="rsgw"}') != {} and set(query("gateway_model_replicas").values()) == {1.0}
        ),
        START_SECONDS,
        what="Prometheus scraping the gateway",
    )
    assert list(query('up{job="rsgw"}').values()) == [1.0]
    rules = json.loads(http_get("http://127.0.0.1:9090/api/v1/rules") or b"{}")
    assert sum(len(g["rules"]) for g in rules["data"]["groups"]) > 0
    assert query("gateway_placement_actions_total") == {
        "action=load,instance=127.0.0.1:8002,job=rsgw": 0.0,
        "action=unload,instance=127.0.0.1:8002,job=rsgw": 2.0,
    }

    # Step 8's caveat, from another host: inference and `rsgw ctl status` work there,
    # `set-replicas` is refused and names the settings that would open it.
    with other_host() as host:
        there = f"{host.gateway_address}:8001"
        rest = host.command(
            "bash",
            "-c",
            block(blocks, "curl -s 127.0.0.1:8000").replace("127.0.0.1", host.gateway_address),
        )
        answered = subprocess.run(rest, capture_output=True, text=True, timeout=30)
        assert '"data":[2,3,4,5]' in answered.stdout.replace(" ", ""), answered
        ctl = [sys.executable, "-m", "rsgw", "ctl", "--gateway", there]
        read = subprocess.run(host.command(*ctl, "status"), capture_output=True, text=True)
        assert read.returncode == 0 and read.stdout.startswith("mode: lpt_packing"), read
        refused = subprocess.run(
            host.command(*ctl, "set-replicas", "simple", "2"), capture_output=True, text=True
        )
        assert refused.returncode == 1
        assert refused.stderr.startswith("error: PERMISSION_DENIED: ")
        assert "auth.tokens_file" in refused.stderr

    # Step 8: traffic, then `simple` on both workers; no call fails meanwhile.
    client = triton.InferenceServerClient("127.0.0.1:8001")
    for seed in range(200):
        infer(client, "simple", seed)
    shell.run(". .venv/bin/activate && " + block(blocks, "rsgw ctl set-replicas simple 2"))
    for seed in range(50):
        infer(client, "simple", seed)
    assert sorted(holders("simple")) == ["gpu0", "gpu1"]
    wait_until(
        lambda: (
            query('gateway_placement_actions_total{action="load"}') != {}
            and list(query('gateway_placement_actions_total{action="load"}').values()) == [1.0]
            and list(query('gateway_model_replicas{model="simple"}').values()) == [2.0]
        ),
        30,
        what="Prometheus seeing simple loaded on gpu1",
    )
    assert "'simple@gpu1'" in shell.log("gateway") or '"simple@gpu1"' in shell.log("gateway")
    # Both workers' own series come through the gateway's one target, labelled by name.
    workers_seen = query("count by (worker) (model_infer_request_success_total)")
    assert set(workers_seen) == {"worker=gpu0", "worker=gpu1"}

    # Step 9: Ctrl-C; the gateway drains and exits cleanly.
    codes = shell.stop()
    assert codes["gateway"] == 0, shell.log("gateway")
