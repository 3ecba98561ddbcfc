"""GatewayControlService and `rsgw ctl` against a live gateway (issue 9)."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import trio

from rsgw.scheduling._knobs import SchedulingMode
from rsgw.scheduling._settings import SchedulingConfig
from tests.gateway.fleet import Fleet, open_fleet
from tests.gateway.test_lpt_packing import NAMES, catalogue, lpt, samples, send
from tests.helpers import MODEL_INFER, catalogue_from_yaml, infer_request

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
    port = fleet if isinstance(fleet, int) else fleet.gateway.grpc_port
    return await trio.run_process(
        [sys.executable, "-m", "rsgw", "ctl", "--gateway", f"127.0.0.1:{port}", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


def lpt_fleet(**knobs: object) -> AbstractAsyncContextManager[Fleet]:
    return open_fleet(3, catalogues=[catalogue()] * 3, scheduling=lpt(**knobs))


# -- 1: a client built from the proto alone ------------------------------------------------


async def test_a_client_generated_from_the_proto_drives_all_four_rpcs(stubs: Path) -> None:
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


# -- 2: repack and set-replicas through the CLI -------------------------------------------


async def test_ctl_repack_waits_for_the_repack_right_after_startup() -> None:
    async with lpt_fleet() as fleet:
        done = await ctl(fleet, "repack", "--wait", "30")
        assert done.returncode == 0, done.stderr
        out = done.stdout.decode()
        assert out.startswith("repack 1 completed in "), out
        assert "last trigger 'operator'" in out


async def test_ctl_set_replicas_then_repack_spreads_a_model_over_two_workers() -> None:
    async with lpt_fleet() as fleet:
        placed = await ctl(fleet, "set-replicas", "alpha", "2", "--fill-mode", "spread")
        assert placed.returncode == 0, placed.stderr
        assert placed.stdout.decode().startswith("alpha: replicas 2 (effective 2), fill spread")
        assert (await ctl(fleet, "repack", "--wait", "30")).returncode == 0
        status = await ctl(fleet, "status")
        assert status.returncode == 0, status.stderr
        rows = [line for line in status.stdout.decode().splitlines() if " alpha " in f" {line} "]
        assert rows and rows[0].count("req/") == 2, status.stdout.decode()
        assert await trio.to_thread.run_sync(send, fleet.target, ("alpha",), 16, 4) == []
        served = [w.service.device.counters["alpha"].requests_served for w in fleet.workers]
        assert sorted(served)[0] == 0 and all(n > 0 for n in sorted(served)[1:]), served


# -- 3: set-policy ------------------------------------------------------------------------------


async def test_ctl_set_policy_applies_all_or_nothing() -> None:
    async with lpt_fleet() as fleet:
        shell = fleet.gateway._packing
        assert shell is not None
        done = await ctl(
            fleet,
            "set-policy",
            "hysteresis=0.15",
            "routing_policy=fill_least",
            "compaction_interval=4",
        )
        assert done.returncode == 0, done.stderr
        assert "applied hysteresis, routing_policy, compaction_interval (generation 1)" in (
            done.stdout.decode()
        )
        knobs = shell.knobs
        assert (knobs.hysteresis, str(knobs.routing_policy), knobs.compaction_interval) == (
            0.15,
            "fill_least",
            4,
        )
        bad = await ctl(fleet, "set-policy", "hysteresis=0.3", "compaction_interval=-2")
        assert bad.returncode == 1
        assert "INVALID_ARGUMENT" in bad.stderr.decode()
        assert "compaction_interval" in bad.stderr.decode()
        assert shell.knobs is knobs and shell.generation == 1


async def inflight_request(target: str, rows: int) -> None:
    def call() -> None:
        with grpc.insecure_channel(target) as channel:
            body = infer_request("slow", {"x": np.ones((rows, 4), dtype=np.float32)})
            channel.unary_unary(MODEL_INFER)(body.SerializeToString(), timeout=30)

    await trio.to_thread.run_sync(call)


async def test_work_basis_changes_the_metric_label_and_items_keep_counting() -> None:
    slow = catalogue_from_yaml(SLOW, with_builtin=False)
    async with open_fleet(2, catalogues=[slow, slow], scheduling=lpt()) as fleet:
        assert (await ctl(fleet, "set-policy", "work_basis=items")).returncode == 0
        placed = await ctl(fleet, "set-replicas", "slow", "1", "--fill-factor", "2")
        assert placed.returncode == 0, placed.stderr
        url = f"http://127.0.0.1:{fleet.gateway.admin_port}/metrics"
        async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
            nursery.start_soon(inflight_request, fleet.target, 32)
            with trio.fail_after(10):
                while True:
                    work = samples((await client.get(url)).text, "gateway_worker_inflight_work")
                    if any(v > 0 for v in work.values()):
                        break
                    await trio.sleep(0.01)
        assert all(k.startswith('{basis="items"') for k in work)
        assert sorted(work.values())[-1] == 32.0


# -- 4 and 5: other modes, no gateway, bad usage -----------------------------------------------


async def test_under_round_robin_status_says_so_and_mutators_fail_precondition() -> None:
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
            assert "require lpt_packing" in err


async def test_against_a_stopped_gateway_one_line_and_exit_1() -> None:
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
