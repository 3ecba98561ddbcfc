"""Inference through the REST front door, as Triton's HTTP client sends it.

JSON tensors, binary tensors (the binary tensor data extension) and both in one
request, every scheduling mode, request and response compression, and the same
routing as the gRPC door: an unknown model 404, a worker that dies failed over.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from rsgw.config._config import SchedulingConfig, SchedulingMode
from tests.gateway.fleet import open_fleet
from tests.helpers import in_thread


def simple_call(
    client: triton_http.InferenceServerClient,
    seed: int,
    *,
    binary_inputs: tuple[bool, bool] = (False, False),
    binary_outputs: tuple[bool, bool] = (False, False),
    **options: object,
) -> None:
    """One `simple` call: INPUT0 + INPUT1 and INPUT0 - INPUT1, checked."""
    a = np.arange(seed, seed + 16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [
        triton_http.InferInput("INPUT0", [1, 16], "INT32"),
        triton_http.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary_inputs[0])
    inputs[1].set_data_from_numpy(b, binary_data=binary_inputs[1])
    outputs = [
        triton_http.InferRequestedOutput("OUTPUT0", binary_data=binary_outputs[0]),
        triton_http.InferRequestedOutput("OUTPUT1", binary_data=binary_outputs[1]),
    ]
    result = client.infer("simple", inputs, outputs=outputs, **options)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("mode", list(SchedulingMode), ids=str)
async def test_json_binary_and_mixed_tensors_in_every_mode(mode: SchedulingMode) -> None:
    async with open_fleet(2, scheduling=SchedulingConfig(mode=mode)) as fleet:
        client = triton_http.InferenceServerClient(f"127.0.0.1:{fleet.gateway.http_port}")

        def calls() -> None:
            for seed, (inputs, outputs) in enumerate(
                [
                    ((False, False), (False, False)),
                    ((True, True), (True, True)),
                    ((True, False), (False, True)),  # mixed, as Triton's own example sends
                ]
            ):
                simple_call(client, seed, binary_inputs=inputs, binary_outputs=outputs)

        try:
            await in_thread(calls)
        finally:
            client.close()


async def test_compressed_requests_and_responses() -> None:
    async with open_fleet(2) as fleet:
        client = triton_http.InferenceServerClient(f"127.0.0.1:{fleet.gateway.http_port}")

        def calls() -> None:
            for algorithm in ("gzip", "deflate"):
                simple_call(
                    client,
                    7,
                    binary_inputs=(True, False),
                    request_compression_algorithm=algorithm,
                    response_compression_algorithm=algorithm,
                )

        try:
            await in_thread(calls)
        finally:
            client.close()


async def test_an_unknown_model_is_404_and_bad_tensors_400() -> None:
    async with open_fleet(2) as fleet:
        client = triton_http.InferenceServerClient(f"127.0.0.1:{fleet.gateway.http_port}")

        def calls() -> None:
            data = np.zeros((1, 16), dtype=np.int32)
            unknown = triton_http.InferInput("INPUT0", [1, 16], "INT32")
            unknown.set_data_from_numpy(data)
            with pytest.raises(InferenceServerException) as failed:
                client.infer("nope", [unknown])
            assert failed.value.status() == "404"
            wrong = triton_http.InferInput("INPUT0", [1, 15], "INT32")
            wrong.set_data_from_numpy(np.zeros((1, 15), dtype=np.int32))
            with pytest.raises(InferenceServerException) as failed:
                client.infer("simple", [wrong])
            assert failed.value.status() == "400"

        try:
            await in_thread(calls)
        finally:
            client.close()


async def test_rest_calls_are_counted_with_their_protocol() -> None:
    async with open_fleet(1) as fleet:
        client = triton_http.InferenceServerClient(f"127.0.0.1:{fleet.gateway.http_port}")
        try:
            await in_thread(lambda: simple_call(client, 3))
        finally:
            client.close()
        rendered = fleet.gateway._service.metrics.render().decode()
        assert (
            'gateway_requests_total{model="simple",protocol="rest",rpc="ModelInfer",status="OK"}'
            " 1.0" in rendered
        )
        assert 'gateway_request_latency_seconds_count{model="simple",protocol="rest"' in rendered


async def test_a_sequence_keeps_its_worker_over_rest() -> None:
    # tritonclient.http sends sequence_id / sequence_start / sequence_end as request
    # parameters; the gateway reads them as the gRPC call's: every step on one worker.
    async with open_fleet(3) as fleet:
        client = triton_http.InferenceServerClient(f"127.0.0.1:{fleet.gateway.http_port}")

        def steps() -> list[int]:
            totals = []
            for i in range(12):
                value = triton_http.InferInput("INPUT", [1, 1], "INT32")
                value.set_data_from_numpy(np.array([[i + 1]], dtype=np.int32))
                result = client.infer(
                    "simple_sequence",
                    [value],
                    sequence_id=42,
                    sequence_start=i == 0,
                    sequence_end=i == 11,
                )
                totals.append(int(result.as_numpy("OUTPUT")[0][0]))
            return totals

        try:
            totals = await in_thread(steps)
        finally:
            client.close()
        # simple_sequence answers INPUT + START (Triton's model): the start flag arrived.
        assert totals == [2, *range(2, 13)]
        served = [
            w.service.device.counters["simple_sequence"].requests_served for w in fleet.workers
        ]
        assert sorted(served) == [0, 0, 12]
