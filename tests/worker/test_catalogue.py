"""Tests for the simulated worker's model catalogue (rsgw.worker.models._catalogue and _entries)."""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._errors import ConfigError
from rsgw.worker.models._catalogue import (
    builtin_catalogue,
    load_catalogue,
    named_catalogue,
    parse_catalogue,
)
from rsgw.worker.models._specs import Catalogue, ModelSpec, TensorSpec
from tests.helpers import simple_model
from tests.worker.client import cli_worker_config

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "models.md"


def parse_one(model: dict[str, Any]) -> ModelSpec:
    catalogue = parse_catalogue({"models": [model]}, source="test.yaml")
    (spec,) = catalogue.models
    return spec


# -- the built-in catalogue -----------------------------------------------------------------


def test_builtin_catalogue_has_the_triton_examples() -> None:
    catalogue = builtin_catalogue()
    names = [m.name for m in catalogue.routable]
    for name in ("simple", "simple_identity", "simple_int8", "simple_string"):
        assert name in names
    assert names == sorted(names)
    assert builtin_catalogue() is catalogue


@pytest.mark.parametrize(
    ("name", "datatype", "compute"),
    [
        ("simple", "INT32", "add_sub"),
        ("simple_int8", "INT8", "add_sub"),
        ("simple_string", "BYTES", "add_sub_string"),
    ],
)
def test_builtin_add_sub_models(name: str, datatype: str, compute: str) -> None:
    spec = builtin_catalogue().get(name)
    assert spec is not None
    shape = (-1, 16)
    assert spec.inputs == (
        TensorSpec("INPUT0", datatype, shape),
        TensorSpec("INPUT1", datatype, shape),
    )
    assert spec.outputs == (
        TensorSpec("OUTPUT0", datatype, shape),
        TensorSpec("OUTPUT1", datatype, shape),
    )
    assert (spec.max_batch_size, spec.batch_input, spec.batch_axis) == (8, "INPUT0", 1)
    assert spec.compute == compute
    assert spec.launch_seconds == pytest.approx(0.001)
    assert spec.item_seconds == pytest.approx(0.00005)
    assert 0 < spec.weight_bytes <= 16 << 20
    assert (spec.platform, spec.version) == ("rsgw_sim", "1")


def test_builtin_identity_model() -> None:
    spec = builtin_catalogue().get("simple_identity")
    assert spec is not None
    assert spec.inputs == (TensorSpec("INPUT0", "BYTES", (-1, -1)),)
    assert spec.outputs == (TensorSpec("OUTPUT0", "BYTES", (-1, -1)),)
    assert (spec.max_batch_size, spec.batch_input, spec.batch_axis) == (8, "INPUT0", 1)
    assert spec.compute == "identity"


def test_docs_example_parses() -> None:
    """The full example in docs/models.md is a valid catalogue."""
    text = DOCS.read_text(encoding="utf-8")
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    catalogue = parse_catalogue(yaml.safe_load(block), source="docs/models.md")
    assert len(catalogue.models) >= 4


# -- defaults and derived values ------------------------------------------------------------


def test_defaults() -> None:
    spec = parse_one(
        {
            "name": "m",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [3]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [3]}],
        }
    )
    assert spec == ModelSpec(
        name="m",
        inputs=(TensorSpec("x", "FP32", (3,)),),
        outputs=(TensorSpec("y", "FP32", (3,)),),
        max_batch_size=0,
        batch_input="",
        batch_axis=0,
        launch_seconds=0.001,
        item_seconds=0.0001,
        weight_bytes=0,
        compute="synthetic",
        platform="rsgw_sim",
        version="1",
    )


def test_batch_axis_defaults_to_first_dynamic_dim_of_first_dynamic_input() -> None:
    spec = parse_one(
        {
            "name": "cross",
            "inputs": [
                {"name": "query", "datatype": "INT64", "shape": [32]},
                {"name": "docs", "datatype": "INT64", "shape": [32, -1, -1]},
            ],
            "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1]}],
            "max_batch_size": 4,
        }
    )
    assert (spec.batch_input, spec.batch_axis) == ("docs", 2)


