"""The worker's KServe V2 data plane and its ControlService.

Each RPC is a typed handler over the worker's parts: the catalogue (what models
exist), the device (queues, weights and execution), the shared-memory registry,
and the metrics. ModelInfer validates everything it can before queueing, so a
bad request costs no device time and names its problem: the input, the expected
and the got. Control RPCs validate here and hand the device a command it runs
between batches (`_device.py`).

Clients see only routable models: a meta's internal sub-models are NOT_FOUND
to every RPC, as if they did not exist.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._version import __version__
from rsgw.base._errors import (
    FailedPrecondition,
    GrpcError,
    InvalidRequest,
    NotFound,
    RsgwError,
)
from rsgw.base._methods import Method
from rsgw.base._shm_access import check_access, may_see
from rsgw.base._status import StatusCode
from rsgw.grpc._metering import metered
from rsgw.grpc._typed import typed_unary
from rsgw.scheduling.calls._wire import stream_error, stream_reply
from rsgw.worker._control import ModelControl
from rsgw.worker._requests import RequestCodec, parameter_deadline, parse_infer_request
from rsgw.worker._sequences import sequence_key
from rsgw.worker._shm import ShmRegistry, regions_named, same_ipc_namespace
from rsgw.worker._stateful import StatefulModels
from rsgw.worker._triton import batches_first, model_config, model_statistics
from rsgw.worker.device._memory import not_resident
from rsgw.worker.models._compute import repeat_responses
from rsgw.worker.models._tensors import Tensor, rows

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterator

    from rsgw.base._call import CallContext, UnaryHandler
    from rsgw.grpc._metering import Meter
    from rsgw.grpc._streams import ServerStream, StreamHandler
    from rsgw.worker._metrics import WorkerMetrics
    from rsgw.worker._tracing import MeterFactory, WorkerTracer
    from rsgw.worker.device._batching import BatchSeen
    from rsgw.worker.device._device import Device
    from rsgw.worker.models._specs import ModelSpec


#: The model label of requests that name no model this worker serves.
UNKNOWN_MODEL = "_unknown_"
#: The KServe V2 / Triton extensions this worker implements, as ServerMetadata lists them.
EXTENSIONS = (
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_configuration",
    "model_repository",
    "system_shared_memory",
)


#: The request parameter asking a decoupled model for an empty final response.
_EMPTY_FINAL = "triton_enable_empty_final_response"


@dataclass(frozen=True, slots=True)
class _Job:
    """One ModelInfer request, checked and decoded, ready for the device."""

    spec: ModelSpec
    request: pb.ModelInferRequest
    inputs: dict[str, Tensor]
    variant: Hashable
    rows: int
    deadline: float
    #: Where a traced call's batches go (`rsgw.worker._tracing`), else None.
    seen: list[BatchSeen] | None = None


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """How this worker names itself in metrics and metadata."""

    name: str
    gpu: str


class WorkerService:
    """The handlers of one worker, bound to its parts."""

    def __init__(
        self,
        identity: WorkerIdentity,
        device: Device,
        shm: ShmRegistry,
        metrics: WorkerMetrics,
        *,
        max_concurrent_requests: int = 64,
        tracer: WorkerTracer | None = None,
    ) -> None:
        self.identity = identity
        #: The worker's spans, when it has a collector (else None: no cost on a call).
        self.tracer = tracer
        self.device = device
        self.catalogue = device.catalogue
        self.shm = shm
        self.metrics = metrics
        self.max_concurrent_requests = max_concurrent_requests
        self.inflight = 0
        #: Set when the worker begins to drain (see `ready`).
        self.draining = False
        self.shed_total = 0
        self.codec = RequestCodec(shm, device.catalogue.labels)
        self.stateful = StatefulModels(device)
        self.control = ModelControl(identity.name, device, on_unloaded=self.stateful.forget_model)
        #: What meters an inference call: traced, a meter that makes its span too
        #: (`rsgw.worker._tracing`); untraced, `Meter` itself, so no call is added.
        self._metered: MeterFactory = metered if tracer is None else tracer.meter

    def handlers(self) -> dict[str, UnaryHandler]:
        """The handler table: one row per method the worker serves."""
        table: dict[Method, UnaryHandler] = {
            Method.SERVER_LIVE: typed_unary(pb.ServerLiveRequest, self.server_live),
            Method.SERVER_READY: typed_unary(pb.ServerReadyRequest, self.server_ready),
            Method.MODEL_READY: typed_unary(pb.ModelReadyRequest, self.model_ready),
            Method.SERVER_METADATA: typed_unary(pb.ServerMetadataRequest, self.server_metadata),
            Method.MODEL_METADATA: typed_unary(pb.ModelMetadataRequest, self.model_metadata),
            Method.MODEL_CONFIG: typed_unary(pb.ModelConfigRequest, self.model_config),
            Method.MODEL_STATISTICS: typed_unary(pb.ModelStatisticsRequest, self.model_statistics),
            Method.REPOSITORY_INDEX: typed_unary(pb.RepositoryIndexRequest, self.repository_index),
            Method.MODEL_INFER: self.model_infer,
            Method.SHM_REGISTER: typed_unary(
                pb.SystemSharedMemoryRegisterRequest, self.shm_register
            ),
            Method.SHM_UNREGISTER: typed_unary(
                pb.SystemSharedMemoryUnregisterRequest, self.shm_unregister
            ),
            Method.SHM_STATUS: typed_unary(pb.SystemSharedMemoryStatusRequest, self.shm_status),
            Method.IPC_NAMESPACE: typed_unary(
                pb.IsSameIPCNamespaceRequest, self.is_same_ipc_namespace
            ),
            Method.CUDA_SHM_REGISTER: typed_unary(
                pb.CudaSharedMemoryRegisterRequest, self.cuda_shm_register
            ),
            Method.CUDA_SHM_UNREGISTER: typed_unary(
                pb.CudaSharedMemoryUnregisterRequest, self.cuda_shm_unregister
            ),
            Method.CUDA_SHM_STATUS: typed_unary(
                pb.CudaSharedMemoryStatusRequest, self.cuda_shm_status
            ),
            **self.control.handlers(),
        }
        return {method.path: handler for method, handler in table.items()}

    def stream_handlers(self) -> dict[str, StreamHandler]:
        """The streaming methods: Triton's ModelStreamInfer."""
        return {Method.MODEL_STREAM_INFER.path: self.model_stream_infer}

    # -- health and metadata ----------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Ready once at least one model is registered (every model is compiled at start).

        Not while draining: a stopping worker takes nothing new.
        """
        return not self.draining and bool(self.catalogue.models)

    async def server_live(self, _: pb.ServerLiveRequest, __: CallContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(
        self, _: pb.ServerReadyRequest, __: CallContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.ready)

    async def model_ready(
        self, request: pb.ModelReadyRequest, _: CallContext
    ) -> pb.ModelReadyResponse:
        spec = self.catalogue.route(request.name)
        return pb.ModelReadyResponse(
            ready=spec is not None and self.device.memory.is_servable(spec.name)
        )

    async def server_metadata(
        self, _: pb.ServerMetadataRequest, __: CallContext
    ) -> pb.ServerMetadataResponse:
        # "triton": a stand-in for a Triton server, named as one (clients check it);
        # the version is rsgw's own.
        return pb.ServerMetadataResponse(
            name="triton", version=__version__, extensions=list(EXTENSIONS)
        )

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, _: CallContext
    ) -> pb.ModelMetadataResponse:
        spec = self.device.model(request.name)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=spec.name,
            versions=[spec.version],
            platform=spec.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in spec.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in spec.outputs],
        )

    async def model_config(
        self, request: pb.ModelConfigRequest, _: CallContext
    ) -> pb.ModelConfigResponse:
        spec = self.device.model(request.name, request.version)
        return pb.ModelConfigResponse(config=model_config(spec, self.identity.gpu))

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, _: CallContext
    ) -> pb.ModelStatisticsResponse:
        """One model's statistics, or every routable model's when no name is given."""
        if request.name:
            specs: tuple[ModelSpec, ...] = (self.device.model(request.name, request.version),)
        else:
            unloaded = self.device.memory.unloaded
            specs = tuple(s for s in self.catalogue.routable if s.name not in unloaded)
        counters = self.device.counters
        gpu, catalogue = self.identity.gpu, self.catalogue
        return pb.ModelStatisticsResponse(
            model_stats=[
                model_statistics(
                    spec,
                    counters[spec.name],
                    gpu,
                    sum(sub.weight_bytes for sub in catalogue.submodels(spec)),
                )
                for spec in specs
            ]
        )

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, _: CallContext
    ) -> pb.RepositoryIndexResponse:
        # Every model is compiled at start. A self-managed worker loads on demand,
        # so all are READY; an externally managed one serves only what is pinned;
        # an unloaded model is UNAVAILABLE until loaded again.
        index = pb.RepositoryIndexResponse.ModelIndex
        response = pb.RepositoryIndexResponse()
        memory = self.device.memory
        for spec in self.catalogue.routable:
            ready = memory.is_servable(spec.name)
            if ready or not request.ready:
                reason = "unloaded" if spec.name in memory.unloaded else ""
                state = "READY" if ready else "UNAVAILABLE"
                response.models.append(
                    index(name=spec.name, version=spec.version, state=state, reason=reason)
                )
        return response

    # -- inference ----------------------------------------------------------------------

    async def model_infer(self, body: bytes, call: CallContext) -> bytes:
        """Validate, queue on the device, answer; counts every outcome in metrics."""
        with self._admitted(), self._metered(call, self._observe_infer, UNKNOWN_MODEL) as meter:
            job = self._prepare(body, call, meter)
            if job.spec.decoupled:
                raise GrpcError(
                    StatusCode.UNIMPLEMENTED,
                    "ModelInfer RPC doesn't support models with decoupled transaction policy",
                )
            outputs = await self._execute(job)
            return self.codec.encode_response(job.spec, job.request, outputs)

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        """Hold a place under `max_concurrent_requests`, or RESOURCE_EXHAUSTED (counted)."""
        if self.max_concurrent_requests and self.inflight >= self.max_concurrent_requests:
            self.shed_total += 1
            self.metrics.count_request(UNKNOWN_MODEL, StatusCode.RESOURCE_EXHAUSTED, 0.0)
            raise GrpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"worker {self.identity.name} is at its limit of "
                f"{self.max_concurrent_requests} concurrent requests",
            )
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1

    def _prepare(self, body: bytes, call: CallContext, meter: Meter) -> _Job:
        """Everything checked before the request may cost device time."""
        request = parse_infer_request(body)
        if not request.model_name:
            raise InvalidRequest("ModelInferRequest.model_name is empty")
        spec = self.device.model(request.model_name, request.model_version)
        meter.label = spec.name
        if not self.device.memory.is_servable(spec.name):
            raise not_resident(spec.name)
        if self.shm:
            for region in regions_named(request):
                self.shm.check_owner(region, call.owner)
        inputs, variant = self.codec.decode_inputs(spec, request)
        self.codec.check_requested_outputs(spec, request)
        batch_rows = 1
        if spec.batch_axis > 0 and spec.batch_input in inputs:
            batch_rows = rows(inputs[spec.batch_input].shape, spec.batch_axis)
            if batches_first(spec) and batch_rows > spec.max_batch_size:
                raise InvalidRequest(
                    f"inference request batch-size must be <= {spec.max_batch_size} "
                    f"for '{spec.name}'"
                )
        deadline = min(call.deadline, parameter_deadline(request, trio.current_time()))
        # A sampled call's meter (`TracedMeter`) collects the batches it runs in.
        seen = None if self.tracer is None else getattr(meter, "seen", None)
        return _Job(spec, request, inputs, variant, batch_rows, deadline, seen)

    async def _execute(self, job: _Job) -> tuple[Tensor, ...]:
        if job.spec.sequence is None:
            return await self.device.execute(
                job.spec,
                job.inputs,
                rows=job.rows,
                variant=job.variant,
                deadline=job.deadline,
                seen=job.seen,
            )
        return await self.stateful.execute(
            job.spec,
            job.request.parameters,
            job.inputs,
            rows=job.rows,
            variant=job.variant,
            deadline=job.deadline,
            seen=job.seen,
        )

    async def model_stream_infer(self, stream: ServerStream) -> None:
        """Triton's ModelStreamInfer: each request answered on the stream as it completes.

        Requests run concurrently (so they batch as unary calls do); a request that
        fails answers with its error message and the stream goes on, as Triton's does.
        The requests of one sequence run one after another in the order they came
        (their answers come back in that order too): each sequence gets its own queue.
        """
        queues: dict[tuple[str, int | str], deque[bytes]] = {}
        async with trio.open_nursery() as nursery:
            async for body in stream:
                key = sequence_key(body)
                if key is None:
                    nursery.start_soon(self._stream_one, stream, body)
                elif key in queues:
                    queues[key].append(body)
                else:
                    queues[key] = deque([body])
                    nursery.start_soon(self._stream_sequence, stream, key, queues)

    async def _stream_sequence(
        self,
        stream: ServerStream,
        key: tuple[str, int | str],
        queues: dict[tuple[str, int | str], deque[bytes]],
    ) -> None:
        queue = queues[key]
        while queue:
            await self._stream_one(stream, queue[0])
            queue.popleft()
        del queues[key]

    async def _stream_one(self, stream: ServerStream, body: bytes) -> None:
        """One streamed request: its answer (or answers, for a decoupled model), or its error.

        Every answer carries Triton's `triton_final_response` parameter, true on the
        one that completes the request.
        """
        try:
            with (
                self._admitted(),
                self._metered(stream.call, self._observe_infer, UNKNOWN_MODEL) as meter,
            ):
                job = self._prepare(body, stream.call, meter)
                if job.spec.decoupled:
                    await self._stream_decoupled(stream, job)
                    return
                outputs = await self._execute(job)
                reply = stream_reply(
                    self.codec.encode_response(job.spec, job.request, outputs, final=True)
                )
        except RsgwError as exc:
            reply = stream_error(exc.message)
        await stream.send(reply)

    async def _stream_decoupled(self, stream: ServerStream, job: _Job) -> None:
        """A decoupled request: one dispatch on the device, then its responses as timed.

        The completion itself is sent as an empty response only to a client that asked
        for it (`triton_enable_empty_final_response`), as Triton does.
        """
        await self._execute(job)
        repeats = repeat_responses(job.spec, job.inputs)
        for delay, outputs in repeats.responses:
            await trio.sleep(delay)
            encoded = self.codec.encode_response(job.spec, job.request, outputs, final=False)
            await stream.send(stream_reply(encoded))
        await trio.sleep(repeats.final_wait)
        parameters = job.request.parameters
        if _EMPTY_FINAL in parameters and parameters[_EMPTY_FINAL].bool_param:
            await stream.send(stream_reply(self.codec.final_response(job.spec, job.request)))

    def _observe_infer(
        self, code: StatusCode, model: str, seconds: float | None, protocol: str = "grpc"
    ) -> None:
        self.metrics.count_request(model, code, seconds or 0.0)
        counters = self.device.counters.get(model)
        if counters is not None:  # a served model (the label of anything else is _unknown_)
            if code is StatusCode.OK:
                count, total = counters.success
                counters.success = (count + 1, total + (seconds or 0.0))
            else:
                count, total = counters.fail
                counters.fail = (count + 1, total + (seconds or 0.0))
            counters.last_inference_ms = int(time.time() * 1000)

    # -- shared memory ------------------------------------------------------------------

    async def shm_register(
        self, request: pb.SystemSharedMemoryRegisterRequest, call: CallContext
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.shm.check_owner(request.name, call.owner)
        check_access(call.client, request.key)
        self.shm.register(request.name, request.key, request.offset, request.byte_size, call.owner)
        return pb.SystemSharedMemoryRegisterResponse()

    async def shm_unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, call: CallContext
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.shm.unregister(request.name, call.owner)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def shm_status(
        self, request: pb.SystemSharedMemoryStatusRequest, call: CallContext
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.shm.status(request.name, call.owner):
            entry = response.regions[region.name]
            entry.name = region.name
            entry.key = region.key
            entry.offset = region.offset
            entry.byte_size = region.byte_size
        return response

    async def cuda_shm_register(
        self, request: pb.CudaSharedMemoryRegisterRequest, _: CallContext
    ) -> pb.CudaSharedMemoryRegisterResponse:
        raise FailedPrecondition(
            f"failed to register CUDA shared memory region '{request.name}': "
            f"worker {self.identity.name} is a simulated GPU and has no CUDA; "
            "use system shared memory"
        )

    async def cuda_shm_unregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, _: CallContext
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        # No region can exist: unregistering one (or all) succeeds, as on Triton.
        return pb.CudaSharedMemoryUnregisterResponse()

    async def cuda_shm_status(
        self, request: pb.CudaSharedMemoryStatusRequest, _: CallContext
    ) -> pb.CudaSharedMemoryStatusResponse:
        if request.name:
            raise NotFound(f"unregistered CUDA shared memory region: {request.name}")
        return pb.CudaSharedMemoryStatusResponse()

    async def is_same_ipc_namespace(
        self, request: pb.IsSameIPCNamespaceRequest, call: CallContext
    ) -> pb.IsSameIPCNamespaceResponse:
        # Only about objects the client could register: no probing of what others have.
        same = may_see(call.client, request.name) and same_ipc_namespace(request.name)
        return pb.IsSameIPCNamespaceResponse(same=same)
