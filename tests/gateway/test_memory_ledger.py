"""The memory ledger's learned load times (issue 49): a worker loads one model after
another, so a load asked while others were under way there took only its own part."""

from __future__ import annotations

import pytest

from rsgw.config._fleet_blocks import RepositoryConfig
from rsgw.gateway.placement._memory_ledger import MemoryLedger


async def test_loads_asked_together_are_learned_as_their_own_time_each() -> None:
    config = RepositoryConfig(models=("a", "b", "c"), worker_budget_bytes=1000)
    ledger = MemoryLedger(config, lambda model: 100, lambda url: url)
    for model in ("a", "b", "c"):
        assert ledger.begin_load(model, "w0")
    # All three asked at t = 10; the worker answers them at 10.5, 11.0 and 11.5.
    for model, end in (("a", 10.5), ("b", 11.0), ("c", 11.5)):
        ledger.end_load(model, "w0", loaded=True, now=end, seconds=end - 10.0)
    for model in ("a", "b", "c"):
        assert ledger.load_times.expected(model) == pytest.approx(0.5)
    # A load asked alone, later, is its own time.
    assert ledger.begin_load("a", "w1")
    ledger.end_load("a", "w1", loaded=True, now=20.7, seconds=0.7)
    assert ledger.load_times.expected("a") == pytest.approx(0.5 + (0.7 - 0.5) / 4)
