"""A worker's ModelInferResponse as Triton's REST inference reply.

Pure: no trio, no sockets, no logging. The other half of `rsgw.rest._codec`, which
turns the REST request into the gRPC one.

Replies, as Triton writes them: "id" only when set; a binary output as
`binary_data_size`, its bytes after the JSON in output order, and the JSON's length
(the Inference-Header-Content-Length header) only when bytes follow; no data for an
output in shared memory (so asked in the request, or so marked by the worker).
Data comes from `raw_output_contents` (an entry per output, or per output not in
shared memory) or from the typed `contents` some workers (MLServer) send instead.
A large numeric output is written a slice of elements at a time
(`rsgw.rest._json_data.numbers_json`), never a Python list of the whole tensor.

Errors are the door's `RestError`s: 500 for a worker's answer that makes no sense,
400 for a BYTES output asked for in JSON that holds bytes JSON cannot carry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from google.protobuf.message import DecodeError

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.rest import _tensors
from rsgw.rest._codec import SHM_REGION, EncodedRequest
from rsgw.rest._json_data import SLICE_ELEMENTS
from rsgw.rest._rest_errors import RestError
from rsgw.rest._tensors import NotUtf8Error, TensorError


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
    in_shm = [o.name in request.shm_outputs or SHM_REGION in o.parameters for o in outputs]
    raw_index = _raw_index(len(outputs), len(response.raw_output_contents), in_shm)
    # The JSON is written in pieces, each output's after the document's other fields and
    # each "data" after its output's: an 8-bit tensor's data then goes from a table of
    # its 256 numbers' text, several times faster than json.dumps of its values, and a
    # large numeric one a slice of elements at a time (no Python object per element).
    written: list[bytes] = []
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
            written.append(_dumps(entry).encode())
        elif not in_shm[i]:
            written += (_dumps(entry)[:-1].encode(), b',"data":', *_output_json(output, raw), b"}")
        else:
            written.append(_dumps(entry).encode())
        written.append(b",")
    if written:
        written.pop()  # the last output's comma
    head = [_dumps(document)[:-1].encode(), b',"outputs":[', *written, b"]}"]
    if not tail:
        return b"".join(head), None
    return b"".join([*head, *tail]), sum(map(len, head))


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


def _output_json(output: pb.ModelInferResponse.InferOutputTensor, raw: bytes | None) -> list[bytes]:
    """The output's data as a JSON array's text, in pieces."""
    count = _shape_count(output)
    try:
        if _typed(output, raw):
            return [
                _dumps(_tensors.contents_values(output.datatype, output.contents, count)).encode()
            ]
        text = _tensors.raw_json_text(output.datatype, raw or b"", count)
        if text is not None:
            return [text.encode()]
        if count > SLICE_ELEMENTS:
            pieces = _tensors.numbers_json_pieces(output.datatype, raw or b"", count)
            if pieces is not None:
                return pieces
        return [_dumps(_tensors.raw_to_json(output.datatype, raw or b"", count)).encode()]
    except NotUtf8Error as exc:
        raise RestError(400, f"unable to write 'data' for output '{output.name}': {exc}") from None
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
