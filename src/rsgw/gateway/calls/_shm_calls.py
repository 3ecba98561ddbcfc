"""The shared-memory RPCs through the gateway: register everywhere, or nowhere.

System and CUDA shared memory regions are host-local, and any worker may serve a
later ModelInfer that names one, so every worker must know every region:
- **register** is all or nothing (`rsgw.gateway.calls._broadcast`): where some workers
  registered and others did not, the ones that did unregister again and the call
  fails; a worker that cannot be reached is told later, when it is back (the
  region book, `rsgw.gateway.fleet._regions`, replays it on its next connection);
- **unregister** succeeds if any worker did;
- **status** lists the caller's regions as every worker reports them alike
  (`rsgw.scheduling.calls._merge`).
While a call runs on a worker its register gate holds ModelInfer back there (a
region registered on some workers but not yet on this one must not be used). These
calls count against the admission cap and are labelled `model=""`: region names
are the client's own and would make labels unbounded.

Regions belong to the client that registered them (docs/security.md): another
client can neither see, use nor unregister them, registration maps only objects
the client's own user owns, and each client holds at most its quota.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import GrpcError, shown
from rsgw.base._methods import Method
from rsgw.base._shm_access import check_access, held_open, not_yours
from rsgw.base._status import StatusCode
from rsgw.gateway.calls._broadcast import parsed
from rsgw.gateway.fleet._regions import UNREGISTER_OF
from rsgw.grpc._metering import metered
from rsgw.scheduling.calls._merge import ShmStatus, merge_shm_status

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from rsgw.base._call import CallContext, UnaryHandler
    from rsgw.config._blocks import ShmConfig
    from rsgw.gateway.calls._broadcast import FanOut
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.observe._metrics import GatewayMetrics


class ShmCalls:
    """The shared-memory handlers of one gateway; see the module docstring.

    Args:
        admitted: holds a place under the admission cap for a call's duration (or
            raises RESOURCE_EXHAUSTED at the cap).
    """

    def __init__(
        self,
        pool: WorkerPool,
        metrics: GatewayMetrics,
        fan: FanOut,
        admitted: Callable[[str], AbstractContextManager[object]],
        shm: ShmConfig,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.fan = fan
        self.shm = shm
        self._admitted = admitted

    def handlers(self) -> dict[Method, UnaryHandler]:
        """The handler table of the shared-memory RPCs."""
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
        }

    def _shm(
        self, method: Method, request: type[Message], undo_with: Method | None
    ) -> UnaryHandler:
        """A register (all or nothing, undone by `undo_with`) or an unregister (any)."""
        observe = self.metrics.observer(method.rpc)

        async def handler(body: bytes, call: CallContext) -> bytes:
            with self._admitted(method.rpc), metered(call, observe):
                message = parsed(request, body)
                name: str = message.name  # type: ignore[attr-defined]  # every SHM request has one
                if undo_with is None:
                    return await self._unregister(method, name, call)
                if not name:
                    raise GrpcError(
                        StatusCode.INVALID_ARGUMENT, f"{request.DESCRIPTOR.name}.name is empty"
                    )
                self._may_register(method, message, call)
                undo = self.fan.undoer(undo_with, _named(undo_with, name))
                key: str = getattr(message, "key", "")  # system shared memory only
                with held_open(key):  # what the workers check we may have them map
                    reply = await self.fan.all_or_nothing(
                        method,
                        body,
                        self.fan.targets.every(method),
                        self.fan.deadline(call),
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
            reply = await self.fan.any_succeeds(
                method, body, self.fan.targets.every(method), self.fan.deadline(call), gated=True
            )
            regions.unregistered(method, each)
        return reply

    def _status(self, method: Method, response: type[ShmStatus]) -> UnaryHandler:
        """A status: the caller's regions, as every worker reports them alike."""
        observe = self.metrics.observer(method.rpc)
        register = Method.SHM_REGISTER if method is Method.SHM_STATUS else Method.CUDA_SHM_REGISTER

        async def handler(body: bytes, call: CallContext) -> bytes:
            with metered(call, observe):
                name: str = parsed(_STATUS_REQUEST[method], body).name  # type: ignore[attr-defined]
                held_by = self.pool.regions.owner(register, name) if name else None
                if held_by is not None and held_by != call.owner:
                    raise GrpcError(
                        StatusCode.NOT_FOUND, f"unregistered shared memory region: {shown(name)}"
                    )
                urls = self.fan.targets.every(method)
                results = await self.fan.ask(
                    method, body, urls, self.fan.deadline(call), gated=False
                )
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
