"""TLS on the gateway's listeners and to its workers, with real certificates and clients.

A trustme CA issues the server certificate (for 127.0.0.1) and client
certificates; stock tritonclient (`ssl=True`) and grpcio
(`ssl_channel_credentials`) connect as users do, httpx reads the admin port over
HTTPS. A cleartext client must fail, mTLS must refuse a client without a
certificate, and a rotated certificate must reach new connections while calls
already open go on.
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._errors import ConfigError, RsgwError
from rsgw.base._status import StatusCode
from rsgw.config._config import TlsConfig, WorkerClientConfig
from tests.gateway.fleet import leaf, open_fleet
from tests.helpers import (
    MODEL_INFER,
    in_thread,
    infer_request,
    output_array,
    simple_inputs,
    wait_until_async,
)
from tests.pki import PemPair, Pki

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


def tls_config(pki: Pki, *, mtls: bool = False) -> TlsConfig:
    return TlsConfig(pki.server.cert, pki.server.key, pki.ca_file if mtls else "")


def credentials(pki: Pki, client: PemPair | None = None) -> grpc.ChannelCredentials:
    key, chain = (None, None)
    if client is not None:
        chain, key = client.read()
    return grpc.ssl_channel_credentials(pki.ca_bytes(), private_key=key, certificate_chain=chain)


def secure_infer(target: str, creds: grpc.ChannelCredentials, seed: int = 0) -> None:
    """One `simple` call over a new TLS channel; raises `grpc.RpcError`."""
    with grpc.secure_channel(target, creds) as channel:
        check_reply(channel.unary_unary(MODEL_INFER)(simple_body(seed), timeout=10), seed)


def simple_body(seed: int) -> bytes:
    return infer_request("simple", simple_inputs(seed)).SerializeToString()


def check_reply(body: bytes, seed: int) -> None:
    inputs = simple_inputs(seed)
    reply = pb.ModelInferResponse.FromString(body)
    np.testing.assert_array_equal(
        output_array(reply, "OUTPUT0"), inputs["INPUT0"] + inputs["INPUT1"]
    )


def triton_infer(target: str, pki: Pki, client: PemPair | None = None) -> None:
    """tritonclient with `ssl=True`, trusting `pki`'s CA, as its documentation shows."""
    triton = grpcclient.InferenceServerClient(
        target,
        ssl=True,
        root_certificates=pki.ca_file,
        private_key=client.key if client else None,
        certificate_chain=client.cert if client else None,
    )
    try:
        assert triton.is_server_live()
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = triton.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    finally:
        triton.close()


def handshake(port: int, ca_file: str) -> str:
    """A bare TLS handshake; the ALPN protocol agreed. Raises `ssl.SSLError`."""
    context = ssl.create_default_context(cafile=ca_file)
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        return tls.selected_alpn_protocol() or ""


def install(pair: PemPair, into: PemPair) -> None:
    """Replace `into`'s files with `pair`'s, each by an atomic rename (as cert-manager does)."""
    for source, target in ((pair.key, into.key), (pair.cert, into.cert)):
        shutil.copyfile(source, target + ".new")
        os.replace(target + ".new", target)


async def test_tls_serves_tritonclient_and_grpcio_and_refuses_cleartext(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    async with open_fleet(2, tls=tls_config(pki)) as fleet:
        await in_thread(lambda: triton_infer(fleet.target, pki))
        await in_thread(lambda: secure_infer(fleet.target, credentials(pki)))
        assert await in_thread(lambda: handshake(fleet.gateway.grpc_port, pki.ca_file)) == "h2"

        def cleartext() -> grpc.StatusCode:
            with (
                grpc.insecure_channel(fleet.target) as channel,
                pytest.raises(grpc.RpcError) as caught,
            ):
                channel.unary_unary(MODEL_INFER)(simple_body(0), timeout=5)
            return caught.value.code()

        assert await in_thread(cleartext) == grpc.StatusCode.UNAVAILABLE
        other = Pki(tmp_path, "other")  # a certificate the client does not trust
        with pytest.raises(ssl.SSLCertVerificationError):
            await in_thread(lambda: handshake(fleet.gateway.grpc_port, other.ca_file))
        # The listener survived every failed handshake.
        await in_thread(lambda: secure_infer(fleet.target, credentials(pki), seed=1))


async def test_admin_port_serves_https(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    async with open_fleet(1, tls=tls_config(pki)) as fleet:
        base = f"127.0.0.1:{fleet.gateway.admin_port}"
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=pki.ca_file)) as c:
            response = await c.get(f"https://{base}/metrics")
            assert response.status_code == 200
            assert "gateway_worker_ready" in response.text
        async with httpx.AsyncClient() as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get(f"http://{base}/readyz")


