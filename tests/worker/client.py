"""rsgw's own gRPC client for the worker tests: an in-process worker on memory streams.

`open_memory_worker(config)` runs `open_worker` on a fresh `tests.memory.MemoryNetwork`
and hands back a `WorkerClient`: rsgw's `Channel` to that worker and async
equivalents of the grpcio helpers in tests/helpers.py.
Nothing here opens a socket, starts a thread or a process, so a test using it can
take the autojump clock (`autojump_clock: MockClock` among its arguments): the
simulated device's compute and weight loads are `trio.sleep` calls, which then
cost no wall time and keep their exact durations on `trio.current_time()`.

The worker runs without its admin HTTP server (that one needs real sockets);
`scrape` and `scrape_models` read the exposition the server would serve at
/metrics straight from the worker's registry (`WorkerMetrics.render`).

Calls raise what the channel raises: `GrpcError` with the worker's own status
code and message when it answered, `WorkerUnavailable` when it did not. Like the
grpcio helpers, every call has a 10 s deadline unless told otherwise
(`time_limit`, on the Trio clock), so a call that would hang fails instead,
at once in wall time.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

import numpy as np
import trio
from google.protobuf.message import Message
from prometheus_client.parser import text_string_to_metric_families

from rsgw._cli import worker_config
from rsgw._flags import build_parser
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.worker._worker import RunningWorker, WorkerConfig, open_worker
from rsgw.worker.device._device import Device
from tests.helpers import infer_request, output_array, simple_inputs
from tests.memory import MemoryNetwork

R = TypeVar("R", bound=Message)

#: Seconds (Trio clock) each call may take unless told otherwise (the grpcio helpers'
#: `timeout=10.0`); sent to the worker as the call's grpc-timeout, as grpcio sends it.
DEFAULT_TIME_LIMIT = 10.0
#: Calls one channel keeps in flight at once: enough for any flood in these tests.
MAX_CONCURRENT_STREAMS = 1000


class WorkerClient:
    """One in-process worker and rsgw's `Channel` to it; see the module docstring."""

    def __init__(self, worker: RunningWorker, channel: Channel, network: MemoryNetwork) -> None:
        self.worker = worker
        self.channel = channel
        self.network = network

    @property
    def device(self) -> Device:
        return self.worker.service.device

    # -- raw and typed calls ------------------------------------------------------------

    async def unary(
        self, method: Method, body: bytes, *, time_limit: float | None = DEFAULT_TIME_LIMIT
    ) -> bytes:
        """One call with raw bytes; raises the `RsgwError` it ended with."""
        deadline = math.inf if time_limit is None else trio.current_time() + time_limit
        return await self.channel.unary(method.wire, body, deadline=deadline)

    async def call(
        self,
        method: Method,
        request: Message,
        response_type: type[R],
        *,
        time_limit: float | None = DEFAULT_TIME_LIMIT,
    ) -> R:
        """One call with protobuf messages; raises the `RsgwError` it ended with."""
        body = await self.unary(method, request.SerializeToString(), time_limit=time_limit)
        return response_type.FromString(body)

    # -- inference ----------------------------------------------------------------------

    async def infer(
        self, request: pb.ModelInferRequest, *, time_limit: float | None = DEFAULT_TIME_LIMIT
    ) -> pb.ModelInferResponse:
        return await self.call(
            Method.MODEL_INFER, request, pb.ModelInferResponse, time_limit=time_limit
        )

    async def check_simple(self, seed: int = 0, rows: int = 1) -> None:
        """A good `simple` call: the worker answers OK with the right sum and difference."""
        inputs = simple_inputs(seed, rows)
        response = await self.infer(infer_request("simple", inputs))
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        np.testing.assert_array_equal(output_array(response, "OUTPUT0"), a + b)
        np.testing.assert_array_equal(output_array(response, "OUTPUT1"), a - b)

    # -- repository and metadata --------------------------------------------------------

    async def repository_index(self, *, ready: bool) -> list[tuple[str, str]]:
        """RepositoryIndex as (name, state) pairs."""
        request = pb.RepositoryIndexRequest(ready=ready)
        response = await self.call(Method.REPOSITORY_INDEX, request, pb.RepositoryIndexResponse)
        return [(m.name, m.state) for m in response.models]

    async def ready_names(self) -> list[str]:
        """The models RepositoryIndex(ready=true) lists."""
        return [name for name, _ in await self.repository_index(ready=True)]

    async def model_ready(self, model: str) -> bool:
        request = pb.ModelReadyRequest(name=model)
        return (await self.call(Method.MODEL_READY, request, pb.ModelReadyResponse)).ready

    async def model_metadata(self, model: str) -> pb.ModelMetadataResponse:
        request = pb.ModelMetadataRequest(name=model)
        return await self.call(Method.MODEL_METADATA, request, pb.ModelMetadataResponse)

    # -- ControlService -----------------------------------------------------------------

    async def control_status(self) -> cpb.ModelControlStatusResponse:
        return await self.call(
            Method.MODEL_CONTROL_STATUS,
            cpb.ModelControlStatusRequest(),
            cpb.ModelControlStatusResponse,
        )

    async def statuses(self) -> dict[str, cpb.ModelStatus]:
        """ModelControlStatus's entries by model name."""
        return {m.name: m for m in (await self.control_status()).models}

    async def model_status(self, model: str) -> cpb.ModelStatus:
        """The ModelControlStatus entry of one model."""
        for entry in (await self.control_status()).models:
            if entry.name == model:
                return entry
        raise AssertionError(f"ModelControlStatus does not list model {model!r}")

    async def resident(self) -> set[str]:
        """The models ModelControlStatus reports on the device."""
        return {m.name for m in (await self.control_status()).models if m.device_resident}

    async def set_residency(self, model: str, residency: int) -> int:
        """SetModelResidency; returns the residency the worker reports afterwards."""
        request = cpb.SetModelResidencyRequest(name=model, target=residency)  # type: ignore[arg-type]
        response = await self.call(
            Method.SET_MODEL_RESIDENCY, request, cpb.SetModelResidencyResponse
        )
        return int(response.residency)

    async def set_policy(self, model: str, weight: float, *, has_weight: bool = True) -> None:
        """SetModelPolicy: the model's fair weight (ignored unless `has_weight`)."""
        request = cpb.SetModelPolicyRequest(name=model, has_weight=has_weight, weight=weight)
        await self.call(Method.SET_MODEL_POLICY, request, cpb.SetModelPolicyResponse)

    async def compact(self, *reload: str) -> tuple[int, int]:
        """CompactMemory; returns (reloaded_models, resident_bytes_after)."""
        request = cpb.CompactMemoryRequest(reload_models=list(reload))
        response = await self.call(Method.COMPACT_MEMORY, request, cpb.CompactMemoryResponse)
        return response.reloaded_models, response.resident_bytes_after


