"""The access log: one `access` line for a sample of the ModelInfer calls.

Off by default (`logging.access_log_sample_rate: 0`); at 1, every call. Lines are
held to `logging.access_log_max_per_second` by a `LogBudget`, and the next line let
through says how many were `suppressed`, so a traffic spike cannot become a log
spike. The sampling decision is made when a call starts (one random number), so an
unsampled call pays nothing more. A call whose trace is sampled (`tracing:`) has its
`trace_id` and `span_id` (the gateway's server span) on its line, so a line leads to
its trace.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping

from rsgw.base._call import CallContext
from rsgw.grpc._metering import Meter
from rsgw.grpc.protocol._metadata import HeaderBlock
from rsgw.runtime._log_budget import LogBudget

logger = logging.getLogger("rsgw.access")

#: The metadata key a client may send to name its request; forwarded to the worker.
REQUEST_ID = b"x-request-id"


def request_id(metadata: HeaderBlock) -> bytes | None:
    """The client's `x-request-id`, if it sent one."""
    for name, value in metadata:
        if name == REQUEST_ID:
            return value
    return None


class AccessLog:
    """Samples calls and writes their `access` lines (see the module docstring)."""

    def __init__(
        self, sample_rate: float, max_per_second: int, label: Callable[[str], str]
    ) -> None:
        self._rate = sample_rate
        #: A worker URL -> its name in logs.
        self._label = label
        self._budget = LogBudget(burst=max_per_second, seconds=1.0)

    def sampled(self) -> bool:
        """Whether the call starting now gets a line."""
        return self._rate >= 1.0 or random.random() < self._rate

    def write(
        self,
        call: CallContext,
        meter: Meter,
        rpc: str,
        seconds: float,
        trace: Mapping[str, str] | None = None,
    ) -> None:
        """The call is over: its line, unless this second's budget is spent; `trace`
        (`trace_id`, `span_id`) when its trace is sampled."""
        suppressed = self._budget.take("access", time.monotonic())
        if suppressed is None or not logger.isEnabledFor(logging.INFO):
            return
        rid = request_id(call.metadata)
        extra = {
            "rpc": rpc,
            "model": meter.label,
            "worker": self._label(meter.upstream) if meter.upstream else "",
            "status": meter.code.name,
            "duration_ms": round(seconds * 1e3, 3),
            "request_id": "" if rid is None else rid.decode("utf-8", "replace")[:128],
            "peer": call.peer,
        }
        if trace is not None:
            extra.update(trace)
        if suppressed:
            extra["suppressed"] = suppressed
        logger.info("access", extra=extra)
