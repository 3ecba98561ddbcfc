"""`rsgw ctl`'s command line -> an `Invocation`, with no printing and no exiting.

Pure: argparse does the work, but a parser that prints and calls `sys.exit` cannot
be tested as a function and cannot word the errors the reference asks for
(`unknown command '<c>'`). So `_Parser` collects help text and raises instead,
and `parse_args` returns `Invocation` or `ShowHelp`, or raises `UsageError`
carrying the usage of the (sub)command that failed; `rsgw.ctl._main` prints.

The line is parsed in two steps: `[--gateway HOST:PORT] COMMAND REST...`, then
REST by the command's own parser. `--gateway` is accepted after the command too,
since operators append it to a line they already typed.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from rsgw.base._usage import StrictParser, nearest
from rsgw.base._values import split_host_port
from rsgw.ctl._commands import (
    DEFAULT_GATEWAY,
    DEFAULT_REPACK_WAIT_SECONDS,
    POLICY_KEYS,
    Access,
    AddWorker,
    Command,
    Invocation,
    RemoveWorker,
    Repack,
    SetPolicy,
    SetReplicas,
    SetTenant,
    ShowHelp,
    Status,
    UsageError,
    parse_float,
    parse_int,
    parse_policy_updates,
    parse_replicas,
)

DEFAULT_PROG = "rsgw ctl"
#: Where `rsgw ctl` takes its bearer token from when no --token-file is given.
TOKEN_VARIABLE = "RSGW_TOKEN"
FILL_MODES = ("run", "spread", "inflight", "inherit")

_DESCRIPTION = """\
Operator front end of the gateway's scheduler (GatewayControlService). Runtime
changes apply at once but are not saved: a restart goes back to gateway.yml.

commands:
  status                     knobs, repack counters, models and workers
  repack [--wait S]          repack now; wait up to S seconds for it (default 30;
                             exit 3 if it did not run in time)
  set-replicas MODEL N|all|default|- [--fill-mode M] [--fill-factor F] [--allow-unknown]
                             one model's replica count and fill override
  set-policy KEY=VALUE ...   change scheduling knobs at runtime
  add-worker HOST:PORT [--metrics HOST:PORT] [--name NAME]
                             a worker joins now (lpt_packing: at a repack once ready)
  remove-worker HOST:PORT|NAME [--drain-seconds S]
                             a worker leaves after its calls in flight finish
  tenant NAME [--weight W] [--priority P] [--rate R] [--burst B] [--max-concurrent N]
                             a tenant's share, priority and quotas (none given: show
                             them); a reload (SIGHUP) goes back to gateway.yml
