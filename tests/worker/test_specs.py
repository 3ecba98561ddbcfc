"""Metas, load_ms and the GPU-shaped built-in models in the catalogue
(rsgw.worker.models._specs)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from rsgw.base._errors import ConfigError
from rsgw.worker.models._catalogue import builtin_catalogue, parse_catalogue
from rsgw.worker.models._specs import Catalogue, ModelKind, TensorSpec


def model(name: str, **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
        "max_batch_size": 8,
        "weight_bytes": 1000,
    }
    entry.update(overrides)
    return entry


def meta(name: str, *subs: str, **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "kind": "meta",
        "submodels": list(subs),
        "inputs": [{"name": "q", "datatype": "INT64", "shape": [-1, 8]}],
        "outputs": [{"name": "out", "datatype": "FP32", "shape": [-1, 3]}],
    }
    entry.update(overrides)
    return entry


def parse(*models: dict[str, Any]) -> Catalogue:
    return parse_catalogue({"models": list(models)}, source="test.yaml")


def test_a_meta_hides_its_submodels() -> None:
    catalogue = parse(model("enc"), model("score"), model("free"), meta("pipe", "enc", "score"))
    assert [m.name for m in catalogue.models] == ["enc", "free", "pipe", "score"]
    assert [m.name for m in catalogue.routable] == ["free", "pipe"]
    pipe = catalogue.route("pipe")
    assert pipe is not None and pipe.is_meta and pipe.kind is ModelKind.META
    assert catalogue.route("enc") is None
    assert catalogue.get("enc") is not None  # the device still runs it
    assert catalogue.is_internal("enc") and not catalogue.is_internal("pipe")
    assert [s.name for s in catalogue.submodels(pipe)] == ["enc", "score"]
    free = catalogue.route("free")
    assert free is not None and catalogue.submodels(free) == (free,)


def test_a_meta_has_no_batching_of_its_own() -> None:
    pipe = parse(model("enc"), meta("pipe", "enc")).route("pipe")
    assert pipe is not None
    assert (pipe.max_batch_size, pipe.weight_bytes, pipe.launch_seconds) == (0, 0, 0.0)
    # Its batch input only sizes its sub-calls and synthetic outputs.
    assert (pipe.batch_input, pipe.batch_axis) == ("q", 1)
    assert pipe.inputs == (TensorSpec("q", "INT64", (-1, 8)),)
    assert pipe.compute == "synthetic"


def test_load_ms_overrides_the_bandwidth() -> None:
    catalogue = parse(model("a", load_ms=250), model("b"))
    a, b = catalogue.get("a"), catalogue.get("b")
    assert a is not None and a.load_seconds == pytest.approx(0.25)
    assert b is not None and b.load_seconds is None


@pytest.mark.parametrize(
    ("models", "needles"),
    [
        ((model("a"), meta("p", "nope")), ("models[1].submodels[0]", "'nope'")),
        (
            (model("a"), meta("p", "a"), meta("q", "p")),
            ("models[2].submodels[0]", "meta 'p'", "do not nest"),
        ),
        ((model("a"), meta("p")), ("models[1].submodels", "at least one", "[]")),
        ((model("a"), meta("p", "a", "a")), ("models[1].submodels[1]", "'a' twice")),
        ((meta("p", "a", submodels="a"),), ("models[0].submodels must be a list",)),
        ((model("a"), meta("p", "a", max_batch_size=4)), ("models[1]", "'max_batch_size'")),
        ((model("a"), meta("p", "a", weight_bytes=4)), ("models[1]", "'weight_bytes'")),
        ((model("a", load_ms=-1),), ("models[0].load_ms", "got -1")),
        ((model("a"), {**meta("p", "a"), "submodels": None}), ("models[1].submodels",)),
    ],
)
def test_meta_errors(models: tuple[dict[str, Any], ...], needles: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        parse(*models)
    message = str(info.value)
    assert message.startswith("test.yaml: ")
    for needle in needles:
        assert needle in message


def test_the_catalogue_constructor_checks_metas_too() -> None:
    a = parse(model("a")).models[0]
    pipe = parse(model("a"), meta("pipe", "a")).models[1]
    assert Catalogue((a, pipe)).route("a") is None
    with pytest.raises(ConfigError, match="unknown sub-model 'a'"):
        Catalogue((pipe,))


@pytest.mark.parametrize(
    ("name", "batch_input", "axis", "first_input_axis"),
    [
        ("image_classifier", "IMAGE", 4, 4),  # the batch axis last in wire order
        ("text_encoder", "input_ids", 1, 1),  # first
        ("reranker", "passages", 1, None),  # the first input has none
    ],
)
def test_builtin_gpu_shaped_models(
    name: str, batch_input: str, axis: int, first_input_axis: int | None
) -> None:
    spec = builtin_catalogue().route(name)
    assert spec is not None
    assert (spec.batch_input, spec.batch_axis) == (batch_input, axis)
    batched = spec.input(batch_input)
    assert batched is not None and batched.shape[axis - 1] == -1
    first = spec.inputs[0]
    assert (-1 in first.shape) == (first_input_axis is not None)
    assert spec.max_batch_size > 1
    assert 1e-3 <= spec.launch_seconds <= 10e-3  # a few ms
    assert 10 << 20 <= spec.weight_bytes <= 1 << 30  # tens to hundreds of MiB


def test_builtin_meta() -> None:
    catalogue = builtin_catalogue()
    pipe = catalogue.route("search_pipeline")
    assert pipe is not None and pipe.is_meta
    subs = catalogue.submodels(pipe)
    assert [s.name for s in subs] == ["search_embedder", "search_scorer"]
    for sub in subs:
        assert catalogue.route(sub.name) is None
        assert sub.weight_bytes > 0 and sub.max_batch_size > 0
    # Different footprints and costs, so the weight cache and the schedulers have
    # something to tell apart.
    sizes = {m.weight_bytes for m in catalogue.models if not m.is_meta}
    launches = {m.launch_seconds for m in catalogue.models if not m.is_meta}
    assert len(sizes) >= 5 and len(launches) >= 4


def test_the_docs_example_has_a_meta_and_load_ms() -> None:
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs" / "models.md"
    block = docs.read_text(encoding="utf-8").split("```yaml\n", 1)[1].split("```", 1)[0]
    catalogue = parse_catalogue(yaml.safe_load(block), source="docs/models.md")
    metas = [m for m in catalogue.models if m.is_meta]
    assert [m.name for m in metas] == ["search"]
    assert all(catalogue.route(s) is None for s in metas[0].submodels)
    assert any(m.load_seconds is not None for m in catalogue.models)
