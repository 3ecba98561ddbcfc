"""The REST inference codec against Triton's own clients, and its error messages.

Oracles: `tritonclient.http` writes the REST bodies (and reads the REST answers)
a real user would, `tritonclient.grpc` builds the gRPC request the same call would
have been over gRPC, and numpy (with ml_dtypes for BF16) says what each datatype's
bytes are. Hypothesis draws the shapes and values.
"""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient
import tritonclient.grpc as triton_grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import _utils as grpc_utils
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._body import joined
from rsgw.rest import _tensors
from rsgw.rest._codec import EncodedRequest, RestError, encode_request
from rsgw.rest._reply import decode_response

LIMIT = 1 << 24


def triton_http(name: str) -> ModuleType:
    """A module of `tritonclient.http`, loaded from its file.

    The test extras install tritonclient[grpc], and `tritonclient.http` does not
    import without gevent; but the modules behind the static
    `InferenceServerClient.generate_request_body` (`_utils._get_inference_request`)
    and `parse_response_body` (`InferResult.from_response_body`) need only numpy,
    rapidjson and tritonclient.utils.
    """
    path = Path(tritonclient.__file__).parent / "http" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"triton_http{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


InferInput = triton_http("_infer_input").InferInput
InferRequestedOutput = triton_http("_requested_output").InferRequestedOutput
InferResult = triton_http("_infer_result").InferResult
_get_inference_request = triton_http("_utils")._get_inference_request


def request_body(inputs: list[Any], outputs: Any = None, **kw: Any) -> tuple[bytes, int | None]:
    """`InferenceServerClient.generate_request_body`, with its defaults."""
    kw = {"request_id": "", "sequence_id": 0, "priority": 0, "timeout": None, **kw}
    custom = kw.pop("parameters", None)
    return _get_inference_request(  # type: ignore[no-any-return]
        inputs=inputs, outputs=outputs, sequence_start=False, sequence_end=False,
        custom_parameters=custom, **kw,
    )  # fmt: skip


def parse(body: bytes, header_length: int | None = None) -> Any:
    """`InferenceServerClient.parse_response_body`."""
    return InferResult.from_response_body(body, False, header_length, None)


def bf16_values() -> st.SearchStrategy[float]:
    bits = st.integers(0, 0xFFFF).filter(lambda b: b & 0x7FFF <= 0x7F80)  # no NaN
    return bits.map(lambda b: struct.unpack("<f", struct.pack("<I", b << 16))[0])


VALUES: dict[str, st.SearchStrategy[Any]] = {
    "BOOL": st.booleans(),
    **{f"INT{b}": st.integers(-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)},
    **{f"UINT{b}": st.integers(0, (1 << b) - 1) for b in (8, 16, 32, 64)},
    "FP16": st.floats(width=16, allow_nan=False),
    "FP32": st.floats(width=32, allow_nan=False),
    "FP64": st.floats(allow_nan=False),
    "BF16": bf16_values(),
    "BYTES": st.text(max_size=8),
}


@st.composite
def tensors(draw: st.DrawFn, datatype: str) -> tuple[list[int], list[Any]]:
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    count = math.prod(shape)
    return shape, draw(st.lists(VALUES[datatype], min_size=count, max_size=count))


def as_array(datatype: str, shape: list[int], values: list[Any]) -> np.ndarray[Any, Any]:
    if datatype == "BYTES":
        return np.array([v.encode() for v in values], dtype=np.object_).reshape(shape)
    return np.array(values, dtype=triton_to_np_dtype(datatype)).reshape(shape)


def raw_of(array: np.ndarray[Any, Any]) -> bytes:
    if array.dtype == np.object_:
        return serialize_byte_tensor(array).item() if array.size else b""
    return array.tobytes()


