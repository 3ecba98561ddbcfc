"""Shared test helpers: a worker subprocess, raw gRPC calls, polling with a deadline.

Everything here drives real rsgw parts. The gRPC helpers use grpcio (a client
rsgw did not write) with identity serializers, so a test can send any bytes,
malformed ones included, and read the exact status and message the worker
answered. grpcio and tritonclient are blocking: call these helpers directly from
sync tests and through `in_thread` (trio.to_thread) from trio tests. The one
scripted part is `raw_h2_unary`, a bare HTTP/2 client for the one case real
clients cannot produce: a deadline that only the server enforces.

`import grpc` sorts with first-party imports: ruff's `src = ["src", "tests"]`
makes it take `tests/grpc/` for the grpcio package.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

import grpc
import h2.config
import h2.connection
import h2.events
import numpy as np
import trio
import yaml
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.worker.models._catalogue import builtin_catalogue, parse_catalogue
from rsgw.worker.models._specs import Catalogue

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import numpy.typing as npt

T = TypeVar("T")

INFERENCE = "/inference.GRPCInferenceService/"
MODEL_INFER = INFERENCE + "ModelInfer"
MODEL_CONTROL_STATUS = "/reactant_control.ControlService/ModelControlStatus"

#: How long a worker subprocess may take to log "worker serving" (a cold import
#: of trio, h2, hypercorn and protobuf takes about a second on a loaded CI box).
DEFAULT_START_SECONDS = 20.0
#: How long the `wait_until` helpers poll before they fail the test.
WAIT_SECONDS = 5.0
#: How long `stop()` waits after SIGTERM before it kills (the issue's 5 s).
DEFAULT_STOP_SECONDS = 5.0


# ---------------------------------------------------------------------------
# Polling with a deadline (never sleep-and-hope).


def wait_until(
    predicate: Callable[[], bool],
    timeout: float = WAIT_SECONDS,
    *,
    interval: float = 0.01,
    what: str = "condition",
) -> None:
    """Poll `predicate` until it is true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def wait_until_async(
    predicate: Callable[[], bool],
    seconds: float = WAIT_SECONDS,
    *,
    interval: float = 0.005,
    what: str = "condition",
) -> None:
    """The trio twin of `wait_until`: poll on the Trio clock; fail after `seconds`."""
    with trio.move_on_after(seconds):
        # Polling on purpose: what we wait for (a counter moved by a call that a
        # client thread sent) has no event to wait on.
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(interval)
        return
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


async def in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking client call in a worker thread (trio tests).

    The limiter is private to the call so that tests issuing many concurrent
    blocking calls are not capped by trio's default of 40 threads.
    """
    return await trio.to_thread.run_sync(fn, limiter=trio.CapacityLimiter(1))


# ---------------------------------------------------------------------------
# A worker subprocess (`rsgw worker`), as an operator runs it.


@dataclass
class WorkerProcess:
    """A running `rsgw worker` subprocess and the ports it reported."""

    process: subprocess.Popen[bytes]
    grpc_port: int
    metrics_port: int | None
    log_path: str
    args: tuple[str, ...] = field(default=())

    @property
    def target(self) -> str:
        """The gRPC target for grpcio and tritonclient."""
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        """Everything the worker wrote to stderr so far."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = DEFAULT_STOP_SECONDS) -> int:
        """SIGTERM, wait up to `timeout` seconds, then SIGKILL; returns the exit status.

        Idempotent; removes the log file.
        """
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout)
            return self.process.returncode
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.log_path)


def _serving_line(text: str, event: str) -> dict[str, object] | None:
    for line in text.splitlines():
        if f'"{event}"' not in line:
            continue
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("event") == event:
                return entry
    return None


def start_rsgw_process(
    *args: str,
    event: str,
    env: dict[str, str] | None = None,
    timeout: float = DEFAULT_START_SECONDS,
    prefix: Sequence[str] = (),
) -> WorkerProcess:
    """Start `python -m rsgw *args` and wait for its `event` log line ("worker serving").

    `prefix` runs it under another command (`prlimit --nofile=64:64 --`).

    Stderr goes to a file we poll, so the pipe can never fill up and block the
    process however long it runs. The ports come from the `event` line's
    `grpc_port` and `metrics_port`.

    Raises:
        AssertionError: the process exited, or did not serve within `timeout`;
            the message carries its log.
    """
    fd, log_path = tempfile.mkstemp(prefix="rsgw-process-", suffix=".log")
    cmd = [*prefix, sys.executable, "-m", "rsgw", *args]
    try:
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env)
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while True:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        entry = _serving_line(text, event)
        if entry is not None:
            grpc_port = entry["grpc_port"]
            metrics_port = entry["metrics_port"]
            assert isinstance(grpc_port, int)
            assert metrics_port is None or isinstance(metrics_port, int)
            return WorkerProcess(process, grpc_port, metrics_port, log_path, tuple(args))
        if process.poll() is not None or time.monotonic() >= deadline:
            WorkerProcess(process, 0, None, log_path).stop()
            state = f"exited with {process.returncode}" if process.returncode else "timed out"
            raise AssertionError(f"rsgw {' '.join(args)} {state}; its log:\n{text}")
        time.sleep(0.02)


