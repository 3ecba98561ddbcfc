"""`rsgw run` under lpt_packing, as an operator runs it: a bad fleet is one line, exit 1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.helpers import WorkerProcess


def run_gateway(
    *workers: WorkerProcess, wait: str = "0", extra: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    endpoints = ",".join(f"127.0.0.1:{w.grpc_port}" for w in workers)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rsgw",
            "run",
            "--workers",
            endpoints,
            "--listen-grpc",
            "127.0.0.1:0",
            "--listen-metrics",
            "127.0.0.1:0",
            "--listen-http",
            "127.0.0.1:0",
            *extra,
        ],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("REACTANT_")},
            "REACTANT_GATEWAY_SCHEDULING_MODE": "lpt_packing",
            "REACTANT_GATEWAY_STARTUP_WAIT_SECONDS": wait,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_fair_worker_stops_rsgw_run_with_one_line(
    worker_process_factory: Callable[..., WorkerProcess],
) -> None:
    fifo = worker_process_factory("--name", "a")
    fair = worker_process_factory("--name", "b", "--discipline", "fair")
    done = run_gateway(fifo, fair)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rsgw run: lpt_packing scheduling requires worker FIFO or EDF")
    assert f"127.0.0.1:{fair.grpc_port}" in last and "'fair'" in last
    assert "Traceback" not in done.stderr


def test_an_unreachable_worker_without_a_wait_stops_rsgw_run_with_one_line(
    worker_process_factory: Callable[..., WorkerProcess],
) -> None:
    up = worker_process_factory("--name", "a")
    gone = worker_process_factory("--name", "b")
    gone.stop()
    done = run_gateway(up, gone, wait="0")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert f"[127.0.0.1:{gone.grpc_port}] not answering; all workers must be up" in last
    assert "REACTANT_GATEWAY_STARTUP_WAIT_SECONDS" in last
    assert "Traceback" not in done.stderr


def test_strict_stops_rsgw_run_on_a_misspelt_variable_with_one_line(
    worker_process_factory: Callable[..., WorkerProcess],
) -> None:
    worker = worker_process_factory("--name", "a")
    done = run_gateway(worker, extra=("--strict",), REACTANT_GATEWAY_SCHEDULNG_MODE="x")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "rsgw run: unknown environment variable REACTANT_GATEWAY_SCHEDULNG_MODE (did you mean "
        "REACTANT_GATEWAY_SCHEDULING_MODE?): --strict makes unknown settings errors"
    ]


def test_a_prefix_of_an_option_is_not_taken_for_it(capsys: pytest.CaptureFixture[str]) -> None:
    """`rsgw node --gpu 2` once ran as `--gpus 2` (argparse's prefix matching): now an
    unknown option, usage, exit 2 (issue 40); the same in `rsgw ctl` and `rsgw simulate`."""
    import pytest

    from rsgw._flags import build_parser
    from rsgw.ctl._args import parse_args
    from rsgw.ctl._commands import UsageError
    from rsgw.simulate._cli import build_parser as simulate_parser

    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["node", "--gpu", "2"])
    assert caught.value.code == 2
    # The subcommand's own usage and error, with the option meant.
    err = capsys.readouterr().err
    assert err.startswith("usage: rsgw node ")
    assert "rsgw node: error: unrecognized arguments: --gpu (did you mean --gpus?)" in err
    with pytest.raises(UsageError) as refused:
        parse_args(["repack", "--wai", "3"])
    assert "(did you mean --wait?)" in refused.value.message
    with pytest.raises(UsageError) as refused:
        parse_args(["stauts"])
    assert refused.value.message.startswith("unknown command 'stauts' (did you mean status?)")
    with pytest.raises(SystemExit):
        simulate_parser().parse_args(["x.yaml", "--dur", "3"])
    assert "rsgw simulate: error: unrecognized arguments: --dur 3" in capsys.readouterr().err


def test_mode_is_a_flag_of_node_and_run() -> None:
    """`--mode` on `rsgw node` and `rsgw run` (issue 40): the scheduling mode without
    knowing its variable; a mode that does not exist is usage, exit 2."""
    import pytest

    from rsgw._cli import _RUN_FLAG_ENV
    from rsgw._flags import build_parser

    parser = build_parser()
    assert parser.parse_args(["node", "--mode", "lpt_packing"]).mode == "lpt_packing"
    assert parser.parse_args(["run", "--mode", "least_outstanding"]).mode == "least_outstanding"
    assert _RUN_FLAG_ENV["mode"] == "REACTANT_GATEWAY_SCHEDULING_MODE"
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["run", "--mode", "fastest"])
    assert caught.value.code == 2


def test_a_busy_port_names_the_setting_that_chose_it(
    worker_process_factory: Callable[..., WorkerProcess],
) -> None:
    """Issue 40: the one line says which setting to change, not only the address."""
    worker = worker_process_factory("--name", "a")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = run_gateway(
            worker,
            extra=("--listen-metrics", f"127.0.0.1:{port}"),
            REACTANT_GATEWAY_SCHEDULING_MODE="round_robin",
        )
    assert done.returncode == 1
    # The flags are not reported as environment variables; the environment's are.
    (overridden,) = [
        json.loads(line)["variables"]
        for line in done.stderr.splitlines()
        if "overridden by environment" in line
    ]
    assert "REACTANT_GATEWAY_SCHEDULING_MODE" in overridden
    assert not any(v.startswith("REACTANT_GATEWAY_LISTEN_") for v in overridden)
    assert done.stderr.strip().splitlines()[-1] == (
        f"rsgw run: cannot listen on 127.0.0.1:{port}: address already in use (set by "
        "listen.metrics, REACTANT_GATEWAY_LISTEN_METRICS; rsgw run --listen-metrics)"
    )
