"""Calls made from another host (run there by `tests.netns.OtherHost.command`).

    python -I tests/remote_calls.py CALLS_JSON

(-I: tests/grpc would shadow grpcio from the script's own folder.)

CALLS_JSON: {"grpc": "host:port", "http": "http://host:port", "calls": [...]}, each
call either ["grpc", path, body_hex, token] or ["rest", method, path, json_body,
token] (token may be null). Prints one JSON list: each gRPC call's status code
name, each REST call's HTTP status.
"""

from __future__ import annotations

import json
import sys

import grpc
import httpx


def main() -> None:
    plan = json.loads(sys.argv[1])
    results: list[str | int] = []
    with grpc.insecure_channel(plan["grpc"]) as channel, httpx.Client(timeout=10) as http:
        for kind, *call in plan["calls"]:
            if kind == "grpc":
                path, body, token = call
                metadata = () if token is None else (("authorization", f"Bearer {token}"),)
                try:
                    channel.unary_unary(path)(bytes.fromhex(body), metadata=metadata, timeout=10)
                    results.append("OK")
                except grpc.RpcError as exc:
                    results.append(exc.code().name)
            else:
                method, path, body, token = call
                headers = {} if token is None else {"authorization": f"Bearer {token}"}
                answer = http.request(method, plan["http"] + path, json=body, headers=headers)
                results.append(answer.status_code)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
