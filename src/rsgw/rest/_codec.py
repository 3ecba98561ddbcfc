"""Triton's REST inference call as the gRPC ModelInfer call a worker takes, and back.

Pure: no trio, no sockets, no logging. The REST door (`rsgw.rest._door`) sends every
inference down the gateway's gRPC ModelInfer path, byte for byte the call a gRPC
client would have made, so the REST-specific work is all here.

Requests. Every tensor's bytes go in `raw_input_contents`, one entry per input not
read from shared memory, in input order (gRPC takes raw contents for all such
inputs or for none). The message is serialized without them and the entries are
appended as encoded fields after it: a binary input's bytes are copied once, from
the body into the message, and field 7 comes last, where protobuf puts it. The
REST-only settings (an input's `binary_data_size`, an output's `binary_data`, the
request's `binary_data_output`) are not forwarded; what the response needs of them
is kept in the `EncodedRequest`. Every other parameter is.

Responses, as Triton writes them: "id" only when set; a binary output as
`binary_data_size`, its bytes after the JSON in output order, and the JSON's length
(the Inference-Header-Content-Length header) only when bytes follow; no data for an
output in shared memory (so asked in the request, or so marked by the worker).
Data comes from `raw_output_contents` (an entry per output, or per output not in
shared memory) or from the typed `contents` some workers (MLServer) send instead.

Errors are the door's `RestError`s: 400 for the request's mistakes, 413 for a
request too large as gRPC, 500 for a worker's answer that makes no sense. They
name the tensor and say what is wrong, in Triton's words where Triton has some.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.rest import _tensors
from rsgw.rest._errors import RestError
from rsgw.rest._tensors import NotUtf8Error, TensorError, show

_SHM_REGION = "shared_memory_region"
_SHM_NUMBERS = ("shared_memory_byte_size", "shared_memory_offset")
_INT64 = 1 << 63
_RAW_INPUT_TAG = b"\x3a"  # raw_input_contents: field 7, length-delimited


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """The gRPC request, and what its REST response needs to know of the REST request.

    `binary_outputs`: per requested output (not in shared memory), whether the client
    asked for it in binary; an output the request does not list follows
    `binary_default` (the request's `binary_data_output`, False unless set).
    `shm_outputs`: requested outputs the worker writes to shared memory.
    """

    message: bytes
    binary_outputs: Mapping[str, bool]
    binary_default: bool = False
    shm_outputs: frozenset[str] = field(default_factory=frozenset)


def encode_request(
    model: str,
    version: str,
    body: bytes | memoryview,
    header_length: int | None,
    *,
    max_bytes: int,
) -> EncodedRequest:
    """A REST inference body (JSON header, then binary section) as a ModelInferRequest.

    `header_length` is the Inference-Header-Content-Length header (None when absent:
    the whole body is JSON).

    Raises:
        RestError: 400 for a body that is not a valid inference request, 413 when
            the gRPC request would be larger than `max_bytes`.
    """
    view = memoryview(body).cast("B")
    if header_length is None:
        header, binary = body, view[len(view) :]
    elif header_length <= 0:
        raise _bad(
            "Inference-Header-Content-Length must be greater than 0 (a request that is "
            "all binary data is not supported: send a JSON header)",
        )
    elif header_length > len(view):
        raise _bad(
            f"Inference-Header-Content-Length {header_length} is larger than the "
            f"{len(view)}-byte body",
        )
    else:
        header, binary = view[:header_length], view[header_length:]
    document = _parse(header)

    message = pb.ModelInferRequest(model_name=model, model_version=version)
    request_id = document.get("id", "")
    if type(request_id) is not str:
        raise _bad(f"unable to parse 'id': expected a string, got {show(request_id)}")
    message.id = request_id
    parameters = _object(document.get("parameters", {}), "'parameters' of the request")
    binary_default = parameters.get("binary_data_output", False)
    if type(binary_default) is not bool:
        raise _bad("unable to parse 'binary_data_output': expected a bool")
    for key, value in parameters.items():
        if key != "binary_data_output":
            _set(message.parameters[key], value, f"parameter '{key}'")

    inputs = document.get("inputs")
    if type(inputs) is not list:
        raise _bad("unable to parse 'inputs': expected an array of input objects")
    chunks: list[bytes | memoryview] = []
    taken = 0
    for index, item in enumerate(inputs):
        chunk, taken = _input(message, item, index, binary, taken, header_length, model)
        if chunk is not None:
            chunks.append(chunk)
    if taken != len(binary):
        raise _bad(
            f"unexpected additional input data for model '{model}': "
            f"{len(binary) - taken} bytes after the last binary input",
        )

    binary_outputs: dict[str, bool] = {}
    shm_outputs: set[str] = set()
    outputs = document.get("outputs")
    if outputs is not None:
        if type(outputs) is not list:
            raise _bad("unable to parse 'outputs': expected an array of output objects")
        for index, item in enumerate(outputs):
            name, binary_output = _output(message, item, index)
            if binary_output is None:
                shm_outputs.add(name)
            else:
                binary_outputs[name] = binary_output

    head = message.SerializeToString()
    parts: list[bytes | memoryview] = [head]
    for chunk in chunks:
        parts += (_RAW_INPUT_TAG, _varint(len(chunk)), chunk)
    size = sum(map(len, parts))
    if size > max_bytes:
        raise RestError(
            413,
            f"the inference request for model '{model}' is {size} bytes as gRPC, "
            f"more than the {max_bytes} bytes allowed",
        )
    return EncodedRequest(b"".join(parts), binary_outputs, binary_default, frozenset(shm_outputs))


def _bad(message: str) -> RestError:
    return RestError(400, message)


def _parse(header: bytes | memoryview) -> dict[str, Any]:
    try:
        document = json.loads(header if isinstance(header, bytes) else bytes(header))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        reason = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        raise _bad(f"failed to parse the request JSON buffer: {reason}") from None
    if type(document) is not dict:
        raise _bad("the inference request must be a JSON object")
    return document


def _object(value: object, what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _bad(f"unable to parse {what}: expected a JSON object")
    return value


def _named(item: object, index: int, kind: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Input or output `index` of the request: the object, its name and its parameters."""
    if type(item) is not dict:
        raise _bad(f"unable to parse '{kind}s': element {index} is not a JSON object")
    name = item.get("name")
    if type(name) is not str:
        raise _bad(f"unable to parse 'name' of {kind} {index}: expected a string")
    return item, name, _object(item.get("parameters", {}), f"'parameters' for {kind} '{name}'")


def _set(target: pb.InferParameter, value: object, what: str) -> None:
    """A JSON parameter as the InferParameter Triton's gRPC API reads it."""
    if type(value) is bool:
        target.bool_param = value
    elif type(value) is int:
        if -_INT64 <= value < _INT64:
            target.int64_param = value
        elif _INT64 <= value < 2 * _INT64:
            target.uint64_param = value
        else:
            raise _bad(f"{what}: {show(value)} is out of range for a 64-bit integer")
    elif type(value) is float:
        target.double_param = value
    elif type(value) is str:
        target.string_param = value
    else:
        raise _bad(f"{what} has invalid type: it should be a bool, integer, number or string")


def _shm_parameters(parameters: Mapping[str, Any], what: str) -> None:
    if type(parameters.get(_SHM_REGION, "")) is not str:
        raise _bad(f"unable to parse '{_SHM_REGION}' for {what}: expected a string")
    for key in _SHM_NUMBERS:
        _count(parameters.get(key, 0), f"'{key}' for {what}")


def _count(value: object, what: str) -> int:
    if type(value) is not int or value < 0:
        raise _bad(f"unable to parse {what}: expected an integer >= 0")
    return value


def _input(
    message: pb.ModelInferRequest,
    item: object,
    index: int,
    binary: memoryview,
    taken: int,
    header_length: int | None,
    model: str,
) -> tuple[bytes | memoryview | None, int]:
    """Adds input `index` to `message`: its raw bytes (None in shared memory), and
    how far the binary section has been taken once its own bytes are."""
    item, name, parameters = _named(item, index, "input")
    datatype = item.get("datatype")
    if type(datatype) is not str:
        raise _bad(f"unable to parse 'datatype' for input '{name}': expected a string")
    if datatype not in _tensors.DATATYPES:
        raise _bad(
            f"invalid datatype {show(datatype)} for input '{name}': expected one of "
            + ", ".join(_tensors.DATATYPES),
        )
    shape = item.get("shape")
    if type(shape) is not list or any(type(d) is not int or not 0 <= d < _INT64 for d in shape):
        raise _bad(
            f"unable to parse 'shape' for input '{name}': expected an array of integers >= 0, "
            f"got {show(shape)}",
        )
    sources = ["'data'"] if "data" in item else []
    sources += [f"'{key}'" for key in ("binary_data_size", _SHM_REGION) if key in parameters]
    if len(sources) != 1:
        raise _bad(
            f"input '{name}' must set exactly one of 'data', 'binary_data_size' in "
            f"'parameters' and '{_SHM_REGION}' in 'parameters', but sets "
            + (" and ".join(sources) if sources else "none"),
        )
    _shm_parameters(parameters, f"input '{name}'")
    tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
    for key, value in parameters.items():
        if key != "binary_data_size":
            _set(tensor.parameters[key], value, f"parameter '{key}' of input '{name}'")
    count = _tensors.element_count(shape)

    if _SHM_REGION in parameters:
        return None, taken
    if "data" in item:
        try:
            return _tensors.json_to_raw(datatype, item["data"], count), taken
        except TensorError as exc:
            raise _bad(f"unable to parse 'data' for input '{name}': {exc}") from None

    size = _count(parameters["binary_data_size"], f"'binary_data_size' for input '{name}'")
    item_size = _tensors.ITEM_SIZES.get(datatype)
    if item_size is not None and size != count * item_size:
        raise _bad(
            f"input '{name}' has binary_data_size {size}, but shape {show(shape)} of "
            f"{datatype} takes {count * item_size} bytes",
        )
    if size and header_length is None:
        raise _bad(
            "must specify valid 'Inference-Header-Content-Length' in request header and "
            "'binary_data_size' when passing inputs in binary data format",
        )
    if taken + size > len(binary):
        raise _bad(
            f"unexpected size for input '{name}', expecting {taken + size - len(binary)} "
            f"additional bytes for model '{model}'",
        )
    return binary[taken : taken + size], taken + size


def _output(message: pb.ModelInferRequest, item: object, index: int) -> tuple[str, bool | None]:
    """Adds requested output `index` to `message`: its name, and whether the client
    wants it in binary (None: the worker writes it to shared memory)."""
    _, name, parameters = _named(item, index, "output")
    binary = parameters.get("binary_data", False)
    if type(binary) is not bool:
        raise _bad(f"unable to parse 'binary_data' for output '{name}': expected a bool")
    shm = _SHM_REGION in parameters
    if shm and binary:
        raise _bad(f"output '{name}' can't set both '{_SHM_REGION}' and 'binary_data'")
    _shm_parameters(parameters, f"output '{name}'")
    if "classification" in parameters:
        _count(parameters["classification"], f"'classification' for output '{name}'")
    tensor = message.outputs.add(name=name)
    for key, value in parameters.items():
        if key != "binary_data":
            _set(tensor.parameters[key], value, f"parameter '{key}' of output '{name}'")
    return name, None if shm else binary


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_response(reply: bytes, request: EncodedRequest) -> tuple[bytes, int | None]:
    """A worker's ModelInferResponse as Triton's REST response body.

    Returns the body and, when binary tensors follow the JSON, the JSON's length
    (the Inference-Header-Content-Length header); None when the body is all JSON.

    Raises:
        RestError: 500 for an answer that does not parse or whose tensors do not
            match their shapes; 400 for a BYTES output asked for in JSON that
            holds bytes JSON cannot carry.
    """
    try:
        response = pb.ModelInferResponse.FromString(reply)
    except DecodeError:
        raise RestError(500, "the worker's ModelInferResponse does not parse") from None
    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    if response.parameters:
        document["parameters"] = _parameters_json(response.parameters)

    outputs = response.outputs
    in_shm = [o.name in request.shm_outputs or _SHM_REGION in o.parameters for o in outputs]
    raw_index = _raw_index(len(outputs), len(response.raw_output_contents), in_shm)
    # The JSON is written in pieces, each output's after the document's other fields and
    # each "data" after its output's: an 8-bit tensor's data then goes from a table of
    # its 256 numbers' text, several times faster than json.dumps of its values.
    written: list[str] = []
    tail: list[bytes] = []
    for i, output in enumerate(outputs):
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        at = raw_index[i]
        raw = response.raw_output_contents[at] if at is not None else None
        binary = not in_shm[i] and request.binary_outputs.get(output.name, request.binary_default)
        # As Triton writes outputs: parameters only on a binary one, and only its size
        # (Triton's C++ client, perf_analyzer's, insists on `binary_data_size` in any
        # output parameters it is given); an output in shared memory has no data.
        if binary:
            data = _output_bytes(output, raw)
            entry["parameters"] = {"binary_data_size": len(data)}
            tail += [data] if data else []
            written.append(_dumps(entry))
        elif not in_shm[i]:
            written.append(f'{_dumps(entry)[:-1]},"data":{_output_json(output, raw)}}}')
        else:
            written.append(_dumps(entry))
    head = f'{_dumps(document)[:-1]},"outputs":[{",".join(written)}]}}'.encode()
    if not tail:
        return head, None
    return b"".join([head, *tail]), len(head)


def _dumps(document: object) -> str:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def _parameters_json(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(value, choice)
    return out


def _raw_index(outputs: int, raws: int, in_shm: list[bool]) -> list[int | None]:
    """Which `raw_output_contents` entry holds each output's bytes (None: none does).

    Triton gives every output an entry, empty for one in shared memory; a worker
    that leaves those out gives one per other output; typed contents, none.
    """
    if raws == outputs:
        return list(range(outputs))
    if raws == 0:
        return [None] * outputs
    if raws == in_shm.count(False):
        index: list[int | None] = []
        for shm in in_shm:
            index.append(None if shm else len(index) - index.count(None))
        return index
    raise RestError(500, f"the worker answered {outputs} outputs with {raws} raw_output_contents")


def _shape_count(output: pb.ModelInferResponse.InferOutputTensor) -> int:
    if any(dim < 0 for dim in output.shape):
        raise RestError(500, f"the worker's output '{output.name}' has shape {list(output.shape)}")
    return _tensors.element_count(output.shape)


def _typed(output: pb.ModelInferResponse.InferOutputTensor, raw: bytes | None) -> bool:
    """Whether the output's data is in its typed contents rather than raw bytes."""
    return output.HasField("contents") and not raw


def _output_json(output: pb.ModelInferResponse.InferOutputTensor, raw: bytes | None) -> str:
    """The output's data as a JSON array's text."""
    count = _shape_count(output)
    try:
        if _typed(output, raw):
            return _dumps(_tensors.contents_values(output.datatype, output.contents, count))
        text = _tensors.raw_json_text(output.datatype, raw or b"", count)
        if text is not None:
            return text
        return _dumps(_tensors.raw_to_json(output.datatype, raw or b"", count))
    except NotUtf8Error as exc:
        raise _bad(f"unable to write 'data' for output '{output.name}': {exc}") from None
    except TensorError as exc:
        raise RestError(
            500, f"unable to write 'data' for the worker's output '{output.name}': {exc}"
        ) from None


def _output_bytes(output: pb.ModelInferResponse.InferOutputTensor, raw: bytes | None) -> bytes:
    count = _shape_count(output)
    try:
        if _typed(output, raw):
            return _tensors.contents_to_raw(output.datatype, output.contents, count)
    except TensorError as exc:
        raise RestError(
            500, f"unable to write the worker's output '{output.name}' in binary: {exc}"
        ) from None
    data = raw or b""
    item_size = _tensors.ITEM_SIZES.get(output.datatype)
    if item_size is not None and len(data) != count * item_size:
        raise RestError(
            500,
            f"the worker's output '{output.name}' has {len(data)} bytes, but shape "
            f"{list(output.shape)} of {output.datatype} takes {count * item_size}",
        )
    return data


__all__ = ["EncodedRequest", "RestError", "decode_response", "encode_request"]