def test_batch_axis_defaults_for_named_input_and_explicit_axis() -> None:
    model = {
        "name": "image",
        "inputs": [{"name": "pixels", "datatype": "FP16", "shape": [3, 224, 224, -1]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [1000, -1]}],
        "max_batch_size": 32,
        "batch_input": "pixels",
    }
    assert parse_one(model).batch_axis == 4
    assert parse_one({**model, "batch_axis": 4}).batch_axis == 4


def test_unbatched_model_has_no_default_batch_axis_but_may_declare_one() -> None:
    spec = parse_one(simple_model(max_batch_size=0))
    assert (spec.batch_input, spec.batch_axis) == ("", 0)
    spec = parse_one(simple_model(max_batch_size=0, batch_input="INPUT1"))
    assert (spec.batch_input, spec.batch_axis) == ("INPUT1", 1)


def test_empty_batch_input_means_none_even_when_batched() -> None:
    spec = parse_one(simple_model(batch_input=""))
    assert (spec.max_batch_size, spec.batch_input, spec.batch_axis) == (8, "", 0)


def test_batched_model_without_dynamic_dim_has_no_batch_axis() -> None:
    spec = parse_one(
        {
            "name": "fixed",
            "inputs": [{"name": "x", "datatype": "UINT8", "shape": [4]}],
            "outputs": [{"name": "y", "datatype": "UINT8", "shape": [4]}],
            "max_batch_size": 2,
        }
    )
    assert (spec.batch_input, spec.batch_axis) == ("", 0)


def test_costs_and_execution_seconds() -> None:
    spec = parse_one(simple_model(launch_ms=2, item_ms=0.5, weight_bytes=123, platform="x"))
    assert spec.launch_seconds == pytest.approx(0.002)
    assert spec.item_seconds == pytest.approx(0.0005)
    assert spec.execution_seconds(0) == pytest.approx(0.002)
    assert spec.execution_seconds(4) == pytest.approx(0.004)
    assert (spec.weight_bytes, spec.platform) == (123, "x")


def test_input_and_output_lookup() -> None:
    spec = parse_one(simple_model())
    assert spec.input("INPUT1") == TensorSpec("INPUT1", "INT32", (-1, 16))
    assert spec.input("OUTPUT0") is None
    assert spec.output("OUTPUT0") == TensorSpec("OUTPUT0", "INT32", (-1, 16))
    assert spec.output("INPUT0") is None


def test_kind_model_is_accepted() -> None:
    assert parse_one(simple_model(kind="model")).name == "simple"


def test_catalogue_is_sorted_and_indexed() -> None:
    catalogue = parse_catalogue(
        {"models": [simple_model(name="b"), simple_model(name="a"), simple_model(name="c")]},
        source="t",
    )
    assert [m.name for m in catalogue.models] == ["a", "b", "c"]
    b = catalogue.get("b")
    assert b is not None
    assert b.name == "b"
    assert catalogue.get("nope") is None
    assert parse_catalogue({"models": []}, source="t").models == ()


def test_catalogue_constructor_rejects_duplicates() -> None:
    spec = parse_one(simple_model())
    with pytest.raises(ConfigError, match="duplicate model name 'simple'"):
        Catalogue((spec, spec))


@given(
    st.lists(st.text(alphabet="abcdefghij_", min_size=1, max_size=6), unique=True, max_size=8),
    st.integers(0, 64),
    st.floats(0, 1000, allow_nan=False),
)
def test_parse_keeps_names_and_numbers(names: list[str], batch: int, launch: float) -> None:
    models = [simple_model(name=n, max_batch_size=batch, launch_ms=launch) for n in names]
    catalogue = parse_catalogue({"models": models}, source="t")
    assert [m.name for m in catalogue.models] == sorted(names)
    for m in catalogue.models:
        assert m.max_batch_size == batch
        assert m.launch_seconds == pytest.approx(launch / 1000)
        assert (m.batch_input, m.batch_axis) == (("INPUT0", 1) if batch else ("", 0))


