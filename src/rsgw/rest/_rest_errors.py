"""REST errors: Triton's `{"error": "..."}` bodies, and the HTTP status of each gRPC status.

Pure. Triton's REST server answers a failed call with its message in a JSON object
and an HTTP status chosen by the kind of failure; rsgw answers the same call the way
its gRPC door would, so the status comes from the gRPC code (docs/api.md):
NOT_FOUND 404, UNAVAILABLE 503, UNIMPLEMENTED 501 and INTERNAL 500 as Triton writes
them; where Triton answers every other failure 400, rsgw says what a client or a load
balancer can act on: a call shed for overload is 429 (retry later, elsewhere), one the
gateway's deadline ended 504, one without valid credentials 401 and one whose role
does not allow it 403. Anything else is the request's fault: 400.

A call refused with gRPC's server pushback (`grpc-retry-pushback-ms`, gRFC A6: a tenant
over its rate quota is told when its next call fits) is answered with `Retry-After`,
the pushback in whole seconds rounded up, as HTTP says a 429 may be.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from rsgw.base._status import StatusCode

#: gRPC's server pushback trailer, in milliseconds.
PUSHBACK = b"grpc-retry-pushback-ms"

HTTP_STATUS: dict[StatusCode, int] = {
    StatusCode.NOT_FOUND: 404,
    StatusCode.UNAVAILABLE: 503,
    StatusCode.UNIMPLEMENTED: 501,
    StatusCode.INTERNAL: 500,
    StatusCode.RESOURCE_EXHAUSTED: 429,
    StatusCode.DEADLINE_EXCEEDED: 504,
    StatusCode.UNAUTHENTICATED: 401,
    StatusCode.PERMISSION_DENIED: 403,
}


class RestError(Exception):
    """A REST request answered with `status` and `{"error": message}`."""

    def __init__(
        self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        #: Headers the answer carries besides its body's (`Retry-After`).
        self.headers = headers or []


def http_status(code: StatusCode) -> int:
    """The HTTP status of a call that ended with gRPC status `code` (not OK)."""
    return HTTP_STATUS.get(code, 400)


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, ensure_ascii=False).encode()


def retry_after(trailers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`Retry-After` for a call whose trailers push back (the last pushback wins, as a
    header repeated); none for none, or for a value that is not a count of
    milliseconds (gRFC A6: that means "do not retry", which HTTP cannot say)."""
    headers: list[tuple[bytes, bytes]] = []
    for name, value in trailers:
        if name == PUSHBACK and value.isdigit():
            headers = [(b"retry-after", b"%d" % -(-int(value) // 1000))]
    return headers
