"""The `rsgw` command line.

Every command has `--help`; a bad argument prints usage and exits 2 (argparse);
a runtime failure prints one readable line and exits 1. An `RsgwError` is an
expected failure (busy port, bad catalogue); anything else is a bug and is
logged with its traceback before the same exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import re
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

from rsgw._errors import ConfigError, RsgwError
from rsgw._logging import FORMATS, LEVELS, configure_logging
from rsgw._process import raise_open_file_limit
from rsgw._usage import StrictParser
from rsgw._version import __version__

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from rsgw.worker._worker import WorkerConfig

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
    parser = StrictParser(
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
    worker.add_argument(
        "--models",
        metavar="FILE|NAME",
        help="model catalogue YAML, or a built-in one: builtin (the default) or triton-docs",
    )
    worker.add_argument(
        "--discipline",
        choices=["fifo", "edf", "fair"],
        default="fifo",
        help="which queued model the device runs next (default fifo)",
    )
    worker.add_argument(
        "--response-compression",
        choices=["none", "gzip", "deflate"],
        default="none",
        help="compress replies in this encoding for clients that accept it (default none)",
    )
    worker.add_argument(
        "--shutdown-grace",
        type=_non_negative_seconds,
        default=20.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long calls in flight get to finish (default 20)",
    )
    worker.add_argument("--tls-cert", metavar="PEM", default="", help="serve TLS: certificate")
    worker.add_argument("--tls-key", metavar="PEM", default="", help="serve TLS: its key")
    worker.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        default="",
        help="require client certificates signed by this CA (mTLS)",
    )
    worker.add_argument(
        "--weight-cache-bytes",
        type=_byte_size,
        default=0,
        metavar="N",
        help="on-demand weight budget in bytes (suffixes KiB, MiB, GiB allowed); "
        "0 keeps every model on the device (default 0)",
    )
    worker.add_argument(
        "--api",
        choices=["reactant", "triton", "kserve"],
        default="reactant",
        help="what the worker answers: reactant (Triton's API, IsSameIPCNamespace and "
        "ReactantServer's ControlService), triton (what stock Triton answers: no "
        "ControlService, no IsSameIPCNamespace) or kserve (what KServe's ModelServer "
        "answers: no RepositoryIndex, streaming, shared memory, config or statistics "
        "either) (default reactant)",
    )
    worker.add_argument(
        "--residency-mode",
        choices=["self_managed", "externally_managed"],
        default="self_managed",
        help="self_managed loads weights on demand; externally_managed serves only "
        "models pinned by SetModelResidency (default self_managed)",
    )
    worker.add_argument(
        "--load-bandwidth",
        type=_positive_byte_size,
        default=None,
        metavar="BYTES_PER_S",
        help="weight load speed in bytes/s for models without load_ms (default 8GiB)",
    )
    worker.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="MODEL",
        help="pin MODEL on the device from the start; repeatable",
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
    run.add_argument(
        "--strict",
        action="store_true",
        help="unknown gateway.yml keys and REACTANT_GATEWAY_* variables are errors, not "
        "warnings (REACTANT_GATEWAY_STRICT=1)",
    )
    run.add_argument("--workers", metavar="H:P,...", help="worker gRPC endpoints")
    run.add_argument("--worker-metrics", metavar="H:P,...", help="worker metrics endpoints")
    run.add_argument("--listen-grpc", metavar="H:P", help="gRPC listen address (0.0.0.0:8001)")
    run.add_argument(
        "--listen-metrics", metavar="H:P", help="admin HTTP listen address (0.0.0.0:8002)"
    )
    run.add_argument(
        "--listen-http", metavar="H:P", help="KServe V2 REST listen address (0.0.0.0:8000)"
    )
    _add_mode_flag(run)
    run.add_argument("--log-level", choices=LEVELS, help="(default info, or logging.level)")
    run.add_argument(
        "--log-format",
        choices=FORMATS,
        help="(default auto: text when stderr is a terminal, else json; or logging.format)",
    )

    node = commands.add_parser(
        "node",
        help="run a node: one simulated worker per GPU and the gateway in front",
        description="Run the node supervisor: one simulated worker process per GPU and, "
        "for two workers or more, the gateway on the public ports 8001 (gRPC), 8000 "
        "(REST) and 8002 (metrics); a single worker serves gRPC and metrics itself. "
        "Children that die are restarted. Without NODE_FILE: builtin models, gpus auto "
        "(4 simulated GPUs when none is visible), workers on 8080+ and metrics on 9100+.",
    )
    node.add_argument("node_file", nargs="?", metavar="NODE_FILE", help="node file YAML")
    node.add_argument(
        "--config",
        metavar="FILE",
        help="the gateway's gateway.yml (REACTANT_GATEWAY_FILE): merged with the node's "
        "workers, which it need not list",
    )
    node.add_argument(
        "--gpus", type=_non_negative_int, metavar="N", help="run N workers (overrides gpus:)"
    )
    node.add_argument(
        "--models",
        metavar="FILE|NAME",
        help="the workers' model catalogue: a YAML file, builtin or triton-docs "
        "(overrides model_repo:)",
    )
    _add_mode_flag(node)
    _add_logging_flags(node)

    probe = commands.add_parser(
        "probe",
        help="health check: is a worker of a node ready?",
        description="Call ServerReady on a worker of the node (127.0.0.1, 5 s deadline): "
        "exit 0 if it is ready, 1 if it is not, is unreachable, or the node file or "
        "worker choice is invalid (then with a one-line message).",
    )
    probe.add_argument("--node", required=True, metavar="NODE_FILE", help="node file YAML")
    probe.add_argument("--worker", metavar="NAME", help="worker name (needed if several)")

    # Listed for `rsgw --help` only: `main` hands everything after `ctl` (`simulate`) to
    # rsgw.ctl (rsgw.simulate), which has its own parser (argparse cannot pass options
    # through a subparser).
    commands.add_parser(
        "ctl",
        add_help=False,
        help="operator front end of the gateway's scheduler (rsgw ctl --help)",
    )
    commands.add_parser(
        "simulate",
        add_help=False,
        help="what-if: a scenario through the scheduling modes in virtual time "
        "(rsgw simulate --help)",
    )
    return parser


def _add_mode_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        choices=("round_robin", "least_outstanding", "lpt_packing"),
        help="the gateway's scheduling mode (REACTANT_GATEWAY_SCHEDULING_MODE, "
        "scheduling.mode; default round_robin): lpt_packing places each model on few "
        "GPUs so their batches fill (docs/operations.md)",
    )


def _add_logging_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="(default info)")
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="auto",
        help="(default auto: text when stderr is a terminal, else json)",
    )


# Decimal (k, kB) and binary (KiB) units, as operators write memory sizes.
_BYTE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6}
_BYTE_UNITS |= {"g": 10**9, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_BYTE_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)", re.IGNORECASE)


def _byte_size(text: str) -> int:
    """A byte count, bare or with a unit: `536870912`, `512MiB`, `8GiB`, `1.5GB`."""
    match = _BYTE_SIZE.fullmatch(text.strip())
    unit = _BYTE_UNITS.get(match[2].lower()) if match else None
    if match is None or unit is None:
        raise argparse.ArgumentTypeError(
            f"not a byte size: {text!r} (say 536870912, 512MiB or 8GiB)"
        )
    return int(float(match[1]) * unit)


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"not a number of seconds >= 0: {text!r}")
    return value


def _positive_byte_size(text: str) -> int:
    value = _byte_size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    """The `WorkerConfig` that `rsgw worker` serves for these parsed flags.

    Raises:
        ConfigError: a catalogue file that does not load, or a value out of range.
    """
    from rsgw.worker._batching import Discipline
    from rsgw.worker._catalogue import builtin_catalogue, named_catalogue
    from rsgw.worker._memory import DEFAULT_LOAD_BANDWIDTH
    from rsgw.worker._weights import ResidencyMode
    from rsgw.worker._worker import WorkerApi, WorkerConfig

    catalogue = named_catalogue(args.models) if args.models else builtin_catalogue()
    return WorkerConfig(
        name=args.name,
        gpu=args.gpu,
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        catalogue=catalogue,
        discipline=Discipline(args.discipline),
        max_concurrent_requests=args.max_concurrent_requests,
        time_scale=args.time_scale,
        weight_cache_bytes=args.weight_cache_bytes,
        residency_mode=ResidencyMode(args.residency_mode),
        api=WorkerApi(args.api),
        load_bandwidth=args.load_bandwidth or DEFAULT_LOAD_BANDWIDTH,
        pinned=frozenset(args.pin),
        response_compression=args.response_compression,
        shutdown_grace=args.shutdown_grace,
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        tls_client_ca_file=args.tls_client_ca,
    )


def _run_worker(args: argparse.Namespace) -> None:
    from rsgw.worker._worker import serve_worker

    trio.run(partial(_until_terminated, partial(serve_worker, worker_config(args)), what="worker"))


#: `rsgw run` flags and the gateway.yml keys they set (named in errors as the flag).
_RUN_FLAG_KEYS = {
    "workers": "endpoints",
    "worker_metrics": "metrics_endpoints",
    "listen_grpc": "listen.grpc",
    "listen_metrics": "listen.metrics",
    "listen_http": "listen.http",
    "log_level": "logging.level",
    "log_format": "logging.format",
    "mode": "scheduling.mode",
}
#: `rsgw run` flags and the environment variables they stand for.
_RUN_FLAG_ENV = {
    "workers": "REACTANT_GATEWAY_WORKERS",
    "worker_metrics": "REACTANT_GATEWAY_WORKER_METRICS",
    "listen_grpc": "REACTANT_GATEWAY_LISTEN_GRPC",
    "listen_metrics": "REACTANT_GATEWAY_LISTEN_METRICS",
    "listen_http": "REACTANT_GATEWAY_LISTEN_HTTP",
    "log_level": "REACTANT_GATEWAY_LOGGING_LEVEL",
    "log_format": "REACTANT_GATEWAY_LOGGING_FORMAT",
    "mode": "REACTANT_GATEWAY_SCHEDULING_MODE",
}


def _run_gateway(args: argparse.Namespace) -> None:
    from rsgw._config import load_config
    from rsgw.gateway._gateway import serve_gateway
    from rsgw.node._supervision import OPERATOR_VARIABLES

    env = dict(os.environ)
    flags: dict[str, str] = {}
    for flag, variable in _RUN_FLAG_ENV.items():
        value = getattr(args, flag)
        if value is not None:
            env[variable] = value
            flags[variable] = flags[_RUN_FLAG_KEYS[flag]] = "--" + flag.replace("_", "-")
    if args.strict:
        env["REACTANT_GATEWAY_STRICT"] = "1"
        flags["REACTANT_GATEWAY_STRICT makes"] = "--strict makes"
    try:
        config = load_config(args.config, env)
    except ConfigError as exc:
        # A flag's value travels as its variable; the operator typed the flag.
        message = str(exc)
        for name, flag in flags.items():
            message = message.replace(f"environment override {name}", flag)
            message = re.sub(rf"(?<![\w.]){re.escape(name)}(?![\w.])", flag, message)
        raise ConfigError(message) from None
    # The log's "overridden by environment" names only what the operator's environment
    # set: not our flags' variables, nor those a node derived for its gateway.
    typed = {variable for flag, variable in _RUN_FLAG_ENV.items() if getattr(args, flag)}
    node_set = os.environ.get(OPERATOR_VARIABLES)
    operator = None if node_set is None else set(node_set.split(","))
    config = dataclasses.replace(
        config,
        env_overrides=tuple(
            v
            for v in config.env_overrides
            if v not in typed and (operator is None or v in operator)
        ),
    )
    configure_logging(config.logging.level, config.logging.format)
    # SIGHUP (or a change to the file) reads gateway.yml again, through the same flags
    # and environment.
    serve = partial(
        serve_gateway,
        config,
        reload_config=partial(load_config, args.config, env),
        config_file=args.config,
    )
    trio.run(partial(_until_terminated, serve, what="gateway"))


def _run_node(args: argparse.Namespace) -> None:
    from rsgw.node._gpus import visible_gpu_count
    from rsgw.node._node import BUILTIN_MODEL_REPO, default_node, load_node
    from rsgw.node._supervision import OPERATOR_VARIABLES, operator_variables
    from rsgw.node._supervisor import serve_node
    from rsgw.worker._catalogue import named_catalogue

    visible = visible_gpu_count() if args.gpus is None else None
    if args.node_file is None:
        node = default_node(visible_gpus=visible, gpus=args.gpus)
    else:
        node = load_node(args.node_file, visible_gpus=visible, gpus=args.gpus)
    if args.models is not None:
        node = dataclasses.replace(node, model_repo=args.models)
    if node.model_repo != BUILTIN_MODEL_REPO:
        # A bad catalogue is one line now, not a restart loop of every worker.
        named_catalogue(node.model_repo)
    env = dict(os.environ)
    env[OPERATOR_VARIABLES] = operator_variables(os.environ)
    if args.mode is not None:
        env["REACTANT_GATEWAY_SCHEDULING_MODE"] = args.mode
    if args.config is not None:
        if not os.path.isfile(args.config):
            raise ConfigError(f"gateway config file not found: {args.config}")
        env["REACTANT_GATEWAY_FILE"] = os.path.abspath(args.config)
        if len(node.workers) < 2:
            logging.getLogger("rsgw.node").warning(
                "--config not read: a one-worker node runs no gateway (its worker serves "
                "the public ports itself)",
                extra={"config": args.config},
            )
    service = partial(
        serve_node, node, env=env, log_level=args.log_level, log_format=args.log_format
    )
    trio.run(partial(_until_terminated, service, what="node"))


def _run_probe(args: argparse.Namespace) -> int:
    from rsgw.node._probe import probe_worker_ready

    if trio.run(probe_worker_ready, args.node, args.worker):
        return 0
    which = f"worker '{args.worker}'" if args.worker else "the worker"
    print(f"rsgw probe: {which} of {args.node} is not ready", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rsgw` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["ctl"]:
        from rsgw.ctl import main as ctl_main

        return ctl_main(argv[1:])
    if argv[:1] == ["simulate"]:
        from rsgw.simulate._cli import main as simulate_main

        return simulate_main(argv[1:])
    args = build_parser().parse_args(argv)
    configure_logging(
        getattr(args, "log_level", None) or "info", getattr(args, "log_format", None) or "auto"
    )
    if args.command in ("worker", "run", "node"):
        raise_open_file_limit()
    try:
        if args.command == "worker":
            _run_worker(args)
        elif args.command == "run":
            _run_gateway(args)
        elif args.command == "node":
            _run_node(args)
        elif args.command == "probe":
            return _run_probe(args)
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


class _Drainable(Protocol):
    async def aclose(self) -> None: ...


async def _until_terminated(
    serve: Callable[..., Awaitable[object]], *, what: str = "service"
) -> None:
    """Run `serve` (a `nursery.start` target) until SIGTERM or SIGINT, then drain it.

    The first signal starts a graceful stop (`aclose()` of what `serve` started:
    readiness off, GOAWAY, calls in flight get their grace); a second one, or one
    that arrives while still starting, stops at once. SIGHUP calls its `reload()`
    (certificates, tokens, the gateway's workers), if it has one, and serving goes on.
    """
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            started: list[_Drainable] = []

            async def drain(running: _Drainable) -> None:
                await running.aclose()
                nursery.cancel_scope.cancel()

            async def on_signals() -> None:
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        reload = getattr(started[0], "reload", None) if started else None
                        logger.info("SIGHUP: reloading", extra={"what": what})
                        if reload is not None:
                            reload()
                        continue
                    if started:
                        nursery.start_soon(drain, started.pop())
                        continue
                    logger.warning("stopping now", extra={"what": what})
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(on_signals)
            started.append(await nursery.start(serve))


if __name__ == "__main__":
    sys.exit(main())
