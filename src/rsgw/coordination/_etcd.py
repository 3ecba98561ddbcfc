"""An etcd v3 client on rsgw's own gRPC channel: the few calls coordination makes.

Why not an etcd library: the Python ones are grpcio-based (threads under Trio) or
asyncio-based, and python-etcd3, the common one, pins protobuf 3 and is unmaintained.
etcd's API is plain gRPC, and rsgw has a Trio gRPC client already
(`rsgw.grpc._client.Channel`, streaming included), so this module is the messages
(`proto/etcd_v3.proto`, etcd's field numbers) and a dozen methods: get, put, delete,
a transaction, a lease with its keep-alive stream, and a watch stream.

Endpoints: the first that answers is used until it fails; a call that fails with
UNAVAILABLE (a refused or lost connection, or etcd's own "no leader") is tried on
the next endpoint once round, then raises `EtcdUnavailable`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar

import trio
from google.protobuf.message import DecodeError, Message

from rsgw._proto import etcd_v3_pb2 as epb
from rsgw.base._errors import GrpcError, RsgwError, WorkerUnavailable
from rsgw.base._status import StatusCode
from rsgw.grpc._client import Channel
from rsgw.grpc._streams import ClientStream
from rsgw.runtime._net import TCP, Network

logger = logging.getLogger(__name__)

RANGE = b"/etcdserverpb.KV/Range"
PUT = b"/etcdserverpb.KV/Put"
DELETE_RANGE = b"/etcdserverpb.KV/DeleteRange"
TXN = b"/etcdserverpb.KV/Txn"
WATCH = b"/etcdserverpb.Watch/Watch"
LEASE_GRANT = b"/etcdserverpb.Lease/LeaseGrant"
LEASE_REVOKE = b"/etcdserverpb.Lease/LeaseRevoke"
LEASE_KEEP_ALIVE = b"/etcdserverpb.Lease/LeaseKeepAlive"

#: How long one etcd call may take before it counts as etcd being unreachable.
CALL_SECONDS = 3.0

Reply = TypeVar("Reply", bound=Message)


class EtcdUnavailable(RsgwError):
    """No etcd endpoint answered (refused, lost, timed out, or without a leader)."""

    grpc_status = StatusCode.UNAVAILABLE


class LeaseLost(RsgwError):
    """etcd says the lease is gone (expired while we could not reach it, or revoked)."""


def prefix_end(prefix: bytes) -> bytes:
    """The `range_end` that makes a range or watch cover every key starting with `prefix`."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"  # every key


def create_if_absent(key: bytes, value: bytes, lease: int) -> epb.TxnRequest:
    """A transaction that creates `key` (under `lease`) unless it exists, and otherwise
    reads it: an election's claim."""
    absent = epb.Compare(
        key=key, target=epb.Compare.CREATE, result=epb.Compare.EQUAL, create_revision=0
    )
    put = epb.PutRequest(key=key, value=value, lease=lease)
    return epb.TxnRequest(
        compare=[absent],
        success=[epb.RequestOp(request_put=put)],
        failure=[epb.RequestOp(request_range=epb.RangeRequest(key=key))],
    )


def put_while(guard: bytes, holds: bytes, key: bytes, value: bytes) -> epb.TxnRequest:
    """A transaction that writes `key` only while `guard` holds `holds`: a fenced write."""
    equal = epb.Compare(key=guard, target=epb.Compare.VALUE, result=epb.Compare.EQUAL, value=holds)
    put = epb.PutRequest(key=key, value=value)
    return epb.TxnRequest(compare=[equal], success=[epb.RequestOp(request_put=put)])


