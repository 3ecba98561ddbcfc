"""`rsgw node --server triton` on this machine's CPU (issue 50, acceptance 1 and 2).

Real Triton 2.51 (nvidia-pytriton's `tritonserver`, Python backend; see
tests/thirdparty/triton.py, whose repository and backend helpers these reuse), one per
"GPU" (`--gpus 2`: CUDA_VISIBLE_DEVICES 0 and 1), the gateway in front under
lpt_packing, and stock tritonclient over gRPC and HTTP. What each Triton holds is read
from the Triton itself (RepositoryIndex). Every port is picked free; the node's own
lines say which. Skipped, saying why, where no Triton is installed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.scheduling.calls._routing import is_ready_state
from tests.helpers import wait_until
from tests.node.test_own_servers import environ, group_alive, serving
from tests.node.test_supervisor import STOP_SECONDS, NodeProcess, alive
from tests.thirdparty import triton

MODELS = tuple(f"m{i}" for i in range(6))
#: The replicated model: on both Tritons, so losing one fails none of its calls.
SHARED = "m0"
#: Two Tritons loading Python-backend stubs on two busy cores.
START_SECONDS = 240.0
RESTART_SECONDS = 120.0
#: Cold copies made by the first calls outlive `repository.min_residency_seconds` (10 s).
SETTLE_SECONDS = 60.0


def _write_node(directory: Path) -> Path:
    site = triton._site_packages()
    assert site is not None
    repository = triton.write_repository(
        directory / "models", [triton.TritonModel(m) for m in MODELS]
    )
    server = {
        "preset": "triton",
        "args": [f"--backend-directory={triton._backends(directory)}", "--exit-timeout-secs=2"],
        "env": {
            "PATH": f"{site / 'pytriton/tritonserver/bin'}:{triton.VENV / 'bin'}:"
            + os.environ.get("PATH", ""),
            "LD_LIBRARY_PATH": str(site / "nvidia_pytriton.libs"),
        },
        "startup_seconds": START_SECONDS,
    }
    return node_file(directory, repository, server)


def node_file(directory: Path, repository: Path, server: dict[str, object]) -> Path:
    """A node file for `server` on `repository`, every port picked free by the node."""
    raw = {
        "model_repo": str(repository),
        "base_port": 0,
        "http_base_port": 0,
        "metrics_base_port": 0,
        "server": server,
    }
    path = directory / "node.yml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """`rsgw node node.yml --gpus 2 --mode lpt_packing --config gateway.yml`: six models
    placed by the gateway, `m0` on every Triton."""
    if not triton.available():
        pytest.skip(triton.MISSING)
    directory = tmp_path_factory.mktemp("triton-node")
    path = _write_node(directory)
    gateway_yml = directory / "gateway.yml"
    gateway_yml.write_text(
        yaml.safe_dump({"scheduling": {"models": {SHARED: {"replicas": "all"}}}})
    )
    args = (str(path), "--gpus", "2", "--mode", "lpt_packing", "--config", str(gateway_yml))
    with serving(directory, *args, start_seconds=START_SECONDS) as process:
        yield process


def ready_on(port: int) -> set[str]:
    """What the server on `port` itself says is ready."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        index = channel.unary_unary(
            "/inference.GRPCInferenceService/RepositoryIndex",
            request_serializer=pb.RepositoryIndexRequest.SerializeToString,
            response_deserializer=pb.RepositoryIndexResponse.FromString,
        )
        reply = index(pb.RepositoryIndexRequest(ready=False), timeout=10)
    # Triton says READY, MLServer State.READY.
    return {m.name for m in reply.models if is_ready_state(m.state)}


def holdings(node: NodeProcess) -> dict[str, set[str]]:
    return {name: ready_on(w["grpc_port"]) for name, w in node.serving["workers"].items()}


def _inputs(module: Any, seed: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32)
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def infer_grpc(target: str, model: str, seed: int = 0) -> None:
    inputs, a, b = _inputs(grpcclient, seed)
    client = grpcclient.InferenceServerClient(target)
    try:
        result = client.infer(model, inputs, client_timeout=60)
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def infer_http(target: str, model: str, seed: int = 0) -> None:
    inputs, a, b = _inputs(httpclient, seed)
    client = httpclient.InferenceServerClient(target, network_timeout=60)
    try:
        result = client.infer(model, inputs)
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def model_ready(target: str, model: str) -> bool:
    client = grpcclient.InferenceServerClient(target)
    try:
        return bool(client.is_model_ready(model))
    except Exception:
        return False
    finally:
        client.close()


