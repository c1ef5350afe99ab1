"""What both programs serve beside their work, written once: `/healthz`, `/readyz` and Prometheus `/metrics`, and
the stop signal (SIGTERM from the kubelet, SIGINT from a terminal).

Readiness also refuses a watch cache that stopped following the cluster: one that has not heard from the API server
(a list, a watch event or a bookmark) for more than `STALE_AFTER` seconds, that is twice the watch timeout
(`shared.watchcache.WATCH_TIMEOUT_SECONDS`, 290 s) plus a minute, 640 s. A healthy cache hears far more often:
kube-apiserver sends a bookmark about every minute, and even without bookmarks every watch ends and is opened again
within the watch timeout; so only an API server that has been unreachable (or answering errors) for two whole watch
cycles turns it false. It turns true again with the next answer.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from shared.watchcache import WATCH_TIMEOUT_SECONDS

STALE_AFTER = 2 * WATCH_TIMEOUT_SECONDS + 60


class Followed(Protocol):
    """What readiness asks of a watch cache (shared.watchcache.WatchCache)."""

    @property
    def name(self) -> str: ...

    def stale_for(self, now: float | None = None) -> float: ...


def stale_caches(caches: Iterable[Followed], now: float | None = None, stale_after: float = STALE_AFTER) -> list[str]:
    """One line for each cache that has not heard from the API server for more than `stale_after` seconds (module
    docstring), naming it and for how long; `now` is time.monotonic()."""
    now = time.monotonic() if now is None else now
    return [f"{cache.name}: no word from the API server for {silent:.0f}s (more than {stale_after:.0f}s)"
            for cache in caches if (silent := cache.stale_for(now)) > stale_after]


def add_probes(app: web.Application, registry: CollectorRegistry, waiting: Callable[[], list[str]],
               describe: Callable[[list[str]], str],
               before_scrape: Callable[[], object] | None = None,
               caches: Callable[[], Iterable[Followed]] | None = None) -> web.Application:
    """Add to `app`: `/healthz` ("ok" while the process serves); `/readyz`, "ok" when `waiting()` names nothing and
    none of `caches()` is stale (`stale_caches`), else 503 with `describe(names)` and one line per stale cache;
    `/metrics`, `registry` in Prometheus text, after `before_scrape()` when given."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        names = waiting()
        stale = stale_caches(caches()) if caches is not None else []
        if not names and not stale:
            return web.Response(text="ok")
        return web.Response(text="\n".join(([describe(names)] if names else []) + stale), status=503)

    async def metrics(_: web.Request) -> web.Response:
        if before_scrape is not None:
            before_scrape()
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def probes_app(registry: CollectorRegistry, waiting: Callable[[], list[str]], describe: Callable[[list[str]], str],
               before_scrape: Callable[[], object] | None = None,
               caches: Callable[[], Iterable[Followed]] | None = None) -> web.Application:
    """An application serving only the probes and metrics (`add_probes`)."""
    return add_probes(web.Application(), registry, waiting, describe, before_scrape, caches)


def stop_on_signals(signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM)) -> asyncio.Event:
    """An event set when the running loop receives one of `signals`: the program's cue to stop cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    return stop
