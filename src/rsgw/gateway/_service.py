"""The gateway's RPCs: ModelInfer pass-through, SHM and CompactMemory fan-outs.

ModelInfer is the hot path. The body is never decoded: a varint walk reads the
model name, the scheduler picks an order of replicas, and the same bytes go to
the first of them; the worker's answer comes back byte for byte. Failover
(DECISIONS.md §3.5) moves on only where the request certainly did not run:
NOT_FOUND, UNAVAILABLE, RESOURCE_EXHAUSTED (a worker's admission shed), or a
connection refused or lost before any response. Any other worker status reaches
the client with its own code and the worker's message, from exactly one worker.

No per-request log lines, no per-request tasks: outcomes are counted in metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import trio

from rsgw._errors import DecodeError, GrpcError, ResponseInterrupted, WorkerUnavailable
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw._status import StatusCode
from rsgw.gateway._metrics import UNKNOWN_MODEL, GatewayMetrics
from rsgw.gateway._pool import WorkerPool, fan_out
from rsgw.gateway._prober import Prober
from rsgw.grpc._server import ServerCall, UnaryHandler
from rsgw.grpc._typed import typed_unary
from rsgw.scheduling._routing import RoutingTable
from rsgw.scheduling._schedulers import RoundRobinScheduler, Scheduler
from rsgw.scheduling._wire import peek_header

logger = logging.getLogger(__name__)

INFERENCE = "/inference.GRPCInferenceService/"
MODEL_INFER = b"/inference.GRPCInferenceService/ModelInfer"
SHM_REGISTER = b"/inference.GRPCInferenceService/SystemSharedMemoryRegister"
SHM_UNREGISTER = b"/inference.GRPCInferenceService/SystemSharedMemoryUnregister"
IPC_NAMESPACE = b"/inference.GRPCInferenceService/IsSameIPCNamespace"
COMPACT_MEMORY = b"/reactant_control.ControlService/CompactMemory"

#: Worker statuses after which the request certainly did not run, so another replica may.
FAILOVER_CODES = frozenset(
    {StatusCode.NOT_FOUND, StatusCode.UNAVAILABLE, StatusCode.RESOURCE_EXHAUSTED}
)
#: Failures after which the call stays on the scheduler's replicas: a worker's own
#: admission shed means it is busy, not gone, and spilling would move weights.
NO_SPILL_CODES = frozenset({StatusCode.RESOURCE_EXHAUSTED})
#: Worker statuses that blame the request itself, logged at debug only.
CLIENT_FAULT_CODES = frozenset(
    {
        StatusCode.INVALID_ARGUMENT,
        StatusCode.FAILED_PRECONDITION,
        StatusCode.OUT_OF_RANGE,
        StatusCode.ALREADY_EXISTS,
        StatusCode.PERMISSION_DENIED,
        StatusCode.UNAUTHENTICATED,
        StatusCode.CANCELLED,
        StatusCode.DEADLINE_EXCEEDED,
    }
)
#: Deadline of IsSameIPCNamespace calls to workers.
IPC_DEADLINE = 5.0
#: CompactMemory may reload weights: at least this long (the original's 300 s floor).
COMPACT_MIN_DEADLINE = 300.0


class GatewayService:
    """The handlers of one gateway, bound to its pool, prober and metrics."""

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        *,
        request_timeout: float = 60.0,
        max_concurrent_requests: int = 0,
        max_requests_per_worker: int = 0,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.pool = pool
        self.prober = prober
        self.metrics = metrics
        self.request_timeout = request_timeout
        self.max_concurrent_requests = max_concurrent_requests
        #: ModelInfer calls one worker may hold at once (sent or waiting for a stream).
        self.max_requests_per_worker = max_requests_per_worker
        self.inflight = 0
        #: worker URL -> ModelInfer calls held for it now.
        self.held: dict[str, int] = {}
        self.scheduler: Scheduler = scheduler or RoundRobinScheduler()
        metrics.max_concurrent.set(max_concurrent_requests)
        if max_concurrent_requests:
            metrics.track_inflight(lambda: self.inflight)

    def handlers(self) -> dict[str, UnaryHandler]:
        return {
            INFERENCE + "ModelInfer": self.model_infer,
            INFERENCE + "SystemSharedMemoryRegister": self.shm_register,
            INFERENCE + "SystemSharedMemoryUnregister": self.shm_unregister,
            INFERENCE + "IsSameIPCNamespace": typed_unary(
                pb.IsSameIPCNamespaceRequest, self.is_same_ipc_namespace
            ),
            "/reactant_control.ControlService/CompactMemory": typed_unary(
                cpb.CompactMemoryRequest, self.compact_memory
            ),
        }

    def on_table_swap(self, table: RoutingTable) -> None:
        self.scheduler.table_swapped(table)

    # -- admission ----------------------------------------------------------------------

    def _admit(self, rpc: str) -> None:
        cap = self.max_concurrent_requests
        if cap and self.inflight >= cap:
            self.metrics.shed.inc()
            self.metrics.observe(rpc, "", StatusCode.RESOURCE_EXHAUSTED, None)
            raise GrpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"gateway is at its limit of {cap} concurrent requests",
            )
        self.inflight += 1

    # -- ModelInfer ---------------------------------------------------------------------

    async def model_infer(self, body: bytes, call: ServerCall) -> bytes:
        self._admit("ModelInfer")
        started = time.perf_counter()
        label = ""
        code = StatusCode.UNKNOWN
        rejected = False  # refused before routing: counted, but no latency observed
        try:
            try:
                model, _ = peek_header(body)
            except DecodeError as exc:
                rejected = True
                raise GrpcError(
                    StatusCode.INVALID_ARGUMENT, f"malformed ModelInferRequest: {exc}"
                ) from exc
            if not model:
                rejected = True
                raise GrpcError(
                    StatusCode.INVALID_ARGUMENT, "ModelInferRequest.model_name is empty"
                )
            replicas = self.prober.table.replicas(model)
            if not replicas:
                await self.prober.refresh_now()
                replicas = self.prober.table.replicas(model)
            if not replicas:
                label = UNKNOWN_MODEL
                code = StatusCode.NOT_FOUND
                # Debug only: the name is client-chosen, and a storm of them must not
                # become a log storm.
                logger.debug("model not found on any worker", extra={"model": model[:200]})
                raise GrpcError(code, f'model "{model}" not found on any worker')
            label = model
            # Replicas holding their share are not offered to the scheduler, so its
            # choice (and the reservation it charges) is where the call really goes.
            free = self._free(replicas)
            try:
                order, reservation = (
                    self.scheduler.select(model, free, body) if free else ((), None)
                )
            except DecodeError as exc:  # the batch-extent walk met bad bytes
                rejected = True
                raise GrpcError(
                    StatusCode.INVALID_ARGUMENT, f"malformed ModelInferRequest: {exc}"
                ) from exc
            if not order:  # every replica the scheduler may use holds its share
                rejected = True
                raise self._shed(model)
            try:
                response = await self._forward(model, body, order, replicas, call.deadline)
            except _Shed:
                rejected = True
                raise
            finally:
                self.scheduler.release(reservation)
            code = StatusCode.OK
            return response
        except BaseException as exc:
            code = call.status_for(exc)
            raise
        finally:
            self.inflight -= 1
            seconds = None if rejected else time.perf_counter() - started
            self.metrics.observe("ModelInfer", label, code, seconds)

    def _free(self, replicas: tuple[str, ...]) -> tuple[str, ...]:
        """The replicas not holding their share of calls (all of them when uncapped)."""
        cap = self.max_requests_per_worker
        held = self.held
        if cap:
            for url in replicas:
                if held.get(url, 0) >= cap:  # rare: only then build a new tuple
                    return tuple(u for u in replicas if held.get(u, 0) < cap)
        return replicas

    def _shed(self, model: str) -> GrpcError:
        self.metrics.shed.inc()
        return _Shed(
            StatusCode.RESOURCE_EXHAUSTED,
            f'every replica of model "{model}" is at its limit of '
            f"{self.max_requests_per_worker} concurrent requests",
        )

    async def _forward(
        self,
        model: str,
        body: bytes,
        order: tuple[str, ...],
        replicas: tuple[str, ...],
        client_deadline: float,
    ) -> bytes:
        """Send `body` to the replicas in `order` until one answers; see module docstring.

        Each worker holds at most `max_requests_per_worker` calls (sent, or waiting for
        the register gate or a stream): one hot worker's backlog must not take the
        whole gateway's admission cap and starve the models of every other worker.
        `model_infer` offers the scheduler only replicas below their share; one that
        filled up since is passed over here, and if none is left the call is shed.
        Replicas outside `order` (discovered, but not chosen by the scheduler, e.g.
        outside lpt_packing's placement) are a last resort after a replica failed
        (unreachable or not serving the model), never after a worker's own admission
        shed, so a busy replica does not drag its model's weights onto another GPU.
        """
        deadline = min(client_deadline, trio.current_time() + self.request_timeout)
        pool = self.pool
        cap = self.max_requests_per_worker
        held = self.held
        last: GrpcError | None = None
        targets = order
        index = 0
        while True:
            if index == len(targets):
                if targets is not order or last is None or last.code in NO_SPILL_CODES:
                    break
                targets = order + tuple(u for u in replicas if u not in order)  # last resort
                if index == len(targets):
                    break
            url = targets[index]
            index += 1
            if cap and held.get(url, 0) >= cap:
                continue
            held[url] = held.get(url, 0) + 1  # before any wait: the gate queue counts too
            started = time.perf_counter()
            try:
                if pool.gate.closed(url):
                    await pool.gate.wait_open(url)
                if trio.current_time() >= deadline:
                    raise _gateway_deadline(model)
                return await pool.channels[url].unary(MODEL_INFER, body, deadline=deadline)
            except GrpcError as exc:
                if exc.code is StatusCode.DEADLINE_EXCEEDED and trio.current_time() >= deadline:
                    raise _gateway_deadline(model) from exc
                failed = GrpcError(exc.code, f"worker {url}: {exc.message}", exc.trailers)
                if exc.code not in FAILOVER_CODES:
                    # The request's own fault is the client's business (and a storm of bad
                    # requests must not become a log storm); the worker's fault is ours.
                    level = logging.DEBUG if exc.code in CLIENT_FAULT_CODES else logging.WARNING
                    logger.log(
                        level,
                        "worker error",
                        extra={"model": model, "worker": pool.label(url), "status": exc.code.name},
                    )
                    raise failed from exc
                if exc.code is StatusCode.NOT_FOUND:
                    self.prober.request_refresh()
                last = failed
            except ResponseInterrupted as exc:
                raise GrpcError(StatusCode.UNAVAILABLE, f"worker {url}: {exc}") from exc
            except WorkerUnavailable as exc:
                last = GrpcError(StatusCode.UNAVAILABLE, f"worker {url}: {exc}")
            finally:
                held[url] -= 1
                self.metrics.observe_worker("ModelInfer", url, time.perf_counter() - started)
        if last is None:  # nothing was tried: every chosen replica holds its share
            raise self._shed(model)
        logger.warning(
            "every replica failed",
            extra={"model": model, "replicas": len(targets), "status": last.code.name},
        )
        raise last

    # -- shared memory ------------------------------------------------------------------

    async def shm_register(self, body: bytes, call: ServerCall) -> bytes:
        """Register on every worker, or on none: partial success is rolled back."""
        rpc = "SystemSharedMemoryRegister"
        return await self._metered(rpc, call, lambda: self._register(body, call))

    async def shm_unregister(self, body: bytes, call: ServerCall) -> bytes:
        """Unregister everywhere; succeeds if any worker succeeds (empty name = all)."""
        rpc = "SystemSharedMemoryUnregister"
        return await self._metered(rpc, call, lambda: self._unregister(body, call))

    async def _metered(
        self, rpc: str, call: ServerCall, work: Callable[[], Awaitable[bytes]]
    ) -> bytes:
        """Admission and metrics around an SHM call (`model=""`: region names are the
        client's own and would make labels unbounded)."""
        self._admit(rpc)
        started = time.perf_counter()
        code = StatusCode.UNKNOWN
        try:
            response = await work()
            code = StatusCode.OK
            return response
        except BaseException as exc:
            code = call.status_for(exc)
            raise
        finally:
            self.inflight -= 1
            self.metrics.observe(rpc, "", code, time.perf_counter() - started)

    async def _register(self, body: bytes, call: ServerCall) -> bytes:
        name = _region_name(pb.SystemSharedMemoryRegisterRequest, body)
        if not name:
            raise GrpcError(
                StatusCode.INVALID_ARGUMENT, "SystemSharedMemoryRegisterRequest.name is empty"
            )
        results = await self._shm_fan_out(SHM_REGISTER, body, call.deadline)
        failed = [url for url, r in results.items() if isinstance(r, Exception)]
        if failed:
            succeeded = [url for url in results if url not in failed]
            await self._roll_back(name, succeeded)
            logger.warning(
                "shm register failed",
                extra={
                    "failed": [self.pool.label(u) for u in failed],
                    "rolled_back": len(succeeded),
                },
            )
            raise GrpcError(
                StatusCode.FAILED_PRECONDITION,
                f"SHM register failed on workers: [{', '.join(failed)}]: "
                + "; ".join(str(results[u]) for u in failed),
            )
        logger.info("shm region registered", extra={"workers": len(results)})
        return next((r for r in results.values() if isinstance(r, bytes)), b"")

    async def _unregister(self, body: bytes, call: ServerCall) -> bytes:
        _region_name(pb.SystemSharedMemoryUnregisterRequest, body)
        results = await self._shm_fan_out(SHM_UNREGISTER, body, call.deadline)
        failed = [url for url, r in results.items() if isinstance(r, Exception)]
        if failed and len(failed) == len(results):
            raise GrpcError(
                StatusCode.UNAVAILABLE,
                f"SHM unregister failed on all workers: [{', '.join(failed)}]",
            )
        if failed:
            logger.warning(
                "shm unregister failed on some workers",
                extra={"failed": [self.pool.label(u) for u in failed]},
            )
        return next((r for r in results.values() if isinstance(r, bytes)), b"")

    async def _shm_fan_out(
        self, path: bytes, body: bytes, client_deadline: float
    ) -> dict[str, bytes | Exception]:
        deadline = min(client_deadline, trio.current_time() + self.request_timeout)
        gate = self.pool.gate

        async def one(url: str) -> bytes:
            gate.begin(url)
            try:
                return await self.pool.channels[url].unary(path, body, deadline=deadline)
            finally:
                gate.end(url)

        return await fan_out(
            self.pool.urls,
            one,
            lambda url, s: self.metrics.observe_worker("SystemSharedMemory", url, s),
        )

    async def _roll_back(self, name: str, urls: list[str]) -> None:
        """Best effort: unregister a partially registered region where it succeeded."""
        if not urls:
            return
        body = pb.SystemSharedMemoryUnregisterRequest(name=name).SerializeToString()
        deadline = trio.current_time() + self.request_timeout
        results = await fan_out(
            urls, lambda url: self.pool.channels[url].unary(SHM_UNREGISTER, body, deadline=deadline)
        )
        for url, result in results.items():
            if isinstance(result, Exception):
                logger.warning(
                    "shm rollback failed",
                    extra={"worker": self.pool.label(url), "error": str(result)},
                )

    # -- fan-outs answered by the gateway ----------------------------------------------

    async def is_same_ipc_namespace(
        self, request: pb.IsSameIPCNamespaceRequest, call: ServerCall
    ) -> pb.IsSameIPCNamespaceResponse:
        """True only if every worker sees the client's region (any may serve it later)."""
        started = time.perf_counter()
        body = request.SerializeToString()
        deadline = min(call.deadline, trio.current_time() + IPC_DEADLINE)
        results = await fan_out(
            self.pool.urls,
            lambda url: self.pool.channels[url].unary(IPC_NAMESPACE, body, deadline=deadline),
        )
        same = bool(results)
        for url, result in results.items():
            if isinstance(result, Exception):
                logger.warning(
                    "IsSameIPCNamespace failed on a worker; counting it as false",
                    extra={"worker": self.pool.label(url), "error": str(result)},
                )
                same = False
            elif not pb.IsSameIPCNamespaceResponse.FromString(result).same:
                same = False
        self.metrics.observe("IsSameIPCNamespace", "", StatusCode.OK, time.perf_counter() - started)
        return pb.IsSameIPCNamespaceResponse(same=same)

    async def compact_memory(
        self, request: cpb.CompactMemoryRequest, call: ServerCall
    ) -> cpb.CompactMemoryResponse:
        """Compact every worker; the answer sums the models they reloaded."""
        started = time.perf_counter()
        body = request.SerializeToString()
        budget = max(self.request_timeout, COMPACT_MIN_DEADLINE)
        deadline = min(call.deadline, trio.current_time() + budget)
        code = StatusCode.UNKNOWN
        try:
            results = await fan_out(
                self.pool.urls,
                lambda url: self.pool.channels[url].unary(COMPACT_MEMORY, body, deadline=deadline),
                lambda url, s: self.metrics.observe_worker("CompactMemory", url, s),
            )
            failed = [url for url, r in results.items() if isinstance(r, Exception)]
            if failed and len(failed) == len(results):
                raise GrpcError(
                    StatusCode.UNAVAILABLE,
                    f"compaction failed on all workers: [{', '.join(failed)}]",
                )
            reloaded = sum(
                cpb.CompactMemoryResponse.FromString(r).reloaded_models
                for r in results.values()
                if isinstance(r, bytes)
            )
            code = StatusCode.OK
            return cpb.CompactMemoryResponse(reloaded_models=reloaded)
        except BaseException as exc:
            code = call.status_for(exc)
            raise
        finally:
            self.metrics.observe("CompactMemory", "", code, time.perf_counter() - started)


class _Shed(GrpcError):
    """A call shed because its replicas hold their share (no latency is observed)."""


def _gateway_deadline(model: str) -> GrpcError:
    return GrpcError(
        StatusCode.DEADLINE_EXCEEDED, f'deadline exceeded at gateway for model "{model}"'
    )


def _region_name(
    message: type[pb.SystemSharedMemoryRegisterRequest]
    | type[pb.SystemSharedMemoryUnregisterRequest],
    body: bytes,
) -> str:
    try:
        return message.FromString(body).name
    except Exception as exc:  # protobuf's DecodeError
        raise GrpcError(
            StatusCode.INVALID_ARGUMENT, f"malformed {message.DESCRIPTOR.name}: {exc}"
        ) from exc
