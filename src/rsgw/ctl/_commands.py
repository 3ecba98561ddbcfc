"""What an operator asked for, and the gateway call that does it.

Pure: no trio, no sockets, no clock. `rsgw.ctl._args` turns a command line into
one of the command dataclasses here; `call_for` turns a command into the
GatewayControlService method, request message, reply type and deadline, so the
shell only has to send bytes and the tests can check every request without a
gateway.

Values are coerced here, not validated: the gateway checks every knob with the
same validators as gateway.yml (docs/original.md §2.8, §3.3) and answers with the
same messages, so a second copy of those rules here could only drift from them.
What we do refuse locally is what the gateway could never read as meant: a
number that does not parse, an unknown knob name, a knob given twice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, TypeAlias

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._methods import GATEWAY_CONTROL
from rsgw.scheduling.knobs._policy import STARTUP_ONLY

if TYPE_CHECKING:
    from google.protobuf.message import Message

#: Where the gateway answers gRPC (`listen.grpc`, docs/configuration.md), dialled locally.
DEFAULT_GATEWAY: Final = "127.0.0.1:8001"
#: docs/original.md §7: the original's repack wait when `--wait` is not given.
DEFAULT_REPACK_WAIT_SECONDS: Final = 30.0
#: docs/original.md §7: the deadline of every call but Repack.
CALL_DEADLINE_SECONDS: Final = 20.0
#: docs/original.md §7: Repack's deadline is ceil(wait) plus this much.
REPACK_DEADLINE_SLACK_SECONDS: Final = 30.0


#: A knob's value once coerced; `SchedulingPolicy` holds each kind.
PolicyValue: TypeAlias = float | int | str | bool


class UsageError(Exception):
    """A command line we cannot turn into a call: the CLI prints it with usage, exit 2."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.message = message
        #: The usage text of the (sub)command that failed, so the reader sees what fits.
        self.usage = usage


# ---------------------------------------------------------------------------
# Commands.


@dataclass(frozen=True, slots=True)
class Status:
    """`status`: GetSchedulingStatus."""


@dataclass(frozen=True, slots=True)
class Repack:
    """`repack [--wait S]`: ask for a repack and wait up to `wait_seconds` for it to run."""

    wait_seconds: float = DEFAULT_REPACK_WAIT_SECONDS


@dataclass(frozen=True, slots=True)
class SetReplicas:
    """`set-replicas MODEL N|all|default|-`: one model's placement override.

    Fields are in wire form: `replicas` -1 is every worker and 0 inherits
    `default_replicas`; `fill_mode` "" keeps the current override; `fill_factor`
    below 0 keeps it, 0 clears it.
    """

    model: str
    replicas: int
    fill_mode: str = ""
    fill_factor: float = -1.0
    allow_unknown: bool = False


@dataclass(frozen=True, slots=True)
class SetPolicy:
    """`set-policy K=V ...`: the knobs to change, in the order given, values coerced."""

    updates: tuple[tuple[str, PolicyValue], ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.updates)


@dataclass(frozen=True, slots=True)
class AddWorker:
    """`add-worker HOST:PORT [--metrics HOST:PORT] [--name NAME]`: a worker joins the
    running gateway."""

    address: str
    name: str = ""
    metrics: str = ""


@dataclass(frozen=True, slots=True)
class RemoveWorker:
    """`remove-worker HOST:PORT|NAME [--drain-seconds S]`: a worker leaves, drained
    first (0: the gateway's shutdown grace)."""

    worker: str
    drain_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class SetTenant:
    """`tenant NAME [--weight W] [--priority P] [--rate R] [--burst B] [--max-concurrent N]`:
    the fields given, in wire form (0: none, or the default); none given asks for the
    tenant's policy in force."""

    tenant: str
    updates: tuple[tuple[str, float | int], ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.updates)


Command: TypeAlias = (
    Status | Repack | SetReplicas | SetPolicy | AddWorker | RemoveWorker | SetTenant
)


