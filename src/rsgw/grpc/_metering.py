"""`metered`: the status and latency of one handled call, observed exactly once.

Every service counts its calls the same way: the status the call ends with (OK,
the code of the `RsgwError` it raised, DEADLINE_EXCEEDED or CANCELLED when it was
cancelled, INTERNAL for anything else) and how long it took. One context manager
does it for the gateway, its control plane and the worker, so the rule lives in
one place. It is a plain class, not a generator: it sits on the ModelInfer path.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rsgw.base._status import StatusCode

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from rsgw.base._call import CallContext


class Meter:
    """The call being metered: set `label` once known; clear `timed` to skip the latency.

    A call refused before any work (a malformed request, a shed) is counted but
    observes no latency, so refusals cannot drag the latency histogram down.
    """

    __slots__ = ("_call", "_observe", "_started", "code", "label", "timed", "upstream")

    def __init__(
        self,
        call: CallContext,
        observe: Callable[[StatusCode, str, float | None, str], None],
        label: str = "",
    ) -> None:
        self._call = call
        self._observe = observe
        self.label = label
        self.timed = True
        self._started = 0.0
        #: The status the call ended with, once it has (for an access log).
        self.code = StatusCode.OK
        #: Who answered it, where a handler passes calls on (the gateway: a worker).
        self.upstream = ""

    def __enter__(self) -> Meter:
        self._started = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        code = self.code = StatusCode.OK if exc is None else self._call.status_for(exc)
        seconds = time.perf_counter() - self._started if self.timed else None
        self._observe(code, self.label, seconds, self._call.protocol)


#: Meter a handler's work: `with metered(call, observe) as meter: ...`. The class
#: itself, so the ModelInfer path pays no extra call for the spelling.
metered = Meter
