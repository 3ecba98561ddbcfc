"""`rsgw ctl` / `tools/gateway_ctl.py`: parsing, requests, rendering, exit statuses.

The pure parts (command line -> command -> request; reply -> text) are plain
table-driven tests. The shell is tested where it can fail without a gateway: a
closed port (UNAVAILABLE) and a real simulated worker, which serves no
GatewayControlService and so answers UNIMPLEMENTED through our own client. Calls
that succeed need the gateway's control service; they belong to the end-to-end
tests.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from rsgw._cli import main as rsgw_main
from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._values import human_bytes
from rsgw.ctl import main
from rsgw.ctl._args import parse_args
from rsgw.ctl._commands import (
    DEFAULT_GATEWAY,
    POLICY_KEYS,
    Command,
    Invocation,
    PolicyValue,
    Repack,
    SetPolicy,
    SetReplicas,
    SetTenant,
    ShowHelp,
    Status,
    UsageError,
    call_for,
)
from rsgw.ctl._main import CallFailed, call_gateway, exit_status, progress, render
from rsgw.ctl._render import (
    NOT_PERSISTED_NOTE,
    format_replicas,
    render_placement,
    render_policy,
    render_repack,
    render_reply,
    render_status,
    render_tenant,
)
from rsgw.scheduling.knobs._knobs import RUNTIME_KNOBS
from tests.helpers import WorkerProcess

TOOL = Path(__file__).resolve().parents[1] / "tools" / "gateway_ctl.py"
SERVICE = b"/reactant_control.GatewayControlService/"


def command(*argv: str) -> Command:
    parsed = parse_args(argv)
    assert isinstance(parsed, Invocation)
    return parsed.command


def usage_error(*argv: str) -> str:
    with pytest.raises(UsageError) as info:
        parse_args(argv)
    assert info.value.usage.startswith("usage: rsgw ctl")
    return info.value.message


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    yield port


# ---------------------------------------------------------------------------
# Parsing


def test_status_and_gateway_flag_anywhere() -> None:
    assert parse_args(["status"]) == Invocation(DEFAULT_GATEWAY, Status())
    assert parse_args(["--gateway", "h:1", "status"]) == Invocation("h:1", Status())
    assert parse_args(["--gateway", "h:1", "status", "--gateway", "[::1]:2"]) == Invocation(
        "[::1]:2", Status()
    )


@pytest.mark.parametrize(
    ("argv", "wait"), [((), 30.0), (("--wait", "2.5"), 2.5), (("--wait", "0"), 0.0)]
)
def test_repack_wait(argv: tuple[str, ...], wait: float) -> None:
    assert command("repack", *argv) == Repack(wait_seconds=wait)


@pytest.mark.parametrize(
    ("text", "wire"),
    [("3", 3), ("all", -1), ("ALL", -1), ("-1", -1), ("default", 0), ("-", 0)],
)
def test_set_replicas_counts(text: str, wire: int) -> None:
    assert command("set-replicas", "resnet", text) == SetReplicas("resnet", wire)


def test_set_replicas_zero_is_refused_not_read_as_default() -> None:
    with pytest.raises(UsageError, match="0 is not a replica count; say default"):
        command("set-replicas", "resnet", "0")


def test_json_flag_before_or_after_the_command() -> None:
    assert parse_args(["--json", "status"]) == Invocation(DEFAULT_GATEWAY, Status(), True)
    assert parse_args(["status", "--json"]) == Invocation(DEFAULT_GATEWAY, Status(), True)
    assert parse_args(["status"]) == Invocation(DEFAULT_GATEWAY, Status(), False)


def test_a_repack_that_did_not_run_in_time_exits_3_and_json_is_protobufs_mapping() -> None:
    late = cpb.RepackResponse(sequence=2, completed=False, waited_seconds=5.0)
    assert exit_status(Repack(wait_seconds=5.0), late) == 3
    assert exit_status(Repack(wait_seconds=0.0), late) == 0  # not waited for: as asked
    assert exit_status(Repack(wait_seconds=5.0), cpb.RepackResponse(completed=True)) == 0
    fields = json.loads(render(Repack(), late, as_json=True))
    assert fields["sequence"] == "2" and fields["completed"] is False
    assert call_for(Repack(wait_seconds=5.0)).progress == "the repack (up to 5 s)"
    assert call_for(Repack(wait_seconds=0.0)).progress == ""


def test_set_replicas_flags() -> None:
    argv = ("set-replicas", "m", "2", "--fill-mode", "inherit", "--fill-factor", "0")
    assert command(*argv, "--allow-unknown") == SetReplicas("m", 2, "inherit", 0.0, True)
    assert command("set-replicas", "m", "all", "--fill-factor", "1.5") == SetReplicas(
        "m", -1, "", 1.5, False
    )


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("rebalance_compute_seconds", "600", 600.0),
        ("first_rebalance_compute_seconds", "60.5", 60.5),
        ("hysteresis", "0.1", 0.1),
        ("ema_halflife_compute_seconds", "0", 0.0),
        ("default_replicas", "all", -1),
        ("default_replicas", "-1", -1),
        ("default_replicas", "3", 3),
        ("routing_policy", "fill_rr", "fill_rr"),
        ("work_basis", "items", "items"),
        ("routing_fill_factor", "2", 2.0),
        ("routing_fill_mode", "spread", "spread"),
        ("compaction_mode", "off", "off"),
        ("compaction_interval", "4", 4),
        ("forbid_memory_oversubscription", "true", True),
        ("forbid_memory_oversubscription", "False", False),
        ("forbid_memory_oversubscription", "1", True),
        ("forbid_memory_oversubscription", "0", False),
        ("forbid_memory_oversubscription", "yes", True),
        ("forbid_memory_oversubscription", "NO", False),
    ],
)
def test_set_policy_coercion(key: str, text: str, value: PolicyValue) -> None:
    parsed = command("set-policy", f"{key}={text}")
    assert parsed == SetPolicy(((key, value),))
    assert isinstance(parsed, SetPolicy)
    assert type(dict(parsed.updates)[key]) is type(value)


def test_set_policy_keeps_the_order_given() -> None:
    parsed = command("set-policy", "work_basis=items", "hysteresis=0.2", "default_replicas=2")
    assert isinstance(parsed, SetPolicy)
    assert parsed.keys == ("work_basis", "hysteresis", "default_replicas")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ((), "no command given"),
        (("frobnicate",), "unknown command 'frobnicate'"),
        (("--bogus", "status"), "unrecognized arguments: --bogus"),
        (("status", "--wait", "3"), "unrecognized arguments: --wait 3"),
        (("repack", "--wait", "soon"), "not a number: 'soon'"),
        (("repack", "--wait", "-1"), "must be >= 0"),
        (("repack", "--wait", "nan"), "not a finite number"),
        (("set-replicas", "m"), "required"),
        (("set-replicas", "m", "-3"), "expected a count >= 1, all or default"),
        (("set-replicas", "m", "two"), "expected a count >= 1, all or default"),
        (("set-replicas", "m", "1", "--fill-mode", "flood"), "invalid choice: 'flood'"),
        (("set-replicas", "m", "1", "--fill-factor", "abc"), "not a number: 'abc'"),
        (("set-replicas", "m", "1", "--fill-factor", "-2"), "must be >= 0"),
        (("set-policy",), "at least one KEY=VALUE"),
        (("set-policy", "hysteresis"), "expected KEY=VALUE"),
        (("set-policy", "hysteresis=x"), "hysteresis: not a number: 'x'"),
        (("set-policy", "compaction_interval=1.5"), "not an integer"),
        (("set-policy", "default_replicas=default"), "a count >= 1 or all"),
        (("set-policy", "forbid_memory_oversubscription=maybe"), "not a boolean"),
        (("set-policy", "hysteresis=0.1", "hysteresis=0.2"), "given twice"),
        (("set-policy", "mode=round_robin"), "cannot be changed at runtime"),
        (("--gateway", "localhost", "status"), "expected HOST:PORT"),
        (("--gateway", "h:99999", "status"), "port must be 1..65535"),
        (("tenant",), "required: NAME"),
        (("tenant", "a", "--priority", "1.5"), "--priority: not an integer: '1.5'"),
        (("tenant", "a", "--rate", "fast"), "--rate: not a number: 'fast'"),
    ],
)
def test_usage_errors(argv: tuple[str, ...], expected: str) -> None:
    assert expected in usage_error(*argv)


def test_unknown_knob_lists_the_accepted_keys() -> None:
    message = usage_error("set-policy", "hysteresis=0.1", "max_batch=4")
    assert "unknown scheduling knob 'max_batch'" in message
    assert message.endswith("accepted keys: " + ", ".join(sorted(POLICY_KEYS)))


@pytest.mark.parametrize(
    "argv", [("-h",), ("--help",), ("status", "-h"), ("repack", "--help"), ("set-policy", "-h")]
)
def test_help(argv: tuple[str, ...]) -> None:
    parsed = parse_args(argv)
    assert isinstance(parsed, ShowHelp)
    assert parsed.text.startswith("usage: rsgw ctl")


# ---------------------------------------------------------------------------
# Requests


def test_calls() -> None:
    status = call_for(Status())
    assert (status.path, status.deadline_seconds) == (SERVICE + b"GetSchedulingStatus", 20.0)
    assert status.response_type is cpb.GetSchedulingStatusResponse

    repack = call_for(Repack(2.5))
    assert (repack.path, repack.deadline_seconds) == (SERVICE + b"Repack", 33.0)
    assert repack.request == cpb.RepackRequest(wait_seconds=2.5)
    assert call_for(Repack(0.0)).deadline_seconds == 30.0

    placement = call_for(SetReplicas("m", -1, "run", 0.0, True))
    assert (placement.path, placement.deadline_seconds) == (SERVICE + b"SetModelPlacement", 20.0)
    assert placement.request == cpb.SetModelPlacementRequest(
        name="m", replicas=-1, fill_mode="run", fill_factor=0.0, allow_unknown_model=True
    )
    unchanged = call_for(SetReplicas("m", 0)).request
    assert isinstance(unchanged, cpb.SetModelPlacementRequest)
    assert (unchanged.fill_mode, unchanged.fill_factor) == ("", -1.0)

    parsed = command("set-policy", "forbid_memory_oversubscription=no", "default_replicas=all")
    policy = call_for(parsed)
    assert policy.path == SERVICE + b"SetSchedulingPolicy"
    request = cpb.SetSchedulingPolicyRequest.FromString(policy.request.SerializeToString())
    assert list(request.update_mask) == ["forbid_memory_oversubscription", "default_replicas"]
    assert request.policy.default_replicas == -1
    assert request.HasField("policy")


# ---------------------------------------------------------------------------
# Rendering

REPACK = cpb.RepackStatus(
    repack_count=3,
    last_trigger="operator",
    last_models_placed=5,
    last_models_moved=2,
    compute_accumulated_seconds=12.34,
    active_threshold_seconds=600,
    first_tick_repack_done=True,
    operator_repacks_requested=2,
    operator_repacks_completed=1,
)
LPT_STATUS = cpb.GetSchedulingStatusResponse(
    mode="lpt_packing",
    policy=cpb.SchedulingPolicy(
        rebalance_compute_seconds=600,
        first_rebalance_compute_seconds=60,
        hysteresis=0.1,
        ema_halflife_compute_seconds=600,
        default_replicas=-1,
        routing_policy="fill_least",
        work_basis="compute",
        routing_fill_factor=1.0,
        routing_fill_mode="run",
        compaction_mode="eager",
        compaction_interval=1,
        forbid_memory_oversubscription=True,
        generation=2,
    ),
    repack=REPACK,
    models=[
        cpb.ModelSchedulingStatus(
            name="resnet",
            configured_replicas=2,
            effective_replicas=2,
            fill_mode="run",
            fill_quantum=8,
            utilization=0.12345,
            cost_seconds=0.005,
            placed=True,
            replicas=[
                cpb.ReplicaPlacement(worker="10.0.0.1:8080", routed_total=10, outstanding=2),
                cpb.ReplicaPlacement(worker="10.0.0.1:8081", routed_total=5),
            ],
        ),
        cpb.ModelSchedulingStatus(name="bert", fill_mode="unknown", drifted=True),
    ],
    workers=[
        cpb.WorkerSchedulingStatus(
            worker="10.0.0.1:8080",
            ready=True,
            models_placed=1,
            inflight_compute=0.25,
            assigned_weight_bytes=3 * 2**30,
            weight_budget_bytes=2 * 2**30,
            oversubscribed=True,
        ),
        cpb.WorkerSchedulingStatus(worker="10.0.0.1:8081"),
    ],
    warnings=["fill mode 'inflight' ... ONE replica ..."],
)

LPT_TEXT = """\
mode: lpt_packing
knobs (generation 2, tuned at runtime):
  rebalance_compute_seconds        600.0
  first_rebalance_compute_seconds  60.0
  hysteresis                       0.1
  ema_halflife_compute_seconds     600.0
  default_replicas                 all
  routing_policy                   fill_least
  work_basis                       compute
  routing_fill_mode                run
  routing_fill_factor              1.0
  compaction                       eager every 1 repack(s)
  forbid_memory_oversubscription   true
