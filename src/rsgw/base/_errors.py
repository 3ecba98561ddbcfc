"""The exceptions rsgw raises, each carrying the gRPC status it maps to.

One flat family under `RsgwError` (as h11 and h2 do): callers that only care
whether something came from rsgw catch the base; the gRPC boundary turns any of
them into a status with `code`, `message` and `trailers`, so an error raised deep
in a core reaches a client with a precise code instead of INTERNAL. `GrpcError`
is the member whose code is chosen per instance (a handler's answer, a peer's
status); the others carry their class's code.
"""

from __future__ import annotations

from typing import ClassVar

from rsgw.base._status import StatusCode

#: Extra trailing metadata a status may carry (header name and value, as bytes).
Trailers = tuple[tuple[bytes, bytes], ...]


class RsgwError(Exception):
    """Base class of every error rsgw raises on purpose.

    Every one carries the gRPC status it ends a call with: `code` is the class's
    `grpc_status` unless the raiser names another, `message` the text a client
    reads, and `trailers` any extra trailing metadata (a worker's, relayed as it
    sent it). So a call boundary catches `RsgwError` alone and answers with
    `code`, `message` and `trailers`, whatever raised it.
    """

    grpc_status: ClassVar[StatusCode] = StatusCode.INTERNAL

    def __init__(
        self, message: str = "", *, code: StatusCode | None = None, trailers: Trailers = ()
    ) -> None:
        super().__init__(message)
        self.code: StatusCode = type(self).grpc_status if code is None else code
        self.message = message
        self.trailers = trailers


class GrpcError(RsgwError):
    """A call that ends with a status chosen by whoever raised it.

    Raised by handlers to answer with a precise status, and by the client channel
    when a peer answered one (its code, message and trailers, unchanged).
    """

    def __init__(self, code: StatusCode, message: str = "", trailers: Trailers = ()) -> None:
        super().__init__(message, code=code, trailers=trailers)

    def __repr__(self) -> str:
        return f"GrpcError({self.code.name}, {self.message!r})"

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class ConfigError(RsgwError):
    """Bad configuration: the message names the key and the bad value."""

    grpc_status = StatusCode.INVALID_ARGUMENT


class DecodeError(RsgwError):
    """Bytes that are not the protobuf message they claim to be."""

    grpc_status = StatusCode.INVALID_ARGUMENT


class InvalidRequest(RsgwError):
    """A well-formed request that asks for something invalid (bad tensor, bad shape)."""

    grpc_status = StatusCode.INVALID_ARGUMENT


class NotFound(RsgwError):
    """The request names something that does not exist (a model, a region)."""

    grpc_status = StatusCode.NOT_FOUND


class FailedPrecondition(RsgwError):
    """The request is valid but the server is not in a state to serve it."""

    grpc_status = StatusCode.FAILED_PRECONDITION


class ListenError(RsgwError):
    """A listener could not bind its address (busy port, bad host)."""

    grpc_status = StatusCode.UNAVAILABLE


class WorkerUnavailable(RsgwError):
    """A peer could not be reached, or refused or lost a call before answering it.

    The call certainly did not run there, so another replica may take it.
    """

    grpc_status = StatusCode.UNAVAILABLE


class ResponseInterrupted(WorkerUnavailable):
    """The connection died after the peer had begun to answer: the call may have run."""


class GatewayWedged(RsgwError):
    """The gateway's client stack stopped answering; restart the process."""

    grpc_status = StatusCode.UNAVAILABLE


class StartupError(RsgwError):
    """The fleet does not meet a scheduling mode's preconditions; the message says how."""

    grpc_status = StatusCode.FAILED_PRECONDITION


#: The most characters of a status message a client is sent. Messages quote client
#: input (a model or region name): a 10 MB name must not come back as a 10 MB
#: trailer the client then cannot read (grpc-core reads 8 KiB of metadata by
#: default, and a percent-encoded character takes up to 12 bytes).
MAX_MESSAGE_CHARS = 512

#: The most characters of one quoted client value (a name) inside a message.
MAX_QUOTED_CHARS = 128


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text`, or its start and how much was left out if it is longer than `limit`."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 32)
    return f"{text[:keep]}... ({len(text) - keep} more characters)"


def shown(value: str | bytes) -> str:
    """A client-supplied value as a message quotes it: printable and short.

    Bytes that are not UTF-8 show as escapes, so a hostile header or name is
    reported, never raised on.
    """
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value
    return clip(text, MAX_QUOTED_CHARS)
