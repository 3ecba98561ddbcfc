"""Starting and stopping one fleet: the `rsgw worker` processes and `rsgw run` in front.

Every run gets a fresh fleet, so no run inherits another's weight caches, counters or
packer state. Ports are all picked by the processes themselves (port 0) and read back
from their "serving" log lines; readiness is polled with a deadline: each worker's
"worker serving" line, then the gateway's, then its admin `/metrics` showing every model
routable on every worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from rsgw.simulate import _scenario as sc

START_TIMEOUT = 60.0  # seconds for the whole fleet to come up (four workers share 2 cores)
POLL_S = 0.05


class FleetError(Exception):
    """A process that would not start, or died."""


@dataclass
class Proc:
    """One child process in its own process group, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 12) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + line for line in text[-lines:])

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL what is left after 5 s (never anything but ours)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


def spawn(name: str, argv: Sequence[str], log: Path, env: dict[str, str]) -> Proc:
    with log.open("ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env,
            start_new_session=True,
        )
    return Proc(name, popen, log)


def log_event(proc: Proc, event: str) -> dict[str, Any] | None:
    """The first JSON log line of `proc` whose event is `event`, if any yet."""
    with contextlib.suppress(OSError):
        for line in proc.log.read_text(errors="replace").splitlines():
            if event not in line:
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    return record
    return None


def log_events(proc: Proc, needle: str) -> list[dict[str, Any]]:
    """Every JSON log line of `proc` whose event mentions `needle` (case-insensitive)."""
    found = []
    with contextlib.suppress(OSError):
        for line in proc.log.read_text(errors="replace").splitlines():
            if needle not in line.lower():
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and needle in str(record.get("event", "")).lower():
                    found.append(record)
    return found


