"""Triton's ModelStreamInfer on the simulated worker.

On memory streams with the autojump clock through rsgw's channel, and once with
tritonclient's own stream over TCP, as a Triton user streams.
"""

from __future__ import annotations

from functools import partial

import grpc
import numpy as np
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.worker._worker import WorkerConfig, open_worker
from tests.helpers import in_thread, infer_request, output_array, simple_inputs, stream_simple
from tests.worker.client import open_memory_worker

CONFIG = WorkerConfig(port=0, metrics_port=-1)


async def test_each_request_is_answered_on_the_stream(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        requests = {str(i): simple_inputs(i) for i in range(8)}
        async with client.channel.stream(Method.MODEL_STREAM_INFER.wire) as stream:
            for request_id, inputs in requests.items():
                await stream.send(
                    infer_request("simple", inputs, request_id=request_id).SerializeToString()
                )
            await stream.send(infer_request("nope", simple_inputs(0)).SerializeToString())
            stream.end()
            replies = [pb.ModelStreamInferResponse.FromString(r) async for r in stream]
        errors = [r.error_message for r in replies if r.error_message]
        assert errors == [
            "Request for unknown model: 'nope' is not found"
        ]  # the stream went on after it
        answered = {r.infer_response.id: r.infer_response for r in replies if not r.error_message}
        assert set(answered) == set(requests)
        for request_id, inputs in requests.items():
            total = output_array(answered[request_id], "OUTPUT0")
            np.testing.assert_array_equal(total, inputs["INPUT0"] + inputs["INPUT1"])


async def test_tritonclient_streams_to_a_worker() -> None:
    async with open_worker(WorkerConfig(port=0, metrics_port=-1)) as worker:
        target = f"127.0.0.1:{worker.grpc_port}"
        got = await in_thread(partial(stream_simple, target, 3))
        assert sorted(request_id for request_id, _ in got) == ["0", "1", "2"]
        assert all(error is None for _, error in got)


def _long_stream(target: str, count: int) -> int:
    """`count` requests on one stream from grpcio with its window probing off, so it
    acknowledges every reply with WINDOW_UPDATEs as perf_analyzer --streaming does;
    how many replies came."""
    options = [("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(target, options=options) as channel:
        stream = channel.stream_stream(Method.MODEL_STREAM_INFER.path)
        body = infer_request("simple", simple_inputs(0)).SerializeToString()
        return sum(1 for _ in stream(iter([body] * count), timeout=30))


async def test_a_long_stream_of_small_requests_is_not_taken_for_a_flood() -> None:
    # Its acknowledgments (a stream and a connection WINDOW_UPDATE per reply) were
    # charged to the flood budget with nothing earned back: after about 700 replies
    # the worker answered GOAWAY ENHANCE_YOUR_CALM (perf_analyzer --streaming stalled).
    async with open_worker(WorkerConfig(port=0, metrics_port=-1)) as worker:
        target = f"127.0.0.1:{worker.grpc_port}"
        assert await in_thread(partial(_long_stream, target, 3000)) == 3000
