"""rsgw's etcd client against a real etcd: KV, transactions, leases, watches, failures."""

from __future__ import annotations

import trio

from rsgw._proto import etcd_v3_pb2 as epb
from rsgw.coordination._etcd import (
    Etcd,
    EtcdUnavailable,
    LeaseLost,
    create_if_absent,
    prefix_end,
    put_while,
)
from tests.etcd import EtcdProcess


def test_prefix_end() -> None:
    assert prefix_end(b"/rsgw/") == b"/rsgw0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\x00"


async def test_get_put_delete_and_prefix(etcd: EtcdProcess) -> None:
    async with trio.open_nursery() as nursery:
        client = Etcd([etcd.endpoint], nursery)
        assert await client.get(b"/t/a") is None
        revision = await client.put(b"/t/a", b"1")
        await client.put(b"/t/b", b"2")
        await client.put(b"/u", b"3")
        kv = await client.get(b"/t/a")
        assert kv is not None and kv.value == b"1" and kv.mod_revision == revision
        kvs, at = await client.get_prefix(b"/t/")
        assert [(k.key, k.value) for k in kvs] == [(b"/t/a", b"1"), (b"/t/b", b"2")]
        assert at >= revision
        assert await client.delete(b"/t/a") == 1
        assert await client.get(b"/t/a") is None
        await client.aclose()


async def test_a_transaction_creates_a_key_once(etcd: EtcdProcess) -> None:
    async with trio.open_nursery() as nursery:
        client = Etcd([etcd.endpoint], nursery)

        def claim(who: bytes) -> epb.TxnRequest:
            return create_if_absent(b"/t/leader", who, 0)

        first = await client.txn(claim(b"a"))
        second = await client.txn(claim(b"b"))
        assert first.succeeded and not second.succeeded
        assert second.responses[0].response_range.kvs[0].value == b"a"
        assert (await client.txn(put_while(b"/t/leader", b"a", b"/t/data", b"1"))).succeeded
        assert not (await client.txn(put_while(b"/t/leader", b"b", b"/t/data", b"2"))).succeeded
        kv = await client.get(b"/t/data")
        assert kv is not None and kv.value == b"1"
        await client.aclose()


async def test_a_leases_keys_go_when_it_is_revoked_and_a_watch_sees_it(etcd: EtcdProcess) -> None:
    async with trio.open_nursery() as nursery:
        client = Etcd([etcd.endpoint], nursery)
        lease = await client.grant(5)
        await client.put(b"/t/member", b"me", lease=lease)
        seen: list[tuple[int, bytes]] = []
        lost = trio.Event()

        async def keep_alive() -> None:
            # Kept alive until revoked; its next refresh then learns the lease is gone
            # (whenever that comes relative to the watch: not a failure of this test).
            try:
                await client.keep_alive(lease, 0.2)
            except LeaseLost:
                lost.set()

        async with client.watch(b"/t/", prefix=True) as events:
            nursery.start_soon(keep_alive)
            await client.put(b"/t/other", b"x")
            await client.revoke(lease)
            with trio.fail_after(10):
                async for event in events:
                    seen.append((event.type, event.kv.key))
                    if len(seen) == 2:
                        break
        assert seen == [(epb.Event.PUT, b"/t/other"), (epb.Event.DELETE, b"/t/member")]
        assert await client.get(b"/t/member") is None
        with trio.fail_after(10):
            await lost.wait()
        nursery.cancel_scope.cancel()


async def test_keep_alive_of_a_lost_lease_raises(etcd: EtcdProcess) -> None:
    async with trio.open_nursery() as nursery:
        client = Etcd([etcd.endpoint], nursery)
        lease = await client.grant(5)
        await client.revoke(lease)
        with trio.fail_after(10):
            try:
                await client.keep_alive(lease, 0.1)
            except LeaseLost as exc:
                assert "expired" in str(exc)
            else:
                raise AssertionError("keep_alive returned")
        await client.aclose()


async def test_an_unreachable_etcd_is_one_clear_error(etcd: EtcdProcess) -> None:
    async with trio.open_nursery() as nursery:
        dead = f"127.0.0.1:{etcd.port + 7}"  # nobody listens there (most likely)
        client = Etcd([dead, etcd.endpoint], nursery)
        assert await client.put(b"/t/k", b"v") > 0  # the second endpoint answered
        assert client.endpoint == etcd.endpoint
        etcd.pause()
        try:
            with trio.fail_after(20):
                try:
                    await client.get(b"/t/k")
                except EtcdUnavailable as exc:
                    assert "no etcd endpoint answered" in str(exc)
                else:
                    raise AssertionError("a stopped etcd answered")
        finally:
            etcd.resume()
        assert (await client.get(b"/t/k")) is not None
        await client.aclose()
