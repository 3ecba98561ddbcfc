"""Limits, bad input, statuses, deadlines and admission through the gateway (items 5-6).

The admission, per-worker share, shedding, bad-input and deadline tests run the
fleet (in-process workers and the gateway) on memory streams with the autojump
clock, and call the gateway with rsgw's own client (`Fleet.infer`, which raises
`GrpcError`). They test the gateway's decisions, not the socket; the slow model's
launches (0.3 s, 3 s) then cost no wall time, and a call that is shed is shed
while the others are certainly still running, not because a thread was late.

Two tests stay on loopback TCP with real clients, because what they check is a
real client's side of the wire: the 64 MiB round trip through tritonclient
(grpcio's large-message handling, flow control over a real socket), and the
over-the-limit call, where grpcio is still uploading a message the gateway has
already refused while its other call on the same connection must go on.
"""

from __future__ import annotations

import math
from functools import partial

import grpc
import httpx
import numpy as np
import pytest
import trio
import trio.testing
import tritonclient.grpc as grpcclient
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._call import CallContext
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.config._config import ConnectionsConfig, GatewayConfig, GrpcLimits, ListenConfig
from rsgw.gateway._gateway import serve_gateway
from rsgw.gateway._running import RunningGateway
from rsgw.grpc._client import Channel
from rsgw.grpc._server import GrpcServer
from rsgw.grpc.protocol._metadata import format_timeout, parse_timeout
from rsgw.worker._worker import RunningWorker
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import (
    MODEL_INFER,
    catalogue_from_yaml,
    infer_request,
    simple_inputs,
    wait_until_async,
)
from tests.memory import MemoryNetwork

SLOW = """
models:
  - name: slow
    compute: add_sub
    max_batch_size: 1
    launch_ms: 300
    item_ms: 0
    inputs:
      - {name: INPUT0, datatype: INT32, shape: [-1, 16]}
      - {name: INPUT1, datatype: INT32, shape: [-1, 16]}
    outputs:
      - {name: OUTPUT0, datatype: INT32, shape: [-1, 16]}
      - {name: OUTPUT1, datatype: INT32, shape: [-1, 16]}
"""


def in_flight_at_least(workers: list[RunningWorker], count: int) -> bool:
    return sum(w.service.inflight for w in workers) >= count


def simple_body(seed: int = 0, model: str = "simple") -> bytes:
    return infer_request(model, simple_inputs(seed)).SerializeToString()


async def rejected(fleet: Fleet, body: bytes) -> GrpcError:
    """The status a ModelInfer through the gateway failed with; it must fail."""
    with pytest.raises(GrpcError) as caught:
        await fleet.infer(body)
    return caught.value


# ---------------------------------------------------------------------------
# Memory fleets with the autojump clock.


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"\x0a\x05abc", "malformed ModelInferRequest"),
        (pb.ModelInferRequest(id="7").SerializeToString(), "model_name is empty"),
    ],
)
async def test_malformed_or_nameless_is_invalid_argument(
    body: bytes, needle: str, autojump_clock: MockClock
) -> None:
    async with open_fleet(2, memory=True, health_interval_seconds=60) as fleet:
        error = await rejected(fleet, body)
        assert error.code is StatusCode.INVALID_ARGUMENT
        assert needle in error.message
        assert not error.message.startswith("worker ")  # the gateway's own answer


