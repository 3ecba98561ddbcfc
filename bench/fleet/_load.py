"""The open-loop load: Poisson arrivals of one-row ModelInfer calls, and what they saw.

grpcio's asyncio API (C-core underneath) on one connection to the gateway: its per-call
cost in Python is small enough that one process sends 400 calls/s on a shared core
without falling behind. Each request is sent at its scheduled time whether or not
earlier ones have answered (open loop), so a slow fleet meets the same arrivals as a
fast one. Latency is measured from the *scheduled* send time, so any lag of the sender
counts against the latency rather than hiding it (no coordinated omission); the lag is
reported so that a run whose sender fell behind can be told apart.

The arrival sequence depends only on the seed: repetition k of every mode replays the
same requests at the same times, so the modes are compared on identical traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from rsgw.simulate._results import OK, UNANSWERED, Outcome, Schedule
from rsgw.simulate._scenario import request_body

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
CONNECT_TIMEOUT_S = 10.0


async def _drive(
    names: Sequence[str],
    ports: Sequence[int],
    schedule: Schedule,
    deadline: float,
    drain: float,
    marks: Sequence[tuple[str, float, Callable[[], Any]]],
) -> Outcome:
    loop = asyncio.get_running_loop()
    bodies = [request_body(name) for name in names]
    n = len(schedule.times)
    outcome = Outcome(schedule, [math.nan] * n, [math.nan] * n, [UNANSWERED] * n)
    options = [("grpc.max_concurrent_streams", 4096), ("grpc.enable_retries", 0)]
    async with contextlib.AsyncExitStack() as stack:
        channels = [
            await stack.enter_async_context(
                grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options)
            )
            for port in ports
        ]
        infers = [channel.unary_unary(MODEL_INFER) for channel in channels]
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
        start = loop.time()
        outcome.started_wall = time.time()

        async def call(i: int) -> None:
            # With several gateways, the calls alternate between them.
            infer = infers[i % len(infers)]
            try:
                await infer(bodies[schedule.models[i]], timeout=deadline)
                outcome.codes[i] = OK
            except grpc.aio.AioRpcError as exc:
                outcome.codes[i] = exc.code().name
            outcome.done[i] = loop.time() - start

        async def mark(name: str, at: float, snapshot: Callable[[], Any]) -> None:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            outcome.mark_times[name] = loop.time() - start
            outcome.marks[name] = await loop.run_in_executor(None, snapshot)

        markers = [asyncio.create_task(mark(*m)) for m in marks]
        pending: set[asyncio.Task[None]] = set()
        for i, due in enumerate(schedule.times):
            delay = start + due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            outcome.lag[i] = loop.time() - start - due
            task = asyncio.create_task(call(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(set(pending), timeout=drain)
        for task in list(pending):
            task.cancel()
        await asyncio.gather(*markers)
    return outcome


def drive(
    names: Sequence[str],
    ports: Sequence[int],
    schedule: Schedule,
    deadline: float,
    drain: float,
    marks: Sequence[tuple[str, float, Callable[[], Any]]],
) -> Outcome:
    """Send `schedule` to the gateways on `ports` (alternately); take each mark's snapshot
    at its time.

    A call gets `deadline` seconds; after the last send, calls still in flight get up to
    `drain` seconds before they are given up (and counted UNANSWERED).
    """
    return asyncio.run(_drive(names, ports, schedule, deadline, drain, marks))
