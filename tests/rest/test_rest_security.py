"""The REST door under the gRPC port's security: TLS, bearer tokens and roles.

The same guard checks a REST call as the gRPC call it is: no token is 401, a role
that does not allow the method 403; with `tls:` the REST listener serves HTTPS only.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx

from rsgw.config._config import AuthConfig, TlsConfig
from tests.gateway.fleet import open_fleet
from tests.gateway.test_gateway_auth import ALICE, OPS, standard_tokens
from tests.pki import Pki

SIMPLE = {
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
    ]
}


async def test_tokens_and_roles_apply_to_rest_calls(tmp_path: Path) -> None:
    auth = AuthConfig(tokens_file=standard_tokens(tmp_path / "tokens.yml"))
    async with open_fleet(1, auth=auth) as fleet:
        base = f"http://127.0.0.1:{fleet.gateway.http_port}"
        async with httpx.AsyncClient(base_url=base) as http:
            anonymous = await http.post("/v2/models/simple/infer", json=SIMPLE)
            assert anonymous.status_code == 401
            assert "error" in anonymous.json()
            bearer = {"authorization": f"Bearer {ALICE}"}
            answer = await http.post("/v2/models/simple/infer", json=SIMPLE, headers=bearer)
            assert answer.status_code == 200
            assert answer.json()["outputs"][0]["data"] == [i + 1 for i in range(16)]
            # alice may infer but not load models; the operator may.
            refused = await http.post("/v2/repository/models/simple/load", headers=bearer)
            assert refused.status_code == 403
            operator = {"authorization": f"Bearer {OPS}"}
            loaded = await http.post("/v2/repository/models/simple/load", headers=operator)
            assert loaded.status_code == 200


async def test_with_tls_the_rest_listener_serves_https(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    async with open_fleet(1, tls=TlsConfig(pki.server.cert, pki.server.key)) as fleet:
        port = fleet.gateway.http_port
        context = ssl.create_default_context(cafile=pki.ca_file)
        async with httpx.AsyncClient(verify=context) as https:
            ready = await https.get(f"https://127.0.0.1:{port}/v2/health/ready")
            assert ready.status_code == 200
            answer = await https.post(
                f"https://127.0.0.1:{port}/v2/models/simple/infer", json=SIMPLE
            )
            assert answer.status_code == 200
