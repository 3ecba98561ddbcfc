"""One catalogue entry, parsed: a `kind: model`, `kind: meta` or `kind: ensemble` mapping.

Pure: no trio, no sockets, no logging. `_catalogue.py` walks the `models:` list
and hands each entry here; `parse_model` turns it into a frozen `ModelSpec`
(`_specs.py`) and checks everything a worker would otherwise trip over
mid-request: datatypes, shapes, the batch axis, the costs, and whether the
`compute` function can actually run on the declared tensors (`_compute_kinds.py`).
Unknown keys are errors, so a typo such as `max_bach_size` fails at start-up
instead of silently leaving a model unbatched. Each helper raises `ConfigError`
with a message that starts with the key path; the catalogue prefixes the source.

Shapes are WIRE shapes (row-major, as KServe clients send them); -1 accepts any
size. `batch_axis` is 1-based into the batch input's wire shape, as the worker's
ModelControlStatus reports it (docs/original.md §8.2).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from rsgw.base._errors import ConfigError
from rsgw.base._values import show
from rsgw.worker.models._compute_kinds import COMPUTE_KINDS, check_compute
from rsgw.worker.models._specs import (
    DEFAULT_PLATFORM,
    DEFAULT_SEQUENCE_IDLE_SECONDS,
    SEQUENCE_CONTROLS,
    ModelKind,
    ModelSpec,
    SequenceSpec,
    TensorSpec,
)
from rsgw.worker.models._tensors import DATATYPES, format_shape

if TYPE_CHECKING:
    from collections.abc import Mapping

# Cost-model defaults, in milliseconds as the YAML spells them: a launch cost of a
# millisecond and a tenth of that per row is the order of a small model's kernel
# launch and per-item work on a GPU, so batching pays off as it does on a device.
DEFAULT_LAUNCH_MS = 1.0
DEFAULT_ITEM_MS = 0.1
DEFAULT_COMPUTE = "synthetic"

_MODEL_KEYS = (
    "name",
    "kind",
    "platform",
    "inputs",
    "outputs",
    "max_batch_size",
    "batch_input",
    "batch_axis",
    "launch_ms",
    "item_ms",
    "weight_bytes",
    "load_ms",
    "compute",
    "sequence",
    "decoupled",
    "max_queue_delay_microseconds",
    "preferred_batch_size",
)
_SEQUENCE_KEYS = ("controls", "corrid_datatype", "idle_ms")
# A meta has no cost or weights of its own (its sub-models carry them) and no
# max batch: it runs one request at a time through its sub-models.
_META_KEYS = (
    "name",
    "kind",
    "platform",
    "inputs",
    "outputs",
    "submodels",
    "batch_input",
    "batch_axis",
    "compute",
)
_ENSEMBLE_KEYS = (*_META_KEYS, "max_batch_size")
_TENSOR_KEYS = ("name", "datatype", "shape", "format", "labels")
#: Image layouts Triton's ModelConfig knows.
_FORMATS = ("NCHW", "NHWC")


# ---------------------------------------------------------------------------
# Parsing. Each helper raises ConfigError with a message that starts with the
# key path; parse_catalogue prefixes the source.


def check_mapping(value: object, where: str, keys: tuple[str, ...]) -> Mapping[Hashable, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {show(value)}")
    for key in value:
        if key not in keys:
            raise ConfigError(
                f"{where} has unknown key {show(key)} (known keys: {', '.join(keys)})"
            )
    return value


def check_list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a list, got {show(value)}")
    return value


def _name(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a non-empty string, got {show(value)}")
    return value


def _int(m: Mapping[Hashable, Any], key: str, where: str, default: int) -> int:
    value = m.get(key, default)
    # bool is an int subclass; `max_batch_size: yes` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where}.{key} must be an integer >= 0, got {show(value)}")
    return value


def _bool(m: Mapping[Hashable, Any], key: str, where: str) -> bool:
    value = m.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} must be true or false, got {show(value)}")
    return value


def _ms(m: Mapping[Hashable, Any], key: str, where: str, default: float) -> float:
    value = m.get(key, default)
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError(
            f"{where}.{key} must be a finite number of milliseconds >= 0, got {show(value)}"
        )
    return float(value) / 1000.0


def _parse_tensor(value: object, where: str) -> TensorSpec:
    m = check_mapping(value, where, _TENSOR_KEYS)
    if "name" not in m:
        raise ConfigError(f"{where}.name is required")
    name = _name(m["name"], f"{where}.name")
    datatype = m.get("datatype")
    if datatype not in DATATYPES:
        raise ConfigError(
            f"{where}.datatype must be one of {', '.join(DATATYPES)}, got {show(datatype)}"
        )
    if "shape" not in m:
        raise ConfigError(f"{where}.shape is required")
    dims = check_list(m["shape"], f"{where}.shape")
    for i, d in enumerate(dims):
        if not isinstance(d, int) or isinstance(d, bool) or (d != -1 and d < 1):
            raise ConfigError(f"{where}.shape[{i}] must be -1 or an integer >= 1, got {show(d)}")
    layout = m.get("format", "")
    if layout not in ("", *_FORMATS):
        raise ConfigError(f"{where}.format must be NCHW or NHWC, got {show(layout)}")
    labels = m.get("labels", "")
    if not isinstance(labels, str):
        raise ConfigError(f"{where}.labels must be a label file name, got {show(labels)}")
    return TensorSpec(name, datatype, tuple(dims), str(layout), labels)


def _parse_tensors(m: Mapping[Hashable, Any], key: str, where: str) -> tuple[TensorSpec, ...]:
    path = f"{where}.{key}"
    if key not in m:
        raise ConfigError(f"{path} is required")
    items = check_list(m[key], path)
    if not items:
        raise ConfigError(f"{path} must declare at least one tensor, got []")
    specs: list[TensorSpec] = []
    for i, item in enumerate(items):
        spec = _parse_tensor(item, f"{path}[{i}]")
        if any(s.name == spec.name for s in specs):
            raise ConfigError(f"{path}[{i}].name duplicates an earlier {key[:-1]}: {spec.name!r}")
        specs.append(spec)
    return tuple(specs)


def _parse_batch(
    m: Mapping[Hashable, Any], where: str, inputs: tuple[TensorSpec, ...], max_batch_size: int
) -> tuple[str, int]:
    """Resolve `batch_input` / `batch_axis`, filling in the documented defaults.

    With neither key, a batched model (max_batch_size > 0) batches along the
    first -1 of its first input that has one, which is what every Triton-style
    `[-1, ...]` model means; an unbatched model has no batch axis. An explicit
    `batch_input: ""` says "no batch axis" for a batched model too.
    """
    axis = _int(m, "batch_axis", where, 0) if "batch_axis" in m else None
    if "batch_input" not in m:
        if axis:
            raise ConfigError(f"{where}.batch_axis needs batch_input to be set, got {axis}")
        if max_batch_size > 0 and axis is None:
            for spec in inputs:
                if -1 in spec.shape:
                    return spec.name, spec.shape.index(-1) + 1
        return "", 0
    name = m["batch_input"]
    if not isinstance(name, str):
        raise ConfigError(f"{where}.batch_input must be a string, got {show(name)}")
    if not name:
        if axis:
            raise ConfigError(f"{where}.batch_axis must be 0 when batch_input is '', got {axis}")
        return "", 0
    target = next((s for s in inputs if s.name == name), None)
    if target is None:
        names = ", ".join(s.name for s in inputs)
        raise ConfigError(
            f"{where}.batch_input must name one of the inputs ({names}), got {name!r}"
        )
    if axis is None:
        if -1 not in target.shape:
            raise ConfigError(
                f"{where}.batch_input {name!r} has no -1 dim to batch along "
                f"(shape {format_shape(target.shape)})"
            )
        return name, target.shape.index(-1) + 1
    if not 1 <= axis <= len(target.shape):
        raise ConfigError(
            f"{where}.batch_axis must be between 1 and {len(target.shape)} "
            f"(the rank of {name!r}), got {axis}"
        )
    if target.shape[axis - 1] != -1:
        raise ConfigError(
            f"{where}.batch_axis {axis} must point at a -1 dim of {name!r} "
            f"{format_shape(target.shape)}, got dim {target.shape[axis - 1]}"
        )
    return name, axis


def _parse_sequence(m: Mapping[Hashable, Any], where: str) -> SequenceSpec | None:
    """The `sequence:` block of a stateful model (Triton's sequence_batching)."""
    if "sequence" not in m:
        return None
    path = f"{where}.sequence"
    block = check_mapping(m["sequence"], path, _SEQUENCE_KEYS)
    controls: list[str] = []
    for i, item in enumerate(
        check_list(block.get("controls", ["START", "READY"]), f"{path}.controls")
    ):
        if item not in SEQUENCE_CONTROLS or item in controls:
            raise ConfigError(
                f"{path}.controls[{i}] must be one of {', '.join(SEQUENCE_CONTROLS)} "
                f"(each once), got {show(item)}"
            )
        controls.append(item)
    corrid = block.get("corrid_datatype", "UINT64")
    if corrid not in ("UINT64", "BYTES"):
        raise ConfigError(f"{path}.corrid_datatype must be UINT64 or BYTES, got {show(corrid)}")
    idle_seconds = _ms(block, "idle_ms", path, DEFAULT_SEQUENCE_IDLE_SECONDS * 1000)
    if idle_seconds <= 0:
        raise ConfigError(f"{path}.idle_ms must be > 0, got {show(block['idle_ms'])}")
    return SequenceSpec(tuple(controls), str(corrid), idle_seconds)


def _parse_compute(m: Mapping[Hashable, Any], where: str) -> str:
    compute = m.get("compute", DEFAULT_COMPUTE)
    if compute not in COMPUTE_KINDS:
        raise ConfigError(
            f"{where}.compute must be one of {', '.join(COMPUTE_KINDS)}, got {show(compute)}"
        )
    return str(compute)


def _parse_submodels(m: Mapping[Hashable, Any], where: str) -> tuple[str, ...]:
    path = f"{where}.submodels"
    if "submodels" not in m:
        raise ConfigError(f"{path} is required for kind: meta and kind: ensemble")
    items = check_list(m["submodels"], path)
    if not items:
        raise ConfigError(f"{path} must list at least one sub-model, got []")
    names: list[str] = []
    for i, item in enumerate(items):
        name = _name(item, f"{path}[{i}]")
        if name in names:
            raise ConfigError(f"{path}[{i}] lists {name!r} twice")
        names.append(name)
    return tuple(names)


def _parse_meta(m: Mapping[Hashable, Any], where: str, name: str, kind: ModelKind) -> ModelSpec:
    """A meta or an ensemble: its own client tensors, and sub-models that do the work.

    Its batch input and axis (defaulting as a batched model's do) only say how
    many rows a request carries, which sizes the sub-calls and the synthetic
    outputs. ModelControlStatus still reports no batch axis for a meta. An
    ensemble may state the `max_batch_size` its ModelConfig reports (Triton's
    clients size their batches by it); it runs its requests one by one as a
    meta does.
    """
    inputs = _parse_tensors(m, "inputs", where)
    batch_input, batch_axis = _parse_batch(m, where, inputs, 1)
    spec = ModelSpec(
        name=name,
        inputs=inputs,
        outputs=_parse_tensors(m, "outputs", where),
        max_batch_size=_int(m, "max_batch_size", where, 0),
        batch_input=batch_input,
        batch_axis=batch_axis,
        launch_seconds=0.0,
        item_seconds=0.0,
        weight_bytes=0,
        compute=_parse_compute(m, where),
        platform=_name(m.get("platform", DEFAULT_PLATFORM), f"{where}.platform"),
        kind=kind,
        submodels=_parse_submodels(m, where),
    )
    check_compute(spec, where)
    return spec


def parse_model(value: object, where: str) -> ModelSpec:
    kinds = tuple(k.value for k in ModelKind)
    kind = value.get("kind", "model") if isinstance(value, dict) else "model"
    if kind not in kinds:
        raise ConfigError(f"{where}.kind must be one of {', '.join(kinds)}, got {show(kind)}")
    keys = {"meta": _META_KEYS, "ensemble": _ENSEMBLE_KEYS}.get(kind, _MODEL_KEYS)
    m = check_mapping(value, where, keys)
    if "name" not in m:
        raise ConfigError(f"{where}.name is required")
    name = _name(m["name"], f"{where}.name")
    if kind != "model":
        return _parse_meta(m, where, name, ModelKind(kind))
    platform = _name(m.get("platform", DEFAULT_PLATFORM), f"{where}.platform")
    inputs = _parse_tensors(m, "inputs", where)
    outputs = _parse_tensors(m, "outputs", where)
    max_batch_size = _int(m, "max_batch_size", where, 0)
    batch_input, batch_axis = _parse_batch(m, where, inputs, max_batch_size)
    compute = _parse_compute(m, where)
    spec = ModelSpec(
        name=name,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch_size,
        batch_input=batch_input,
        batch_axis=batch_axis,
        launch_seconds=_ms(m, "launch_ms", where, DEFAULT_LAUNCH_MS),
        item_seconds=_ms(m, "item_ms", where, DEFAULT_ITEM_MS),
        weight_bytes=_int(m, "weight_bytes", where, 0),
        compute=compute,
        platform=platform,
        load_seconds=_ms(m, "load_ms", where, 0.0) if "load_ms" in m else None,
        sequence=_parse_sequence(m, where),
        decoupled=_bool(m, "decoupled", where),
        max_queue_delay_seconds=_int(m, "max_queue_delay_microseconds", where, 0) / 1e6,
        preferred_batch_size=_preferred(m, where, max_batch_size),
    )
    check_compute(spec, where)
    return spec


def _preferred(m: Mapping[Hashable, Any], where: str, max_batch_size: int) -> tuple[int, ...]:
    """`preferred_batch_size`: batch sizes in 1..max_batch_size, as Triton requires."""
    value = m.get("preferred_batch_size", [])
    key = f"{where}.preferred_batch_size"
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be a list of batch sizes, got {show(value)}")
    for size in value:
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= max_batch_size:
            raise ConfigError(
                f"{key} entries must be integers in 1..max_batch_size ({max_batch_size}), "
                f"got {show(size)}"
            )
    if value and not m.get("max_queue_delay_microseconds"):
        raise ConfigError(f"{key} needs max_queue_delay_microseconds > 0 (else nothing waits)")
    return tuple(sorted(set(value)))
