"""Tests for node files (rsgw.node._node): synthesis, validation, the probe target.

The embedded gateway's environment, derived from a node, is in tests/node/test_supervision.py.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw.base._errors import ConfigError
from rsgw.node._node import (
    DEFAULT_NODE_TEMPLATE,
    NodeConfig,
    WorkerSpec,
    default_node,
    load_node,
    parse_node,
)
from rsgw.node._probe import probe_target


def node(visible_gpus: int | None = None, **raw: Any) -> NodeConfig:
    return parse_node(
        {"model_repo": "builtin", **raw}, source="node.yml", visible_gpus=visible_gpus
    )


def fails(raw: dict[str, Any], *fragments: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_node(raw, source="node.yml", visible_gpus=2)
    message = str(info.value)
    assert message.startswith("node.yml: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def ports(n: NodeConfig) -> list[tuple[str, object, int, int | None]]:
    return [(w.name, w.gpu, w.port, w.metrics_port) for w in n.workers]


# -- synthesis -------------------------------------------------------------------------------------


def test_default_node_simulates_four_gpus_when_none_is_visible() -> None:
    for visible in (None, 0):
        n = default_node(visible_gpus=visible)
        assert ports(n) == [
            ("worker0", 0, 8080, 9100),
            ("worker1", 1, 8081, 9101),
            ("worker2", 2, 8082, 9102),
            ("worker3", 3, 8083, 9103),
        ]
        assert n.notes == ("gpus: auto found no visible GPU; simulating 4 GPUs",)
        assert n.model_repo == "builtin"
        assert n.source == "<default node>"


def test_default_template() -> None:
    assert dict(DEFAULT_NODE_TEMPLATE) == {
        "model_repo": "builtin",
        "base_port": 8080,
        "metrics_base_port": 9100,
        "gpus": "auto",
    }


def test_auto_counts_the_visible_gpus() -> None:
    n = node(visible_gpus=2, gpus="AUTO")
    assert [w.name for w in n.workers] == ["worker0", "worker1"]
    assert n.gpus == (0, 1)
    assert n.notes == ()


def test_gpus_argument_overrides_the_file() -> None:
    n = parse_node({"model_repo": "builtin", "gpus": 8}, source="n", gpus=3)
    assert [w.name for w in n.workers] == ["worker0", "worker1", "worker2"]
    assert len(default_node(gpus=1).workers) == 1


def test_base_ports_and_defaults() -> None:
    n = node(gpus=3, base_port=7000, metrics_base_port=7100)
    assert ports(n) == [
        ("worker0", 0, 7000, 7100),
        ("worker1", 1, 7001, 7101),
        ("worker2", 2, 7002, 7102),
    ]
    plain = node(gpus=2)
    assert [(w.port, w.metrics_port) for w in plain.workers] == [(8080, None), (8081, None)]
    assert plain.workers[0].host == "127.0.0.1"
    assert plain.metrics_base_port is None
    assert plain.shared_host_weights is False
    assert dict(plain.models) == {}


def test_gpu_list_names_the_gpus() -> None:
    n = node(gpus=[2, "GPU-5f3c", 0])
    assert ports(n) == [
        ("worker0", 2, 8080, None),
        ("worker1", "GPU-5f3c", 8081, None),
        ("worker2", 0, 8082, None),
    ]


def test_base_port_zero_picks_free_ports_for_every_worker() -> None:
    n = node(gpus=3, base_port=0, metrics_base_port=0)
    assert [(w.port, w.metrics_port) for w in n.workers] == [(0, 0)] * 3


# -- explicit workers ------------------------------------------------------------------------------


def test_explicit_workers() -> None:
    n = node(
        visible_gpus=2,
        base_port=7000,
        metrics_base_port=9000,
        workers=[
            {"name": "a"},
            {"name": "b", "gpu": 1, "host": "0.0.0.0", "port": 7500},
            {"name": "c", "gpu": "GPU-x"},
        ],
    )
    assert ports(n) == [("a", 0, 7000, 9000), ("b", 1, 7500, 9001), ("c", "GPU-x", 7002, 9002)]
    assert n.workers[1].host == "0.0.0.0"
    assert n.workers[1].dial_host == "127.0.0.1"
    assert n.worker("b") is n.workers[1]
    assert n.worker("zz") is None


def test_worker_overrides_deep_merge_over_global() -> None:
    raw: dict[str, Any] = {
        "global": {"scheduler": {"discipline": "fifo", "max_batch": 8}, "cache": {"bytes": 1}},
        "workers": [
            {"name": "a", "scheduler": {"discipline": "edf"}, "cache": None},
            {"name": "b", "extra": [1, 2]},
        ],
    }
    n = node(gpus=1, **raw)
    a, b = n.workers
    assert a.settings == {"scheduler": {"discipline": "edf", "max_batch": 8}, "cache": None}
    assert b.settings == {
        "scheduler": {"discipline": "fifo", "max_batch": 8},
        "cache": {"bytes": 1},
        "extra": (1, 2),
    }
    assert n.global_settings["scheduler"] == {"discipline": "fifo", "max_batch": 8}
    with pytest.raises(TypeError):
        a.settings["scheduler"]["discipline"] = "fair"  # type: ignore[index]  # read-only


@pytest.mark.parametrize(
    ("workers", "fragments"),
    [
        ([], ("workers must be a non-empty list of mappings", "[]")),
        ({"name": "a"}, ("workers must be a non-empty list", "{'name': 'a'}")),
        (["a"], ("workers[0] must be a mapping", "'a'")),
        ([{"gpu": 0}], ("workers[0].name is required",)),
        ([{"name": ""}], ("workers[0].name must be a non-empty name", "''")),
        ([{"name": "a,b"}], ("workers[0].name", "without commas or whitespace", "'a,b'")),
        ([{"name": 7}], ("workers[0].name", "got 7")),
        ([{"name": "a"}, {"name": "a"}], ("workers[1].name duplicates an earlier worker: 'a'",)),
        ([{"name": "a", "gpu": -1}], ("workers[0].gpu must be a GPU ordinal", "got -1")),
        ([{"name": "a", "gpu": True}], ("workers[0].gpu", "got True")),
        ([{"name": "a", "host": ""}], ("workers[0].host must be a non-empty string", "''")),
        ([{"name": "a", "port": "80"}], ("workers[0].port must be a port number", "'80'")),
        ([{"name": "a", "port": 70000}], ("workers[0].port", "got 70000")),
        ([{"name": "a", 5: {}}], ("workers[0] keys must be strings", "got 5")),
    ],
)
def test_invalid_workers(workers: object, fragments: tuple[str, ...]) -> None:
    fails({"model_repo": "builtin", "workers": workers}, *fragments)


# -- ports -----------------------------------------------------------------------------------------


def test_colliding_grpc_ports_are_rejected() -> None:
    message = fails(
        {
            "model_repo": "builtin",
            "workers": [{"name": "a"}, {"name": "b"}, {"name": "c", "port": 8081}],
        },
    )
    assert (
        message
        == "node.yml: port 8081 is used twice: by worker 'b' (gRPC) and by worker 'c' (gRPC)"
    )


def test_grpc_and_metrics_ports_may_not_collide() -> None:
    fails(
        {"model_repo": "builtin", "gpus": 4, "base_port": 9000, "metrics_base_port": 9002},
        "port 9002 is used twice",
        "worker 'worker2' (gRPC)",
        "worker 'worker0' (metrics)",
    )


def test_explicit_port_zero_never_collides() -> None:
    n = node(base_port=0, workers=[{"name": "a", "port": 0}, {"name": "b"}])
    assert [w.port for w in n.workers] == [0, 0]


@pytest.mark.parametrize(
    ("raw", "fragments"),
    [
        ({"base_port": 70000}, ("base_port must be a port number in 0..65535, got 70000",)),
        ({"base_port": -1}, ("base_port", "got -1")),
        ({"base_port": "8080"}, ("base_port", "'8080'")),
        ({"base_port": True}, ("base_port", "True")),
        ({"metrics_base_port": 1.5}, ("metrics_base_port must be a port number", "1.5")),
        ({"base_port": 65535, "gpus": 2}, ("base_port + 1 for worker 'worker1' is 65536",)),
        ({"metrics_base_port": 65535, "gpus": 3}, ("metrics_base_port + 1", "65536")),
    ],
)
def test_invalid_ports(raw: dict[str, Any], fragments: tuple[str, ...]) -> None:
    fails({"model_repo": "builtin", **raw}, *fragments)


# -- gpus ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "fragments"),
    [
        (-1, ("gpus must be 'auto', a GPU count >= 0, or a non-empty list", "got -1")),
        ("some", ("gpus must be 'auto'", "'some'")),
        ([], ("gpus must be", "[]")),
        (True, ("gpus must be", "True")),
        (2.0, ("gpus must be", "2.0")),
        ([0, "x", 0], ("gpus[2] lists GPU 0 a second time",)),
        ([0, None], ("gpus[1] must be a GPU ordinal >= 0 or a GPU UUID string, got None",)),
        (0, ("gpus is 0 and there is no workers: list",)),
    ],
)
def test_invalid_gpus(gpus: object, fragments: tuple[str, ...]) -> None:
    fails({"model_repo": "builtin", "gpus": gpus}, *fragments)


def test_gpus_zero_with_explicit_workers() -> None:
    n = node(gpus=0, workers=[{"name": "a"}, {"name": "b", "gpu": 3}])
    assert [w.gpu for w in n.workers] == [0, 3]
    assert n.gpus == ()


# -- models ----------------------------------------------------------------------------------------


def test_models_map_to_defined_workers() -> None:
    n = node(gpus=3, models={"resnet": ["worker0", "worker2"], "bert": ["worker2"]})
    assert dict(n.models) == {"resnet": ("worker0", "worker2"), "bert": ("worker2",)}
    assert n.models_on("worker2") == ("bert", "resnet")
    assert n.models_on("worker1") == ()


def test_unknown_worker_in_models_is_rejected() -> None:
    message = fails(
        {"model_repo": "builtin", "gpus": 2, "models": {"resnet": ["worker0", "worker7"]}}
    )
    assert message == (
        "node.yml: models.resnet[1]: worker 'worker7' not defined in node "
        "(workers: worker0, worker1)"
    )


@pytest.mark.parametrize(
    ("models", "fragments"),
    [
        (["resnet"], ("models must be a mapping", "['resnet']")),
        ({"resnet": []}, ("models.resnet must be a non-empty list of worker names", "[]")),
        ({"resnet": "worker0"}, ("models.resnet must be a non-empty list", "'worker0'")),
        (
            {"resnet": ["worker0", "worker0"]},
            ("models.resnet[1] lists worker 'worker0' a second time",),
        ),
        ({"resnet": [0]}, ("models.resnet[0]: worker 0 not defined in node",)),
        ({3: ["worker0"]}, ("models keys must be model names", "3")),
    ],
)
def test_invalid_models(models: object, fragments: tuple[str, ...]) -> None:
    fails({"model_repo": "builtin", "gpus": 2, "models": models}, *fragments)


# -- the rest of the file --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "fragments"),
    [
        ({}, ("model_repo is required",)),
        ({"model_repo": ""}, ("model_repo must be a non-empty string", "''")),
        ({"model_repo": ["a"]}, ("model_repo must be a non-empty string", "['a']")),
        ({"model_repo": "builtin", "global": []}, ("global must be a mapping", "[]")),
        ({"model_repo": "builtin", "global": {1: 2}}, ("global keys must be strings", "1")),
        ({"model_repo": "builtin", "global": {"grpc": 5}}, ("global.grpc must be a mapping", "5")),
        (
            {"model_repo": "builtin", "global": {"grpc": {"max_recv_msg_bytes": "1MiB"}}},
            ("global.grpc.max_recv_msg_bytes must be an integer", "'1MiB'"),
        ),
        (
            {"model_repo": "builtin", "global": {"grpc": {"max_send_msg_bytes": 0}}},
            ("global.grpc.max_send_msg_bytes", "got 0"),
        ),
        (
            {"model_repo": "builtin", "shared_host_weights": "yes"},
            ("shared_host_weights must be a boolean", "'yes'"),
        ),
    ],
)
def test_invalid_node_keys(raw: dict[str, Any], fragments: tuple[str, ...]) -> None:
    fails(raw, *fragments)


@pytest.mark.parametrize("root", [None, [], "model_repo: builtin", 5])
def test_root_must_be_a_mapping(root: object) -> None:
    with pytest.raises(ConfigError, match=r"node\.yml: node file root must be a mapping"):
        parse_node(root, source="node.yml")


def test_unknown_keys_are_noted() -> None:
    n = node(visible_gpus=1, scheduler={"x": 1})
    assert n.notes == ("unknown node key 'scheduler' ignored",)
    assert node(visible_gpus=1, shared_host_weights=True).shared_host_weights is True


def test_load_node_resolves_a_relative_model_repo(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "node.yml"
    path.write_text("model_repo: models/catalogue.yml\ngpus: 2\n", encoding="utf-8")
    n = load_node(path)
    assert n.model_repo == str(tmp_path / "models" / "catalogue.yml")
    assert n.source == str(path)
    path.write_text("model_repo: /abs/cat.yml\n", encoding="utf-8")
    assert load_node(path, visible_gpus=1).model_repo == "/abs/cat.yml"
    path.write_text("model_repo: builtin\n", encoding="utf-8")
    assert load_node(str(path), gpus=1).model_repo == "builtin"


def test_load_node_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_node(tmp_path / "none.yml")
    assert str(info.value) == f"node file not found: {tmp_path / 'none.yml'}"
    bad = tmp_path / "bad.yml"
    bad.write_text("model_repo: [\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_node(bad)
    bad.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="node file root must be a mapping, got None"):
        load_node(bad)


# -- probe_target (probe_worker_ready's choice of worker) ------------------------------------------


def test_probe_target_sole_worker() -> None:
    assert probe_target(node(gpus=1, base_port=7000)) == ("127.0.0.1", 7000)


def test_probe_target_named_worker_and_explicit_port() -> None:
    n = node(workers=[{"name": "a"}, {"name": "b", "port": 9999, "host": "10.1.2.3"}])
    assert probe_target(n, "a") == ("127.0.0.1", 8080)
    assert probe_target(n, "b") == ("10.1.2.3", 9999)


def test_probe_target_errors() -> None:
    n = node(gpus=3)
    with pytest.raises(ConfigError) as info:
        probe_target(n)
    assert str(info.value) == "node has 3 workers; specify which to probe"
    with pytest.raises(ConfigError) as info:
        probe_target(n, "gpu9")
    assert str(info.value) == "worker 'gpu9' not defined in node"
    with pytest.raises(ConfigError, match="worker 'worker0' has port 0"):
        probe_target(node(gpus=1, base_port=0))


def test_worker_spec_is_frozen() -> None:
    w = node(gpus=1).workers[0]
    assert isinstance(w, WorkerSpec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.port = 1  # type: ignore[misc]  # the point of the test
    assert hash(w) == hash(node(gpus=1).workers[0])


# -- properties ------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.floats(),
    st.text(max_size=8),
    st.just("auto"),
)
junk = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)
NODE_KEYS = [
    "model_repo",
    "base_port",
    "metrics_base_port",
    "gpus",
    "global",
    "workers",
    "models",
    "shared_host_weights",
]
worker_entries = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["a", "b", "c"]), junk)},
    optional={
        "gpu": junk,
        "host": junk,
        "port": st.one_of(st.integers(0, 9000), junk),
        "extra": junk,
    },
)


@given(
    st.dictionaries(st.sampled_from(NODE_KEYS), junk, max_size=6),
    st.one_of(st.none(), st.lists(worker_entries, max_size=4)),
    st.one_of(st.none(), st.integers(0, 8)),
)
def test_junk_node_files_raise_config_error_and_nothing_else(
    raw: dict[str, Any], workers: list[dict[str, Any]] | None, visible: int | None
) -> None:
    raw.setdefault("model_repo", "builtin")
    if workers is not None:
        raw["workers"] = workers
    try:
        n = parse_node(raw, source="junk.yml", visible_gpus=visible)
    except ConfigError as exc:
        assert str(exc).startswith("junk.yml: ")
        return
    used = [p for w in n.workers for p in (w.port, w.metrics_port) if p]
    assert len(used) == len(set(used))
    assert len({w.name for w in n.workers}) == len(n.workers) > 0
