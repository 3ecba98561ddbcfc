"""Protected mode: without auth, calls that change the node are taken from loopback only.

A real gateway listening on 0.0.0.0 (gRPC and REST) in front of real workers; the
anonymous client on another host is a real process in a network namespace
(`tests.netns`) calling the gateway's address on the link, with grpcio and httpx.
The same calls from loopback are let through; with a tokens file, the roles of
docs/security.md decide from both; with `auth.trusted_network` nothing is refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import grpc
import trio

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._methods import Method
from rsgw.config._config import AuthConfig, ListenConfig
from tests.gateway.fleet import Fleet, open_fleet
from tests.gateway.test_gateway_auth import ALICE, OPS, code_of, standard_tokens
from tests.helpers import in_thread, infer_request, simple_inputs
from tests.netns import OtherHost, other_host

REMOTE_CALLS = Path(__file__).resolve().parent.parent / "remote_calls.py"
EVERYWHERE = ListenConfig(grpc="0.0.0.0:0", metrics="127.0.0.1:0", http="0.0.0.0:0")

INFER = infer_request("simple", simple_inputs(0)).SerializeToString()
LOG_UPDATE = pb.LogSettingsRequest(
    settings={"log_verbose_level": pb.LogSettingsRequest.SettingValue(uint32_param=1)}
).SerializeToString()
TRACE_UPDATE = pb.TraceSettingRequest(
    settings={"trace_rate": pb.TraceSettingRequest.SettingValue(value=["10"])}
).SerializeToString()
TRACE_READ = pb.TraceSettingRequest(model_name="simple").SerializeToString()

#: Every call the gateway serves that changes the node, with a body each method takes
#: (SetModelResidency and SetModelPolicy are the workers' own: the gateway answers
#: UNIMPLEMENTED to everyone).
CHANGES: list[tuple[Method, bytes]] = [
    (Method.ADD_WORKER, cpb.AddWorkerRequest(address="10.9.9.9:8001").SerializeToString()),
    (Method.REMOVE_WORKER, cpb.RemoveWorkerRequest(worker="worker0").SerializeToString()),
    (Method.SET_SCHEDULING_POLICY, b""),
    (Method.SET_MODEL_PLACEMENT, b""),
    (Method.REPACK, b""),
    (Method.COMPACT_MEMORY, b""),
    (
        Method.REPOSITORY_MODEL_LOAD,
        pb.RepositoryModelLoadRequest(model_name="x").SerializeToString(),
    ),
    (
        Method.REPOSITORY_MODEL_UNLOAD,
        pb.RepositoryModelUnloadRequest(model_name="x").SerializeToString(),
    ),
    (Method.LOG_SETTINGS, LOG_UPDATE),
    (Method.TRACE_SETTING, TRACE_UPDATE),
]
#: Calls that only read or infer: open to anyone without auth.
READS: list[tuple[Method, bytes]] = [
    (Method.MODEL_INFER, INFER),
    (Method.SERVER_READY, b""),
    (Method.MODEL_METADATA, pb.ModelMetadataRequest(name="simple").SerializeToString()),
    (Method.GET_SCHEDULING_STATUS, b""),
    (Method.LOG_SETTINGS, b""),
    (Method.TRACE_SETTING, TRACE_READ),
]
INFER_JSON = {
    "inputs": [
        {"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
}
#: REST: (method, path, body, what protected mode answers a remote client).
REST: list[tuple[str, str, Any, int]] = [
    ("POST", "/v2/models/simple/infer", INFER_JSON, 200),
    ("GET", "/v2/logging", None, 200),
    ("POST", "/v2/logging", {"log_verbose_level": 1}, 403),
    ("POST", "/v2/repository/models/simple/unload", {}, 403),
    ("POST", "/v2/repository/models/simple/load", {}, 403),
    ("POST", "/v2/trace/setting", {"trace_rate": "10"}, 403),
]


async def remote(host: OtherHost, fleet: Fleet, calls: list[list[Any]]) -> list[Any]:
    """`calls` (see tests/remote_calls.py) made from `host`; their codes."""
    gateway = fleet.gateway
    plan = {
        "grpc": f"{host.gateway_address}:{gateway.grpc_port}",
        "http": f"http://{host.gateway_address}:{gateway.http_port}",
        "calls": calls,
    }
    done = await trio.run_process(
        host.command(sys.executable, "-I", str(REMOTE_CALLS), json.dumps(plan)),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert isinstance(result, list)
    return result


def grpc_calls(pairs: list[tuple[Method, bytes]], token: str | None = None) -> list[list[Any]]:
    return [["grpc", method.path, body.hex(), token] for method, body in pairs]


async def test_without_auth_a_remote_client_may_infer_and_read_but_not_change_the_node() -> None:
    with other_host() as host:
        async with open_fleet(2, listen=EVERYWHERE) as fleet:
            codes = await remote(host, fleet, grpc_calls(CHANGES) + grpc_calls(READS))
            assert list(zip(CHANGES, codes[: len(CHANGES)], strict=True)) == [
                (c, "PERMISSION_DENIED") for c in CHANGES
            ]
            assert list(zip(READS, codes[len(CHANGES) :], strict=True)) == [
                (r, "OK") for r in READS
            ]
            statuses = await remote(
                host, fleet, [["rest", method, path, body, None] for method, path, body, _ in REST]
            )
            assert statuses == [expected for *_, expected in REST]
            # Nothing was changed: the worker the remote client tried to add is not there,
            # and the one it tried to remove still is.
            assert len(fleet.gateway.status().workers) == 2

            local = f"127.0.0.1:{fleet.gateway.grpc_port}"
            for method, body in CHANGES:  # the same calls from loopback reach their handlers
                code = await in_thread(lambda: code_of(local, method, body))  # noqa: B023
                assert code != grpc.StatusCode.PERMISSION_DENIED, method


async def test_the_refusal_names_the_settings_that_allow_the_call() -> None:
    with other_host() as host:
        async with open_fleet(1, listen=EVERYWHERE) as fleet:
            plan = grpc_calls([(Method.COMPACT_MEMORY, b"")])
            gateway = fleet.gateway
            target = f"{host.gateway_address}:{gateway.grpc_port}"
            script = (
                "import grpc, sys\n"
                f"c = grpc.insecure_channel({target!r})\n"
                "try:\n"
                f"    c.unary_unary({plan[0][1]!r})(b'', timeout=10)\n"
                "except grpc.RpcError as e:\n"
                "    print(e.code().name, e.details())\n"
            )
            done = await trio.run_process(
                host.command(sys.executable, "-I", "-c", script), capture_stdout=True
            )
            text = done.stdout.decode()
            assert text.startswith("PERMISSION_DENIED CompactMemory refused to " + host.address)
            for setting in ("auth.tokens_file", "auth.identities", "auth.trusted_network"):
                assert setting in text


async def test_with_a_tokens_file_roles_decide_from_anywhere(tmp_path: Path) -> None:
    tokens = standard_tokens(tmp_path / "tokens.yml")
    compact = [(Method.COMPACT_MEMORY, b"")]
    with other_host() as host:
        async with open_fleet(1, listen=EVERYWHERE, auth=AuthConfig(tokens_file=tokens)) as fleet:
            codes = await remote(
                host,
                fleet,
                grpc_calls(compact) + grpc_calls(compact, ALICE) + grpc_calls(compact, OPS),
            )
            assert codes == ["UNAUTHENTICATED", "PERMISSION_DENIED", "OK"]
            local = f"127.0.0.1:{fleet.gateway.grpc_port}"
            for token, expected in (
                (None, grpc.StatusCode.UNAUTHENTICATED),
                (ALICE, grpc.StatusCode.PERMISSION_DENIED),
                (OPS, grpc.StatusCode.OK),
            ):
                got = await in_thread(
                    lambda: code_of(local, Method.COMPACT_MEMORY, b"", token=token)  # noqa: B023
                )
                assert got == expected


async def test_a_trusted_network_takes_every_call_from_anywhere() -> None:
    with other_host() as host:
        async with open_fleet(1, listen=EVERYWHERE, auth=AuthConfig(trusted_network=True)) as fleet:
            codes = await remote(host, fleet, grpc_calls([(Method.COMPACT_MEMORY, b"")]))
            assert codes == ["OK"]
