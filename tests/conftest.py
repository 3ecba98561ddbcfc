"""Fixtures shared by every test module, the hypothesis profiles, and the `slow` mark.

`CI=1` selects the `ci` hypothesis profile: derandomized (a fixed seed per test,
so a red build reproduces) and without per-example deadlines (shared CI machines
stall). Elsewhere the `dev` profile keeps hypothesis's random exploration.

`pytest -m "not slow"` runs the pure and memory-stream tests, a few minutes' worth;
CI runs everything. A test is slow when it starts processes or third-party servers
(its module is in `SLOW_MODULES`, or it uses a fixture in `SLOW_FIXTURES`), or when
it was measured at over about two seconds (`SLOW_TESTS`, by node id prefix; the CI
run prints the slowest 25, `--durations=25`), or it says so itself
(`@pytest.mark.slow`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from tests.helpers import WorkerProcess, start_worker_process

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

#: Modules whose tests start processes, third-party servers or real clusters.
SLOW_MODULES = frozenset(
    {
        "tests/coordination/",
        "tests/thirdparty/",
        "tests/node/",
        "tests/observability/test_prometheus.py",
        "tests/reliability/test_drain.py",
        "tests/reliability/test_exhaustion.py",
        "tests/reliability/test_hung_worker.py",
        "tests/reliability/test_membership_processes.py",
        "tests/gateway/test_run_cli.py",
        "tests/gateway/test_tls_processes.py",
        "tests/grpc/test_interop.py",
        "tests/test_doc_commands.py",
        "tests/test_grafana.py",
        "tests/test_deploy.py",
        "tests/worker/test_worker_e2e.py",
        "tests/worker/test_shm.py",
    }
)
#: Fixtures that start processes.
SLOW_FIXTURES = frozenset({"worker_process", "worker_process_factory"})
#: Single tests measured at over about two seconds, by node id prefix.
SLOW_TESTS = frozenset(
    {
        "tests/simulate/test_cli.py::",
        "tests/simulate/test_day.py::",
        "tests/simulate/test_trace.py::test_rsgw_simulate_replays_a_trace",
        "tests/simulate/test_engine.py::test_a_run_is_deterministic_for_its_seed",
        "tests/rest/test_rest_hostile.py::",
        "tests/rest/test_json_data.py::test_a_47_mib_body",
        "tests/gateway/test_cold_starts.py::test_a_minute_of_skewed_traffic",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        node = item.nodeid
        fixtures = set(getattr(item, "fixturenames", ()))
        if (
            any(node.startswith(prefix) for prefix in SLOW_MODULES)
            or fixtures & SLOW_FIXTURES
            or any(node.startswith(prefix) for prefix in SLOW_TESTS)
        ):
            item.add_marker(pytest.mark.slow)


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
