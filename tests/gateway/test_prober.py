"""The prober's hang handling, wedge condition, single-flight discovery, and one
broken worker's replies staying that worker's failure.

The stand-in worker here is scripted on purpose: a real worker cannot be told to
hang its ServerReady while still accepting connections, to count or hold discovery
calls, nor to answer bytes that do not parse (beside it there, a real simulated
worker). Workers and gateway run on memory streams with the autojump clock, so the
probe watchdog and the refresh floor cost no wall time.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._call import CallContext, UnaryHandler
from rsgw.base._errors import GatewayWedged
from rsgw.base._methods import Method
from rsgw.config._config import GatewayConfig, ListenConfig
from rsgw.gateway._gateway import serve_gateway
from rsgw.gateway._running import RunningGateway
from rsgw.gateway.fleet._model_discovery import MIN_REFRESH_INTERVAL
from rsgw.grpc._server import GrpcServer
from rsgw.scheduling.knobs._knobs import SchedulingMode
from rsgw.scheduling.knobs._settings import SchedulingConfig
from rsgw.worker._worker import RunningWorker, WorkerConfig
from rsgw.worker.models._catalogue import builtin_catalogue
from tests.gateway.fleet import start_worker
from tests.helpers import wait_until_async
from tests.memory import MemoryNetwork

#: Not a protobuf message (a tag whose varint never ends): what a broken worker sends.
GARBLED = b"\xff\xff\xff"


class ScriptedWorker:
    """Answers ServerReady and RepositoryIndex; can be told to hang."""

    def __init__(self) -> None:
        self.hang = False
        self.index_calls = 0
        self.index_gate: trio.Event | None = None
        #: The models RepositoryIndex reports, as they are when the call arrives.
        self.models = ["m"]
        #: The next RepositoryIndex call (only that one) answers once this is set.
        self.hold: trio.Event | None = None
        self.reading = 0
        self.most_reading = 0

    async def ready(self, body: bytes, call: CallContext) -> bytes:
        if self.hang:
            await trio.sleep_forever()
        return pb.ServerReadyResponse(ready=True).SerializeToString()

    async def index(self, body: bytes, call: CallContext) -> bytes:
        self.index_calls += 1
        models = list(self.models)
        hold, self.hold = self.hold, None
        self.reading += 1
        self.most_reading = max(self.most_reading, self.reading)
        try:
            if self.hang:
                await trio.sleep_forever()
            if self.index_gate is not None:
                await self.index_gate.wait()
            if hold is not None:
                await hold.wait()
        finally:
            self.reading -= 1
        response = pb.RepositoryIndexResponse()
        for name in models:
            response.models.add(name=name, state="READY")
        return response.SerializeToString()

    def server(self, **extra: UnaryHandler) -> GrpcServer:
        """A server for these handlers; `extra` adds methods by their full path."""
        return GrpcServer(
            {
                Method.SERVER_READY.path: self.ready,
                Method.REPOSITORY_INDEX.path: self.index,
                **extra,
            }
        )


async def serve(
    worker: ScriptedWorker,
    nursery: trio.Nursery,
    network: MemoryNetwork,
    server: GrpcServer | None = None,
    **overrides: object,
) -> RunningGateway:
    """Start the scripted worker and a gateway in front of it, both on `network`."""
    server = server or worker.server()
    port = await nursery.start(partial(server.serve, network=network), "127.0.0.1", 0)
    gateway: RunningGateway = await nursery.start(
        partial(serve_gateway, network=network), config(port, **overrides)
    )
    return gateway


def config(port: int, **overrides: object) -> GatewayConfig:
    base = GatewayConfig(
        endpoints=(f"127.0.0.1:{port}",),
        listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        health_interval_seconds=0.05,
        probe_timeout_seconds=0.2,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]  # test overrides


async def test_a_hung_probe_resets_the_channel(autojump_clock: MockClock) -> None:
    worker = ScriptedWorker()
    async with trio.open_nursery() as nursery:
        gateway = await serve(worker, nursery, MemoryNetwork(), wedge_exit_rounds=0)
        assert gateway.statistics().ready
        worker.hang = True
        await wait_until_async(lambda: gateway.statistics().channel_resets > 0, what="a reset")
        assert not gateway.statistics().ready
        worker.hang = False
        await wait_until_async(lambda: bool(gateway.statistics().ready), what="ready again")
        nursery.cancel_scope.cancel()


async def test_wedged_fleet_raises_gateway_wedged(autojump_clock: MockClock) -> None:
    worker = ScriptedWorker()
    with pytest.RaisesGroup(GatewayWedged, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await serve(worker, nursery, MemoryNetwork(), wedge_exit_rounds=2)
            worker.hang = True  # responsive once, now every probe hangs
            with trio.fail_after(10):
                await trio.sleep_forever()


async def test_never_responsive_fleet_is_not_wedged(autojump_clock: MockClock) -> None:
    worker = ScriptedWorker()
    worker.hang = True
    async with trio.open_nursery() as nursery:
        gateway = await serve(worker, nursery, MemoryNetwork(), wedge_exit_rounds=1)
        await wait_until_async(lambda: gateway.statistics().probe_rounds >= 3, what="three rounds")
        nursery.cancel_scope.cancel()


async def test_on_demand_refresh_is_single_flight(autojump_clock: MockClock) -> None:
    worker = ScriptedWorker()
    async with trio.open_nursery() as nursery:
        gateway = await serve(worker, nursery, MemoryNetwork(), health_interval_seconds=3600)
        prober = gateway._service.prober
        await trio.sleep(MIN_REFRESH_INTERVAL + 0.1)  # past the startup discovery's floor
        before = worker.index_calls
        worker.index_gate = trio.Event()
        async with trio.open_nursery() as callers:
            for _ in range(10):
                callers.start_soon(prober.discovery.refresh_now)
            await trio.testing.wait_all_tasks_blocked(0.05)
            worker.index_gate.set()
        assert worker.index_calls == before + 1
        await prober.discovery.refresh_now()  # within the 1 s floor: no new scan
        assert worker.index_calls == before + 1
        nursery.cancel_scope.cancel()


async def test_an_older_discovery_never_replaces_a_newer_table(autojump_clock: MockClock) -> None:
    """A probe round that comes while an on-demand discovery is slow waits for it and
    reads after it: discoveries never overlap, so the slow one's older answer cannot
    land on top of the round's newer one."""
    worker = ScriptedWorker()
    async with trio.open_nursery() as nursery:
        gateway = await serve(
            worker, nursery, MemoryNetwork(), health_interval_seconds=3600, probe_timeout_seconds=60
        )
        prober = gateway._service.prober
        await trio.sleep(MIN_REFRESH_INTERVAL + 0.1)  # past the startup discovery's floor
        slow = worker.hold = trio.Event()

        async def probe_round() -> None:
            prober.wake()
            await prober.next_round()

        async with trio.open_nursery() as callers:
            callers.start_soon(prober.discovery.refresh_now)  # reads ["m"], then is slow to answer
            await trio.testing.wait_all_tasks_blocked()
            worker.models = ["m", "n"]  # the fleet changes meanwhile...
            callers.start_soon(probe_round)  # ...and a round rediscovers
            await trio.testing.wait_all_tasks_blocked()
            slow.set()
        assert prober.discovery.table.replicas("n") == gateway.statistics().workers
        assert worker.most_reading == 1, "discoveries overlapped"
        nursery.cancel_scope.cancel()


