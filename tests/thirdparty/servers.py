"""Real KServe V2 servers nobody here wrote, as processes for the tests: MLServer and
KServe's ModelServer, each from its own virtual environment (their pins clash with
rsgw's), serving Triton's `simple` under chosen names.

`.ci/run` makes the environments (`.venv-mlserver`, `.venv-kserve` beside the
repository's own `.venv`); elsewhere point `RSGW_MLSERVER` at an `mlserver`
executable and `RSGW_KSERVE_PYTHON` at a Python that has `kserve`, or the tests that
need them are skipped, saying which.

Neither server reports a port it bound itself, so the ports are chosen free just
before the start (bound to port 0 and released), and a start that finds one taken
meanwhile is tried again with new ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from rsgw._proto import grpc_predict_v2_pb2 as pb

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MLSERVER_MODEL = REPO / "examples" / "mlserver" / "simple_model.py"
MLSERVER = Path(os.environ.get("RSGW_MLSERVER", REPO / ".venv-mlserver" / "bin" / "mlserver"))
KSERVE_PYTHON = Path(os.environ.get("RSGW_KSERVE_PYTHON", REPO / ".venv-kserve" / "bin" / "python"))
#: How long a server may take to serve its models (MLServer imports a lot).
START_SECONDS = 90.0
STARTS = 3


def available(kind: str) -> bool:
    return (MLSERVER if kind == "mlserver" else KSERVE_PYTHON).is_file()


def missing(kind: str) -> str:
    variable, path = (
        ("RSGW_MLSERVER", MLSERVER) if kind == "mlserver" else ("RSGW_KSERVE_PYTHON", KSERVE_PYTHON)
    )
    return f"{kind} is not installed at {path} (.ci/run makes it; or set {variable})"


@dataclass
class ServerProcess:
    """One running third-party server: its process, ports and log file."""

    kind: str
    process: subprocess.Popen[bytes]
    grpc_port: int
    log: Path

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def kill(self) -> None:
        """SIGKILL: a worker that dies without a word."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def start_server(kind: str, models: Sequence[str], workdir: Path) -> ServerProcess:
    """A server of `kind` ("mlserver" or "kserve") serving `models`, ready."""
    for attempt in range(STARTS):
        server = _launch(kind, models, workdir / f"{kind}-{attempt}")
        if _wait_ready(server, models):
            return server
        server.stop()
    raise RuntimeError(f"{kind} did not start; see {server.log}:\n{server.log.read_text()[-3000:]}")


def _launch(kind: str, models: Sequence[str], folder: Path) -> ServerProcess:
    folder.mkdir(parents=True, exist_ok=True)
    grpc_port, http_port, metrics_port = free_ports(3)
    log = folder / "server.log"
    env = {**os.environ, "MODELS": ",".join(models), "PYTHONUNBUFFERED": "1"}
    if kind == "mlserver":
        for model in models:
            home = folder / model
            home.mkdir(exist_ok=True)
            shutil.copy(MLSERVER_MODEL, home / "simple_model.py")
            settings = {"name": model, "implementation": "simple_model.SimpleModel"}
            (home / "model-settings.json").write_text(json.dumps(settings))
        server_settings = {
            "http_port": http_port,
            "grpc_port": grpc_port,
            "metrics_port": metrics_port,
            "parallel_workers": 0,
        }
        (folder / "settings.json").write_text(json.dumps(server_settings))
        argv = [str(MLSERVER), "start", str(folder)]
    else:
        argv = [
            str(KSERVE_PYTHON),
            str(HERE / "kserve_server.py"),
            "--grpc_port",
            str(grpc_port),
            "--http_port",
            str(http_port),
            "--workers",
            "1",
        ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=folder, env=env, start_new_session=True
        )
    return ServerProcess(kind, process, grpc_port, log)


def _wait_ready(server: ServerProcess, models: Sequence[str]) -> bool:
    """Whether `server` says each of `models` is ready before the start deadline."""
    deadline = time.monotonic() + START_SECONDS
    with grpc.insecure_channel(server.target) as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelReady",
            request_serializer=pb.ModelReadyRequest.SerializeToString,
            response_deserializer=pb.ModelReadyResponse.FromString,
        )
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                return False  # it died (a port taken meanwhile, say)
            try:
                if all(ready(pb.ModelReadyRequest(name=m), timeout=2).ready for m in models):
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    return False
