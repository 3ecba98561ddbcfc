"""Compressed requests and replies through the gateway.

A compressed ModelInfer is routed by its head alone and reaches the worker still
compressed (the memory network counts the bytes); a worker's compressed reply
reaches a client that accepts it as it was sent. Real clients over loopback too:
grpcio with gzip, tritonclient with gzip and deflate.
"""

from __future__ import annotations

import textwrap

import grpc
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.grpc.protocol._compression import Compressed, Gzipped, compress, decompress
from rsgw.worker.models._catalogue import builtin_catalogue
from tests.gateway.fleet import open_fleet
from tests.helpers import catalogue_from_yaml, infer_request, output_array, simple_inputs
from tests.memory import MemoryNetwork

#: `wide` echoes a 1 MiB INT32 row; only worker1 serves it.
WIDE = catalogue_from_yaml(
    textwrap.dedent(
        """\
        models:
          - name: wide
            inputs: [{name: x, datatype: INT32, shape: [-1, 262144]}]
            outputs: [{name: y, datatype: INT32, shape: [-1, 262144]}]
            max_batch_size: 4
            compute: identity
        """
    )
)
MiB = 1024 * 1024


def _wide_request() -> tuple[pb.ModelInferRequest, np.ndarray]:
    row = np.tile(np.arange(256, dtype=np.int32), 1024).reshape(1, 262144)
    return infer_request("wide", {"x": row}), row


async def test_a_compressed_request_is_routed_and_forwarded_compressed(
    autojump_clock: MockClock,
) -> None:
    catalogues = [builtin_catalogue(), WIDE, builtin_catalogue()]
    async with open_fleet(3, memory=True, catalogues=catalogues) as fleet:
        request, row = _wide_request()
        body = request.SerializeToString()
        assert len(body) > MiB
        wide_worker = fleet.worker_url(1)
        network = fleet.network
        assert isinstance(network, MemoryNetwork)
        before = network.sent_to.get(wide_worker, 0)
        reply = await fleet.channel().unary(Method.MODEL_INFER.wire, compress(body, Gzipped))
        np.testing.assert_array_equal(
            output_array(pb.ModelInferResponse.FromString(reply), "y"), row
        )
        # The worker got the compressed bytes: a few KiB, not the MiB they inflate to.
        assert network.sent_to[wide_worker] - before < 64 * 1024


async def test_a_compressed_reply_is_relayed_as_sent(autojump_clock: MockClock) -> None:
    overrides = {"response_compression": "gzip"}
    async with open_fleet(2, memory=True, worker_overrides=overrides) as fleet:
        inputs = simple_inputs(3)
        body = infer_request("simple", inputs).SerializeToString()
        reply = await fleet.channel().unary(Method.MODEL_INFER.wire, body, raw=True)
        assert isinstance(reply, Compressed) and type(reply) is Gzipped  # the worker's bytes
        response = pb.ModelInferResponse.FromString(decompress(reply, MiB))
        np.testing.assert_array_equal(
            output_array(response, "OUTPUT0"), inputs["INPUT0"] + inputs["INPUT1"]
        )


async def test_compressed_requests_sharing_a_sequence_stay_on_its_worker(
    autojump_clock: MockClock,
) -> None:
    async with open_fleet(3, memory=True) as fleet:
        channel = fleet.channel()
        answered = []
        for step in range(6):
            request = infer_request("simple", simple_inputs(step))
            request.parameters["sequence_id"].int64_param = 42
            request.parameters["sequence_start"].bool_param = step == 0
            request.parameters["sequence_end"].bool_param = step == 5
            packed = compress(request.SerializeToString(), Gzipped)
            await channel.unary(Method.MODEL_INFER.wire, packed)
            answered.append(
                [w.service.device.counters["simple"].requests_served for w in fleet.workers]
            )
        assert sorted(answered[-1]) == [0, 0, 6]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
async def test_tritonclient_compression(algorithm: str) -> None:
    async with open_fleet(2) as fleet:
        client = grpcclient.InferenceServerClient(fleet.target)
        values = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
        for tensor in inputs:
            tensor.set_data_from_numpy(values)

        def infer() -> grpcclient.InferResult:
            return client.infer("simple", inputs, compression_algorithm=algorithm)

        result = await trio.to_thread.run_sync(infer)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * values)
        client.close()


async def test_grpcio_gzip_channel_with_a_compressing_worker() -> None:
    overrides = {"response_compression": "deflate"}
    async with open_fleet(2, catalogues=[WIDE, WIDE], worker_overrides=overrides) as fleet:
        request, row = _wide_request()

        def infer() -> pb.ModelInferResponse:
            with grpc.insecure_channel(
                fleet.target,
                compression=grpc.Compression.Gzip,
                options=[("grpc.max_receive_message_length", 8 * MiB)],
            ) as channel:
                model_infer = channel.unary_unary(
                    Method.MODEL_INFER.path,
                    request_serializer=pb.ModelInferRequest.SerializeToString,
                    response_deserializer=pb.ModelInferResponse.FromString,
                )
                response: pb.ModelInferResponse = model_infer(request, timeout=20)
                return response

        response = await trio.to_thread.run_sync(infer)
        np.testing.assert_array_equal(output_array(response, "y"), row)
