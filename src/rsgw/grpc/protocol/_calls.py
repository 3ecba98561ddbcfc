"""The life of one gRPC call: its two halves, their states, and the events it produces.

Pure: no h2, no trio, no clock. `rsgw.grpc.protocol._connection` maps HTTP/2 onto these
calls; the server and client shells only ever see the events defined here.

Theory of operation. A gRPC call is two independent half-streams, as h11 treats
an HTTP exchange as two roles: the *inbound* half is what the peer sends us (the
request on a server, the response on a client), the *outbound* half is what we
send. Each half goes through the same states:

    IDLE --HEADERS--> OPEN --MESSAGE*--> OPEN --END--> CLOSED
      \\--END (trailers-only, or a request with nothing in it)---^
    any --RESET--> RESET        (CLOSED stays CLOSED: what it carried was complete)

`TRANSITIONS` is the whole table; `Call`'s advance methods are the only code that
changes a half's state, and a step that is not in the table raises `CallStateError`. For
the inbound half that means the peer broke the protocol (the connection fails
the call); for the outbound half it means a bug in our own shell.

Invariants:
- A call is *over* once both halves are CLOSED or RESET; the connection then
  forgets it, and no event names it again.
- Exactly one `CallEnded` is emitted for a call unless our own side ended it
  (a server that answered, a client that cancelled): the shell always learns
  the end it did not cause, and never hears of a call twice.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rsgw.base._body import Body
from rsgw.base._errors import GrpcError, ResponseInterrupted, RsgwError, WorkerUnavailable
from rsgw.base._status import StatusCode
from rsgw.grpc.protocol._framing import MessageDecoder

if TYPE_CHECKING:
    from rsgw.base._uploads import Ticket
    from rsgw.grpc.protocol._metadata import HeaderBlock, RequestHead


class HalfState(enum.IntEnum):
    """Where one direction of a call is; the finished states are the highest."""

    IDLE = 0  # no headers yet
    OPEN = 1  # headers done; messages may follow
    CLOSED = 2  # ended cleanly: END_STREAM (a request) or trailers (a response)
    RESET = 3  # ended by RST_STREAM, a failure of ours, or a lost connection


class Step(enum.IntEnum):
    """What can happen to a half."""

    HEADERS = 0
    MESSAGE = 1
    END = 2
    RESET = 3


_I, _O, _C, _R = HalfState.IDLE, HalfState.OPEN, HalfState.CLOSED, HalfState.RESET

#: (state, step) -> next state. Anything else is a protocol violation.
TRANSITIONS: dict[tuple[HalfState, Step], HalfState] = {
    (_I, Step.HEADERS): _O,
    (_I, Step.END): _C,
    (_O, Step.MESSAGE): _O,
    (_O, Step.END): _C,
    (_I, Step.RESET): _R,
    (_O, Step.RESET): _R,
    (_C, Step.RESET): _C,
    (_R, Step.RESET): _R,
}

#: States in which a half will carry nothing more (every state from CLOSED up).
FINISHED = frozenset({HalfState.CLOSED, HalfState.RESET})

#: `TRANSITIONS` as rows by state and columns by step, for the per-call path: a
#: tuple index per step instead of hashing two enum members.
_NEXT: tuple[tuple[HalfState | None, ...], ...] = tuple(
    tuple(TRANSITIONS.get((state, step)) for step in Step) for state in HalfState
)


class CallStateError(RsgwError):
    """A step the call's state does not allow (a broken peer, or a bug of ours)."""


class EndCause(enum.Enum):
    """Why a call ended, as far as the side that reports it can tell.

    The client's failover rule depends on it: only a call that certainly did not
    run (`REFUSED`) or that died before any response (`LOST` without a started
    response) may be sent elsewhere.
    """

    ANSWERED = "answered"  # the peer sent its status (OK or not)
    FAILED = "failed"  # we failed it: a bad or oversized message, a missing status
    REFUSED = "refused"  # the peer never processed it (REFUSED_STREAM, GOAWAY past it)
    RESET = "reset"  # the peer reset the stream
    LOST = "lost"  # the connection ended under it


