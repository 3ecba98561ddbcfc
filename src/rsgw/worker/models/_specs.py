"""The simulated worker's model specs: what one model is, and the catalogue of them.

Pure: no I/O, no logging. `_catalogue.py` builds these from YAML and checks every
key; the classes here hold the result and answer the questions the worker asks
of it (which names a client may call, which sub-models a meta runs).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rsgw.base._errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

# What ModelMetadata reports as the platform of a simulated model.
DEFAULT_PLATFORM = "rsgw_sim"
#: Triton's control inputs of a stateful model, which the server, not the client, sets.
SEQUENCE_CONTROLS = ("START", "END", "READY", "CORRID")
#: Triton's default `max_sequence_idle_microseconds`: one second.
DEFAULT_SEQUENCE_IDLE_SECONDS = 1.0
#: The implicit state tensor of a stateful model: its value after the previous request
#: goes in under this name, and a compute that keeps state returns it under it.
SEQUENCE_STATE = "__sequence_state__"


class ModelKind(enum.Enum):
    """What a catalogue entry is."""

    MODEL = "model"  # runs on the device: batches, costs time, holds weights
    META = "meta"  # a pipeline: one request through each sub-model in turn
    # A meta whose steps stay models clients may call too (Triton's ensemble).
    ENSEMBLE = "ensemble"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One declared input or output of a model."""

    name: str
    # A KServe V2 datatype: BOOL, UINT8 ... UINT64, INT8 ... INT64, FP16, FP32, FP64, BYTES.
    datatype: str
    # The WIRE (row-major) shape; -1 accepts any size.
    shape: tuple[int, ...]
    # An image input's layout as Triton's ModelConfig states it: "NCHW", "NHWC" or "".
    format: str = ""
    # An output's label file (Triton's label_filename): class names, one per line,
    # which classification results carry; "" for none.
    labels: str = ""


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """A stateful model's sequence batching (Triton's `sequence_batching`).

    `controls` are the control inputs the model receives, as Triton names them:
    START, END and READY as INT32 0/1, CORRID as `corrid_datatype` (UINT64, or
    BYTES for string correlation ids). A sequence idle for `idle_seconds` is
    released.
    """

    controls: tuple[str, ...]
    corrid_datatype: str = "UINT64"
    idle_seconds: float = DEFAULT_SEQUENCE_IDLE_SECONDS


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One simulated model: its tensors, how it batches, what it costs and computes.

    Built by `parse_catalogue`, which checks every invariant below and reports
    the YAML key path when one fails. The constructor itself does not re-check,
    so a spec built by hand (in a test) is taken as given.
    """

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # 0 = the worker never coalesces this model (one request per dispatch).
    max_batch_size: int
    # The input carrying the batch axis; "" = none.
    batch_input: str
    # 1-based index into `batch_input`'s WIRE shape, always at a -1 dim; 0 = none.
    batch_axis: int
    # The fixed cost of one dispatch, in seconds before --time-scale.
    launch_seconds: float
    # The cost added per batch row, in seconds before --time-scale.
    item_seconds: float
    weight_bytes: int
    # One of COMPUTE_KINDS.
    compute: str
    platform: str = DEFAULT_PLATFORM
    version: str = "1"
    kind: ModelKind = ModelKind.MODEL
    # A meta's sub-models, in the order a request runs through them.
    submodels: tuple[str, ...] = ()
    # Seconds (before --time-scale) to load the weights onto the device; None =
    # weight_bytes over the worker's --load-bandwidth.
    load_seconds: float | None = None
    # A stateful model: its requests belong to sequences (Triton's sequence batcher).
    sequence: SequenceSpec | None = None
    # Decoupled (Triton's model_transaction_policy): zero or many responses per
    # request, so only ModelStreamInfer can call it.
    decoupled: bool = False
    # Triton's dynamic batcher: how long (seconds, before --time-scale) the oldest
    # request may wait for its batch to fill; 0 = dispatch at once (eager).
    max_queue_delay_seconds: float = 0.0
    # Batch sizes worth dispatching at once, without waiting out the delay.
    preferred_batch_size: tuple[int, ...] = ()

    @property
    def is_meta(self) -> bool:
        """A pipeline over sub-models (a meta or an ensemble)."""
        return self.kind is not ModelKind.MODEL

    def input(self, name: str) -> TensorSpec | None:
        """The declared input called `name`, or None."""
        for spec in self.inputs:
            if spec.name == name:
                return spec
        return None

    def output(self, name: str) -> TensorSpec | None:
        """The declared output called `name`, or None."""
        for spec in self.outputs:
            if spec.name == name:
                return spec
        return None

    def execution_seconds(self, rows: int) -> float:
        """The unscaled time one dispatch of `rows` batch rows takes on the simulated device.

        The cost model the worker runs and `rsgw simulate` replays, both from here.
        """
        return self.launch_seconds + self.item_seconds * rows

    def weight_load_seconds(self, nbytes: int, bandwidth: float) -> float:
        """The unscaled time loading `nbytes` of this model's weights takes: its catalogue
        `load_ms`, else the bytes over the worker's load bandwidth (bytes/s)."""
        return nbytes / bandwidth if self.load_seconds is None else self.load_seconds


