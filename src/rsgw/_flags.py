"""The `rsgw` command line's parser: every command, its flags and their types.

`rsgw._cli` runs what it parses. `rsgw ctl` and `rsgw simulate` parse their own
arguments (`rsgw.ctl._args`, `rsgw.simulate._cli`); they are listed here for `--help`.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import TYPE_CHECKING, TypeAlias

from rsgw._version import __version__
from rsgw.base._usage import StrictParser
from rsgw.runtime._logging import FORMATS, LEVELS


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
    """The `rsgw` parser: one subcommand each for worker, run, node and probe, and
    `ctl` and `simulate` listed for `--help` (they parse their own arguments)."""
    parser = StrictParser(
        prog="rsgw",
        description="One KServe V2 gRPC endpoint in front of many GPU inference workers.",
    )
    parser.add_argument("--version", action="version", version=f"rsgw {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_worker(commands)
    _add_run(commands)
    _add_node(commands)
    _add_probe(commands)
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


if TYPE_CHECKING:
    #: What `add_subparsers` returns (argparse names it privately).
    Commands: TypeAlias = argparse._SubParsersAction[StrictParser]


def _add_worker(commands: Commands) -> None:
    """`rsgw worker`: one simulated GPU worker."""
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
    _add_worker_serving(worker)
    _add_worker_device(worker)
    _add_logging_flags(worker)


def _add_worker_serving(worker: argparse.ArgumentParser) -> None:
    """`rsgw worker`'s models, queue discipline, replies, shutdown and TLS."""
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


def _add_worker_device(worker: argparse.ArgumentParser) -> None:
    """`rsgw worker`'s simulated device: weights, API, residency, admission, speed."""
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
        "--model-control-mode",
        choices=["none", "explicit"],
        default="none",
        help="as tritonserver's: none serves every catalogue model from the start; "
        "explicit only those named by --load-model, the rest until RepositoryModelLoad "
        "(default none)",
    )
    worker.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="MODEL",
        help="with --model-control-mode explicit, load MODEL at start; repeatable",
    )
    worker.add_argument(
        "--gpu-memory-bytes",
        type=_byte_size,
        default=0,
        metavar="N",
        help="the GPU's memory for loaded models' weights, enforced as a GPU would: a "
        "load past it fails INTERNAL (out of memory); 0 = no limit (default 0)",
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


def _add_run(commands: Commands) -> None:
    """`rsgw run`: the gateway in front of running workers."""
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


def _add_node(commands: Commands) -> None:
    """`rsgw node`: the node supervisor."""
    node = commands.add_parser(
        "node",
        help="run a node: one worker per GPU (simulated, Triton, MLServer or any command) "
        "and the gateway in front",
        description="Run the node supervisor: one worker process per GPU (rsgw's simulated "
        "worker, or with --server/--command a Triton, MLServer or any KServe V2 server) and, "
        "for two workers or more, the gateway on the public ports 8001 (gRPC), 8000 "
        "(REST) and 8002 (metrics); a single simulated worker serves gRPC and metrics "
        "itself. Children that die are restarted; one that fails before it was ever ready "
        "ends the node. Without NODE_FILE: builtin models, gpus auto (nvidia-smi -L or "
        "CUDA_VISIBLE_DEVICES; 4 simulated GPUs when none is visible), workers on 8080+, "
        "their REST on 8180+ (Triton, MLServer) and metrics on 9100+.",
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
        metavar="DIR|FILE|NAME",
        help="overrides model_repo: the model repository folder of a Triton or MLServer, "
        "or the simulated workers' catalogue (a YAML file, builtin or triton-docs)",
    )
    what = node.add_mutually_exclusive_group()
    what.add_argument(
        "--server",
        choices=("rsgw", "triton", "mlserver"),
        help="what serves each GPU (overrides server:): rsgw's simulated worker, "
        "tritonserver or mlserver on the --models repository (docs/gpu-box-triton.md)",
    )
    what.add_argument(
        "--command",
        dest="worker_command",
        metavar="CMD",
        help="any KServe V2 server as each GPU's worker, with placeholders such as "
        "{grpc_port}, {http_port}, {metrics_port}, {gpu}, {name}, {workdir}, {model_repo}",
    )
    node.add_argument(
        "--dry-run",
        action="store_true",
        help="print each worker's command and the gateway's configuration, start nothing",
    )
    _add_mode_flag(node)
    _add_logging_flags(node)


def _add_probe(commands: Commands) -> None:
    """`rsgw probe`: the node's health check."""
    probe = commands.add_parser(
        "probe",
        help="health check: is a worker of a node ready?",
        description="Call ServerReady on a worker of the node (127.0.0.1, 5 s deadline): "
        "exit 0 if it is ready, 1 if it is not, is unreachable, or the node file or "
        "worker choice is invalid (then with a one-line message).",
    )
    probe.add_argument("--node", required=True, metavar="NODE_FILE", help="node file YAML")
    probe.add_argument("--worker", metavar="NAME", help="worker name (needed if several)")


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
