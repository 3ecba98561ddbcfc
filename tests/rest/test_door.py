"""The REST front door in front of simulated workers: every endpoint but inference.

Real gateway, real workers on loopback, real clients: httpx for the raw answers
(status codes, bodies) and Triton's `tritonclient.http` as a user would call it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from tests.gateway.fleet import Fleet, open_fleet
from tests.helpers import in_thread


@asynccontextmanager
async def rest_fleet(count: int = 2) -> AsyncIterator[tuple[Fleet, httpx.AsyncClient]]:
    async with open_fleet(count) as fleet:
        port = fleet.gateway.http_port
        assert port is not None
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            yield fleet, http


def url_of(fleet: Fleet) -> str:
    return f"127.0.0.1:{fleet.gateway.http_port}"


async def test_health_metadata_and_readiness() -> None:
    async with rest_fleet() as (_, http):
        assert (await http.get("/v2/health/live")).status_code == 200
        assert (await http.get("/v2/health/ready")).status_code == 200
        server = (await http.get("/v2")).json()
        assert server["name"] == "triton"
        assert "binary_tensor_data" in server["extensions"]
        assert (await http.get("/v2/models/simple/ready")).status_code == 200
        assert (await http.get("/v2/models/simple/versions/1/ready")).status_code == 200
        metadata = (await http.get("/v2/models/simple")).json()
        assert metadata["name"] == "simple"
        assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
        assert metadata["inputs"][0]["shape"] == [-1, 16]


async def test_config_statistics_and_index_as_triton_writes_them() -> None:
    async with rest_fleet() as (_, http):
        config = (await http.get("/v2/models/simple/config")).json()
        assert config["name"] == "simple"
        assert isinstance(config["max_batch_size"], int)
        stats = (await http.get("/v2/models/simple/stats")).json()
        assert stats["model_stats"][0]["name"] == "simple"
        everything = (await http.get("/v2/models/stats")).json()
        assert len(everything["model_stats"]) > 1
        index = (await http.post("/v2/repository/index", json={"ready": True})).json()
        assert {"name": "simple", "version": "1", "state": "READY"} in index


async def test_errors_are_triton_shaped() -> None:
    async with rest_fleet() as (_, http):
        missing = await http.get("/v2/models/nope")
        assert missing.status_code == 404
        assert "nope" in missing.json()["error"]
        assert (await http.get("/v2/models/nope/ready")).status_code in (400, 404)
        nowhere = await http.get("/v2/no/such/thing")
        assert nowhere.status_code == 404
        assert "error" in nowhere.json()
        wrong = await http.post("/v2/health/live")
        assert wrong.status_code == 405
        bad = await http.post("/v2/repository/index", content=b"{not json")
        assert bad.status_code == 400
        assert "JSON" in bad.json()["error"]
        gzip = await http.post(
            "/v2/repository/index", content=b"{}", headers={"content-encoding": "br"}
        )
        assert gzip.status_code == 415


async def test_model_control_and_logging_through_tritonclient_http() -> None:
    async with rest_fleet() as (fleet, _):
        client = triton_http.InferenceServerClient(url_of(fleet))

        def calls() -> None:
            assert client.is_server_live()
            assert client.is_server_ready()
            assert client.is_model_ready("simple")
            assert client.get_model_metadata("simple")["name"] == "simple"
            assert client.get_model_config("simple")["name"] == "simple"
            assert client.get_inference_statistics("simple")["model_stats"]
            client.unload_model("simple")
            assert not client.is_model_ready("simple")
            client.load_model("simple")
            assert client.is_model_ready("simple")
            with pytest.raises(InferenceServerException) as failed:
                client.get_model_metadata("nope")
            assert "nope" in str(failed.value)
            assert client.get_system_shared_memory_status() == []
            settings = client.get_log_settings()
            assert isinstance(settings, dict)

        try:
            await in_thread(calls)
        finally:
            client.close()


async def test_only_inference_replies_are_compressed_and_configs_list_defaults() -> None:
    async with rest_fleet() as (_, http):
        stats = await http.get("/v2/models/simple/stats", headers={"accept-encoding": "gzip"})
        assert "content-encoding" not in stats.headers  # Triton's aio client reads it raw
        config = (await http.get("/v2/models/simple_identity/config")).json()
        assert "max_batch_size" in config  # 0 is written, as Triton writes it
