"""The simulated worker's model catalogue: the `models:` document, and where one comes from.

Pure: no trio, no sockets, no logging. `load_catalogue` and `builtin_catalogue`
read one file each, at start-up, the way `load_config` does.

A catalogue is a YAML mapping with a `models:` list (docs/models.md documents
every key). An entry is a `kind: model` (tensors, batching, cost, weights) or a
`kind: meta`: a pipeline over `submodels` (each a `kind: model` entry) with its
own client-facing tensors. A model listed by a meta is *internal*: clients
never see it, only the meta that runs it (the classes live in `_specs.py`).

We parse it into frozen dataclasses once: `_entries.py` parses and checks each
entry, and this module the list as a whole (unique names, metas over `kind: model`
entries, the label files outputs name). Every `ConfigError` names the source, the
key path and the bad value, for example
`models.yaml: models[2].inputs[0].datatype must be one of BOOL, ..., got 'INT3'`.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
from collections.abc import Callable

from rsgw.base._errors import ConfigError
from rsgw.base._values import parse_yaml
from rsgw.worker.models._entries import check_list, check_mapping, parse_model
from rsgw.worker.models._specs import Catalogue, ModelKind, ModelSpec

BUILTIN_CATALOGUE_FILE = "builtin_models.yaml"
#: Catalogues `--models` (and a node file's `model_repo`) name instead of a file: the
#: built-in catalogue whole, or a selection of it. `triton-docs` is the repository of
#: Triton's docs/examples (eight models), which some of Triton's example clients
#: count (simple_grpc_model_control.py expects exactly eight); `triton-l0-http` the one
#: Triton's HTTP examples are run against (simple_http_model_control.py expects seven).
BUILTIN_SETS: dict[str, tuple[str, ...] | None] = {
    "builtin": None,
    "triton-docs": (
        "densenet_onnx",
        "inception_onnx",
        "simple",
        "simple_dyna_sequence",
        "simple_identity",
        "simple_int8",
        "simple_sequence",
        "simple_string",
    ),
    # The repository Triton's REST CI (qa/L0_http) serves its HTTP examples from
    # (seven models: simple_http_model_control.py counts them).
    "triton-l0-http": (
        "densenet_onnx",
        "simple",
        "simple_dyna_sequence",
        "simple_identity",
        "simple_sequence",
        "simple_string",
        "simple_string_dyna_sequence",
    ),
}

_CATALOGUE_KEYS = ("models",)


def _check_metas(models: list[ModelSpec]) -> None:
    """Every meta's sub-models are `kind: model` entries (errors with key paths)."""
    kinds = {spec.name: spec.kind for spec in models}
    for i, spec in enumerate(models):
        for j, sub in enumerate(spec.submodels):
            kind = kinds.get(sub)
            if kind is None:
                raise ConfigError(
                    f"models[{i}].submodels[{j}] must name a model of the catalogue, got {sub!r}"
                )
            if kind is not ModelKind.MODEL:
                raise ConfigError(
                    f"models[{i}].submodels[{j}] must name a kind: model entry, "
                    f"got {kind.value} {sub!r} (metas do not nest)"
                )


def parse_catalogue(
    data: object, *, source: str, read_labels: Callable[[str], str] | None = None
) -> Catalogue:
    """Build a `Catalogue` from parsed YAML (or any equivalent plain data).

    Args:
        data: a mapping with a `models` list, as `yaml.safe_load` returns it.
        source: where `data` came from (a file name), put at the start of errors.

    Raises:
        ConfigError: anything invalid; the message names the source, the key
            path and the bad value.
    """
    try:
        m = check_mapping(data, "the catalogue", _CATALOGUE_KEYS)
        if "models" not in m:
            raise ConfigError("the catalogue must have a 'models' list")
        items = check_list(m["models"], "models")
        models: list[ModelSpec] = []
        for i, item in enumerate(items):
            spec = parse_model(item, f"models[{i}]")
            if any(s.name == spec.name for s in models):
                raise ConfigError(f"models[{i}].name duplicates an earlier model: {spec.name!r}")
            models.append(spec)
        _check_metas(models)
        return Catalogue(tuple(models), _labels(models, read_labels))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _labels(
    models: list[ModelSpec], read: Callable[[str], str] | None
) -> dict[str, tuple[str, ...]]:
    """Every label file an output names, read (one class name per line)."""
    labels: dict[str, tuple[str, ...]] = {}
    for i, spec in enumerate(models):
        for j, tensor in enumerate(spec.outputs):
            name = tensor.labels
            if not name or name in labels:
                continue
            where = f"models[{i}].outputs[{j}].labels"
            if read is None:
                raise ConfigError(f"{where}: {name!r} cannot be read here (no label files)")
            try:
                text = read(name)
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{where}: cannot read label file {name!r}: {exc}") from None
            labels[name] = tuple(text.splitlines())
    return labels


def load_catalogue(path: str | os.PathLike[str]) -> Catalogue:
    """Read and parse a catalogue YAML file (the `--models FILE` of `rsgw worker`).

    Raises:
        ConfigError: the file cannot be read, is not YAML, or is not a valid
            catalogue; always one line naming the file.
    """
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read model catalogue {source}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc.reason})") from None
    folder = os.path.dirname(os.path.abspath(source))

    def read_labels(name: str) -> str:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            return f.read()

    return parse_catalogue(parse_yaml(text, source), source=source, read_labels=read_labels)


@functools.cache
def builtin_catalogue() -> Catalogue:
    """The catalogue shipped in the package: the Triton example models, computed for real.

    Cached: it is immutable and every worker of a node asks for it.
    """
    package = importlib.resources.files("rsgw.worker")
    text = package.joinpath(BUILTIN_CATALOGUE_FILE).read_text(encoding="utf-8")

    def read_labels(name: str) -> str:
        return package.joinpath("labels", name).read_text(encoding="utf-8")

    return parse_catalogue(
        parse_yaml(text, BUILTIN_CATALOGUE_FILE),
        source=BUILTIN_CATALOGUE_FILE,
        read_labels=read_labels,
    )


def named_catalogue(name_or_path: str) -> Catalogue:
    """A built-in catalogue by name (`BUILTIN_SETS`), or the catalogue file at a path.

    Raises:
        ConfigError: as `load_catalogue`, for a path.
    """
    if name_or_path not in BUILTIN_SETS:
        return load_catalogue(name_or_path)
    catalogue = builtin_catalogue()
    selection = BUILTIN_SETS[name_or_path]
    if selection is None:
        return catalogue
    models = tuple(m for m in catalogue.models if m.name in selection)
    return Catalogue(models, catalogue.labels)
