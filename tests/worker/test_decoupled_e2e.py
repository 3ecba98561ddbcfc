"""A decoupled model on the worker (Triton's repeat backend): many answers per request.

Memory streams and the autojump clock: the delays between answers are exact on the
Trio clock and cost no wall time.
"""

from __future__ import annotations

import numpy as np
import trio
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.worker._worker import WorkerConfig
from tests.helpers import infer_request, output_array
from tests.worker.client import WorkerClient, grpc_error, open_memory_worker

CONFIG = WorkerConfig(port=0, metrics_port=-1)


def repeat(values: list[int], delays: list[int], wait: int, **parameters: bool) -> bytes:
    request = infer_request(
        "repeat_int32",
        {
            "IN": np.array(values, dtype=np.int32),
            "DELAY": np.array(delays, dtype=np.uint32),
            "WAIT": np.array([wait], dtype=np.uint32),
        },
    )
    request.id = "r"
    for key, value in parameters.items():
        request.parameters[key].bool_param = value
    return request.SerializeToString()


async def stream_replies(
    client: WorkerClient, *bodies: bytes
) -> list[tuple[float, pb.ModelStreamInferResponse]]:
    started = trio.current_time()
    got = []
    async with client.channel.stream(Method.MODEL_STREAM_INFER.wire) as stream:
        for body in bodies:
            await stream.send(body)
        stream.end()
        async for reply in stream:
            got.append(
                (trio.current_time() - started, pb.ModelStreamInferResponse.FromString(reply))
            )
    return got


def final(reply: pb.ModelStreamInferResponse) -> bool:
    return reply.infer_response.parameters["triton_final_response"].bool_param


async def test_one_answer_per_element_each_after_its_delay(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        got = await stream_replies(client, repeat([100, 101, 102], [10, 20, 30], 50))
        assert [int(output_array(r.infer_response, "OUT")[0]) for _, r in got] == [100, 101, 102]
        assert [int(output_array(r.infer_response, "IDX")[0]) for _, r in got] == [0, 1, 2]
        times = [round(t, 3) for t, _ in got]
        assert times == [0.010, 0.030, 0.060]  # plus the device's 0.1 ms launch, rounded off
        assert not any(final(r) for _, r in got)
        assert all(r.infer_response.id == "r" for _, r in got)


async def test_the_empty_final_answer_on_request(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        body = repeat([7], [5], 40, triton_enable_empty_final_response=True)
        got = await stream_replies(client, body, repeat([], [], 0))
        finals = [(round(t, 3), r) for t, r in got if final(r)]
        assert len(got) == 2  # the one element's answer, the final; the empty IN answers none
        ((at, last),) = finals
        assert at == 0.045 and not last.infer_response.outputs


async def test_decoupled_refusals(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        code, message = await grpc_error(client.unary(Method.MODEL_INFER, repeat([1], [0], 0)))
        assert code is StatusCode.UNIMPLEMENTED
        assert message == "ModelInfer RPC doesn't support models with decoupled transaction policy"
        got = await stream_replies(client, repeat([1, 2], [0], 0))
        assert "DELAY must have one element per element of IN" in got[0][1].error_message
        config = await client.call(
            Method.MODEL_CONFIG, pb.ModelConfigRequest(name="repeat_int32"), pb.ModelConfigResponse
        )
        assert config.config.model_transaction_policy.decoupled
