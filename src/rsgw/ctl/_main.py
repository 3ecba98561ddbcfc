"""The shell of `rsgw ctl`: parse, make one call on rsgw's own gRPC client, print.

Exit statuses (docs/original.md §7, docs/product.md §2): 0 done (and `--help`); 1 the
call failed, with one stderr line naming the status code, the message and the
gateway; 2 a command line we cannot run, with the error and the usage; 3 a
`repack --wait S` (S > 0) whose repack did not run within S seconds. The
operator never sees a traceback: this is a tool for people, so anything we did
not expect still becomes one line and exit 1.

We dial with `rsgw.grpc._client.Channel` (trio + h2), not grpcio, so the tool
needs only rsgw's runtime dependencies on the gateway host.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
from collections.abc import Sequence

import trio
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError, Message

from rsgw._proto import reactant_control_v1_pb2 as cpb
from rsgw.base._errors import RsgwError
from rsgw.base._status import StatusCode
from rsgw.ctl._args import DEFAULT_PROG, parse_args
from rsgw.ctl._commands import Access, Call, Command, Repack, ShowHelp, UsageError, call_for
from rsgw.ctl._render import format_error, render_reply
from rsgw.grpc._client import Channel
from rsgw.runtime._tls import client_context

#: Exit statuses.
EXIT_OK = 0
EXIT_CALL_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_IN_TIME = 3
#: How often a long `repack --wait` says it is still waiting (on stderr).
PROGRESS_SECONDS = 5.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


class CallFailed(Exception):
    """A call that did not produce a reply: a status code name and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


async def call_gateway(target: str, call: Call, access: Access | None = None) -> Message:
    """Make `call` on the gateway at `target` and decode its reply.

    The channel's connection tasks live in a nursery of our own, which we cancel
    once the one call is over; the channel is closed whatever happened, so the
    socket never outlives the call.

    Raises:
        CallFailed: the gateway answered a non-OK status, could not be reached, did
            not answer by the deadline, or answered bytes that are not the reply type.
    """
    failure: CallFailed | None = None
    reply = b""
    access = access or Access()
    metadata = ((b"authorization", f"Bearer {access.token}".encode()),) if access.token else ()
    try:
        context = (
            client_context(access.tls_ca, access.tls_cert, access.tls_key)
            if access.tls_ca
            else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise CallFailed("INVALID_ARGUMENT", f"cannot load the TLS files: {exc}") from None
    async with trio.open_nursery() as nursery:
        channel = Channel(target, nursery, ssl_context=context)
        if call.progress:
            nursery.start_soon(progress, call.progress)
        try:
            deadline = trio.current_time() + call.deadline_seconds
            reply = await channel.unary(
                call.path, call.request.SerializeToString(), deadline=deadline, metadata=metadata
            )
        except RsgwError as exc:  # the gateway's status, or no connection at all
            failure = CallFailed(exc.code.name, exc.message)
        finally:
            await channel.aclose()
            nursery.cancel_scope.cancel()
    # Raised out here, not in the nursery, so the caller never sees an ExceptionGroup.
    if failure is not None:
        raise failure
    try:
        return call.response_type.FromString(reply)
    except DecodeError as exc:
        name = call.response_type.DESCRIPTOR.name
        raise CallFailed(
            StatusCode.INTERNAL.name, f"the reply is not a valid {name}: {exc}"
        ) from exc


async def progress(what: str) -> None:
    """Say on stderr every few seconds that we are still waiting for `what`.

    Nothing for a call that is over sooner: its answer stays the only line.
    """
    started = trio.current_time()
    while True:
        await trio.sleep(PROGRESS_SECONDS)
        waited = trio.current_time() - started
        print(f"still waiting for {what}: {waited:.0f} s", file=sys.stderr, flush=True)


def render(command: Command, reply: Message, as_json: bool) -> str:
    """The reply as the operator asked: text, or protobuf's JSON mapping."""
    if not as_json:
        return render_reply(command, reply)
    fields = MessageToDict(
        reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json.dumps(fields, indent=2, sort_keys=True)


def exit_status(command: Command, reply: Message) -> int:
    """0, or 3 for a repack that was waited for and did not run in time."""
    waited = isinstance(command, Repack) and command.wait_seconds > 0
    if waited and isinstance(reply, cpb.RepackResponse) and not reply.completed:
        return EXIT_NOT_IN_TIME
    return EXIT_OK


def hint(message: str) -> str:
    """What to check when --gateway names the wrong thing (what a newcomer meets first)."""
    if message.startswith("cannot connect to"):
        return "; is a gateway running there? (rsgw run or rsgw node; --gateway HOST:PORT)"
    if " answered HTTP " in message:
        return (
            "; not a gRPC port (the REST or metrics port?): --gateway takes the gateway's "
            "gRPC port, 8001 unless listen.grpc says otherwise"
        )
    return ""


def main(argv: Sequence[str] | None = None, *, prog: str = DEFAULT_PROG) -> int:
    """Run `rsgw ctl` with `argv` (default `sys.argv[1:]`); return the exit status.

    Args:
        argv: the arguments after the program name.
        prog: the program name shown in usage (`tools/gateway_ctl.py` passes its own).
    """
    try:
        parsed = parse_args(sys.argv[1:] if argv is None else argv, prog=prog)
    except UsageError as exc:
        print(f"{exc.usage}{prog}: error: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(parsed, ShowHelp):
        _write(parsed.text.rstrip("\n"))
        return EXIT_OK
    target = parsed.gateway
    try:
        reply = trio.run(call_gateway, target, call_for(parsed.command), parsed.access)
        text = render(parsed.command, reply, parsed.json)
    except CallFailed as exc:
        print(format_error(exc.code, exc.message + hint(exc.message), target), file=sys.stderr)
        return EXIT_CALL_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseExceptionGroup as group:
        if group.split(KeyboardInterrupt)[1] is None:  # only Ctrl-C in there
            return EXIT_INTERRUPTED
        print(format_error("UNKNOWN", f"unexpected failure: {group!r}", target), file=sys.stderr)
        return EXIT_CALL_FAILED
    except Exception as exc:  # a bug in us; still one line for the operator
        print(format_error("UNKNOWN", f"unexpected failure: {exc!r}", target), file=sys.stderr)
        return EXIT_CALL_FAILED
    _write(text)
    return exit_status(parsed.command, reply)


def _write(text: str) -> None:
    """Print to stdout; a reader that went away (`| head`) is not an error."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit (see the `signal`
        # module's note on SIGPIPE); point stdout at /dev/null so that flush succeeds.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
