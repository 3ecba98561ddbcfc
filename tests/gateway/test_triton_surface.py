"""What Triton's stock example clients do, done with tritonclient through the gateway.

The project's own calls (no example code): sequences by correlation id (integer and
string, sync and streamed, dyna), a decoupled model's many answers on a stream,
classification with labels, typed contents and their error, model control with a
config override, and the ensemble. Two workers behind the gateway over loopback, so
every call is also routed.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.gateway.fleet import open_fleet

VALUES = [11, 7, 5, 3, 2, 0, 1]


def _sequence_input(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
    return [tensor]


def _sequences(target: str, model: str, sequence_id: int | str) -> list[int]:
    client = grpcclient.InferenceServerClient(target)
    values = [0, *VALUES]
    got = []
    for i, value in enumerate(values):
        result = client.infer(
            model,
            _sequence_input(value),
            sequence_id=sequence_id,
            sequence_start=i == 0,
            sequence_end=i == len(values) - 1,
        )
        got.append(int(result.as_numpy("OUTPUT")[0][0]))
    client.close()
    return got


async def test_sequences_through_the_gateway() -> None:
    async with open_fleet(2) as fleet:
        plain = await trio.to_thread.run_sync(_sequences, fleet.target, "simple_sequence", 1000)
        assert plain == [1, *VALUES]
        dyna = await trio.to_thread.run_sync(_sequences, fleet.target, "simple_dyna_sequence", 1001)
        assert dyna == [1, *VALUES[:-1], VALUES[-1] + 1001]
        text = await trio.to_thread.run_sync(_sequences, fleet.target, "simple_sequence", "a-b-c")
        assert text == [1, *VALUES]
        counters = [w.service.device.counters["simple_sequence"] for w in fleet.workers]
        served = [c.requests_served for c in counters]
        # Each sequence of 8 stayed on the worker that took its START.
        assert sum(served) == 16 and all(n % 8 == 0 for n in served)


def _streamed(target: str) -> dict[str, list[int]]:
    replies: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(target)
    client.start_stream(callback=lambda result, error: replies.put(error or result))
    values = [20, *[-v for v in VALUES]]
    for sequence in ("1002", "1003"):
        for i, value in enumerate(values):
            client.async_stream_infer(
                "simple_string_dyna_sequence",
                _sequence_input(value),
                request_id=f"{sequence}_{i}",
                sequence_id=sequence,
                sequence_start=i == 0,
                sequence_end=i == len(values) - 1,
            )
    by_sequence: dict[str, list[int]] = {"1002": [], "1003": []}
    for _ in range(2 * len(values)):
        reply = replies.get(timeout=20)
        assert isinstance(reply, grpcclient.InferResult), reply
        sequence = reply.get_response().id.split("_")[0]
        by_sequence[sequence].append(int(reply.as_numpy("OUTPUT")[0][0]))
    client.stop_stream()
    client.close()
    return by_sequence


async def test_a_streamed_dyna_sequence_accumulates_in_order() -> None:
    async with open_fleet(2) as fleet:
        got = await trio.to_thread.run_sync(_streamed, fleet.target)
        running = list(np.cumsum([20, *[-v for v in VALUES]]))
        assert got["1002"] == [*running[:-1], running[-1] + 1002]
        assert got["1003"] == [*running[:-1], running[-1] + 1003]


def _repeat(target: str, count: int) -> list[tuple[int, bool]]:
    replies: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(target)
    client.start_stream(callback=lambda result, error: replies.put(error or result))
    inputs = [
        grpcclient.InferInput("IN", [count], "INT32"),
        grpcclient.InferInput("DELAY", [count], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.arange(100, 100 + count, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.full(count, 5, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([5], dtype=np.uint32))
    client.async_stream_infer("repeat_int32", inputs, enable_empty_final_response=True)
    got = []
    while True:
        reply = replies.get(timeout=20)
        assert isinstance(reply, grpcclient.InferResult), reply
        final = reply.get_response().parameters["triton_final_response"].bool_param
        out = reply.as_numpy("OUT")
        got.append((int(out[0]) if out is not None else -1, final))
        if final:
            break
    client.stop_stream()
    client.close()
    return got


async def test_a_decoupled_model_streams_many_answers() -> None:
    async with open_fleet(2) as fleet:
        got = await trio.to_thread.run_sync(_repeat, fleet.target, 6)
        assert got == [*[(100 + i, False) for i in range(6)], (-1, True)]


def _classes(target: str) -> list[str]:
    client = grpcclient.InferenceServerClient(target)
    image = grpcclient.InferInput("data_0", [3, 224, 224], "FP32")
    image.set_data_from_numpy(np.random.default_rng(0).random((3, 224, 224), dtype=np.float32))
    output = grpcclient.InferRequestedOutput("fc6_1", class_count=3)
    result = client.infer("densenet_onnx", [image], outputs=[output])
    client.close()
    return [item.decode() for item in result.as_numpy("fc6_1")]


async def test_classification_with_labels() -> None:
    async with open_fleet(2) as fleet:
        classes = await trio.to_thread.run_sync(_classes, fleet.target)
        assert len(classes) == 3
        value, index, label = classes[0].split(":", 2)
        assert float(value) > 0 and 0 <= int(index) < 1000 and label


def _model_control(target: str) -> tuple[int, int, str]:
    client = grpcclient.InferenceServerClient(target)
    client.load_model("simple", config='{"max_batch_size":"16"}')
    overridden = client.get_model_config("simple").config.max_batch_size
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    client.load_model("simple")
    restored = client.get_model_config("simple").config.max_batch_size
    client.close()
    return overridden, restored, caught.value.message()


async def test_model_control_with_a_config_override() -> None:
    async with open_fleet(2) as fleet:
        overridden, restored, message = await trio.to_thread.run_sync(_model_control, fleet.target)
        assert (overridden, restored) == (16, 8)
        assert "failed to load 'simple'" in message
