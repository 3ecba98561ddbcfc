"""The standard gRPC services every rsgw listener adds: health checking and reflection.

- `grpc.health.v1.Health`: Check, List and Watch for the server as a whole ("")
  and for each gRPC service it serves; SERVING while the `ready` callable says so,
  NOT_SERVING otherwise (a gateway with no ready worker, a worker with no model).
  Check of an unknown service is NOT_FOUND; Watch of one answers SERVICE_UNKNOWN
  and then follows it, as the protocol says. Kubernetes' gRPC probes call Check.
- `grpc.reflection.v1` and `v1alpha` `ServerReflection`: the services served and
  the descriptors of the files that define them (from rsgw's private descriptor
  pool), so `grpcurl list` and `describe` need no local copy of the protos. rsgw's
  files define no extensions, so extension queries find none.

`standard_services(paths, ready)` returns the extra unary and stream handlers for a
listener whose own handlers are at `paths`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING

import trio

from rsgw._proto import grpc_health_v1_pb2 as health_pb
from rsgw._proto import grpc_reflection_v1_pb2 as reflection_v1
from rsgw._proto import grpc_reflection_v1alpha_pb2 as reflection_v1alpha
from rsgw._proto._pool import POOL
from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.grpc._typed import typed_unary

if TYPE_CHECKING:
    from google.protobuf.descriptor import FileDescriptor

    from rsgw.base._call import CallContext, UnaryHandler
    from rsgw.grpc._streams import ServerStream, StreamHandler

HEALTH = "grpc.health.v1.Health"
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
REFLECTION_V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
#: How often Watch looks at readiness (the gateway's own changes once a probe round).
WATCH_SECONDS = 1.0

_Status = health_pb.HealthCheckResponse.ServingStatus


class Health:
    """grpc.health.v1.Health over a readiness callable; see the module docstring."""

    def __init__(self, services: Iterable[str], ready: Callable[[], bool]) -> None:
        self.services = frozenset({"", *services})
        self._ready = ready

    def status(self) -> _Status:
        return (
            health_pb.HealthCheckResponse.SERVING
            if self._ready()
            else (health_pb.HealthCheckResponse.NOT_SERVING)
        )

    async def check(
        self, request: health_pb.HealthCheckRequest, call: CallContext
    ) -> health_pb.HealthCheckResponse:
        if request.service not in self.services:
            raise GrpcError(StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb.HealthCheckResponse(status=self.status())

    async def list(
        self, request: health_pb.HealthListRequest, call: CallContext
    ) -> health_pb.HealthListResponse:
        status = self.status()
        response = health_pb.HealthListResponse()
        for service in sorted(self.services):
            response.statuses[service].status = status
        return response

    async def watch(self, stream: ServerStream) -> None:
        body = await stream.receive()
        request = health_pb.HealthCheckRequest.FromString(body or b"")
        if request.service not in self.services:
            unknown = health_pb.HealthCheckResponse.SERVICE_UNKNOWN
            await stream.send(health_pb.HealthCheckResponse(status=unknown).SerializeToString())
            await trio.sleep_forever()  # the protocol: keep the call open, nothing changes
        sent: _Status | None = None
        while True:
            status = self.status()
            if status != sent:
                await stream.send(health_pb.HealthCheckResponse(status=status).SerializeToString())
                sent = status
            await trio.sleep(WATCH_SECONDS)


def _files_with_dependencies(file: FileDescriptor) -> list[bytes]:
    """`file` and everything it imports, each serialized once, `file` first."""
    seen: dict[str, bytes] = {}

    def add(one: FileDescriptor) -> None:
        if one.name not in seen:
            seen[one.name] = one.serialized_pb
            for dependency in one.dependencies:
                add(dependency)

    add(file)
    return list(seen.values())


def reflect(module: ModuleType, services: Iterable[str], body: bytes) -> bytes:
    """The answer to one ServerReflectionRequest (`module`: the v1 or v1alpha messages)."""
    request = module.ServerReflectionRequest.FromString(body)
    response = module.ServerReflectionResponse(valid_host=request.host, original_request=request)
    kind = request.WhichOneof("message_request")
    try:
        if kind == "list_services":
            for name in sorted(services):
                response.list_services_response.service.add(name=name)
        elif kind == "file_by_filename":
            file = POOL.FindFileByName(request.file_by_filename)  # type: ignore[no-untyped-call]  # stubs 6.x
            response.file_descriptor_response.file_descriptor_proto.extend(
                _files_with_dependencies(file)
            )
        elif kind == "file_containing_symbol":
            file = POOL.FindFileContainingSymbol(request.file_containing_symbol)  # type: ignore[no-untyped-call]  # stubs 6.x
            response.file_descriptor_response.file_descriptor_proto.extend(
                _files_with_dependencies(file)
            )
        elif kind == "all_extension_numbers_of_type":
            POOL.FindMessageTypeByName(request.all_extension_numbers_of_type)  # type: ignore[no-untyped-call]  # stubs 6.x
            response.all_extension_numbers_response.base_type_name = (
                request.all_extension_numbers_of_type
            )
        else:  # file_containing_extension: we define none; or an empty request
            raise KeyError(kind or "empty request")
    except KeyError as exc:
        response.error_response.error_code = int(StatusCode.NOT_FOUND)
        response.error_response.error_message = f"not found: {exc}"
    serialized: bytes = response.SerializeToString()
    return serialized


def _reflection(module: ModuleType, services: frozenset[str]) -> StreamHandler:
    async def handler(stream: ServerStream) -> None:
        async for body in stream:
            await stream.send(reflect(module, services, body))

    return handler


def standard_services(
    paths: Iterable[str], ready: Callable[[], bool]
) -> tuple[dict[str, UnaryHandler], dict[str, StreamHandler]]:
    """Health and reflection for a listener whose own methods are at `paths`."""
    own = {path.split("/")[1] for path in paths}
    services = frozenset({*own, HEALTH, REFLECTION_V1, REFLECTION_V1ALPHA})
    health = Health(services, ready)
    unary: dict[str, UnaryHandler] = {
        f"/{HEALTH}/Check": typed_unary(health_pb.HealthCheckRequest, health.check),
        f"/{HEALTH}/List": typed_unary(health_pb.HealthListRequest, health.list),
    }
    streams: dict[str, StreamHandler] = {
        f"/{HEALTH}/Watch": health.watch,
        f"/{REFLECTION_V1}/ServerReflectionInfo": _reflection(reflection_v1, services),
        f"/{REFLECTION_V1ALPHA}/ServerReflectionInfo": _reflection(reflection_v1alpha, services),
    }
    return unary, streams