# -- errors ---------------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], object]


def setter(*path: str | int, value: object) -> Mutation:
    def mutate(model: dict[str, Any]) -> None:
        target: Any = model
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def deleter(*path: str | int) -> Mutation:
    def mutate(model: dict[str, Any]) -> None:
        target: Any = model
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


# (mutation of a valid `simple` model, substrings the message must contain)
MODEL_ERRORS: list[tuple[str, Mutation, tuple[str, ...]]] = [
    (
        "bad datatype",
        setter("inputs", 0, "datatype", value="INT3"),
        (
            "models[0].inputs[0].datatype must be one of BOOL, UINT8, UINT16, UINT32, UINT64, "
            "INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES, got 'INT3'",
        ),
    ),
    ("missing datatype", deleter("outputs", 1, "datatype"), ("models[0].outputs[1].datatype",)),
    ("unknown model key", setter("max_bach_size", value=8), ("models[0]", "'max_bach_size'")),
    ("unknown tensor key", setter("inputs", 1, "dims", value=[1]), ("inputs[1]", "'dims'")),
    ("missing name", deleter("name"), ("models[0].name is required",)),
    ("empty name", setter("name", value=""), ("models[0].name", "got ''")),
    ("int name", setter("name", value=7), ("models[0].name", "got 7")),
    (
        "bad kind",
        setter("kind", value="pipeline"),
        ("models[0].kind", "model, meta, ensemble", "'pipeline'"),
    ),
    ("meta keys", setter("kind", value="meta"), ("models[0]", "'max_batch_size'")),
    ("missing inputs", deleter("inputs"), ("models[0].inputs is required",)),
    ("empty outputs", setter("outputs", value=[]), ("models[0].outputs", "got []")),
    ("inputs not a list", setter("inputs", value={"a": 1}), ("models[0].inputs", "{'a': 1}")),
    ("tensor not a mapping", setter("inputs", 0, value="INPUT0"), ("inputs[0]", "'INPUT0'")),
    ("tensor name missing", deleter("inputs", 0, "name"), ("models[0].inputs[0].name",)),
    ("shape missing", deleter("inputs", 0, "shape"), ("models[0].inputs[0].shape is required",)),
    ("shape not a list", setter("inputs", 0, "shape", value=16), ("inputs[0].shape", "got 16")),
    ("zero dim", setter("inputs", 0, "shape", value=[-1, 0]), ("inputs[0].shape[1]", "got 0")),
    ("-2 dim", setter("inputs", 0, "shape", value=[-2, 16]), ("inputs[0].shape[0]", "got -2")),
    ("bool dim", setter("inputs", 0, "shape", value=[True]), ("inputs[0].shape[0]", "got True")),
    ("duplicate input", setter("inputs", 1, "name", value="INPUT0"), ("inputs[1].name", "INPUT0")),
    (
        "duplicate output",
        setter("outputs", 1, "name", value="OUTPUT0"),
        ("outputs[1].name", "'OUTPUT0'"),
    ),
    ("negative batch", setter("max_batch_size", value=-1), ("models[0].max_batch_size", "-1")),
    ("bool batch", setter("max_batch_size", value=True), ("models[0].max_batch_size", "True")),
    ("float batch", setter("max_batch_size", value=2.5), ("models[0].max_batch_size", "2.5")),
    ("negative launch", setter("launch_ms", value=-1), ("models[0].launch_ms", "-1")),
    ("nan item", setter("item_ms", value=float("nan")), ("models[0].item_ms", "nan")),
    ("string item", setter("item_ms", value="1ms"), ("models[0].item_ms", "'1ms'")),
    ("negative weight", setter("weight_bytes", value=-5), ("models[0].weight_bytes", "-5")),
    ("unknown compute", setter("compute", value="matmul"), ("models[0].compute", "'matmul'")),
    ("empty platform", setter("platform", value=""), ("models[0].platform", "''")),
    (
        "batch_input not an input",
        setter("batch_input", value="OUTPUT0"),
        ("models[0].batch_input", "INPUT0, INPUT1", "'OUTPUT0'"),
    ),
    ("batch_input not a string", setter("batch_input", value=1), ("models[0].batch_input", "1")),
    ("axis without input", setter("batch_axis", value=1), ("models[0].batch_axis", "got 1")),
    (
        "axis out of range",
        lambda m: m.update(batch_input="INPUT0", batch_axis=3),
        ("models[0].batch_axis", "between 1 and 2", "got 3"),
    ),
    (
        "axis zero with input",
        lambda m: m.update(batch_input="INPUT0", batch_axis=0),
        ("models[0].batch_axis", "got 0"),
    ),
    (
        "axis on a fixed dim",
        lambda m: m.update(batch_input="INPUT0", batch_axis=2),
        ("models[0].batch_axis 2", "'INPUT0'", "got dim 16"),
    ),
    (
        "axis with empty input",
        lambda m: m.update(batch_input="", batch_axis=1),
        ("models[0].batch_axis", "got 1"),
    ),
    (
        "batch input without dynamic dim",
        lambda m: (
            m["inputs"][1].update(shape=[4, 16]),
            m["inputs"][0].update(shape=[4, 16]),
            m["outputs"][0].update(shape=[4, 16]),
            m["outputs"][1].update(shape=[4, 16]),
            m.update(batch_input="INPUT1"),
        ),
        ("models[0].batch_input 'INPUT1'", "no -1 dim", "[4,16]"),
    ),
    (
        "add_sub with three inputs",
        lambda m: m["inputs"].append({"name": "INPUT2", "datatype": "INT32", "shape": [-1, 16]}),
        ("models[0].inputs", "'add_sub'", "exactly 2 inputs", "got 3"),
    ),
    (
        "add_sub with one output",
        lambda m: m["outputs"].pop(),
        ("models[0].outputs", "exactly 2 outputs", "got 1"),
    ),
    (
        "add_sub on BYTES",
        lambda m: [t.update(datatype="BYTES") for t in m["inputs"] + m["outputs"]],
        ("models[0].inputs[0].datatype", "'add_sub'", "got 'BYTES'"),
    ),
    (
        "add_sub on FP16",
        lambda m: [t.update(datatype="FP16") for t in m["inputs"] + m["outputs"]],
        ("models[0].inputs[0].datatype", "got 'FP16'"),
    ),
    (
        "add_sub mixed datatypes",
        setter("inputs", 1, "datatype", value="INT64"),
        ("models[0].inputs[1].datatype must be INT32", "got 'INT64'"),
    ),
    (
        "add_sub output datatype",
        setter("outputs", 0, "datatype", value="FP32"),
        ("models[0].outputs[0].datatype must be INT32", "got 'FP32'"),
    ),
    (
        "add_sub mixed shapes",
        setter("inputs", 1, "shape", value=[-1, 8]),
        ("models[0].inputs[1].shape must be [-1,16]", "got [-1,8]"),
    ),
    (
        "add_sub_string on INT32",
        setter("compute", value="add_sub_string"),
        ("models[0].inputs[0].datatype must be one of BYTES", "'add_sub_string'", "got 'INT32'"),
    ),
    (
        "identity with two inputs and one output",
        lambda m: (m.update(compute="identity"), m["outputs"].pop()),
        ("models[0].outputs", "'identity'", "(2), got 1"),
    ),
    (
        "identity datatype mismatch",
        lambda m: (m.update(compute="identity"), m["outputs"][1].update(datatype="INT64")),
        ("models[0].outputs[1] must be INT32 [-1,16]", "got INT64 [-1,16]"),
    ),
]


