"""Bad requests get a precise status and a message naming the problem (issue acceptance 6).

Each case runs against a real in-process worker over grpcio with raw bytes, so
we can send what no well-behaved client would (a malformed body, a slice past
a region's end) and read the exact status and details. After every failure a
good `simple` call must still succeed: a bad request costs its caller, never
the worker.
"""

from __future__ import annotations

import textwrap
import uuid
from functools import partial
from typing import TYPE_CHECKING

import grpc
import numpy as np
import pytest
import trio
import tritonclient.utils.shared_memory as shm

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.worker._worker import RunningWorker, WorkerConfig, open_worker
from tests.helpers import (
    INFERENCE,
    MODEL_INFER,
    catalogue_from_yaml,
    check_simple,
    in_thread,
    infer_request,
    model_infer,
    model_status,
    raw_h2_unary,
    simple_inputs,
    unary_call,
    wait_until_async,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

SLOW_LAUNCH_SECONDS = 0.3

CATALOGUE = catalogue_from_yaml(
    textwrap.dedent(
        f"""\
        models:
          - name: slow
            inputs:
              - {{name: INPUT0, datatype: INT32, shape: [-1, 4]}}
              - {{name: INPUT1, datatype: INT32, shape: [-1, 4]}}
            outputs:
              - {{name: OUTPUT0, datatype: INT32, shape: [-1, 4]}}
              - {{name: OUTPUT1, datatype: INT32, shape: [-1, 4]}}
            max_batch_size: 8
            launch_ms: {SLOW_LAUNCH_SECONDS * 1000}
            item_ms: 0
            compute: add_sub
        """
    )
)

Body = pb.ModelInferRequest | bytes


def _config(max_concurrent_requests: int = 64) -> WorkerConfig:
    return WorkerConfig(
        name="bad",
        gpu="3",
        port=0,
        metrics_port=-1,
        catalogue=CATALOGUE,
        max_concurrent_requests=max_concurrent_requests,
    )


@pytest.fixture
async def worker() -> AsyncIterator[RunningWorker]:
    async with open_worker(_config()) as running:
        yield running


def _target(worker: RunningWorker) -> str:
    return f"127.0.0.1:{worker.grpc_port}"


def _slow_request() -> pb.ModelInferRequest:
    ones = np.ones((1, 4), dtype=np.int32)
    return infer_request("slow", {"INPUT0": ones, "INPUT1": ones})


def _served(worker: RunningWorker, code: str, model: str = "slow") -> float:
    """How many ModelInfer calls the worker itself counted with status `code`."""
    value = worker.service.metrics.registry.get_sample_value(
        "worker_requests_total",
        {"worker": "bad", "gpu": "3", "model": model, "status": code},
    )
    return value or 0.0


async def _call(target: str, body: Body, *, grpc_timeout: float | None = 10.0) -> bytes:
    """ModelInfer with raw `body`; `grpc_timeout` is the client's deadline (grpc-timeout)."""
    raw = body if isinstance(body, bytes) else body.SerializeToString()
    return await in_thread(partial(unary_call, target, MODEL_INFER, raw, timeout=grpc_timeout))


async def _expect_error(
    target: str, body: Body, code: grpc.StatusCode, *, grpc_timeout: float | None = 10.0
) -> str:
    """Send `body`; assert the call fails with `code`; return the details."""
    with pytest.raises(grpc.RpcError) as info:
        await _call(target, body, grpc_timeout=grpc_timeout)
    error = info.value
    assert error.code() == code, error.details()
    details = error.details()
    assert isinstance(details, str)
    return details


async def _still_serving(target: str) -> None:
    await in_thread(partial(check_simple, target, 1, 2))


# ---------------------------------------------------------------------------
# Requests the worker rejects before queueing.


def _simple(**overrides: np.typing.NDArray[np.generic]) -> pb.ModelInferRequest:
    inputs: dict[str, np.typing.NDArray[np.generic]] = dict(simple_inputs(seed=2))
    inputs.update(overrides)
    return infer_request("simple", inputs)


def _missing_input1() -> pb.ModelInferRequest:
    request = _simple()
    del request.inputs[1]
    del request.raw_input_contents[1]
    return request


def _short_raw_contents() -> pb.ModelInferRequest:
    request = _simple()
    request.raw_input_contents[1] = request.raw_input_contents[1][:60]
    return request


def _unknown_output() -> pb.ModelInferRequest:
    request = _simple()
    request.outputs.add(name="OUTPUT9")
    return request


def _unexpected_input() -> pb.ModelInferRequest:
    return _simple(INPUT7=np.zeros((1, 16), dtype=np.int32))


CASES: list[tuple[str, Callable[[], Body], grpc.StatusCode, tuple[str, ...]]] = [
    (
        "unknown model",
        lambda: infer_request("no_such_model", simple_inputs(seed=1)),
        grpc.StatusCode.NOT_FOUND,
        ("no_such_model",),
    ),
    (
        "wrong datatype",
        lambda: _simple(INPUT0=np.zeros((1, 16), dtype=np.float32)),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("'INPUT0'", "INT32", "FP32"),
    ),
    (
        "wrong rank",
        lambda: _simple(INPUT1=np.zeros(16, dtype=np.int32)),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("'INPUT1'", "[-1,16]", "[16]"),
    ),
    (
        "wrong fixed dim",
        lambda: _simple(INPUT0=np.zeros((1, 8), dtype=np.int32)),
        grpc.StatusCode.INVALID_ARGUMENT,
        ("'INPUT0'", "[-1,16]", "[1,8]"),
    ),
    (
        "missing input",
        _missing_input1,
        grpc.StatusCode.INVALID_ARGUMENT,
        ("missing input 'INPUT1'", "simple"),
    ),
    (
        "unexpected input",
        _unexpected_input,
        grpc.StatusCode.INVALID_ARGUMENT,
        ("'INPUT7'",),
    ),
    (
        "raw contents too short",
        _short_raw_contents,
        grpc.StatusCode.INVALID_ARGUMENT,
        ("'INPUT1'", "expected 64 bytes", "got 60"),
    ),
    (
        "unknown requested output",
        _unknown_output,
        grpc.StatusCode.INVALID_ARGUMENT,
        ("'OUTPUT9'",),
    ),
    (
        "malformed protobuf",
        lambda: b"\x0a\xff\xff",
        grpc.StatusCode.INVALID_ARGUMENT,
        ("malformed ModelInferRequest",),
    ),
]


@pytest.mark.parametrize(
    ("make_body", "code", "needles"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
async def test_rejected_request(
    worker: RunningWorker,
    make_body: Callable[[], Body],
    code: grpc.StatusCode,
    needles: tuple[str, ...],
) -> None:
    target = _target(worker)
    details = await _expect_error(target, make_body(), code)
    for needle in needles:
        assert needle in details
    await _still_serving(target)


# ---------------------------------------------------------------------------
# Shared memory.


@pytest.fixture
def region() -> Iterator[tuple[str, str]]:
    """A 64-byte POSIX shm object; yields (region name, key); unlinked afterwards."""
    tag = uuid.uuid4().hex[:12]
    name, key = f"bad_{tag}", f"/rsgw_test_bad_{tag}"
    handle = shm.create_shared_memory_region(name, key, 64, create_only=True)
    try:
        yield name, key
    finally:
        shm.destroy_shared_memory_region(handle)


def _shm_simple(region: str, offset: int, byte_size: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_offset"].int64_param = offset
        tensor.parameters["shared_memory_byte_size"].int64_param = byte_size
    return request


async def test_unregistered_region(worker: RunningWorker) -> None:
    target = _target(worker)
    details = await _expect_error(
        target, _shm_simple("never_registered", 0, 64), grpc.StatusCode.FAILED_PRECONDITION
    )
    assert "never_registered" in details
    await _still_serving(target)


async def test_region_slice_out_of_bounds(worker: RunningWorker, region: tuple[str, str]) -> None:
    target = _target(worker)
    name, key = region
    register = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=64)
    await in_thread(
        partial(
            unary_call,
            target,
            INFERENCE + "SystemSharedMemoryRegister",
            register.SerializeToString(),
        )
    )
    details = await _expect_error(
        target, _shm_simple(name, 32, 64), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert name in details
    assert "exceeds" in details
    await _still_serving(target)


def _simple_with_output(name: str, region: str = "") -> pb.ModelInferRequest:
    request = _simple()
    output = request.outputs.add(name=name)
    if region:
        output.parameters["shared_memory_region"].string_param = region
        output.parameters["shared_memory_byte_size"].int64_param = 64
    return request


@pytest.mark.parametrize(
    ("request_", "code", "needle"),
    [
        pytest.param(
            _simple_with_output("OUTPUT9"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "'OUTPUT9'",
            id="unknown output",
        ),
        pytest.param(
            _simple_with_output("OUTPUT0", region="never_registered"),
            grpc.StatusCode.FAILED_PRECONDITION,
            "never_registered",
            id="unregistered output region",
        ),
    ],
)
async def test_bad_requested_output_costs_no_device_time(
    worker: RunningWorker, request_: pb.ModelInferRequest, code: grpc.StatusCode, needle: str
) -> None:
    target = _target(worker)
    details = await _expect_error(target, request_, code)
    assert needle in details
    # "ModelInfer validates everything it can before queueing, so a bad request
    # costs no device time" (the _service.py module docstring).
    assert worker.service.device.counters["simple"].dispatch_count == 0
    await _still_serving(target)


# ---------------------------------------------------------------------------
# Deadlines.


async def test_client_deadline_shorter_than_execution(worker: RunningWorker) -> None:
    target = _target(worker)
    await _expect_error(
        target, _slow_request(), grpc.StatusCode.DEADLINE_EXCEEDED, grpc_timeout=0.05
    )
    # The slow batch still occupies the device; the next call waits for it, then runs.
    await _still_serving(target)


async def test_worker_enforces_grpc_timeout(worker: RunningWorker) -> None:
    """The worker's own verdict: a client with no timer of its own still gets an answer.

    With grpcio, the client's timer and the worker's fire together, so the status
    above may be either's. Here only the worker can end the call.
    """
    started = trio.current_time()
    with trio.fail_after(5):
        reply = await raw_h2_unary(
            worker.grpc_port,
            MODEL_INFER,
            _slow_request().SerializeToString(),
            headers=[("grpc-timeout", "50m")],
        )
    elapsed = trio.current_time() - started
    assert reply.status == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert "deadline exceeded" in reply.message
    assert reply.messages == ()
    assert elapsed >= 0.05
    assert _served(worker, "DEADLINE_EXCEEDED") == 1
    assert worker.service.inflight == 0
    await _still_serving(_target(worker))


async def test_parameter_deadline_expires_in_queue(worker: RunningWorker) -> None:
    target = _target(worker)
    device = worker.service.device
    first: list[pb.ModelInferResponse] = []

    async def run_first() -> None:
        first.append(await in_thread(partial(model_infer, target, _slow_request())))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_first)
        # In flight with nothing queued: the dispatch loop took it, so it executes.
        await wait_until_async(
            lambda: worker.service.inflight == 1 and device.queue_depth("slow") == 0,
            what="the first slow request to start executing",
        )
        queued = _slow_request()
        queued.parameters["reactant_timeout_ns"].int64_param = 50_000_000  # 50 ms
        details = await _expect_error(target, queued, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert "deadline exceeded" in details
    assert "'slow'" in details
    assert len(first) == 1
    # The expired request never ran: only the first one was served.
    status = await in_thread(partial(model_status, target, "slow"))
    assert (status.requests_served, status.dispatch_count) == (1, 1)
    assert _served(worker, "DEADLINE_EXCEEDED") == 1
    await _still_serving(target)


# ---------------------------------------------------------------------------
# Admission control.


async def test_admission_cap_sheds_the_third_call() -> None:
    async with open_worker(_config(max_concurrent_requests=2)) as worker:
        target = _target(worker)
        done: list[pb.ModelInferResponse] = []

        async def run_slow() -> None:
            done.append(await in_thread(partial(model_infer, target, _slow_request())))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_slow)
            nursery.start_soon(run_slow)
            await wait_until_async(
                lambda: worker.service.inflight == 2, what="two slow calls in flight"
            )
            details = await _expect_error(
                target, _slow_request(), grpc.StatusCode.RESOURCE_EXHAUSTED
            )
        assert "limit of 2 concurrent requests" in details
        assert len(done) == 2
        assert worker.service.shed_total == 1
        await _still_serving(target)