async def test_worker_invalid_argument_comes_from_exactly_one_worker(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(3, memory=True, health_interval_seconds=60) as fleet:
        request = infer_request("simple", simple_inputs(0))
        request.inputs[0].datatype = "FP32"
        error = await rejected(fleet, request.SerializeToString())
        assert error.code is StatusCode.INVALID_ARGUMENT
        # The worker is named (never addressed) in what the client reads.
        assert error.message.split(": ", 1)[0] in {"worker0", "worker1", "worker2"}
        assert "127.0.0.1" not in error.message
        assert "INPUT0" in error.message
        rejected_by = [
            w.service.metrics._requests.labels(
                w.config.name, w.config.gpu, "simple", "INVALID_ARGUMENT"
            )._value.get()
            for w in fleet.workers
        ]
        assert sorted(rejected_by) == [0, 0, 1]


async def test_worker_admission_shed_fails_over(autojump_clock: MockClock) -> None:
    catalogue = catalogue_from_yaml(SLOW)
    async with open_fleet(
        2,
        memory=True,
        catalogues=[catalogue, catalogue],
        worker_overrides=[{"max_concurrent_requests": 1}, {"max_concurrent_requests": 0}],
        health_interval_seconds=60,
    ) as fleet:
        results: list[pb.ModelInferResponse] = []

        async def one(seed: int) -> None:
            results.append(await fleet.infer(simple_body(seed, "slow")))

        async with trio.open_nursery() as nursery:
            for seed in range(3):  # worker0, worker1, then worker0 again: it sheds
                nursery.start_soon(one, seed)
                await wait_until_async(
                    partial(in_flight_at_least, fleet.workers, seed + 1),
                    what="the call to land on a worker",
                )
        assert len(results) == 3
        assert all(response.model_name == "slow" for response in results)
        assert [w.service.shed_total for w in fleet.workers] == [1, 0]
        served = [w.service.device.counters["slow"].requests_served for w in fleet.workers]
        assert served == [1, 2]


async def test_gateway_admission_cap_queues_what_can_wait_and_sheds_what_cannot(
    autojump_clock: MockClock,
) -> None:
    """At the cap a call waits for a slot if the queue clears before its deadline.

    One slow call per worker fills the cap (2). A third with a 5 s deadline waits in the
    gateway's queue and is served. The gateway reads on up to twice the cap, so a
    fourth with 0.1 s left is read and refused at once, RESOURCE_EXHAUSTED, rather than
    left to time out (docs: gateway/calls/_admission.py).
    """
    catalogue = catalogue_from_yaml(SLOW)
    limits = GrpcLimits(max_concurrent_requests_per_worker=1)
    async with open_fleet(
        2,
        memory=True,
        catalogues=[catalogue, catalogue],
        grpc=limits,
        health_interval_seconds=60,
    ) as fleet:
        outcomes: dict[int, StatusCode] = {}

        async def one(seed: int, seconds: float) -> None:
            try:
                deadline = trio.current_time() + seconds
                await fleet.infer(simple_body(seed, "slow"), deadline=deadline)
                outcomes[seed] = StatusCode.OK
            except GrpcError as exc:
                outcomes[seed] = exc.code

        async with trio.open_nursery() as nursery:
            for seed, seconds in enumerate((60.0, 60.0, 5.0, 0.1)):
                nursery.start_soon(one, seed, seconds)
                await trio.testing.wait_all_tasks_blocked()
        assert outcomes == {
            0: StatusCode.OK,
            1: StatusCode.OK,
            2: StatusCode.OK,  # queued, then served
            3: StatusCode.RESOURCE_EXHAUSTED,  # it could not finish in time: refused
        }
        assert fleet.gateway._service.metrics.shed._value.get() == 1


async def test_a_worker_holding_its_share_sheds_its_models_only(
    autojump_clock: MockClock,
) -> None:
    """worker0 alone serves `slow`; two slow calls fill its share (2 of the 4 the gateway
    admits). A third slow call is shed at once, while `simple` (on both workers) skips
    the full worker and is served by the other: one hot worker's backlog cannot take
    the whole admission cap from the models of every other worker."""
    hot = catalogue_from_yaml(SLOW.replace("launch_ms: 300", "launch_ms: 3000"))
    limits = GrpcLimits(max_concurrent_requests_per_worker=2)
    async with open_fleet(
        2,
        memory=True,
        catalogues=[hot, catalogue_from_yaml("models: []")],
        grpc=limits,
        health_interval_seconds=60,
    ) as fleet:
        service = fleet.gateway._service
        worker0 = fleet.gateway.config.endpoints[0]
        async with trio.open_nursery() as nursery:
            for seed in range(2):
                nursery.start_soon(fleet.infer, simple_body(seed, "slow"))
            await wait_until_async(lambda: service.ledger.held(worker0) == 2, 10)
            started = trio.current_time()
            error = await rejected(fleet, simple_body(9, "slow"))
            assert error.code is StatusCode.RESOURCE_EXHAUSTED
            assert "at its limit of 2 concurrent requests" in error.message
            for seed in range(4):  # round robin would send two of these to worker0
                await fleet.infer(simple_body(seed))
            assert service.ledger.held(worker0) == 2  # still busy with the slow pair
            # Shed at once and served at once: nothing waited for the slow pair.
            assert trio.current_time() - started < 0.3
        assert service.metrics.shed._value.get() == 1
        counters = fleet.workers[1].service.device.counters
        assert counters["simple"].requests_served == 4
        assert fleet.workers[0].service.device.counters["slow"].requests_served == 2
    assert [service.ledger.held(url) for url in fleet.gateway.config.endpoints] == [0, 0]
    assert service.ledger.inflight == 0


async def test_lpt_packing_counts_a_shed_call_as_demand(autojump_clock: MockClock) -> None:
    """The packer sizes replicas from what clients offer: a call shed because its
    model's placed replica holds its share still counts, or a saturated model would
    look no busier than its cap and never get the replica it lacks."""
    from tests.gateway.test_lpt_packing import lpt

    hot = catalogue_from_yaml(SLOW.replace("launch_ms: 300", "launch_ms: 3000"))
    limits = GrpcLimits(max_concurrent_requests_per_worker=2)
    async with open_fleet(
        2,
        memory=True,
        catalogues=[hot, hot],
        grpc=limits,
        scheduling=lpt(default_replicas=1),
        health_interval_seconds=60,
    ) as fleet:
        service = fleet.gateway._service
        packing = fleet.gateway._packing
        assert packing is not None
        (placed,) = packing.packer.assignment["slow"].urls
        async with trio.open_nursery() as nursery:
            for seed in range(2):
                nursery.start_soon(fleet.infer, simple_body(seed, "slow"))
            await wait_until_async(lambda: service.ledger.held(placed) == 2, 10)
            for seed in range(3):  # the other worker has room, but slow is not placed there
                error = await rejected(fleet, simple_body(seed + 2, "slow"))
                assert error.code is StatusCode.RESOURCE_EXHAUSTED
            assert packing.packer.pending_arrivals().get("slow") == 5
        assert service.metrics.shed._value.get() == 3


async def test_forwarded_deadline_is_at_most_the_clients(autojump_clock: MockClock) -> None:
    """A recording stand-in worker: the real worker cannot report what it received."""
    received: list[float] = []

    async def ready(body: bytes, call_: CallContext) -> bytes:
        return pb.ServerReadyResponse(ready=True).SerializeToString()

    async def index(body: bytes, call_: CallContext) -> bytes:
        response = pb.RepositoryIndexResponse()
        response.models.add(name="echo", state="READY")
        return response.SerializeToString()

    async def infer(body: bytes, call_: CallContext) -> bytes:
        received.append(call_.deadline - trio.current_time())
        return pb.ModelInferResponse(model_name="echo").SerializeToString()

    worker = GrpcServer(
        {
            Method.SERVER_READY.path: ready,
            Method.REPOSITORY_INDEX.path: index,
            Method.MODEL_INFER.path: infer,
        }
    )
    network = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(worker.serve, network=network), "127.0.0.1", 0)
        config = GatewayConfig(
            endpoints=(f"127.0.0.1:{port}",),
            listen=ListenConfig(grpc="127.0.0.1:0", metrics="127.0.0.1:0", http="127.0.0.1:0"),
        )
        gateway: RunningGateway = await nursery.start(
            partial(serve_gateway, network=network), config
        )
        client = Channel(f"127.0.0.1:{gateway.grpc_port}", nursery, network=network)
        body = pb.ModelInferRequest(model_name="echo").SerializeToString()
        # No virtual time passes inside the gateway, so the worker gets the whole budget
        # the client sent (the clock stands at 0 here: nothing slept, the sums are exact).
        await client.unary(Method.MODEL_INFER.wire, body, deadline=trio.current_time() + 0.3)
        assert 0 < received[-1] <= 0.3
        assert received[-1] == pytest.approx(0.3)
        await client.unary(Method.MODEL_INFER.wire, body, deadline=trio.current_time() + 1000)
        assert 59 < received[-1] <= 60  # request_timeout_seconds (60) caps the client's 1000 s
        assert received[-1] == pytest.approx(60)
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------------
# Real clients on loopback TCP (see the module docstring).


