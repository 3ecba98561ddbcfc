"""The gateway's admin HTTP routes: `/metrics` for the whole node, `/healthz`, `/readyz`.

One scrape covers the node: `/metrics` is the gateway's own series merged with every
worker's scrape (relabelled with the worker's name, fetched concurrently; a worker that
does not answer is left out and counted). Worker scrapes get the sooner of
`metrics.scrape_timeout_seconds` and the scraper's own deadline: Prometheus sends its
scrape timeout with every scrape (`X-Prometheus-Scrape-Timeout-Seconds`), and a gateway
that waited longer for a hung worker than Prometheus waits for the gateway would be
marked down with everything it had. `/readyz` follows the prober's readiness, so a
stopping gateway says "not ready" at once.

With tracing on, a scraper whose Accept asks for OpenMetrics (Prometheus does) gets
it, with the request-latency histogram's exemplars (traced calls' trace ids) and every
worker's text turned into OpenMetrics (`rsgw.runtime._openmetrics`). Any other scraper,
and every scraper of a gateway that traces nothing (so has no exemplar to give), gets
the text format, byte for byte as before: a worker's exposition that the conversion
would read differently from Prometheus's text parser cannot cost a scrape that gains
nothing from OpenMetrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import trio

from rsgw.gateway.fleet._pool import fan_out
from rsgw.runtime._admin import AdminApp, Headers, Reply, header
from rsgw.runtime._exposition import (
    CONTENT_TYPE,
    merge_expositions,
    relabel_exposition,
    served_families,
)
from rsgw.runtime._openmetrics import (
    OPENMETRICS_CONTENT_TYPE,
    merge_openmetrics,
    wants_openmetrics,
)

if TYPE_CHECKING:
    from rsgw.config._config import GatewayConfig
    from rsgw.gateway.fleet._pool import WorkerPool
    from rsgw.gateway.fleet._prober import Prober
    from rsgw.gateway.observe._metrics import GatewayMetrics


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
    # Only a tracing gateway has exemplars to give (see the module docstring).
    exemplars = config.tracing.enabled

    async def scrape(url: str, label: str, budget: float) -> str | None:
        """A worker's series, relabelled; None when it could not be scraped (down, slow,
        an error status): that worker's gap, not the scrape's failure (fan_out raises
        anything but an RsgwError)."""
        try:
            with trio.fail_after(budget):
                response = await http.get(f"{scheme}://{url}/metrics")
            response.raise_for_status()
        except (httpx.HTTPError, trio.TooSlowError, OSError):
            return None
        return relabel_exposition(response.text, "worker", label)

    async def metrics_endpoint(headers: Headers) -> Reply:
        targets = pool.metrics_targets() | unpaired  # the members now, in the order they joined
        budget = scrape_budget(timeout, header(headers, SCRAPE_TIMEOUT_HEADER))
        scraped = await fan_out(list(targets), lambda url: scrape(url, targets[url], budget))
        for url, label in targets.items():
            metrics.metrics_scraped(label, isinstance(scraped[url], str))
        # Member order, not completion order.
        texts = [text for url in targets if isinstance(text := scraped[url], str)]
        if exemplars and wants_openmetrics(header(headers, b"accept")):
            body = merge_openmetrics(served_families(metrics.registry), texts)
            return Reply(200, body, OPENMETRICS_CONTENT_TYPE)
        merged = merge_expositions([metrics.render().decode(), *texts])
        return Reply(200, merged.encode(), CONTENT_TYPE)

    async def healthz(_: Headers) -> Reply:
        return Reply(200, b"ok")

    async def readyz(_: Headers) -> Reply:
        return Reply(200, b"ok") if prober.serving else Reply(503, b"not ready")

    return AdminApp({"/metrics": metrics_endpoint, "/healthz": healthz, "/readyz": readyz})


#: What Prometheus sends with every scrape: how long it waits for the answer.
SCRAPE_TIMEOUT_HEADER = b"x-prometheus-scrape-timeout-seconds"
#: Of the scraper's timeout, what is kept back for the gateway's own part of the
#: answer (rendering, merging, the network) ...
SCRAPE_MARGIN_SHARE = 0.2
#: ... and at most this much.
SCRAPE_MARGIN_SECONDS = 0.5


def scrape_budget(configured: float, scraper_timeout: bytes | None) -> float:
    """How long worker scrapes may take: `configured`, or less when the scraper's
    timeout (the header's value, if it is a positive number of seconds) less a margin
    is sooner."""
    if scraper_timeout is None:
        return configured
    try:
        seconds = float(scraper_timeout)
    except ValueError:
        return configured
    if not 0 < seconds < float("inf"):
        return configured
    margin = min(seconds * SCRAPE_MARGIN_SHARE, SCRAPE_MARGIN_SECONDS)
    return min(configured, seconds - margin)
