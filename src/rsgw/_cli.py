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
import os
import re
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

from rsgw._flags import build_parser
from rsgw.base._errors import ConfigError, RsgwError
from rsgw.runtime._logging import configure_logging
from rsgw.runtime._process import raise_open_file_limit

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from rsgw.worker._worker import WorkerConfig

logger = logging.getLogger("rsgw")

#: The `service.name` of a worker's spans unless `OTEL_SERVICE_NAME` names another.
WORKER_SERVICE_NAME = "rsgw-worker"


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    """The `WorkerConfig` that `rsgw worker` serves for these parsed flags.

    Raises:
        ConfigError: a catalogue file that does not load, or a value out of range.
    """
    from rsgw.config._tracing import tracing_from_env
    from rsgw.worker._worker import WorkerApi, WorkerConfig
    from rsgw.worker.device._batching import Discipline
    from rsgw.worker.device._memory import DEFAULT_LOAD_BANDWIDTH
    from rsgw.worker.device._weights import ResidencyMode
    from rsgw.worker.models._catalogue import builtin_catalogue, named_catalogue

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
        loaded_at_start=(
            frozenset(args.load_model) if args.model_control_mode == "explicit" else None
        ),
        gpu_memory_bytes=args.gpu_memory_bytes,
        response_compression=args.response_compression,
        shutdown_grace=args.shutdown_grace,
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        tls_client_ca_file=args.tls_client_ca,
        # OpenTelemetry's variables, as the gateway reads them (`rsgw.config._tracing`).
        tracing=tracing_from_env(os.environ, WORKER_SERVICE_NAME),
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
    from rsgw.config._config import load_config
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
    from rsgw.node._gpus import visible_gpus
    from rsgw.node._node import BUILTIN_MODEL_REPO, default_node, load_node
    from rsgw.node._servers import check_repository
    from rsgw.node._supervision import OPERATOR_VARIABLES, operator_variables
    from rsgw.node._supervisor import dry_run, serve_node
    from rsgw.worker.models._catalogue import named_catalogue

    chosen = {"gpus": args.gpus, "server": args.server, "command": args.worker_command}
    visible = visible_gpus() if args.gpus is None else None
    if args.node_file is None:
        node = default_node(visible_gpus=visible, **chosen)
    else:
        node = load_node(args.node_file, visible_gpus=visible, **chosen)
    if args.models is not None:
        # A server of its own is started in a folder of its own: the path must not move.
        repo = os.path.abspath(args.models) if node.server.external else args.models
        node = dataclasses.replace(node, model_repo=repo)
    if node.server.external:
        where = "--models" if args.models is not None else args.node_file or "<default node>"
        check_repository(node.server.kind, node.model_repo, where)
    elif node.model_repo != BUILTIN_MODEL_REPO:
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
        if len(node.workers) < 2 and not node.server.external:
            logging.getLogger("rsgw.node").warning(
                "--config not read: a one-worker node runs no gateway (its worker serves "
                "the public ports itself)",
                extra={"config": args.config},
            )
    if args.dry_run:
        text = dry_run(node, env=env, log_level=args.log_level, log_format=args.log_format)
        sys.stdout.write(text)
        return
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
