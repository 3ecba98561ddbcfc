"""The call context: what a handler knows of its call, whichever door it came through.

A handler is `async def handler(request: bytes, call: CallContext) -> bytes`. The
context carries what the gateway's decisions need (the deadline, the client's
metadata, who the client is and who it proved to be) and nothing of the wire, so
the gRPC server and any other front door build one and call the same handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from rsgw._auth import Principal
from rsgw._errors import RsgwError
from rsgw._peer import IN_PROCESS, Peer
from rsgw._status import StatusCode

#: Call metadata (custom headers): (name, value) pairs, names lower-case. The same
#: shape as the gRPC layer's header blocks (`rsgw.grpc._metadata.HeaderBlock`).
Metadata = tuple[tuple[bytes, bytes], ...]

_IN_PROCESS: Peer = Peer(IN_PROCESS, "in-process")


@dataclass(slots=True)
class CallContext:
    """What a handler may know about its call besides the request bytes.

    Built by the door the call came in through (the gRPC server today), and the
    same for every door: a handler never learns which wire carried it.
    """

    path: str
    #: Absolute deadline on the Trio clock, `math.inf` when the client set none.
    deadline: float
    #: Request metadata (custom headers), names lower-case.
    metadata: Metadata
    peer: str
    #: Extra trailing metadata to send with the status (e.g. relayed from a worker).
    trailers: Metadata = ()
    #: The encodings the client accepts for the response.
    accept: frozenset[bytes] = frozenset()
    #: The connection's client: certificate identity, loopback user (`rsgw._peer`).
    client: Peer = field(default_factory=lambda: _IN_PROCESS)
    #: Who the call proved to be, once the gateway's guard checked it (auth on).
    principal: Principal | None = None
    #: What the call answers if `limit`'s deadline ends it (else "deadline exceeded").
    expired: Callable[[], RsgwError] | None = None
    #: The cancel scope the handler runs under (None outside a server).
    scope: trio.CancelScope | None = None

    def limit(self, deadline: float, expired: Callable[[], RsgwError]) -> None:
        """End the handler at `deadline` if that is sooner, answering `expired()` then.

        The handler's own scope takes the deadline: the request path needs no cancel
        scope of its own (a scope costs more than the rest of a small call's routing).
        """
        self.expired = expired
        if deadline < self.deadline:
            self.deadline = deadline
            if self.scope is not None:
                self.scope.deadline = deadline

    @property
    def owner(self) -> str:
        """Who owns the shared memory this call registers (docs/security.md)."""
        return f"token:{self.principal.name}" if self.principal else self.client.owner

    def status_for(self, exc: BaseException) -> StatusCode:
        """The status this call ends with when its handler raises `exc` (for metrics)."""
        if isinstance(exc, RsgwError):
            return exc.code
        if isinstance(exc, trio.Cancelled):
            if trio.current_time() >= self.deadline:
                return StatusCode.DEADLINE_EXCEEDED
            return StatusCode.CANCELLED
        return StatusCode.INTERNAL


UnaryHandler = Callable[[bytes, CallContext], Awaitable[bytes]]
