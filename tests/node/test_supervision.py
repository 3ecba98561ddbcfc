"""The node supervisor's pure decisions (rsgw.node._supervision): plain table tests.

The processes themselves are tested end to end in tests/node/test_supervisor.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest

import rsgw
from rsgw.base._errors import ConfigError
from rsgw.config._config import parse_config
from rsgw.node._node import NodeConfig, parse_node
from rsgw.node._supervision import (
    Backoff,
    cuda_device,
    cuda_devices,
    gateway_command,
    gateway_environment,
    listed_gpu_count,
    parse_serving,
    pinned_gateway_env,
    public_addresses,
    serving_http_port,
    sole_worker,
    worker_command,
)

W = "REACTANT_GATEWAY_"


def node(**raw: Any) -> NodeConfig:
    return parse_node({"model_repo": "builtin", **raw}, source="node.yml")


# ---------------------------------------------------------------------------
# Backoff.


def test_backoff_doubles_from_1_to_30_and_resets_after_a_stable_run() -> None:
    backoff = Backoff()
    delays = [backoff.after_exit(0.5) for _ in range(7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff.after_exit(60.0) == 1.0
    assert backoff.after_exit(59.0) == 2.0


# ---------------------------------------------------------------------------
# GPUs.


@pytest.mark.parametrize(
    ("devices", "listed"),
    [
        ("0,1", ["0", "1"]),
        ("", []),
        ("-1", []),
        ("0,-1,2", ["0"]),
        (" 2 , 3 ", ["2", "3"]),
        ("0,,1", ["0"]),
        ("GPU-8f1c,GPU-77aa", ["GPU-8f1c", "GPU-77aa"]),
    ],
)
def test_cuda_devices_stop_at_the_first_invalid_entry(devices: str, listed: list[str]) -> None:
    assert cuda_devices({"CUDA_VISIBLE_DEVICES": devices}) == listed


def test_cuda_devices_unset_is_none() -> None:
    assert cuda_devices({}) is None


def test_listed_gpu_count_counts_gpu_lines_only() -> None:
    listing = (
        "GPU 0: NVIDIA A100 (UUID: GPU-1)\n"
        "  MIG 1g.5gb Device 0: (UUID: MIG-1)\n"
        "GPU 1: NVIDIA A100 (UUID: GPU-2)\n"
    )
    assert listed_gpu_count(listing) == 2
    assert listed_gpu_count("") == 0
    assert listed_gpu_count("No devices were found\n") == 0


def test_a_worker_gets_the_physical_device_behind_its_ordinal() -> None:
    assert cuda_device(1, {"CUDA_VISIBLE_DEVICES": "2,3"}) == "3"
    assert cuda_device(1, {}) == "1"
    assert cuda_device("GPU-77aa", {"CUDA_VISIBLE_DEVICES": "2,3"}) == "GPU-77aa"


# ---------------------------------------------------------------------------
# Addresses.


def test_public_addresses_default_and_override() -> None:
    assert public_addresses({}) == ("0.0.0.0:8001", "0.0.0.0:8002")
    env = {"REACTANT_GATEWAY_LISTEN_GRPC": " 127.0.0.1:0 ", "REACTANT_GATEWAY_LISTEN_METRICS": ""}
    assert public_addresses(env) == ("127.0.0.1:0", "0.0.0.0:8002")
    with pytest.raises(rsgw.ConfigError, match="REACTANT_GATEWAY_LISTEN_GRPC"):
        public_addresses({"REACTANT_GATEWAY_LISTEN_GRPC": "8001"})


def test_sole_worker_runs_on_the_public_addresses() -> None:
    node = parse_node({"model_repo": "builtin", "gpus": 1, "base_port": 7000}, source="n")
    worker = sole_worker(node, {})
    assert (worker.name, worker.host, worker.port, worker.metrics_port) == (
        "worker0",
        "0.0.0.0",
        8001,
        8002,
    )
    env = {
        "REACTANT_GATEWAY_LISTEN_GRPC": "[::1]:0",
        "REACTANT_GATEWAY_LISTEN_METRICS": "10.0.0.1:9",
    }
    worker = sole_worker(node, env)
    assert (worker.host, worker.port, worker.metrics_port) == ("::1", 0, 9)
    assert worker.gpu == node.workers[0].gpu


# ---------------------------------------------------------------------------
# The embedded gateway's environment (docs/original.md §8.5, docs/product.md §6).


def test_gateway_environment_synthesizes_workers_metrics_and_names() -> None:
    n = node(gpus=2, metrics_base_port=9100, **{"global": {"grpc": {"max_recv_msg_bytes": 1024}}})
    env = gateway_environment(n, {"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        W + "STARTUP_WAIT_SECONDS": "inf",
        W + "WORKERS": "127.0.0.1:8080,127.0.0.1:8081",
        W + "WORKER_METRICS": "127.0.0.1:9100,127.0.0.1:9101",
        W + "WORKER_NAMES": "worker0,worker1",
        W + "GRPC_MAX_RECV_MSG_BYTES": "1024",
    }
    cfg = parse_config({}, env)
    assert cfg.endpoints == ("127.0.0.1:8080", "127.0.0.1:8081")
    assert cfg.metrics_endpoints == ("127.0.0.1:9100", "127.0.0.1:9101")
    assert cfg.worker_names == ("worker0", "worker1")
    assert cfg.grpc.max_recv_msg_bytes == 1024
    assert cfg.startup_wait_seconds == math.inf


def test_gateway_environment_keeps_what_is_already_set() -> None:
    n = node(
        gpus=2, **{"global": {"grpc": {"max_recv_msg_bytes": 1024, "max_send_msg_bytes": 2048}}}
    )
    given = {W + "STARTUP_WAIT_SECONDS": "30", W + "GRPC_MAX_SEND_MSG_BYTES": "4096"}
    env = gateway_environment(n, given)
    assert env[W + "STARTUP_WAIT_SECONDS"] == "30"
    assert env[W + "GRPC_MAX_SEND_MSG_BYTES"] == "4096"
    assert env[W + "GRPC_MAX_RECV_MSG_BYTES"] == "1024"
    assert W + "WORKER_METRICS" not in env  # no metrics_base_port
    assert given == {W + "STARTUP_WAIT_SECONDS": "30", W + "GRPC_MAX_SEND_MSG_BYTES": "4096"}


def test_a_mounted_gateway_yml_suppresses_the_synthesis() -> None:
    n = node(gpus=2, metrics_base_port=9100, **{"global": {"grpc": {"max_recv_msg_bytes": 1024}}})
    yml = {"endpoints": ["10.0.0.1:8001"], "grpc": {"max_recv_msg_bytes": 64}}
    env = gateway_environment(n, {W + "FILE": "/g.yml"}, gateway_yml=yml)
    assert env == {W + "FILE": "/g.yml", W + "STARTUP_WAIT_SECONDS": "inf"}


def test_a_mounted_gateway_yml_without_workers_gets_the_nodes() -> None:
    """A file that sets only the mode still runs in front of the node's workers: the
    node fills in what the file leaves out, and nothing the file sets (env beats file)."""
    n = node(gpus=2, metrics_base_port=9100, **{"global": {"grpc": {"max_recv_msg_bytes": 1024}}})
    yml = {"scheduling": {"mode": "lpt_packing"}, "grpc": {"max_recv_msg_bytes": None}}
    env = gateway_environment(n, {}, gateway_yml=yml)
    assert env[W + "WORKERS"] == "127.0.0.1:8080,127.0.0.1:8081"
    assert env[W + "WORKER_METRICS"] == "127.0.0.1:9100,127.0.0.1:9101"
    assert env[W + "WORKER_NAMES"] == "worker0,worker1"
    assert env[W + "GRPC_MAX_RECV_MSG_BYTES"] == "1024"  # empty in the file counts as absent
    cfg = parse_config(yml, env)
    assert cfg.scheduling.mode == "lpt_packing"
    assert cfg.endpoints == ("127.0.0.1:8080", "127.0.0.1:8081")
    # The file's own metrics list and limit win over the node's.
    yml = {"metrics_endpoints": ["10.0.0.9:9100"], "grpc": {"max_recv_msg_bytes": 64}}
    env = gateway_environment(n, {}, gateway_yml=yml)
    assert W + "WORKER_METRICS" not in env
    assert W + "GRPC_MAX_RECV_MSG_BYTES" not in env
    assert env[W + "WORKERS"] == "127.0.0.1:8080,127.0.0.1:8081"


def test_the_nodes_logging_goes_where_neither_file_nor_environment_says() -> None:
    """The node's level and (resolved) format; `auto` from the environment or the file
    is the node's choice too (the gateway's stderr is a pipe to the node)."""
    n = node(gpus=2)

    def logged(env: dict[str, str], yml: dict[str, object] | None = None) -> tuple[str, str]:
        out = gateway_environment(n, env, gateway_yml=yml, logging=("debug", "text"))
        return out.get(W + "LOGGING_LEVEL", "-"), out.get(W + "LOGGING_FORMAT", "-")

    assert logged({}) == ("debug", "text")
    assert logged({W + "LOGGING_FORMAT": "AUTO"}) == ("debug", "text")
    assert logged({W + "LOGGING_FORMAT": "json", W + "LOGGING_LEVEL": "error"}) == (
        "error",
        "json",
    )
    assert logged({}, {"logging": {"format": "json", "level": "warning"}}) == ("-", "-")
    assert logged({}, {"logging": {"format": "auto"}}) == ("debug", "text")


def test_gateway_environment_needs_bound_ports_for_port_zero() -> None:
    n = node(gpus=2, base_port=0)
    with pytest.raises(ConfigError, match="worker 'worker0' has gRPC port 0"):
        gateway_environment(n, {})
    bound = [dataclasses.replace(w, port=41000 + i) for i, w in enumerate(n.workers)]
    env = gateway_environment(n, {}, workers=bound)
    assert env[W + "WORKERS"] == "127.0.0.1:41000,127.0.0.1:41001"


def test_only_a_gateway_port_zero_from_the_environment_is_pinned() -> None:
    env = {
        "REACTANT_GATEWAY_LISTEN_GRPC": " 127.0.0.1:0 ",
        "REACTANT_GATEWAY_LISTEN_METRICS": "[::]:0",
        "OTHER": "x",
    }
    assert pinned_gateway_env(env, 5, 6) == {
        "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:5",
        "REACTANT_GATEWAY_LISTEN_METRICS": "[::]:6",
        "OTHER": "x",
    }
    assert env["REACTANT_GATEWAY_LISTEN_GRPC"] == " 127.0.0.1:0 "  # a copy, not an edit
    assert pinned_gateway_env(env, 5, None)["REACTANT_GATEWAY_LISTEN_METRICS"] == "[::]:0"
    fixed = {"REACTANT_GATEWAY_LISTEN_GRPC": "0.0.0.0:8001"}
    assert pinned_gateway_env(fixed, 5, 6) == fixed
    assert pinned_gateway_env({}, 5, 6) == {}
    rest = {"REACTANT_GATEWAY_LISTEN_HTTP": "127.0.0.1:0"}
    assert pinned_gateway_env(rest, 5, 6, 7) == {"REACTANT_GATEWAY_LISTEN_HTTP": "127.0.0.1:7"}
    assert pinned_gateway_env(rest, 5, 6) == rest  # no REST port reported: left alone


@pytest.mark.parametrize(
    ("line", "port"),
    [
        ('{"event": "gateway serving", "grpc_port": 5, "http_port": 7}', 7),
        ('{"event": "gateway serving", "grpc_port": 5, "http_port": null}', None),
        ("12:00 info x: gateway serving grpc_port=5 metrics_port=6 http_port=7", 7),
        ("12:00 info x: gateway serving grpc_port=5 http_port=None", None),
        ('{"event": "worker serving", "grpc_port": 5}', None),
    ],
)
def test_the_gateways_rest_port_is_read_from_its_serving_line(line: str, port: int | None) -> None:
    assert serving_http_port(line) == port


# ---------------------------------------------------------------------------
# Command lines and log lines.


def test_worker_command_carries_the_node_files_worker_settings() -> None:
    node = parse_node(
        {
            "model_repo": "builtin",
            "gpus": 2,
            "global": {
                "scheduler": {"discipline": "EDF"},
                "memory": {"weight_cache_bytes": "1GiB"},
            },
            "models": {"simple": ["worker1"]},
        },
        source="n",
    )
    env = {"CUDA_VISIBLE_DEVICES": "4,5"}
    spec = node.workers[1]
    argv = worker_command(
        spec,
        node,
        device=cuda_device(spec.gpu, env),
        logging_flags=["--log-format", "text"],
        executable="python3",
    )
    assert argv[0] == "python3"
    assert argv[1:] == [
        "-m",
        "rsgw",
        "worker",
        "--name",
        "worker1",
        "--gpu",
        "5",
        "--host",
        "127.0.0.1",
        "--port",
        "8081",
        "--metrics-port",
        "-1",
        "--discipline",
        "edf",
        "--weight-cache-bytes",
        "1GiB",
        "--pin",
        "simple",
        "--log-format",
        "text",
    ]


def test_worker_command_names_a_catalogue_and_a_metrics_port() -> None:
    node = parse_node(
        {"model_repo": "/m/models.yaml", "gpus": ["GPU-a"], "metrics_base_port": 9100},
        source="n",
    )
    argv = worker_command(node.workers[0], node, device="GPU-a", logging_flags=[], executable="py")
    assert argv == [
        "py",
        "-m",
        "rsgw",
        "worker",
        "--name",
        "worker0",
        "--gpu",
        "GPU-a",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--metrics-port",
        "9100",
        "--models",
        "/m/models.yaml",
    ]


def test_gateway_command_is_rsgw_run() -> None:
    assert gateway_command("py") == ["py", "-m", "rsgw", "run"]


@pytest.mark.parametrize(
    ("line", "ports"),
    [
        ('{"event": "worker serving", "grpc_port": 5, "metrics_port": 6}', (5, 6)),
        ('{"event": "worker serving", "grpc_port": 5, "metrics_port": null}', (5, None)),
        ('{"event": "worker serving!", "grpc_port": 5, "metrics_port": 6}', None),
        ('{"event": "gateway serving", "grpc_port": 5, "metrics_port": 6}', None),
        ('{"event": "worker serving", "grpc_port": "5"}', None),
        ('{"event": "worker serving", "grpc_po', None),
        (
            "12:00:00 info    rsgw.worker._worker: worker serving worker=w0 gpu=0 "
            "grpc_port=5 metrics_port=6 models=8",
            (5, 6),
        ),
        ("12:00:00 info    x: worker serving worker=w grpc_port=5 metrics_port=None", (5, None)),
        (
            "12:00:00 info    x: worker serving worker=grpc_port=9 grpc_port=5 metrics_port=6",
            (5, 6),
        ),
        ("12:00:00 info    x: not worker serving grpc_port=5 metrics_port=6", None),
    ],
)
def test_parse_serving_reads_json_and_text_lines(
    line: str, ports: tuple[int, int | None] | None
) -> None:
    assert parse_serving(line, "worker serving") == ports


# ---------------------------------------------------------------------------
# TLS through the node file (docs/security.md).

NODE_TLS = {
    "cert_file": "/pki/worker.pem",
    "key_file": "/pki/worker.key",
    "client_ca_file": "/pki/ca.pem",
    "ca_file": "/pki/ca.pem",
    "client_cert_file": "/pki/gateway.pem",
    "client_key_file": "/pki/gateway.key",
}


def test_node_tls_reaches_the_workers_flags_and_the_gateways_client() -> None:
    n = node(gpus=2, **{"global": {"tls": NODE_TLS}})
    argv = worker_command(n.workers[0], n, device="0", logging_flags=[], executable="python3")
    flags = dict(itertools.pairwise(argv))
    assert flags["--tls-cert"] == "/pki/worker.pem"
    assert flags["--tls-key"] == "/pki/worker.key"
    assert flags["--tls-client-ca"] == "/pki/ca.pem"
    env = gateway_environment(n, {})
    assert env[W + "WORKER_CLIENT_TLS_CA_FILE"] == "/pki/ca.pem"
    assert env[W + "WORKER_CLIENT_TLS_CERT_FILE"] == "/pki/gateway.pem"
    assert env[W + "WORKER_CLIENT_TLS_KEY_FILE"] == "/pki/gateway.key"
    assert parse_config({}, env).worker_client.tls_ca_file == "/pki/ca.pem"


@pytest.mark.parametrize(
    ("missing", "fragment"),
    [("ca_file", "global.tls.ca_file is required"), ("client_cert_file", "client_cert_file")],
)
def test_node_tls_without_the_gateways_side_is_an_error(missing: str, fragment: str) -> None:
    tls = {k: v for k, v in NODE_TLS.items() if k != missing}
    n = node(gpus=2, **{"global": {"tls": tls}})
    with pytest.raises(ConfigError, match=fragment):
        gateway_environment(n, {})


def test_a_sole_public_worker_serves_the_gateways_tls() -> None:
    n = node(gpus=1)
    env = {W + "TLS_CERT_FILE": "/pki/public.pem", W + "TLS_KEY_FILE": "/pki/public.key"}
    argv = worker_command(sole_worker(n, env), n, device="0", logging_flags=[], executable="p")
    assert argv[argv.index("--tls-cert") + 1] == "/pki/public.pem"
    assert argv[argv.index("--tls-key") + 1] == "/pki/public.key"
