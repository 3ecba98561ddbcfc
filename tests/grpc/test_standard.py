"""Health checking and server reflection, as every rsgw listener serves them.

The first tests drive the handlers over memory streams with rsgw's channel; the last
ones point real clients at a gateway over TCP: grpcio's health stub, grpcio-reflection's
descriptor database, and grpcurl (with no local copy of the protos).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import trio
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from trio.testing import MockClock

from rsgw._proto import grpc_health_v1_pb2 as hpb
from rsgw._proto import grpc_reflection_v1_pb2 as rpb
from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from rsgw.grpc._standard import HEALTH, REFLECTION_V1, standard_services
from tests.gateway.fleet import open_fleet
from tests.helpers import in_thread
from tests.memory import MemoryNetwork

CHECK = f"/{HEALTH}/Check".encode()
WATCH = f"/{HEALTH}/Watch".encode()
REFLECT = f"/{REFLECTION_V1}/ServerReflectionInfo".encode()
OWN = {"/inference.GRPCInferenceService/ModelInfer": None}


@dataclass
class Served:
    channel: Channel
    ready: list[bool]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    ready = [True]
    unary, streams = standard_services(OWN, lambda: ready[0])
    server = GrpcServer(unary, stream_handlers=streams)
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda **kw: server.serve("h", 0, network=network, **kw))
        yield Served(Channel(f"h:{port}", nursery, network=network), ready)
        nursery.cancel_scope.cancel()


async def check(served: Served, service: str) -> int:
    reply = await served.channel.unary(
        CHECK, hpb.HealthCheckRequest(service=service).SerializeToString()
    )
    return hpb.HealthCheckResponse.FromString(reply).status


async def test_check_follows_readiness(served: Served, autojump_clock: MockClock) -> None:
    assert await check(served, "") == hpb.HealthCheckResponse.SERVING
    assert await check(served, "inference.GRPCInferenceService") == hpb.HealthCheckResponse.SERVING
    served.ready[0] = False
    assert await check(served, "") == hpb.HealthCheckResponse.NOT_SERVING
    with pytest.raises(GrpcError) as caught:
        await check(served, "no.Such")
    assert caught.value.code is StatusCode.NOT_FOUND


async def test_watch_sends_the_status_then_each_change(
    served: Served, autojump_clock: MockClock
) -> None:
    async with served.channel.stream(WATCH) as stream:
        await stream.send(hpb.HealthCheckRequest(service="").SerializeToString())
        stream.end()
        first = hpb.HealthCheckResponse.FromString(await stream.receive() or b"")
        assert first.status == hpb.HealthCheckResponse.SERVING
        served.ready[0] = False
        second = hpb.HealthCheckResponse.FromString(await stream.receive() or b"")
        assert second.status == hpb.HealthCheckResponse.NOT_SERVING
    async with served.channel.stream(WATCH) as stream:
        await stream.send(hpb.HealthCheckRequest(service="no.Such").SerializeToString())
        unknown = hpb.HealthCheckResponse.FromString(await stream.receive() or b"")
        assert unknown.status == hpb.HealthCheckResponse.SERVICE_UNKNOWN


async def reflect(
    served: Served, request: rpb.ServerReflectionRequest
) -> rpb.ServerReflectionResponse:
    async with served.channel.stream(REFLECT) as stream:
        await stream.send(request.SerializeToString())
        stream.end()
        (reply,) = [rpb.ServerReflectionResponse.FromString(r) async for r in stream]
    return reply


async def test_reflection_lists_and_describes(served: Served, autojump_clock: MockClock) -> None:
    listed = await reflect(served, rpb.ServerReflectionRequest(list_services=""))
    assert [s.name for s in listed.list_services_response.service] == sorted(
        {
            "inference.GRPCInferenceService",
            HEALTH,
            REFLECTION_V1,
            "grpc.reflection.v1alpha.ServerReflection",
        }
    )
    found = await reflect(
        served, rpb.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService")
    )
    (file,) = found.file_descriptor_response.file_descriptor_proto
    proto = descriptor_pb2.FileDescriptorProto.FromString(file)
    assert proto.package == "inference"
    assert "ModelStreamInfer" in {m.name for m in proto.service[0].method}
    missing = await reflect(served, rpb.ServerReflectionRequest(file_containing_symbol="no.Such"))
    assert missing.error_response.error_code == StatusCode.NOT_FOUND


# -- real clients, over TCP ----------------------------------------------------------------


async def test_grpcio_health_stub_and_reflection_client_see_a_gateway() -> None:
    async with open_fleet(1) as fleet:

        def with_grpcio() -> tuple[int, list[str]]:
            with grpc.insecure_channel(fleet.target) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
                database = ProtoReflectionDescriptorDatabase(channel)
                return status, sorted(database.get_services())

        status, services = await in_thread(with_grpcio)
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert "inference.GRPCInferenceService" in services
        assert "reactant_control.GatewayControlService" in services


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl is not installed")
async def test_grpcurl_lists_describes_and_checks_health_without_protos() -> None:
    async with open_fleet(1) as fleet:

        async def grpcurl(*args: str) -> str:
            done = await trio.run_process(
                ["grpcurl", "-plaintext", *args], capture_stdout=True, capture_stderr=True
            )
            return done.stdout.decode()

        listed = (await grpcurl(fleet.target, "list")).split()
        assert "inference.GRPCInferenceService" in listed
        assert "grpc.health.v1.Health" in listed
        described = await grpcurl(fleet.target, "describe", "inference.GRPCInferenceService")
        assert "rpc ModelInfer" in described
        health = json.loads(await grpcurl(fleet.target, "grpc.health.v1.Health/Check"))
        assert health == {"status": "SERVING"}
        ready = json.loads(
            await grpcurl(
                "-d",
                '{"name": "simple"}',
                fleet.target,
                "inference.GRPCInferenceService/ModelReady",
            )
        )
        assert ready == {"ready": True}
