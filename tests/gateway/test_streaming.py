"""ModelStreamInfer through the gateway, against real workers.

On memory streams with the autojump clock through rsgw's channel, and once with
tritonclient's stream over TCP.
"""

from __future__ import annotations

from functools import partial

import pytest
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.worker.models._catalogue import builtin_catalogue
from tests.gateway.fleet import open_fleet
from tests.helpers import (
    catalogue_from_yaml,
    in_thread,
    infer_request,
    simple_inputs,
    stream_simple,
)

OTHER_AND_SLOW = catalogue_from_yaml(
    """
models:
  - name: other
    compute: add_sub
    max_batch_size: 8
    inputs:
      - {name: INPUT0, datatype: INT32, shape: [-1, 16]}
      - {name: INPUT1, datatype: INT32, shape: [-1, 16]}
    outputs:
      - {name: OUTPUT0, datatype: INT32, shape: [-1, 16]}
      - {name: OUTPUT1, datatype: INT32, shape: [-1, 16]}
  - name: slow
    compute: add_sub
    launch_ms: 5000
    inputs:
      - {name: INPUT0, datatype: INT32, shape: [1, 16]}
      - {name: INPUT1, datatype: INT32, shape: [1, 16]}
    outputs:
      - {name: OUTPUT0, datatype: INT32, shape: [1, 16]}
      - {name: OUTPUT1, datatype: INT32, shape: [1, 16]}
""",
    with_builtin=False,
)


def request(model: str, request_id: str, seed: int = 0) -> bytes:
    return infer_request(model, simple_inputs(seed), request_id=request_id).SerializeToString()


async def test_each_message_goes_to_a_worker_serving_its_model(autojump_clock: MockClock) -> None:
    catalogues = [builtin_catalogue(), builtin_catalogue(), OTHER_AND_SLOW]
    async with open_fleet(3, memory=True, catalogues=catalogues) as fleet:
        async with fleet.channel().stream(Method.MODEL_STREAM_INFER.wire) as stream:
            for i in range(4):
                await stream.send(request("simple", f"s{i}", i))
                await stream.send(request("other", f"o{i}", i))
            await stream.send(request("nope", "n"))
            stream.end()
            replies = [pb.ModelStreamInferResponse.FromString(r) async for r in stream]
        assert [r.error_message for r in replies if r.error_message] == [
            "Request for unknown model: 'nope' is not found"
        ]
        ids = sorted(r.infer_response.id for r in replies if not r.error_message)
        assert ids == sorted([f"s{i}" for i in range(4)] + [f"o{i}" for i in range(4)])
        served = [w.service.device.counters for w in fleet.workers]
        assert served[2]["other"].requests_served == 4  # only worker2 serves it
        assert served[0]["simple"].requests_served + served[1]["simple"].requests_served == 4


async def test_a_worker_killed_mid_stream_ends_it_unavailable(autojump_clock: MockClock) -> None:
    async with open_fleet(1, memory=True, catalogues=[OTHER_AND_SLOW]) as fleet:
        with pytest.raises(GrpcError) as caught:
            async with fleet.channel().stream(Method.MODEL_STREAM_INFER.wire) as stream:
                await stream.send(request("slow", "x"))
                fleet.workers[0].kill()  # dies with the request in flight
                await stream.receive()  # never a hang
        assert (caught.value.code, caught.value.message) == (
            StatusCode.UNAVAILABLE,
            "worker0 is unavailable",
        )


async def test_tritonclient_streams_through_the_gateway() -> None:
    async with open_fleet(2) as fleet:
        got = await in_thread(partial(stream_simple, fleet.target, 4))
        assert sorted(request_id for request_id, _ in got) == ["0", "1", "2", "3"]
        assert all(error is None for _, error in got)