def call(target: str, body: bytes, timeout: float = 30) -> bytes:
    with grpc.insecure_channel(
        target,
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
    ) as channel:
        return channel.unary_unary(MODEL_INFER)(body, timeout=timeout)  # type: ignore[no-any-return]


async def test_64_mib_round_trips_byte_exact() -> None:
    async with open_fleet(2, health_interval_seconds=60) as fleet:
        payload = np.frombuffer(np.random.default_rng(1).bytes(64 * 1024 * 1024), dtype=np.uint8)

        def identity() -> bytes:
            client = grpcclient.InferenceServerClient(fleet.target)
            tensor = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[payload.tobytes()]], dtype=np.object_))
            result = client.infer("simple_identity", [tensor])
            client.close()
            return result.as_numpy("OUTPUT0")[0][0]  # type: ignore[no-any-return]

        assert await trio.to_thread.run_sync(identity) == payload.tobytes()


async def test_over_the_limit_is_resource_exhausted_and_others_go_on() -> None:
    limits = GrpcLimits(max_recv_msg_bytes=1024 * 1024, max_send_msg_bytes=1024 * 1024)
    async with open_fleet(2, health_interval_seconds=60, grpc=limits) as fleet:

        def both() -> tuple[grpc.RpcError, bytes]:
            with grpc.insecure_channel(
                fleet.target, options=[("grpc.max_send_message_length", -1)]
            ) as channel:
                method = channel.unary_unary(MODEL_INFER)
                big = method.future(
                    b"\x0a\x06simple" + b"\x3a" + b"\x80\x80\x80\x01" + b"x" * (2 << 20)
                )
                ok = method.future(simple_body(1))
                try:
                    big.result()
                except grpc.RpcError as exc:
                    return exc, ok.result()
            raise AssertionError("oversized call succeeded")

        error, body = await trio.to_thread.run_sync(both)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "vs. 1048576" in error.details()
        assert pb.ModelInferResponse.FromString(body).model_name == "simple"


