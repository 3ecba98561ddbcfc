"""The command line's log lines: RFC 3339 timestamps, quiet libraries, storms held back."""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from rsgw._logging import JsonFormatter, log_limited, rfc3339, timestamp


def test_json_lines_carry_an_rfc3339_utc_timestamp() -> None:
    record = logging.LogRecord("rsgw.x", logging.INFO, "", 0, "gateway serving", (), None)
    record.created = 1796331992.2064
    record.port = 8001
    entry = json.loads(JsonFormatter().format(record))
    assert entry == {
        "ts": "2026-12-03T21:06:32.206Z",
        "level": "info",
        "logger": "rsgw.x",
        "event": "gateway serving",
        "port": 8001,
    }
    assert rfc3339(0.0) == "1970-01-01T00:00:00.000Z"
    assert timestamp(entry) == pytest.approx(1796331992.206)


def test_a_storm_of_one_kind_of_line_is_held_back(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("rsgw.test_storm")
    event = f"worker error {uuid.uuid4()}"  # the budget is process-wide
    with caplog.at_level(logging.WARNING, logger="rsgw.test_storm"):
        for _ in range(50):
            log_limited(logger, logging.WARNING, event, {"worker": "w0"}, "w0")
        log_limited(logger, logging.WARNING, event, {"worker": "w1"}, "w1")
    lines = [r for r in caplog.records if r.getMessage() == event]
    assert [r.__dict__["worker"] for r in lines] == ["w0"] * 10 + ["w1"]
