"""Workers that come and go, as an operator changes them: real processes (issue 24).

Three `rsgw worker` processes and `rsgw run --config gateway.yml` in front of the
first two, under steady load from grpcio clients in threads. `rsgw ctl add-worker`
adds the third (with its metrics endpoint), gateway.yml loses the first and the
gateway gets SIGHUP, then `rsgw ctl remove-worker` takes the third away again. Not
one call may fail, and the merged /metrics must follow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from tests.helpers import (
    WorkerProcess,
    infer_request,
    simple_inputs,
    start_rsgw_process,
    start_worker_process,
    wait_until,
)

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
CLIENTS = 4


class Load:
    """Clients calling `simple` through the gateway until stopped; their failures."""

    def __init__(self, target: str) -> None:
        self.calls = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(target,)) for _ in range(CLIENTS)]
        for thread in self._threads:
            thread.start()

    def _run(self, target: str) -> None:
        body = infer_request("simple", simple_inputs(1)).SerializeToString()
        with grpc.insecure_channel(target) as channel:
            call = channel.unary_unary(MODEL_INFER)
            while not self._stop.is_set():
                try:
                    call(body, timeout=10)
                    self.calls += 1
                except grpc.RpcError as exc:
                    self.failures.append(f"{exc.code()}: {exc.details()}")

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def served(worker: WorkerProcess) -> float:
    text = httpx.get(f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("worker_requests_served_total{") and 'model="simple"' in line
    )


def ctl(gateway: WorkerProcess, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rsgw", "ctl", "--gateway", gateway.target, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started = [start_worker_process("--name", name) for name in ("gpu-a", "gpu-b", "gpu-c")]
    try:
        yield started
    finally:
        for worker in started:
            worker.stop()


def write_config(path: Path, workers: list[WorkerProcess]) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "endpoints": [w.target for w in workers],
                "metrics_endpoints": [f"127.0.0.1:{w.metrics_port}" for w in workers],
                "worker_names": [w.args[w.args.index("--name") + 1] for w in workers],
                "listen": {"grpc": "127.0.0.1:0", "metrics": "127.0.0.1:0", "http": "127.0.0.1:0"},
            }
        )
    )


def test_add_sighup_and_remove_under_load_fail_no_call(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    a, b, c = workers
    config = tmp_path / "gateway.yml"
    write_config(config, [a, b])
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTANT_")}
    env["REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS"] = "0.2"
    gateway = start_rsgw_process(
        "run", "--config", str(config), "--log-format", "json", event="gateway serving", env=env
    )
    load = Load(gateway.target)
    try:
        wait_until(lambda: load.calls > 50, what="load running")
        said = ctl(gateway, "add-worker", c.target, "--name", "gpu-c", "--metrics",
                   f"127.0.0.1:{c.metrics_port}")  # fmt: skip
        assert said == "added gpu-c; 3 workers"
        before = served(c)
        wait_until(lambda: served(c) > before + 20, what="gpu-c takes calls")

        write_config(config, [b])  # gpu-a leaves gateway.yml
        gateway.process.send_signal(signal.SIGHUP)
        wait_until(lambda: '"worker removed"' in gateway.log(), what="gpu-a drained")
        assert '"reload: gateway.yml applied"' in gateway.log()
        calls_a = served(a)
        wait_until(lambda: load.calls > 200, what="more calls")
        assert served(a) == calls_a, "gpu-a gets nothing after it left"

        metrics = httpx.get(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=10).text
        merged = [s for s in metrics.splitlines() if s.startswith("worker_requests_served")]
        assert any('worker="gpu-c"' in line for line in merged), "gpu-c's own series merged"
        assert 'worker="gpu-a"' not in metrics, "no series of a departed worker"

        said = ctl(gateway, "remove-worker", "gpu-c", "--drain-seconds", "5")
        assert said.startswith("removed gpu-c after ") and said.endswith("; 1 workers")
        calls = load.calls
        wait_until(lambda: load.calls > calls + 50, what="gpu-b serves alone")
        status = ctl(gateway, "status")
        assert "members: 1" in status and "gpu-b" in status
        assert "Traceback" not in gateway.log()
    finally:
        load.stop()
        gateway.stop()
    assert load.failures == []
