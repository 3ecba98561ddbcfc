"""Log formatting for the command line: JSON lines or plain text.

The format `auto` (the default) is text when stderr is a terminal, a person
reading it, and JSON lines otherwise, for the tools that collect and parse them.
The library never touches the root logger; only `rsgw` commands call
`configure_logging`. Each record is a stable event name (the message) plus the
fields passed in `extra`, which the formatters render as JSON keys or `k=v`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Hashable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from rsgw.runtime._log_budget import LogBudget

#: LogRecord attributes that are not user fields.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


def rfc3339(created: float) -> str:
    """A record's time as RFC 3339 in UTC, to the millisecond: `2026-12-03T21:04:05.123Z`."""
    moment = datetime.fromtimestamp(created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def timestamp(entry: dict[str, Any]) -> float:
    """The Unix time of a JSON log entry's `ts` (for tools that read rsgw's logs)."""
    return datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


#: A field value written bare in text: no spaces, quotes or `=` that would blur `k=v`.
_BARE = re.compile(r"[^\s\"'=]+")


def _text_value(value: object) -> str:
    """A field's value as text: strings bare when they can be, else quoted; containers
    as compact JSON; numbers, booleans and None as Python writes them."""
    if isinstance(value, str):
        return value if _BARE.fullmatch(value) else json.dumps(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


class TextFormatter(logging.Formatter):
    """`time level logger: event k=v ...`, one line a record, for people at a terminal.

    The time is local, to the millisecond; a string value with a space or a quote is
    quoted, a dict or list is compact JSON. No colour: a node's children write to a
    pipe, and their lines would differ from the supervisor's.
    """

    def format(self, record: logging.LogRecord) -> str:
        moment = time.localtime(record.created)
        stamp = time.strftime("%H:%M:%S", moment) + f".{int(record.msecs):03d}"
        fields = " ".join(f"{k}={_text_value(v)}" for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname.lower():<7} {record.name}: {record.getMessage()}"
        if fields:
            line += " " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


#: The process's budget for lines a call can cause (a storm of failing calls).
STORMS = LogBudget()


def log_limited(
    logger: logging.Logger, level: int, event: str, extra: Mapping[str, Any], kind: Hashable = ()
) -> None:
    """Log `event` unless its kind (the event plus `kind`) is over its budget.

    For lines a single call can cause: past 10 of a kind in 10 s they are held
    back, and the next one let through carries `suppressed`, how many were.
    """
    if not logger.isEnabledFor(level):
        return
    suppressed = STORMS.take((event, kind), time.monotonic())
    if suppressed is None:
        return
    logger.log(level, event, extra={**extra, "suppressed": suppressed} if suppressed else extra)


LEVELS = ("debug", "info", "warning", "error")
#: `auto`: text on a terminal, json otherwise (`resolve_format`).
FORMATS = ("auto", "json", "text")


#: Libraries whose debug and info lines say nothing an operator of rsgw needs (h2 and
#: hpack log every frame, httpx every worker scrape): warnings and errors only.
QUIET_LOGGERS = ("h2", "hpack", "httpx", "httpcore", "hypercorn.access")


class _NoBanner(logging.Filter):
    """Drop hypercorn's "Running on ... (CTRL + C to quit)": rsgw logs its own ports."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Running on ")


def resolve_format(fmt: str, stream: TextIO | None = None) -> str:
    """The format `fmt` stands for on `stream` (default stderr): `auto` is text when
    the stream is a terminal and json when it is not (a pipe, a file, a collector);
    json and text are themselves."""
    if fmt != "auto":
        return fmt
    return "text" if _isatty(sys.stderr if stream is None else stream) else "json"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # not a file, or closed
        return False


def configure_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> str:
    """Send rsgw's (and hypercorn's) logs to `stream` (default stderr) in the chosen
    format; returns the format used (`auto` resolved to json or text)."""
    stream = sys.stderr if stream is None else stream
    resolved = resolve_format(fmt, stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if resolved == "json" else TextFormatter())
    handler.addFilter(_NoBanner())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    return resolved
