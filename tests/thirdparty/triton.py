"""A real Triton Inference Server for the tests: NVIDIA's `tritonserver` 2.51 from the
nvidia-pytriton wheel, on CPU, serving Python-backend models written here.

The wheel ships the server, its Python backend and a backend stub per Python
version; the stub is copied into a copy of the backend folder (Triton looks for it
there), the wheel's own libraries go on LD_LIBRARY_PATH, and the environment's
`bin` goes on PATH so the stub's Python has numpy. `.ci/run` makes the environment
(`.venv-triton` beside the repository's `.venv`); elsewhere point `RSGW_TRITON_VENV`
at a virtual environment with nvidia-pytriton and numpy, or the tests that need a
real Triton are skipped, saying so.

The models (`TritonModel`): `simple` (Triton's example: INPUT0 + INPUT1 and
INPUT0 - INPUT1, INT32 [16], batched up to 8) and `repeat` (Triton's decoupled
repeat backend: one response per element of IN, each DELAY[i] ms after the one
before, then WAIT ms, then the final flag), under any names. Every port is
loopback; they are chosen free just before the start, and a start that finds one
taken meanwhile is tried again with new ones.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rsgw._proto import grpc_predict_v2_pb2 as pb
from tests.thirdparty.servers import free_ports

REPO = Path(__file__).resolve().parent.parent.parent
VENV = Path(os.environ.get("RSGW_TRITON_VENV", REPO / ".venv-triton"))
#: Triton loads each Python-backend model in a stub process of its own: allow for many.
START_SECONDS = 120.0
STARTS = 3


def _site_packages() -> Path | None:
    found = sorted(VENV.glob("lib/python3*/site-packages/pytriton/tritonserver"))
    return found[0].parent.parent if found else None


def available() -> bool:
    site = _site_packages()
    return site is not None and (site / "pytriton/tritonserver/bin/tritonserver").is_file()


MISSING = (
    f"a real Triton is not installed in {VENV} (.ci/run makes it: nvidia-pytriton; "
    "or set RSGW_TRITON_VENV)"
)

_SIMPLE_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
dynamic_batching {{ }}
"""

_SIMPLE_MODEL = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils

LOAD_SECONDS = {load_seconds}


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(LOAD_SECONDS)

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [pb_utils.Tensor("OUTPUT0", (a + b).astype(np.int32)),
                       pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32))]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

_REPEAT_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] }},
  {{ name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
output [
  {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

_REPEAT_MODEL = """\
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            for index, value in enumerate(values):
                if index < len(delays) and delays[index]:
                    time.sleep(delays[index] / 1000)
                outputs = [pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                           pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32))]
                sender.send(pb_utils.InferenceResponse(outputs))
            if wait[0]:
                time.sleep(wait[0] / 1000)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@dataclass(frozen=True)
class TritonModel:
    """One Python-backend model of a test repository.

    Attributes:
        name: its name in the repository.
        kind: "simple" or "repeat" (decoupled); see the module docstring.
        load_seconds: how long its load takes (a `simple` sleeps in `initialize`).
    """

    name: str
    kind: str = "simple"
    load_seconds: float = 0.0


def write_repository(folder: Path, models: Iterable[TritonModel]) -> Path:
    """A Triton model repository holding `models`, under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for model in models:
        home = folder / model.name
        (home / "1").mkdir(parents=True, exist_ok=True)
        if model.kind == "simple":
            config = _SIMPLE_CONFIG.format(name=model.name)
            code = _SIMPLE_MODEL.format(load_seconds=model.load_seconds)
        elif model.kind == "repeat":
            config, code = _REPEAT_CONFIG.format(name=model.name), _REPEAT_MODEL
        else:
            raise ValueError(f"unknown model kind {model.kind!r}")
        (home / "config.pbtxt").write_text(config)
        (home / "1" / "model.py").write_text(code)
    return folder


def _backends(folder: Path) -> Path:
    """A copy of the wheel's Python backend with this Python's stub in it."""
    site = _site_packages()
    assert site is not None, MISSING
    server = site / "pytriton" / "tritonserver"
    target = folder / "backends"
    if not (target / "python" / "triton_python_backend_stub").is_file():
        shutil.copytree(server / "backends", target, dirs_exist_ok=True)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = server / "python_backend_stubs" / version / "triton_python_backend_stub"
        shutil.copy(stub, target / "python" / "triton_python_backend_stub")
    return target


@dataclass
class TritonProcess:
    """One running `tritonserver`: its process, ports and log."""

    process: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    metrics_port: int
    log: Path
    argv: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_target(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def metrics_target(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL the server and its stubs: a GPU process that dies without a word."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(ProcessLookupError):  # stubs left behind, if any
            os.killpg(self.process.pid, signal.SIGKILL)


def start_triton(
    repository: Path,
    workdir: Path,
    *,
    explicit: bool = False,
    load: Sequence[str] = (),
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> TritonProcess:
    """A `tritonserver` serving `repository`, ready (ServerReady) on loopback ports.

    With `explicit`, the model control mode is explicit and only `load` is loaded at
    start; otherwise every model of the repository is.
    """
    last: TritonProcess | None = None
    for attempt in range(STARTS):
        server = _launch(repository, workdir, attempt, explicit, load, extra, env or {})
        if _wait_ready(server):
            return server
        server.stop()
        last = server
    assert last is not None
    raise RuntimeError(f"tritonserver did not start; see {last.log}:\n{last.log_tail()}")


def _launch(
    repository: Path,
    workdir: Path,
    attempt: int,
    explicit: bool,
    load: Sequence[str],
    extra: Sequence[str],
    env: dict[str, str],
) -> TritonProcess:
    site = _site_packages()
    assert site is not None, MISSING
    workdir.mkdir(parents=True, exist_ok=True)
    grpc_port, http_port, metrics_port = free_ports(3)
    argv = [
        str(site / "pytriton" / "tritonserver" / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={_backends(workdir)}",
        "--grpc-address=127.0.0.1",
        "--http-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        f"--http-port={http_port}",
        f"--metrics-port={metrics_port}",
        "--exit-timeout-secs=5",
    ]
    if explicit:
        argv.append("--model-control-mode=explicit")
        argv += [f"--load-model={name}" for name in load]
    argv += list(extra)
    environment = {
        **os.environ,
        "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '')}",
        "LD_LIBRARY_PATH": str(site / "nvidia_pytriton.libs"),
        **env,
    }
    log = workdir / f"tritonserver-{attempt}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=environment,
            start_new_session=True,
        )
    return TritonProcess(process, grpc_port, http_port, metrics_port, log, argv)


def _wait_ready(server: TritonProcess) -> bool:
    """Whether `server` says it is ready before the start deadline."""
    deadline = time.monotonic() + START_SECONDS
    with grpc.insecure_channel(server.target) as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerReady",
            request_serializer=pb.ServerReadyRequest.SerializeToString,
            response_deserializer=pb.ServerReadyResponse.FromString,
        )
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                return False  # it died (a port taken meanwhile, say)
            try:
                if ready(pb.ServerReadyRequest(), timeout=2).ready:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    return False
