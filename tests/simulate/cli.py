"""`rsgw simulate` as a real process, for the tests of its command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parents[2] / "bench" / "fleet" / "scenarios"


def simulate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m rsgw simulate ARGS` and return what it printed and its exit."""
    return subprocess.run(
        [sys.executable, "-m", "rsgw", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
