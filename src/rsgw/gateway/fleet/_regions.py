"""Shared memory regions registered through the gateway, replayed to a worker that comes back.

A worker that restarts (or whose connection the gateway reset: an ejection, a hung
probe) has none of the regions clients registered through the gateway, and a
request naming one would fail there. The original left it so; here every
connection to a worker first registers the regions again, before any call may use
it (`Channel(on_connect=...)` runs this before the connection is handed out).

The book keeps each region's register request as the client sent it, in order,
with who registered it (docs/security.md): only that client may use the region in
ModelInfer, unregister it or see it in a status; an unregister removes it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import GrpcError, RsgwError
from rsgw.base._methods import Method
from rsgw.base._shm_access import REGION_PARAMETER, held_open, not_yours, regions_named
from rsgw.base._status import StatusCode
from rsgw.scheduling.calls._wire import head_length

logger = logging.getLogger(__name__)

#: register method -> the unregister method that removes what it registered.
UNREGISTER_OF = {
    Method.SHM_REGISTER: Method.SHM_UNREGISTER,
    Method.CUDA_SHM_REGISTER: Method.CUDA_SHM_UNREGISTER,
}

Send = Callable[[bytes, bytes], Awaitable[bytes]]

#: What every request naming a shared memory region contains.
REGION_MARK = REGION_PARAMETER.encode()
_NONE: frozenset[Method] = frozenset()


@dataclass(frozen=True, slots=True)
class _Region:
    body: bytes
    #: Who registered it (`CallContext.owner`): only they may use or unregister it.
    owner: str
    byte_size: int
    #: The POSIX object of a system shared memory region ("" for CUDA).
    key: str = ""


class RegionBook:
    """The regions registered through the gateway: who owns each, to register again later."""

    def __init__(self) -> None:
        self._regions: dict[tuple[Method, str], _Region] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def owner(self, method: Method, name: str) -> str | None:
        """Who registered region `name` with `method`, or None."""
        region = self._regions.get((method, name))
        return None if region is None else region.owner

    def held_by(self, owner: str) -> tuple[int, int]:
        """(regions, bytes) `owner` holds, of every kind: what its quota counts."""
        mine = [r for r in self._regions.values() if r.owner == owner]
        return len(mine), sum(r.byte_size for r in mine)

    def names(self, method: Method, owner: str | None = None) -> list[str]:
        """The regions of kind `method` (a register method), or only `owner`'s."""
        return [
            name
            for (kind, name), region in self._regions.items()
            if kind is method and (owner is None or region.owner == owner)
        ]

    def check_use(self, names: Iterable[str], owner: str) -> frozenset[Method]:
        """PERMISSION_DENIED if any of `names` is another's region (ModelInfer's check).

        Returns the kinds (register methods) of the regions named that were
        registered through the gateway: the call may go only to workers with them.
        """
        kinds: set[Method] = set()
        for name in names:
            for method in UNREGISTER_OF:
                region = self._regions.get((method, name))
                if region is not None:
                    if region.owner != owner:
                        raise not_yours(name)
                    kinds.add(method)
        return frozenset(kinds)

    def check_request(self, head: bytes, owner: str) -> frozenset[Method]:
        """PERMISSION_DENIED if ModelInfer request `head` names another's region; else
        the kinds of the gateway's regions it names (`check_use`).

        `head` is what routing read: the body, or a compressed body's inflated head.
        Regions are named in the inputs' and outputs' parameters, which come before
        the raw tensor bytes, so only that part is searched (a field walk, no copy of
        the tensors), and decoded only if it mentions a region. Called only while some
        region is registered.

        Raises:
            GrpcError: INVALID_ARGUMENT, the request is not a valid encoding (as routing
                would say).
        """
        part = head[: head_length(head, True)]  # the whole head itself when it has no tensors
        if REGION_MARK not in part:
            return _NONE
        try:
            request = pb.ModelInferRequest.FromString(part)
        except DecodeError as exc:
            raise GrpcError(
                StatusCode.INVALID_ARGUMENT, f"malformed ModelInferRequest: {exc}"
            ) from None
        return self.check_use(regions_named(request), owner)

    def registered(
        self,
        method: Method,
        name: str,
        body: bytes,
        owner: str = "",
        byte_size: int = 0,
        key: str = "",
    ) -> None:
        """A register call (`method`) of region `name` succeeded with request `body`."""
        self._regions.pop((method, name), None)
        self._regions[(method, name)] = _Region(body, owner, byte_size, key)

    def unregistered(self, method: Method, name: str) -> None:
        """An unregister call succeeded somewhere: region `name` (or all, for "") is gone."""
        register = next(r for r, u in UNREGISTER_OF.items() if u is method)
        for key in [k for k in self._regions if k[0] is register and (not name or k[1] == name)]:
            del self._regions[key]

    async def replay(self, worker: str, send: Send) -> None:
        """Register every region on a fresh connection to `worker`, through `send`.

        A region the worker already has (ALREADY_EXISTS) is fine. One it refuses
        (its object is gone, say) is logged and skipped: the others still serve,
        and a request naming that region fails there as it would anywhere.
        """
        for (method, name), region in list(self._regions.items()):
            try:
                with held_open(region.key):  # the worker checks we may have it map it
                    await send(method.wire, region.body)
            except GrpcError as exc:
                if exc.code is not StatusCode.ALREADY_EXISTS:
                    _refused(worker, name, exc)
            except RsgwError as exc:
                _refused(worker, name, exc)
        if self._regions:
            logger.info(
                "shared memory regions registered again",
                extra={"worker": worker, "regions": len(self._regions)},
            )

    async def unwind(self, worker: str, send: Send) -> None:
        """Unregister every region on `worker`, which is leaving the gateway (its
        other clients, if any, keep theirs: only what the gateway registered goes).

        A worker that does not answer is skipped: it is leaving anyway.
        """
        if not self._regions:
            return
        gone = 0
        for method, name in list(self._regions):
            try:
                await _unwind_one(send, UNREGISTER_OF[method], name)
                gone += 1
            except RsgwError as exc:
                logger.info(
                    "could not unregister a region on a departing worker",
                    extra={"worker": worker, "region": name[:128], "error": str(exc)[:300]},
                )
        logger.info("shared memory regions unregistered", extra={"worker": worker, "regions": gone})


async def _unwind_one(send: Send, method: Method, name: str) -> None:
    request = (
        pb.SystemSharedMemoryUnregisterRequest(name=name)
        if method is Method.SHM_UNREGISTER
        else pb.CudaSharedMemoryUnregisterRequest(name=name)
    )
    await send(method.wire, request.SerializeToString())


def _refused(worker: str, name: str, exc: RsgwError) -> None:
    logger.warning(
        "could not register a shared memory region again",
        extra={"worker": worker, "region": name[:128], "error": str(exc)[:300]},
    )
