"""The RPCs the gateway answers by asking every worker (or every holder of a model).

Each is one fan-out (`rsgw.gateway._pool.fan_out`: the workers at once, each result
or its error) and one of two rules:
- **all or nothing** (SystemSharedMemoryRegister, CudaSharedMemoryRegister,
  RepositoryModelLoad): every worker must succeed; where some did and others did
  not, the ones that did are undone (unregister, unload) and the call fails with
  FAILED_PRECONDITION naming the workers that failed and why;
- **any succeeds** (the Unregisters, RepositoryModelUnload, CompactMemory): the call
  succeeds if one worker did; only if every worker failed does it fail.
When every worker failed with the same status (a key that does not exist, a model
no worker knows), the call fails with that status: it is the client's answer, and
more precise than the original's FAILED_PRECONDITION for every failure.
Statuses merge (the regions every worker reports alike, `rsgw.scheduling._merge`);
IsSameIPCNamespace is true only if every worker says so; CompactMemory sums the
models reloaded.

While an SHM call runs on a worker its register gate holds ModelInfer back there (a
region registered on some workers but not yet on this one must not be used). SHM
calls count against the admission cap and are labelled `model=""`: region names
are the client's own and would make labels unbounded. Workers are named in what the
client reads, never addressed.

Model control goes to the workers that should hold the model: the ones its
lpt_packing placement names, every worker in the other modes (`holders`); the
call answers once the routing table agrees (the prober rediscovers first).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import trio

from rsgw._errors import GrpcError, RsgwError, WorkerUnavailable, shown
from rsgw._logging import log_limited
from rsgw._methods import Method
from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw._shm_access import check_access, held_open, may_see, not_yours
from rsgw._status import StatusCode
from rsgw.gateway._pool import fan_out
from rsgw.gateway._regions import UNREGISTER_OF
from rsgw.grpc._metering import metered
from rsgw.grpc._typed import typed_unary
from rsgw.scheduling._merge import ShmStatus, merge_shm_status

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from rsgw._blocks import ShmConfig
    from rsgw._call import CallContext, UnaryHandler
    from rsgw.gateway._metrics import GatewayMetrics
    from rsgw.gateway._pool import WorkerPool
    from rsgw.gateway._prober import Prober

logger = logging.getLogger(__name__)

#: Deadline of IsSameIPCNamespace calls to workers.
IPC_DEADLINE = 5.0
#: CompactMemory and model loads may move weights: at least this long (the original's
#: 300 s floor for compaction).
SLOW_MIN_DEADLINE = 300.0

Results = dict[str, bytes | Exception]


class FleetCalls:
    """The fan-out RPCs of one gateway; see the module docstring.

    Args:
        admitted: holds a place under the admission cap for a call's duration (or
            raises RESOURCE_EXHAUSTED at the cap); SHM calls take one.
        holders: the workers that should hold a model (for model control).
    """

    def __init__(
        self,
        pool: WorkerPool,
        prober: Prober,
        metrics: GatewayMetrics,
        admitted: Callable[[str], AbstractContextManager[object]],
        holders: Callable[[str], tuple[str, ...]],
        *,
        request_timeout: float,
        shm: ShmConfig,
    ) -> None:
        self.pool = pool
        self.shm = shm
        self.prober = prober
        self.metrics = metrics
        self._admitted = admitted
        self._holders = holders
        self.request_timeout = request_timeout

    def handlers(self) -> dict[Method, UnaryHandler]:
        """The handler table of the fan-out RPCs."""
        return {
            Method.SHM_REGISTER: self._shm(
                Method.SHM_REGISTER, pb.SystemSharedMemoryRegisterRequest, Method.SHM_UNREGISTER
            ),
            Method.SHM_UNREGISTER: self._shm(
                Method.SHM_UNREGISTER, pb.SystemSharedMemoryUnregisterRequest, None
            ),
            Method.SHM_STATUS: self._status(Method.SHM_STATUS, pb.SystemSharedMemoryStatusResponse),
            Method.CUDA_SHM_REGISTER: self._shm(
                Method.CUDA_SHM_REGISTER,
                pb.CudaSharedMemoryRegisterRequest,
                Method.CUDA_SHM_UNREGISTER,
            ),
            Method.CUDA_SHM_UNREGISTER: self._shm(
                Method.CUDA_SHM_UNREGISTER, pb.CudaSharedMemoryUnregisterRequest, None
            ),
            Method.CUDA_SHM_STATUS: self._status(
                Method.CUDA_SHM_STATUS, pb.CudaSharedMemoryStatusResponse
            ),
            Method.REPOSITORY_MODEL_LOAD: typed_unary(
                pb.RepositoryModelLoadRequest, self.model_load
            ),
            Method.REPOSITORY_MODEL_UNLOAD: typed_unary(
                pb.RepositoryModelUnloadRequest, self.model_unload
            ),
            Method.IPC_NAMESPACE: typed_unary(
                pb.IsSameIPCNamespaceRequest, self.is_same_ipc_namespace
            ),
            Method.COMPACT_MEMORY: typed_unary(cpb.CompactMemoryRequest, self.compact_memory),
        }

    # -- the two rules ----------------------------------------------------------------------

    async def all_or_nothing(
        self,
        method: Method,
        body: bytes,
        urls: Sequence[str],
        deadline: float,
        undo: Callable[[list[str]], Awaitable[None]],
        *,
        gated: bool = False,
        unreachable_later: bool = False,
    ) -> bytes:
        """Every worker in `urls` succeeds, or the ones that did are undone and we fail.

        With `unreachable_later`, a worker that cannot be reached is not a failure
        (it will be told when it is back: see `rsgw.gateway._regions`), as long as
        one worker succeeded.
        """
        results = await self._ask(method, body, urls, deadline, gated=gated)
        failed = [url for url in urls if isinstance(results[url], Exception)]
        if unreachable_later and len(failed) < len(urls):
            failed = [url for url in failed if not isinstance(results[url], WorkerUnavailable)]
        if not failed:
            return _first_reply(results)
        succeeded = [url for url in urls if url not in failed]
        await undo(succeeded)
        code = StatusCode.FAILED_PRECONDITION
        if not succeeded:
            code = _common_code([results[url] for url in failed]) or code
        log_limited(
            logger,
            logging.WARNING,
            "fan-out failed; undone where it succeeded",
            {
                "rpc": method.rpc,
                "failed": [self.pool.label(u) for u in failed],
                "undone": len(succeeded),
            },
            method.rpc,
        )
        raise GrpcError(
            code,
            f"{method.rpc} failed on {len(failed)} of {len(urls)} workers "
            f"({self._why(failed, results)})",
        )

    async def any_succeeds(
        self, method: Method, body: bytes, urls: Sequence[str], deadline: float, *, gated: bool
    ) -> bytes:
        """One worker's success is the call's; it fails only if every worker did."""
        results = await self._ask(method, body, urls, deadline, gated=gated)
        failed = [url for url in urls if isinstance(results[url], Exception)]
        if failed and len(failed) == len(urls):
            code = _common_code([results[url] for url in failed]) or StatusCode.UNAVAILABLE
            raise GrpcError(
                code, f"{method.rpc} failed on every worker ({self._why(failed, results)})"
            )
        if failed:
            log_limited(
                logger,
                logging.WARNING,
                "fan-out failed on some workers",
                {"rpc": method.rpc, "failed": [self.pool.label(u) for u in failed]},
                method.rpc,
            )
        return _first_reply(results)

    async def _ask(
        self, method: Method, body: bytes, urls: Sequence[str], deadline: float, *, gated: bool
    ) -> Results:
        """The fan-out; with `gated`, each worker's register gate is closed meanwhile."""
        gate = self.pool.gate

        async def one(url: str) -> bytes:
            if gated:
                gate.begin(url)
            try:
                return await self.pool.channels[url].unary(method.wire, body, deadline=deadline)
            finally:
                if gated:
                    gate.end(url)

        return await fan_out(urls, one, self._observe_worker(method.rpc))

    def _why(self, urls: Sequence[str], results: Results) -> str:
        """What went wrong on each worker, in words a client may read (no addresses)."""
        reasons = []
        for url in urls:
            error = results[url]
            text = (
                "unavailable"
                if isinstance(error, WorkerUnavailable) or not isinstance(error, RsgwError)
                else error.message
            )
            reasons.append(f"{self.pool.public_name(url)}: {text}")
        return "; ".join(reasons)

    def _deadline(self, call: CallContext, at_least: float = 0.0) -> float:
        budget = max(self.request_timeout, at_least)
        return min(call.deadline, trio.current_time() + budget)

    # -- shared memory ------------------------------------------------------------------

    def _shm(
        self, method: Method, request: type[Message], undo_with: Method | None
    ) -> UnaryHandler:
        """A register (all or nothing, undone by `undo_with`) or an unregister (any)."""
        observe = self.metrics.observer(method.rpc)

        async def handler(body: bytes, call: CallContext) -> bytes:
            with self._admitted(method.rpc), metered(call, observe):
                message = _parsed(request, body)
                name: str = message.name  # type: ignore[attr-defined]  # every SHM request has one
                if undo_with is None:
                    return await self._unregister(method, name, call)
                if not name:
                    raise GrpcError(
                        StatusCode.INVALID_ARGUMENT, f"{request.DESCRIPTOR.name}.name is empty"
                    )
                self._may_register(method, message, call)
                undo = self._undoer(undo_with, _named(undo_with, name))
                key: str = getattr(message, "key", "")  # system shared memory only
                with held_open(key):  # what the workers check we may have them map
                    reply = await self.all_or_nothing(
                        method,
                        body,
                        self.pool.urls,
                        self._deadline(call),
                        undo,
                        gated=True,
                        unreachable_later=True,
                    )
                byte_size: int = message.byte_size  # type: ignore[attr-defined]
                self.pool.regions.registered(method, name, body, call.owner, byte_size, key)
                return reply

        return handler

    def _may_register(self, method: Method, message: Message, call: CallContext) -> None:
        """Ownership, access to the object, and the client's quota (docs/security.md)."""
        name: str = message.name  # type: ignore[attr-defined]
        regions, owner = self.pool.regions, call.owner
        held_by = regions.owner(method, name)
        if held_by is not None and held_by != owner:
            raise not_yours(name)
        if method is Method.SHM_REGISTER:
            key: str = message.key  # type: ignore[attr-defined]
            check_access(
                call.client,
                key,
                allow_remote=self.shm.allow_remote_clients,
                key_prefix=self.shm.key_prefix,
            )
        if held_by is not None:
            return  # the workers answer ALREADY_EXISTS, as Triton does
        count, held = regions.held_by(owner)
        cap, byte_cap = self.shm.max_regions_per_client, self.shm.max_bytes_per_client
        if cap and count + 1 > cap:
            raise GrpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"this client already holds {count} shared memory regions, its limit "
                "(shm.max_regions_per_client); unregister some first",
            )
        size: int = message.byte_size  # type: ignore[attr-defined]
        if byte_cap and held + size > byte_cap:
            raise GrpcError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"this client holds {held} bytes of shared memory regions; {size} more would "
                f"pass its limit of {byte_cap} (shm.max_bytes_per_client)",
            )

    async def _unregister(self, method: Method, name: str, call: CallContext) -> bytes:
        """Unregister the caller's region `name`, or all the caller's regions for ""."""
        regions = self.pool.regions
        register = next(r for r, u in UNREGISTER_OF.items() if u is method)
        if name:
            held_by = regions.owner(register, name)
            if held_by is not None and held_by != call.owner:
                raise not_yours(name)
            names = [name]
        elif len(regions.names(register)) == len(regions.names(register, call.owner)):
            names = [""]  # every region is the caller's: one call clears the workers too
        else:
            names = regions.names(register, call.owner)
        reply = b""
        for each in names:
            body = _named(method, each)
            reply = await self.any_succeeds(
                method, body, self.pool.urls, self._deadline(call), gated=True
            )
            regions.unregistered(method, each)
        return reply

    def _status(self, method: Method, response: type[ShmStatus]) -> UnaryHandler:
        """A status: the caller's regions, as every worker reports them alike."""
        observe = self.metrics.observer(method.rpc)
        register = Method.SHM_REGISTER if method is Method.SHM_STATUS else Method.CUDA_SHM_REGISTER

        async def handler(body: bytes, call: CallContext) -> bytes:
            with metered(call, observe):
                name: str = _parsed(_STATUS_REQUEST[method], body).name  # type: ignore[attr-defined]
                held_by = self.pool.regions.owner(register, name) if name else None
                if held_by is not None and held_by != call.owner:
                    raise GrpcError(
                        StatusCode.NOT_FOUND, f"unregistered shared memory region: {shown(name)}"
                    )
                urls = self.pool.urls
                results = await self._ask(method, body, urls, self._deadline(call), gated=False)
                answers = [
                    response.FromString(reply)
                    for url in urls
                    if isinstance(reply := results[url], bytes)
                ]
                if answers:
                    merged = merge_shm_status(answers)
                    others = set(self.pool.regions.names(register)) - set(
                        self.pool.regions.names(register, call.owner)
                    )
                    for other in others & set(merged.regions):
                        del merged.regions[other]
                    serialized: bytes = merged.SerializeToString()
                    return serialized
                first = results[urls[0]]
                if isinstance(first, GrpcError):  # every worker said the same: no such region
                    raise GrpcError(first.code, first.message)
                raise GrpcError(StatusCode.UNAVAILABLE, f"no worker answered {method.rpc}")

        return handler

    def _undoer(self, method: Method, body: bytes) -> Callable[[list[str]], Awaitable[None]]:
        """Best effort: run `method` where the failed call had succeeded."""

        async def undo(urls: list[str]) -> None:
            if not urls:
                return
            deadline = trio.current_time() + self.request_timeout
            results = await self._ask(method, body, urls, deadline, gated=False)
            for url, result in results.items():
                if isinstance(result, Exception):
                    logger.warning(
                        "undo failed",
                        extra={
                            "rpc": method.rpc,
                            "worker": self.pool.label(url),
                            "error": str(result),
                        },
                    )

        return undo

    # -- explicit model control -----------------------------------------------------------

    async def model_load(
        self, request: pb.RepositoryModelLoadRequest, call: CallContext
    ) -> pb.RepositoryModelLoadResponse:
        """Load on every worker that should hold the model; undone if any fails."""
        method = Method.REPOSITORY_MODEL_LOAD
        with metered(call, self.metrics.observer(method.rpc)):
            urls = self._holders(request.model_name)
            undo = self._undoer(
                Method.REPOSITORY_MODEL_UNLOAD,
                pb.RepositoryModelUnloadRequest(model_name=request.model_name).SerializeToString(),
            )
            deadline = self._deadline(call, SLOW_MIN_DEADLINE)
            await self.all_or_nothing(method, request.SerializeToString(), urls, deadline, undo)
            await self.prober.rediscover()
            return pb.RepositoryModelLoadResponse()

    async def model_unload(
        self, request: pb.RepositoryModelUnloadRequest, call: CallContext
    ) -> pb.RepositoryModelUnloadResponse:
        """Unload everywhere it is held; succeeds if any worker did."""
        method = Method.REPOSITORY_MODEL_UNLOAD
        with metered(call, self.metrics.observer(method.rpc)):
            body = request.SerializeToString()
            await self.any_succeeds(method, body, self.pool.urls, self._deadline(call), gated=False)
            await self.prober.rediscover()
            return pb.RepositoryModelUnloadResponse()

    # -- answered by asking everyone ----------------------------------------------------

    async def is_same_ipc_namespace(
        self, request: pb.IsSameIPCNamespaceRequest, call: CallContext
    ) -> pb.IsSameIPCNamespaceResponse:
        """True only if every worker sees the client's region (any may serve it later)."""
        method = Method.IPC_NAMESPACE
        with metered(call, self.metrics.observer(method.rpc)):
            shm = self.shm
            if not may_see(
                call.client,
                request.name,
                allow_remote=shm.allow_remote_clients,
                key_prefix=shm.key_prefix,
            ):
                return pb.IsSameIPCNamespaceResponse(same=False)  # nothing about others' objects
            deadline = min(call.deadline, trio.current_time() + IPC_DEADLINE)
            urls = self.pool.urls
            results = await self._ask(
                method, request.SerializeToString(), urls, deadline, gated=False
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
            return pb.IsSameIPCNamespaceResponse(same=same)

    async def compact_memory(
        self, request: cpb.CompactMemoryRequest, call: CallContext
    ) -> cpb.CompactMemoryResponse:
        """Compact every worker; the answer sums the models they reloaded."""
        method = Method.COMPACT_MEMORY
        with metered(call, self.metrics.observer(method.rpc)):
            urls = self.pool.urls
            deadline = self._deadline(call, SLOW_MIN_DEADLINE)
            results = await self._ask(
                method, request.SerializeToString(), urls, deadline, gated=False
            )
            failed = [url for url in urls if isinstance(results[url], Exception)]
            if failed and len(failed) == len(urls):
                raise GrpcError(
                    StatusCode.UNAVAILABLE,
                    f"compaction failed on every worker ({self._why(failed, results)})",
                )
            reloaded = sum(
                cpb.CompactMemoryResponse.FromString(r).reloaded_models
                for r in results.values()
                if isinstance(r, bytes)
            )
            return cpb.CompactMemoryResponse(reloaded_models=reloaded)

    def _observe_worker(self, rpc: str) -> Callable[[str, float], None]:
        return lambda url, seconds: self.metrics.observe_worker(rpc, url, seconds)


def _common_code(errors: Sequence[bytes | Exception]) -> StatusCode | None:
    """The status every worker answered alike (a client's fault, say), or None."""
    codes = {e.code if isinstance(e, GrpcError) else None for e in errors}
    code = codes.pop() if len(codes) == 1 else None
    return code


def _first_reply(results: Results) -> bytes:
    return next((r for r in results.values() if isinstance(r, bytes)), b"")


def _parsed(message: type[Message], body: bytes) -> Message:
    try:
        return message.FromString(body)
    except Exception as exc:  # protobuf's DecodeError
        raise GrpcError(
            StatusCode.INVALID_ARGUMENT, f"malformed {message.DESCRIPTOR.name}: {exc}"
        ) from exc


_STATUS_REQUEST: dict[Method, type[Message]] = {
    Method.SHM_STATUS: pb.SystemSharedMemoryStatusRequest,
    Method.CUDA_SHM_STATUS: pb.CudaSharedMemoryStatusRequest,
}


def _named(unregister: Method, name: str) -> bytes:
    """The unregister request that undoes a register of region `name`."""
    request: Message = (
        pb.CudaSharedMemoryUnregisterRequest(name=name)
        if unregister is Method.CUDA_SHM_UNREGISTER
        else pb.SystemSharedMemoryUnregisterRequest(name=name)
    )
    return request.SerializeToString()
