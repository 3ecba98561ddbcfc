"""GatewayControlService and `rsgw ctl` against a live gateway (issue 9).

Two kinds of test. Those about what the RPCs do (retune, place, report the work
basis) run on memory streams with the autojump clock (`open_fleet(memory=True)`):
they drive the service through `rsgw ctl`'s own pure parts (`parse_args` ->
`call_for` -> rsgw's Channel over the fleet's network -> `render_reply`, or
`format_error` for the one line a failure prints), so the operator's text is
still checked, and the traffic and the 600 ms batches they wait on cost no wall
time. Those about what only a real client or a real process shows stay on
loopback TCP with the real clock: a grpcio client generated from the .proto alone,
in its own process (the wire contract, independent of rsgw's code), and `rsgw ctl`
as a subprocess (argument parsing, exit statuses, the one stderr line, dialing a
real socket, and a gateway that is gone).
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import numpy as np
import pytest
import trio
from trio.testing import MockClock

from rsgw.base._errors import RsgwError
from rsgw.base._status import StatusCode
from rsgw.ctl._args import parse_args
from rsgw.ctl._commands import Invocation, call_for
from rsgw.ctl._render import format_error, render_reply
from rsgw.scheduling.knobs._knobs import SchedulingMode
from rsgw.scheduling.knobs._settings import SchedulingConfig
from tests.gateway.fleet import Fleet, open_fleet
from tests.gateway.test_lpt_packing import NAMES, catalogue, exposition, lpt, samples, send
from tests.helpers import catalogue_from_yaml, infer_request

ROOT = Path(__file__).resolve().parents[2]

SLOW = """
models:
  - name: slow
    max_batch_size: 64
    launch_ms: 600
    item_ms: 0
    inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
    outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
"""


@pytest.fixture(scope="session")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of Python stubs generated from proto/reactant_control_v1.proto alone.

    They are only imported by a separate client process, so they never meet rsgw's
    own modules (or the default descriptor pool of this test process).
    """
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "reactant_control_v1.proto",
        ],
        check=True,
    )
    (out / "client.py").write_text(STUB_CLIENT)
    return out


#: Drives the four RPCs with the generated stubs and prints what came back, as JSON.
STUB_CLIENT = """
import json, sys
import grpc
from google.protobuf.json_format import MessageToDict
import reactant_control_v1_pb2 as pb
import reactant_control_v1_pb2_grpc as rpc

results = []
with grpc.insecure_channel(sys.argv[1]) as channel:
    stub = rpc.GatewayControlServiceStub(channel)
    calls = [
        (stub.GetSchedulingStatus, pb.GetSchedulingStatusRequest()),
        (stub.SetSchedulingPolicy, pb.SetSchedulingPolicyRequest(
            update_mask=["hysteresis"], policy=pb.SchedulingPolicy(hysteresis=0.2))),
        (stub.SetModelPlacement, pb.SetModelPlacementRequest(name="alpha", replicas=2)),
        (stub.Repack, pb.RepackRequest(wait_seconds=20)),
    ] + [
        (stub.SetSchedulingPolicy, pb.SetSchedulingPolicyRequest(
            update_mask=[name], policy=pb.SchedulingPolicy()))
        for name in ("no_such_knob", "mode", "max_worker_share")
    ]
    for method, request in calls:
        try:
            reply = method(request, timeout=30)
            results.append(MessageToDict(reply, preserving_proto_field_name=True))
        except grpc.RpcError as exc:
            results.append({"code": exc.code().name, "details": exc.details()})
print(json.dumps(results))
"""