@asynccontextmanager
async def open_memory_worker(
    config: WorkerConfig, *, network: MemoryNetwork | None = None
) -> AsyncIterator[WorkerClient]:
    """An in-process worker on memory streams and a client to it, for the block.

    Leaving the block stops the worker first (what is still queued fails, as at
    shutdown), then the client's connection.
    """
    assert config.metrics_port < 0, "no admin HTTP server on memory streams: metrics_port=-1"
    network = MemoryNetwork() if network is None else network
    async with trio.open_nursery() as connections:
        try:
            async with open_worker(config, network=network) as worker:
                channel = Channel(
                    f"{config.host}:{worker.grpc_port}",
                    connections,
                    network=network,
                    max_receive_message_bytes=config.max_message_bytes,
                    max_send_message_bytes=config.max_message_bytes,
                    max_concurrent_streams=MAX_CONCURRENT_STREAMS,
                )
                try:
                    yield WorkerClient(worker, channel, network)
                finally:
                    await channel.aclose()
        finally:
            connections.cancel_scope.cancel()


async def grpc_error(call: Awaitable[object]) -> tuple[StatusCode, str]:
    """Await `call`, which must end with a status the worker answered: its code and message."""
    try:
        await call
    except GrpcError as exc:
        return exc.code, exc.message
    raise AssertionError("the call succeeded; expected a gRPC error")


# ---------------------------------------------------------------------------
# The worker's /metrics, read from its registry.


def _exposition(worker: RunningWorker) -> str:
    return worker.service.metrics.render().decode()


def scrape(worker: RunningWorker) -> dict[str, float]:
    """The worker's /metrics as {sample name: value}, for the series without a model label."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(_exposition(worker)):
        for sample in family.samples:
            if "model" not in sample.labels:
                samples[sample.name] = sample.value
    return samples


def scrape_models(worker: RunningWorker, name: str) -> dict[str, float]:
    """One per-model series of the worker's /metrics as {model: value}."""
    return {
        sample.labels["model"]: sample.value
        for family in text_string_to_metric_families(_exposition(worker))
        for sample in family.samples
        if sample.name == name
    }


# ---------------------------------------------------------------------------
# The configuration `rsgw worker FLAGS` runs, without running a process.


def cli_worker_config(*flags: str) -> WorkerConfig:
    """The `WorkerConfig` that `rsgw worker FLAGS` serves, built by the CLI's own code."""
    return worker_config(build_parser().parse_args(["worker", *flags]))