"""


class _Exit(Exception):
    """argparse wanted to exit (after `--help`); we return instead."""


class _Parser(StrictParser):
    """A StrictParser that collects what it would print and raises instead of exiting."""

    def __init__(self, output: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._output = output

    def print_help(self, file: object = None) -> None:
        self._output.append(self.format_help())

    def print_usage(self, file: object = None) -> None:
        self._output.append(self.format_usage())

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status:
            raise UsageError(message or "bad usage", self.format_usage())
        raise _Exit

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())


def _argtype(parse: Callable[[str, str], object], what: str) -> Callable[[str], object]:
    """Wrap a coercion so argparse reports its UsageError as its own (exit 2, usage).

    argparse already names the argument, so the coercion's `<what>: ` prefix goes.
    """

    def convert(text: str) -> object:
        try:
            return parse(text, what)
        except UsageError as exc:
            message = exc.message.removeprefix(f"{what}: ")
            raise argparse.ArgumentTypeError(message) from None

    return convert


def _gateway(text: str) -> str:
    try:
        _, port = split_host_port(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}") from None
    if not 0 < port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {port}")
    return text


def _non_negative(what: str, hint: str = "") -> Callable[[str], object]:
    def parse(text: str, what: str) -> float:
        value = parse_float(text, what)
        if value < 0:
            raise UsageError(f"{what}: must be >= 0{hint}, got {text}")
        return value

    return _argtype(parse, what)


def _add_gateway(parser: argparse.ArgumentParser, default: object, json: object) -> None:
    parser.add_argument(
        "--gateway",
        type=_gateway,
        default=default,
        metavar="HOST:PORT",
        help=f"the gateway's gRPC address (default {DEFAULT_GATEWAY})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=json,
        help="print the gateway's reply as JSON (protobuf field names) instead of text",
    )
    quiet = default is argparse.SUPPRESS
    for flag, meta, text in _ACCESS_FLAGS:
        parser.add_argument(
            flag, metavar=meta, default=argparse.SUPPRESS if quiet else "", help=text
        )


#: The flags that reach a gateway with auth or TLS on (docs/security.md).
_ACCESS_FLAGS = (
    ("--token-file", "FILE", "send the bearer token in FILE (default: $RSGW_TOKEN)"),
    ("--tls-ca", "PEM", "speak TLS to the gateway, trusting this CA"),
    ("--tls-cert", "PEM", "client certificate for mTLS (with --tls-key)"),
    ("--tls-key", "PEM", "the client certificate's key"),
)


def _access(args: argparse.Namespace, head: argparse.Namespace) -> Access:
    """The token and TLS files of the command line (a subcommand's flags win)."""

    def value(name: str) -> str:
        return str(getattr(args, name, getattr(head, name)))

    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    token_file = value("token_file")
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--token-file: cannot read {token_file}: {exc}") from None
        if not token:
            raise UsageError(f"--token-file: {token_file} is empty")
    access = Access(token, value("tls_ca"), value("tls_cert"), value("tls_key"))
    if access.tls_cert and not (access.tls_key and access.tls_ca):
        raise UsageError("--tls-cert needs --tls-key and --tls-ca")
    return access


def _command_parsers(prog: str, output: list[str]) -> dict[str, _Parser]:
    def sub(name: str, description: str) -> _Parser:
        parser = _Parser(output, prog=f"{prog} {name}", description=description)
        _add_gateway(parser, argparse.SUPPRESS, argparse.SUPPRESS)
        return parser

    status = sub("status", "Print the scheduler's knobs, repack state, models and workers.")

    repack = sub("repack", "Ask the gateway for a repack now and wait for it to run.")
    repack.add_argument(
        "--wait",
        type=_non_negative("--wait"),
        default=DEFAULT_REPACK_WAIT_SECONDS,
        metavar="S",
        help="seconds to wait for the repack; 0 returns at once (default 30; "
        "the gateway caps it at 120). Exit 3 if it did not run within them",
    )

    replicas = sub(
        "set-replicas",
        "Set one model's replica count and fill override; it takes effect at the next repack.",
    )
    replicas.add_argument("model", metavar="MODEL", help="the model's name")
    replicas.add_argument(
        "replicas",
        type=_argtype(parse_replicas, "replicas"),
        metavar="N|all|default|-",
        help="workers to place it on: a count >= 1, all, or default/- to inherit default_replicas",
    )
    replicas.add_argument(
        "--fill-mode",
        choices=FILL_MODES,
        default="",
        help="how its requests fill its replicas; inherit uses routing_fill_mode "
        "(default: unchanged)",
    )
    replicas.add_argument(
        "--fill-factor",
        type=_non_negative("--fill-factor", " (0 clears the override)"),
        default=-1.0,
        metavar="F",
        help="fill quantum = round(F x max_batch); 0 clears the override (default: unchanged)",
    )
    replicas.add_argument(
        "--allow-unknown",
        action="store_true",
        help="store the override even if no worker serves the model yet",
    )

    policy = sub(
        "set-policy",
        "Change scheduling knobs at runtime (checked as gateway.yml is). Keys: "
        + ", ".join(POLICY_KEYS)
        + ". default_replicas takes a count or all; forbid_memory_oversubscription "
        "takes true/false, 1/0 or yes/no.",
    )
    policy.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="knob and new value")

    add = sub("add-worker", "A worker joins the running gateway; it takes calls once ready.")
    add.add_argument("address", metavar="HOST:PORT", help="the worker's gRPC endpoint")
    add.add_argument("--name", default="", help="its metrics label and public name")
    add.add_argument(
        "--metrics",
        default="",
        metavar="HOST:PORT",
        help="its Prometheus endpoint, merged into the gateway's /metrics",
    )

    remove = sub(
        "remove-worker",
        "A worker leaves the running gateway: no new calls at once, its calls in flight "
        "finish (or are cut short after the drain), then it is gone.",
    )
    remove.add_argument("worker", metavar="HOST:PORT|NAME", help="the worker to remove")
    remove.add_argument(
        "--drain-seconds",
        type=_non_negative("--drain-seconds"),
        default=0.0,
        metavar="S",
        help="seconds its calls in flight get (default 0: the gateway's shutdown grace)",
    )
    tenant = sub(
        "tenant",
        "Set a tenant's fair-share weight, default priority and quotas at run time (checked "
        "as gateway.yml's tenancy block is; 0 means none, or the default). With no option, "
        "print its policy in force. A reload (SIGHUP) or a restart goes back to gateway.yml.",
    )
    tenant.add_argument("tenant", metavar="NAME", help="the tenant's name")
    for flag, parse, meta, text in _TENANT_FLAGS:
        tenant.add_argument(flag, type=_argtype(parse, flag), metavar=meta, help=text)
    return {
        "status": status,
        "repack": repack,
        "set-replicas": replicas,
        "set-policy": policy,
        "add-worker": add,
        "remove-worker": remove,
        "tenant": tenant,
    }


