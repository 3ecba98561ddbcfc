"""The node supervisor (`rsgw node`, docs/product.md §6), with real processes and sockets.

The end-to-end tests run `python -m rsgw node` as an operator does, with every port 0
(`base_port: 0`, `metrics_base_port: 0`, `REACTANT_GATEWAY_LISTEN_*=127.0.0.1:0`), and
learn the ports and pids from its "node serving" log line; restarts show up as
"process started" lines. The supervisor runs in its own session so that a test can
send the whole group Ctrl-C, and so that clean-up can kill the group if a test fails.
Everything waits by polling with a deadline. The pure decisions (backoff, GPUs,
addresses, command and log lines) have plain table tests in tests/node/test_supervision.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
import yaml

import rsgw
from rsgw._cli import main
from rsgw.node._children import WorkerChild
from rsgw.node._gpus import visible_gpu_count
from rsgw.node._node import load_node, parse_node
from rsgw.node._supervision import worker_command
from rsgw.node._supervisor import RunningNode, serve_node
from tests.helpers import in_thread, wait_until

#: Cold start of 3 workers and a gateway, each importing trio, h2, protobuf, on a busy box.
START_SECONDS = 30.0
#: docs/product.md §6: SIGTERM or Ctrl-C stops every child and frees every port within 5 s.
STOP_SECONDS = 5.0
#: A restart: 1 s backoff plus a cold start.
RESTART_SECONDS = 20.0

NODE_ENV = {
    "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:0",
    "REACTANT_GATEWAY_LISTEN_METRICS": "127.0.0.1:0",
    "REACTANT_GATEWAY_LISTEN_HTTP": "127.0.0.1:0",
    # A restarted worker is routed to again after one probe round.
    "REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS": "0.2",
}


def node_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTANT_GATEWAY_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env | NODE_ENV


def write_node_file(directory: Path, **keys: Any) -> Path:
    path = directory / "node.yml"
    node = {"model_repo": "builtin", "base_port": 0, "metrics_base_port": 0} | keys
    path.write_text(yaml.safe_dump(node))
    return path


# ---------------------------------------------------------------------------
# `rsgw node` as a subprocess.


@dataclass
class NodeProcess:
    """A running `rsgw node` and what its "node serving" line said."""

    process: subprocess.Popen[bytes]
    log_path: str
    node_file: Path
    serving: dict[str, Any]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.serving['grpc_port']}"

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def events(self, event: str, **match: object) -> list[dict[str, Any]]:
        """The supervisor's own log entries (unprefixed JSON lines) named `event`."""
        found = []
        for line in self.log().splitlines():
            if line.startswith("{") and f'"{event}"' in line:
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if entry.get("event") == event and all(
                        entry.get(k) == v for k, v in match.items()
                    ):
                        found.append(entry)
        return found

    def pid(self, child: str) -> int:
        """The pid of the latest start of `child`."""
        return int(self.events("process started", child=child)[-1]["pid"])

    def ports(self) -> list[int]:
        """Every port the node listens on: the gateway's and each worker's two."""
        ports = [self.serving["grpc_port"], self.serving["metrics_port"]]
        for worker in self.serving["workers"].values():
            ports += [worker["grpc_port"], worker["metrics_port"]]
        return ports

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(STOP_SECONDS)


def start_node(directory: Path, *args: str, env: dict[str, str] | None = None) -> NodeProcess:
    """`python -m rsgw node NODE_FILE *args`, once it logged "node serving"."""
    node_file = write_node_file(directory)
    fd, log_path = tempfile.mkstemp(prefix="rsgw-node-", suffix=".log", dir=directory)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "rsgw", "node", str(node_file), *args],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env=node_environment() | (env or {}),
            start_new_session=True,
        )
    finally:
        os.close(fd)
    node = NodeProcess(process, log_path, node_file, {})
    try:
        wait_until(
            lambda: bool(node.events("node serving")) or process.poll() is not None,
            START_SECONDS,
            what="node serving",
        )
        assert process.poll() is None, f"rsgw node exited; its log:\n{node.log()}"
    except BaseException:
        node.kill_group()
        raise
    node.serving = node.events("node serving")[0]
    return node