# -- events ----------------------------------------------------------------------------
# Frozen and slotted, as h11's are: the shells dispatch on their type.


@dataclass(frozen=True, slots=True)
class CallStarted:
    """Server: a client opened a call with valid gRPC request headers."""

    stream_id: int
    head: RequestHead


@dataclass(frozen=True, slots=True)
class ResponseStarted:
    """Client: the peer began to answer (response headers, status 200)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """A whole length-prefixed message arrived on the inbound half (`Gathered` only on
    a call whose decoder gathers: a pass-through's)."""

    stream_id: int
    message: Body


@dataclass(frozen=True, slots=True)
class HalfClosed:
    """Server: the client finished its request (END_STREAM)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class CallEnded:
    """The call is over; `error` is None only for a client call answered OK.

    `error` is what a client call raises (the peer's status as `GrpcError`, or
    `WorkerUnavailable` / `ResponseInterrupted` when it was refused or lost), and
    what stopped a server call (so the shell can cancel its handler).
    """

    stream_id: int
    cause: EndCause
    error: RsgwError | None
    response_started: bool = False


@dataclass(frozen=True, slots=True)
class OutboxDrained:
    """What a call queued beyond the peer's window has gone: its sender may go on."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class ConnectionTerminated:
    """The peer sent GOAWAY: no new calls here; calls above `last_stream_id` were dropped."""

    last_stream_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class PeerSettled:
    """A client's peer sent its first SETTINGS: its limits (streams, frame size) are known."""


Event = (
    PeerSettled
    | CallStarted
    | ResponseStarted
    | MessageReceived
    | HalfClosed
    | CallEnded
    | OutboxDrained
    | ConnectionTerminated
)


# -- one call's record -------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Call:
    """The connection's record of one call: half states, the decoder, what waits to be sent.

    `outbox` holds outbound DATA that the peer's flow-control window could not take
    yet. With `end_pending`, the outbound half ends once the outbox has gone: with
    `trailers` (a server's status), or with END_STREAM on the last DATA frame (a
    client's request, `trailers == ()`).
    """

    stream_id: int
    decoder: MessageDecoder
    inbound: HalfState = HalfState.IDLE
    outbound: HalfState = HalfState.IDLE
    outbox: list[bytes | memoryview] = field(default_factory=list)
    end_pending: bool = False
    trailers: HeaderBlock = ()
    #: Client: response headers arrived, so a lost connection may have run the call.
    response_started: bool = False
    #: Client: the peer's trailers, parsed, until the stream ends.
    status: RsgwError | None = None
    answered_ok: bool = False
    #: Server: the connection's `receives` count when the call arrived (a reset that
    #: follows at once is the "rapid reset" pattern).
    opened: int = 0
    #: Server: the unfinished message's claim on the gateway's upload budget
    #: (`rsgw.base._uploads`), and the stream window held back until it is granted.
    ticket: Ticket | None = None
    owed: int = 0
    #: Server: the bytes its granted message held at the sweep's last look, and when
    #: they last moved (an upload that stalls holding a grant is ended).
    held_at_look: int = -1
    moved_at: float = 0.0

    def advance(self, half: str, step: Step) -> HalfState:
        """Apply `step` to the `"inbound"` or `"outbound"` half (see the two below)."""
        if half == "inbound":
            return self.advance_inbound(step)
        return self.advance_outbound(step)

    def advance_inbound(self, step: Step) -> HalfState:
        """Apply `step` to what the peer sends.

        Raises:
            CallStateError: `step` is not allowed in the half's state.
        """
        following = _NEXT[self.inbound][step]
        if following is None:
            raise self._refused("inbound", self.inbound, step)
        self.inbound = following
        return following

    def advance_outbound(self, step: Step) -> HalfState:
        """Apply `step` to what we send.

        Raises:
            CallStateError: `step` is not allowed in the half's state.
        """
        following = _NEXT[self.outbound][step]
        if following is None:
            raise self._refused("outbound", self.outbound, step)
        self.outbound = following
        return following

    def _refused(self, half: str, state: HalfState, step: Step) -> CallStateError:
        return CallStateError(
            f"stream {self.stream_id}: {step.name.lower()} on the {half} half in state "
            f"{state.name.lower()}"
        )

    def reset(self) -> None:
        """Both halves end now (a reset either way, or a lost connection)."""
        self.advance_inbound(Step.RESET)
        self.advance_outbound(Step.RESET)
        self.outbox.clear()
        self.end_pending = False

    @property
    def over(self) -> bool:
        return self.inbound >= HalfState.CLOSED and self.outbound >= HalfState.CLOSED

    @property
    def sending(self) -> bool:
        """Outbound data or an end is still waiting for the peer's window."""
        return bool(self.outbox) or self.end_pending


# -- how an ending reads to the side that did not cause it ------------------------------

#: The HTTP/2 error codes (RFC 9113 §7) by number, for messages.
HTTP2_ERRORS = (
    "NO_ERROR",
    "PROTOCOL_ERROR",
    "INTERNAL_ERROR",
    "FLOW_CONTROL_ERROR",
    "SETTINGS_TIMEOUT",
    "STREAM_CLOSED",
    "FRAME_SIZE_ERROR",
    "REFUSED_STREAM",
    "CANCEL",
    "COMPRESSION_ERROR",
    "CONNECT_ERROR",
    "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY",
    "HTTP_1_1_REQUIRED",
)
REFUSED_STREAM = HTTP2_ERRORS.index("REFUSED_STREAM")
CANCEL = HTTP2_ERRORS.index("CANCEL")

#: HTTP statuses a gRPC client maps to codes when no grpc-status came (gRPC spec).
HTTP_TO_STATUS = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}


