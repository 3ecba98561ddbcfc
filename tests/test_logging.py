"""The command line's log lines: RFC 3339 timestamps, quiet libraries, storms held back,
and the format: text on a terminal, JSON lines elsewhere, unless told."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import TextIO

import pytest

from rsgw.runtime._logging import (
    FORMATS,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    log_limited,
    resolve_format,
    rfc3339,
    timestamp,
)


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


# -- the format ---------------------------------------------------------------------------------

#: A text line: local time to the millisecond, the level padded, the logger, the event.
TEXT_LINE = re.compile(r"\d\d:\d\d:\d\d\.\d{3} (debug|info|warning|error)\s+[\w.]+: .+")


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level put back after `configure_logging`."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


@contextlib.contextmanager
def terminal() -> Iterator[tuple[TextIO, int]]:
    """A pseudo-terminal: its writing end as a text stream, and the reading end's fd."""
    reader, writer = os.openpty()
    stream = os.fdopen(writer, "w", encoding="utf-8")
    try:
        yield stream, reader
    finally:
        stream.close()
        os.close(reader)


def read_available(fd: int, wait: float = 5.0) -> str:
    """What `fd` has to read within `wait` seconds, until it goes quiet."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + wait
    while select.select([fd], [], [], 0.2 if chunks else deadline - time.monotonic())[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # a pty whose other end is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_auto_is_the_default_and_every_format_is_selectable() -> None:
    assert FORMATS == ("auto", "json", "text")
    with terminal() as (tty, _):
        assert tty.isatty()
        assert resolve_format("auto", tty) == "text"
        assert resolve_format("json", tty) == "json"
    read_end, write_end = os.pipe()
    with os.fdopen(read_end), os.fdopen(write_end, "w") as pipe:
        assert resolve_format("auto", pipe) == "json"
        assert resolve_format("text", pipe) == "text"


def test_auto_logs_text_to_a_terminal(root_logger: logging.Logger) -> None:
    with terminal() as (tty, reader):
        assert configure_logging("info", "auto", tty) == "text"
        logging.getLogger("rsgw.test").info("gateway serving", extra={"grpc_port": 8001})
        tty.flush()
        (line,) = read_available(reader).splitlines()
    assert TEXT_LINE.fullmatch(line), line
    assert line.endswith(" info    rsgw.test: gateway serving grpc_port=8001")


def test_auto_logs_json_lines_to_a_pipe(root_logger: logging.Logger) -> None:
    read_end, write_end = os.pipe()
    with os.fdopen(read_end) as reader, os.fdopen(write_end, "w") as pipe:
        assert configure_logging("info", "auto", pipe) == "json"
        logging.getLogger("rsgw.test").info("gateway serving", extra={"grpc_port": 8001})
        pipe.close()
        (line,) = reader.read().splitlines()
    entry = json.loads(line)
    assert entry["event"] == "gateway serving" and entry["grpc_port"] == 8001


def test_a_stream_without_isatty_is_no_terminal() -> None:
    class Sink:
        def write(self, text: str) -> int:
            return len(text)

    assert resolve_format("auto", Sink()) == "json"  # type: ignore[arg-type]


def test_text_lines_quote_what_would_blur_the_fields() -> None:
    record = logging.LogRecord("rsgw.x", logging.WARNING, "", 0, "worker failed", (), None)
    record.created = 1796331992.2064
    record.msecs = 206.4
    record.__dict__.update(
        worker="w0", error="connection refused", ports={"grpc": 8080}, metrics_port=None
    )
    line = TextFormatter().format(record)
    assert TEXT_LINE.fullmatch(line), line
    assert line.endswith(
        '.206 warning rsgw.x: worker failed worker=w0 error="connection refused" '
        'ports={"grpc":8080} metrics_port=None'
    )


def test_rsgw_worker_on_a_terminal_logs_text() -> None:
    reader, writer = os.openpty()
    cmd = [sys.executable, "-m", "rsgw", "worker", "--port", "0", "--metrics-port", "0"]
    process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=writer, stderr=writer)
    os.close(writer)
    try:
        seen = ""
        deadline = time.monotonic() + 20
        while "worker serving" not in seen and time.monotonic() < deadline:
            seen += read_available(reader, 1.0)
        serving = [line for line in seen.splitlines() if "worker serving" in line]
        assert serving, seen
        assert TEXT_LINE.fullmatch(serving[0].strip()), serving[0]
        assert re.search(r" grpc_port=\d+ ", serving[0])
        assert not any(line.lstrip().startswith("{") for line in seen.splitlines())
    finally:
        process.terminate()
        process.wait(10)
        os.close(reader)
