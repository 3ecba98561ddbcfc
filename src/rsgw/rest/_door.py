"""The REST front door: answers Triton's REST API with the gateway's handlers.

Each request is matched to its gRPC method (`rsgw.rest._routes`), its body read
(bounded by `grpc.max_recv_msg_bytes`, inflated when `Content-Encoding` says gzip or
deflate) and turned into that method's request; then the same guarded handler the
gRPC door calls runs with a `CallContext` built from the HTTP request (its headers
are the call's metadata, so `Authorization: Bearer` is checked by the same guard and
roles), under the same deadline rules. Its reply, or its error, is written the way
Triton's REST server writes it. Inference goes through the tensor codec
(`rsgw.rest._codec`): one ModelInferRequest is built per call, and the worker's
answer becomes JSON and binary tensors; the gateway's ModelInfer path in between is
the gRPC one, byte for byte.

What a JSON body costs. Its large numeric arrays are packed without a Python object
per number (`rsgw.rest._codec.read_request`), and before they are: the inputs are
checked against the model's metadata (a wrong shape is answered 400 without reading
a number), and the bytes they will pack into are paid for from the upload budget
(`rsgw.base._uploads`) beyond what the listener reserved for the body
(`body_reservation`): granted at once, or refused 429 (413 when no budget could
ever hold them), in words that point to the binary tensor extension. Packing and
writing a large JSON reply run in a thread, so the event loop keeps serving the
other clients meanwhile.

rsgw's own HTTP/1.1 listener (`rsgw.rest._listener`) serves it on `listen.http`,
calling `RestDoor.respond` with each whole request; HTTP/2 there (h2c, or h2 over
TLS) goes to hypercorn, which serves the door as an ASGI app.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio
from google.protobuf.message import DecodeError

from rsgw._proto import grpc_predict_v2_pb2 as pb
from rsgw.base._body import Body
from rsgw.base._call import CallContext, PassThrough, TimeLimits, UnaryHandler
from rsgw.base._methods import Method
from rsgw.base._peer import LOOPBACK, REMOTE, Peer, is_loopback
from rsgw.base._status import StatusCode
from rsgw.base._uploads import Share, Ticket, UploadBudget
from rsgw.grpc.protocol._compression import plain
from rsgw.rest._codec import RequestDraft, read_request, shape_problem
from rsgw.rest._reply import decode_response
from rsgw.rest._rest_errors import RestError, error_body, http_status, retry_after
from rsgw.rest._routes import INFER, match
from rsgw.runtime._admin import Receive, Scope, Send, header, lifespan

logger = logging.getLogger(__name__)


#: Headers that describe the HTTP request itself, not the call: never call metadata.
_NOT_METADATA = frozenset(
    {
        b"host",
        b"content-length",
        b"content-type",
        b"content-encoding",
        b"accept-encoding",
        b"connection",
        b"transfer-encoding",
        b"inference-header-content-length",
        b"user-agent",
        b"accept",
    }
)
_JSON = (b"content-type", b"application/json")
_OCTETS = (b"content-type", b"application/octet-stream")
_BINARY_LENGTH = b"inference-header-content-length"
_ENCODINGS = {b"gzip": 31, b"deflate": 15}
#: Replies shorter than this go uncompressed whatever the client accepts (not worth it).
COMPRESS_FROM_BYTES = 256
#: Work on a body or reply this large runs in a thread (the event loop serves on).
THREAD_FROM_BYTES = 1024 * 1024
#: How to send tensors without JSON's cost, for the messages that refuse it.
BINARY_ADVICE = (
    "send the tensors in binary (the binary tensor data extension: "
    "Inference-Header-Content-Length and binary_data_size), or smaller requests"
)


@dataclass(frozen=True, slots=True)
class Response:
    """What the door answers a request: the status, its headers (lower-case names,
    `content-length` first) and the whole body (a listener sends none for HEAD)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class RestDoor:
    """The REST listener's request handler; see the module docstring.

    `respond` is the door itself, with no HTTP framing in it: rsgw's own HTTP/1.1
    listener (`rsgw.rest._listener`) calls it on the connection's task. The instance
    is also an ASGI app over `respond`, which hypercorn serves for HTTP/2 (h2c, and
    h2 over TLS).

    Args:
        handlers: the gateway's unary handlers by gRPC path, guarded.
        pass_through: ModelInfer's handler by path, guarded.
        time_limits: the methods' own time limits, by path (as the gRPC door's).
        max_body_bytes: the largest request body, inflated (`grpc.max_recv_msg_bytes`).
        upload_budget: what large JSON bodies' numbers are paid from (None: no bound).
    """

    def __init__(
        self,
        handlers: Mapping[str, UnaryHandler],
        pass_through: Mapping[str, PassThrough],
        *,
        time_limits: TimeLimits,
        max_body_bytes: int,
        upload_budget: UploadBudget | None = None,
    ) -> None:
        self._handlers = dict(handlers)
        self._infer = pass_through[Method.MODEL_INFER.path]
        self._time_limits = time_limits
        self.max_body_bytes = max_body_bytes
        self._uploads = upload_budget

    def body_reservation(self, path: str, headers: list[tuple[bytes, bytes]], size: int) -> int:
        """What a listener should reserve from the upload budget for a body of `size`
        bytes before reading it: the body, and for an inference body that is all JSON as
        much again for the numbers it packs into (FP32 written `1.5,` packs into as many
        bytes); `respond` pays for any more itself."""
        if header(headers, _BINARY_LENGTH) is None and path.endswith("/infer"):
            return 2 * size
        return size

    async def respond(
        self,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | bytearray,
        peer: Peer,
        reserved: int = 0,
    ) -> Response:
        """The answer to one request whose whole body (as it came, maybe compressed) is
        `body`; `headers` have lower-case names. `reserved` is what the listener holds
        from the upload budget beyond the body (`body_reservation`). Never raises but
        for cancellation."""
        try:
            route, target = match(method, path)
            body = self._inflated(headers, body)
            call = _call(headers, route.method.path, peer)
            if route is INFER:
                draft = self._read(target.model, target.version, body, headers)
                reply, extra = await self._inference(draft, target.version, call, peer, reserved)
                # Triton compresses inference replies only (not errors, not the other
                # endpoints): tritonclient.http.aio reads those undecoded.
                accept = header(headers, b"accept-encoding")
                if accept is not None:
                    reply, extra = _compressed(reply, extra, accept)
                return _response(200, reply, extra)
            request = route.build(target, bytes(body))
            handler = self._handlers.get(route.method.path)
            if handler is None:
                raise RestError(501, f"{route.method.rpc} is not served here")
            answer = await self._run(handler, request, call)
            status, reply = route.render(answer)
            return _response(status, reply, [])
        except RestError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        except Exception as exc:  # a bug: answered and logged, never the listener's end
            logger.exception("REST request failed", extra={"path": path[:200]})
            return error_response(500, f"internal error: {type(exc).__name__}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The door as an ASGI app (hypercorn's HTTP/2)."""
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        try:
            body = await self._read_body(receive)
        except RestError as exc:
            response = error_response(exc.status, exc.message)
        else:
            response = await self.respond(
                scope["method"], scope["path"], headers, body, _scope_peer(scope)
            )
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": response.headers,
            }
        )
        body = b"" if scope["method"] == "HEAD" else response.body
        await send({"type": "http.response.body", "body": body})

    def _read(
        self, model: str, version: str, body: bytes | bytearray, headers: list[tuple[bytes, bytes]]
    ) -> RequestDraft:
        length = header(headers, _BINARY_LENGTH)
        header_length = None
        if length is not None:
            try:
                header_length = int(length)
            except ValueError:
                raise RestError(400, "Inference-Header-Content-Length must be an integer") from None
        return read_request(model, version, body, header_length)

    async def _inference(
        self, draft: RequestDraft, version: str, call: CallContext, peer: Peer, reserved: int
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The REST answer to an inference request; see the module docstring for the
        cost of a large JSON body."""
        ticket: Ticket | None = None
        try:
            if draft.expansion:
                await self._check_shapes(draft, version, call, peer)
                ticket = self._afford(draft, draft.expansion - reserved)
                encoded = await trio.to_thread.run_sync(draft.encode, self.max_body_bytes)
            else:
                encoded = draft.encode(self.max_body_bytes)
            answer = plain(await self._run(self._infer, encoded.message, call), self.max_body_bytes)
            if len(answer) >= THREAD_FROM_BYTES:
                reply, json_length = await trio.to_thread.run_sync(decode_response, answer, encoded)
            else:
                reply, json_length = decode_response(answer, encoded)
        finally:
            if ticket is not None:
                ticket.release()
        if json_length is None:
            return reply, []
        return reply, [(b"inference-header-content-length", str(json_length).encode())]

    async def _check_shapes(
        self, draft: RequestDraft, version: str, call: CallContext, peer: Peer
    ) -> None:
        """Refuse (400) inputs the model's metadata says cannot be its own, before their
        numbers are read; a model whose metadata cannot be had is left to its worker."""
        handler = self._handlers.get(Method.MODEL_METADATA.path)
        if handler is None:
            return
        request = pb.ModelMetadataRequest(name=draft.model, version=version).SerializeToString()
        asking = CallContext(
            Method.MODEL_METADATA.path,
            call.deadline,
            call.metadata,
            peer.address,
            client=peer,
            protocol="rest",
        )
        try:
            reply = await self._run(handler, request, asking)
            metadata = pb.ModelMetadataResponse.FromString(reply)
        except (RestError, DecodeError):
            return
        problem = shape_problem(draft, metadata)
        if problem is not None:
            raise RestError(400, problem)

    def _afford(self, draft: RequestDraft, extra: int) -> Ticket | None:
        """Pay `extra` bytes of packed numbers from the upload budget, now or never.

        Never waits: the listener already holds this request's body from the same
        budget, and requests that wait while holding could wait for each other.

        Raises:
            RestError: 413 past the whole budget, 429 past what is free now.
        """
        budget = self._uploads
        if budget is None or extra <= 0:
            return None
        packed = draft.expansion
        if extra > budget.limit:
            raise RestError(
                413,
                f"the JSON numbers of this request to model '{draft.model}' pack into "
                f"{packed} bytes, more than the gateway's upload budget of {budget.limit} "
                f"bytes can hold; {BINARY_ADVICE}",
            )
        ticket = budget.request(extra, Share(extra), _never_woken)
        if ticket is not None and ticket.granted:
            return ticket
        if ticket is not None:
            ticket.release()
        raise RestError(
            429,
            f"the gateway cannot take the {packed} bytes the JSON numbers of this request "
            f"to model '{draft.model}' pack into now ({budget.describe()}); retry later, "
            f"or {BINARY_ADVICE}",
        )

    async def _run(
        self,
        handler: Callable[[Any, CallContext], Awaitable[Any]],
        request: Body,
        call: CallContext,
    ) -> Any:
        """The handler's reply, run as the gRPC door runs it (deadline, time limit)."""
        code, message = StatusCode.OK, ""
        reply = None
        with trio.CancelScope() as scope:
            call.begin(scope, self._time_limits.get(call.path))
            try:
                reply = await handler(request, call)
            except RestError:
                raise
            except Exception as exc:
                code, message = call.failed(exc)
        call.scope = None
        if scope.cancelled_caught:
            code, message = call.cut_short()
        if code is not StatusCode.OK:
            raise RestError(http_status(code), message, retry_after(call.trailers))
        return reply

    async def _read_body(self, receive: Receive) -> bytes:
        """An ASGI request's whole body, held to the limit.

        Raises:
            RestError: 413 past the limit, 400 if the client went before its end.
        """
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RestError(400, "the client closed the request before its body ended")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise RestError(413, too_large(self.max_body_bytes))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _inflated(
        self, headers: list[tuple[bytes, bytes]], body: bytes | bytearray
    ) -> bytes | bytearray:
        """`body` inflated if it came compressed, held to the limit.

        Raises:
            RestError: 413 past the limit, 415 for an encoding other than gzip or
                deflate, 400 for a body that does not inflate.
        """
        encoding = header(headers, b"content-encoding")
        if encoding is None:
            return body
        encoding = encoding.strip().lower()
        if encoding in (b"", b"identity"):
            return body
        wbits = _ENCODINGS.get(encoding)
        if wbits is None:
            raise RestError(
                415,
                f"unsupported Content-Encoding {encoding.decode(errors='replace')!r}; "
                "use gzip or deflate",
            )
        engine = zlib.decompressobj(wbits=wbits)
        try:
            inflated = engine.decompress(body, self.max_body_bytes + 1)
        except zlib.error as exc:
            raise RestError(
                400, f"failed to decompress the {encoding.decode()} body: {exc}"
            ) from None
        if len(inflated) > self.max_body_bytes:
            raise RestError(
                413, f"request body larger than {self.max_body_bytes} bytes when decompressed"
            )
        return inflated


def _never_woken(_: Ticket) -> None:
    """`RestDoor._afford` releases a ticket it was not granted at once."""


def too_large(limit: int) -> str:
    return f"request body larger than {limit} bytes"


def error_response(
    status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> Response:
    """Triton's error reply: `{"error": message}` with `status` (and `headers`)."""
    return _response(status, error_body(message), headers or [])


def _call(headers: list[tuple[bytes, bytes]], path: str, peer: Peer) -> CallContext:
    metadata = tuple((k, v) for k, v in headers if k not in _NOT_METADATA)
    return CallContext(path, math.inf, metadata, peer.address, client=peer, protocol="rest")


def _scope_peer(scope: Scope) -> Peer:
    """An ASGI request's client, as `rsgw.base._peer.peer_of` sees a socket's."""
    client = scope.get("client") or ("", 0)
    server = scope.get("server") or ("", 0)
    host, port = str(client[0]), int(client[1] or 0)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    kind = LOOPBACK if is_loopback(host) else REMOTE
    return Peer(kind, address, ends=(host, port, str(server[0]), int(server[1] or 0)))


def _compressed(
    reply: bytes, extra: list[tuple[bytes, bytes]], accept: bytes | None
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """`reply` compressed in the first of gzip and deflate the client accepts, as Triton
    answers a client that asks (`Accept-Encoding`); as it is otherwise."""
    if not accept or len(reply) < COMPRESS_FROM_BYTES:
        return reply, extra
    name = _chosen_encoding(accept)
    if name == b"identity":
        return reply, extra
    engine = zlib.compressobj(wbits=_ENCODINGS[name])
    return engine.compress(reply) + engine.flush(), [*extra, (b"content-encoding", name)]


def _chosen_encoding(accept: bytes) -> bytes:
    """Triton's pick (http_server.cc CompressionTypeUsed): of identity, deflate and gzip,
    the one of highest q (1 when not given), the first listed among equals; identity
    when none has q > 0."""
    best, weight = b"identity", 0.0
    for token in accept.split(b","):
        name, _, params = token.partition(b";")
        q = 1.0
        params = params.strip()
        if params.startswith(b"q="):
            try:
                q = float(params[2:])
            except ValueError:
                continue
        name = name.strip().lower()
        if name in (b"identity", b"deflate", b"gzip") and q > weight:
            best, weight = name, q
    return best


def _response(status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> Response:
    headers = [(b"content-length", b"%d" % len(body)), *extra]
    if body:
        binary = bool(extra) and any(name == _BINARY_LENGTH for name, _ in extra)
        headers.append(_OCTETS if binary else _JSON)
    return Response(status, headers, body)
