"""The gateway's guard: authentication, authorisation and the audit log around its handlers.

`Guard.wrap` puts a check in front of every handler when `auth:` is on (the
decision is `rsgw.base._auth.Authorizer`'s); with auth off nothing is wrapped but the
audited methods, so the data plane pays nothing for a feature it does not use.

The audit log (logger `rsgw.audit`, one INFO line per call) covers every
operator action and every shared memory registration or unregistration, whether
auth is on or not: who (the principal, else the client's owner name), what (the
method), from where (the peer), and how it ended (the status code). Refusals of
those methods are audited too; refusals of others are logged within the per-kind
log budget.

The tokens file is re-read when it changes (checked every second) or on SIGHUP
(`reload`); a file that no longer parses is logged and the tokens in force stay.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

import trio

from rsgw.base._auth import (
    Authorizer,
    Principal,
    Role,
    bearer_token,
    changes_node,
    parse_identities,
    parse_tokens,
    protected_refusal,
    role_of,
)
from rsgw.base._body import Body
from rsgw.base._call import CallContext
from rsgw.base._errors import ConfigError, GrpcError
from rsgw.base._methods import Method
from rsgw.base._peer import REMOTE
from rsgw.base._status import StatusCode
from rsgw.base._values import read_yaml
from rsgw.runtime._logging import log_limited

if TYPE_CHECKING:
    from rsgw.config._blocks import AuthConfig
    from rsgw.grpc._streams import ServerStream, StreamHandler

#: A unary handler's message type: plain bytes, or a pass-through's `Body`.
B = TypeVar("B", bytes, Body)
#: A unary handler or a pass-through (`rsgw.base._call`), guarded alike.
Handler = Callable[[B, CallContext], Awaitable[B]]

logger = logging.getLogger(__name__)
audit = logging.getLogger("rsgw.audit")

#: Besides every operator method: what the audit log records.
_AUDITED = frozenset(
    m.path
    for m in (
        Method.SHM_REGISTER,
        Method.SHM_UNREGISTER,
        Method.CUDA_SHM_REGISTER,
        Method.CUDA_SHM_UNREGISTER,
    )
)
#: How often the tokens file is checked for changes.
RELOAD_CHECK_SECONDS = 1.0


def audited(path: str) -> bool:
    return path in _AUDITED or role_of(path) is Role.OPERATOR


class Guard:
    """Checks each call of the gateway's listener (see the module docstring)."""

    def __init__(self, config: AuthConfig) -> None:
        self.enabled = config.enabled
        #: Protected mode (`rsgw.base._auth`): no auth, and the network not declared trusted.
        self.protected = not config.enabled and not config.trusted_network
        self._tokens_file = config.tokens_file
        self._identities = parse_identities(dict(config.identities))
        self._stamp = self._file_stamp()
        self.authorizer = Authorizer(self._read_tokens(), self._identities)

    # -- the tokens file --------------------------------------------------------------

    def _file_stamp(self) -> tuple[float, int] | None:
        if not self._tokens_file:
            return None
        try:
            stat = os.stat(self._tokens_file)
        except OSError:
            return None
        return (stat.st_mtime, stat.st_size)

    def _read_tokens(self) -> Mapping[str, Principal]:
        if not self._tokens_file:
            return {}
        document = read_yaml(self._tokens_file, what="auth.tokens_file")
        return parse_tokens(document, self._tokens_file)

    def reload(self) -> bool:
        """Read the tokens file again; keep the tokens in force if it does not parse."""
        self._stamp = self._file_stamp()
        try:
            tokens = self._read_tokens()
        except ConfigError as exc:
            logger.warning(
                "tokens file reload failed; keeping the tokens in force", extra={"error": str(exc)}
            )
            return False
        self.authorizer = Authorizer(tokens, self._identities)
        logger.info("tokens reloaded", extra={"tokens": len(tokens)})
        return True

    def reload_if_changed(self) -> bool:
        if self._file_stamp() == self._stamp:
            return False
        return self.reload()

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Re-read the tokens file whenever it changes, until cancelled."""
        task_status.started()
        if not self._tokens_file:
            return
        while True:
            await trio.sleep(RELOAD_CHECK_SECONDS)
            self.reload_if_changed()

    # -- the check --------------------------------------------------------------------

    def check(self, call: CallContext) -> None:
        """Authorise `call` (setting its principal) or raise UNAUTHENTICATED/PERMISSION_DENIED."""
        try:
            call.principal = self.authorizer.authorize(
                call.path, bearer_token(call.metadata), call.client.certificate
            )
        except GrpcError as exc:
            name = exc.code.name
            if not audited(call.path):
                log_limited(
                    logger,
                    logging.WARNING,
                    "call refused",
                    {"rpc": call.path, "peer": call.peer, "code": name},
                    name,
                )
            raise

    def wrap(self, handlers: Mapping[str, Handler[B]]) -> dict[str, Handler[B]]:
        """`handlers` with the check (auth on) and the audit line (audited paths) in front."""
        return {path: self._unary(path, handler) for path, handler in handlers.items()}

    def wrap_streams(self, handlers: Mapping[str, StreamHandler]) -> dict[str, StreamHandler]:
        return {path: self._stream(path, handler) for path, handler in handlers.items()}

    def _unary(self, path: str, handler: Handler[B]) -> Handler[B]:
        logged = audited(path)
        if not self.enabled and not logged:
            return handler
        check = self.check if self.enabled else None
        protect = self.protected and role_of(path) is Role.OPERATOR

        async def guarded(body: B, call: CallContext) -> B:
            try:
                if check is not None:
                    check(call)
                elif protect and call.client.kind == REMOTE:
                    request = body if isinstance(body, bytes) else None
                    if changes_node(path, request):
                        raise protected_refusal(path, call.peer)
                reply = await handler(body, call)
            except BaseException as exc:
                if logged:
                    _audit(call, call.status_for(exc))
                raise
            if logged:
                _audit(call, StatusCode.OK)
            return reply

        return guarded

    def _stream(self, path: str, handler: StreamHandler) -> StreamHandler:
        if not self.enabled:
            return handler
        check = self.check

        async def guarded(stream: ServerStream) -> None:
            check(stream.call)
            await handler(stream)

        return guarded


def _audit(call: CallContext, code: StatusCode) -> None:
    who = str(call.principal) if call.principal is not None else call.client.owner
    audit.info(
        "audit",
        extra={"principal": who, "rpc": call.path, "peer": call.peer, "code": code.name},
    )
