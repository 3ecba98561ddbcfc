"""REST errors: Triton's `{"error": "..."}` bodies, and the HTTP status of each gRPC status.

Pure. Triton's REST server answers a failed call with its message in a JSON object
and an HTTP status chosen by the kind of failure; rsgw answers the same call the way
its gRPC door would, so the status comes from the gRPC code (docs/api.md):
NOT_FOUND 404, UNAVAILABLE 503, UNIMPLEMENTED 501 and INTERNAL 500 as Triton writes
them; where Triton answers every other failure 400, rsgw says what a client or a load
balancer can act on: a call shed for overload is 429 (retry later, elsewhere), one the
gateway's deadline ended 504, one without valid credentials 401 and one whose role
does not allow it 403. Anything else is the request's fault: 400.
"""

from __future__ import annotations

import json

from rsgw.base._status import StatusCode

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

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def http_status(code: StatusCode) -> int:
    """The HTTP status of a call that ended with gRPC status `code` (not OK)."""
    return HTTP_STATUS.get(code, 400)


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, ensure_ascii=False).encode()
