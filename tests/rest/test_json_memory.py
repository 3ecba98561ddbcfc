"""What large JSON infer bodies cost the gateway (issue 47): eight connections each
POST a 64 MiB JSON body at once to a real `rsgw run` in front of a real `rsgw worker`.

The gateway's peak resident memory (VmHWM) may grow by no more than its upload
budget plus 64 MB; a client calling meanwhile is served all along; each of the
eight gets its answer, or a 413 / 429 that names the binary tensor extension. Half
the bodies fit the model (`inception_graphdef`, FP32 [-1, 299, 299, 3]) and are
answered 200; half give their 16.6 million numbers as one flat dimension, which
the model's metadata refuses (400) before a number is read.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import WorkerProcess, start_rsgw_process, start_worker_process

MIB = 1024 * 1024
#: The gateway's upload budget (connections.max_buffered_bytes_total's default).
BUDGET = 256 * MIB
IMAGE = 299 * 299 * 3
IMAGES = 62  # 62 images of FP32 "1.5," take 63.4 MiB of JSON
MODEL = "inception_graphdef"

pytestmark = pytest.mark.slow


def _body(fits: bool) -> bytes:
    count = IMAGES * IMAGE
    shape = [IMAGES, 299, 299, 3] if fits else [count]
    head = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": shape, "data": [0]}]}
    ).encode()
    before, _, after = head.partition(b"[0]")
    data = b"[" + b",".join([b"1.5"] * count) + b"]"
    return before + data + after


def _memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in bytes."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def _post(port: int, body: bytes, timeout: float = 300) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", f"/v2/models/{MODEL}/infer", body)
        response = connection.getresponse()
        return response.status, response.read(2000).decode(errors="replace")
    finally:
        connection.close()


def _small(port: int) -> int:
    return _small_answer(port)[0]


def _small_answer(port: int) -> tuple[int, str]:
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
            ]
        }
    ).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/v2/models/simple/infer", body)
        response = connection.getresponse()
        return response.status, response.read(500).decode(errors="replace")
    finally:
        connection.close()


def _gateway(worker: WorkerProcess) -> tuple[WorkerProcess, int]:
    gateway = start_rsgw_process(
        "run",
        "--workers",
        worker.target,
        "--listen-grpc",
        "127.0.0.1:0",
        "--listen-metrics",
        "127.0.0.1:0",
        "--listen-http",
        "127.0.0.1:0",
        "--log-format",
        "json",
        event="gateway serving",
        # One worker takes every call: its admission forecast counts the large calls
        # uploading to it as work ahead of the small ones and would refuse those (429,
        # issue 38's rule); this test is about memory and the event loop, not that.
        env={**os.environ, "REACTANT_GATEWAY_GRPC_MAX_QUEUE_SECONDS": "60"},
    )
    serving = next(
        json.loads(line) for line in gateway.log().splitlines() if '"gateway serving"' in line
    )
    return gateway, int(serving["http_port"])


def test_eight_64_mib_json_bodies_at_once_stay_within_the_upload_budget() -> None:
    worker = start_worker_process("--time-scale", "0.01")
    gateway, port = _gateway(worker)
    try:
        assert _small(port) == 200
        bodies = [_body(fits=i % 2 == 0) for i in range(8)]
        assert all(len(body) > 63 * MIB for body in bodies)
        baseline, _ = _memory(gateway.process.pid)
        answers: list[tuple[int, str] | BaseException] = [ValueError("no answer")] * 8
        small_answers: list[int] = []
        done = threading.Event()

        def big(index: int) -> None:
            try:
                answers[index] = _post(port, bodies[index])
            except BaseException as exc:
                answers[index] = exc

        def meanwhile() -> None:
            while not done.is_set():
                started = time.monotonic()
                status, text = _small_answer(port)
                small_answers.append(status)
                if status != 200:
                    print("small call answered", status, text)
                assert time.monotonic() - started < 10  # never held up for long
                time.sleep(0.05)

        senders = [threading.Thread(target=big, args=(i,)) for i in range(8)]
        other = threading.Thread(target=meanwhile)
        other.start()
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(600)
        done.set()
        other.join(60)
        _, peak = _memory(gateway.process.pid)
    finally:
        gateway.stop()
        worker.stop()
    for index, answer in enumerate(answers):
        assert isinstance(answer, tuple), answer
        status, text = answer
        if status in (413, 429):
            assert "binary tensor data extension" in text, text
        elif index % 2 == 0:
            assert status == 200, (status, text)
            assert '"outputs"' in text, text
        else:
            assert status == 400, (status, text)
            assert "unexpected shape for input 'input'" in text, text
    assert small_answers and set(small_answers) == {200}, small_answers
    growth = peak - baseline
    print(f"peak RSS growth {growth / MIB:.0f} MiB over {baseline / MIB:.0f} MiB")
    assert growth <= BUDGET + 64 * MIB, f"grew {growth / MIB:.0f} MiB over {baseline / MIB:.0f}"
