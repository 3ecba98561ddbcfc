"""NVIDIA's perf_analyzer against `rsgw worker` and through the gateway, in each of its
gRPC modes: synchronous, asynchronous, streaming, and with system shared memory; and
through the gateway's REST port (`-i http`; a worker has none) synchronous,
asynchronous and with system shared memory. Streaming runs at concurrency 1, 4 and
16, with a plain and a decoupled model, against `rsgw worker`, through the gateway in
front of rsgw workers, and through the gateway in front of a real Triton
(`tests/thirdparty/triton.py`).

perf_analyzer is Triton's own load generator (a C++ binary shipped in the
tritonclient 2.48.0 manylinux wheel; it needs Debian's libb64-0d, and loads libcudart
from the nvidia-cuda-runtime-cu12 wheel even when no GPU is used). `.ci/run` installs
it in `.venv-perf`; elsewhere point `RSGW_PERF_ANALYZER` at the binary, or these tests
are skipped.

Two of its modes found worker bugs: `--streaming` stalled after about 700 replies
(their acknowledgments were charged to the flood budget and the worker said GOAWAY),
and `--shared-memory system` crashed the client (a response whose every output went
to shared memory had no raw_output_contents placeholders, which its C++ client indexes
by output position).

`-i http --shared-memory system` found a REST bug: an output in shared memory was
written with the worker's `shared_memory_*` parameters, and the C++ HTTP client reads
`binary_data_size` from any output that has "parameters" ("attempt to access
non-existing object member 'binary_data_size'"); Triton writes such an output as its
name, datatype and shape only.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NamedTuple

import pytest
import trio

from rsgw import open_gateway
from rsgw.config._config import GatewayConfig, ListenConfig
from rsgw.worker._worker import WorkerConfig, open_worker
from tests.helpers import in_thread
from tests.thirdparty import triton

REPO = Path(__file__).resolve().parent.parent.parent
PERF_ANALYZER = Path(
    os.environ.get("RSGW_PERF_ANALYZER", REPO / ".venv-perf" / "bin" / "perf_analyzer")
)
MODES = {
    "sync": [],
    "async": ["--async"],
    "streaming": ["--streaming"],
    "system_shared_memory": ["--shared-memory", "system"],
}
#: Every run sends exactly this many requests, measured as one window: no search for a
#: stable throughput (three 500 ms windows within 10% of each other), which a busy CI
#: machine failed at concurrency 16 ("Failed to obtain stable measurement"); a busy
#: machine slows these runs but cannot fail them, and a stalled stream still does.
REQUESTS = 500
WINDOWS = ["--request-count", str(REQUESTS)]
HTTP_MODES = {
    "sync": [],
    "async": ["--async"],
    "system_shared_memory": ["--shared-memory", "system"],
}

pytestmark = pytest.mark.skipif(
    not PERF_ANALYZER.is_file(),
    reason=f"perf_analyzer is not installed at {PERF_ANALYZER} (.ci/run makes it; "
    "or set RSGW_PERF_ANALYZER)",
)


def _cuda_runtime() -> str:
    """Where the nvidia-cuda-runtime-cu12 wheel put libcudart, beside perf_analyzer."""
    venv = PERF_ANALYZER.parent.parent
    found = sorted(venv.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    return str(found[0]) if found else ""


def perf_analyzer(
    target: str, protocol: str, args: list[str], model: str = "simple"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": _cuda_runtime()}
    argv = [str(PERF_ANALYZER), "-m", model, "-u", target, "-i", protocol, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def assert_measured(run: subprocess.CompletedProcess[str], where: object) -> None:
    """perf_analyzer ended well and recorded a throughput (not "No valid requests")."""
    assert run.returncode == 0, (where, run.stdout[-1500:], run.stderr[-1500:])
    assert "throughput:" in run.stdout, (where, run.stdout[-1500:])
    assert "No valid requests" not in run.stdout, (where, run.stdout[-1500:])


class Node(NamedTuple):
    """Where perf_analyzer reaches a node: a worker, and the gateway's gRPC and REST ports."""

    worker: str
    grpc: str
    http: str