def start_worker_process(
    *args: str, timeout: float = DEFAULT_START_SECONDS, prefix: Sequence[str] = ()
) -> WorkerProcess:
    """Start `python -m rsgw worker --port 0 --metrics-port 0 *args` and wait until it serves.

    Later flags win in argparse, so `args` may override either port.
    """
    process = start_rsgw_process(
        "worker",
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--log-format",
        "json",
        *args,
        event="worker serving",
        timeout=timeout,
        prefix=prefix,
    )
    process.args = tuple(args)
    return process


# ---------------------------------------------------------------------------
# Raw gRPC calls with grpcio.


def unary_call(
    target: str,
    path: str,
    body: bytes,
    *,
    timeout: float | None = 10.0,
) -> bytes:
    """One unary call with raw request and response bytes; raises `grpc.RpcError`."""
    with grpc.insecure_channel(target) as channel:
        method = channel.unary_unary(path)
        response = method(body, timeout=timeout)
    assert isinstance(response, bytes)
    return response


def model_infer(
    target: str, request: pb.ModelInferRequest, *, timeout: float | None = 10.0
) -> pb.ModelInferResponse:
    """ModelInfer through `unary_call`; raises `grpc.RpcError` on a non-OK status."""
    body = unary_call(target, MODEL_INFER, request.SerializeToString(), timeout=timeout)
    return pb.ModelInferResponse.FromString(body)


def model_control_status(target: str) -> cpb.ModelControlStatusResponse:
    """ReactantServer's ModelControlStatus, through grpcio's own (de)serializers."""
    with grpc.insecure_channel(target) as channel:
        method = channel.unary_unary(
            MODEL_CONTROL_STATUS,
            request_serializer=cpb.ModelControlStatusRequest.SerializeToString,
            response_deserializer=cpb.ModelControlStatusResponse.FromString,
        )
        response = method(cpb.ModelControlStatusRequest(), timeout=10.0)
    assert isinstance(response, cpb.ModelControlStatusResponse)
    return response


def model_status(target: str, model: str) -> cpb.ModelStatus:
    """The ModelControlStatus entry of one model."""
    for entry in model_control_status(target).models:
        if entry.name == model:
            return entry
    raise AssertionError(f"ModelControlStatus does not list model {model!r}")


# ---------------------------------------------------------------------------
# A bare HTTP/2 gRPC call, for what no real client can do on purpose.


@dataclass(frozen=True)
class RawReply:
    """How a server ended one call: its grpc-status, grpc-message and response messages."""

    status: int
    message: str
    messages: tuple[bytes, ...]
    #: Every response header and trailer, by name.
    fields: dict[str, str]
    #: Each response message's compressed flag.
    flags: tuple[int, ...]


