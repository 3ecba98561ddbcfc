"""The call context: what a handler knows of its call, whichever door it came through.

A handler is `async def handler(request: bytes, call: CallContext) -> bytes`. The
context carries what the gateway's decisions need (the deadline, the client's
metadata, who the client is and who it proved to be) and nothing of the wire, so
the gRPC server and any other front door build one and call the same handler.

A door runs a handler the same way whatever its wire (`rsgw.grpc._handling` is the
gRPC one):
- `begin(scope, time_limit)` puts the call on the cancel scope it runs under, with
  the method's own time limit (the service's `time_limits`, by method path) when
  that is sooner than the client's deadline;
- the handler returns its reply, or raises: `failed(exc)` is the status and message
  that answers (an `RsgwError`'s own, anything else INTERNAL and logged as the bug
  it is), and when the scope cancelled the handler, `cut_short()` is (the door's
  drain, the gateway's deadline for the call, or the client's);
- `status_for(exc)` is the same rule for the call's metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import trio

from rsgw.base._auth import Principal
from rsgw.base._body import Body
from rsgw.base._errors import RsgwError
from rsgw.base._peer import IN_PROCESS, Peer
from rsgw.base._status import StatusCode

#: Call metadata (custom headers): (name, value) pairs, names lower-case. The same
#: shape as the gRPC layer's header blocks (`rsgw.grpc.protocol._metadata.HeaderBlock`).
Metadata = tuple[tuple[bytes, bytes], ...]
#: Methods' own time limits, in seconds from when the handler starts, by method path.
TimeLimits = Mapping[str, float]

logger = logging.getLogger(__name__)

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
    #: The connection's client: certificate identity, loopback user (`rsgw.base._peer`).
    client: Peer = field(default_factory=lambda: _IN_PROCESS)
    #: Who the call proved to be, once the gateway's guard checked it (auth on).
    principal: Principal | None = None
    #: What the call answers if `limit`'s deadline ends it (else "deadline exceeded").
    expired: Callable[[], RsgwError] | None = None
    #: The cancel scope the handler runs under (None outside a server).
    scope: trio.CancelScope | None = None
    #: Why the door cut the call short (it was still running when its drain ended).
    abandoned: str = ""
    #: The door's wire, for the metrics' `protocol` label: "grpc" or "rest".
    protocol: str = "grpc"

    def begin(self, scope: trio.CancelScope, time_limit: float | None) -> None:
        """The handler runs under `scope` from now, ended by the call's deadline or by
        the method's own `time_limit` (seconds from now) if that is sooner.

        The scope may still hold an earlier call's deadline (the gRPC server runs a
        connection's calls one after another under one scope): it is set only when
        it differs, so a method with a time limit costs one deadline setter a call.
        """
        self.scope = scope
        if time_limit is not None:
            self.deadline = min(self.deadline, trio.current_time() + time_limit)
        if scope.deadline != self.deadline:
            scope.deadline = self.deadline

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

    def failed(self, exc: Exception) -> tuple[StatusCode, str]:
        """The status and message a handler's exception answers: an `RsgwError`'s own
        (its trailers added to the call's), anything else INTERNAL naming only the
        exception's type, logged as a bug with its traceback."""
        if isinstance(exc, RsgwError):
            if exc.trailers:
                self.trailers = self.trailers + exc.trailers
            return exc.code, exc.message
        logger.exception("handler for %s failed", self.path)
        # The bug's text stays in the log: it may say what a client should not see.
        return (
            StatusCode.INTERNAL,
            f"internal error ({type(exc).__name__}); the log has its traceback",
        )

    def cut_short(self) -> tuple[StatusCode, str]:
        """The status and message of a call whose scope cancelled its handler: the
        door's drain, what `limit` chose, or the deadline."""
        if self.abandoned:
            return StatusCode.UNAVAILABLE, self.abandoned
        if self.expired is not None:
            error = self.expired()
            return error.code, error.message
        return StatusCode.DEADLINE_EXCEEDED, "deadline exceeded"


UnaryHandler = Callable[[bytes, CallContext], Awaitable[bytes]]
#: A pass-through's handler: it takes the request as it came (compressed, or in the
#: pieces it arrived in) and may answer likewise (`rsgw.base._body`).
PassThrough = Callable[[Body, CallContext], Awaitable[Body]]
