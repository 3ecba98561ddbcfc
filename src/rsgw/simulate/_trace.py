"""Request traces for `rsgw simulate --trace`: recorded arrivals instead of Poisson ones.

Three formats, told apart by their content:

* CSV with a header naming at least `time` and `model` (and optionally `rows`): one
  call per line, `time` in seconds from any origin;
* JSON Lines, one object per call with the same keys;
* the gateway's own JSON log (`rsgw run --log-format json` with
  `logging.access_log_sample_rate: 1`): every `access` line of a ModelInfer becomes a
  call that started `duration_ms` before the line's timestamp. Lines of other events
  are skipped. A sampled access log gives a sampled trace: scale the load with the
  sample rate in mind.

Times are shifted so the first call is at 0 and sorted. `write_csv` writes the CSV
form, so a converted log can be kept and edited.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from rsgw.runtime._logging import timestamp
from rsgw.simulate._results import Schedule


class TraceError(Exception):
    """A trace that cannot be used: names the file, the line and the problem."""


def load_trace(path: Path, models: Sequence[str]) -> Schedule:
    """The calls of the trace at `path`, for a fleet serving `models`.

    Raises:
        TraceError: unreadable, no calls, a bad line, or a model the scenario lacks.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file") from None
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.lstrip().startswith("{"):
        calls = list(_json_lines(path, text))
    else:
        calls = list(_csv(path, text))
    if not calls:
        raise TraceError(
            f"{path}: no calls (CSV with time,model[,rows], JSON Lines, or an "
            "rsgw JSON log with access lines)"
        )
    index = {name: i for i, name in enumerate(models)}
    unknown = sorted({model for _, model, _ in calls if model not in index})
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise TraceError(f"{path}: models the scenario does not serve: {shown}")
    calls.sort(key=lambda call: call[0])
    origin = calls[0][0]
    return Schedule(
        [t - origin for t, _, _ in calls],
        [index[model] for _, model, _ in calls],
        [rows for _, _, rows in calls],
    )


def write_csv(schedule: Schedule, models: Sequence[str], path: Path) -> None:
    """The trace as CSV (`time,model,rows`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["time", "model", "rows"])
    rows = schedule.rows or [1] * len(schedule.times)
    for t, m, r in zip(schedule.times, schedule.models, rows, strict=True):
        writer.writerow([f"{t:.6f}", models[m], r])
    path.write_text(out.getvalue())


def _call(path: Path, line: int, t: object, model: object, rows: object) -> tuple[float, str, int]:
    try:
        seconds = float(t)  # type: ignore[arg-type]
        count = int(rows)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{line}: time must be a number and rows an integer") from None
    if not math.isfinite(seconds) or count < 1 or not isinstance(model, str) or not model:
        raise TraceError(f"{path}:{line}: needs a finite time, a model name and rows >= 1")
    return seconds, model, count


def _csv(path: Path, text: str) -> Iterable[tuple[float, str, int]]:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or not {"time", "model"} <= set(reader.fieldnames):
        raise TraceError(f"{path}: a CSV trace needs a header with time and model (and rows)")
    for record in reader:
        yield _call(path, reader.line_num, record["time"], record["model"], record.get("rows") or 1)


def _json_lines(path: Path, text: str) -> Iterable[tuple[float, str, int]]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise TraceError(f"{path}:{number}: not JSON") from None
        if not isinstance(record, dict):
            raise TraceError(f"{path}:{number}: expected an object")
        if "event" in record:  # an rsgw log line: only ModelInfer access lines are calls
            if record.get("event") != "access" or record.get("rpc") != "ModelInfer":
                continue
            try:
                ended = timestamp(record)
            except (KeyError, ValueError):
                raise TraceError(f"{path}:{number}: access line without a valid ts") from None
            started = ended - float(record.get("duration_ms", 0.0)) / 1000
            yield _call(path, number, started, record.get("model"), 1)
        else:
            yield _call(
                path, number, record.get("time"), record.get("model"), record.get("rows", 1)
            )