async def raw_h2_unary(
    port: int,
    path: str,
    body: bytes,
    *,
    headers: Sequence[tuple[str, str]] = (),
    flag: int = 0,
) -> RawReply:
    """One gRPC call over a fresh h2 connection, with no client-side timer at all.

    grpcio (and rsgw's own client) enforce a deadline locally and reset the
    stream when it passes, so with them a test cannot tell whether the server
    enforced its `grpc-timeout` or the client gave up first. This client sends
    whatever `headers` say (a `grpc-timeout`, say) and then only listens, so the
    status it returns is the server's own verdict. Wrap it in `trio.fail_after`.
    `flag` is the request message's compressed flag (1: `body` is compressed in
    the encoding `headers` name), and no `grpc-accept-encoding` is sent.
    """
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        conn.initiate_connection()
        stream_id = conn.get_next_available_stream_id()
        request_headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", f"127.0.0.1:{port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *headers,
        ]
        conn.send_headers(stream_id, request_headers)
        prefix = flag.to_bytes(1, "big") + len(body).to_bytes(4, "big")
        conn.send_data(stream_id, prefix + body, end_stream=True)
        await stream.send_all(conn.data_to_send())
        fields: dict[str, str] = {}
        data = bytearray()
        ended = False
        while not ended:
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise AssertionError(f"connection closed before {path} ended")
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    # A trailers-only answer carries grpc-status in its headers.
                    fields.update((str(k), str(v)) for k, v in event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    raise AssertionError(f"server reset {path} with error {event.error_code!r}")
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
            await stream.send_all(conn.data_to_send())
    messages: list[bytes] = []
    flags: list[int] = []
    while data:
        size = int.from_bytes(data[1:5], "big")
        flags.append(data[0])
        messages.append(bytes(data[5 : 5 + size]))
        del data[: 5 + size]
    status = fields.get("grpc-status")
    assert status is not None, f"{path} ended without grpc-status: {fields}"
    message = unquote(fields.get("grpc-message", ""))
    return RawReply(int(status), message, tuple(messages), fields, tuple(flags))


# ---------------------------------------------------------------------------
# Building and reading ModelInfer messages.


def infer_request(
    model: str,
    inputs: Mapping[str, npt.NDArray[np.generic]],
    *,
    parameters: Mapping[str, int] | None = None,
    request_id: str = "",
) -> pb.ModelInferRequest:
    """A ModelInferRequest with every input in `raw_input_contents` (fixed-size types only).

    `parameters` become int64 request parameters (for `reactant_timeout_ns`).
    """
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, value in inputs.items():
        tensor = request.inputs.add(name=name, datatype=np_to_triton_dtype(value.dtype))
        tensor.shape.extend(value.shape)
        little_endian = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
        request.raw_input_contents.append(little_endian.tobytes())
    for key, number in (parameters or {}).items():
        request.parameters[key].int64_param = number
    return request


def output_array(response: pb.ModelInferResponse, name: str) -> npt.NDArray[np.generic]:
    """A fixed-size output of `response` as a numpy array, from `raw_output_contents`."""
    for i, out in enumerate(response.outputs):
        if out.name == name:
            dtype = np.dtype(triton_to_np_dtype(out.datatype)).newbyteorder("<")
            return np.frombuffer(response.raw_output_contents[i], dtype=dtype).reshape(
                tuple(out.shape)
            )
    raise AssertionError(f"response has no output {name!r}")


def simple_inputs(seed: int, rows: int = 1) -> dict[str, npt.NDArray[np.int32]]:
    """Random INT32 inputs for the built-in `simple` model ([rows, 16])."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(np.int32)
    return {
        name: rng.integers(info.min, info.max, size=(rows, 16), dtype=np.int32, endpoint=True)
        for name in ("INPUT0", "INPUT1")
    }


def check_simple(target: str, seed: int = 0, rows: int = 1) -> None:
    """A good `simple` call: the worker answers OK with the right sum and difference."""
    inputs = simple_inputs(seed, rows)
    response = model_infer(target, infer_request("simple", inputs))
    a, b = inputs["INPUT0"], inputs["INPUT1"]
    np.testing.assert_array_equal(output_array(response, "OUTPUT0"), a + b)
    np.testing.assert_array_equal(output_array(response, "OUTPUT1"), a - b)


# ---------------------------------------------------------------------------
# Residency samples (issue 49): what each worker held, sampled every half second.

#: (when, per worker the models it held then)
Samples = list[tuple[float, list[set[str]]]]


def early_evictions(
    samples: Samples, seconds: float, after: float, slack: float
) -> list[tuple[str, int, float]]:
    """(model, worker, seconds held) of each copy first seen later than `after` that was
    gone again sooner than `seconds` (less `slack`, what the sampling cannot resolve)."""
    seen: dict[tuple[str, int], float] = {}
    early = []
    for at, held in samples:
        for index, models in enumerate(held):
            for model in models:
                seen.setdefault((model, index), at)
            for (model, where), since in list(seen.items()):
                if where == index and model not in models:
                    del seen[(model, where)]
                    if since > after and at - since < seconds - slack:
                        early.append((model, index, at - since))
    return early


# ---------------------------------------------------------------------------
# Catalogues for in-process workers.


def simple_model(**overrides: Any) -> dict[str, Any]:
    """A catalogue entry shaped like the built-in `simple` (INT32 add and subtract)."""
    model: dict[str, Any] = {
        "name": "simple",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
        "max_batch_size": 8,
        "compute": "add_sub",
    }
    model.update(overrides)
    return model


def catalogue_from_yaml(text: str, *, with_builtin: bool = True) -> Catalogue:
    """A catalogue of the models in YAML `text`, plus the built-in ones if asked."""
    parsed = parse_catalogue(yaml.safe_load(text), source="test")
    models = parsed.models + (builtin_catalogue().models if with_builtin else ())
    return Catalogue(models)


def stream_simple(target: str, count: int) -> list[tuple[str, object]]:
    """`count` calls of `simple` on one tritonclient stream: (request id, error) per answer."""
    import queue

    import tritonclient.grpc as grpcclient

    results: queue.Queue[tuple[str, object]] = queue.Queue()
    client = grpcclient.InferenceServerClient(target)
    try:
        client.start_stream(
            callback=lambda result, error: results.put(
                (result.get_response().id if result else "", error)
            )
        )
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for i in range(count):
            inputs = [
                grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(a)
            client.async_stream_infer("simple", inputs, request_id=str(i))
        got = [results.get(timeout=10) for _ in range(count)]
        client.stop_stream()
        return got
    finally:
        client.close()


def client_inputs(kind: Any) -> list[Any]:
    """`simple`'s two inputs (0..15 each), as tritonclient's gRPC or HTTP `InferInput`s
    (`kind`: `tritonclient.grpc.InferInput` or `tritonclient.http.InferInput`)."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [kind("INPUT0", [1, 16], "INT32"), kind("INPUT1", [1, 16], "INT32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    return inputs