#: `tenant`'s options: flag, how its value is read, its metavar, its help.
_TENANT_FLAGS: tuple[tuple[str, Callable[[str, str], float | int], str, str], ...] = (
    ("--weight", parse_float, "W", "its share of a full worker against the others' (> 0)"),
    ("--priority", parse_int, "P", "its calls' priority when they send none (1 the highest)"),
    ("--rate", parse_float, "R", "rate quota in calls per second (0: none)"),
    ("--burst", parse_float, "B", "calls a burst may take at once (0: one second of the rate)"),
    ("--max-concurrent", parse_int, "N", "calls it may hold at once (0: no limit)"),
)


def _command(name: str, args: argparse.Namespace, usage: str) -> Command:
    if name == "tenant":
        updates = []
        for flag, *_ in _TENANT_FLAGS:
            key = flag.removeprefix("--").replace("-", "_")
            value = getattr(args, key)
            if value is not None:
                updates.append((key, value))
        return SetTenant(args.tenant, tuple(updates))
    if name == "status":
        return Status()
    if name == "repack":
        return Repack(wait_seconds=args.wait)
    if name == "add-worker":
        return AddWorker(address=args.address, name=args.name, metrics=args.metrics)
    if name == "remove-worker":
        return RemoveWorker(worker=args.worker, drain_seconds=args.drain_seconds)
    if name == "set-replicas":
        return SetReplicas(
            model=args.model,
            replicas=args.replicas,
            fill_mode=args.fill_mode,
            fill_factor=args.fill_factor,
            allow_unknown=args.allow_unknown,
        )
    try:
        return SetPolicy(parse_policy_updates(args.pairs))
    except UsageError as exc:
        raise UsageError(exc.message, usage) from None


def parse_args(argv: Sequence[str], *, prog: str = DEFAULT_PROG) -> Invocation | ShowHelp:
    """Parse `rsgw ctl`'s arguments (without the program name).

    Returns:
        The gateway and command, or `ShowHelp` when `-h/--help` was asked for.

    Raises:
        UsageError: no command, an unknown command, an unknown flag, a missing or
            unreadable argument; `usage` holds the failing (sub)command's usage.
    """
    output: list[str] = []
    top = _Parser(
        output,
        prog=prog,
        usage=f"{prog} [-h] [--gateway HOST:PORT] COMMAND ...",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_gateway(top, DEFAULT_GATEWAY, False)
    top.add_argument("command", nargs="?", metavar="COMMAND", help=argparse.SUPPRESS)
    top.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    commands = _command_parsers(prog, output)
    try:
        head = top.parse_args(list(argv))
        if head.command is None:
            raise UsageError("no command given", top.format_usage())
        parser = commands.get(head.command)
        if parser is None:
            raise UsageError(
                f"unknown command '{head.command}'{nearest(head.command, list(commands))}; "
                f"the commands: {', '.join(commands)}",
                top.format_usage(),
            )
        args = parser.parse_args(head.rest)
    except _Exit:
        return ShowHelp("".join(output))
    gateway: str = getattr(args, "gateway", head.gateway)
    as_json = bool(getattr(args, "json", head.json))
    command = _command(head.command, args, parser.format_usage())
    return Invocation(gateway, command, as_json, _access(args, head))
