"""The gateway's admin HTTP routes: `/metrics` for the whole node, `/healthz`, `/readyz`.

One scrape covers the node: `/metrics` is the gateway's own series merged with every
worker's scrape (relabelled with the worker's name, fetched concurrently, each under
`metrics.scrape_timeout_seconds`; a worker that does not answer is left out and
counted). `/readyz` follows the prober's readiness, so a stopping gateway says "not
ready" at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import trio

from rsgw._admin import AdminApp, Reply
from rsgw._exposition import CONTENT_TYPE, merge_expositions, relabel_exposition
from rsgw.gateway._pool import fan_out

if TYPE_CHECKING:
    from rsgw._config import GatewayConfig
    from rsgw.gateway._metrics import GatewayMetrics
    from rsgw.gateway._pool import WorkerPool
    from rsgw.gateway._prober import Prober


def admin_app(
    config: GatewayConfig,
    pool: WorkerPool,
    metrics: GatewayMetrics,
    prober: Prober,
    http: httpx.AsyncClient,
) -> AdminApp:
    """`/metrics` merges every worker's scrape into ours; `/readyz` follows the prober."""

    timeout = config.metrics.scrape_timeout_seconds
    scheme = "https" if config.worker_client.tls_ca_file else "http"
    # Metrics endpoints listed beyond the endpoints pair with no worker: scraped as named.
    unpaired = {worker.metrics: worker.label for worker in config.pairing().unpaired}

    async def scrape(url: str, label: str) -> str | None:
        """A worker's series, relabelled; None when it could not be scraped (down, slow,
        an error status): that worker's gap, not the scrape's failure (fan_out raises
        anything but an RsgwError)."""
        try:
            with trio.fail_after(timeout):
                response = await http.get(f"{scheme}://{url}/metrics")
            response.raise_for_status()
        except (httpx.HTTPError, trio.TooSlowError, OSError):
            return None
        return relabel_exposition(response.text, "worker", label)

    async def metrics_endpoint() -> Reply:
        targets = pool.metrics_targets() | unpaired  # the members now, in the order they joined
        scraped = await fan_out(list(targets), lambda url: scrape(url, targets[url]))
        for url, label in targets.items():
            metrics.metrics_scraped(label, isinstance(scraped[url], str))
        texts = [metrics.render().decode()]
        for url in targets:  # member order, not completion order
            text = scraped[url]
            if isinstance(text, str):
                texts.append(text)
        return Reply(200, merge_expositions(texts).encode(), CONTENT_TYPE)

    async def healthz() -> Reply:
        return Reply(200, b"ok")

    async def readyz() -> Reply:
        return Reply(200, b"ok") if prober.serving else Reply(503, b"not ready")

    return AdminApp({"/metrics": metrics_endpoint, "/healthz": healthz, "/readyz": readyz})
