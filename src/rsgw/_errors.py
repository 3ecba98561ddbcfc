"""The exceptions rsgw raises, each carrying the gRPC status it maps to.

One flat family under `RsgwError` (as h11 and h2 do): callers that only care
whether something came from rsgw catch the base; the gRPC boundary turns any of
them into a status with `grpc_status` and the message, so an error raised deep in
a core reaches a client with a precise code instead of INTERNAL.
"""

from __future__ import annotations

from rsgw._status import StatusCode


class RsgwError(Exception):
    """Base class of every error rsgw raises on purpose."""

    grpc_status: StatusCode = StatusCode.INTERNAL


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
    """A worker could not be reached, or its connection died under a call."""

    grpc_status = StatusCode.UNAVAILABLE


class GatewayWedged(RsgwError):
    """The gateway's client stack stopped answering; restart the process."""

    grpc_status = StatusCode.UNAVAILABLE


class StartupError(RsgwError):
    """The fleet does not meet a scheduling mode's preconditions; the message says how."""

    grpc_status = StatusCode.FAILED_PRECONDITION