@pytest.mark.parametrize(
    ("mutate", "needles"), [(m, n) for _, m, n in MODEL_ERRORS], ids=[i for i, _, _ in MODEL_ERRORS]
)
def test_model_errors(mutate: Mutation, needles: tuple[str, ...]) -> None:
    model = copy.deepcopy(simple_model())
    mutate(model)
    with pytest.raises(ConfigError) as info:
        parse_catalogue({"models": [model]}, source="cat.yaml")
    message = str(info.value)
    assert message.startswith("cat.yaml: ")
    assert "\n" not in message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        (None, ("the catalogue must be a mapping", "got None")),
        ([], ("the catalogue must be a mapping", "got []")),
        ({}, ("'models' list",)),
        ({"models": None}, ("models must be a list", "got None")),
        ({"models": [], "model": []}, ("unknown key 'model'",)),
        ({"models": ["simple"]}, ("models[0] must be a mapping", "got 'simple'")),
        (
            {"models": [simple_model(), simple_model(name="x"), simple_model()]},
            ("models[2].name", "'simple'"),
        ),
    ],
)
def test_catalogue_errors(data: object, needles: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_catalogue(data, source="cat.yaml")
    message = str(info.value)
    assert message.startswith("cat.yaml: ")
    for needle in needles:
        assert needle in message


def test_long_bad_values_are_cut_short() -> None:
    model = simple_model(compute="x" * 500)
    with pytest.raises(ConfigError) as info:
        parse_catalogue({"models": [model]}, source="t")
    assert "'xxxx" in str(info.value)
    assert "x" * 100 not in str(info.value)  # the bad value is cut, however long


# -- files ----------------------------------------------------------------------------------


def test_load_catalogue_reads_yaml(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [simple_model()]}), encoding="utf-8")
    catalogue = load_catalogue(path)
    assert catalogue == parse_catalogue({"models": [simple_model()]}, source="other")
    assert load_catalogue(str(path)) == catalogue


