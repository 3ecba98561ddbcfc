"""Stateful models on the worker: Triton's sequence batcher semantics, end to end.

Memory streams and the autojump clock (`tests.worker.client`): idle timeouts of
seconds cost no wall time. tritonclient's sequence calls over TCP are in
test_triton_examples.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.worker._worker import WorkerConfig
from tests.helpers import infer_request, output_array
from tests.worker.client import WorkerClient, grpc_error, open_memory_worker

CONFIG = WorkerConfig(port=0, metrics_port=-1)


def request(
    model: str, value: int, sequence: int | str, *, start: bool = False, end: bool = False
) -> pb.ModelInferRequest:
    message = infer_request(model, {"INPUT": np.full((1, 1), value, dtype=np.int32)})
    if isinstance(sequence, str):
        message.parameters["sequence_id"].string_param = sequence
    else:
        message.parameters["sequence_id"].int64_param = sequence
    message.parameters["sequence_start"].bool_param = start
    message.parameters["sequence_end"].bool_param = end
    message.id = f"{sequence}_{value}"
    return message


async def run(client: WorkerClient, message: pb.ModelInferRequest) -> int:
    return int(output_array(await client.infer(message), "OUTPUT")[0][0])


async def send_sequence(
    client: WorkerClient, model: str, values: list[int], sequence: int | str
) -> list[int]:
    last = len(values) - 1
    return [
        await run(client, request(model, v, sequence, start=i == 0, end=i == last))
        for i, v in enumerate(values)
    ]


VALUES = [0, 11, 7, 5, 3, 2, 0, 1]


async def test_simple_sequence_interleaved(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        results: dict[int, list[int]] = {}

        async def one(sequence: int, sign: int) -> None:
            values = [v * sign for v in VALUES]
            results[sequence] = await send_sequence(client, "simple_sequence", values, sequence)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 1000, 1)
            nursery.start_soon(one, 1001, -1)
        # OUTPUT = INPUT, plus 1 on the START request.
        assert results[1000] == [1, 11, 7, 5, 3, 2, 0, 1]
        assert results[1001] == [1, -11, -7, -5, -3, -2, 0, -1]
        assert len(client.worker.service.stateful.book) == 0  # both ended


async def test_dyna_sequences_add_the_correlation_id_at_end(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        got = await send_sequence(client, "simple_dyna_sequence", VALUES, 1000)
        assert got == [1, 11, 7, 5, 3, 2, 0, 1 + 1000]
        values = [20, -11, -7, -5, -3, -2, 0, -1]
        got = await send_sequence(client, "simple_string_dyna_sequence", values, "1002")
        running = list(np.cumsum(values))
        running[-1] += 1002
        assert got == running


async def test_sequence_refusals(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        code, message = await grpc_error(client.infer(request("simple_sequence", 1, 5)))
        assert code is StatusCode.INVALID_ARGUMENT
        assert "must specify the START flag on the first request" in message
        no_id = infer_request("simple_sequence", {"INPUT": np.ones((1, 1), np.int32)})
        code, message = await grpc_error(client.infer(no_id))
        assert "must specify a non-zero or non-empty correlation ID" in message
        two_rows = request("simple_sequence", 1, 6, start=True)
        two_rows.inputs[0].shape[:] = [2, 1]
        two_rows.raw_input_contents[0] = np.ones((2, 1), np.int32).tobytes()
        code, message = await grpc_error(client.infer(two_rows))
        assert "must specify batch-size 1" in message
        code, message = await grpc_error(
            client.infer(request("simple_dyna_sequence", 1, "text", start=True))
        )
        assert "takes unsigned integer correlation ids" in message


async def test_an_idle_sequence_must_start_again(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        assert await run(client, request("simple_sequence", 4, 9, start=True)) == 5
        await trio.sleep(1.5)  # simple_sequence's idle time is Triton's default, 1 s
        _, message = await grpc_error(client.infer(request("simple_sequence", 4, 9)))
        assert "START flag" in message
        assert await run(client, request("simple_sequence", 4, 9, start=True)) == 5
        await trio.sleep(0.5)
        assert await run(client, request("simple_sequence", 4, 9, end=True)) == 4


async def test_a_stream_answers_each_sequence_in_order(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        values = [20, -11, -7, -5, -3, -2, 0, -1]
        async with client.channel.stream(Method.MODEL_STREAM_INFER.wire) as stream:
            for sequence in ("1", "2"):
                for i, value in enumerate(values):
                    message = request(
                        "simple_string_dyna_sequence",
                        value,
                        sequence,
                        start=i == 0,
                        end=i == len(values) - 1,
                    )
                    await stream.send(message.SerializeToString())
            stream.end()
            replies = [pb.ModelStreamInferResponse.FromString(r) async for r in stream]
        assert all(not r.error_message for r in replies)
        by_sequence: dict[str, list[int]] = {"1": [], "2": []}
        for reply in replies:
            sequence = reply.infer_response.id.split("_")[0]
            by_sequence[sequence].append(int(output_array(reply.infer_response, "OUTPUT")[0][0]))
        running = [int(v) for v in np.cumsum(values)]
        assert by_sequence["1"][:-1] == running[:-1] and by_sequence["1"][-1] == running[-1] + 1
        assert by_sequence["2"][:-1] == running[:-1] and by_sequence["2"][-1] == running[-1] + 2


async def test_model_config_reports_the_sequence_batcher(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        config = (
            await client.call(
                Method.MODEL_CONFIG,
                pb.ModelConfigRequest(name="simple_string_dyna_sequence"),
                pb.ModelConfigResponse,
            )
        ).config
        batching = config.sequence_batching
        assert batching.max_sequence_idle_microseconds == 10_000_000
        assert [c.name for c in batching.control_input] == ["START", "END", "READY", "CORRID"]
        assert batching.control_input[3].control[0].data_type == pb.TYPE_STRING
        assert list(batching.control_input[0].control[0].int32_false_true) == [0, 1]
        assert not config.HasField("dynamic_batching")
        metadata = await client.model_metadata("simple_sequence")
        assert [t.name for t in metadata.inputs] == ["INPUT"]  # controls are not inputs


@pytest.mark.parametrize("model", ["simple_sequence", "simple_string_dyna_sequence"])
async def test_unload_forgets_live_sequences(model: str, autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        await run(client, request(model, 1, "7", start=True))
        assert len(client.worker.service.stateful.book) == 1
        await client.call(
            Method.REPOSITORY_MODEL_UNLOAD,
            pb.RepositoryModelUnloadRequest(model_name=model),
            pb.RepositoryModelUnloadResponse,
        )
        assert len(client.worker.service.stateful.book) == 0
