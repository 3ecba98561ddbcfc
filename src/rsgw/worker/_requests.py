"""A ModelInferRequest as the worker reads it, and its ModelInferResponse as it writes it.

Inputs come from `raw_input_contents`, the typed `contents`, or a registered
shared-memory region; outputs go back raw or into a region the client named.
Everything is checked against the model's declared tensors before the request
costs any device time, and every error names the input, the expected and the got.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import InvalidRequest
from rsgw.worker._shm import REGION_PARAMETER
from rsgw.worker._triton import batches_first
from rsgw.worker.models._classification import classify, requested_classes
from rsgw.worker.models._tensors import Tensor, check_input, tensor_from_contents, tensor_from_raw

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping, Sequence

    from rsgw.worker._shm import ShmRegistry
    from rsgw.worker.models._specs import ModelSpec

_SHM_REGION = REGION_PARAMETER
_SHM_OFFSET = "shared_memory_offset"
_SHM_SIZE = "shared_memory_byte_size"
#: Triton's parameter on every streamed response: true on the one completing its request.
_FINAL = "triton_final_response"
#: Relative deadline a ReactantServer client may send as a request parameter.
_TIMEOUT_NS = "reactant_timeout_ns"


class RequestCodec:
    """Reads requests and writes responses for one worker, through its SHM registry."""

    def __init__(self, shm: ShmRegistry, labels: Mapping[str, Sequence[str]]) -> None:
        self.shm = shm
        #: The catalogue's label files, for classification results.
        self.labels = labels

    def decode_inputs(
        self, spec: ModelSpec, request: pb.ModelInferRequest
    ) -> tuple[dict[str, Tensor], Hashable]:
        # As in Triton, raw_input_contents holds one entry per input that is not read
        # from shared memory, in input order.
        raw = request.raw_input_contents
        for tensor in request.inputs:  # Triton's checks and words, before any other
            if not tensor.HasField("contents"):
                continue
            if _SHM_REGION in tensor.parameters:
                raise InvalidRequest(
                    f"unexpected 'content' provided when using shared memory for input tensor "
                    f"'{tensor.name}' for model '{request.model_name}'"
                )
            if raw:
                raise InvalidRequest(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{request.model_name}'"
                )
        inline = sum(1 for t in request.inputs if _SHM_REGION not in t.parameters)
        if raw and len(raw) != inline:
            raise InvalidRequest(
                f"model '{spec.name}': {inline} inputs without shared memory but "
                f"{len(raw)} raw_input_contents"
            )
        next_raw = iter(raw)
        tensors: dict[str, Tensor] = {}
        variant: list[tuple[str, tuple[int, ...]]] = []
        for tensor in request.inputs:
            declared = spec.input(tensor.name)
            if declared is None:
                raise InvalidRequest(
                    f"unexpected input '{tensor.name}' for model '{spec.name}'; it takes "
                    + ", ".join(repr(t.name) for t in spec.inputs)
                )
            if tensor.name in tensors:
                raise InvalidRequest(f"input '{tensor.name}' given twice")
            shape = tuple(tensor.shape)
            check_input(declared, tensor.datatype, shape, model=spec.name)
            params = tensor.parameters
            if _SHM_REGION in params:
                region = params[_SHM_REGION].string_param
                offset = params[_SHM_OFFSET].int64_param if _SHM_OFFSET in params else 0
                if _SHM_SIZE not in params:
                    raise InvalidRequest(
                        f"input '{tensor.name}': {_SHM_SIZE} is required with {_SHM_REGION}"
                    )
                data = self.shm.read(region, offset, params[_SHM_SIZE].int64_param)
                value = tensor_from_raw(tensor.name, tensor.datatype, shape, data)
            elif raw:
                value = tensor_from_raw(tensor.name, tensor.datatype, shape, next(next_raw))
            else:
                value = tensor_from_contents(tensor.name, tensor.datatype, shape, tensor.contents)
            tensors[tensor.name] = value
            if tensor.name == spec.batch_input and 0 < spec.batch_axis <= len(shape):
                shape = shape[: spec.batch_axis - 1] + shape[spec.batch_axis :]
            variant.append((tensor.name, shape))
        missing = [t.name for t in spec.inputs if t.name not in tensors]
        if missing:
            raise InvalidRequest(
                f"missing input '{missing[0]}' for model '{spec.name}'"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        variant.sort()
        return tensors, tuple(variant)

    def check_requested_outputs(self, spec: ModelSpec, request: pb.ModelInferRequest) -> None:
        """Reject bad requested outputs before the request costs any device time."""
        for requested in request.outputs:
            if spec.output(requested.name) is None:
                raise InvalidRequest(
                    f"unexpected requested output '{requested.name}' for model "
                    f"'{spec.name}'; it produces " + ", ".join(repr(t.name) for t in spec.outputs)
                )
            if _SHM_REGION in requested.parameters:
                self.shm.require(requested.parameters[_SHM_REGION].string_param)
            requested_classes(requested.name, requested.parameters)

    def encode_response(
        self,
        spec: ModelSpec,
        request: pb.ModelInferRequest,
        outputs: tuple[Tensor, ...],
        *,
        final: bool | None = None,
    ) -> bytes:
        """The response to `request`; a streamed one says whether it is the `final` one."""
        by_name = {t.name: t for t in outputs}
        response = pb.ModelInferResponse(
            model_name=spec.name, model_version=spec.version, id=request.id
        )
        if final is not None:
            response.parameters[_FINAL].bool_param = final
        selection: list[tuple[Tensor, Mapping[str, pb.InferParameter] | None]]
        if request.outputs:  # names were checked before execution
            selection = [(by_name[r.name], r.parameters) for r in request.outputs]
        else:
            selection = [(t, None) for t in outputs]
        raw: list[bytes] = []
        for tensor, params in selection:
            classes = 0 if params is None else requested_classes(tensor.name, params)
            if classes:
                declared = spec.output(tensor.name)
                labels = self.labels.get(declared.labels, ()) if declared is not None else ()
                tensor = classify(tensor, classes, labels, batched=batches_first(spec))
            out = response.outputs.add(name=tensor.name, datatype=tensor.datatype)
            out.shape.extend(tensor.shape)
            if params is not None and _SHM_REGION in params:
                region = params[_SHM_REGION].string_param
                offset = params[_SHM_OFFSET].int64_param if _SHM_OFFSET in params else 0
                slot = params[_SHM_SIZE].int64_param if _SHM_SIZE in params else None
                self.shm.write(region, offset, tensor.data, byte_size=slot)
                out.parameters[_SHM_REGION].string_param = region
                out.parameters[_SHM_OFFSET].int64_param = offset
                out.parameters[_SHM_SIZE].int64_param = len(tensor.data)
                raw.append(b"")
            else:
                raw.append(tensor.data)
        # Triton's clients index raw_output_contents by output position, so a region-backed
        # output keeps an empty placeholder, as Triton writes it: even when every output
        # went to shared memory (without them, perf_analyzer's C++ client read past the
        # end of the list and crashed).
        response.raw_output_contents.extend(raw)
        return response.SerializeToString()

    def final_response(self, spec: ModelSpec, request: pb.ModelInferRequest) -> bytes:
        """The empty response that completes a decoupled request (no outputs)."""
        response = pb.ModelInferResponse(
            model_name=spec.name, model_version=spec.version, id=request.id
        )
        response.parameters[_FINAL].bool_param = True
        return response.SerializeToString()


def parse_infer_request(body: bytes) -> pb.ModelInferRequest:
    try:
        return pb.ModelInferRequest.FromString(body)
    except Exception as exc:  # protobuf's DecodeError, or a RuntimeError from upb
        raise InvalidRequest(f"malformed ModelInferRequest: {exc}") from exc


def parameter_deadline(request: pb.ModelInferRequest, now: float) -> float:
    """The absolute deadline a `reactant_timeout_ns` parameter asks for (from `now`), or inf."""
    if _TIMEOUT_NS in request.parameters:
        budget_ns = request.parameters[_TIMEOUT_NS].int64_param
        if budget_ns > 0:
            return now + budget_ns / 1e9
    return math.inf
