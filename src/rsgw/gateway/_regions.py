"""Shared memory regions registered through the gateway, replayed to a worker that comes back.

A worker that restarts (or whose connection the gateway reset: an ejection, a hung
probe) has none of the regions clients registered through the gateway, and a
request naming one would fail there. The original left it so; here every
connection to a worker first registers the regions again, before any call may use
it (`Channel(on_connect=...)` runs this before the connection is handed out).

The book keeps each region's register request as the client sent it, in order;
an unregister removes it (an empty name: every region of that kind).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from rsgw._errors import GrpcError, RsgwError
from rsgw._methods import Method
from rsgw._status import StatusCode

logger = logging.getLogger(__name__)

#: register method -> the unregister method that removes what it registered.
UNREGISTER_OF = {
    Method.SHM_REGISTER: Method.SHM_UNREGISTER,
    Method.CUDA_SHM_REGISTER: Method.CUDA_SHM_UNREGISTER,
}

Send = Callable[[bytes, bytes], Awaitable[bytes]]


class RegionBook:
    """The regions registered through the gateway, to register again on a new connection."""

    def __init__(self) -> None:
        self._regions: dict[tuple[Method, str], bytes] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def registered(self, method: Method, name: str, body: bytes) -> None:
        """A register call (`method`) of region `name` succeeded with request `body`."""
        self._regions.pop((method, name), None)
        self._regions[(method, name)] = body

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
        for (method, name), body in list(self._regions.items()):
            try:
                await send(method.wire, body)
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


def _refused(worker: str, name: str, exc: RsgwError) -> None:
    logger.warning(
        "could not register a shared memory region again",
        extra={"worker": worker, "region": name[:128], "error": str(exc)[:300]},
    )
