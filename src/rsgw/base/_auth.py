"""Who may call what: roles, the method table, bearer tokens and mTLS identities.

Pure: no files, no sockets. The gateway's guard (`rsgw.gateway.calls._guard`) reads the
tokens file and asks `Authorizer.authorize` once per call.

Three roles, each a set of methods (`ROLE_OF`):

- `infer`: the data plane (ModelInfer, ModelStreamInfer, metadata, config,
  statistics, the repository index, ModelReady);
- `shm`: shared memory (register, unregister, status; IsSameIPCNamespace);
- `operator`: everything that changes the node for everyone
  (GatewayControlService, ReactantServer's ControlService with CompactMemory,
  model load and unload, TraceSetting, LogSettings).

ServerLive, ServerReady and grpc.health.v1 are open to anyone: load balancers and
the kubelet probe them without credentials, and they reveal nothing but liveness.
So is server reflection: it describes the public protocol, and grpcurl asks it
before every call, whatever role the caller's token has.

Protected mode. With authentication off (no tokens file, no identities), calls
that change the node for everyone (`changes_node`: the operator role's methods
but the ones that only read) are refused to clients that are not on loopback,
PERMISSION_DENIED naming the settings that open them: auth, or
`auth.trusted_network` for a network where every client is trusted. Everything
else stays open, as on the original, so a node's own clients and `rsgw ctl` on the
node keep working. Triton ships model control off; Redis refuses remote clients
while it has no password: the same idea.

A client proves who it is with `authorization: Bearer <token>` metadata (a token
of the tokens file) or, failing that, with its TLS client certificate (an
identity named in `auth.identities`). No proof: UNAUTHENTICATED. Proof without the
method's role: PERMISSION_DENIED. Messages name the method and the role, never a
token.

Tokens are kept as SHA-256 digests, so a tokens file may hold digests only
(`sha256:`) and a leaked file or core dump does not give tokens away; a presented
token is hashed and looked up (a dictionary lookup of a digest; no timing channel
on the token's bytes).
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from google.protobuf.message import DecodeError

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import ConfigError, GrpcError
from rsgw.base._methods import CONTROL, GATEWAY_CONTROL, Method
from rsgw.base._status import StatusCode
from rsgw.base._values import show


class Role(enum.Enum):
    INFER = "infer"
    SHM = "shm"
    OPERATOR = "operator"


ROLES = frozenset(role.value for role in Role)

#: Methods anyone may call (liveness and readiness only).
OPEN_PATHS = frozenset(
    {
        Method.SERVER_LIVE.path,
        Method.SERVER_READY.path,
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.health.v1.Health/List",
        # The protocol's own description (public protos): grpcurl asks it before any
        # call, so an operator-only token must get through it to reach the control plane.
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    }
)

_SHM_METHODS = (
    Method.SHM_STATUS,
    Method.SHM_REGISTER,
    Method.SHM_UNREGISTER,
    Method.CUDA_SHM_STATUS,
    Method.CUDA_SHM_REGISTER,
    Method.CUDA_SHM_UNREGISTER,
    Method.IPC_NAMESPACE,
)
_OPERATOR_METHODS = (
    Method.REPOSITORY_MODEL_LOAD,
    Method.REPOSITORY_MODEL_UNLOAD,
    Method.TRACE_SETTING,
    Method.LOG_SETTINGS,
)


def role_of(path: str) -> Role | None:
    """The role `path` needs; None for the open methods."""
    if path in OPEN_PATHS:
        return None
    if path in _SHM_PATHS:
        return Role.SHM
    if path in _OPERATOR_PATHS or path.startswith(_OPERATOR_PREFIXES):
        return Role.OPERATOR
    return Role.INFER  # the data plane, and paths no one serves (then UNIMPLEMENTED)


#: Operator methods that only read: protected mode leaves them open.
_OPERATOR_READS = frozenset(
    m.path for m in (Method.GET_SCHEDULING_STATUS, Method.MODEL_CONTROL_STATUS)
)
#: Operator methods that read when their request sets nothing, by their request type.
_SETTINGS_REQUESTS: Mapping[str, type[pb.LogSettingsRequest] | type[pb.TraceSettingRequest]] = {
    Method.LOG_SETTINGS.path: pb.LogSettingsRequest,
    Method.TRACE_SETTING.path: pb.TraceSettingRequest,
}
#: The environment variable that turns protected mode off.
TRUSTED_NETWORK_VARIABLE = "REACTANT_GATEWAY_AUTH_TRUSTED_NETWORK"


def changes_node(path: str, request: bytes | None) -> bool:
    """Whether a call of `path` with `request` (None: not at hand) changes the node
    for everyone: an operator method that does not only read. Protected mode keeps
    these to loopback."""
    if role_of(path) is not Role.OPERATOR or path in _OPERATOR_READS:
        return False
    kind = _SETTINGS_REQUESTS.get(path)
    if kind is None or request is None:
        return True
    try:
        return bool(kind.FromString(request).settings)
    except DecodeError:
        return True  # the method answers INVALID_ARGUMENT to the clients it serves


def protected_refusal(path: str, peer: str) -> GrpcError:
    """What a client not on loopback is told in protected mode."""
    return GrpcError(
        StatusCode.PERMISSION_DENIED,
        f"{_method_name(path)} refused to {peer or 'a remote client'}: with no "
        "authentication configured, calls that change the node are taken from loopback "
        "only. Configure auth.tokens_file or auth.identities (docs/security.md), or set "
        f"auth.trusted_network: true ({TRUSTED_NETWORK_VARIABLE}=1) if every client "
        "that can reach this port is trusted",
    )


_SHM_PATHS = frozenset(m.path for m in _SHM_METHODS)
_OPERATOR_PATHS = frozenset(m.path for m in _OPERATOR_METHODS)
_OPERATOR_PREFIXES = (f"/{CONTROL}/", f"/{GATEWAY_CONTROL}/")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call proved to be, how, and what it may do."""

    name: str
    roles: frozenset[Role]
    #: "token" or "certificate".
    via: str

    def __str__(self) -> str:
        return f"{self.via}:{self.name}"


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
#: Shorter tokens are refused in the file: guessable.
MIN_TOKEN_CHARS = 16


