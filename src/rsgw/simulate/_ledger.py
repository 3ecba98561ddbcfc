"""What each simulated worker holds of the handed models, counted against its budget.

The gateway's memory ledger in virtual time, for the cold path (`_cold`): the pure
bookkeeping both share is `rsgw.scheduling.placement._copies.CopyBook` (copies from
the moment their load is asked until their unload has answered, the load times
learned, and the `memory()`, `terms()` and `facts()` snapshots the pure decisions
take). The gateway's ledger adds Trio events, room locks and following the workers'
RepositoryIndex answers; here nothing loads or unloads behind the simulated gateway's
back, so this one adds only which models have loads under way.

Pure: no Trio, no clock (callers pass `now`).
"""

from __future__ import annotations

from collections.abc import Sequence

from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.scheduling.placement._copies import CopyBook


class SimLedger(CopyBook):
    """Each worker's copies of the handed models; see the module docstring.

    Args:
        config: the gateway's `repository` block (budgets, weights, floors, eviction).
        urls: the workers, in the gateway's order (the planner's tie order).
    """

    def __init__(self, config: RepositoryConfig, urls: Sequence[str]) -> None:
        # As `MetaPoller.weight_of`: configured, else the default (the simulated
        # workers report the same bytes).
        weights, default = config.weight_bytes, config.default_weight_bytes
        super().__init__(config, lambda model: weights.get(model, default), urls=urls)
        #: model -> the workers its loads under way are on.
        self._loads: dict[str, set[str]] = {}

    def load_under_way(self, model: str) -> bool:
        return model in self._loads

    def begin_load(self, model: str, url: str) -> bool:
        """Count a load of `model` on `url` from now, if it fits."""
        if not self.take_load(model, url):
            return False
        self._loads.setdefault(model, set()).add(url)
        return True

    def end_load(
        self, model: str, url: str, *, now: float, seconds: float, protected: bool
    ) -> None:
        """A load answered (they all succeed here: the ledger never asks past a budget)."""
        self.load_answered(model, url, loaded=True, now=now, seconds=seconds, protected=protected)
        urls = self._loads[model]
        urls.discard(url)
        if not urls:
            del self._loads[model]

    def end_unload(self, model: str, url: str) -> None:
        self.unload_answered(model, url, unloaded=True)