async def test_mtls_refuses_a_client_without_a_certificate(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    stranger = Pki(tmp_path, "stranger").client("mallory.example")
    alice = pki.client("alice.example")
    async with open_fleet(1, tls=tls_config(pki, mtls=True)) as fleet:
        await in_thread(lambda: secure_infer(fleet.target, credentials(pki, alice)))
        await in_thread(lambda: triton_infer(fleet.target, pki, alice))
        for creds in (credentials(pki), credentials(pki, stranger)):
            with pytest.raises(grpc.RpcError) as caught:
                await in_thread(lambda: secure_infer(fleet.target, creds))  # noqa: B023
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_rotated_certificate_reaches_new_connections_and_keeps_open_calls(
    tmp_path: Path,
) -> None:
    old, new = Pki(tmp_path, "old"), Pki(tmp_path, "new")
    served = PemPair(str(tmp_path / "tls.pem"), str(tmp_path / "tls.key"))
    install(old.server, served)
    config = TlsConfig(served.cert, served.key)
    async with open_fleet(1, tls=config) as fleet:
        port = fleet.gateway.grpc_port

        def scenario() -> None:
            requests: queue.Queue[bytes | None] = queue.Queue()

            def outgoing() -> Iterator[bytes]:
                while (body := requests.get()) is not None:
                    yield body

            with grpc.secure_channel(fleet.target, credentials(old)) as channel:
                unary = channel.unary_unary(MODEL_INFER)
                replies = channel.stream_stream(STREAM_INFER)(outgoing(), timeout=30)
                requests.put(simple_body(1))
                first = pb.ModelStreamInferResponse.FromString(next(replies))
                check_reply(first.infer_response.SerializeToString(), 1)

                install(new.server, served)
                deadline = time.monotonic() + 10
                while True:  # the gateway checks the files every second
                    try:
                        handshake(port, new.ca_file)
                        break
                    except ssl.SSLError:
                        assert time.monotonic() < deadline, "new certificate not served"
                        time.sleep(0.1)
                with pytest.raises(ssl.SSLCertVerificationError):
                    handshake(port, old.ca_file)

                # The stream opened before the rotation goes on, as does its connection.
                requests.put(simple_body(2))
                second = pb.ModelStreamInferResponse.FromString(next(replies))
                check_reply(second.infer_response.SerializeToString(), 2)
                check_reply(unary(simple_body(3), timeout=10), 3)
                requests.put(None)
                assert list(replies) == []
            secure_infer(fleet.target, credentials(new), seed=4)

        await in_thread(scenario)


async def test_broken_certificate_files_keep_the_one_in_force(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    served = PemPair(str(tmp_path / "tls.pem"), str(tmp_path / "tls.key"))
    install(pki.server, served)
    async with open_fleet(1, tls=TlsConfig(served.cert, served.key)) as fleet:
        await trio.Path(served.key).write_text("not a key\n")
        server_tls = fleet.gateway._server.tls
        assert server_tls is not None
        await wait_until_async(lambda: server_tls.reload_failures > 0, what="a failed reload")
        await in_thread(lambda: secure_infer(fleet.target, credentials(pki)))


async def test_gateway_speaks_mtls_to_workers(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    gateway_client = pki.client("gateway.example")
    worker_tls = {
        "tls_cert_file": pki.server.cert,
        "tls_key_file": pki.server.key,
        "tls_client_ca_file": pki.ca_file,
    }
    to_workers = WorkerClientConfig(
        tls_ca_file=pki.ca_file,
        tls_cert_file=gateway_client.cert,
        tls_key_file=gateway_client.key,
    )
    async with open_fleet(2, worker_overrides=worker_tls, worker_client=to_workers) as fleet:
        status = fleet.gateway.statistics()
        assert status.ready == frozenset(status.workers)
        for seed in range(4):
            await fleet.infer(infer_request("simple", simple_inputs(seed)))
        async with httpx.AsyncClient() as client:  # merged worker series came over HTTPS
            response = await client.get(f"http://127.0.0.1:{fleet.gateway.admin_port}/metrics")
        assert 'gateway_worker_metrics_up{worker="worker0"} 1.0' in response.text
        assert "worker_requests_total" in response.text
        # A worker that requires client certificates refuses grpcio without one.
        with pytest.raises(grpc.RpcError):
            await in_thread(lambda: secure_infer(fleet.worker_url(0), credentials(pki)))


async def test_a_worker_with_an_untrusted_certificate_is_not_ready(tmp_path: Path) -> None:
    pki, other = Pki(tmp_path), Pki(tmp_path, "other")
    worker_tls = {"tls_cert_file": other.server.cert, "tls_key_file": other.server.key}
    to_workers = WorkerClientConfig(tls_ca_file=pki.ca_file)
    async with open_fleet(1, worker_overrides=worker_tls, worker_client=to_workers) as fleet:
        status = fleet.gateway.statistics()
        assert status.probe_rounds >= 1 and not status.ready  # probed, and refused
        with pytest.raises(RsgwError) as caught:
            await fleet.infer(infer_request("simple", simple_inputs(0)))
        # The gateway never got through to the worker, so it never learnt its models.
        assert caught.value.code is StatusCode.NOT_FOUND


def test_unloadable_tls_files_are_a_config_error(tmp_path: Path) -> None:
    pki = Pki(tmp_path)

    async def start() -> None:
        async with open_fleet(1, tls=TlsConfig(pki.server.cert, pki.ca_file)):
            pass  # pragma: no cover - must not start

    with pytest.raises(BaseException) as caught:
        trio.run(start)
    error = leaf(caught.value)
    assert isinstance(error, ConfigError)
    assert "tls" in str(error)
