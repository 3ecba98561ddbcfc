"""Which models to look for on workers that cannot list theirs.

Pure. A worker without RepositoryIndex (KServe's ModelServer) cannot say what it
serves, only whether a model it is asked about is ready (ModelReady). So discovery
asks such workers about a set of candidate models each probe round, and the routing
table is built from their answers as from an index. The candidates are:
- the models named in configuration (`discovery.models`), always;
- models a client asked for that some such worker turned out to serve (an
  on-demand lookup, below), for as long as a round has found one ready in the last
  `found_ttl` seconds.

An on-demand lookup happens when a call names a model the table does not have: the
gateway asks the index-less workers once, and what they say is remembered. It is
bounded, because model names are client-chosen: one lookup per model at a time (a
second call for the same name waits for the first's answer), a name found nowhere is
not looked up again for `miss_ttl` seconds (a storm of calls for it costs one
lookup), at most `per_second` lookups start in any second (a storm of distinct names
costs that, and the rest are answered NOT_FOUND at once), and at most `max_models`
names are remembered either way, the least recently used forgotten first.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable

#: How long a model found on demand stays a candidate after a round last found it.
DEFAULT_FOUND_TTL_SECONDS = 300.0
#: How long a name found nowhere is not looked up again.
DEFAULT_MISS_TTL_SECONDS = 10.0
#: On-demand lookups started per second, at most.
DEFAULT_LOOKUPS_PER_SECOND = 10
#: Names remembered (found and missed together), at most.
DEFAULT_MAX_MODELS = 4096


class ModelLookups:
    """The candidates and the on-demand lookups' memory; see the module docstring."""

    def __init__(
        self,
        configured: Iterable[str] = (),
        *,
        found_ttl: float = DEFAULT_FOUND_TTL_SECONDS,
        miss_ttl: float = DEFAULT_MISS_TTL_SECONDS,
        per_second: int = DEFAULT_LOOKUPS_PER_SECOND,
        max_models: int = DEFAULT_MAX_MODELS,
    ) -> None:
        self.configured = tuple(dict.fromkeys(configured))
        self.found_ttl = found_ttl
        self.miss_ttl = miss_ttl
        self.per_second = per_second
        self.max_models = max_models
        #: model -> when a round or a lookup last found it ready.
        self._found: OrderedDict[str, float] = OrderedDict()
        #: model -> when a lookup last found it nowhere.
        self._missed: OrderedDict[str, float] = OrderedDict()
        self._looking: set[str] = set()
        self._window = -math.inf
        self._started_in_window = 0

    def candidates(self, now: float) -> tuple[str, ...]:
        """The models to ask index-less workers about this round."""
        self._expire(now)
        return self.configured + tuple(m for m in self._found if m not in self.configured)

    def seen(self, models: Iterable[str], now: float) -> None:
        """A round found `models` ready on some index-less worker: they stay candidates."""
        for model in models:
            if model in self._found:
                self._found[model] = now
                self._found.move_to_end(model)

    def begin(self, model: str, now: float) -> bool:
        """Whether to look `model` up now; if so it is marked as being looked up, and
        `end` must follow. False: it is being looked up (wait for that), was found
        nowhere a moment ago, or this second's lookups are spent."""
        if model in self._looking:
            return False
        missed = self._missed.get(model)
        if missed is not None and now - missed < self.miss_ttl:
            return False
        if now - self._window >= 1.0:
            self._window, self._started_in_window = now, 0
        if self._started_in_window >= self.per_second:
            return False
        self._started_in_window += 1
        self._looking.add(model)
        return True

    def looking(self, model: str) -> bool:
        return model in self._looking

    def end(self, model: str, found: bool, now: float) -> None:
        """The lookup `begin` allowed is over: `found` on some index-less worker, or not."""
        self._looking.discard(model)
        self._missed.pop(model, None)
        self._found.pop(model, None)
        (self._found if found else self._missed)[model] = now
        while len(self._found) + len(self._missed) > self.max_models:
            oldest = self._missed if self._missed else self._found
            oldest.popitem(last=False)

    def abandon(self, model: str) -> None:
        """The lookup `begin` allowed was cut short: nothing learned."""
        self._looking.discard(model)

    def _expire(self, now: float) -> None:
        for model, at in list(self._found.items()):
            if now - at > self.found_ttl:
                del self._found[model]
        for model, at in list(self._missed.items()):
            if now - at >= self.miss_ttl:
                del self._missed[model]