async def ctl(fleet: Fleet | int, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`rsgw ctl *args` as a subprocess against a gateway on loopback TCP."""
    port = fleet if isinstance(fleet, int) else fleet.gateway.grpc_port
    return await trio.run_process(
        [sys.executable, "-m", "rsgw", "ctl", "--gateway", f"127.0.0.1:{port}", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


def lpt_fleet(*, memory: bool = False, **knobs: object) -> AbstractAsyncContextManager[Fleet]:
    return open_fleet(3, memory=memory, catalogues=[catalogue()] * 3, scheduling=lpt(**knobs))


class CtlFailed(Exception):
    """A call `ctl_in_memory` made that failed: the error and the line `rsgw ctl` prints."""

    def __init__(self, error: RsgwError, line: str) -> None:
        super().__init__(line)
        self.error = error
        self.line = line


async def ctl_in_memory(fleet: Fleet, *args: str) -> str:
    """What `rsgw ctl *args` prints, with the call made in process over the fleet's network.

    The same steps as `rsgw.ctl._main` (parse, build the call, call with rsgw's Channel
    and the command's deadline, render), minus the process around them; the kept
    subprocess tests check that shell.

    Raises:
        CtlFailed: the gateway answered an error (`rsgw ctl` would exit 1).
    """
    parsed = parse_args(["--gateway", fleet.target, *args])
    assert isinstance(parsed, Invocation)
    call = call_for(parsed.command)
    try:
        reply = await fleet.channel().unary(
            call.path,
            call.request.SerializeToString(),
            deadline=trio.current_time() + call.deadline_seconds,
        )
    except RsgwError as exc:
        line = format_error(exc.code.name, exc.message, fleet.target)
        assert "\n" not in line
        raise CtlFailed(exc, line) from exc
    return render_reply(parsed.command, call.response_type.FromString(reply))


# -- 1: a client built from the proto alone ------------------------------------------------


async def test_a_client_generated_from_the_proto_drives_all_four_rpcs(stubs: Path) -> None:
    # Real: grpcio with stubs from the .proto alone, in its own process, is the wire
    # contract a third-party client relies on; it needs a real port and a real clock.
    async with lpt_fleet() as fleet:
        done = await trio.run_process(
            [sys.executable, str(stubs / "client.py"), fleet.target],
            capture_stdout=True,
            cwd=str(stubs),
        )
    status, policy, placement, repack, unknown, mode, share = json.loads(done.stdout)
    assert status["mode"] == "lpt_packing"
    assert [m["name"] for m in status["models"]] == list(NAMES)
    assert policy["applied"]["hysteresis"] == 0.2 and policy["applied"]["generation"] == "1"
    assert not policy.get("persisted", False)
    assert placement["configured_replicas"] == "2" and placement["effective_replicas"] == "2"
    assert repack["completed"] and repack["repack"]["last_trigger"] == "operator"
    assert unknown["code"] == "INVALID_ARGUMENT"
    assert (
        "unknown scheduling knob 'no_such_knob'; accepted: compaction_interval,"
        in (unknown["details"])
    )
    for refused in (mode, share):
        assert refused["code"] == "INVALID_ARGUMENT"
        assert "cannot be changed at runtime" in refused["details"]


# -- 2: repack and set-replicas through the CLI (the subprocess, then its parts in memory) --


async def test_ctl_repack_waits_for_the_repack_right_after_startup() -> None:
    # Real: `rsgw ctl` end to end on a success (the process dials TCP, exits 0, prints).
    async with lpt_fleet() as fleet:
        done = await ctl(fleet, "repack", "--wait", "30")
        assert done.returncode == 0, done.stderr
        out = done.stdout.decode()
        assert out.startswith("repack 1 completed in "), out
        assert "last trigger 'operator'" in out
        assert done.stderr == b""  # done within the first progress interval
        status = await ctl(fleet, "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["mode"] == "lpt_packing"


async def test_ctl_set_replicas_then_repack_spreads_a_model_over_two_workers(
    autojump_clock: MockClock,
) -> None:
    async with lpt_fleet(memory=True) as fleet:
        placed = await ctl_in_memory(fleet, "set-replicas", "alpha", "2", "--fill-mode", "spread")
        assert placed.startswith("alpha: replicas 2 (effective 2), fill spread")
        repacked = await ctl_in_memory(fleet, "repack", "--wait", "30")
        assert repacked.startswith("repack 1 completed in "), repacked
        status = await ctl_in_memory(fleet, "status")
        rows = [line for line in status.splitlines() if " alpha " in f" {line} "]
        assert rows and rows[0].count("req/") == 2, status
        assert await send(fleet, ("alpha",), 16, 4) == []
        served = [w.service.device.counters["alpha"].requests_served for w in fleet.workers]
        assert sorted(served)[0] == 0 and all(n > 0 for n in sorted(served)[1:]), served
        assert sum(served) == 16
        # A misspelt model: the nearest served name, then how to pre-seed (issue 40).
        with pytest.raises(CtlFailed) as refused:
            await ctl_in_memory(fleet, "set-replicas", "alpah", "2")
        assert refused.value.line.startswith(
            "error: NOT_FOUND: no worker currently serves model 'alpah' (did you mean alpha?); "
        )


# -- 3: set-policy ------------------------------------------------------------------------------


async def test_ctl_set_policy_applies_all_or_nothing(autojump_clock: MockClock) -> None:
    async with lpt_fleet(memory=True) as fleet:
        shell = fleet.gateway._packing
        assert shell is not None
        done = await ctl_in_memory(
            fleet,
            "set-policy",
            "hysteresis=0.15",
            "routing_policy=fill_least",
            "compaction_interval=4",
        )
        assert "applied hysteresis, routing_policy, compaction_interval (generation 1)" in done
        knobs = shell.knobs
        assert (knobs.hysteresis, str(knobs.routing_policy), knobs.compaction_interval) == (
            0.15,
            "fill_least",
            4,
        )
        with pytest.raises(CtlFailed) as bad:
            await ctl_in_memory(fleet, "set-policy", "hysteresis=0.3", "compaction_interval=-2")
        assert bad.value.error.code is StatusCode.INVALID_ARGUMENT
        assert "INVALID_ARGUMENT" in bad.value.line
        assert "compaction_interval" in bad.value.line
        assert shell.knobs is knobs and shell.generation == 1


async def test_work_basis_changes_the_metric_label_and_items_keep_counting(
    autojump_clock: MockClock,
) -> None:
    slow = catalogue_from_yaml(SLOW, with_builtin=False)
    async with open_fleet(2, memory=True, catalogues=[slow, slow], scheduling=lpt()) as fleet:
        await ctl_in_memory(fleet, "set-policy", "work_basis=items")
        await ctl_in_memory(fleet, "set-replicas", "slow", "1", "--fill-factor", "2")
        request = infer_request("slow", {"x": np.ones((32, 4), dtype=np.float32)})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fleet.infer, request)
            with trio.fail_after(10):
                while True:
                    work = samples(exposition(fleet), "gateway_worker_inflight_work")
                    if any(v > 0 for v in work.values()):
                        break
                    await trio.sleep(0.01)
        assert all(k.startswith('{basis="items"') for k in work)
        assert sorted(work.values())[-1] == 32.0


# -- 4 and 5: other modes, no gateway, bad usage -----------------------------------------------


async def test_under_round_robin_status_says_so_and_mutators_fail_precondition() -> None:
    # Real: `rsgw ctl` end to end on the gateway's own refusals (exit 1, one stderr line).
    rr = SchedulingConfig(mode=SchedulingMode.ROUND_ROBIN)
    async with open_fleet(2, catalogues=[catalogue()] * 2, scheduling=rr) as fleet:
        status = await ctl(fleet, "status")
        assert status.returncode == 0
        assert status.stdout.decode().startswith("mode: round_robin")
        for args in (("repack",), ("set-replicas", "alpha", "2"), ("set-policy", "hysteresis=0.2")):
            failed = await ctl(fleet, *args)
            assert failed.returncode == 1
            err = failed.stderr.decode()
            assert err.count("\n") == 1 and "FAILED_PRECONDITION" in err
            assert "require lpt_packing" in err and "--mode lpt_packing" in err


async def test_against_a_stopped_gateway_one_line_and_exit_1() -> None:
    # Real: a refused TCP connect and the usage error are the process's own exits (1, 2).
    async with lpt_fleet() as fleet:
        port = fleet.gateway.grpc_port
        await fleet.gateway.aclose()
    done = await ctl(port, "status")
    assert done.returncode == 1
    err = done.stderr.decode()
    assert err.count("\n") == 1 and "UNAVAILABLE" in err and f"127.0.0.1:{port}" in err
    assert "Traceback" not in err
    usage = await ctl(port, "set-replicas")
    assert usage.returncode == 2 and "usage" in usage.stderr.decode().lower()
