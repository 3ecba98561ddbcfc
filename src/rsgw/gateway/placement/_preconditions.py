"""lpt_packing's startup preconditions: every worker up, batching, serving one model set.

Packing places a model on a few GPUs and expects each of them to serve it and to
coalesce its requests. So before the gateway serves under lpt_packing, every
configured worker must answer ModelControlStatus, report the `fifo` or `edf`
discipline (`fair` interleaves models and defeats the fill quantum), and report the
same model set (docs/original.md §4.6.1). Workers that are still starting are waited
for up to `REACTANT_GATEWAY_STARTUP_WAIT_SECONDS` (`inf` = forever).

A worker that answers ModelControlStatus UNIMPLEMENTED has no such control plane
(Triton, MLServer, KServe): it has answered, and is left out of these checks. The
packing shell places its models by loading and unloading them where it can
(`repository.models`, Triton's repository extension), and otherwise routes them over
the workers that have them, and its start-up log says which, naming the capability
each lacks.

Better than the original: the polls of a round run concurrently (docs/product.md §3
item 12), so one hung worker costs one watchdog, not one per worker; and a missing
worker is re-polled every second rather than every ten, so a late worker delays
serving by at most a second.
"""

from __future__ import annotations

import logging
import math

import trio

from rsgw.base._errors import GatewayWedged, StartupError
from rsgw.gateway.fleet._meta_poll import ControlAnswer, poll_control_status
from rsgw.gateway.fleet._pool import WorkerPool, fan_out
from rsgw.gateway.fleet._prober import Prober
from rsgw.scheduling.calls._meta import WorkerCounters

logger = logging.getLogger(__name__)

#: Seconds between precondition rounds while waiting for workers.
RETRY_INTERVAL = 1.0
#: Seconds between "still waiting" log lines.
WAITING_LOG_INTERVAL = 10.0
#: Disciplines that coalesce a model's requests into batches.
BATCHING_DISCIPLINES = ("fifo", "edf")
#: Model names listed in a model-set mismatch message, at most.
SHOWN_MODELS = 5
#: What start-up says of workers without ReactantServer's control plane.
NO_CONTROL_PLANE = (
    "lpt_packing: these workers have neither ReactantServer's control plane nor models "
    "the gateway may load and unload (repository.models); they are not placed, and "
    "their models are routed over the workers that have them"
)


async def await_fleet(
    pool: WorkerPool,
    prober: Prober,
    *,
    wait_seconds: float,
    wedge_rounds: int = 3,
) -> tuple[dict[str, WorkerCounters], tuple[str, ...]]:
    """Poll every worker until all answer, then check them.

    Returns:
        The answers of the workers with the control plane, and the workers without it
        (ModelControlStatus UNIMPLEMENTED), each in pool order.

    Raises:
        StartupError: a worker stayed unreachable past the wait, reports a
            discipline other than fifo or edf, or serves a different model set.
        GatewayWedged: every poll of `wedge_rounds` consecutive rounds hit its watchdog.
    """
    deadline = trio.current_time() + wait_seconds if wait_seconds > 0 else -math.inf
    streak = 0
    last_logged = -math.inf
    started = trio.current_time()
    while True:
        results = await fan_out(
            pool.urls,
            lambda url: poll_control_status(prober.capabilities, pool, url, prober.probe_timeout),
        )
        answers: dict[str, WorkerCounters] = {}
        lacking: dict[str, str] = {}
        timed_out = 0
        for url in pool.urls:
            result = results[url]
            if isinstance(result, ControlAnswer) and result.counters is not None:
                answers[url] = result.counters
            elif isinstance(result, ControlAnswer) and result.lacking is not None:
                lacking[url] = result.lacking
            elif isinstance(result, ControlAnswer) and result.timed_out:
                timed_out += 1
        if len(answers) + len(lacking) == len(pool.urls):
            break
        streak = streak + 1 if timed_out == len(pool.urls) else 0
        if wedge_rounds > 0 and streak >= wedge_rounds:
            logger.error("every lpt_packing startup poll timed out", extra={"rounds": streak})
            raise GatewayWedged(
                f"every worker's ModelControlStatus poll timed out for {streak} consecutive rounds"
            )
        pending = sorted(
            _where(pool, url) for url in pool.urls if url not in answers and url not in lacking
        )
        now = trio.current_time()
        if now >= deadline:
            waited = f" after {now - started:.0f}s" if wait_seconds > 0 else ""
            raise StartupError(
                f"lpt_packing scheduling: worker(s) [{', '.join(pending)}] not answering"
                f"{waited}; all workers must be up (set "
                "REACTANT_GATEWAY_STARTUP_WAIT_SECONDS to wait for them, inf = forever)"
            )
        if now - last_logged >= WAITING_LOG_INTERVAL:
            last_logged = now
            logger.info(
                "lpt_packing: waiting for all workers before serving",
                extra={"ready": sorted(pool.label(u) for u in answers), "pending": pending},
            )
        await trio.sleep(min(RETRY_INTERVAL, max(deadline - now, 0.0)))
    logger.info(
        "lpt_packing: all workers ready",
        extra={
            "count": len(pool.urls),
            "control_plane": [pool.label(u) for u in answers],
            "without_control_plane": [pool.label(u) for u in pool.urls if u in lacking],
        },
    )
    if answers:
        check_fleet(pool, answers)
    return answers, tuple(url for url in pool.urls if url in lacking)


def _where(pool: WorkerPool, url: str) -> str:
    """A worker as an operator finds it: `gpu1 at 127.0.0.1:9011`, or the address alone."""
    label = pool.label(url)
    return url if label == url else f"{label} at {url}"


def check_fleet(pool: WorkerPool, answers: dict[str, WorkerCounters]) -> None:
    """Every worker batches, and every worker serves the same models.

    Raises:
        StartupError: naming the first worker (in pool order) that does not.
    """
    for url, answer in answers.items():
        if answer.discipline not in BATCHING_DISCIPLINES:
            raise StartupError(
                "lpt_packing scheduling requires worker FIFO or EDF discipline; worker "
                f"{_named(pool, url)} reports {answer.discipline!r} (restart it with "
                "--discipline fifo or edf, or choose another scheduling.mode)"
            )
    reference, expected = next(iter(answers.items()))
    want = set(expected.models)
    for url, answer in answers.items():
        have = set(answer.models)
        if have != want:
            missing = _listed(want - have)
            extra = _listed(have - want)
            raise StartupError(
                "lpt_packing scheduling requires all models on all workers; "
                f"{_named(pool, url)} serves {len(have)} models but "
                f"{_named(pool, reference)} serves {len(want)} models "
                f"(model sets differ: missing [{missing}], extra [{extra}])"
            )


def _named(pool: WorkerPool, url: str) -> str:
    """`worker1 (127.0.0.1:8081)`, or just the URL for a worker without a name."""
    label = pool.label(url)
    return url if label == url else f"{label} ({url})"


def _listed(names: set[str]) -> str:
    shown = sorted(names)[:SHOWN_MODELS]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f", ... {more} more" if more > 0 else "")
