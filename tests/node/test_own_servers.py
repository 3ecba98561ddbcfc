"""`rsgw node` running a server of its own per GPU (issue 50), with real processes.

The server here is a plain command, `rsgw worker --api triton` (answers as a stock
Triton would), so these run wherever rsgw does; tests/node/test_triton_node.py runs the
Triton preset on a real tritonserver. Every port is picked free (`base_port: 0`, the
public ports `127.0.0.1:0`), pids come from the node's "process started" lines and a
child's environment from /proc. Everything waits by polling with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import wait_until
from tests.node.test_supervisor import (
    RESTART_SECONDS,
    START_SECONDS,
    STOP_SECONDS,
    NodeProcess,
    alive,
    infer_simple,
    node_environment,
    succeeds,
)

#: `rsgw worker --api triton` as each GPU's server, on the ports the node picked.
WORKER = (
    f"{shlex.quote(sys.executable)} -m rsgw worker --api triton --name {{name}} "
    "--host {host} --port {grpc_port} --metrics-port {metrics_port} --gpu {gpu} "
    "--log-format text"
)
#: A node that fails must say so and be gone within this (issue 50 acceptance 5).
FAIL_SECONDS = 5.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def node_file(directory: Path, server: dict[str, Any], **keys: Any) -> Path:
    path = directory / "node.yml"
    raw = {"model_repo": "builtin", "base_port": 0, "http_base_port": 0, "metrics_base_port": 0}
    path.write_text(yaml.safe_dump(raw | {"server": server} | keys))
    return path


def launch(directory: Path, *args: str, drop: tuple[str, ...] = ()) -> NodeProcess:
    """`python -m rsgw node *args` in a session of its own, its output in a file, its
    environment `node_environment()` less the variables in `drop`."""
    fd, log_path = tempfile.mkstemp(prefix="rsgw-node-", suffix=".log", dir=directory)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "rsgw", "node", *args],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env={k: v for k, v in node_environment().items() if k not in drop},
            start_new_session=True,
        )
    finally:
        os.close(fd)
    return NodeProcess(process, log_path, directory / "node.yml", {})


@contextlib.contextmanager
def serving(
    directory: Path, *args: str, start_seconds: float = START_SECONDS
) -> Iterator[NodeProcess]:
    """`rsgw node ARGS` until it serves (within `start_seconds`); every server's session
    and the node's group killed on the way out."""
    node = launch(directory, *args)
    try:
        wait_until(
            lambda: bool(node.events("node serving")) or node.process.poll() is not None,
            start_seconds,
            what="node serving",
        )
        assert node.process.poll() is None, f"rsgw node exited; its log:\n{node.log()}"
        node.serving = node.events("node serving")[0]
        yield node
    finally:
        for entry in node.events("process started"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry["pid"], signal.SIGKILL)  # a server's own session
        node.kill_group()


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (a zombie left for init to reap,
    which some container inits do late, does not count: it is dead)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def failed(node: NodeProcess) -> tuple[int, str, float]:
    """The exit status of a node that fails, its last line, and how long it took."""
    start = time.monotonic()
    try:
        status = node.process.wait(4 * FAIL_SECONDS)
    except subprocess.TimeoutExpired:
        node.kill_group()
        raise AssertionError(f"the node did not exit; its log:\n{node.log()}") from None
    return status, node.log().rstrip("\n").splitlines()[-1], time.monotonic() - start


# ---------------------------------------------------------------------------
# Acceptance 3: a plain command works as the presets do.


def test_a_plain_command_per_gpu_behind_the_gateway(tmp_path: Path) -> None:
    """Two `rsgw worker --api triton` as GPU servers: each its own GPU in
    CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES, its env additions, its output
    prefixed by its name; tritonclient answered through the gateway; Ctrl-C stops all,
    nothing left in a server's process group, exit 0."""
    # The server starts a helper of its own in its process group (as Triton starts its
    # Python-backend stubs): stopping the server must not leave it behind.
    command = f"sh -c 'sleep 300 & echo $! > helper.pid; exec {WORKER}'"
    server = {"command": command, "env": {"SLOT": "{index}", "WHERE": "{workdir}"}}
    workers = [{"name": "gpu0"}, {"name": "gpu1", "env": {"SLOT": "mine"}}]
    path = node_file(tmp_path, server, gpus=2, workers=workers)
    with serving(tmp_path, str(path)) as node:
        pids = {name: w["pid"] for name, w in node.serving["workers"].items()}
        for index, name in enumerate(("gpu0", "gpu1")):
            env = environ(pids[name])
            assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == str(index)
            assert env["WHERE"].endswith(f"/{name}")
        environ_before = environ(pids["gpu0"])
        assert environ_before["SLOT"] == "0"
        assert environ(pids["gpu1"])["SLOT"] == "mine"
        helpers = [
            int((Path(environ(p)["WHERE"]) / "helper.pid").read_text()) for p in pids.values()
        ]
        assert all(alive(pid) for pid in helpers)
        for seed in range(4):
            infer_simple(node.target, seed)
        log = node.log()
        assert "[gpu0] " in log and "[gpu1] " in log and "[gateway] " in log
        assert len(node.events("worker ready")) == 2
        start = time.monotonic()
        os.killpg(node.process.pid, signal.SIGINT)  # a terminal's Ctrl-C
        assert node.process.wait(2 * STOP_SECONDS) == 0
        gone = [*pids.values(), *helpers]
        wait_until(
            lambda: not any(map(alive, gone)) and not any(map(group_alive, pids.values())),
            2 * STOP_SECONDS - (time.monotonic() - start),
            what="every server and its helper gone",
        )
    # The folder the node made for its workers is gone with them.
    assert not Path(environ_before["WHERE"]).parent.exists()


