"""Triton's REST inference request as the gRPC ModelInfer call a worker takes.

Pure: no trio, no sockets, no logging. The REST door (`rsgw.rest._door`) sends every
inference down the gateway's gRPC ModelInfer path, byte for byte the call a gRPC
client would have made, so the REST-specific work is here and in `rsgw.rest._reply` (the way back).

Requests. Every tensor's bytes go in `raw_input_contents`, one entry per input not
read from shared memory, in input order (gRPC takes raw contents for all such
inputs or for none). The message is serialized without them and the entries are
appended as encoded fields after it: a binary input's bytes are copied once, from
the body into the message, and field 7 comes last, where protobuf puts it. The
REST-only settings (an input's `binary_data_size`, an output's `binary_data`, the
request's `binary_data_output`) are not forwarded; what the response needs of them
is kept in the `EncodedRequest`. Every other parameter is.

Large JSON data. A JSON body's numbers are not made Python objects (issue 47: that
cost 32 bytes a `1.5,`): `read_request` cuts the large numeric `data` arrays out
of the text (`rsgw.rest._json_data`), parses and checks the rest, and returns a
`RequestDraft` that knows every input's name, datatype and shape and how many
bytes its numbers will pack into, before any is read; `RequestDraft.encode` then
packs them a slice at a time. The door checks and pays for the draft in between.

Errors are the door's `RestError`s: 400 for the request's mistakes, 413 for a
request too large as gRPC. They name the tensor and say what is wrong, in Triton's
words where Triton has some.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._body import Body, Gathered
from rsgw.rest import _tensors
from rsgw.rest._json_data import (
    NumbersError,
    Skeleton,
    cut_data,
    pack_numbers,
    span_of,
)
from rsgw.rest._rest_errors import RestError
from rsgw.rest._tensors import TensorError, show

SHM_REGION = "shared_memory_region"
_SHM_NUMBERS = ("shared_memory_byte_size", "shared_memory_offset")
_INT64 = 1 << 63
_RAW_INPUT_TAG = b"\x3a"  # raw_input_contents: field 7, length-delimited
#: A request this large goes to the gateway in its pieces, never joined (one copy less).
GATHER_FROM_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """The gRPC request, and what its REST response needs to know of the REST request.

    `binary_outputs`: per requested output (not in shared memory), whether the client
    asked for it in binary; an output the request does not list follows
    `binary_default` (the request's `binary_data_output`, False unless set).
    `shm_outputs`: requested outputs the worker writes to shared memory.
    """

    message: Body
    binary_outputs: Mapping[str, bool]
    binary_default: bool = False
    shm_outputs: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class DraftInput:
    """An input of a read request, as the model's metadata can check it."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(slots=True)
class RequestDraft:
    """A REST inference request read and checked, its large numeric arrays not yet
    packed (see the module docstring); `encode` finishes it."""

    model: str
    message: pb.ModelInferRequest
    #: Each raw input's bytes, or (for a large JSON array) how to pack them.
    chunks: list[bytes | memoryview | _LargeData]
    binary_outputs: dict[str, bool]
    binary_default: bool
    shm_outputs: frozenset[str]
    inputs: list[DraftInput]

    @property
    def expansion(self) -> int:
        """Bytes the large JSON arrays pack into: what `encode` makes beside the body."""
        return sum(chunk.size for chunk in self.chunks if isinstance(chunk, _LargeData))

    def encode(self, max_bytes: int) -> EncodedRequest:
        """The gRPC request, large arrays packed (a slice of their text at a time).

        Raises:
            RestError: 400 for data that does not fit its input, 413 when the gRPC
                request would be larger than `max_bytes`.
        """
        # Each raw entry's tag and length go with what comes before them, so the first
        # piece holds the whole head and where the tensors start (routing reads a
        # `Gathered` body's head from its first piece, and joins it all if it cannot).
        parts: list[bytes | bytearray | memoryview] = []
        framing = self.message.SerializeToString()
        for chunk in self.chunks:
            data = chunk.pack() if isinstance(chunk, _LargeData) else chunk
            parts += (framing + _RAW_INPUT_TAG + _varint(len(data)), data)
            framing = b""
        if framing:
            parts.append(framing)
        size = sum(map(len, parts))
        if size > max_bytes:
            raise RestError(
                413,
                f"the inference request for model '{self.model}' is {size} bytes as gRPC, "
                f"more than the {max_bytes} bytes allowed",
            )
        if size < GATHER_FROM_BYTES:
            message: Body = b"".join(parts)
        else:
            message = Gathered([memoryview(part) for part in parts], size)
        return EncodedRequest(message, self.binary_outputs, self.binary_default, self.shm_outputs)


@dataclass(frozen=True, slots=True)
class _LargeData:
    """A large JSON array of numbers, still text: packed by `pack`."""

    text: memoryview
    name: str
    datatype: str
    count: int

    @property
    def size(self) -> int:
        return self.count * _tensors.ITEM_SIZES[self.datatype]

    def pack(self) -> bytes | bytearray:
        datatype = self.datatype
        try:
            return pack_numbers(
                self.text,
                self.count,
                _tensors.kinds(datatype),
                lambda values: _tensors.pack(datatype, values),  # type: ignore[arg-type]
            )
        except (NumbersError, TensorError) as exc:
            raise _bad(f"unable to parse 'data' for input '{self.name}': {exc}") from None


def shape_problem(draft: RequestDraft, metadata: pb.ModelMetadataResponse) -> str | None:
    """Why the draft's inputs cannot be the model's (as its metadata says), worded as
    Triton words it; None when they fit, or the metadata does not say."""
    known = {tensor.name: tensor for tensor in metadata.inputs}
    if not known:
        return None
    for given in draft.inputs:
        tensor = known.get(given.name)
        if tensor is None:
            return f"unexpected inference input '{given.name}' for model '{draft.model}'"
        if tensor.datatype and tensor.datatype != given.datatype:
            return (
                f"inference input '{given.name}' data-type is '{given.datatype}', but model "
                f"'{draft.model}' expects '{tensor.datatype}'"
            )
        expected = list(tensor.shape)
        if expected and (
            len(expected) != len(given.shape)
            or any(e >= 0 and e != g for e, g in zip(expected, given.shape, strict=True))
        ):
            return (
                f"unexpected shape for input '{given.name}' for model '{draft.model}'. "
                f"Expected {_dims(expected)}, got {_dims(given.shape)}"
            )
    return None


def _dims(shape: Sequence[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def encode_request(
    model: str,
    version: str,
    body: bytes | memoryview,
    header_length: int | None,
    *,
    max_bytes: int,
) -> EncodedRequest:
    """`read_request`, then `RequestDraft.encode`: a REST inference body as a
    ModelInferRequest.

    Raises:
        RestError: as those two.
    """
    return read_request(model, version, body, header_length).encode(max_bytes)


def read_request(
    model: str, version: str, body: bytes | bytearray | memoryview, header_length: int | None
) -> RequestDraft:
    """A REST inference body (JSON header, then binary section), read and checked.

    `header_length` is the Inference-Header-Content-Length header (None when absent:
    the whole body is JSON).

    Raises:
        RestError: 400 for a body that is not a valid inference request.
    """
    view = memoryview(body).cast("B")
    if header_length is None:
        header, binary = view, view[len(view) :]
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
    # The whole body when it is all JSON: a view of it would be copied to parse.
    skeleton = cut_data(body if header_length is None else header)
    document = _parse(skeleton.text)

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
    chunks: list[bytes | memoryview | _LargeData] = []
    taken = 0
    found = _Found(header, skeleton, binary, header_length, model)
    for index, item in enumerate(inputs):
        chunk, taken = _input(message, item, index, found, taken)
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
    described = [DraftInput(t.name, t.datatype, tuple(t.shape)) for t in message.inputs]
    return RequestDraft(
        model,
        message,
        chunks,
        binary_outputs,
        binary_default,
        frozenset(shm_outputs),
        described,
    )


@dataclass(frozen=True, slots=True)
class _Found:
    """Where a request's tensor data is: its JSON header (and the arrays cut out of
    it), and its binary section."""

    header: memoryview
    skeleton: Skeleton
    binary: memoryview
    header_length: int | None
    model: str


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
    if type(parameters.get(SHM_REGION, "")) is not str:
        raise _bad(f"unable to parse '{SHM_REGION}' for {what}: expected a string")
    for key in _SHM_NUMBERS:
        _count(parameters.get(key, 0), f"'{key}' for {what}")


def _count(value: object, what: str) -> int:
    if type(value) is not int or value < 0:
        raise _bad(f"unable to parse {what}: expected an integer >= 0")
    return value


def _input(
    message: pb.ModelInferRequest, item: object, index: int, found: _Found, taken: int
) -> tuple[bytes | memoryview | _LargeData | None, int]:
    """Adds input `index` to `message`: its raw bytes (None in shared memory; a large
    JSON array still to pack), and how far the binary section has been taken once
    its own bytes are."""
    binary, header_length, model = found.binary, found.header_length, found.model
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
    sources += [f"'{key}'" for key in ("binary_data_size", SHM_REGION) if key in parameters]
    if len(sources) != 1:
        raise _bad(
            f"input '{name}' must set exactly one of 'data', 'binary_data_size' in "
            f"'parameters' and '{SHM_REGION}' in 'parameters', but sets "
            + (" and ".join(sources) if sources else "none"),
        )
    _shm_parameters(parameters, f"input '{name}'")
    tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
    for key, value in parameters.items():
        if key != "binary_data_size":
            _set(tensor.parameters[key], value, f"parameter '{key}' of input '{name}'")
    count = _tensors.element_count(shape)

    if SHM_REGION in parameters:
        return None, taken
    if "data" in item:
        span = span_of(item["data"], found.skeleton)
        if span is not None:
            if datatype == "BYTES":  # the cut arrays hold numbers and booleans only
                raise _bad(f"unable to parse 'data' for input '{name}': expected strings")
            text = found.header[span[0] : span[1]]
            return _LargeData(text, name, datatype, count), taken
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
    shm = SHM_REGION in parameters
    if shm and binary:
        raise _bad(f"output '{name}' can't set both '{SHM_REGION}' and 'binary_data'")
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


__all__ = [
    "DraftInput",
    "EncodedRequest",
    "RequestDraft",
    "RestError",
    "encode_request",
    "read_request",
    "shape_problem",
]