@asynccontextmanager
async def node() -> AsyncIterator[Node]:
    """Two workers and a gateway in front of them."""
    async with trio.open_nursery() as nursery:
        workers = [await nursery.start(serve_worker_on_port, i) for i in range(2)]
        async with gateway_before(f"127.0.0.1:{port}" for port in workers) as gateway:
            yield Node(f"127.0.0.1:{workers[0]}", *gateway)
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def gateway_before(workers: Iterable[str]) -> AsyncIterator[tuple[str, str]]:
    """A gateway in front of `workers`: its gRPC and REST addresses."""
    config = GatewayConfig(
        endpoints=tuple(workers),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
    )
    async with open_gateway(config) as gateway:
        yield f"127.0.0.1:{gateway.grpc_port}", f"127.0.0.1:{gateway.http_port}"


async def serve_worker_on_port(
    index: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    config = WorkerConfig(name=f"worker{index}", gpu=str(index), port=0, metrics_port=-1)
    async with open_worker(config) as worker:
        task_status.started(worker.grpc_port)
        await trio.sleep_forever()


@pytest.mark.parametrize("mode", list(MODES))
async def test_perf_analyzer_runs_against_a_worker_and_through_the_gateway(mode: str) -> None:
    async with node() as ends:
        for target in (ends.worker, ends.grpc):
            run = await in_thread(
                functools.partial(perf_analyzer, target, "grpc", [*MODES[mode], *WINDOWS])
            )
            assert_measured(run, target)


#: Streaming runs: several streams in flight at once, and a decoupled model (several
#: replies per request) beside a plain one. perf_analyzer's decoupled inputs: four
#: values, so four replies and a final flag per request, with no delays.
CONCURRENCIES = (1, 4, 16)
DECOUPLED_INPUTS = ["--input-data", "zero", "--shape", "IN:4", "--shape", "DELAY:4"]
DECOUPLED_INPUTS += ["--shape", "WAIT:1"]


def streaming(concurrency: int) -> list[str]:
    return ["--streaming", "--concurrency-range", f"{concurrency}:{concurrency}", *WINDOWS]


@pytest.mark.parametrize("decoupled", [False, True], ids=["simple", "decoupled"])
async def test_streaming_at_concurrency_against_workers_and_through_the_gateway(
    decoupled: bool,
) -> None:
    model, inputs = ("repeat_int32", DECOUPLED_INPUTS) if decoupled else ("simple", [])
    async with node() as ends:
        for target in (ends.worker, ends.grpc):
            for concurrency in CONCURRENCIES:
                args = [*streaming(concurrency), *inputs]
                run = await in_thread(functools.partial(perf_analyzer, target, "grpc", args, model))
                assert_measured(run, (target, concurrency))


@pytest.fixture(scope="module")
def real_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[triton.TritonProcess]:
    """One real Triton serving `simple` and the decoupled `repeat_int32`."""
    if not triton.available():
        pytest.skip(triton.MISSING)
    workdir = tmp_path_factory.mktemp("triton")
    models = [triton.TritonModel("simple"), triton.TritonModel("repeat_int32", "repeat")]
    server = triton.start_triton(triton.write_repository(workdir / "models", models), workdir)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("decoupled", [False, True], ids=["simple", "decoupled"])
async def test_streaming_at_concurrency_through_the_gateway_in_front_of_triton(
    real_triton: triton.TritonProcess, decoupled: bool
) -> None:
    model, inputs = ("repeat_int32", DECOUPLED_INPUTS) if decoupled else ("simple", [])
    async with gateway_before([real_triton.target]) as (grpc_target, _):
        for target in (real_triton.target, grpc_target):
            for concurrency in CONCURRENCIES:
                args = [*streaming(concurrency), *inputs]
                run = await in_thread(functools.partial(perf_analyzer, target, "grpc", args, model))
                assert_measured(run, (target, concurrency))


@pytest.mark.parametrize("mode", list(HTTP_MODES))
async def test_perf_analyzer_http_runs_through_the_gateway(mode: str) -> None:
    args = [*HTTP_MODES[mode], *WINDOWS]
    async with node() as ends:
        run = await in_thread(functools.partial(perf_analyzer, ends.http, "http", args))
    assert_measured(run, ends.http)
    assert f"Request count: {REQUESTS}\n" in run.stdout, run.stdout[-1500:]
