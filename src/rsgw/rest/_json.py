"""Protobuf messages as Triton's REST API writes them in JSON, and back.

Pure. Triton's REST answers are the gRPC messages' fields by their proto names, with
64-bit integers as JSON numbers (protobuf's own JSON mapping writes them as strings,
which `tritonclient.http` users index as numbers: `config["max_batch_size"]`,
`stats["model_stats"][0]["inference_count"]`), enums by their names, and unset
fields left out. Requests come the other way through `json_format.ParseDict`, which
takes numbers for 64-bit fields.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from rsgw.rest._rest_errors import RestError

M = TypeVar("M", bound=Message)


def message_json(message: Message, *, defaults: bool = False) -> dict[str, Any]:
    """`message`'s set fields as Triton writes them (see the module docstring).

    With `defaults`, also every field without presence left at its default (0, "",
    false, the enum's zero name, [] and {}), as protobuf's `always_print_primitive_fields`
    writes them: Triton's ModelConfig JSON (`config["max_batch_size"]` is 0, not missing).
    """
    out: dict[str, Any] = {}
    if defaults:
        fields = [
            (field, getattr(message, field.name))
            for field in message.DESCRIPTOR.fields
            if not field.has_presence or message.HasField(field.name)
        ]
    else:
        fields = list(message.ListFields())
    for field, value in fields:
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            inner = entry.fields_by_name["value"]
            out[field.name] = {key: _single(inner, item, defaults) for key, item in value.items()}
        elif field.is_repeated:
            out[field.name] = [_single(field, item, defaults) for item in value]
        else:
            out[field.name] = _single(field, value, defaults)
    return out


def _single(field: FieldDescriptor, value: Any, defaults: bool = False) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_json(value, defaults=defaults)
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if field.type == FieldDescriptor.TYPE_BYTES:
        return {"b64": base64.b64encode(value).decode()}
    return value


def dumps(document: object) -> bytes:
    """Compact JSON, as Triton writes it."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def loads_object(body: bytes, what: str) -> dict[str, Any]:
    """A JSON object from a request body ({} for an empty body).

    Raises:
        RestError: 400, the body is not a JSON object.
    """
    if not body.strip():
        return {}
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RestError(400, f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(document, dict):
        raise RestError(400, f"{what} must be a JSON object")
    return document


def parse_into(document: Mapping[str, Any], message: M, what: str) -> M:
    """`document` read into `message` by protobuf's JSON mapping.

    Raises:
        RestError: 400, naming what was wrong with it.
    """
    try:
        json_format.ParseDict(document, message)
    except json_format.ParseError as exc:
        raise RestError(400, f"invalid {what}: {exc}") from None
    return message
