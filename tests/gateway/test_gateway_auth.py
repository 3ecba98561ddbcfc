"""Authentication and authorisation on the gateway: tokens, mTLS identities, roles, audit.

Real clients (grpcio with metadata, stock tritonclient with `headers=`) against a
real fleet; the tokens file on disk is rewritten to show rotation without restart.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._auth import digest
from rsgw.base._errors import ConfigError
from rsgw.base._methods import Method
from rsgw.config._config import AuthConfig, TlsConfig
from tests.gateway.fleet import leaf, open_fleet
from tests.helpers import in_thread, infer_request, simple_inputs, wait_until
from tests.pki import Pki

ALICE = "alice-infer-token-0123456789"  # infer
SAM = "sam-shm-token-0123456789abcd"  # infer, shm
OPS = "ops-operator-token-012345678"  # operator


def write_tokens(path: Path, entries: list[dict[str, object]]) -> str:
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return str(path)


def standard_tokens(path: Path) -> str:
    return write_tokens(
        path,
        [
            {"name": "alice", "token": ALICE, "roles": ["infer"]},
            {"name": "sam", "sha256": digest(SAM), "roles": ["infer", "shm"]},
            {"name": "ops", "token": OPS, "roles": ["operator"]},
        ],
    )


def call(
    target: str,
    method: Method,
    body: bytes = b"",
    token: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> bytes:
    """One unary call with an optional bearer token; raises `grpc.RpcError`."""
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    channel = (
        grpc.insecure_channel(target)
        if credentials is None
        else grpc.secure_channel(target, credentials)
    )
    with channel:
        reply = channel.unary_unary(method.path)(body, metadata=metadata, timeout=10)
    assert isinstance(reply, bytes)
    return reply


def code_of(target: str, method: Method, body: bytes = b"", **kwargs: object) -> grpc.StatusCode:
    try:
        call(target, method, body, **kwargs)  # type: ignore[arg-type]
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


INFER_BODY = infer_request("simple", simple_inputs(0)).SerializeToString()
SHM_REGISTER = pb.SystemSharedMemoryRegisterRequest(
    name="r", key="/rsgw-test-none", byte_size=64
).SerializeToString()


async def test_roles_decide_who_may_call_what(tmp_path: Path) -> None:
    tokens = standard_tokens(tmp_path / "tokens.yml")
    async with open_fleet(2, auth=AuthConfig(tokens_file=tokens)) as fleet:
        t = fleet.target
        cases = [
            # (method, body, token, expected)
            (Method.SERVER_LIVE, b"", None, grpc.StatusCode.OK),  # open: probes
            (Method.SERVER_READY, b"", None, grpc.StatusCode.OK),
            (Method.MODEL_INFER, INFER_BODY, None, grpc.StatusCode.UNAUTHENTICATED),
            (Method.MODEL_INFER, INFER_BODY, "not-a-token", grpc.StatusCode.UNAUTHENTICATED),
            (Method.MODEL_INFER, INFER_BODY, ALICE, grpc.StatusCode.OK),
            (Method.MODEL_METADATA, b"\n\x06simple", ALICE, grpc.StatusCode.OK),
            (Method.MODEL_INFER, INFER_BODY, OPS, grpc.StatusCode.PERMISSION_DENIED),
            (Method.SHM_STATUS, b"", ALICE, grpc.StatusCode.PERMISSION_DENIED),
            (Method.SHM_STATUS, b"", SAM, grpc.StatusCode.OK),
            (Method.SHM_REGISTER, SHM_REGISTER, None, grpc.StatusCode.UNAUTHENTICATED),
            (Method.GET_SCHEDULING_STATUS, b"", ALICE, grpc.StatusCode.PERMISSION_DENIED),
            (Method.GET_SCHEDULING_STATUS, b"", SAM, grpc.StatusCode.PERMISSION_DENIED),
            (Method.GET_SCHEDULING_STATUS, b"", OPS, grpc.StatusCode.OK),
            (Method.COMPACT_MEMORY, b"", SAM, grpc.StatusCode.PERMISSION_DENIED),
            (Method.COMPACT_MEMORY, b"", OPS, grpc.StatusCode.OK),
            (Method.REPOSITORY_MODEL_UNLOAD, b"\n\x01x", ALICE, grpc.StatusCode.PERMISSION_DENIED),
            (Method.REPACK, b"", None, grpc.StatusCode.UNAUTHENTICATED),
        ]
        for method, body, token, expected in cases:
            got = await in_thread(lambda: code_of(t, method, body, token=token))  # noqa: B023
            assert got == expected, (method, token)


async def test_refusals_say_what_is_missing(tmp_path: Path) -> None:
    tokens = standard_tokens(tmp_path / "tokens.yml")
    async with open_fleet(1, auth=AuthConfig(tokens_file=tokens)) as fleet:
        with pytest.raises(grpc.RpcError) as caught:
            await in_thread(lambda: call(fleet.target, Method.REPACK, b"", token=ALICE))
        assert caught.value.details() == ("alice may not call Repack: it needs the 'operator' role")
        with pytest.raises(grpc.RpcError) as caught:
            await in_thread(lambda: call(fleet.target, Method.MODEL_INFER, INFER_BODY))
        details = caught.value.details()
        assert "needs the 'infer' role" in details and "authorization: Bearer" in details


async def test_tritonclient_sends_its_token_as_a_header(tmp_path: Path) -> None:
    tokens = standard_tokens(tmp_path / "tokens.yml")
    async with open_fleet(1, auth=AuthConfig(tokens_file=tokens)) as fleet:

        def infer(token: str | None) -> None:
            client = grpcclient.InferenceServerClient(fleet.target)
            headers = None if token is None else {"authorization": f"Bearer {token}"}
            try:
                a = np.ones((1, 16), dtype=np.int32)
                inputs = [
                    grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                    grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
                ]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(a)
                result = client.infer("simple", inputs, headers=headers)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
                assert client.is_server_live()  # open, no header needed
            finally:
                client.close()

        await in_thread(lambda: infer(ALICE))
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            await in_thread(lambda: infer(None))


async def test_a_rotated_tokens_file_takes_effect_without_restart(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yml"
    tokens = standard_tokens(path)
    fresh = "alice-new-token-abcdefghijkl"
    async with open_fleet(1, auth=AuthConfig(tokens_file=tokens)) as fleet:
        await in_thread(lambda: call(fleet.target, Method.MODEL_INFER, INFER_BODY, token=ALICE))
        write_tokens(path, [{"name": "alice", "token": fresh, "roles": ["infer"]}])

        def old_refused() -> bool:
            code = code_of(fleet.target, Method.MODEL_INFER, INFER_BODY, token=ALICE)
            return bool(code == grpc.StatusCode.UNAUTHENTICATED)

        await in_thread(lambda: wait_until(old_refused, what="the old token refused"))
        await in_thread(lambda: call(fleet.target, Method.MODEL_INFER, INFER_BODY, token=fresh))
        # A file that no longer parses keeps the tokens in force.
        path.write_text("tokens: [{name: x}]\n")
        fleet.gateway.reload()
        await in_thread(lambda: call(fleet.target, Method.MODEL_INFER, INFER_BODY, token=fresh))


async def test_mtls_identities_carry_roles(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    ops, other = pki.client("ops.example"), pki.client("someone.example")
    tls = TlsConfig(pki.server.cert, pki.server.key, pki.ca_file)
    auth = AuthConfig(identities={"ops.example": ("operator",)})
    async with open_fleet(1, tls=tls, auth=auth) as fleet:

        def creds(pair: object) -> grpc.ChannelCredentials:
            chain, key = pair.read()  # type: ignore[attr-defined]
            return grpc.ssl_channel_credentials(
                pki.ca_bytes(), private_key=key, certificate_chain=chain
            )

        status = await in_thread(
            lambda: call(fleet.target, Method.GET_SCHEDULING_STATUS, credentials=creds(ops))
        )
        cpb.GetSchedulingStatusResponse.FromString(status)
        assert (
            await in_thread(
                lambda: code_of(
                    fleet.target, Method.GET_SCHEDULING_STATUS, credentials=creds(other)
                )
            )
            == grpc.StatusCode.UNAUTHENTICATED
        )
        # The certificate's identity has no infer role: the data plane is refused.
        assert (
            await in_thread(
                lambda: code_of(
                    fleet.target, Method.MODEL_INFER, INFER_BODY, credentials=creds(ops)
                )
            )
            == grpc.StatusCode.PERMISSION_DENIED
        )


async def test_operator_actions_are_audited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = standard_tokens(tmp_path / "tokens.yml")
    caplog.set_level(logging.INFO, logger="rsgw.audit")
    async with open_fleet(1, auth=AuthConfig(tokens_file=tokens)) as fleet:
        await in_thread(lambda: call(fleet.target, Method.COMPACT_MEMORY, b"", token=OPS))
        await in_thread(lambda: code_of(fleet.target, Method.COMPACT_MEMORY, b"", token=ALICE))
        await in_thread(lambda: call(fleet.target, Method.MODEL_INFER, INFER_BODY, token=ALICE))
    lines = [r for r in caplog.records if r.name == "rsgw.audit"]
    seen = [(r.principal, r.rpc, r.code) for r in lines]  # type: ignore[attr-defined]
    assert seen == [
        ("token:ops", Method.COMPACT_MEMORY.path, "OK"),
        # Refused before it proved a role: named by what the connection shows.
        (f"uid:{os.geteuid()}", Method.COMPACT_MEMORY.path, "PERMISSION_DENIED"),
    ]


async def test_audit_without_auth_names_the_local_user(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rsgw.audit")
    async with open_fleet(1) as fleet:
        await in_thread(lambda: call(fleet.target, Method.COMPACT_MEMORY))
    (line,) = [r for r in caplog.records if r.name == "rsgw.audit"]
    assert line.principal == f"uid:{os.geteuid()}"  # type: ignore[attr-defined]
    assert line.peer.startswith("127.0.0.1:")  # type: ignore[attr-defined]


def test_a_bad_tokens_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yml"
    write_tokens(path, [{"name": "short", "token": "abc", "roles": ["infer"]}])

    async def start() -> None:
        async with open_fleet(1, auth=AuthConfig(tokens_file=str(path))):
            pass  # pragma: no cover - must not start

    with pytest.raises(BaseException) as caught:
        trio.run(start)
    error = leaf(caught.value)
    assert isinstance(error, ConfigError)
    assert "tokens[0].token must be printable and at least 16 characters" in str(error)


async def test_rsgw_ctl_sends_a_token_and_speaks_tls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rsgw.ctl import main as ctl

    pki = Pki(tmp_path)
    tokens = standard_tokens(tmp_path / "tokens.yml")
    token_file = tmp_path / "ops.token"
    token_file.write_text(OPS + "\n")
    tls = TlsConfig(pki.server.cert, pki.server.key)
    async with open_fleet(1, auth=AuthConfig(tokens_file=tokens), tls=tls) as fleet:
        base = ["--gateway", fleet.target, "--tls-ca", pki.ca_file]
        assert await in_thread(lambda: ctl([*base, "status"])) == 1
        assert "UNAUTHENTICATED" in capsys.readouterr().err
        assert await in_thread(lambda: ctl([*base, "--token-file", str(token_file), "status"])) == 0
        assert "mode: round_robin" in capsys.readouterr().out
        monkeypatch.setenv("RSGW_TOKEN", ALICE)
        assert await in_thread(lambda: ctl([*base, "status"])) == 1
        assert "alice may not call GetSchedulingStatus" in capsys.readouterr().err
        # Cleartext to a TLS gateway fails in one line.
        assert await in_thread(lambda: ctl(["--gateway", fleet.target, "status"])) == 1
        assert "UNAVAILABLE" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl is not installed")
async def test_grpcurl_reaches_the_control_plane_with_an_operator_token(tmp_path: Path) -> None:
    """grpcurl reads server reflection before every call: an operator-only token must
    get through it (reflection is open), and the role still decides the call."""
    tokens = standard_tokens(tmp_path / "tokens.yml")
    async with open_fleet(1, auth=AuthConfig(tokens_file=tokens)) as fleet:

        async def grpcurl(token: str) -> subprocess.CompletedProcess[bytes]:
            method = "reactant_control.GatewayControlService/GetSchedulingStatus"
            header = f"authorization: Bearer {token}"
            return await trio.run_process(
                ["grpcurl", "-plaintext", "-H", header, fleet.target, method],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )

        allowed = await grpcurl(OPS)
        assert allowed.returncode == 0, allowed.stderr
        assert b'"mode"' in allowed.stdout
        refused = await grpcurl(ALICE)
        assert refused.returncode != 0
        assert b"alice may not call GetSchedulingStatus" in refused.stderr