@dataclass(frozen=True, slots=True)
class Access:
    """How to reach a gateway that asks for TLS or a token (docs/security.md)."""

    #: The bearer token (from --token-file or RSGW_TOKEN), or "".
    token: str = ""
    #: Speak TLS, trusting this CA (PEM); "" = cleartext.
    tls_ca: str = ""
    #: A client certificate and its key, for mTLS.
    tls_cert: str = ""
    tls_key: str = ""


@dataclass(frozen=True, slots=True)
class Invocation:
    """A parsed command line: which gateway to ask, and what, and how to get in."""

    gateway: str
    command: Command
    #: Print the reply as JSON (protobuf's JSON mapping, proto field names).
    json: bool = False
    access: Access = field(default_factory=Access)


@dataclass(frozen=True, slots=True)
class ShowHelp:
    """`-h/--help` somewhere on the line: print `text` and exit 0."""

    text: str


# ---------------------------------------------------------------------------
# Coercions: text -> value, raising UsageError with a message that names the input.


def parse_float(text: str, what: str) -> float:
    """A finite number; `nan` and `inf` parse as floats but mean nothing to the gateway."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{what}: not a number: {text!r}") from None
    if not math.isfinite(value):
        raise UsageError(f"{what}: not a finite number: {text!r}")
    return value


def parse_int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{what}: not an integer: {text!r}") from None


_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no"})


def parse_bool(text: str, what: str) -> bool:
    """true/false, 1/0, yes/no, in any case: how operators write booleans in shells."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise UsageError(f"{what}: not a boolean: {text!r} (say true/false, 1/0 or yes/no)")


def parse_replicas(text: str, what: str = "replicas") -> int:
    """A model's replica count in wire form: N > 0, `all`/-1 -> -1, `default`/`-` -> 0."""
    lowered = text.strip().lower()
    if lowered in ("all", "-1"):
        return -1
    if lowered in ("default", "-"):
        return 0
    value = _whole_number(text)
    if value == 0:
        # 0 is the wire's "inherit": say so rather than read it silently as that.
        raise UsageError(
            f"{what}: 0 is not a replica count; say default (or -) to inherit "
            "default_replicas, or a count >= 1"
        )
    if value is None or value < 0:
        raise UsageError(f"{what}: expected a count >= 1, all or default, got {text!r}")
    return value


def parse_default_replicas(text: str, what: str = "default_replicas") -> int:
    """The fleet default in wire form: N (sent as given) or `all`/-1 -> -1.

    `default` has no meaning for the default itself, so it is refused here; 0 and
    other bad counts go to the gateway, whose validator words the error as
    gateway.yml's does.
    """
    if text.strip().lower() in ("all", "-1"):
        return -1
    value = _whole_number(text)
    if value is None:
        raise UsageError(f"{what}: expected a count >= 1 or all, got {text!r}")
    return value


def _whole_number(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _parse_str(text: str, what: str) -> str:
    return text


#: set-policy's knobs and how each value is read (docs/original.md §7); the order is the
#: reference's, the order `status` lists them in.
POLICY_KEYS: Final[Mapping[str, Callable[[str, str], PolicyValue]]] = MappingProxyType(
    {
        "rebalance_compute_seconds": parse_float,
        "first_rebalance_compute_seconds": parse_float,
        "hysteresis": parse_float,
        "ema_halflife_compute_seconds": parse_float,
        "default_replicas": parse_default_replicas,
        "routing_policy": _parse_str,
        "work_basis": _parse_str,
        "routing_fill_factor": parse_float,
        "routing_fill_mode": _parse_str,
        "compaction_mode": _parse_str,
        "compaction_interval": parse_int,
        "forbid_memory_oversubscription": parse_bool,
    }
)

#: Settings the gateway reads once at start-up (the gateway's own table, docs/original.md
#: §2.8); naming one in set-policy gets the gateway's advice without a round trip.
STARTUP_ONLY_KEYS: Final = frozenset(STARTUP_ONLY)


def parse_policy_updates(pairs: list[str]) -> tuple[tuple[str, PolicyValue], ...]:
    """`["hysteresis=0.1", ...]` -> `(("hysteresis", 0.1), ...)`, in the order given.

    Raises:
        UsageError: no pair, a pair without `=`, an unknown or start-up-only knob
            (the message lists the accepted ones), a knob given twice, or a value
            its knob cannot read.
    """
    if not pairs:
        raise UsageError("set-policy needs at least one KEY=VALUE")
    updates: dict[str, PolicyValue] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"expected KEY=VALUE, got {pair!r}")
        coerce = POLICY_KEYS.get(key)
        if coerce is None:
            accepted = ", ".join(sorted(POLICY_KEYS))
            if key in STARTUP_ONLY_KEYS:
                raise UsageError(
                    f"'{key}' cannot be changed at runtime; change it in gateway.yml and "
                    f"restart (accepted keys: {accepted})"
                )
            raise UsageError(f"unknown scheduling knob '{key}'; accepted keys: {accepted}")
        if key in updates:
            raise UsageError(f"'{key}' is given twice")
        updates[key] = coerce(text, key)
    return tuple(updates.items())


