"""The worker pool and its fan-out: what a worker's failure is, and what a bug is.

`fan_out` keeps each worker's failure (an `RsgwError`) as that worker's result, and
lets anything else, a bug, reach the caller as itself: the server then answers
INTERNAL naming it, instead of the bug passing for an unavailable worker. The
gateway tests run a memory fleet of real simulated workers with the autojump clock;
the bug is the one scripted part (a real worker cannot make the gateway raise).
"""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from rsgw._errors import GrpcError, WorkerUnavailable
from rsgw._methods import Method
from rsgw._status import StatusCode
from rsgw.gateway._pool import fan_out
from rsgw.grpc._client import Channel
from tests.gateway.fleet import open_fleet
from tests.gateway.test_failover import PROBING


async def test_each_workers_failure_is_its_own_result() -> None:
    async def call(url: str) -> str:
        await trio.lowlevel.checkpoint()
        if url == "b":
            raise WorkerUnavailable("b is down")
        return url.upper()

    results = await fan_out(["a", "b", "c"], call)
    assert results["a"] == "A" and results["c"] == "C"
    assert isinstance(results["b"], WorkerUnavailable)


async def test_a_bug_in_a_fan_out_is_raised_as_itself() -> None:
    """Not an ExceptionGroup: the server's boundary names what it answers INTERNAL for."""

    async def call(url: str) -> str:
        await trio.lowlevel.checkpoint()
        if url == "b":
            raise KeyError("a bug")
        return url

    with pytest.raises(KeyError, match="a bug"):
        await fan_out(["a", "b", "c"], call)


async def test_a_bug_reaches_the_client_as_internal(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ServerMetadata asks every ready worker; the gateway's call to one of them
    hits a bug. The client reads INTERNAL with the bug's name, not an answer built
    from the other worker alone as if the first were merely down."""
    async with open_fleet(2, memory=True, **PROBING) as fleet:
        channel = fleet.gateway._service.pool.channels[fleet.worker_url(1)]
        unary = channel.unary

        async def buggy(path: bytes, request: bytes, **options: object) -> bytes:
            if path == Method.SERVER_METADATA.wire:
                raise RuntimeError("a bug in the gateway")
            return await unary(path, request, **options)  # type: ignore[arg-type]  # as given

        monkeypatch.setattr(channel, "unary", buggy)
        client: Channel = fleet.channel()
        with pytest.raises(GrpcError) as failed:
            await client.unary(Method.SERVER_METADATA.wire, b"")
        assert failed.value.code is StatusCode.INTERNAL
        assert failed.value.message == "RuntimeError: a bug in the gateway"
