"""Typed unary handlers: protobuf in, protobuf out, on top of the raw-bytes server.

The gateway's hot path stays on raw bytes; everything else (the worker's data
plane, control RPCs) is clearer with messages. A body that does not parse is the
client's fault, so it fails with INVALID_ARGUMENT naming the message type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from google.protobuf.message import DecodeError, Message

from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from rsgw.base._call import CallContext, UnaryHandler

Req = TypeVar("Req", bound=Message)


def typed_unary(
    request_type: type[Req], method: Callable[[Req, CallContext], Awaitable[Message]]
) -> UnaryHandler:
    """Wrap `method(request, call) -> response` as a raw-bytes unary handler."""
    name = request_type.DESCRIPTOR.name

    async def handler(body: bytes, call: CallContext) -> bytes:
        try:
            request = request_type.FromString(body)
        except DecodeError as exc:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, f"malformed {name}: {exc}") from exc
        response = await method(request, call)
        return response.SerializeToString()

    return handler