# ---------------------------------------------------------------------------
# Calls.


@dataclass(frozen=True, slots=True)
class Call:
    """One unary GatewayControlService call: what to send, what comes back, how long to wait."""

    path: bytes
    request: Message
    response_type: type[Message]
    deadline_seconds: float
    #: What the operator waits for, when the call may take a while ("" : say nothing).
    progress: str = ""


def call_for(command: Command) -> Call:
    """The GatewayControlService call that carries out `command`."""
    if isinstance(command, Status):
        return _call(
            "GetSchedulingStatus",
            cpb.GetSchedulingStatusRequest(),
            cpb.GetSchedulingStatusResponse,
        )
    if isinstance(command, Repack):
        # The gateway may wait up to wait_seconds before it answers; give it that plus slack.
        deadline = math.ceil(command.wait_seconds) + REPACK_DEADLINE_SLACK_SECONDS
        request = cpb.RepackRequest(wait_seconds=command.wait_seconds)
        call = _call("Repack", request, cpb.RepackResponse, deadline)
        if command.wait_seconds > 0:
            wait = f"{command.wait_seconds:g}"
            call = dataclasses.replace(call, progress=f"the repack (up to {wait} s)")
        return call
    if isinstance(command, AddWorker):
        add = cpb.AddWorkerRequest(
            address=command.address, name=command.name, metrics=command.metrics
        )
        return _call("AddWorker", add, cpb.AddWorkerResponse)
    if isinstance(command, RemoveWorker):
        # The gateway answers once the worker has drained: the drain plus slack.
        drain = command.drain_seconds or CALL_DEADLINE_SECONDS
        remove = cpb.RemoveWorkerRequest(worker=command.worker, drain_seconds=command.drain_seconds)
        call = _call(
            "RemoveWorker",
            remove,
            cpb.RemoveWorkerResponse,
            math.ceil(drain) + REPACK_DEADLINE_SLACK_SECONDS,
        )
        return dataclasses.replace(call, progress=f"{command.worker} to drain")
    if isinstance(command, SetReplicas):
        placement = cpb.SetModelPlacementRequest(
            name=command.model,
            replicas=command.replicas,
            fill_mode=command.fill_mode,
            fill_factor=command.fill_factor,
            allow_unknown_model=command.allow_unknown,
        )
        return _call("SetModelPlacement", placement, cpb.SetModelPlacementResponse)
    if isinstance(command, SetTenant):
        values = cpb.TenantPolicy()
        for key, number in command.updates:
            setattr(values, key, number)
        tenant = cpb.SetTenantPolicyRequest(
            tenant=command.tenant, update_mask=command.keys, policy=values
        )
        return _call("SetTenantPolicy", tenant, cpb.SetTenantPolicyResponse)
    policy = cpb.SchedulingPolicy()
    for key, value in command.updates:
        setattr(policy, key, value)
    request_policy = cpb.SetSchedulingPolicyRequest(update_mask=command.keys, policy=policy)
    return _call("SetSchedulingPolicy", request_policy, cpb.SetSchedulingPolicyResponse)


def _call(
    method: str,
    request: Message,
    response_type: type[Message],
    deadline_seconds: float = CALL_DEADLINE_SECONDS,
) -> Call:
    return Call(f"/{GATEWAY_CONTROL}/{method}".encode(), request, response_type, deadline_seconds)
