"""Partial decoding of a ModelInferRequest: read what routing needs, touch nothing else.

Pure. The gateway forwards request bodies byte for byte; to route it needs the
model name (field 1) and the id (field 3), and to size a request in items the
shape of one named input (field 5's name and shape). This module walks the
protobuf wire format for exactly those and skips every other field by its wire
type, so a tensor payload of any size costs one length read.

It agrees with protobuf's own parser on every body that parser accepts (a property
test checks this): the last occurrence of a singular field wins, a known field
with an unexpected wire type is an unknown field and skipped, repeated scalars
accept packed and unpacked encodings, groups are skipped whole, and the strings
it reads must be valid UTF-8. On any other bytes it returns a value or raises
`DecodeError`, never another exception. It validates only what it reads: a body
protobuf would reject for a bad string deep inside a tensor is still forwarded,
and the worker, which parses the whole request, rejects it.

A walk reads at most `WALK_LIMIT` top-level fields. A real request has a dozen; a
hostile one of millions of two-byte unknown fields would cost the walk seconds
(about a third of a microsecond per field in Python) while every other client of
the event loop waits. Past the limit the walk hands a body of up to
`PARSE_LIMIT_BYTES` to protobuf's own parser (C, about 6 ms per MiB of such
fields), so it still agrees with protobuf, by construction; a larger one is refused
(`DecodeError`) rather than stall the gateway for tenths of seconds. No real
request comes near: it would need over a thousand inputs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf.message import DecodeError as ProtobufDecodeError

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import DecodeError, clip

_VARINT, _FIXED64, _LENGTH, _START_GROUP, _END_GROUP, _FIXED32 = 0, 1, 2, 3, 4, 5
_MAX_GROUP_DEPTH = 100  # protobuf's default recursion limit
_MASK64 = (1 << 64) - 1
#: Top-level fields a walk reads before protobuf's parser takes over (module docstring).
WALK_LIMIT = 1024
#: The largest body protobuf's parser reads past the walk limit (about 50 ms of work).
PARSE_LIMIT_BYTES = 8 * 1024 * 1024


#: What the walks read: bytes, or a view of them (a gathered body's first piece).
Buffer = bytes | memoryview


def _varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Decode one varint at `pos`; return (value, next position).

    A tenth byte's bits beyond the 64th are dropped, as protobuf's parser drops
    them (it accepts such a varint), so the two agree on every body.
    """
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise DecodeError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")


def _tag(buf: Buffer, pos: int, end: int) -> tuple[int, int, int]:
    """Decode a field tag; return (field number, wire type, next position)."""
    if buf[pos] < 0x80:  # one-byte tag: the common case
        tag = buf[pos]
        pos += 1
    else:
        tag, pos = _varint(buf, pos, end)
        if tag > 0xFFFFFFFF:
            raise DecodeError("field tag out of range")
    field = tag >> 3
    if field == 0:
        raise DecodeError("field number 0")
    return field, tag & 7, pos


def _skip(buf: Buffer, pos: int, end: int, field: int, wire_type: int, depth: int = 0) -> int:
    """Skip one field's value; return the position after it."""
    if wire_type == _VARINT:
        return _varint(buf, pos, end)[1]
    if wire_type == _LENGTH:
        length, pos = _varint(buf, pos, end)
        pos += length
    elif wire_type == _FIXED64:
        pos += 8
    elif wire_type == _FIXED32:
        pos += 4
    elif wire_type == _START_GROUP:
        if depth >= _MAX_GROUP_DEPTH:
            raise DecodeError("groups nested too deeply")
        while True:
            if pos >= end:
                raise DecodeError("unterminated group")
            inner, inner_type, pos = _tag(buf, pos, end)
            if inner_type == _END_GROUP:
                if inner != field:
                    raise DecodeError("mismatched end of group")
                return pos
            pos = _skip(buf, pos, end, inner, inner_type, depth + 1)
    else:
        raise DecodeError(f"invalid wire type {wire_type}")
    if pos > end:
        raise DecodeError("truncated field")
    return pos


