"""Two `rsgw run` processes coordinated through a real etcd, one SIGKILLed under load
(issue 39's third acceptance, as an operator would see it: processes, signals, grpcio
and `rsgw ctl status`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import grpc

from rsgw._proto import reactant_control_v1_pb2 as cpb
from tests.etcd import EtcdProcess
from tests.helpers import (
    WorkerProcess,
    infer_request,
    simple_inputs,
    start_rsgw_process,
    start_worker_process,
)

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
STATUS = "/reactant_control.GatewayControlService/GetSchedulingStatus"
TTL = 3


def start_gateway(workers: list[WorkerProcess], etcd: EtcdProcess, member: str) -> WorkerProcess:
    env = dict(os.environ)
    env |= {
        "REACTANT_GATEWAY_WORKERS": ",".join(w.target for w in workers),
        "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_METRICS": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_HTTP": "127.0.0.1:0",
        "REACTANT_GATEWAY_SCHEDULING_MODE": "lpt_packing",
        "REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS": "0.5",
        "REACTANT_GATEWAY_COORDINATION_ETCD_ENDPOINTS": etcd.endpoint,
        "REACTANT_GATEWAY_COORDINATION_MEMBER": member,
        "REACTANT_GATEWAY_COORDINATION_LEASE_TTL_SECONDS": str(TTL),
    }
    return start_rsgw_process("run", event="gateway serving", env=env)


def status(gateway: WorkerProcess) -> cpb.GetSchedulingStatusResponse:
    with grpc.insecure_channel(gateway.target) as channel:
        reply = channel.unary_unary(STATUS)(
            cpb.GetSchedulingStatusRequest().SerializeToString(), timeout=5
        )
    return cpb.GetSchedulingStatusResponse.FromString(reply)


def call_until(
    gateway: WorkerProcess,
    body: bytes,
    stop: threading.Event,
    answered: list[int],
    slot: int,
    failures: list[str],
) -> None:
    """ModelInfer to `gateway` one after another until `stop`: answers counted in
    `answered[slot]`, failures kept (a client thread)."""
    with grpc.insecure_channel(gateway.target) as channel:
        infer = channel.unary_unary(MODEL_INFER)
        while not stop.is_set():
            try:
                infer(body, timeout=10)
                answered[slot] += 1
            except grpc.RpcError as exc:
                failures.append(f"{exc.code()}: {exc.details()}")


def settled(gateways: list[WorkerProcess]) -> bool:
    """One placer and one follower at one epoch (> 0)."""
    seen = [status(g).coordination for g in gateways]
    states = sorted(c.state for c in seen)
    return states == ["follower", "placer"] and seen[0].epoch == seen[1].epoch > 0


def wait_for(what: str, holds: object, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not holds():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.05)


def test_sigkill_of_the_placer_under_load(etcd: EtcdProcess) -> None:
    workers = [start_worker_process() for _ in range(2)]
    gateways: list[WorkerProcess] = []
    try:
        gateways = [start_gateway(workers, etcd, name) for name in ("gw-a", "gw-b")]
        wait_for("placer and follower at one epoch", lambda: settled(gateways), 30)
        states = [status(g).coordination.state for g in gateways]
        placer, survivor = gateways[states.index("placer")], gateways[states.index("follower")]
        epoch = status(survivor).coordination.epoch

        failures: list[str] = []
        answered = [0]
        stop = threading.Event()
        body = infer_request("simple", simple_inputs(7)).SerializeToString()

        client = threading.Thread(
            target=call_until, args=(survivor, body, stop, answered, 0, failures)
        )
        client.start()
        try:
            wait_for("calls before the kill", lambda: answered[0] >= 20, 10)
            placer.process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            wait_for("a new placer", lambda: status(survivor).coordination.state == "placer", 15)
            took = time.monotonic() - killed
            count = answered[0]
            wait_for("calls after the handover", lambda: answered[0] >= count + 20, 10)
        finally:
            stop.set()
            client.join(15)
        assert failures == []
        # About one lease TTL; five of them is the margin for a busy two-core runner.
        assert took <= 5 * TTL, took
        after = status(survivor).coordination
        assert after.epoch == epoch, "the handover placed nothing anew"
        ctl = subprocess.run(
            [sys.executable, "-m", "rsgw", "ctl", "--gateway", survivor.target, "status"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert ctl.returncode == 0, ctl.stderr
        assert "coordination: gw-" in ctl.stdout and "placer (this gateway places" in ctl.stdout
    finally:
        for process in [*gateways, *workers]:
            process.stop()


def test_etcd_stopped_for_30_seconds_under_load(etcd: EtcdProcess) -> None:
    """SIGSTOP of etcd for 30 s (ten lease TTLs here) with both gateways under load: no
    failed call, no repack; after SIGCONT, one placer and one follower again."""
    workers = [start_worker_process() for _ in range(2)]
    gateways: list[WorkerProcess] = []
    try:
        gateways = [start_gateway(workers, etcd, name) for name in ("gw-a", "gw-b")]
        wait_for("placer and follower at one epoch", lambda: settled(gateways), 30)
        repacks = [status(g).repack.repack_count for g in gateways]
        placements = [placed(status(g)) for g in gateways]
        failures: list[str] = []
        answered = [0, 0]
        stop = threading.Event()
        body = infer_request("simple", simple_inputs(3)).SerializeToString()

        clients = [
            threading.Thread(
                target=call_until, args=(gateways[i], body, stop, answered, i, failures)
            )
            for i in (0, 1)
        ]
        for client in clients:
            client.start()
        try:
            etcd.pause()
            try:
                for gateway in gateways:
                    wait_for(
                        "disconnected",
                        lambda g=gateway: status(g).coordination.state == "disconnected",
                        15,
                    )
                time.sleep(30)
                during = [status(g) for g in gateways]
                count = list(answered)
                wait_for("calls while etcd is stopped", lambda: min(answered) > min(count), 10)
            finally:
                etcd.resume()
            wait_for("placer and follower again", lambda: settled(gateways), 30)
        finally:
            stop.set()
            for client in clients:
                client.join(15)
        assert failures == []
        assert [s.repack.repack_count for s in during] == repacks
        assert [placed(s) for s in during] == placements
        assert all(s.coordination.last_error for s in during)
    finally:
        for process in [*gateways, *workers]:
            process.stop()


def placed(reply: cpb.GetSchedulingStatusResponse) -> dict[str, list[str]]:
    return {m.name: sorted(r.worker for r in m.replicas) for m in reply.models if m.placed}
