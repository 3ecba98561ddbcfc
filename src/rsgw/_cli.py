"""The `rsgw` command line.

Every command has `--help`; a bad argument prints usage and exits 2 (argparse);
a runtime failure prints one readable line and exits 1. An `RsgwError` is an
expected failure (busy port, bad catalogue); anything else is a bug and is
logged with its traceback before the same exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING

import trio

from rsgw._errors import RsgwError
from rsgw._logging import FORMATS, LEVELS, configure_logging
from rsgw._version import __version__

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

logger = logging.getLogger("rsgw")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not -1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rsgw",
        description="One KServe V2 gRPC endpoint in front of many GPU inference workers.",
    )
    parser.add_argument("--version", action="version", version=f"rsgw {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    worker = commands.add_parser(
        "worker",
        help="run one simulated GPU worker",
        description="Run one simulated GPU worker: a KServe V2 gRPC server whose "
        "device is a cost model (see docs/models.md).",
    )
    worker.add_argument("--name", default="worker0", help="worker label (default worker0)")
    worker.add_argument("--gpu", default="0", help="gpu label of its metrics (default 0)")
    worker.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    worker.add_argument("--port", type=_port, default=8080, help="gRPC port; 0 picks one (8080)")
    worker.add_argument(
        "--metrics-port",
        type=_port,
        default=9100,
        help="admin HTTP port for /metrics, /healthz, /readyz; 0 picks one, -1 disables (9100)",
    )
    worker.add_argument("--models", metavar="FILE", help="model catalogue YAML (default: built-in)")
    worker.add_argument(
        "--discipline", choices=["fifo"], default="fifo", help="dispatch discipline (fifo)"
    )
    worker.add_argument(
        "--max-concurrent-requests",
        type=_non_negative_int,
        default=64,
        help="ModelInfer calls in flight before RESOURCE_EXHAUSTED; 0 = uncapped (64)",
    )
    worker.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="multiply every simulated duration by F (default 1.0)",
    )
    _add_logging_flags(worker)

    run = commands.add_parser(
        "run",
        help="run the gateway in front of running workers",
        description="Run the gateway: one KServe V2 endpoint in front of the workers. "
        "Settings come from gateway.yml (--config, REACTANT_GATEWAY_FILE or "
        "/etc/reactantserver/gateway.yml), then REACTANT_GATEWAY_* variables, then these "
        "flags (see docs/configuration.md).",
    )
    run.add_argument("--config", metavar="FILE", help="gateway.yml to read")
    run.add_argument("--workers", metavar="H:P,...", help="worker gRPC endpoints")
    run.add_argument("--worker-metrics", metavar="H:P,...", help="worker metrics endpoints")
    run.add_argument("--listen-grpc", metavar="H:P", help="gRPC listen address (0.0.0.0:8001)")
    run.add_argument(
        "--listen-metrics", metavar="H:P", help="admin HTTP listen address (0.0.0.0:8002)"
    )
    return parser


def _add_logging_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="(default info)")
    parser.add_argument("--log-format", choices=FORMATS, default="json", help="(default json)")


def _run_worker(args: argparse.Namespace) -> None:
    from rsgw.worker._batching import Discipline
    from rsgw.worker._catalogue import builtin_catalogue, load_catalogue
    from rsgw.worker._worker import WorkerConfig, serve_worker

    catalogue = load_catalogue(args.models) if args.models else builtin_catalogue()
    config = WorkerConfig(
        name=args.name,
        gpu=args.gpu,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        catalogue=catalogue,
        discipline=Discipline(args.discipline),
        max_concurrent_requests=args.max_concurrent_requests,
        time_scale=args.time_scale,
    )
    trio.run(_until_terminated, partial(serve_worker, config))


#: `rsgw run` flags and the environment variables they stand for.
_RUN_FLAG_ENV = {
    "workers": "REACTANT_GATEWAY_WORKERS",
    "worker_metrics": "REACTANT_GATEWAY_WORKER_METRICS",
    "listen_grpc": "REACTANT_GATEWAY_LISTEN_GRPC",
    "listen_metrics": "REACTANT_GATEWAY_LISTEN_METRICS",
}


def _run_gateway(args: argparse.Namespace) -> None:
    from rsgw._config import load_config
    from rsgw.gateway._gateway import serve_gateway

    env = dict(os.environ)
    for flag, variable in _RUN_FLAG_ENV.items():
        value = getattr(args, flag)
        if value is not None:
            env[variable] = value
    config = load_config(args.config, env)
    configure_logging(config.logging.level, config.logging.format)
    trio.run(_until_terminated, partial(serve_gateway, config))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rsgw` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    configure_logging(getattr(args, "log_level", "info"), getattr(args, "log_format", "json"))
    try:
        if args.command == "worker":
            _run_worker(args)
        elif args.command == "run":
            _run_gateway(args)
    except (Exception, KeyboardInterrupt) as exc:
        leaf = _first_leaf(exc)
        if isinstance(leaf, KeyboardInterrupt):
            return 0
        if isinstance(leaf, RsgwError):
            print(f"rsgw {args.command}: {leaf}", file=sys.stderr)
        else:
            logger.error("unexpected failure", exc_info=leaf)
            print(f"rsgw {args.command}: unexpected error: {leaf!r}", file=sys.stderr)
        return 1
    return 0


def _first_leaf(exc: BaseException) -> BaseException:
    """The first leaf of a (possibly nested) exception group, or `exc` itself."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def _until_terminated(service: Callable[[], Awaitable[object]]) -> None:
    """Run `service` until it returns or SIGTERM/SIGINT arrives (a clean stop)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            await service()
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    sys.exit(main())