repacks: 3 total, last trigger 'operator' (5 models, 2 moved)
  compute since last repack 12.34 of 600.00 GPU-seconds
  first-repack budget armed false
  operator repacks 2 requested, 1 served
models:
  name    cfg  eff  fill     quant  util    cost    placement
  resnet  2    2    run      8      0.1235  0.0050  10.0.0.1:8080 10req/2it  10.0.0.1:8081 5req/0it
  bert    -    0    unknown  0      0.0000  0.0000  - [unplaced] [drifted]
workers:
  worker         ready  models  in-flight  weights  budget
  10.0.0.1:8080  true   1       0.250      3.0 GiB  2.0 GiB  OVERSUBSCRIBED
  10.0.0.1:8081  false  0       0.000      0 B      -
  warning: fill mode 'inflight' ... ONE replica ..."""


def test_render_lpt_status() -> None:
    assert render_status(LPT_STATUS) == LPT_TEXT


def test_render_status_says_how_a_coordinated_gateway_stands() -> None:
    status = cpb.GetSchedulingStatusResponse(mode="lpt_packing")
    status.coordination.CopyFrom(
        cpb.Coordination(
            state="follower",
            member="gw-b",
            placer="gw-a",
            epoch=42,
            members=["gw-a", "gw-b"],
            seconds_since_contact=0.4,
            etcd_endpoints=["etcd:2379"],
        )
    )
    assert render_status(status).splitlines()[:4] == [
        "mode: lpt_packing",
        "coordination: gw-b, follower of gw-a",
        "  epoch: 42  gateways: gw-a, gw-b",
        "  etcd: etcd:2379, last answered 0.4 s ago",
    ]
    status.coordination.state = "disconnected"
    status.coordination.last_error = "no etcd endpoint answered"
    assert "coordination: gw-b, disconnected: no etcd endpoint answered" in render_status(status)


def test_render_status_as_configured_and_empty() -> None:
    status = cpb.GetSchedulingStatusResponse(
        mode="lpt_packing", policy=cpb.SchedulingPolicy(generation=0), repack=cpb.RepackStatus()
    )
    lines = render_status(status).splitlines()
    assert "knobs (as configured):" in lines
    assert "  first-repack budget armed true" in lines
    assert lines[-2:] == ["models: none", "workers: none"]


@pytest.mark.parametrize("mode", ["round_robin", "least_outstanding"])
def test_render_status_without_knobs(mode: str) -> None:
    text = render_status(cpb.GetSchedulingStatusResponse(mode=mode))
    assert text == f"mode: {mode}\n(this scheduling mode has no runtime knobs)"


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (512 * 2**20, "512.0 MiB"),
        (2**50, "1.0 PiB"),
    ],
)
def test_human_bytes(count: int, text: str) -> None:
    assert human_bytes(count) == text


@pytest.mark.parametrize(("wire", "text"), [(-1, "all"), (0, "-"), (1, "1"), (4, "4")])
def test_format_replicas(wire: int, text: str) -> None:
    assert format_replicas(wire) == text


def test_render_repack() -> None:
    done = cpb.RepackResponse(sequence=4, completed=True, waited_seconds=0.123, repack=REPACK)
    assert render_repack(done) == (
        "repack 4 completed in 0.12s\n"
        "  now 3 repack(s) total, last trigger 'operator', 2 model(s) moved"
    )
    queued = cpb.RepackResponse(
        sequence=5, waited_seconds=120, repack=REPACK, warnings=["wait_seconds clamped"]
    )
    assert render_repack(queued).splitlines() == [
        "repack 5 queued (not observed within 120.00s)",
        "  now 3 repack(s) total, last trigger 'operator', 2 model(s) moved",
        "  warning: wait_seconds clamped",
    ]


def test_render_placement_and_policy() -> None:
    placement = cpb.SetModelPlacementResponse(
        name="m", configured_replicas=-1, effective_replicas=4, fill_mode="spread", fill_quantum=8
    )
    placement.warnings.append("takes effect at the next repack")
    assert render_placement(placement).splitlines() == [
        "m: replicas all (effective 4), fill spread quantum 8",
        "  warning: takes effect at the next repack",
        NOT_PERSISTED_NOTE,
    ]
    placement.persisted = True
    assert NOT_PERSISTED_NOTE not in render_placement(placement)

    reply = cpb.SetSchedulingPolicyResponse(applied=cpb.SchedulingPolicy(generation=7))
    assert render_policy(("hysteresis", "work_basis"), reply).splitlines() == [
        "applied hysteresis, work_basis (generation 7)",
        NOT_PERSISTED_NOTE,
    ]
    parsed = command("set-policy", "hysteresis=0.2")
    assert render_reply(parsed, reply).startswith("applied hysteresis (generation 7)")
    assert render_reply(Status(), LPT_STATUS) == LPT_TEXT


def test_tenant_sends_the_fields_given_and_renders_the_policy_in_force() -> None:
    parsed = command("tenant", "team-a", "--max-concurrent", "3", "--weight", "2")
    assert parsed == SetTenant("team-a", (("weight", 2.0), ("max_concurrent", 3)))
    call = call_for(parsed)
    assert call.path == SERVICE + b"SetTenantPolicy"
    assert isinstance(call.request, cpb.SetTenantPolicyRequest)
    assert list(call.request.update_mask) == ["weight", "max_concurrent"]
    assert (call.request.policy.weight, call.request.policy.max_concurrent) == (2.0, 3)
    reply = cpb.SetTenantPolicyResponse(
        tenant="team-a",
        applied=cpb.TenantPolicy(weight=2, max_concurrent=3, rate=0.5),
        warnings=["counted as _other_"],
    )
    assert render_reply(parsed, reply).splitlines() == [
        "applied weight, max_concurrent: tenant 'team-a' weight 2, priority the default, "
        "quota 0.5/s burst 1, 3 at once",
        "  warning: counted as _other_",
        "note: runtime changes are not persisted; a reload (SIGHUP) or a restart reverts to "
        "gateway.yml's tenancy block",
    ]
    shown = render_tenant(SetTenant("b"), cpb.SetTenantPolicyResponse(tenant="b", applied={}))
    assert shown == "tenant 'b' weight 0, priority the default, quota none"


def test_render_status_shows_each_tenants_share_and_use() -> None:
    status = cpb.GetSchedulingStatusResponse(
        mode="round_robin",
        tenancy=cpb.TenancyStatus(
            header="x-tenant-id",
            priority_levels=3,
            default_priority=2,
            default=cpb.TenantPolicy(rate=10),
            tenants=[
                cpb.TenantStatus(
                    tenant="live",
                    listed=True,
                    policy=cpb.TenantPolicy(weight=3, priority=1, max_concurrent=4),
                    inflight=2,
                    admitted=90,
                    refused=1,
                    share=0.75,
                ),
                cpb.TenantStatus(
                    tenant="_other_",
                    policy=cpb.TenantPolicy(weight=1, rate=10),
                    admitted=5,
                    over_quota=7,
                    share=0.25,
                ),
            ],
        ),
    )
    assert render_status(status).splitlines()[2:] == [
        "tenancy: tenant from header x-tenant-id; priorities 3 levels, default 2; "
        "default quota 10/s burst 10",
        "  tenant     weight  share  priority  quota          calls  admitted  refused",
        "  live       3       0.75   1         4 at once      2      90        1 + 0 over quota",
        "  _other_ *  1       0.25   2         10/s burst 10  0      5         0 + 7 over quota",
        "  (* not listed: the default quota applies)",
    ]


# ---------------------------------------------------------------------------
# The shell: exit statuses and the one error line


def test_main_usage_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "usage: rsgw ctl [-h] [--gateway HOST:PORT] COMMAND ...",
        "rsgw ctl: error: no command given",
    ]
    assert main(["--help"]) == 0
    assert "set-policy KEY=VALUE" in capsys.readouterr().out
    assert rsgw_main(["ctl", "set-policy", "nope=1"]) == 2
    assert "accepted keys:" in capsys.readouterr().err


async def test_call_gateway_closed_port(closed_port: int) -> None:
    with pytest.raises(CallFailed) as info:
        await call_gateway(f"127.0.0.1:{closed_port}", call_for(Status()))
    assert info.value.code == "UNAVAILABLE"


def test_main_against_a_server_without_the_service(
    worker_process: WorkerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real rsgw server that is not a gateway: our client reports its status, exit 1."""
    assert main(["--gateway", worker_process.target, "repack", "--wait", "0"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"error: UNIMPLEMENTED: unknown method {SERVICE.decode()}Repack "
        f"(from {worker_process.target})\n"
    )


PROGRAMS = {
    "rsgw ctl": (sys.executable, "-m", "rsgw", "ctl"),
    "gateway_ctl": (sys.executable, str(TOOL)),
}


def run(program: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PROGRAMS[program], *argv], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("program", PROGRAMS)
def test_program_exit_statuses(program: str, closed_port: int) -> None:
    done = run(program)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"usage: {program} ")
    assert f"{program}: error: no command given" in done.stderr

    done = run(program, "--help")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"usage: {program} ")

    done = run(program, "status", "--frobnicate")
    assert done.returncode == 2
    assert "unrecognized arguments: --frobnicate" in done.stderr

    target = f"127.0.0.1:{closed_port}"
    done = run(program, "--gateway", target, "status")
    assert (done.returncode, done.stdout) == (1, "")
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("error: UNAVAILABLE: cannot connect to ")
    assert done.stderr.endswith(
        "is a gateway running there? (rsgw run or rsgw node; --gateway HOST:PORT) "
        f"(from {target})\n"
    )
    assert "Traceback" not in done.stderr


def test_set_policy_accepts_exactly_the_gateways_runtime_knobs() -> None:
    """The CLI's own table of value readers must not drift from the gateway's."""
    assert set(POLICY_KEYS) == RUNTIME_KNOBS


async def test_a_long_wait_says_so_every_few_seconds(
    autojump_clock: MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    with trio.move_on_after(11.0):
        await progress("the repack (up to 30 s)")
    assert capsys.readouterr().err.splitlines() == [
        "still waiting for the repack (up to 30 s): 5 s",
        "still waiting for the repack (up to 30 s): 10 s",
    ]


def test_a_wrong_gateway_address_gets_a_hint() -> None:
    """Issue 40: the two ways a newcomer points `rsgw ctl` at the wrong place."""
    from rsgw.ctl._main import hint

    assert "is a gateway running there?" in hint("cannot connect to h:1: refused")
    assert "not a gRPC port (the REST or metrics port?)" in hint("h:8000 answered HTTP 404")
    assert hint("model 'x' not found") == ""
