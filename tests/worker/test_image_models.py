"""Triton's image examples on the worker: tensors, configs, labels, classification, ensemble."""

from __future__ import annotations

import numpy as np
import pytest
from trio.testing import MockClock

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode
from rsgw.worker._worker import WorkerConfig
from rsgw.worker.models._catalogue import builtin_catalogue
from rsgw.worker.models._classification import classify
from rsgw.worker.models._tensors import Tensor, array_to_le, decode_bytes_elements
from tests.helpers import infer_request, output_array
from tests.worker.client import WorkerClient, grpc_error, open_memory_worker

CONFIG = WorkerConfig(port=0, metrics_port=-1)


def classified(response: pb.ModelInferResponse, index: int = 0) -> list[str]:
    return [s.decode() for s in decode_bytes_elements(response.raw_output_contents[index])]


async def config_of(client: WorkerClient, model: str) -> pb.ModelConfig:
    request = pb.ModelConfigRequest(name=model)
    return (await client.call(Method.MODEL_CONFIG, request, pb.ModelConfigResponse)).config


async def test_densenet_classifies_with_its_labels(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        config = await config_of(client, "densenet_onnx")
        assert (config.max_batch_size, config.input[0].format) == (0, pb.ModelInput.FORMAT_NCHW)
        assert config.output[0].label_filename == "densenet_labels.txt"
        image = np.random.default_rng(1).random((3, 224, 224), dtype=np.float32)
        request = infer_request("densenet_onnx", {"data_0": image})
        request.outputs.add(name="fc6_1").parameters["classification"].int64_param = 3
        response = await client.infer(request)
        assert (response.outputs[0].datatype, list(response.outputs[0].shape)) == ("BYTES", [3])
        classes = classified(response)
        labels = builtin_catalogue().labels["densenet_labels.txt"]
        scores = [float(c.split(":")[0]) for c in classes]
        assert scores == sorted(scores, reverse=True)
        for entry in classes:
            value, index, label = entry.split(":", 2)
            assert label == labels[int(index)] and len(value.split(".")[1]) == 6
        again = await client.infer(request)  # the same image: the same classes
        assert classified(again) == classes
        plain = infer_request("densenet_onnx", {"data_0": image})
        scores_out = output_array(await client.infer(plain), "fc6_1")
        assert scores_out.shape == (1000,) and abs(float(scores_out.sum()) - 1.0) < 1e-4


async def test_inception_batches_and_classifies_per_row(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        config = await config_of(client, "inception_graphdef")
        assert (config.max_batch_size, config.input[0].format) == (128, pb.ModelInput.FORMAT_NHWC)
        assert list(config.input[0].dims) == [299, 299, 3]
        images = np.random.default_rng(2).random((2, 299, 299, 3), dtype=np.float32)
        request = infer_request("inception_graphdef", {"input": images})
        output = request.outputs.add(name="InceptionV3/Predictions/Softmax")
        output.parameters["classification"].int64_param = 2
        response = await client.infer(request)
        assert list(response.outputs[0].shape) == [2, 2]
        assert len(classified(response)) == 4


async def test_the_ensemble_reads_encoded_images(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        config = await config_of(client, "preprocess_inception_ensemble")
        assert (config.platform, config.max_batch_size) == ("ensemble", 128)
        steps = [s.model_name for s in config.ensemble_scheduling.step]
        assert steps == ["image_preprocess", "inception_graphdef"]
        encoded = np.array([[b"\xff\xd8 a jpeg"], [b"\x89PNG another"]], dtype=np.object_)
        request = pb.ModelInferRequest(model_name="preprocess_inception_ensemble")
        tensor = request.inputs.add(name="INPUT", datatype="BYTES", shape=[2, 1])
        tensor.contents.bytes_contents.extend(encoded.ravel().tolist())
        request.outputs.add(name="OUTPUT").parameters["classification"].int64_param = 1
        response = await client.infer(request)
        assert list(response.outputs[0].shape) == [2, 1]
        first, second = classified(response)
        assert first != second  # different images, different answers
        device = client.device
        assert device.counters["image_preprocess"].requests_served == 1  # one sub-call
        assert device.counters["inception_graphdef"].requests_served == 1
        assert await client.model_ready("inception_graphdef")  # the steps stay callable


async def test_classification_refusals(autojump_clock: MockClock) -> None:
    async with open_memory_worker(CONFIG) as client:
        values = np.zeros((1, 16), np.int32)
        request = infer_request("simple_string", {"INPUT0": values.astype(np.bytes_)})
        request.inputs.add(name="INPUT1", datatype="BYTES", shape=[1, 16])
        request.ClearField("raw_input_contents")
        for tensor in request.inputs:
            tensor.contents.bytes_contents.extend([b"1"] * 16)
        request.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 2
        code, message = await grpc_error(client.infer(request))
        assert code is StatusCode.INVALID_ARGUMENT
        assert "class result not available for output 'OUTPUT0'" in message
        bad = infer_request("simple", {"INPUT0": values, "INPUT1": values})
        bad.outputs.add(name="OUTPUT0").parameters["classification"].string_param = "2"
        code, message = await grpc_error(client.infer(bad))
        assert "expected int64_param" in message


@pytest.mark.parametrize(
    ("values", "labels", "expected"),
    [
        ([0.5, 2.0, 1.0], ["a", "b", "c"], ["2.000000:1:b", "1.000000:2:c"]),
        ([1.0, 1.0, 3.0], [], ["3.000000:2", "1.000000:0"]),  # ties keep index order
    ],
)
def test_classify_formats_as_triton(
    values: list[float], labels: list[str], expected: list[str]
) -> None:
    from array import array

    tensor = Tensor("y", "FP32", (3,), array_to_le(array("f", values)))
    out = classify(tensor, 2, labels, batched=False)
    assert (out.datatype, out.shape) == ("BYTES", (2,))
    assert [s.decode() for s in decode_bytes_elements(out.data)] == expected
