"""The pure auth core: the role of every method, the tokens file, the decision."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._auth import (
    Authorizer,
    Principal,
    Role,
    bearer_token,
    changes_node,
    digest,
    parse_identities,
    parse_tokens,
    role_of,
)
from rsgw.base._errors import ConfigError, GrpcError
from rsgw.base._methods import Method
from rsgw.base._status import StatusCode

OPEN = {Method.SERVER_LIVE, Method.SERVER_READY}
SHM = {
    Method.SHM_STATUS,
    Method.SHM_REGISTER,
    Method.SHM_UNREGISTER,
    Method.CUDA_SHM_STATUS,
    Method.CUDA_SHM_REGISTER,
    Method.CUDA_SHM_UNREGISTER,
    Method.IPC_NAMESPACE,
}
OPERATOR = {
    Method.REPOSITORY_MODEL_LOAD,
    Method.REPOSITORY_MODEL_UNLOAD,
    Method.TRACE_SETTING,
    Method.LOG_SETTINGS,
    Method.MODEL_CONTROL_STATUS,
    Method.SET_MODEL_RESIDENCY,
    Method.SET_MODEL_POLICY,
    Method.COMPACT_MEMORY,
    Method.GET_SCHEDULING_STATUS,
    Method.SET_SCHEDULING_POLICY,
    Method.SET_MODEL_PLACEMENT,
    Method.REPACK,
    Method.ADD_WORKER,
    Method.REMOVE_WORKER,
    Method.SET_TENANT_POLICY,
}


@pytest.mark.parametrize("method", list(Method), ids=lambda m: m.rpc)
def test_every_method_has_the_documented_role(method: Method) -> None:
    expected = (
        None
        if method in OPEN
        else Role.SHM
        if method in SHM
        else Role.OPERATOR
        if method in OPERATOR
        else Role.INFER
    )
    assert role_of(method.path) is expected


def test_health_and_reflection_are_open() -> None:
    assert role_of("/grpc.health.v1.Health/Check") is None
    assert role_of("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo") is None
    assert role_of("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is None
    assert role_of("/grpc.reflection.v1.ServerReflection/Other") is Role.INFER


TOKEN = "a-long-enough-token-0001"
TABLE = parse_tokens(
    {
        "tokens": [
            {"name": "alice", "token": TOKEN, "roles": ["infer"]},
            {"name": "ops", "sha256": digest("ops-token-long-enough"), "roles": "operator"},
        ]
    },
    "tokens.yml",
)


def test_tokens_are_kept_as_digests() -> None:
    assert set(TABLE) == {digest(TOKEN), digest("ops-token-long-enough")}
    assert TABLE[digest(TOKEN)] == Principal("alice", frozenset({Role.INFER}), "token")


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ([], "expected a mapping with a `tokens:` list"),
        ({"tokens": [3]}, "tokens[0] must be a mapping"),
        ({"tokens": [{"name": "a", "roles": ["infer"]}]}, "exactly one of token or sha256"),
        ({"tokens": [{"name": "a", "token": "short", "roles": ["infer"]}]}, "at least 16"),
        ({"tokens": [{"name": "a", "sha256": "zz", "roles": ["infer"]}]}, "64 hex digits"),
        ({"tokens": [{"name": "a b", "token": TOKEN, "roles": ["infer"]}]}, "tokens[0].name"),
        ({"tokens": [{"name": "a", "token": TOKEN, "roles": ["root"]}]}, "unknown role 'root'"),
        ({"tokens": [{"name": "a", "token": TOKEN, "roles": []}]}, "non-empty list of roles"),
        ({"tokens": [{"name": "a", "token": TOKEN, "roles": ["infer"], "x": 1}]}, "unknown key"),
        (
            {
                "tokens": [
                    {"name": "a", "token": TOKEN, "roles": ["infer"]},
                    {"name": "a", "token": TOKEN + "x", "roles": ["infer"]},
                ]
            },
            "used twice",
        ),
        (
            {
                "tokens": [
                    {"name": "a", "token": TOKEN, "roles": ["infer"]},
                    {"name": "b", "token": TOKEN, "roles": ["infer"]},
                ]
            },
            "the same token as 'a'",
        ),
    ],
)
def test_bad_tokens_files_name_the_entry(document: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_tokens(document, "tokens.yml")
    assert str(caught.value).startswith("tokens.yml")
    assert fragment in str(caught.value)
    assert TOKEN not in str(caught.value)  # a token never reaches a message


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((), None),
        (((b"authorization", b"Bearer abc"),), b"abc"),
        (((b"authorization", b"bearer   abc "),), b"abc"),
        (((b"authorization", b"Basic abc"),), b""),
        (((b"authorization", b"Bearer"),), b""),
        (((b"x-other", b"Bearer abc"),), None),
    ],
)
def test_bearer_token(metadata: tuple[tuple[bytes, bytes], ...], expected: bytes | None) -> None:
    assert bearer_token(metadata) == expected


AUTHORIZER = Authorizer(TABLE, parse_identities({"ops.example": ["operator", "shm"]}))


def test_decisions() -> None:
    infer, repack = Method.MODEL_INFER.path, Method.REPACK.path
    assert AUTHORIZER.authorize(infer, TOKEN.encode(), "").name == "alice"  # type: ignore[union-attr]
    assert AUTHORIZER.authorize(Method.SERVER_LIVE.path, None, "") is None
    assert AUTHORIZER.authorize(repack, None, "ops.example").via == "certificate"  # type: ignore[union-attr]
    for path, token, identity, code in [
        (infer, None, "", StatusCode.UNAUTHENTICATED),
        (infer, b"wrong", "ops.example", StatusCode.UNAUTHENTICATED),  # no silent fallback
        (infer, None, "stranger.example", StatusCode.UNAUTHENTICATED),
        (repack, TOKEN.encode(), "", StatusCode.PERMISSION_DENIED),
        (infer, None, "ops.example", StatusCode.PERMISSION_DENIED),
    ]:
        with pytest.raises(GrpcError) as caught:
            AUTHORIZER.authorize(path, token, identity)
        assert caught.value.code is code


@given(
    path=st.sampled_from([m.path for m in Method] + ["/x/y", ""]),
    token=st.none() | st.binary(max_size=40) | st.just(TOKEN.encode()),
    identity=st.sampled_from(["", "ops.example", "x"]),
)
def test_authorize_allows_or_refuses_with_an_auth_status(
    path: str, token: bytes | None, identity: str
) -> None:
    try:
        principal = AUTHORIZER.authorize(path, token, identity)
    except GrpcError as exc:
        assert exc.code in (StatusCode.UNAUTHENTICATED, StatusCode.PERMISSION_DENIED)
        return
    role = role_of(path)
    assert role is None or (principal is not None and role in principal.roles)


def test_changes_node_is_every_operator_call_but_the_reads() -> None:
    update = pb.LogSettingsRequest(
        settings={"log_info": pb.LogSettingsRequest.SettingValue(bool_param=True)}
    ).SerializeToString()
    trace = pb.TraceSettingRequest(
        settings={"trace_level": pb.TraceSettingRequest.SettingValue(value=["TIMESTAMPS"])}
    ).SerializeToString()
    assert changes_node(Method.REPACK.path, b"")
    assert changes_node(Method.ADD_WORKER.path, b"")
    assert changes_node(Method.COMPACT_MEMORY.path, b"")
    assert changes_node(Method.REPOSITORY_MODEL_UNLOAD.path, b"")
    assert changes_node(Method.LOG_SETTINGS.path, update)
    assert changes_node(Method.TRACE_SETTING.path, trace)
    assert changes_node(Method.LOG_SETTINGS.path, b"\xff")  # does not parse: not a read
    assert changes_node(Method.LOG_SETTINGS.path, None)  # not at hand: not a read
    assert not changes_node(Method.LOG_SETTINGS.path, b"")
    assert not changes_node(Method.TRACE_SETTING.path, b"\x12\x06simple")  # model_name only
    assert not changes_node(Method.GET_SCHEDULING_STATUS.path, b"")
    assert not changes_node(Method.MODEL_CONTROL_STATUS.path, b"")
    assert not changes_node(Method.MODEL_INFER.path, b"")
    assert not changes_node(Method.SHM_REGISTER.path, b"")
