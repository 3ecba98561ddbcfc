"""One bounded probe call to a worker: its parsed reply, its failure, or a hang.

The prober's readiness checks, discovery's index and ModelReady reads and the
routing-metadata polls all call workers the same way: outside the stream cap (a few
per round, and they must not queue behind a full load of inference, or a busy worker
looks hung), under a gRPC deadline inside a watchdog, with the reply parsed on the
spot. Whatever goes wrong is that worker's failed probe, never the round's: a reply
that does not parse is logged (rate-limited) and counted as a failure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import trio
from google.protobuf.message import DecodeError, Message

from rsgw.base._errors import GrpcError, RsgwError
from rsgw.base._status import StatusCode
from rsgw.runtime._logging import log_limited

if TYPE_CHECKING:
    from rsgw.base._methods import Method
    from rsgw.gateway.fleet._pool import WorkerPool

logger = logging.getLogger(__name__)

#: Watchdog on each probe call (the original's PROBE_TIMEOUT_SECONDS).
DEFAULT_PROBE_TIMEOUT = 8.0
#: gRPC deadline of each probe call, inside the watchdog.
PROBE_DEADLINE = 5.0

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class ProbeResult(Generic[M]):
    """One worker's answer to one probe call: its parsed reply, a failure, or a hang."""

    reply: M | None
    timed_out: bool
    #: The worker's status and message when it answered with an error.
    error: GrpcError | None = None


async def probe_call(
    pool: WorkerPool,
    url: str,
    method: Method,
    request: bytes,
    response: type[M],
    watchdog_seconds: float = DEFAULT_PROBE_TIMEOUT,
) -> ProbeResult[M]:
    """One bounded probe call: a reply, a fast failure, or a hang (timed out)."""
    channel = pool.channels[url]
    with trio.move_on_after(watchdog_seconds):
        try:
            deadline = trio.current_time() + min(PROBE_DEADLINE, watchdog_seconds)
            reply = await channel.unary(method.wire, request, deadline=deadline, uncapped=True)
        except GrpcError as exc:
            return ProbeResult(None, exc.code is StatusCode.DEADLINE_EXCEEDED, exc)
        except RsgwError:  # unreachable, or its reply was cut short
            return ProbeResult(None, False)
        try:
            return ProbeResult(response.FromString(reply), False)
        except DecodeError as exc:
            worker = pool.label(url)
            extra = {"worker": worker, "rpc": method.rpc, "error": str(exc)}
            log_limited(
                logger,
                logging.WARNING,
                "a worker's probe reply does not parse; counted as a failed probe",
                extra,
                (method.rpc, worker),
            )
            return ProbeResult(None, False)
    return ProbeResult(None, True)


def answer_of(result: ProbeResult[M] | RsgwError) -> ProbeResult[M]:
    """A worker's probe result out of a fan-out. `probe_call` answers every failure of
    a worker with a result; an `RsgwError` that still came out of it is that worker's
    failed probe, never the round's."""
    return result if isinstance(result, ProbeResult) else ProbeResult(None, False)