def digest(token: str | bytes) -> str:
    """A token's SHA-256, as the tokens file's `sha256:` spells it."""
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).hexdigest()


def parse_roles(value: object, key: str) -> frozenset[Role]:
    """A list of role names; ConfigError naming `key` for anything else."""
    if isinstance(value, str):
        value = [value]
    known = ", ".join(sorted(ROLES))
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(f"{key} must be a non-empty list of roles ({known})")
    roles = set()
    for item in value:
        if item not in ROLES:
            raise ConfigError(f"{key}: unknown role {show(item)} (roles: {known})")
        roles.add(Role(item))
    return frozenset(roles)


def parse_tokens(document: object, source: str) -> Mapping[str, Principal]:
    """The tokens file: token digest -> principal.

    The file (YAML)::

        tokens:
          - name: alice            # who: audit lines, shared memory ownership
            token: "s3cr3t-..."    # or sha256: <64 hex digits of the token's SHA-256>
            roles: [infer, shm]

    Raises:
        ConfigError: naming `source`, the entry and the bad key or value.
    """
    if not isinstance(document, Mapping) or not isinstance(document.get("tokens"), list):
        raise ConfigError(f"{source}: expected a mapping with a `tokens:` list")
    table: dict[str, Principal] = {}
    names: set[str] = set()
    for i, entry in enumerate(document["tokens"]):
        where = f"{source}: tokens[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a mapping with name, token or sha256, roles")
        unknown = set(entry) - {"name", "token", "sha256", "roles"}
        if unknown:
            raise ConfigError(f"{where}: unknown key {show(sorted(map(str, unknown))[0])}")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(
                f"{where}.name must be 1-128 letters, digits or ._@:+- (got {show(name)})"
            )
        if name in names:
            raise ConfigError(f"{where}.name {show(name)} is used twice")
        names.add(name)
        key = _token_digest(entry, where)
        if key in table:
            raise ConfigError(f"{where}: the same token as {table[key].name!r}")
        table[key] = Principal(name, parse_roles(entry.get("roles"), f"{where}.roles"), "token")
    return MappingProxyType(table)


def _token_digest(entry: Mapping[str, object], where: str) -> str:
    token, hashed = entry.get("token"), entry.get("sha256")
    if (token is None) == (hashed is None):
        raise ConfigError(f"{where} needs exactly one of token or sha256")
    if token is not None:
        if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS or not token.isprintable():
            raise ConfigError(
                f"{where}.token must be printable and at least {MIN_TOKEN_CHARS} characters"
            )
        return digest(token)
    if not isinstance(hashed, str) or not _DIGEST.match(hashed.lower()):
        raise ConfigError(f"{where}.sha256 must be 64 hex digits (got {show(hashed)})")
    return hashed.lower()


def parse_identities(value: object, key: str = "auth.identities") -> Mapping[str, frozenset[Role]]:
    """`auth.identities`: certificate identity -> roles."""
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must map certificate identities to lists of roles")
    out: dict[str, frozenset[Role]] = {}
    for name, roles in value.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{key}: identity {show(name)} must be a non-empty string")
        out[name] = parse_roles(roles, f"{key}.{name}")
    return MappingProxyType(out)


def bearer_token(metadata: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The token of `authorization: Bearer <token>` metadata, or None."""
    for name, value in metadata:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return b""  # present but not a bearer token: a failed proof, not an absent one
    return None


class Authorizer:
    """The decision for one call, from an immutable snapshot of tokens and identities.

    A reload builds a new Authorizer and swaps it in; calls in flight finish with
    the one they started with.
    """

    def __init__(
        self,
        tokens: Mapping[str, Principal],
        identities: Mapping[str, frozenset[Role]],
    ) -> None:
        self.tokens = tokens
        self.identities = identities

    def authenticate(self, token: bytes | None, identity: str) -> Principal | None:
        """Who the call proved to be, or None.

        Raises:
            GrpcError: UNAUTHENTICATED for a token that is malformed or unknown (a
                wrong token is never silently downgraded to the certificate).
        """
        if token is not None:
            found = self.tokens.get(digest(token)) if token else None
            if found is None:
                raise GrpcError(StatusCode.UNAUTHENTICATED, "invalid bearer token")
            return found
        if identity and identity in self.identities:
            return Principal(identity, self.identities[identity], "certificate")
        return None

    def authorize(self, path: str, token: bytes | None, identity: str) -> Principal | None:
        """The principal allowed to call `path`; None for an open method called anonymously.

        Raises:
            GrpcError: UNAUTHENTICATED (no or a bad proof) or PERMISSION_DENIED.
        """
        role = role_of(path)
        principal = self.authenticate(token, identity)
        if role is None:
            return principal
        if principal is None:
            raise GrpcError(
                StatusCode.UNAUTHENTICATED,
                f"{_method_name(path)} needs the '{role.value}' role: send "
                "'authorization: Bearer <token>' metadata or a client certificate",
            )
        if role not in principal.roles:
            raise GrpcError(
                StatusCode.PERMISSION_DENIED,
                f"{principal.name} may not call {_method_name(path)}: "
                f"it needs the '{role.value}' role",
            )
        return principal


def _method_name(path: str) -> str:
    return path.rsplit("/", 1)[-1][:64] or "this method"
