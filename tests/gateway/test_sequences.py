"""Sequence affinity through the gateway, against real workers (memory streams, autojump)."""

from __future__ import annotations

import pytest
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import infer_request, simple_inputs, wait_until_async


def step(sequence_id: int, i: int, *, start: bool = False, end: bool = False) -> bytes:
    request = infer_request("simple", simple_inputs(i), request_id=f"{sequence_id}-{i}")
    request.parameters["sequence_id"].int64_param = sequence_id
    if start:
        request.parameters["sequence_start"].bool_param = True
    if end:
        request.parameters["sequence_end"].bool_param = True
    return request.SerializeToString()


def served_by(fleet: Fleet) -> list[int]:
    return [w.service.device.counters["simple"].requests_served for w in fleet.workers]


async def test_twenty_requests_of_a_sequence_stay_on_one_worker(autojump_clock: MockClock) -> None:
    async with open_fleet(3, memory=True) as fleet:  # round robin
        await fleet.infer(infer_request("simple", simple_inputs(0)))  # move the rotation on
        for i in range(20):
            await fleet.infer(step(7, i, start=i == 0, end=i == 19))
        counts = served_by(fleet)
        assert sorted(counts) == [0, 1, 20] or sorted(counts) == [0, 0, 21]
        assert len(fleet.gateway._service.sequences) == 0  # ended: forgotten
        # Without sequence parameters the same calls rotate over the workers.
        before = served_by(fleet)
        for i in range(6):
            await fleet.infer(infer_request("simple", simple_inputs(i)))
        assert [b - a for a, b in zip(before, served_by(fleet), strict=True)] == [2, 2, 2]


async def test_a_sequence_in_a_stream_stays_on_one_worker(autojump_clock: MockClock) -> None:
    async with open_fleet(3, memory=True) as fleet:
        async with fleet.channel().stream(Method.MODEL_STREAM_INFER.wire) as stream:
            for i in range(12):
                await stream.send(step(9, i, start=i == 0, end=i == 11))
            stream.end()
            replies = [pb.ModelStreamInferResponse.FromString(r) async for r in stream]
        assert len(replies) == 12 and not any(r.error_message for r in replies)
        assert sorted(served_by(fleet)) == [0, 0, 12]


async def test_a_sequence_whose_worker_died_fails_and_is_never_moved(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(2, memory=True, health_interval_seconds=0.5) as fleet:
        await fleet.infer(step(5, 0, start=True))
        holder = served_by(fleet).index(1)
        fleet.workers[holder].kill()
        # Before the prober has noticed: the holder is tried alone, never another worker.
        with pytest.raises(GrpcError) as caught:
            await fleet.infer(step(5, 1))
        assert (caught.value.code, caught.value.message) == (
            StatusCode.UNAVAILABLE,
            f"worker{holder} is unavailable",
        )
        url = fleet.worker_url(holder)
        await wait_until_async(lambda: url not in fleet.gateway.statistics().ready)
        # Once it has: the sequence is aborted, its state lost with the worker.
        with pytest.raises(GrpcError) as caught:
            await fleet.infer(step(5, 2))
        assert caught.value.code is StatusCode.ABORTED
        assert f"held by worker{holder}" in caught.value.message
        assert served_by(fleet)[1 - holder] == 0  # nothing of it went to the survivor
        # Started again, the sequence lives on the surviving worker.
        await fleet.infer(step(5, 0, start=True))
        await fleet.infer(step(5, 1, end=True))
        assert served_by(fleet)[1 - holder] == 2