def http_get(port: int, path: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:
        body: bytes = reply.read()
    return body.decode()


def clean_env() -> dict[str, str]:
    """The caller's environment without any gateway setting that would change the scenario."""
    return {k: v for k, v in os.environ.items() if not k.startswith("REACTANT_GATEWAY_")}


@dataclass
class Fleet:
    """A running fleet: the workers (gRPC and metrics ports) and the gateway."""

    mode: str
    workers: list[Proc]
    gateway: Proc
    grpc_port: int = 0
    admin_port: int = 0
    #: With --gateways N > 1: the other gateways, and the etcd they coordinate through.
    others: list[Proc] = field(default_factory=list)
    etcd: Proc | None = None
    #: Every gateway's gRPC port, the first's first (the load is split across them).
    grpc_ports: list[int] = field(default_factory=list)

    @property
    def gateways(self) -> list[Proc]:
        return [self.gateway, *self.others]

    @property
    def procs(self) -> list[Proc]:
        return [*self.workers, *self.gateways, *([self.etcd] if self.etcd else [])]

    def check_alive(self) -> None:
        for proc in self.procs:
            if not proc.alive():
                raise FleetError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")

    def stop(self) -> None:
        # The gateways first, so they do not log every worker's departure as a failure.
        for proc in [*self.gateways, *self.workers, *([self.etcd] if self.etcd else [])]:
            proc.stop()


def gateway_config(
    mode: str,
    workers: Sequence[Proc],
    settings: sc.RunSettings,
    admission_cap: int | None = None,
    repository: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """gateway.yml: the one `rsgw simulate` parses for the same run, plus what only real
    processes need (the workers' metrics ports and names, the log format read back), and
    the models lpt_packing may load and unload on Triton-like workers (`repository`)."""
    from rsgw.simulate._engine import gateway_yaml

    endpoints = [f"127.0.0.1:{w.info['grpc_port']}" for w in workers]
    extra = {"repository": repository} if repository else {}
    return {
        **gateway_yaml(mode, endpoints, settings, admission_cap),
        **extra,
        "metrics_endpoints": [f"127.0.0.1:{w.info['metrics_port']}" for w in workers],
        "worker_names": [w.name for w in workers],
        "logging": {"level": "info", "format": "json"},
    }


def start_etcd(workdir: Path, deadline: float) -> Proc:
    """A one-member etcd on loopback for the coordinated gateways (ports found free)."""
    etcd = shutil.which("etcd")
    if etcd is None:
        raise FleetError("--gateways > 1 needs etcd (Debian's etcd-server)")
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    client, peer = f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
    argv = [
        etcd,
        "--name=bench",
        f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=bench={peer}",
        "--log-level=warn",
    ]
    proc = spawn("etcd", argv, workdir / "etcd.log", clean_env())
    proc.info = {"port": ports[0]}

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{client}/health", timeout=1) as reply:
                return b'"true"' in reply.read()
        except OSError:
            return False

    wait_for("etcd", [proc], healthy, deadline)
    return proc


def wait_for(what: str, procs: Sequence[Proc], ready: Any, deadline: float) -> None:
    """Poll `ready()` until true; fail when a process dies or the deadline passes."""
    while True:
        for proc in procs:
            if not proc.alive():
                raise FleetError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        if ready():
            return
        if time.monotonic() > deadline:
            tails = "\n".join(f"  {p.name}:\n{p.tail()}" for p in procs)
            raise FleetError(f"{what} not ready after {START_TIMEOUT:.0f}s:\n{tails}")
        time.sleep(POLL_S)


def routable(admin_port: int, models: int, workers: int) -> bool:
    """The gateway routes every model to every worker (its own /metrics says so)."""
    try:
        text = http_get(admin_port, "/metrics", timeout=2.0)
    except OSError:
        return False
    table = 0.0
    ready = 0.0
    for line in text.splitlines():
        if line.startswith("gateway_routing_table_size"):
            table = float(line.split()[-1])
        elif line.startswith("gateway_worker_ready{"):
            ready += float(line.split()[-1])
    return table >= models and ready >= workers


def start_fleet(
    scenario: sc.Scenario,
    mode: str,
    workdir: Path,
    catalogue: Path,
    time_scale: float,
    settings: sc.RunSettings,
    admission_cap: int | None = None,
    *,
    api: str = "reactant",
    gateways: int = 1,
    eviction: str | None = None,
) -> Fleet:
    """The scenario's workers, then the gateway; returns once every model is routable.

    `api`: what the workers answer as (`rsgw worker --api`); as Triton, lpt_packing
    places the scenario's models by loading and unloading them, within the scenario's
    weight budget per worker. `gateways` > 1: that many gateways in front of the same
    workers, coordinated through an etcd started here (Debian's `etcd`), which elect one
    placer (issue 39); every gateway is ready before this returns. `eviction` ("value"
    or "lru"): the scenario's models need not fit (issue 49's long tail): the workers
    start with nothing loaded and fail a load past their GPU memory, and the gateway
    loads on demand, evicting by value (rsgw's) or least recently used (the baseline),
    with a minimum residency of three mean loads for both.
    """
    deadline = time.monotonic() + START_TIMEOUT
    env = clean_env()
    workers = []
    for k in range(scenario.workers):
        name = f"gpu{k}"
        argv = [
            sys.executable,
            "-m",
            "rsgw",
            "worker",
            *("--name", name, "--gpu", str(k), "--host", "127.0.0.1"),
            *("--port", "0", "--metrics-port", "0", "--models", str(catalogue)),
            *("--discipline", scenario.discipline),
            *("--weight-cache-bytes", str(scenario.budget_bytes)),
            *("--time-scale", f"{time_scale:g}", "--log-format", "json"),
            *("--api", "triton" if eviction else api),
        ]
        if eviction:
            argv += ["--model-control-mode", "explicit"]
            argv += ["--gpu-memory-bytes", str(scenario.budget_bytes)]
        if admission_cap is not None:
            argv += ["--max-concurrent-requests", str(admission_cap)]
        workers.append(spawn(name, argv, workdir / f"{name}.log", env))
    procs: list[Proc] = []
    etcd: Proc | None = None
    try:

        def workers_serving() -> bool:
            for w in workers:
                if not w.info:
                    w.info = log_event(w, "worker serving") or {}
            return all(w.info for w in workers)

        wait_for("workers", workers, workers_serving, deadline)
        repository: dict[str, Any] | None = None
        if api == "triton" or eviction:
            repository = {
                "models": list(scenario.names),
                "worker_budget_bytes": scenario.budget_bytes,
            }
        if eviction:
            assert repository is not None
            load_s = scenario.load_ms * time_scale / 1000
            repository |= {
                "default_weight_bytes": scenario.weight_bytes,
                "weight_bytes": scenario.weights,
                "eviction": eviction,
                # The same for both (it never holds back LRU, whose youngest copies
                # are its last to go anyway).
                "min_residency_seconds": 3 * load_s,
            }
        scheduling_mode = "lpt_packing" if eviction else mode
        base = gateway_config(scheduling_mode, workers, settings, admission_cap, repository)
        etcd = start_etcd(workdir, deadline) if gateways > 1 else None
        genv = dict(env)
        genv["REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS"] = f"{settings.health_interval_s:g}"
        genv["REACTANT_GATEWAY_STARTUP_WAIT_SECONDS"] = f"{START_TIMEOUT:g}"
        procs: list[Proc] = []
        for k in range(gateways):
            config = workdir / ("gateway.yml" if k == 0 else f"gateway{k}.yml")
            text = dict(base)
            if etcd is not None:
                endpoint = f"127.0.0.1:{etcd.info['port']}"
                text["coordination"] = {"etcd_endpoints": [endpoint], "member": f"gw{k}"}
            config.write_text(yaml.safe_dump(text, sort_keys=False))
            argv = [sys.executable, "-m", "rsgw", "run", "--config", str(config)]
            name = "gateway" if k == 0 else f"gateway{k}"
            procs.append(spawn(name, argv, workdir / f"{name}.log", genv))
        fleet = Fleet(mode, workers, procs[0], others=procs[1:], etcd=etcd)

        def gateways_serving() -> bool:
            for proc in fleet.gateways:
                proc.info = proc.info or log_event(proc, "gateway serving") or {}
            return all(proc.info for proc in fleet.gateways)

        wait_for("gateway", fleet.procs, gateways_serving, deadline)
        fleet.grpc_ports = [int(proc.info["grpc_port"]) for proc in fleet.gateways]
        fleet.grpc_port = fleet.grpc_ports[0]
        fleet.admin_port = int(fleet.gateway.info["metrics_port"])
        for proc in fleet.gateways:
            admin = int(proc.info["metrics_port"])
            wait_for(
                "gateway routing table",
                fleet.procs,
                lambda admin=admin: routable(
                    admin, 0 if eviction else scenario.count, scenario.workers
                ),
                deadline,
            )
        return fleet
    except BaseException:
        for proc in procs:
            proc.stop()
        if etcd is not None:
            etcd.stop()
        for w in workers:
            w.stop()
        raise
