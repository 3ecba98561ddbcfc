"""Log formatting for the command line: JSON lines (default) or plain text.

The library never touches the root logger; only `rsgw` commands call
`configure_logging`. Each record is a stable event name (the message) plus the
fields passed in `extra`, which the formatters render as JSON keys or `k=v`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

#: LogRecord attributes that are not user fields.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """`time level logger: event k=v ...` for people reading a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        fields = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname.lower():<7} {record.name}: {record.getMessage()}"
        if fields:
            line += " " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("json", "text")


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Send rsgw's (and hypercorn's) logs to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
