"""gRPC status codes and their names.

Pure: no I/O. The tables here are the single place where a status code becomes a
string, both the canonical upper-case name (grpcio's spelling, used by worker
metrics) and the CamelCase label the gateway's metrics use (docs/original.md §6.1,
extended to every code by docs/product.md §3.5).
"""

from __future__ import annotations

import enum


class StatusCode(enum.IntEnum):
    """The seventeen canonical gRPC status codes."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

    @property
    def camel(self) -> str:
        """CamelCase label value, as the gateway's metrics spell statuses."""
        return _CAMEL[self]


_CAMEL: dict[StatusCode, str] = {
    code: "OK" if code is StatusCode.OK else "".join(p.title() for p in code.name.split("_"))
    for code in StatusCode
}


def status_from_wire(value: bytes | str | None) -> StatusCode:
    """The code a `grpc-status` trailer carries; missing or garbage is UNKNOWN."""
    if value is None:
        return StatusCode.UNKNOWN
    try:
        return StatusCode(int(value))
    except ValueError:
        return StatusCode.UNKNOWN
