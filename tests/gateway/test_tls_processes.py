"""TLS and auth as an operator runs them: `rsgw worker` and `rsgw run` processes.

The worker serves mTLS (`--tls-cert/--tls-key/--tls-client-ca`), the gateway
reaches it with its own certificate (REACTANT_GATEWAY_WORKER_CLIENT_TLS_*) and
serves TLS itself (REACTANT_GATEWAY_TLS_*); SIGHUP makes both read their
certificates again; an unauthenticated gateway on 0.0.0.0 says so loudly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
from pathlib import Path

import grpc

from tests.helpers import (
    MODEL_INFER,
    infer_request,
    simple_inputs,
    start_rsgw_process,
    start_worker_process,
    wait_until,
)
from tests.pki import PemPair, Pki


def handshake_ca(port: int, ca_file: str) -> bool:
    """Whether a TLS handshake on `port` verifies against `ca_file`."""
    import socket

    context = ssl.create_default_context(cafile=ca_file)
    context.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return True
    except ssl.SSLError:
        return False


def infer(target: str, ca: bytes) -> None:
    body = infer_request("simple", simple_inputs(0)).SerializeToString()
    with grpc.secure_channel(target, grpc.ssl_channel_credentials(ca)) as channel:
        channel.unary_unary(MODEL_INFER)(body, timeout=10)


def test_rsgw_run_and_worker_with_mtls_reload_on_sighup(tmp_path: Path) -> None:
    pki, new = Pki(tmp_path), Pki(tmp_path, "new")
    gateway_cert = pki.client("gateway.example")
    served = PemPair(str(tmp_path / "served.pem"), str(tmp_path / "served.key"))
    shutil.copyfile(pki.server.cert, served.cert)
    shutil.copyfile(pki.server.key, served.key)
    worker = start_worker_process(
        "--tls-cert", pki.server.cert, "--tls-key", pki.server.key, "--tls-client-ca", pki.ca_file
    )
    env = {
        **os.environ,
        "REACTANT_GATEWAY_WORKERS": worker.target,
        "REACTANT_GATEWAY_WORKER_METRICS": f"127.0.0.1:{worker.metrics_port}",
        "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_METRICS": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_HTTP": "127.0.0.1:0",
        "REACTANT_GATEWAY_TLS_CERT_FILE": served.cert,
        "REACTANT_GATEWAY_TLS_KEY_FILE": served.key,
        "REACTANT_GATEWAY_WORKER_CLIENT_TLS_CA_FILE": pki.ca_file,
        "REACTANT_GATEWAY_WORKER_CLIENT_TLS_CERT_FILE": gateway_cert.cert,
        "REACTANT_GATEWAY_WORKER_CLIENT_TLS_KEY_FILE": gateway_cert.key,
        "REACTANT_GATEWAY_HEALTH_INTERVAL_SECONDS": "0.2",
    }
    gateway = start_rsgw_process("run", event="gateway serving", env=env)
    try:
        infer(gateway.target, pki.ca_bytes())
        assert "no authentication" not in gateway.log()  # loopback only
        # Replace the files with the same modification time the old ones had, so only
        # SIGHUP (not the once-a-second check) can notice, then signal.
        stamp = os.stat(served.cert).st_mtime_ns
        for source, target in ((new.server.cert, served.cert), (new.server.key, served.key)):
            shutil.copyfile(source, target)
            os.utime(target, ns=(stamp, stamp))
        gateway.process.send_signal(signal.SIGHUP)
        wait_until(lambda: handshake_ca(gateway.grpc_port, new.ca_file), what="new certificate")
        assert "TLS certificate reloaded" in gateway.log()
        infer(gateway.target, new.ca_bytes())
    finally:
        assert gateway.stop() == 0
        worker.stop()


def test_an_unauthenticated_gateway_on_every_address_warns(tmp_path: Path) -> None:
    worker = start_worker_process()
    env = {
        **os.environ,
        "REACTANT_GATEWAY_WORKERS": worker.target,
        "REACTANT_GATEWAY_LISTEN_GRPC": "0.0.0.0:0",
        "REACTANT_GATEWAY_LISTEN_METRICS": "127.0.0.1:0",
        "REACTANT_GATEWAY_LISTEN_HTTP": "127.0.0.1:0",
    }
    gateway = start_rsgw_process("run", event="gateway serving", env=env)
    try:
        log = gateway.log()
        assert log.count("no authentication: ") == 1  # said once
        assert "any client that can reach 0.0.0.0:0 (gRPC) may run inference" in log
        # Its stderr is a file, not a terminal: `logging.format: auto` writes JSON lines.
        entries = [json.loads(line) for line in log.splitlines() if line.strip()]
        assert all({"ts", "level", "logger", "event"} <= entry.keys() for entry in entries)
    finally:
        gateway.stop()
        worker.stop()