def served_by(port: int, model: str) -> int:
    """How many calls of `model` the Triton on `port` answered (its own statistics)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        stats = client.get_inference_statistics(model, as_json=True)
    finally:
        client.close()
    return sum(int(s.get("inference_count", 0)) for s in stats.get("model_stats", []))


# ---------------------------------------------------------------------------


def test_two_tritons_one_per_gpu_serve_every_model_where_placed(node: NodeProcess) -> None:
    """Acceptance 1."""
    workers = node.serving["workers"]
    assert sorted(workers) == ["gpu0", "gpu1"]
    for index, name in enumerate(("gpu0", "gpu1")):
        env = environ(workers[name]["pid"])
        assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == str(index)
        cmdline = Path(f"/proc/{workers[name]['pid']}/cmdline").read_bytes().split(b"\0")
        assert cmdline[0].endswith(b"tritonserver")
        assert b"--model-control-mode=explicit" in cmdline
    grpc_target = node.target
    http_target = f"127.0.0.1:{node.serving['http_port']}"
    # As a client (or a Kubernetes readiness probe) would: the gateway says when each
    # model is ready, once its start-up placement has loaded it.
    wait_until(
        lambda: all(model_ready(grpc_target, m) for m in MODELS),
        SETTLE_SECONDS,
        interval=0.5,
        what="every model ready through the gateway",
    )
    for seed, model in enumerate(MODELS):
        infer_grpc(grpc_target, model, seed)
        infer_http(http_target, model, seed)
    # Placed, not loaded everywhere: m0 on both Tritons, every other model on one. A
    # call may find its model cold and load it where it arrives; that copy is unloaded
    # once placement settles (after `repository.min_residency_seconds`, 10 s).

    def placed() -> bool:
        held = holdings(node)
        copies = {m: sum(m in models for models in held.values()) for m in MODELS}
        return copies == {m: 2 if m == SHARED else 1 for m in MODELS}

    wait_until(placed, SETTLE_SECONDS, interval=0.5, what="each model only where placed")
    log = node.log()
    assert "[gpu0] " in log and "[gpu1] " in log


def test_a_killed_triton_is_restarted_and_no_call_of_a_shared_model_fails(
    node: NodeProcess,
) -> None:
    """Acceptance 2: SIGKILL of one tritonserver under load; then Ctrl-C."""
    failures: list[BaseException] = []
    calls = [0]
    stop = threading.Event()

    def load(seed: int) -> None:
        while not stop.is_set():
            try:
                infer_grpc(node.target, SHARED, seed)
                calls[0] += 1
            except BaseException as exc:
                failures.append(exc)

    threads = [threading.Thread(target=load, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: calls[0] >= 10, 60, what="calls flowing")
        victim = node.pid("gpu0")
        port = node.serving["workers"]["gpu0"]["grpc_port"]
        os.kill(victim, signal.SIGKILL)  # the server dies without a word
        wait_until(
            lambda: len(node.events("worker ready", child="gpu0")) == 2,
            RESTART_SECONDS,
            interval=0.2,
            what="gpu0 restarted and ready",
        )
        assert not group_alive(victim)  # its stubs went with it
        # Back in routing: the gateway loads its placed model there again and sends calls.
        # It comes back empty; the node asks the gateway to place on it again.
        wait_until(
            lambda: SHARED in ready_on(port) and served_by(port, SHARED) > 0,
            RESTART_SECONDS,
            interval=0.5,
            what="the restarted Triton serving m0 again",
        )
        assert node.events("asked the gateway to repack: a worker came back", worker="gpu0")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures[:3]
    # Ctrl-C: every child and its process group gone within the grace, exit 0.
    pids = [node.serving["gateway_pid"], node.pid("gpu0"), node.pid("gpu1")]
    start = time.monotonic()
    os.killpg(node.process.pid, signal.SIGINT)
    assert node.process.wait(3 * STOP_SECONDS) == 0
    wait_until(
        lambda: not any(map(alive, pids)) and not any(map(group_alive, pids[1:])),
        3 * STOP_SECONDS - (time.monotonic() - start),
        what="every child gone",
    )