def test_load_catalogue_missing_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_catalogue(path)
    message = str(info.value)
    assert str(path) in message
    assert "No such file" in message
    assert "\n" not in message


def test_load_catalogue_bad_yaml_is_one_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models:\n  - name: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_catalogue(path)
    message = str(info.value)
    assert message.startswith(f"{path}: invalid YAML at line ")
    assert "\n" not in message


def test_load_catalogue_rejects_duplicate_keys(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("models:\n  - name: a\n    name: b\n    inputs: []\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_catalogue(path)
    message = str(info.value)
    assert str(path) in message
    assert "duplicate key 'name'" in message
    assert "line 3" in message


def test_load_catalogue_errors_name_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("models:\n  - name: m\n    inputs: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"m\.yaml: models\[0\]\.inputs must be a list, got 3"):
        load_catalogue(path)


def test_load_catalogue_not_utf8(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"models: []\n# \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_catalogue(path)


# -- built-in catalogues by name ------------------------------------------------------------


def test_triton_l0_http_is_the_repository_of_tritons_rest_ci() -> None:
    catalogue = named_catalogue("triton-l0-http")
    assert [m.name for m in catalogue.routable] == [
        "densenet_onnx",
        "simple",
        "simple_dyna_sequence",
        "simple_identity",
        "simple_sequence",
        "simple_string",
        "simple_string_dyna_sequence",
    ]


def test_triton_docs_is_tritons_example_repository() -> None:
    catalogue = named_catalogue("triton-docs")
    assert [m.name for m in catalogue.routable] == [
        "densenet_onnx",
        "inception_onnx",
        "simple",
        "simple_dyna_sequence",
        "simple_identity",
        "simple_int8",
        "simple_sequence",
        "simple_string",
    ]
    assert catalogue.labels["densenet_labels.txt"][0] == "TENCH"
    assert named_catalogue("builtin") is builtin_catalogue()
    with pytest.raises(ConfigError, match="cannot read model catalogue no-such-set"):
        named_catalogue("no-such-set")


def test_the_worker_cli_takes_a_catalogue_name() -> None:
    config = cli_worker_config("--models", "triton-docs")
    assert len(config.catalogue.routable) == 8
