"""Sequence affinity: which worker holds each live sequence of a stateful model.

Pure. A stateful model (Triton's sequence batcher) keeps a sequence's state on the
worker that took its `sequence_start`, so every later request of that sequence must
go there too, until `sequence_end` or until the sequence has been idle too long. A
model-blind proxy cannot do this; the gateway reads the sequence flags from the raw
request (`peek_routing`) and keeps this table.

Rules:
- a request with `sequence_start` is routed as any other; the worker that answers it
  becomes the sequence's holder (a restarted sequence id simply moves);
- a later request of a live sequence goes to its holder only, with no failover: if
  the holder is not ready the request fails ABORTED (its state is gone with it; the
  client must start the sequence again), never silently on another worker;
- `sequence_end` forgets the sequence once its request is routed;
- a request of a sequence the table does not know (never started here, or idle past
  `idle_seconds`) is routed as any other; the model itself then says what it says
  about a sequence it never saw;
- sequence ids are client-chosen, so the table is bounded: past `max_sequences` the
  least recently used sequence is forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from rsgw.base._errors import GrpcError
from rsgw.base._status import StatusCode
from rsgw.scheduling.calls._wire import SequenceFlags

#: How long a sequence may stay idle before the gateway forgets it: far above
#: Triton's own idle default (1 s), so the worker, not the gateway, decides.
DEFAULT_IDLE_SECONDS = 600.0
#: The most sequences remembered at once.
DEFAULT_MAX_SEQUENCES = 100_000


class SequenceTable:
    """model and sequence id -> the worker holding it; see the module docstring."""

    def __init__(
        self,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
    ) -> None:
        self.idle_seconds = idle_seconds
        self.max_sequences = max_sequences
        #: Least recently used first.
        self._holders: OrderedDict[tuple[str, int | str], tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._holders)

    def holder(self, model: str, sequence_id: int | str, now: float) -> str | None:
        """The worker holding a live sequence (its idle clock restarts), else None."""
        key = (model, sequence_id)
        entry = self._holders.get(key)
        if entry is None:
            return None
        url, last = entry
        if now - last > self.idle_seconds:
            del self._holders[key]
            return None
        self._holders[key] = (url, now)
        self._holders.move_to_end(key)
        return url

    def started(self, model: str, sequence_id: int | str, url: str, now: float) -> None:
        """`url` answered the sequence's start: it holds the sequence from now on."""
        key = (model, sequence_id)
        self._holders[key] = (url, now)
        self._holders.move_to_end(key)
        self._expire(now)

    def ended(self, model: str, sequence_id: int | str) -> None:
        self._holders.pop((model, sequence_id), None)

    def pinned(
        self,
        model: str,
        sequence_id: int | str,
        replicas: tuple[str, ...],
        now: float,
        who: Callable[[str], str],
    ) -> str | None:
        """Where a live sequence's request must go: its holder, or None (not a
        sequence we know: routed as any other request).

        Raises:
            GrpcError: ABORTED (`holder_lost`, naming the worker as `who(url)` names
                it) when the holder is no longer among `replicas`; the sequence is
                forgotten then.
        """
        holder = self.holder(model, sequence_id, now)
        if holder is not None and holder not in replicas:
            self.ended(model, sequence_id)
            raise holder_lost(model, sequence_id, who(holder))
        return holder

    def routed(self, model: str, sequence: SequenceFlags, url: str | None, now: float) -> None:
        """A request of `sequence` went to `url` (None: nowhere): its end forgets
        the sequence, its start makes `url` the holder."""
        if sequence.end:
            self.ended(model, sequence.id)
        elif sequence.start and url is not None:
            self.started(model, sequence.id, url, now)

    def _expire(self, now: float) -> None:
        holders = self._holders
        while holders:
            key, (_, last) = next(iter(holders.items()))
            if now - last <= self.idle_seconds and len(holders) <= self.max_sequences:
                return
            del holders[key]


def holder_lost(model: str, sequence_id: int | str, worker: str) -> GrpcError:
    """A live sequence's worker is gone: its state with it (see the module docstring)."""
    return GrpcError(
        StatusCode.ABORTED,
        f"sequence {sequence_id!r} of model '{model}' was held by {worker}, which is "
        "unavailable; its state is lost: start the sequence again",
    )
