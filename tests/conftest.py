"""Fixtures shared by every test module, and the hypothesis profiles.

`CI=1` selects the `ci` hypothesis profile: derandomized (a fixed seed per test,
so a red build reproduces) and without per-example deadlines (shared CI machines
stall). Elsewhere the `dev` profile keeps hypothesis's random exploration.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from tests.helpers import WorkerProcess, start_worker_process

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def worker_process() -> Iterator[WorkerProcess]:
    """One `rsgw worker` subprocess with the built-in catalogue, shared by the session.

    Tests that use it must leave it as they found it (unregister their regions).
    Tests that stop a worker start their own with `worker_process_factory`.
    """
    worker = start_worker_process("--name", "e2e", "--gpu", "7")
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture
def worker_process_factory() -> Iterator[Callable[..., WorkerProcess]]:
    """Start `rsgw worker` subprocesses with extra flags; each is stopped after the test."""
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        worker = start_worker_process(*args)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()