@contextlib.contextmanager
def running_node(
    directory: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[NodeProcess]:
    node = start_node(directory, *args, env=env)
    try:
        yield node
    finally:
        node.kill_group()


@pytest.fixture(scope="module")
def node3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """`rsgw node --gpus 3`, shared by the tests that leave it serving."""
    with running_node(tmp_path_factory.mktemp("node3"), "--gpus", "3") as node:
        yield node


def infer_simple(target: str, seed: int = 0) -> None:
    """A tritonclient `simple` call with a correct answer, or an exception."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32)
    client = grpcclient.InferenceServerClient(target)
    try:
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("simple", inputs, client_timeout=10)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        client.close()


def succeeds(call: Any) -> bool:
    try:
        call()
    except Exception:
        return False
    return True


def alive(pid: int) -> bool:
    """Whether `pid` exists (a reaped child does not; ours are always reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def port_is_free(port: int) -> bool:
    """Whether an rsgw listener could bind `port` again (SO_REUSEADDR, as `bind_tcp`)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def probe(node_file: Path, *args: str) -> int:
    return subprocess.run(
        [sys.executable, "-m", "rsgw", "probe", "--node", str(node_file), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=node_environment(),
        timeout=30,
    ).returncode


def probe_file(directory: Path, node: NodeProcess) -> Path:
    """A node file naming the ports `node`'s workers bound (it started them on port 0)."""
    workers = [
        {"name": name, "port": w["grpc_port"]} for name, w in node.serving["workers"].items()
    ]
    path = directory / "probe.yml"
    path.write_text(yaml.safe_dump({"model_repo": "builtin", "workers": workers}))
    return path


# ---------------------------------------------------------------------------
# Acceptance: `rsgw node --gpus 3`.


def test_node_serves_tritonclient_through_its_gateway(node3: NodeProcess) -> None:
    serving = node3.serving
    assert sorted(serving["workers"]) == ["worker0", "worker1", "worker2"]
    assert serving["gateway_pid"] is not None
    # Each child is its own OS process, and the gateway's port is none of the workers'.
    pids = [serving["gateway_pid"], *(w["pid"] for w in serving["workers"].values())]
    assert len(set(pids)) == 4 and all(alive(pid) for pid in pids)
    assert len(set(node3.ports())) == 8
    for seed in range(6):
        infer_simple(node3.target, seed)
    log = node3.log()
    assert "[gateway] " in log and all(f"[worker{i}] " in log for i in range(3))


def test_a_killed_worker_is_restarted_on_its_port(node3: NodeProcess) -> None:
    old_pid = node3.pid("worker1")
    starts = len(node3.events("process started", child="worker1"))
    port = node3.serving["workers"]["worker1"]["grpc_port"]
    os.kill(old_pid, signal.SIGKILL)
    # The gateway fails over while worker1 is down: every call still succeeds.
    seed = 0
    deadline = time.monotonic() + RESTART_SECONDS
    while len(node3.events("process started", child="worker1")) == starts:
        assert time.monotonic() < deadline, f"worker1 not restarted; log:\n{node3.log()}"
        infer_simple(node3.target, seed)
        seed += 1
    exits = node3.events("process exited; restarting", child="worker1", pid=old_pid)
    assert exits and exits[0]["returncode"] == -signal.SIGKILL
    assert exits[0]["restart_in_s"] == 1.0
    new_pid = node3.pid("worker1")
    assert new_pid != old_pid and alive(new_pid)
    # The restart binds the port its first run picked, so the gateway's list holds.
    wait_until(
        lambda: succeeds(partial(infer_simple, f"127.0.0.1:{port}")),
        RESTART_SECONDS,
        what="restarted worker1 serving on its old port",
    )
    for seed in range(6):
        infer_simple(node3.target, seed)


def test_a_killed_gateway_is_restarted_on_the_same_public_port(node3: NodeProcess) -> None:
    old_pid = node3.pid("gateway")
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: node3.pid("gateway") != old_pid, RESTART_SECONDS, what="gateway restart")
    wait_until(
        lambda: succeeds(partial(infer_simple, node3.target)),
        RESTART_SECONDS,
        what="restarted gateway serving on its old port",
    )


def test_probe_exits_0_for_a_ready_worker_and_1_for_a_stopped_one(
    node3: NodeProcess, tmp_path: Path
) -> None:
    node_file = probe_file(tmp_path, node3)
    assert probe(node_file, "--worker", "worker0") == 0
    pid = node3.pid("worker2")
    os.kill(pid, signal.SIGSTOP)
    try:
        # Connected but never answered: the probe's 5 s deadline decides.
        assert probe(node_file, "--worker", "worker2") == 1
    finally:
        os.kill(pid, signal.SIGCONT)
    assert probe(node_file, "--worker", "worker2") == 0
    # A name the node does not define is a one-line configuration error.
    assert probe(node_file, "--worker", "nope") == 1


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_stop_leaves_no_child_and_frees_every_port(tmp_path: Path, how: str) -> None:
    with running_node(tmp_path, "--gpus", "3") as node:
        pids = [node.process.pid, node.serving["gateway_pid"]]
        pids += [w["pid"] for w in node.serving["workers"].values()]
        ports = node.ports()
        assert not any(port_is_free(port) for port in ports)
        start = time.monotonic()
        if how == "SIGTERM":
            node.process.send_signal(signal.SIGTERM)
        else:
            # A terminal's Ctrl-C: SIGINT to the whole foreground process group.
            os.killpg(node.process.pid, signal.SIGINT)
        assert node.process.wait(2 * STOP_SECONDS) == 0
        wait_until(
            lambda: not any(alive(pid) for pid in pids) and all(map(port_is_free, ports)),
            2 * STOP_SECONDS - (time.monotonic() - start),
            what="every child gone and every port free",
        )
        # The promise is STOP_SECONDS on an idle machine (about 1 s here); the waits
        # above hold it, with twice that for a busy runner.
        assert time.monotonic() - start < 2 * STOP_SECONDS
        assert node.events("node stopped")
        # Nothing listens any more: a probe is refused at once and says not ready.
        assert probe(probe_file(tmp_path, node), "--worker", "worker0") == 1


# ---------------------------------------------------------------------------
# A single-worker node, in process through `serve_node` and its handle.


@pytest.mark.parametrize("how", ["--mode", "--config"])
def test_a_node_serves_lpt_packing_and_rsgw_ctl_reaches_it(tmp_path: Path, how: str) -> None:
    """The embedded gateway under lpt_packing: it waits for its workers (the supervisor
    sets an infinite startup wait), places every model, serves, and answers `rsgw ctl`.

    Switched on by `--mode`, or by a gateway.yml that says only the mode (issue 40): the
    node fills in its workers, which the file does not list."""
    if how == "--mode":
        args = ["--mode", "lpt_packing"]
    else:
        gateway_yml = tmp_path / "gateway.yml"
        gateway_yml.write_text("scheduling:\n  mode: lpt_packing\n")
        args = ["--config", str(gateway_yml)]
    with running_node(tmp_path, "--gpus", "2", *args) as node:
        target = f"127.0.0.1:{node.serving['grpc_port']}"
        infer_simple(target)
        status = subprocess.run(
            [sys.executable, "-m", "rsgw", "ctl", "--gateway", target, "status"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith("mode: lpt_packing")
        assert "last trigger 'startup'" in status.stdout
        repack = subprocess.run(
            [sys.executable, "-m", "rsgw", "ctl", "--gateway", target, "repack", "--wait", "30"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert repack.returncode == 0 and " completed in " in repack.stdout, repack.stderr
    # The gateway's "overridden by environment" line names the operator's variables only,
    # not the workers, mode and log format the node handed it.
    (line,) = [ln for ln in node.log().splitlines() if "overridden by environment" in ln]
    overridden = json.loads(line.removeprefix("[gateway] "))["variables"]
    assert sorted(overridden) == sorted(v for v in NODE_ENV if "LISTEN" in v)


async def test_single_worker_node_serves_the_public_ports_itself(tmp_path: Path) -> None:
    node = load_node(write_node_file(tmp_path, gpus=1))
    env = node_environment()
    lines: list[str] = []
    async with trio.open_nursery() as nursery:
        running: RunningNode = await nursery.start(
            partial(serve_node, node, env=env, sink=lines.append)
        )
        assert not running.has_gateway
        assert list(running.pids()) == ["worker0"]
        (pid,) = running.pids().values()
        assert pid is not None
        assert running.worker_ports()["worker0"] == (running.grpc_port, running.metrics_port)
        await in_thread(partial(infer_simple, f"127.0.0.1:{running.grpc_port}"))
        assert any(line.startswith("[worker0] ") for line in lines)
        # `rsgw probe` finds the sole worker where the supervisor put it.
        env_port = {"REACTANT_GATEWAY_LISTEN_GRPC": f"127.0.0.1:{running.grpc_port}"}
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env_port.items():
                patch.setenv(key, value)
            assert await rsgw.probe_worker_ready(write_node_file(tmp_path, gpus=1))
        with trio.fail_after(STOP_SECONDS):
            await running.aclose()
    assert not alive(pid)
    assert port_is_free(running.grpc_port)
    assert running.metrics_port is not None and port_is_free(running.metrics_port)


# ---------------------------------------------------------------------------
# The command line's failures.


@pytest.mark.parametrize(
    "argv", [["node", "--gpus", "x"], ["node", "a", "b"], ["probe"], ["probe", "--node"]]
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "usage: rsgw" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["node", "probe"])
def test_a_bad_node_file_is_one_line_and_exit_1(
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The CLI would install its log handler on the root logger, under pytest's.
    monkeypatch.setattr("rsgw._cli.configure_logging", lambda *args: None)
    missing = str(tmp_path / "absent.yml")
    argv = ["node", missing] if command == "node" else ["probe", "--node", missing]
    assert main(argv) == 1
    assert capsys.readouterr().err == f"rsgw {command}: node file not found: {missing}\n"


def test_a_missing_gateway_yml_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rsgw._cli.configure_logging", lambda *args: None)
    missing = str(tmp_path / "gateway.yml")
    assert main(["node", "--config", missing]) == 1
    assert capsys.readouterr().err == f"rsgw node: gateway config file not found: {missing}\n"
    # Not a mapping: one line too, before any process starts.
    (tmp_path / "gateway.yml").write_text("- lpt_packing\n")
    node_file = write_node_file(tmp_path, gpus=2)
    assert main(["node", str(node_file), "--config", missing]) == 1
    assert "gateway config root must be a mapping" in capsys.readouterr().err


def test_a_bad_model_catalogue_is_one_line_before_any_worker_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rsgw._cli.configure_logging", lambda *args: None)
    node_file = write_node_file(tmp_path, model_repo="models.yml")
    assert main(["node", str(node_file)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rsgw node: ") and "models.yml" in err and err.count("\n") == 1


def test_a_busy_public_port_is_one_line_and_exit_1_before_any_child(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "rsgw", "node", str(write_node_file(tmp_path)), "--gpus", "2"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=node_environment() | {"REACTANT_GATEWAY_LISTEN_GRPC": f"127.0.0.1:{port}"},
            timeout=30,
        )
    assert result.returncode == 1
    assert (
        f"rsgw node: cannot listen on 127.0.0.1:{port}: address already in use (another rsgw "
        "node running? the node's ports: the node file's base_port and metrics_base_port, and "
        "REACTANT_GATEWAY_LISTEN_GRPC, _HTTP and _METRICS for the gateway's)\n"
    ) == result.stderr.splitlines(keepends=True)[-1]
    assert "process started" not in result.stderr


# ---------------------------------------------------------------------------
# GPU counting and the worker's command line, as the shell does them.


@pytest.mark.parametrize(
    ("devices", "count"),
    [("0,1", 2), ("", 0), ("-1", 0), ("0,-1,2", 1), ("GPU-8f1c,GPU-77aa", 2)],
)
def test_visible_gpus_come_from_cuda_visible_devices(devices: str, count: int) -> None:
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": devices}) == count


def test_visible_gpus_come_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert visible_gpu_count({}) is None
    tool = tmp_path / "nvidia-smi"
    tool.write_text(
        "#!/bin/sh\n"
        "echo 'GPU 0: NVIDIA A100 (UUID: GPU-1)'\n"
        "echo 'GPU 1: NVIDIA A100 (UUID: GPU-2)'\n"
    )
    tool.chmod(0o755)
    assert visible_gpu_count({}) == 2
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert visible_gpu_count({}) is None


def test_no_visible_gpu_simulates_four_and_says_so() -> None:
    node = parse_node(
        {"model_repo": "builtin"},
        source="n",
        visible_gpus=visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}),
    )
    assert len(node.workers) == 4
    assert any("simulating 4" in note for note in node.notes)


def test_a_worker_child_runs_its_worker_command_on_its_device() -> None:
    node = parse_node(
        {"model_repo": "builtin", "gpus": 2, "models": {"simple": ["worker1"]}}, source="n"
    )
    env = {"CUDA_VISIBLE_DEVICES": "4,5"}
    child = WorkerChild(node.workers[1], node, env, ["--log-format", "text"], print, 3.0)
    assert child.environment()["CUDA_VISIBLE_DEVICES"] == "5"
    assert child.command() == worker_command(
        node.workers[1],
        node,
        device="5",
        logging_flags=["--log-format", "text"],
        executable=sys.executable,
    )
    child.pin(7001, None)
    assert child.command()[child.command().index("--port") + 1] == "7001"