class Etcd:
    """A client of one etcd cluster (see the module docstring).

    Args:
        endpoints: `host:port` of the cluster's members, tried in order.
        nursery: where the channels run their connections.
    """

    def __init__(
        self, endpoints: Sequence[str], nursery: trio.Nursery, *, network: Network = TCP
    ) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint")
        self.endpoints = tuple(endpoints)
        self._channels = [Channel(e, nursery, network=network) for e in self.endpoints]
        self._current = 0

    @property
    def endpoint(self) -> str:
        """The endpoint in use now."""
        return self.endpoints[self._current]

    async def aclose(self) -> None:
        for channel in self._channels:
            await channel.aclose()

    # -- KV ----------------------------------------------------------------------------

    async def get(self, key: bytes) -> epb.KeyValue | None:
        reply = await self._call(RANGE, epb.RangeRequest(key=key), epb.RangeResponse)
        return reply.kvs[0] if reply.kvs else None

    async def get_prefix(self, prefix: bytes) -> tuple[list[epb.KeyValue], int]:
        """Every key under `prefix`, and the store's revision they were read at."""
        request = epb.RangeRequest(key=prefix, range_end=prefix_end(prefix))
        reply = await self._call(RANGE, request, epb.RangeResponse)
        return list(reply.kvs), reply.header.revision

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Write `key`; the store's revision after the write."""
        request = epb.PutRequest(key=key, value=value, lease=lease)
        reply = await self._call(PUT, request, epb.PutResponse)
        return reply.header.revision

    async def delete(self, key: bytes) -> int:
        """Delete `key`; how many keys went (0 or 1)."""
        reply = await self._call(
            DELETE_RANGE, epb.DeleteRangeRequest(key=key), epb.DeleteRangeResponse
        )
        return reply.deleted

    async def txn(self, request: epb.TxnRequest) -> epb.TxnResponse:
        """One transaction: its compares decide whether `success` or `failure` runs."""
        return await self._call(TXN, request, epb.TxnResponse)

    # -- leases ------------------------------------------------------------------------

    async def grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; its id."""
        reply = await self._call(
            LEASE_GRANT, epb.LeaseGrantRequest(TTL=ttl), epb.LeaseGrantResponse
        )
        if reply.error:
            raise GrpcError(StatusCode.UNAVAILABLE, f"etcd granted no lease: {reply.error}")
        return reply.ID

    async def revoke(self, lease: int) -> None:
        """End the lease now: its keys go at once (a clean hand-over)."""
        await self._call(LEASE_REVOKE, epb.LeaseRevokeRequest(ID=lease), epb.LeaseRevokeResponse)

    async def keep_alive(self, lease: int, every: float) -> None:
        """Refresh `lease` every `every` seconds until cancelled.

        Raises:
            LeaseLost: etcd answered that the lease no longer exists.
            EtcdUnavailable: the stream failed (the caller decides how long to retry
                before the lease's TTL is up).
        """
        try:
            async with self._stream(LEASE_KEEP_ALIVE) as stream:
                request = epb.LeaseKeepAliveRequest(ID=lease).SerializeToString()
                while True:
                    await stream.send(request)
                    with trio.fail_after(CALL_SECONDS):
                        reply = await stream.receive()
                    if reply is None:
                        raise EtcdUnavailable("etcd ended the lease keep-alive stream")
                    answer = _decode(epb.LeaseKeepAliveResponse, reply)
                    if answer.TTL <= 0:
                        raise LeaseLost(f"etcd lease {lease:x} has expired")
                    await trio.sleep(every)
        except trio.TooSlowError as exc:
            self._next()
            raise EtcdUnavailable(f"etcd at {self.endpoint} did not answer a keep-alive") from exc

    # -- watches -----------------------------------------------------------------------

    @asynccontextmanager
    async def watch(
        self, key: bytes, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[Watcher]:
        """The changes to `key` (every key under it with `prefix`) from `start_revision`
        (0: from now), as an iterator of events, for the duration of the block.

        Raises (from the iterator):
            EtcdUnavailable: the stream failed, or etcd cancelled the watch (a compacted
                start revision): the caller reads the state again and watches anew.
        """
        create = epb.WatchCreateRequest(
            key=key, range_end=prefix_end(key) if prefix else b"", start_revision=start_revision
        )
        async with self._stream(WATCH) as stream:
            await stream.send(epb.WatchRequest(create_request=create).SerializeToString())
            yield Watcher(stream, self.endpoint)

    # -- plumbing ----------------------------------------------------------------------

    async def _call(self, path: bytes, request: Message, reply_type: type[Reply]) -> Reply:
        body = request.SerializeToString()
        failures: list[str] = []
        for _ in self.endpoints:
            channel = self._channels[self._current]
            try:
                reply = await channel.unary(path, body, deadline=trio.current_time() + CALL_SECONDS)
            except (WorkerUnavailable, GrpcError) as exc:
                if isinstance(exc, GrpcError) and exc.code not in _UNREACHABLE:
                    raise
                failures.append(f"{channel.target}: {exc}")
                self._next()
                continue
            return _decode(reply_type, reply)
        raise EtcdUnavailable("no etcd endpoint answered (" + "; ".join(failures) + ")")

    @asynccontextmanager
    async def _stream(self, path: bytes) -> AsyncIterator[ClientStream]:
        channel = self._channels[self._current]
        try:
            async with channel.stream(path) as stream:
                yield stream
        except (WorkerUnavailable, GrpcError) as exc:
            self._next()
            raise EtcdUnavailable(f"etcd at {channel.target}: {exc}") from exc

    def _next(self) -> None:
        self._current = (self._current + 1) % len(self.endpoints)


#: Statuses that mean "this endpoint cannot serve now", not "the request was wrong".
_UNREACHABLE = frozenset(
    {StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED, StatusCode.CANCELLED}
)


class Watcher:
    """The events of one watch, in order: `async for event in watcher` (a class, not an
    async generator, so that leaving the loop early needs no finalizer)."""

    def __init__(self, stream: ClientStream, endpoint: str) -> None:
        self._stream = stream
        self._endpoint = endpoint
        self._ready: list[epb.Event] = []

    def __aiter__(self) -> Watcher:
        return self

    async def __anext__(self) -> epb.Event:
        while not self._ready:
            self._ready = await self._next_batch()
        return self._ready.pop(0)

    async def _next_batch(self) -> list[epb.Event]:
        try:
            reply = await self._stream.receive()
        except (WorkerUnavailable, GrpcError) as exc:
            raise EtcdUnavailable(f"etcd at {self._endpoint}: watch failed: {exc}") from exc
        if reply is None:
            raise EtcdUnavailable(f"etcd at {self._endpoint} ended the watch")
        answer = _decode(epb.WatchResponse, reply)
        if answer.canceled:
            reason = answer.cancel_reason or f"compacted at {answer.compact_revision}"
            raise EtcdUnavailable(f"etcd at {self._endpoint} cancelled the watch: {reason}")
        return list(answer.events)


def _decode(reply_type: type[Reply], body: bytes) -> Reply:
    try:
        return reply_type.FromString(body)
    except DecodeError as exc:
        raise EtcdUnavailable(f"malformed etcd reply: {exc}") from exc
