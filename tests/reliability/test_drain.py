"""SIGTERM drains: calls in flight finish, nothing new is taken, the stop is logged.

Real processes: `rsgw worker` with a slow model behind `rsgw run`, 200 calls in
flight through grpcio when the gateway gets SIGTERM. Every call must answer OK, the
listener must refuse new connections at once, readiness must turn false, and the
process must exit 0 having logged its start and end. In-process tests cover the
rest with the gateway's own API.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest

from rsgw._proto import grpc_predict_v2_pb2 as pb
from tests.helpers import (
    WorkerProcess,
    infer_request,
    start_rsgw_process,
    start_worker_process,
    wait_until,
)

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
SLOW_MODELS = textwrap.dedent(
    """\
    models:
      - name: slow
        inputs: [{name: x, datatype: INT32, shape: [-1, 2]}]
        outputs: [{name: y, datatype: INT32, shape: [-1, 2]}]
        max_batch_size: 64
        launch_ms: 800
    """
)
CALLS = 200


@pytest.fixture
def slow_worker() -> Iterator[WorkerProcess]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(SLOW_MODELS)
    try:
        worker = start_worker_process("--models", f.name, "--max-concurrent-requests", "0")
        try:
            yield worker
        finally:
            worker.stop()
    finally:
        os.unlink(f.name)


def _start_gateway(worker: WorkerProcess, **variables: str) -> WorkerProcess:
    """`rsgw run` in front of `worker` on loopback, with `REACTANT_GATEWAY_<variables>`."""
    env = dict(os.environ)
    env |= {
        "REACTANT_GATEWAY_WORKERS": worker.target,
        "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_METRICS": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_HTTP": "127.0.0.1:0",
    }
    env |= {f"REACTANT_GATEWAY_{name}": value for name, value in variables.items()}
    return start_rsgw_process("run", event="gateway serving", env=env)


#: Every call goes straight to the worker, and the drain outlasts them all.
UNCAPPED = {
    "GRPC_MAX_CONCURRENT_REQUESTS_PER_WORKER": "0",
    "WORKER_CLIENT_MAX_CONCURRENT_STREAMS": "256",
    "SHUTDOWN_GRACE_SECONDS": "30",
}


def _worker_inflight(worker: WorkerProcess) -> float:
    text = httpx.get(f"http://127.0.0.1:{worker.metrics_port}/metrics").text
    for line in text.splitlines():
        if line.startswith("worker_inflight_requests"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def _events(log: str) -> list[dict[str, object]]:
    found = []
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            found.append(entry)
    return found


def test_sigterm_with_200_calls_in_flight_loses_none(slow_worker: WorkerProcess) -> None:
    gateway = _start_gateway(slow_worker, **UNCAPPED)
    try:
        target = f"127.0.0.1:{gateway.grpc_port}"
        body = infer_request("slow", {"x": np.ones((1, 2), np.int32)}).SerializeToString()
        with grpc.insecure_channel(target) as channel:
            call = channel.unary_unary(MODEL_INFER)
            futures = [call.future(body, timeout=60) for _ in range(CALLS)]
            wait_until(lambda: _worker_inflight(slow_worker) == CALLS, what="all calls in flight")
            gateway.process.send_signal(signal.SIGTERM)
            admin = f"http://127.0.0.1:{gateway.metrics_port}/readyz"
            wait_until(lambda: _refused(gateway.grpc_port), what="the listener to close")
            assert httpx.get(admin).status_code == 503  # not ready while it drains
            replies = [pb.ModelInferResponse.FromString(f.result()) for f in futures]
        assert len(replies) == CALLS
        assert all(r.model_name == "slow" for r in replies)
        assert gateway.process.wait(30) == 0
        events = {e["event"]: e for e in _events(gateway.log())}
        assert events["gateway stopping"]["inflight"] == CALLS
        assert events["gateway stopped"]["calls_cut_short"] == 0
    finally:
        gateway.stop()


def test_sigterm_with_rest_and_grpc_calls_in_flight_loses_none(slow_worker: WorkerProcess) -> None:
    gateway = _start_gateway(slow_worker, **UNCAPPED)
    try:
        serving = next(e for e in _events(gateway.log()) if e.get("event") == "gateway serving")
        http_port = serving["http_port"]
        assert isinstance(http_port, int)
        tensor = {"name": "x", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}
        rest_body = {"inputs": [tensor]}
        grpc_body = infer_request("slow", {"x": np.ones((1, 2), np.int32)}).SerializeToString()
        half = CALLS // 2
        url = f"http://127.0.0.1:{http_port}/v2/models/slow/infer"
        with (
            grpc.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel,
            httpx.Client(limits=httpx.Limits(max_connections=half), timeout=60) as rest,
            ThreadPoolExecutor(half) as pool,
        ):
            call = channel.unary_unary(MODEL_INFER)
            grpc_calls = [call.future(grpc_body, timeout=60) for _ in range(half)]
            rest_calls = [pool.submit(rest.post, url, json=rest_body) for _ in range(half)]
            wait_until(lambda: _worker_inflight(slow_worker) == CALLS, what="all calls in flight")
            gateway.process.send_signal(signal.SIGTERM)
            wait_until(lambda: _refused(http_port), what="the REST listener to close")
            assert all(pb.ModelInferResponse.FromString(f.result()).model_name for f in grpc_calls)
            answers = [f.result() for f in rest_calls]
        assert [a.status_code for a in answers] == [200] * half
        assert {a.headers["connection"] for a in answers} == {"close"}
        assert all(a.json()["outputs"][0]["name"] == "y" for a in answers)
        assert gateway.process.wait(30) == 0
        events = {e["event"]: e for e in _events(gateway.log())}
        assert events["gateway stopped"]["calls_cut_short"] == 0
    finally:
        gateway.stop()


def test_a_second_sigterm_stops_at_once(slow_worker: WorkerProcess) -> None:
    gateway = _start_gateway(slow_worker)
    try:
        body = infer_request("slow", {"x": np.ones((1, 2), np.int32)}).SerializeToString()
        with grpc.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
            future = channel.unary_unary(MODEL_INFER).future(body, timeout=60)
            wait_until(lambda: _worker_inflight(slow_worker) == 1, what="the call in flight")
            gateway.process.send_signal(signal.SIGTERM)
            wait_until(lambda: "gateway stopping" in gateway.log(), what="the drain to start")
            gateway.process.send_signal(signal.SIGTERM)
            # At once, not after the drain's grace (30 s): exit 0 well within it.
            assert gateway.process.wait(10) == 0
            with pytest.raises(grpc.RpcError):
                future.result()
    finally:
        gateway.stop()


def test_worker_drains_on_sigterm(slow_worker: WorkerProcess) -> None:
    body = infer_request("slow", {"x": np.ones((1, 2), np.int32)}).SerializeToString()
    with grpc.insecure_channel(slow_worker.target) as channel:
        futures = [channel.unary_unary(MODEL_INFER).future(body, timeout=60) for _ in range(8)]
        wait_until(lambda: _worker_inflight(slow_worker) == 8, what="the calls in flight")
        slow_worker.process.send_signal(signal.SIGTERM)
        for future in futures:
            assert pb.ModelInferResponse.FromString(future.result()).model_name == "slow"
    assert slow_worker.process.wait(30) == 0
    assert "worker stopped" in slow_worker.log()
