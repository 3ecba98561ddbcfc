"""The scheduling knobs (rsgw.scheduling.knobs._knobs): the table, `validate_knob`, the checks.

gateway.yml reaches these checks through `SchedulingConfig` (tests/test_config.py covers
that path, key by key); here they are called directly, as the runtime control plane
calls them.
"""

from __future__ import annotations

import dataclasses

import pytest

from rsgw.base._errors import ConfigError
from rsgw.scheduling.knobs._knobs import (
    RUNTIME_KNOBS,
    SCHEDULING_KNOBS,
    CompactionMode,
    RoutingPolicy,
    SchedulingMode,
    check_compaction_mode,
    check_replicas,
    check_routing_policy,
    validate_knob,
)
from rsgw.scheduling.knobs._settings import SchedulingConfig


def test_validate_knob_uses_the_yaml_checks() -> None:
    assert validate_knob("mode", "LPT_PACKING") is SchedulingMode.LPT_PACKING
    assert validate_knob("default_replicas", "all") == "all"
    assert validate_knob("hysteresis", 0) == 0.0
    assert validate_knob("compaction_interval", 0) == 0
    assert validate_knob("forbid_memory_oversubscription", False) is False
    with pytest.raises(
        ConfigError, match=r"scheduling.rebalance_compute_seconds must be positive, got -1"
    ):
        validate_knob("rebalance_compute_seconds", -1)
    with pytest.raises(ConfigError, match=r"policy\.hysteresis must be in"):
        validate_knob("hysteresis", 2.0, key="policy.hysteresis")


def test_validate_knob_unknown_name() -> None:
    with pytest.raises(ConfigError) as info:
        validate_knob("rebalance", 1)
    message = str(info.value)
    assert message.startswith(
        "unknown scheduling knob 'rebalance'; accepted: compaction_interval, "
    )
    assert "work_basis" in message


def test_knob_tables() -> None:
    assert set(SCHEDULING_KNOBS) == {
        f.name for f in dataclasses.fields(SchedulingConfig) if f.name != "models"
    }
    assert {"mode", "max_worker_share"}.isdisjoint(RUNTIME_KNOBS)
    assert len(RUNTIME_KNOBS) == 12


@pytest.mark.parametrize(("name", "bad"), [(n, object()) for n in SCHEDULING_KNOBS])
def test_every_knob_rejects_a_foreign_object(name: str, bad: object) -> None:
    with pytest.raises(ConfigError, match=f"scheduling.{name}"):
        validate_knob(name, bad)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1), (8, 8), ("all", "all"), (" ALL ", "all"), ("3", 3), (" +4 ", 4)],
)
def test_replicas_accepts_counts_and_all(value: object, expected: object) -> None:
    assert check_replicas(value, "k") == expected


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "", "some", "0", "1" * 19, None])
def test_replicas_rejects_the_rest_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^k must be a positive integer or 'all', got "):
        check_replicas(value, "k")


def test_routing_policy_points_least_outstanding_at_the_mode() -> None:
    assert check_routing_policy(" Fill_RR ", "k") is RoutingPolicy.FILL_RR
    with pytest.raises(ConfigError, match=r"Set scheduling\.mode: least_outstanding instead"):
        check_routing_policy("least_outstanding", "k")


def test_compaction_mode_reads_yaml_false_as_off() -> None:
    assert check_compaction_mode(False, "k") is CompactionMode.OFF
    assert check_compaction_mode("Scheduled", "k") is CompactionMode.SCHEDULED
    with pytest.raises(ConfigError, match=r"^k must be 'off', 'eager', or 'scheduled', got 'on'$"):
        check_compaction_mode("on", "k")
    with pytest.raises(ConfigError, match=r"^config 'k' must be a string, got True$"):
        check_compaction_mode(True, "k")