def test_a_killed_server_is_restarted_and_routed_to_again(tmp_path: Path) -> None:
    path = node_file(tmp_path, {"command": WORKER}, gpus=2)
    with serving(tmp_path, str(path)) as node:
        pid = node.pid("gpu1")
        os.killpg(pid, signal.SIGKILL)
        wait_until(
            lambda: len(node.events("worker ready", child="gpu1")) == 2,
            RESTART_SECONDS,
            what="gpu1 restarted and ready",
        )
        assert node.pid("gpu1") != pid
        port = node.serving["workers"]["gpu1"]["grpc_port"]
        assert node.events("worker ready", child="gpu1")[-1]["grpc_port"] == port
        wait_until(lambda: succeeds(lambda: infer_simple(node.target)), RESTART_SECONDS)


# ---------------------------------------------------------------------------
# Acceptance 3 and 5: what a restart cannot fix ends the node, in one line.


def test_a_server_that_fails_at_once_ends_the_node(tmp_path: Path) -> None:
    bad = f"{WORKER} --bogus"
    node = launch(tmp_path, "--gpus", "2", "--command", bad)
    status, line, took = failed(node)
    assert status == 1 and took < FAIL_SECONDS, node.log()
    assert re.match(r"rsgw node: worker 'gpu[01]' exited with status 2 before it was ready", line)
    assert "(command: " in line and " --bogus)" in line
    assert "its last line: rsgw worker: error: unrecognized arguments: --bogus" in line
    assert not node.events("process exited; restarting")
    # Nothing left running: neither server, nor a gateway (none was started).
    for entry in node.events("process started"):
        assert not group_alive(entry["pid"])


def test_a_server_that_never_becomes_ready_ends_the_node(tmp_path: Path) -> None:
    script = "print('loading weights', flush=True); import time; time.sleep(300)"
    stuck = [sys.executable, "-c", script]
    path = node_file(tmp_path, {"command": stuck, "startup_seconds": 2}, gpus=1)
    node = launch(tmp_path, str(path))
    status, line, took = failed(node)
    assert status == 1 and took < 2 + FAIL_SECONDS, node.log()
    assert line.startswith("rsgw node: worker 'gpu0' not ready after 2 s (server.startup_seconds")
    assert line.endswith("its last line: loading weights")
    assert "[gpu0] loading weights" in node.log()
    for entry in node.events("process started"):
        assert not group_alive(entry["pid"])


def test_a_bad_gateway_config_ends_the_node_before_any_child(tmp_path: Path) -> None:
    gateway_yml = tmp_path / "gateway.yml"
    gateway_yml.write_text("scheduling: {mode: lpt}\n")
    node = launch(tmp_path, "--gpus", "2", "--config", str(gateway_yml))
    status, line, took = failed(node)
    assert status == 1 and took < FAIL_SECONDS
    assert line == (
        "rsgw node: gateway: scheduling.mode must be 'round_robin', 'least_outstanding', "
        "or 'lpt_packing', got 'lpt'"
    )
    assert not node.events("process started")
    assert "rsgw run:" not in node.log()


def test_a_command_that_does_not_exist_ends_the_node(tmp_path: Path) -> None:
    node = launch(tmp_path, "--gpus", "2", "--command", "no-such-server --port {grpc_port}")
    status, line, took = failed(node)
    assert status == 1 and took < FAIL_SECONDS, node.log()
    assert re.fullmatch(
        r"rsgw node: worker 'gpu[01]' could not be started \(command: no-such-server --port "
        r"\d+\): No such file or directory: 'no-such-server'",
        line,
    )


def test_a_gateway_that_fails_before_it_serves_ends_the_node(tmp_path: Path) -> None:
    """What only the gateway finds out (a gateway.yml's listen address is taken: the node
    checks only the addresses it sets itself) still ends the node, in the gateway's words."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        gateway_yml = tmp_path / "gateway.yml"
        gateway_yml.write_text(yaml.safe_dump({"listen": {"grpc": f"127.0.0.1:{port}"}}))
        path = node_file(tmp_path, {"command": WORKER}, gpus=2)
        drop = ("REACTANT_GATEWAY_LISTEN_GRPC",)  # it would win over the file
        node = launch(tmp_path, str(path), "--config", str(gateway_yml), drop=drop)
        status, line, _ = failed(node)
    assert status == 1, node.log()
    assert line.startswith("rsgw node: gateway: ") and f":{port}" in line, line
    assert "address already in use" in line.lower(), line
    assert "rsgw run:" not in node.log()
    assert not node.events("process exited; restarting")
    for entry in node.events("process started"):
        assert not group_alive(entry["pid"])