async def test_a_hung_control_status_poll_resets_the_channel(autojump_clock: MockClock) -> None:
    worker = ScriptedWorker()
    poll_started = trio.Event()

    async def control_status(body: bytes, call: CallContext) -> bytes:
        poll_started.set()
        await trio.sleep_forever()
        return b""  # pragma: no cover

    server = worker.server(**{Method.MODEL_CONTROL_STATUS.path: control_status})
    async with trio.open_nursery() as nursery:
        least = SchedulingConfig(mode=SchedulingMode.LEAST_OUTSTANDING)
        gateway = await serve(
            worker, nursery, MemoryNetwork(), server, scheduling=least, health_interval_seconds=3600
        )
        assert poll_started.is_set()  # the first round polled before serving
        assert gateway.statistics().channel_resets == 0  # a poll is not a probe...
        assert gateway.statistics().ready  # ...and the worker stays ready
        (channel,) = gateway._service.pool.channels.values()
        assert channel.connects == 1 and not channel.connected  # ...but its channel was dropped
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "method", [Method.SERVER_READY, Method.REPOSITORY_INDEX, Method.MODEL_CONTROL_STATUS]
)
async def test_a_reply_that_does_not_parse_fails_that_worker_alone(
    autojump_clock: MockClock, method: Method, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose probe reply does not parse has failed that probe; the round
    still applies to the others (a real worker beside it is ready and routed)."""

    async def garbled(body: bytes, call: CallContext) -> bytes:
        return GARBLED

    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        real = WorkerConfig(
            name="good", gpu="0", port=0, metrics_port=-1, catalogue=builtin_catalogue()
        )
        good: RunningWorker = await nursery.start(start_worker, real, network)
        broken = ScriptedWorker().server(**{method.path: garbled})
        port = await nursery.start(partial(broken.serve, network=network), "127.0.0.1", 0)
        good_url, broken_url = f"127.0.0.1:{good.grpc_port}", f"127.0.0.1:{port}"
        least = SchedulingConfig(mode=SchedulingMode.LEAST_OUTSTANDING)  # polls ModelControlStatus
        gateway: RunningGateway = await nursery.start(
            partial(serve_gateway, network=network),
            config(
                good.grpc_port,
                endpoints=(good_url, broken_url),
                scheduling=least,
                health_interval_seconds=3600,
            ),
        )
        status = gateway.statistics()  # the first round has run
        assert status.probe_rounds == 1
        assert good_url in status.ready
        assert status.models["simple"] == (good_url,)
        assert (broken_url in status.ready) is (method is not Method.SERVER_READY)
        assert "does not parse" in caplog.text
        nursery.cancel_scope.cancel()
