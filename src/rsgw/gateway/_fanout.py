"""The RPCs the gateway answers by asking every worker: shared memory, IPC, compaction.

Each is one fan-out (`rsgw.gateway._pool.fan_out`: every worker at once, each
result or its error) and a rule that turns the results into one answer:
- SystemSharedMemoryRegister: all or nothing; a partial success is rolled back;
- SystemSharedMemoryUnregister: succeeds if any worker succeeds (empty name = all);
- IsSameIPCNamespace: true only if every worker sees the client's region;
- CompactMemory: succeeds if any worker compacted; the answer sums their reloads.
While an SHM call runs on a worker, its register gate holds ModelInfer back
there (a region registered on some workers but not yet on this one must not be
used here). SHM calls count against the admission cap and are labelled
`model=""`: region names are the client's own and would make labels unbounded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import trio

from rsgw._errors import GrpcError
from rsgw._methods import Method
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw._status import StatusCode
from rsgw.gateway._pool import fan_out
from rsgw.grpc._metering import metered
from rsgw.scheduling._merge import merge_shm_status

if TYPE_CHECKING:
    from rsgw.gateway._metrics import GatewayMetrics
    from rsgw.gateway._pool import WorkerPool
    from rsgw.grpc._server import ServerCall

logger = logging.getLogger(__name__)

#: Deadline of IsSameIPCNamespace calls to workers.
IPC_DEADLINE = 5.0
#: CompactMemory may reload weights: at least this long (the original's 300 s floor).
COMPACT_MIN_DEADLINE = 300.0

Results = dict[str, bytes | Exception]


class FleetCalls:
    """The fan-out RPCs of one gateway; see the module docstring.

    `admitted(rpc)` holds a place under the admission cap for the call's duration
    (or raises RESOURCE_EXHAUSTED at the cap).
    """

    def __init__(
        self,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        admitted: Callable[[str], AbstractContextManager[object]],
        *,
        request_timeout: float,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self._admitted = admitted
        self.request_timeout = request_timeout

    # -- shared memory ------------------------------------------------------------------

    async def shm_register(self, body: bytes, call: ServerCall) -> bytes:
        """Register on every worker, or on none: partial success is rolled back."""
        rpc = Method.SHM_REGISTER.rpc
        with self._admitted(rpc), metered(call, self.metrics.observer(rpc)):
            name = _region_name(pb.SystemSharedMemoryRegisterRequest, body)
            if not name:
                raise GrpcError(
                    StatusCode.INVALID_ARGUMENT,
                    "SystemSharedMemoryRegisterRequest.name is empty",
                )
            results = await self._gated(Method.SHM_REGISTER, body, call.deadline)
            failed = _failed(results)
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
            return _first_reply(results)

    async def shm_unregister(self, body: bytes, call: ServerCall) -> bytes:
        """Unregister everywhere; succeeds if any worker succeeds (empty name = all)."""
        rpc = Method.SHM_UNREGISTER.rpc
        with self._admitted(rpc), metered(call, self.metrics.observer(rpc)):
            _region_name(pb.SystemSharedMemoryUnregisterRequest, body)
            results = await self._gated(Method.SHM_UNREGISTER, body, call.deadline)
            failed = _failed(results)
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
            return _first_reply(results)

    async def _gated(self, method: Method, body: bytes, client_deadline: float) -> Results:
        """The SHM fan-out, each worker's register gate closed while its call runs."""
        deadline = min(client_deadline, trio.current_time() + self.request_timeout)
        gate = self.pool.gate

        async def one(url: str) -> bytes:
            gate.begin(url)
            try:
                return await self.pool.channels[url].unary(method.wire, body, deadline=deadline)
            finally:
                gate.end(url)

        return await fan_out(self.pool.urls, one, self._observe_worker("SystemSharedMemory"))

    async def _roll_back(self, name: str, urls: list[str]) -> None:
        """Best effort: unregister a partially registered region where it succeeded."""
        if not urls:
            return
        body = pb.SystemSharedMemoryUnregisterRequest(name=name).SerializeToString()
        deadline = trio.current_time() + self.request_timeout
        results = await fan_out(urls, self._caller(Method.SHM_UNREGISTER, body, deadline))
        for url in _failed(results):
            logger.warning(
                "shm rollback failed",
                extra={"worker": self.pool.label(url), "error": str(results[url])},
            )

    async def shm_status(
        self, request: pb.SystemSharedMemoryStatusRequest, call: ServerCall
    ) -> pb.SystemSharedMemoryStatusResponse:
        """The regions registered through the gateway: those every worker reports alike."""
        method = Method.SHM_STATUS
        with metered(call, self.metrics.observer(method.rpc)):
            deadline = min(call.deadline, trio.current_time() + self.request_timeout)
            caller = self._caller(method, request.SerializeToString(), deadline)
            results = await fan_out(self.pool.urls, caller, self._observe_worker(method.rpc))
            answers = [
                pb.SystemSharedMemoryStatusResponse.FromString(reply)
                for url in self.pool.urls
                if isinstance(reply := results[url], bytes)
            ]
            if answers:
                return merge_shm_status(answers)
            first = results[self.pool.urls[0]]
            if isinstance(first, GrpcError):  # every worker said the same: no such region
                raise GrpcError(first.code, first.message)
            raise GrpcError(StatusCode.UNAVAILABLE, "no worker answered SystemSharedMemoryStatus")

    # -- answered by asking everyone ----------------------------------------------------

    async def is_same_ipc_namespace(
        self, request: pb.IsSameIPCNamespaceRequest, call: ServerCall
    ) -> pb.IsSameIPCNamespaceResponse:
        """True only if every worker sees the client's region (any may serve it later)."""
        with metered(call, self.metrics.observer(Method.IPC_NAMESPACE.rpc)):
            deadline = min(call.deadline, trio.current_time() + IPC_DEADLINE)
            caller = self._caller(Method.IPC_NAMESPACE, request.SerializeToString(), deadline)
            results = await fan_out(self.pool.urls, caller)
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
            return pb.IsSameIPCNamespaceResponse(same=same)

    async def compact_memory(
        self, request: cpb.CompactMemoryRequest, call: ServerCall
    ) -> cpb.CompactMemoryResponse:
        """Compact every worker; the answer sums the models they reloaded."""
        method = Method.COMPACT_MEMORY
        with metered(call, self.metrics.observer(method.rpc)):
            budget = max(self.request_timeout, COMPACT_MIN_DEADLINE)
            deadline = min(call.deadline, trio.current_time() + budget)
            caller = self._caller(method, request.SerializeToString(), deadline)
            results = await fan_out(self.pool.urls, caller, self._observe_worker(method.rpc))
            failed = _failed(results)
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
            return cpb.CompactMemoryResponse(reloaded_models=reloaded)

    def _caller(
        self, method: Method, body: bytes, deadline: float
    ) -> Callable[[str], Awaitable[bytes]]:
        async def call(url: str) -> bytes:
            return await self.pool.channels[url].unary(method.wire, body, deadline=deadline)

        return call

    def _observe_worker(self, rpc: str) -> Callable[[str, float], None]:
        return lambda url, seconds: self.metrics.observe_worker(rpc, url, seconds)


def _failed(results: Results) -> list[str]:
    return [url for url, result in results.items() if isinstance(result, Exception)]


def _first_reply(results: Results) -> bytes:
    return next((r for r in results.values() if isinstance(r, bytes)), b"")


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