def nest(values: list[Any], shape: list[int]) -> Any:
    if len(shape) <= 1:
        return values
    step = len(values) // shape[0] if shape[0] else 0
    return [nest(values[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def param_values(parameters: Any) -> dict[str, Any]:
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in parameters.items()}


# --- Tensors ----------------------------------------------------------------------


@pytest.mark.parametrize("datatype", _tensors.DATATYPES)
@settings(max_examples=40)
@given(data=st.data())
def test_json_and_raw_round_trip_with_numpy_as_the_oracle(
    datatype: str, data: st.DataObject
) -> None:
    shape, values = data.draw(tensors(datatype))
    raw = _tensors.json_to_raw(datatype, nest(values, shape), math.prod(shape))
    assert raw == raw_of(as_array(datatype, shape, values))
    assert _tensors.raw_to_json(datatype, raw, len(values)) == values


@pytest.mark.parametrize("datatype", ["INT8", "UINT16", "INT32", "UINT64", "FP64"])
@given(raw=st.binary(max_size=64))
def test_any_raw_bytes_survive_json(datatype: str, raw: bytes) -> None:
    size = _tensors.ITEM_SIZES[datatype]
    raw = raw[: len(raw) // size * size]
    values = _tensors.raw_to_json(datatype, raw, len(raw) // size)
    if not any(isinstance(v, float) and math.isnan(v) for v in values):
        assert _tensors.json_to_raw(datatype, values, len(values)) == raw


@given(st.lists(st.floats(width=32), max_size=16))
def test_bf16_rounds_to_nearest_even_as_ml_dtypes(values: list[float]) -> None:
    ours = np.frombuffer(_tensors.json_to_raw("BF16", values, len(values)), ml_dtypes.bfloat16)
    theirs = np.array(values, np.float32).astype(ml_dtypes.bfloat16)
    assert np.array_equal(ours.astype(np.float32), theirs.astype(np.float32), equal_nan=True)


FIELDS = {
    "BOOL": "bool_contents",
    **dict.fromkeys(["INT8", "INT16", "INT32"], "int_contents"),
    **dict.fromkeys(["UINT8", "UINT16", "UINT32"], "uint_contents"),
    "INT64": "int64_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


@pytest.mark.parametrize("datatype", _tensors.DATATYPES)
@settings(max_examples=25)
@given(data=st.data())
def test_typed_contents(datatype: str, data: st.DataObject) -> None:
    shape, values = data.draw(tensors(datatype))
    raw = raw_of(as_array(datatype, shape, values))
    if datatype == "BYTES":
        contents = pb.InferTensorContents(bytes_contents=[v.encode() for v in values])
    elif datatype in FIELDS:
        contents = pb.InferTensorContents(**{FIELDS[datatype]: values})
    else:  # FP16, BF16: raw bytes in bytes_contents, as MLServer sends FP16
        contents = pb.InferTensorContents(
            bytes_contents=[raw[i : i + 2] for i in range(0, len(raw), 2)]
        )
    assert _tensors.contents_values(datatype, contents, len(values)) == values
    assert _tensors.contents_to_raw(datatype, contents, len(values)) == raw


def test_typed_contents_out_of_range_and_wrong_count() -> None:
    with pytest.raises(_tensors.TensorError, match="300 is out of range for INT8 at element 1"):
        _tensors.contents_values("INT8", pb.InferTensorContents(int_contents=[1, 300]), 2)
    with pytest.raises(_tensors.TensorError, match="expected 3 elements in uint_contents, got 2"):
        _tensors.contents_to_raw("UINT8", pb.InferTensorContents(uint_contents=[1, 2]), 3)


# --- Requests against tritonclient ------------------------------------------------------


def triton_bodies(
    arrays: dict[str, np.ndarray[Any, Any]],
    binary: bool,
    outputs: list[tuple[str, bool, int]] | None,
) -> tuple[bytes, int | None, pb.ModelInferRequest]:
    """The same call through tritonclient.http (body, header length) and tritonclient.grpc."""
    http_inputs, grpc_inputs = [], []
    for name, array in arrays.items():
        datatype = np_to_triton_dtype(array.dtype)
        http_inputs.append(InferInput(name, list(array.shape), datatype))
        # tritonclient.http refuses BF16 in JSON
        http_inputs[-1].set_data_from_numpy(array, binary_data=binary or datatype == "BF16")
        grpc_inputs.append(triton_grpc.InferInput(name, list(array.shape), datatype))
        grpc_inputs[-1].set_data_from_numpy(array)
    http_outputs = grpc_outputs = None
    if outputs is not None:
        http_outputs = [InferRequestedOutput(n, b, c) for n, b, c in outputs]
        grpc_outputs = [triton_grpc.InferRequestedOutput(n, c) for n, _, c in outputs]
    kw: dict[str, Any] = {"request_id": "r-1", "sequence_id": 42, "priority": 3}
    kw["parameters"] = {"k": "v", "f": 0.5}
    body, length = request_body(http_inputs, outputs=http_outputs, **kw)
    grpc_request = grpc_utils._get_inference_request(
        "simple", grpc_inputs, "2", kw["request_id"], grpc_outputs, kw["sequence_id"], False, False,
        kw["priority"], None, kw["parameters"],
    )  # fmt: skip
    return body, length, pb.ModelInferRequest.FromString(grpc_request.SerializeToString())


def call(message: pb.ModelInferRequest) -> dict[str, Any]:
    """What a worker reads of a request (parameter values, whatever their kind)."""
    return {
        "head": (message.model_name, message.model_version, message.id),
        "parameters": param_values(message.parameters),
        "inputs": [
            (i.name, i.datatype, list(i.shape), param_values(i.parameters)) for i in message.inputs
        ],
        "raw": list(message.raw_input_contents),
        "outputs": [(o.name, param_values(o.parameters)) for o in message.outputs],
    }


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_request_carries_what_tritonclient_grpc_would_send(
    binary: bool, data: st.DataObject
) -> None:
    names = data.draw(st.lists(st.sampled_from(_tensors.DATATYPES), min_size=1, max_size=4))
    arrays = {f"IN{i}": as_array(t, *data.draw(tensors(t))) for i, t in enumerate(names)}
    outputs = [("OUT0", True, 0), ("OUT1", False, 3)]
    body, length, theirs = triton_bodies(arrays, binary, outputs)
    encoded = encode_request("simple", "2", body, length, max_bytes=LIMIT)
    assert call(pb.ModelInferRequest.FromString(joined(encoded.message))) == call(theirs)
    assert encoded.binary_outputs == {"OUT0": True, "OUT1": False}
    assert encoded.binary_default is False


def test_no_outputs_listed_follows_binary_data_output() -> None:
    body, length, theirs = triton_bodies({"IN": np.arange(4, dtype=np.int32)}, True, None)
    encoded = encode_request("simple", "2", memoryview(body), length, max_bytes=LIMIT)
    message = pb.ModelInferRequest.FromString(joined(encoded.message))
    assert "binary_data_output" not in message.parameters
    assert call(message) == call(theirs)
    assert (encoded.binary_outputs, encoded.binary_default) == ({}, True)


def test_shared_memory_inputs_and_outputs() -> None:
    on_http = InferInput("A", [4], "FP32").set_shared_memory("in", 16, offset=8)
    on_grpc = triton_grpc.InferInput("A", [4], "FP32")
    on_grpc.set_shared_memory("in", 16, offset=8)
    b = InferInput("B", [2], "INT8")
    b.set_data_from_numpy(np.array([1, 2], np.int8))
    out = InferRequestedOutput("C")
    out.set_shared_memory("out", 64)
    body, length = request_body([on_http, b], outputs=[out])
    encoded = encode_request("m", "", body, length, max_bytes=LIMIT)
    message = pb.ModelInferRequest.FromString(joined(encoded.message))
    assert param_values(message.inputs[0].parameters) == param_values(
        on_grpc._get_tensor().parameters
    )
    assert list(message.raw_input_contents) == [b"\x01\x02"]  # none for the shared-memory input
    assert param_values(message.outputs[0].parameters) == {
        "shared_memory_region": "out",
        "shared_memory_byte_size": 64,
    }
    assert (encoded.binary_outputs, encoded.shm_outputs) == ({}, frozenset({"C"}))


# --- Responses against tritonclient -------------------------------------------------


def response_of(
    arrays: dict[str, np.ndarray[Any, Any]], typed: bool = False
) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name="simple", model_version="1")
    for name, array in arrays.items():
        datatype = np_to_triton_dtype(array.dtype)
        output = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if not typed:
            response.raw_output_contents.append(raw_of(array))
        elif datatype in FIELDS:
            getattr(output.contents, FIELDS[datatype]).extend(array.flatten().tolist())
        elif datatype == "BYTES":
            output.contents.bytes_contents.extend(array.flatten().tolist())
        else:
            output.contents.bytes_contents.append(array.tobytes())
    return response


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_response_reads_back_in_tritonclient(typed: bool, data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(_tensors.DATATYPES), min_size=1, max_size=5))
    arrays = {f"OUT{i}": as_array(t, *data.draw(tensors(t))) for i, t in enumerate(names)}
    binary = {name: data.draw(st.booleans()) for name in arrays}
    request = EncodedRequest(b"", binary)
    body, length = decode_response(response_of(arrays, typed).SerializeToString(), request)
    result = parse(body, header_length=length)
    for name, array in arrays.items():
        got = result.as_numpy(name)
        if array.dtype == np.object_ and not binary[name]:
            got = np.array([s.encode() for s in got.flatten()], dtype=np.object_).reshape(got.shape)
        assert got.shape == array.shape and got.dtype == array.dtype
        assert np.array_equal(got, array), name
        written = result.get_output(name)
        assert ("data" in written) is not binary[name]


def test_response_json_as_triton_writes_it() -> None:
    response = response_of({"A": np.array([[1.5, -2]], np.float32), "B": np.array([True])})
    response.id = "r-9"
    response.parameters["sequence_id"].int64_param = 5
    response.outputs[1].parameters["note"].string_param = "x"  # a worker's: not written
    body, length = decode_response(response.SerializeToString(), EncodedRequest(b"", {"B": True}))
    header = (
        b'{"id":"r-9","model_name":"simple","model_version":"1","parameters":{"sequence_id":5},'
        b'"outputs":[{"name":"A","datatype":"FP32","shape":[1,2],"data":[1.5,-2.0]},'
        b'{"name":"B","datatype":"BOOL","shape":[1],'
        b'"parameters":{"binary_data_size":1}}]}'
    )
    assert (body, length) == (header + b"\x01", len(header))


def test_response_without_id_and_binary_bytes_is_all_json() -> None:
    response = response_of({"A": np.zeros([0, 3], np.int64)})
    body, length = decode_response(response.SerializeToString(), EncodedRequest(b"", {}, True))
    assert length is None  # no bytes follow the JSON: Triton sends no header either
    assert body.startswith(b'{"model_name":"simple"')
    assert parse(body).as_numpy("A").shape == (0, 3)


def test_nan_and_infinities_reach_tritonclient_through_json() -> None:
    values = np.array([math.nan, math.inf, -math.inf, 0.5], np.float32)
    body, _ = decode_response(
        response_of({"A": values}).SerializeToString(), EncodedRequest(b"", {})
    )
    assert b'"data":[NaN,Infinity,-Infinity,0.5]' in body
    assert np.array_equal(parse(body).as_numpy("A"), values, equal_nan=True)
    raw = joined(encode_json(infer("FP64", [2], [math.nan, -math.inf])).message)
    assert pb.ModelInferRequest.FromString(raw).raw_input_contents[0] == struct.pack(
        "<2d", math.nan, -math.inf
    )


@pytest.mark.parametrize("placeholders", [True, False], ids=["triton", "left-out"])
def test_shared_memory_outputs_have_no_data(placeholders: bool) -> None:
    arrays = {name: np.array([i], np.int32) for i, name in enumerate("ABC")}
    response = response_of(arrays)
    response.outputs[1].parameters["shared_memory_region"].string_param = "r"
    if placeholders:  # Triton: an empty entry for each output in shared memory
        response.raw_output_contents[0] = response.raw_output_contents[1] = b""
    else:
        del response.raw_output_contents[:2]
    request = EncodedRequest(b"", {}, shm_outputs=frozenset({"A"}))
    body, length = decode_response(response.SerializeToString(), request)
    assert length is None
    assert parse(body).get_response()["outputs"] == [
        {"name": "A", "datatype": "INT32", "shape": [1]},
        {"name": "B", "datatype": "INT32", "shape": [1]},  # Triton writes no parameters
        {"name": "C", "datatype": "INT32", "shape": [1], "data": [2]},
    ]


# --- Errors ----------------------------------------------------------------------


def infer(datatype: str, shape: list[int], data: Any, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "INPUT0", "datatype": datatype, "shape": shape, "data": data, **extra}
    return {"inputs": [tensor]}


def binary_input(name: str, size: int) -> dict[str, Any]:
    parameters = {"binary_data_size": size}
    return {"name": name, "datatype": "INT32", "shape": [size // 4], "parameters": parameters}


def output(**parameters: Any) -> dict[str, Any]:
    return {"inputs": [], "outputs": [{"name": "O", "parameters": parameters}]}


DATA = "unable to parse 'data' for input 'INPUT0': "
ONE_OF = (
    "must set exactly one of 'data', 'binary_data_size' in 'parameters' and "
    "'shared_memory_region' in 'parameters', but sets "
)
BAD_JSON = [
    (infer("INT32", [1, 16], list(range(15))), DATA + "expected 16 elements, got 15"),
    (
        infer("INT32", [4], [0, 1, 2, "a"]),
        DATA + 'expected INT32 values (integers), got "a" at element 3',
    ),
    (
        infer("INT8", [2], [True, 1]),
        DATA + "expected INT8 values (integers), got true at element 0",
    ),
    (infer("INT64", [1], [1.0]), DATA + "expected INT64 values (integers), got 1.0 at element 0"),
    (infer("UINT8", [2], [[1], [256]]), DATA + "256 is out of range for UINT8 at element 1"),
    (infer("UINT64", [1], [-1]), DATA + "-1 is out of range for UINT64 at element 0"),
    (infer("FP16", [1], [1e6]), DATA + "1000000.0 is out of range for FP16 at element 0"),
    (infer("BOOL", [1], [1]), DATA + "expected BOOL values (booleans), got 1 at element 0"),
    (infer("FP32", [1], ["x"]), DATA + 'expected FP32 values (numbers), got "x" at element 0'),
    (infer("BYTES", [1], [5]), DATA + "expected BYTES values (strings), got 5 at element 0"),
    (infer("FP32", [1], 5), DATA + "expected an array, got 5"),
    (infer("BYTES", [1], ["\ud800"]), DATA + "element 0 is not a valid Unicode string"),
    (
        infer("FP17", [1], [1]),
        "invalid datatype \"FP17\" for input 'INPUT0': expected one of BOOL, INT8, INT16, "
        "INT32, INT64, UINT8, UINT16, UINT32, UINT64, FP16, FP32, FP64, BF16, BYTES",
    ),
    (
        infer("FP32", [2, -1], []),
        "unable to parse 'shape' for input 'INPUT0': expected an array of integers >= 0, "
        "got [2, -1]",
    ),
    (
        infer("FP32", [1], [1], parameters={"binary_data_size": 4}),
        f"input 'INPUT0' {ONE_OF}'data' and 'binary_data_size'",
    ),
    ({"inputs": [{"name": "A", "datatype": "FP32", "shape": [1]}]}, f"input 'A' {ONE_OF}none"),
    (
        {"inputs": [binary_input("A", 8)]},
        "must specify valid 'Inference-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format",
    ),
    (
        {"inputs": [{**binary_input("A", 8), "shape": [3]}]},
        "input 'A' has binary_data_size 8, but shape [3] of INT32 takes 12 bytes",
    ),
    ({"inputs": [{"datatype": "FP32"}]}, "unable to parse 'name' of input 0: expected a string"),
    ({"inputs": [[]]}, "unable to parse 'inputs': element 0 is not a JSON object"),
    ({"outputs": []}, "unable to parse 'inputs': expected an array of input objects"),
    ({"id": 7, "inputs": []}, "unable to parse 'id': expected a string, got 7"),
    (
        {"parameters": {"p": [1]}, "inputs": []},
        "parameter 'p' has invalid type: it should be a bool, integer, number or string",
    ),
    (
        {"parameters": {"p": 1 << 64}, "inputs": []},
        "parameter 'p': 18446744073709551616 is out of range for a 64-bit integer",
    ),
    (
        {"parameters": {"binary_data_output": 1}, "inputs": []},
        "unable to parse 'binary_data_output': expected a bool",
    ),
    (
        {"inputs": [], "outputs": {}},
        "unable to parse 'outputs': expected an array of output objects",
    ),
    (output(binary_data="yes"), "unable to parse 'binary_data' for output 'O': expected a bool"),
    (
        output(binary_data=True, shared_memory_region="r"),
        "output 'O' can't set both 'shared_memory_region' and 'binary_data'",
    ),
    (
        output(classification=-1),
        "unable to parse 'classification' for output 'O': expected an integer >= 0",
    ),
    ([1], "the inference request must be a JSON object"),
]


@pytest.mark.parametrize(("document", "message"), BAD_JSON)
def test_bad_requests_say_what_is_wrong(document: Any, message: str) -> None:
    with pytest.raises(RestError) as caught:
        encode_json(document)
    assert (caught.value.status, caught.value.message) == (400, message)


def encode_json(document: Any, max_bytes: int = LIMIT) -> EncodedRequest:
    return encode_request("simple", "", json.dumps(document).encode(), None, max_bytes=max_bytes)


def framed(document: dict[str, Any], binary: bytes) -> tuple[bytes, int]:
    header = json.dumps(document).encode()
    return header + binary, len(header)


JSON_BUFFER = "failed to parse the request JSON buffer: "
BAD_BODIES = [
    (
        *framed({"inputs": [binary_input("A", 8), binary_input("B", 8)]}, bytes(12)),
        "unexpected size for input 'B', expecting 4 additional bytes for model 'simple'",
    ),
    (
        *framed({"inputs": [binary_input("A", 8)]}, bytes(11)),
        "unexpected additional input data for model 'simple': 3 bytes after the last binary input",
    ),
    (b'{"inputs": []}', 40, "Inference-Header-Content-Length 40 is larger than the 14-byte body"),
    (
        b'{"inputs": []}',
        0,
        "Inference-Header-Content-Length must be greater than 0 (a request that is all binary "
        "data is not supported: send a JSON header)",
    ),
    (b'{"inputs": [', None, JSON_BUFFER + "Expecting value: line 1 column 13 (char 12)"),
    (
        b'{"id": "\xff"}',
        None,
        JSON_BUFFER + "'utf-8' codec can't decode byte 0xff in position 8: invalid start byte",
    ),
    (b"[" * 100_000 + b"]" * 100_000, None, JSON_BUFFER + "nested too deeply"),
    (b"", None, JSON_BUFFER + "Expecting value: line 1 column 1 (char 0)"),
]


@pytest.mark.parametrize(("body", "length", "message"), BAD_BODIES)
def test_bad_bodies_say_what_is_wrong(body: bytes, length: int | None, message: str) -> None:
    with pytest.raises(RestError) as caught:
        encode_request("simple", "", body, length, max_bytes=LIMIT)
    assert (caught.value.status, caught.value.message) == (400, message)


def test_deep_data_nesting_is_flattened_without_recursion() -> None:
    deep: Any = [7]
    for _ in range(10_000):
        deep = [deep]
    assert _tensors.json_to_raw("INT8", deep, 1) == b"\x07"


def test_too_large_as_grpc_is_413() -> None:
    document = infer("INT64", [64], list(range(64)))
    assert len(encode_json(document).message) > 512
    with pytest.raises(RestError) as caught:
        encode_json(document, max_bytes=512)
    assert caught.value.status == 413
    assert caught.value.message.endswith("as gRPC, more than the 512 bytes allowed")


def reply(datatype: str, shape: list[int], *raw: bytes, count: int = 1) -> bytes:
    outputs = [{"name": "ABC"[i], "datatype": datatype, "shape": shape} for i in range(count)]
    response = pb.ModelInferResponse(outputs=outputs, raw_output_contents=raw)
    return response.SerializeToString()


WRITE = "unable to write 'data' for the worker's output 'A': "
BAD_REPLIES = [
    (b"\xff\xff", 500, "the worker's ModelInferResponse does not parse"),
    (reply("FP32", [2], bytes(4)), 500, WRITE + "expected 8 bytes for 2 elements, got 4"),
    (
        reply("BYTES", [1], b"\x01\0\0\0\xff"),
        400,
        "unable to write 'data' for output 'A': BYTES element 0 is not valid UTF-8, so JSON "
        "cannot carry it; ask for this output with binary_data: true",
    ),
    (reply("BYTES", [2], b"\x01\0\0\0a"), 500, WRITE + "BYTES data ends before element 1 of 2"),
    (
        reply("INT8", [0], b"", b"", count=3),
        500,
        "the worker answered 3 outputs with 2 raw_output_contents",
    ),
    (reply("FP16", [-1]), 500, "the worker's output 'A' has shape [-1]"),
]


@pytest.mark.parametrize(("answer", "status", "message"), BAD_REPLIES)
def test_bad_replies_say_what_is_wrong(answer: bytes, status: int, message: str) -> None:
    with pytest.raises(RestError) as caught:
        decode_response(answer, EncodedRequest(b"", {}))
    assert (caught.value.status, caught.value.message) == (status, message)


def test_binary_output_of_the_wrong_size_is_the_workers_fault() -> None:
    with pytest.raises(RestError) as caught:
        decode_response(reply("INT16", [3], bytes(4)), EncodedRequest(b"", {"A": True}))
    assert (caught.value.status, caught.value.message) == (
        500,
        "the worker's output 'A' has 4 bytes, but shape [3] of INT16 takes 6",
    )
