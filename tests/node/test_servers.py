"""A server of its own on each GPU (issue 50): the node file's `server:`, placeholders,
each worker's command line and environment, what the gateway is handed, the node's
failure lines, and `rsgw node --dry-run`. Pure table tests; `--dry-run` starts nothing.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from rsgw._cli import main
from rsgw.base._errors import ConfigError
from rsgw.node._node import NodeConfig, parse_node
from rsgw.node._plan import handed_models, scheduling_mode, server_runs
from rsgw.node._probe import probe_address
from rsgw.node._servers import (
    PLACEHOLDERS,
    ServerSpec,
    check_repository,
    exit_failure,
    listed_gpu_uuids,
    parse_server,
    repository_models,
    spawn_failure,
    startup_failure,
)


def node(**raw: Any) -> NodeConfig:
    return parse_node({"model_repo": "/models", **raw}, source="node.yml")


# ---------------------------------------------------------------------------
# `server:`


def test_rsgw_is_the_default_and_keeps_todays_names_and_ports() -> None:
    n = node(gpus=2)
    assert n.server == ServerSpec() and not n.server.external
    assert [(w.name, w.port, w.metrics_port, w.http_port) for w in n.workers] == [
        ("worker0", 8080, None, None),
        ("worker1", 8081, None, None),
    ]


def test_a_server_of_its_own_names_workers_after_gpus_with_three_ports_each() -> None:
    n = node(gpus=2, server="triton")
    assert n.server.kind == "triton" and n.server.external
    assert [(w.name, w.gpu, w.port, w.http_port, w.metrics_port) for w in n.workers] == [
        ("gpu0", 0, 8080, 8180, 9100),
        ("gpu1", 1, 8081, 8181, 9101),
    ]
    n = node(gpus=2, server="mlserver", base_port=0, http_base_port=0, metrics_base_port=0)
    assert {(w.port, w.http_port, w.metrics_port) for w in n.workers} == {(0, 0, 0)}


def test_the_server_block() -> None:
    spec = parse_server(
        {
            "preset": "Triton",
            "args": ["--backend-directory=/b", "--log-verbose=1"],
            "env": {"LD_LIBRARY_PATH": "/lib", "SLOT": 3, "WHO": "{name}"},
            "startup_seconds": 900,
            "work_dir": "/var/lib/rsgw",
        }
    )
    assert spec.kind == "triton"
    assert spec.args == ("--backend-directory=/b", "--log-verbose=1")
    assert dict(spec.env) == {"LD_LIBRARY_PATH": "/lib", "SLOT": "3", "WHO": "{name}"}
    assert (spec.startup_seconds, spec.work_dir) == (900.0, "/var/lib/rsgw")
    command = parse_server({"command": "my-server --port {grpc_port} --gpu '{gpu}'"})
    assert command.kind == "command"
    assert command.command == ("my-server", "--port", "{grpc_port}", "--gpu", "{gpu}")
    assert parse_server({"command": ["a", 1]}).command == ("a", "1")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("tgi", "server must be one of rsgw, triton, mlserver"),
        (3, "server must be one of"),
        ({"preset": "triton", "command": "x"}, "a preset or a command, not both"),
        ({"command": ""}, "server.command is empty"),
        ({"command": {"a": 1}}, "server.command must be a command line"),
        ({"command": "x 'unclosed"}, "server.command: No closing quotation"),
        ({"command": "x --port {port}"}, "unknown placeholder {port}"),
        ({"command": "x {"}, "server.command: Single '{'"),
        ({"preset": "triton", "args": "--x={gpu_index}"}, "unknown placeholder {gpu_index}"),
        ({"preset": "triton", "env": ["A"]}, "server.env must be a mapping"),
        ({"preset": "triton", "env": {"A": True}}, "server.env.A must be a string"),
        ({"preset": "triton", "env": {"A=B": "1"}}, "server.env keys must be variable names"),
        ({"preset": "triton", "startup_seconds": 0}, "server.startup_seconds must be seconds"),
        ({"preset": "triton", "work_dir": ""}, "server.work_dir must be a folder"),
        ({"preset": "triton", "ports": 1}, "server: unknown key 'ports'"),
        ({"args": ["-x"]}, "not rsgw's"),
    ],
)
def test_bad_server_blocks_are_one_line(value: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        node(server=value)
    message = str(caught.value)
    assert message.startswith("node.yml: ") and fragment in message and "\n" not in message


def test_flags_replace_what_runs() -> None:
    n = parse_node(
        {"model_repo": "/m", "server": {"preset": "triton", "args": ["-v"], "env": {"A": "1"}}},
        source="n",
        command="rsgw worker --port {grpc_port}",
    )
    assert n.server.kind == "command" and n.server.args == () and n.server.env == {"A": "1"}
    n = parse_node({"model_repo": "/m"}, source="n", server="mlserver", gpus=1)
    assert n.server.kind == "mlserver" and n.workers[0].name == "gpu0"
    with pytest.raises(ConfigError, match="--server and --command"):
        parse_node({"model_repo": "/m"}, source="n", server="triton", command="x")


# ---------------------------------------------------------------------------
# Each worker's command line and environment.


def test_triton_workers_get_their_gpu_ports_and_env(tmp_path: Path) -> None:
    n = parse_node(
        {
            "model_repo": "/models",
            "gpus": ["GPU-aaa", "GPU-bbb"],
            "server": {"preset": "triton", "args": ["--x={workdir}"], "env": {"A": "{index}"}},
            "workers": [{"name": "left"}, {"name": "right", "env": {"A": "mine", "B": "2"}}],
        },
        source="n",
    )
    runs = server_runs(n, {}, n.workers, str(tmp_path), load_all=True)
    left, right = runs
    assert left.argv == (
        "tritonserver",
        "--model-repository=/models",
        "--model-control-mode=explicit",
        "--grpc-address=127.0.0.1",
        "--grpc-port=8080",
        "--http-address=127.0.0.1",
        "--http-port=8180",
        "--allow-metrics=true",
        "--metrics-address=127.0.0.1",
        "--metrics-port=9100",
        f"--x={tmp_path / 'left'}",
        "--load-model=*",
    )
    assert left.cwd == str(tmp_path / "left")
    assert dict(left.additions) == {
        "A": "0",
        "CUDA_VISIBLE_DEVICES": "GPU-aaa",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaa",
    }
    assert dict(right.additions)["A"] == "mine" and right.additions["B"] == "2"
    assert right.additions["CUDA_VISIBLE_DEVICES"] == "GPU-bbb"
    # Placed by the gateway (lpt_packing): nothing loaded at start.
    (placed, _) = server_runs(n, {}, n.workers, str(tmp_path), load_all=False)
    assert not any(a.startswith("--load-model") for a in placed.argv)


def test_ordinals_map_through_the_nodes_own_cuda_visible_devices(tmp_path: Path) -> None:
    n = node(gpus=2, server="triton")
    runs = server_runs(n, {"CUDA_VISIBLE_DEVICES": "4,5"}, n.workers, str(tmp_path), load_all=True)
    assert [r.additions["NVIDIA_VISIBLE_DEVICES"] for r in runs] == ["4", "5"]


def test_mlserver_gets_its_ports_through_its_settings_environment(tmp_path: Path) -> None:
    n = node(gpus=1, server={"preset": "mlserver", "env": {"MLSERVER_GRPC_PORT": "1"}})
    (run,) = server_runs(n, {}, n.workers, str(tmp_path), load_all=True)
    assert run.argv == ("mlserver", "start", "/models")
    assert {k: v for k, v in run.additions.items() if k.startswith("MLSERVER_")} == {
        "MLSERVER_HOST": "127.0.0.1",
        "MLSERVER_GRPC_PORT": "8080",
        "MLSERVER_HTTP_PORT": "8180",
        "MLSERVER_METRICS_PORT": "9100",
    }
    (placed,) = server_runs(n, {}, n.workers, str(tmp_path), load_all=False)
    assert placed.additions["MLSERVER_LOAD_MODELS_AT_STARTUP"] == "false"


def test_every_placeholder_is_filled(tmp_path: Path) -> None:
    command = " ".join(f"{p}={{{p}}}" for p in PLACEHOLDERS)
    n = node(gpus=1, server={"command": f"serve {command}"})
    (run,) = server_runs(n, {}, n.workers, str(tmp_path), load_all=True)
    assert dict(a.split("=", 1) for a in run.argv[1:]) == {
        "name": "gpu0",
        "index": "0",
        "gpu": "0",
        "cuda_visible_devices": "0",
        "host": "127.0.0.1",
        "grpc_port": "8080",
        "http_port": "8180",
        "metrics_port": "9100",
        "workdir": str(tmp_path / "gpu0"),
        "model_repo": "/models",
    }


# ---------------------------------------------------------------------------
# GPUs, repositories and the gateway.


def test_nvidia_smi_uuids() -> None:
    listing = (
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5f1b3c2a-0000)\n"
        "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-9e8d7c6b-1111)\n"
        "  MIG 1g.10gb Device 0: (UUID: MIG-1234)\n"
    )
    assert listed_gpu_uuids(listing) == ("GPU-5f1b3c2a-0000", "GPU-9e8d7c6b-1111")
    assert listed_gpu_uuids("GPU 0: Tesla K80\n") is None
    assert listed_gpu_uuids("No devices were found\n") == ()
    n = parse_node({"model_repo": "/m", "server": "triton"}, source="n", visible_gpus=("G-1",))
    assert [(w.name, w.gpu) for w in n.workers] == [("gpu0", "G-1")]


def test_repository_models(tmp_path: Path) -> None:
    triton = tmp_path / "triton"
    for name in ("b", "a"):
        (triton / name).mkdir(parents=True)
        (triton / name / "config.pbtxt").write_text("")
    (triton / "c" / "1").mkdir(parents=True)
    (triton / "notes").mkdir()
    (triton / "README").write_text("")
    assert repository_models("triton", str(triton)) == ("a", "b", "c")
    mlserver = tmp_path / "ml"
    (mlserver / "x").mkdir(parents=True)
    (mlserver / "x" / "model-settings.json").write_text(json.dumps({"name": "iris"}))
    (mlserver / "deep" / "y").mkdir(parents=True)
    (mlserver / "deep" / "y" / "model-settings.json").write_text("{}")
    assert repository_models("mlserver", str(mlserver)) == ("iris", "y")
    assert repository_models("command", str(triton)) == ()
    assert repository_models("triton", str(tmp_path / "none")) == ()
    with pytest.raises(ConfigError, match="is not a folder; the triton server"):
        check_repository("triton", str(tmp_path / "none"), "node.yml")
    check_repository("command", "builtin", "node.yml")


def test_lpt_packing_is_handed_the_repositorys_models_unless_the_operator_says() -> None:
    mode = "REACTANT_GATEWAY_SCHEDULING_MODE"
    handed = "REACTANT_GATEWAY_REPOSITORY_MODELS"
    assert scheduling_mode({}, None) == "round_robin"
    assert scheduling_mode({}, {"scheduling": {"mode": "lpt_packing"}}) == "lpt_packing"
    assert scheduling_mode({mode: "least_outstanding"}, {"scheduling": {"mode": "x"}}) == (
        "least_outstanding"
    )
    assert handed_models({mode: "lpt_packing"}, None, ["a", "b"]) == {handed: "a,b"}
    assert handed_models({}, {"scheduling": {"mode": "lpt_packing"}}, ["a"]) == {handed: "a"}
    assert handed_models({}, None, ["a"]) == {}
    assert handed_models({mode: "lpt_packing"}, None, []) == {}
    assert handed_models({mode: "lpt_packing", handed: "a"}, None, ["a", "b"]) == {}
    yml = {"scheduling": {"mode": "lpt_packing"}, "repository": {"models": ["a"]}}
    assert handed_models({}, yml, ["a", "b"]) == {}


# ---------------------------------------------------------------------------
# The node's one line when a child fails for good.


def test_failure_lines_name_the_child_its_command_and_its_last_line() -> None:
    argv = ["tritonserver", "--model-repository=/my models"]
    line = exit_failure("gpu1", 1, argv, ["loading", "error: unknown flag --bogus", ""])
    assert line == (
        "worker 'gpu1' exited with status 1 before it was ready (command: tritonserver "
        "'--model-repository=/my models'); its last line: error: unknown flag --bogus"
    )
    assert exit_failure("gpu0", 2, ["x"], []).endswith("it printed nothing")
    assert exit_failure("w", 2, ["rsgw"], ["rsgw worker: bad --gpu"]).endswith(
        "its last line: rsgw worker: bad --gpu"
    )
    # The gateway's own line, in the words of `rsgw node`.
    assert exit_failure("gateway", 1, ["rsgw", "run"], ["{}", "rsgw run: a.yml: bad"]) == (
        "gateway: a.yml: bad"
    )
    assert exit_failure("gateway", 3, ["rsgw", "run"], ["Killed"]) == (
        "gateway exited with status 3 before it served; its last line: Killed"
    )
    assert startup_failure("gpu0", 2.5, ["sleep", "9"], ["zzz"]) == (
        "worker 'gpu0' not ready after 2.5 s (server.startup_seconds; command: sleep 9); "
        "its last line: zzz"
    )
    assert spawn_failure("gpu0", ["x y"], "No such file or directory: 'x y'") == (
        "worker 'gpu0' could not be started (command: 'x y'): No such file or directory: 'x y'"
    )
    assert math.isinf(
        parse_server({"preset": "triton", "startup_seconds": math.inf}).startup_seconds
    )


# ---------------------------------------------------------------------------
# `rsgw node --dry-run`


def dry_run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["node", "--dry-run", "--log-format", "json", *argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(sys.modules["os"].environ):
        if key.startswith("REACTANT_GATEWAY_") or key == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(key)


@pytest.mark.usefixtures("clean_env")
def test_dry_run_prints_each_triton_and_the_gateway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "models"
    for name in ("resnet", "bert"):
        (repo / name / "1").mkdir(parents=True)
    work = tmp_path / "work"
    node_file = tmp_path / "node.yml"
    node_file.write_text(f"model_repo: models\nserver: {{preset: triton, work_dir: {work}}}\n")
    status, out, err = dry_run(capsys, str(node_file), "--gpus", "2", "--mode", "lpt_packing")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "# rsgw node --dry-run: 2 worker(s), server triton; nothing started"
    assert lines[1] == "# worker gpu0 on GPU 0"
    gpu0 = shlex.split(lines[2])
    assert gpu0[:4] == ["cd", str(work / "gpu0"), "&&", "CUDA_VISIBLE_DEVICES=0"]
    assert gpu0[4:7] == [
        "NVIDIA_VISIBLE_DEVICES=0",
        "tritonserver",
        f"--model-repository={repo}",
    ]
    assert "--grpc-port=8080" in gpu0 and "--http-port=8180" in gpu0
    assert "--metrics-port=9100" in gpu0 and "--load-model=*" not in gpu0
    assert "--grpc-port=8081" in shlex.split(lines[4])
    gateway = lines[lines.index("# gateway in front (rsgw run), configured by its environment:") :]
    assert gateway[1:] == [
        "REACTANT_GATEWAY_LOGGING_FORMAT=json \\",
        "REACTANT_GATEWAY_LOGGING_LEVEL=info \\",
        "REACTANT_GATEWAY_REPOSITORY_MODELS=bert,resnet \\",
        "REACTANT_GATEWAY_SCHEDULING_MODE=lpt_packing \\",
        "REACTANT_GATEWAY_STARTUP_WAIT_SECONDS=inf \\",
        "REACTANT_GATEWAY_WORKERS=127.0.0.1:8080,127.0.0.1:8081 \\",
        "REACTANT_GATEWAY_WORKER_METRICS=127.0.0.1:9100,127.0.0.1:9101 \\",
        "REACTANT_GATEWAY_WORKER_NAMES=gpu0,gpu1 \\",
        shlex.join([sys.executable, "-m", "rsgw", "run"]),
    ]
    assert not work.exists()  # nothing started, nothing made


@pytest.mark.usefixtures("clean_env")
def test_dry_run_of_a_command_and_of_simulated_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = (
        "rsgw worker --api triton --name {name} --port {grpc_port} --metrics-port {metrics_port}"
    )
    status, out, _ = dry_run(capsys, "--gpus", "1", "--command", command)
    assert status == 0
    assert "rsgw worker --api triton --name gpu0 --port 8080 --metrics-port 9100" in out
    assert "REACTANT_GATEWAY_WORKERS=127.0.0.1:8080 \\" in out  # a gateway even for one
    assert "--load-model" not in out
    status, out, _ = dry_run(capsys, "--gpus", "2")
    assert status == 0
    assert "--name worker1 --gpu 1 --host 127.0.0.1 --port 8081 --metrics-port 9101" in out
    assert "REACTANT_GATEWAY_WORKER_NAMES=worker0,worker1 \\" in out


@pytest.mark.usefixtures("clean_env")
def test_dry_run_reports_what_a_start_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "gateway.yml"
    bad.write_text("scheduling: {mode: lpt}\n")
    status, out, err = dry_run(capsys, "--gpus", "2", "--config", str(bad))
    assert (status, out) == (1, "")
    assert err == (
        "rsgw node: gateway: scheduling.mode must be 'round_robin', 'least_outstanding', "
        "or 'lpt_packing', got 'lpt'\n"
    )
    status, _, err = dry_run(capsys, "--server", "triton", "--models", str(tmp_path / "no"))
    assert status == 1 and err.startswith("rsgw node: --models: model_repo '")
    assert err.count("\n") == 1


def test_rsgw_probe_asks_a_sole_server_of_its_own_on_its_own_port() -> None:
    """Unlike a sole rsgw worker, a server of its own is always behind the gateway."""
    assert probe_address(node(gpus=1, server="triton", base_port=7000), None, {}) == (
        "127.0.0.1",
        7000,
    )