def _length_delimited(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """(start, stop) of a length-delimited value starting at `pos`."""
    length, pos = _varint(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise DecodeError("truncated length-delimited field")
    return pos, stop


def _utf8(buf: bytes, start: int, stop: int) -> str:
    try:
        return buf[start:stop].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError("string field is not valid UTF-8") from exc


def peek_header(body: bytes) -> tuple[str, str]:
    """The request's `model_name` (field 1) and `id` (field 3).

    Raises:
        DecodeError: the body is not a valid ModelInferRequest encoding.
    """
    buf = body
    end = len(buf)
    pos = 0
    name_at = id_at = (0, 0)
    walked = 0
    while pos < end:
        walked += 1
        if walked > WALK_LIMIT:
            request = _parsed(body)
            return request.model_name, request.id
        # One-byte tags and lengths inline: every field the header walk meets in a
        # real request (small field numbers, names and ids under 128 bytes) takes
        # this path; the helpers handle everything else, with the same checks.
        byte = buf[pos]
        if 8 <= byte < 0x80:
            field, wire_type = byte >> 3, byte & 7
            pos += 1
        else:
            field, wire_type, pos = _tag(buf, pos, end)
        if wire_type == _LENGTH:
            if pos < end and buf[pos] < 0x80:
                start = pos + 1
                pos = start + buf[pos]
                if pos > end:
                    raise DecodeError("truncated length-delimited field")
            else:
                start, pos = _length_delimited(buf, pos, end)
            if field == 1:
                name_at = (start, pos)
            elif field == 3:
                id_at = (start, pos)
        elif wire_type == _END_GROUP:
            raise DecodeError("unexpected end of group")
        else:
            pos = _skip(buf, pos, end, field, wire_type)
    return _utf8(buf, *name_at), _utf8(buf, *id_at) if id_at[1] > id_at[0] else ""


#: ModelInferRequest's `raw_input_contents`: the tensor bytes, after every field routing reads.
RAW_INPUT_CONTENTS = 7


def head_length(prefix: Buffer, complete: bool, stop_field: int = RAW_INPUT_CONTENTS) -> int | None:
    """Where a request's head ends: the first top-level field numbered `stop_field` or more.

    For a compressed request, routing inflates only its head, which is a valid
    request in its own right (it ends on a field boundary) holding everything the
    walks above read: the name, id, parameters and input shapes, in the field
    order protobuf serializes. `prefix` is the start of the payload (`complete`:
    all of it). Returns None when `prefix` ends inside the head (inflate more).

    Raises:
        DecodeError: `complete`, and the payload is not a valid encoding.
    """
    end = len(prefix)
    pos = 0
    walked = 0
    try:
        while pos < end:
            walked += 1
            if walked > WALK_LIMIT:  # the whole payload is the head: see the module docstring
                return end if complete else None
            field, wire_type, after = _tag(prefix, pos, end)
            if field >= stop_field:
                return pos
            if wire_type == _END_GROUP:
                raise DecodeError("unexpected end of group")
            pos = _skip(prefix, after, end, field, wire_type)
    except DecodeError:
        if complete:
            raise
        return None
    return pos if complete else None


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """Triton's sequence parameters of a request: its correlation id and control flags."""

    id: int | str
    start: bool
    end: bool


_SEQUENCE_KEYS = {b"sequence_id": "id", b"sequence_start": "start", b"sequence_end": "end"}
#: A request parameter's value as read (a double only by `peek_priority`).
ParameterValue = int | str | bool | float
_Entry = tuple[str, ParameterValue]


def peek_routing(body: bytes) -> tuple[str, SequenceFlags | None]:
    """The request's `model_name` and, if it belongs to a sequence, its sequence flags.

    One walk for both, so sequence affinity costs a request without parameters
    nothing. A `sequence_id` of 0 or "" means no sequence, as in Triton; a later
    occurrence of a parameter wins, as protobuf's map parsing has it.

    Raises:
        DecodeError: the body is not a valid ModelInferRequest encoding.
    """
    buf = body
    end = len(buf)
    pos = 0
    name_at = (0, 0)
    found: dict[str, ParameterValue] | None = None
    walked = 0
    while pos < end:
        walked += 1
        if walked > WALK_LIMIT:
            return _routing_parsed(body)
        byte = buf[pos]
        if 8 <= byte < 0x80:
            field, wire_type = byte >> 3, byte & 7
            pos += 1
        else:
            field, wire_type, pos = _tag(buf, pos, end)
        if wire_type == _LENGTH:
            if pos < end and buf[pos] < 0x80:  # a one-byte length: inline, as in peek_header
                start = pos + 1
                pos = start + buf[pos]
                if pos > end:
                    raise DecodeError("truncated length-delimited field")
            else:
                start, pos = _length_delimited(buf, pos, end)
            if field == 1:
                name_at = (start, pos)
            elif field == 4:
                entry = _parameter(buf, start, pos)
                if entry is not None:
                    found = found if found is not None else {}
                    found[entry[0]] = entry[1]
        elif wire_type == _END_GROUP:
            raise DecodeError("unexpected end of group")
        else:
            pos = _skip(buf, pos, end, field, wire_type)
    return _routing(_utf8(buf, *name_at), found)


def _routing(
    model: str, found: dict[str, ParameterValue] | None
) -> tuple[str, SequenceFlags | None]:
    if found is None or not found.get("id"):
        return model, None
    sequence_id = found["id"]
    if isinstance(sequence_id, (bool, float)):  # a bool_param (or double) is not an id
        return model, None
    return model, SequenceFlags(
        sequence_id, bool(found.get("start", False)), bool(found.get("end", False))
    )


def _parameter(buf: bytes, start: int, stop: int, priority: bool = False) -> _Entry | None:
    """One `parameters` map entry: (which, its value) if a sequence (or `priority`) parameter."""
    pos = start
    key = b""
    value: ParameterValue | None = None
    while pos < stop:
        field, wire_type, pos = _tag(buf, pos, stop)
        if field == 1 and wire_type == _LENGTH:
            s, pos = _length_delimited(buf, pos, stop)
            key = buf[s:pos]
        elif field == 2 and wire_type == _LENGTH:
            s, pos = _length_delimited(buf, pos, stop)
            value = _parameter_value(buf, s, pos, priority)
        elif wire_type == _END_GROUP:
            raise DecodeError("unexpected end of group")
        else:
            pos = _skip(buf, pos, stop, field, wire_type)
    # An exact ASCII match: no UTF-8 check needed.
    which = ("priority" if key == b"priority" else None) if priority else _SEQUENCE_KEYS.get(key)
    if which is None:
        return None
    return which, value if value is not None else 0


def _parameter_value(buf: bytes, start: int, stop: int, doubles: bool) -> ParameterValue | None:
    """An InferParameter's value: bool, int64, string, uint64 (double if `doubles`); last wins."""
    pos = start
    value: ParameterValue | None = None
    while pos < stop:
        field, wire_type, pos = _tag(buf, pos, stop)
        if field == 1 and wire_type == _VARINT:
            raw, pos = _varint(buf, pos, stop)
            value = raw != 0
        elif field == 2 and wire_type == _VARINT:
            raw, pos = _varint(buf, pos, stop)
            value = raw - (1 << 64) if raw >= 1 << 63 else raw
        elif field == 5 and wire_type == _VARINT:
            value, pos = _varint(buf, pos, stop)
        elif field == 3 and wire_type == _LENGTH:
            s, pos = _length_delimited(buf, pos, stop)
            value = _utf8(buf, s, pos)
        elif field == 4 and wire_type == _FIXED64 and doubles and pos + 8 <= stop:
            value, pos = struct.unpack_from("<d", buf, pos)[0], pos + 8
        elif wire_type == _END_GROUP:
            raise DecodeError("unexpected end of group")
        else:
            pos = _skip(buf, pos, stop, field, wire_type)
    return value


def peek_priority(body: bytes) -> ParameterValue | None:
    """The `priority` parameter as sent (0 if set to no value; the last wins, as in protobuf),
    None without one; `_shares.band_of` judges it. Its own walk, for gateways with bands.

    Raises:
        DecodeError: the body is not a valid ModelInferRequest encoding.
    """
    end = len(body)
    pos = walked = 0
    found: ParameterValue | None = None
    while pos < end:
        walked += 1
        if walked > WALK_LIMIT:  # protobuf's parser reads it: see the module docstring
            parameter = _parsed(body).parameters.get("priority")
            kind = None if parameter is None else parameter.WhichOneof("parameter_choice")
            return None if parameter is None else getattr(parameter, kind or "int64_param")
        field, wire_type, pos = _tag(body, pos, end)
        if wire_type == _LENGTH:
            start, pos = _length_delimited(body, pos, end)
            entry = _parameter(body, start, pos, True) if field == 4 else None
            found = entry[1] if entry is not None else found
        elif wire_type == _END_GROUP:
            raise DecodeError("unexpected end of group")
        else:
            pos = _skip(body, pos, end, field, wire_type)
    return found


def peek_batch_size(body: bytes, input_name: str, axis: int) -> int:
    """The request's extent along `axis` (1-based) of the input named `input_name`.

    Returns 0 when `input_name` is empty, `axis` < 1, no input has that name, or
    that input's shape has fewer than `axis` dimensions. The first input with the
    name decides; inputs are matched by name, never by position.

    Raises:
        DecodeError: the body (or that input) is not a valid encoding.
    """
    if not input_name or axis < 1:
        return 0
    wanted = input_name.encode("utf-8")
    buf = body
    end = len(buf)
    pos = 0
    found: int | None = None
    walked = 0
    while pos < end:
        walked += 1
        if walked > WALK_LIMIT:
            return _batch_size_parsed(body, input_name, axis)
        field, wire_type, pos = _tag(buf, pos, end)
        if wire_type == _LENGTH:
            start, pos = _length_delimited(buf, pos, end)
            if field == 5:
                extent = _input_extent(buf, start, pos, wanted, axis)
                if found is None and extent is not None:
                    found = extent
        elif wire_type == _END_GROUP:
            raise DecodeError("unexpected end of group")
        else:
            pos = _skip(buf, pos, end, field, wire_type)
    return found or 0


def _input_extent(buf: bytes, start: int, stop: int, wanted: bytes, axis: int) -> int | None:
    """Within one InferInputTensor: shape[axis] if its name is `wanted` (0 if short)."""
    pos = start
    name = b""
    shape: list[int] = []
    while pos < stop:
        field, wire_type, pos = _tag(buf, pos, stop)
        if field == 1 and wire_type == _LENGTH:
            s, pos = _length_delimited(buf, pos, stop)
            name = buf[s:pos]
        elif field == 3 and wire_type == _LENGTH:  # packed
            s, pos = _length_delimited(buf, pos, stop)
            while s < pos:
                value, s = _varint(buf, s, pos)
                shape.append(value)
        elif field == 3 and wire_type == _VARINT:  # unpacked
            value, pos = _varint(buf, pos, stop)
            shape.append(value)
        elif wire_type == _END_GROUP:
            raise DecodeError("unexpected end of group")
        else:
            pos = _skip(buf, pos, stop, field, wire_type)
    if name != wanted:
        return None
    if axis > len(shape):
        return 0
    value = shape[axis - 1]
    return value - (1 << 64) if value >= 1 << 63 else value


# -- Past the walk limit: protobuf's parser reads the body ------------------------------


def _parsed(body: bytes) -> pb.ModelInferRequest:
    if len(body) > PARSE_LIMIT_BYTES:
        raise DecodeError(
            f"over {WALK_LIMIT} top-level fields in a body of {len(body)} bytes; "
            f"such a request is read only up to {PARSE_LIMIT_BYTES} bytes"
        )
    try:
        return pb.ModelInferRequest.FromString(body)
    except ProtobufDecodeError as exc:
        raise DecodeError(f"not a valid encoding: {exc}") from None


#: An InferParameter's value as the walk reads it (double_param is not a sequence value).
_PARAMETER_VALUES = {"bool_param", "int64_param", "string_param", "uint64_param"}


def _routing_parsed(body: bytes) -> tuple[str, SequenceFlags | None]:
    request = _parsed(body)
    found: dict[str, ParameterValue] = {}
    for key, which in _SEQUENCE_KEYS.items():
        parameter = request.parameters.get(key.decode())
        if parameter is not None:
            kind = parameter.WhichOneof("parameter_choice")
            found[which] = getattr(parameter, kind) if kind in _PARAMETER_VALUES else 0
    return _routing(request.model_name, found or None)


def _batch_size_parsed(body: bytes, input_name: str, axis: int) -> int:
    for tensor in _parsed(body).inputs:
        if tensor.name == input_name:
            return tensor.shape[axis - 1] if axis <= len(tensor.shape) else 0
    return 0


# -- ModelStreamInferResponse, written without protobuf --------------------------------

_INFER_RESPONSE_TAG = b"\x12"  # field 2 (infer_response), length-delimited


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def stream_reply(infer_response: bytes) -> bytes:
    """A ModelStreamInferResponse carrying an already serialized ModelInferResponse.

    The response bytes are embedded as they are (field 2), so a worker's answer is
    never parsed or re-encoded on its way into the stream.
    """
    return _INFER_RESPONSE_TAG + _encode_varint(len(infer_response)) + infer_response


def stream_error(message: str) -> bytes:
    """A ModelStreamInferResponse reporting one request's failure (field 1)."""
    text = clip(message).encode("utf-8")
    return b"\x0a" + _encode_varint(len(text)) + text