async def test_large_uploads_past_the_budget_wait_their_turn_through_grpcio() -> None:
    """Six 6 MiB requests at once from tritonclient (grpcio's flow control) against an
    8 MiB upload budget: every one answered byte-exact, some after waiting for a grant,
    the budget empty after, and the wait visible in the gateway's series."""
    connections = ConnectionsConfig(max_buffered_bytes_total=8 * 1024 * 1024)
    async with open_fleet(2, health_interval_seconds=60, connections=connections) as fleet:
        payloads = [np.random.default_rng(n).bytes(6 * 1024 * 1024) for n in range(6)]

        def identity(payload: bytes) -> bytes:
            client = grpcclient.InferenceServerClient(fleet.target)
            tensor = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[payload]], dtype=np.object_))
            try:
                return client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0")[0][0]  # type: ignore[no-any-return]
            finally:
                client.close()

        answers: list[bytes] = [b""] * len(payloads)

        async def one(index: int) -> None:
            answers[index] = await trio.to_thread.run_sync(identity, payloads[index])

        async with trio.open_nursery() as nursery:
            for index in range(len(payloads)):
                nursery.start_soon(one, index)
        assert answers == payloads
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{fleet.gateway.admin_port}/metrics")).text
        series = dict(
            line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("gateway_")
        )
        assert float(series['gateway_large_requests_total{outcome="after_wait"}']) > 0
        assert float(series['gateway_large_requests_total{outcome="refused"}']) == 0
        assert float(series['gateway_unfinished_request_bytes{state="granted"}']) == 0
        assert float(series["gateway_unfinished_request_bytes_limit"]) == 8 * 1024 * 1024


# ---------------------------------------------------------------------------
# Pure: no network at all.


def test_timeout_encoder_units_and_digit_limit() -> None:
    assert format_timeout(0.3) == b"300000u"
    assert format_timeout(99.999999) == b"99999999u"
    assert format_timeout(3600.0) == b"3600000m"
    assert format_timeout(10**9) == b"16666667M"
    for seconds in (1e-6, 0.3, 59.5, 100.0, 86400.0, 1e8):
        value = format_timeout(seconds)
        assert len(value) <= 9  # at most 8 digits and a unit
        assert parse_timeout(value) >= seconds
    assert math.isclose(parse_timeout(format_timeout(0.3)), 0.3)
