"""gRPC calls from another process: `python -m tests.as_user UID TARGET CALLS [OPEN]`.

The shared memory tests need a client whose socket belongs to another uid than
the server's (the server tells who a loopback client is from /proc/net/tcp). The
test suite runs as root; this process imports what it needs, drops to `UID`
(setgid/setuid, no way back) before it connects, then makes each call of CALLS_JSON (a list of
`[path, request hex, bearer token or null]`) on one grpcio channel and prints a
JSON list of `[status name, details, reply hex]`. OPEN (a JSON list of POSIX shm
keys) names objects it opens first, after the drop, as a client that made them does.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  # loaded lazily by socket; not readable after the drop
import json
import os
import sys

import grpc


def main() -> None:
    uid, target, calls = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    keys = json.loads(sys.argv[4]) if len(sys.argv) > 4 else []
    results = []
    # Made before the drop (grpc imports modules as it goes); it connects at the first
    # call, after the drop, so the socket is the other user's.
    with grpc.insecure_channel(target) as channel:
        os.setgid(uid)
        os.setuid(uid)
        held = [os.open("/dev/shm" + key, os.O_RDWR) for key in keys]
        for path, body, token in calls:
            metadata = () if token is None else (("authorization", f"Bearer {token}"),)
            try:
                reply = channel.unary_unary(path)(
                    bytes.fromhex(body), metadata=metadata, timeout=10
                )
                results.append(["OK", "", reply.hex()])
            except grpc.RpcError as exc:
                results.append([exc.code().name, exc.details(), ""])
    for fd in held:
        os.close(fd)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