def http_status_error(http_status: bytes, peer: str) -> GrpcError:
    """A response that is not HTTP 200 and carries no grpc-status."""
    code = HTTP_TO_STATUS.get(int(http_status or 0), StatusCode.UNKNOWN)
    return GrpcError(code, f"{peer} answered HTTP {http_status.decode()}")


def lost(call: Call, peer: str, reason: str, *, client_side: bool) -> RsgwError:
    """What a call sees when its connection ends under it.

    A client call that had no response yet certainly did not run there
    (`WorkerUnavailable`, so it may go elsewhere); one whose response had begun
    may have (`ResponseInterrupted`). A server call's client is simply gone.
    """
    if not client_side:
        return GrpcError(StatusCode.CANCELLED, f"connection from the client {reason}")
    kind = ResponseInterrupted if call.response_started else WorkerUnavailable
    return kind(f"connection to {peer} {reason}")


def reset_by_peer(
    call: Call, error_code: int, peer: str, *, client_side: bool
) -> tuple[EndCause, RsgwError | None]:
    """How a call the peer reset (RST_STREAM `error_code`) ends."""
    if not client_side:
        return EndCause.RESET, GrpcError(StatusCode.CANCELLED, "the client cancelled the call")
    if call.status is not None or call.answered_ok:
        return EndCause.ANSWERED, call.status  # the answer was whole; the reset stops our upload
    if error_code == REFUSED_STREAM:
        return EndCause.REFUSED, WorkerUnavailable(f"{peer} refused the stream")
    if error_code == CANCEL:
        return EndCause.RESET, GrpcError(StatusCode.CANCELLED, f"{peer} cancelled the call")
    name = HTTP2_ERRORS[error_code] if 0 <= error_code < len(HTTP2_ERRORS) else str(error_code)
    return EndCause.RESET, lost(call, peer, f"reset the stream ({name})", client_side=True)