@dataclass(frozen=True, slots=True)
class Catalogue:
    """Every model a simulated worker serves, sorted by name.

    `models` holds every entry, metas and their internal sub-models included;
    `routable` only what clients may name (RepositoryIndex, ModelMetadata,
    ModelInfer, ModelControlStatus). An ensemble's steps stay routable.

    Raises:
        ConfigError: two entries share a name, or a meta lists something that
            is not a `kind: model` entry of this catalogue.
    """

    models: tuple[ModelSpec, ...]
    #: The label files outputs name (`TensorSpec.labels`), read: file -> class names.
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    _by_name: Mapping[str, ModelSpec] = field(init=False, repr=False, compare=False)
    _internal: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Sorted here, not trusted from the caller: RepositoryIndex lists models
        # in name order and relies on this tuple for it.
        models = tuple(sorted(self.models, key=lambda m: m.name))
        by_name = {m.name: m for m in models}
        if len(by_name) != len(models):
            # Sorted, so a duplicate sits right after its twin.
            dup = next(a.name for a, b in itertools.pairwise(models) if a.name == b.name)
            raise ConfigError(f"duplicate model name {dup!r} in the catalogue")
        internal: set[str] = set()
        for meta in models:
            if not meta.is_meta:
                continue
            if not meta.submodels:
                raise ConfigError(f"meta model {meta.name!r} lists no submodels")
            for sub in meta.submodels:
                target = by_name.get(sub)
                if target is None or target.is_meta:
                    what = "unknown" if target is None else "a meta"
                    raise ConfigError(
                        f"meta model {meta.name!r} lists {what} sub-model {sub!r}; "
                        "submodels must be kind: model entries"
                    )
                if meta.kind is ModelKind.META:
                    internal.add(sub)
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_internal", frozenset(internal))

    def get(self, name: str) -> ModelSpec | None:
        """The entry called `name` (internal sub-models included), or None."""
        return self._by_name.get(name)

    def route(self, name: str) -> ModelSpec | None:
        """The entry a client may call `name`: None for unknown and internal names."""
        if name in self._internal:
            return None
        return self._by_name.get(name)

    @property
    def routable(self) -> tuple[ModelSpec, ...]:
        """What clients see: every model that no meta lists, and the metas, by name."""
        return tuple(m for m in self.models if m.name not in self._internal)

    def is_internal(self, name: str) -> bool:
        return name in self._internal

    def submodels(self, spec: ModelSpec) -> tuple[ModelSpec, ...]:
        """A meta's sub-models in run order; a regular model is its own only one."""
        if not spec.is_meta:
            return (spec,)
        return tuple(self._by_name[s] for s in spec.submodels)
