"""The whole Triton surface through the gateway, under each scheduling mode.

One tritonclient session per mode over loopback: health, metadata, config,
statistics, repository index, model control, inference (plain and gzip), a
stream, a sequence, and shared-memory status. The modes differ in where
ModelInfer goes, and none of them may change what these calls answer.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient

from rsgw.scheduling.knobs._knobs import SchedulingMode, WorkBasis
from rsgw.scheduling.knobs._settings import SchedulingConfig
from tests.gateway.fleet import open_fleet
from tests.gateway.test_lpt_packing import lpt

MODES = {
    "round_robin": SchedulingConfig(mode=SchedulingMode.ROUND_ROBIN),
    "least_outstanding": SchedulingConfig(
        mode=SchedulingMode.LEAST_OUTSTANDING, work_basis=WorkBasis.REQUESTS
    ),
    "lpt_packing": lpt(),
}


def _inputs(seed: int) -> tuple[list[grpcclient.InferInput], np.ndarray]:
    values = np.full((1, 16), seed, dtype=np.int32)
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
    for tensor in inputs:
        tensor.set_data_from_numpy(values)
    return inputs, values


def _session(target: str) -> None:
    client = grpcclient.InferenceServerClient(target)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_server_metadata().name == "triton"
        assert client.is_model_ready("simple")
        assert client.get_model_metadata("simple").name == "simple"
        assert client.get_model_config("simple").config.max_batch_size > 0
        index = {m.name: m.state for m in client.get_model_repository_index().models}
        assert index["simple"] == "READY"
        for seed, compression in enumerate([None, "gzip", "deflate"]):
            inputs, values = _inputs(seed)
            result = client.infer("simple", inputs, compression_algorithm=compression)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * values)
        for step in range(5):  # a sequence: routed like any request, then held
            inputs, _ = _inputs(step)
            client.infer(
                "simple",
                inputs,
                sequence_id=7,
                sequence_start=step == 0,
                sequence_end=step == 4,
            )
        stats = client.get_inference_statistics("simple").model_stats[0]
        assert stats.name == "simple" and stats.inference_count >= 1
        everyone = client.get_inference_statistics()
        assert "simple" in {s.name for s in everyone.model_stats}
        replies: queue.Queue[object] = queue.Queue()
        client.start_stream(callback=lambda result, error: replies.put(error or result))
        inputs, values = _inputs(9)
        client.async_stream_infer("simple", inputs, request_id="s")
        reply = replies.get(timeout=10)
        assert isinstance(reply, grpcclient.InferResult), reply
        np.testing.assert_array_equal(reply.as_numpy("OUTPUT0"), 2 * values)
        client.stop_stream()
        client.unload_model("simple_string")
        assert not client.is_model_ready("simple_string")
        client.load_model("simple_string")
        assert client.is_model_ready("simple_string")
        assert client.get_system_shared_memory_status(as_json=True) == {}
        assert client.get_cuda_shared_memory_status(as_json=True) == {}
    finally:
        client.close()


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_the_endpoint_under_each_mode(mode: str) -> None:
    async with open_fleet(2, scheduling=MODES[mode]) as fleet:
        await trio.to_thread.run_sync(_session, fleet.target)
