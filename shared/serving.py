"""What both programs serve beside their work, written once: `/healthz`, `/readyz` and Prometheus `/metrics`, and
the stop signal (SIGTERM from the kubelet, SIGINT from a terminal)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def add_probes(app: web.Application, registry: CollectorRegistry, waiting: Callable[[], list[str]],
               describe: Callable[[list[str]], str],
               before_scrape: Callable[[], object] | None = None) -> web.Application:
    """Add to `app`: `/healthz` ("ok" while the process serves); `/readyz`, "ok" when `waiting()` names nothing, else
    503 with `describe(names)`; `/metrics`, `registry` in Prometheus text, after `before_scrape()` when given."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        names = waiting()
        if not names:
            return web.Response(text="ok")
        return web.Response(text=describe(names), status=503)

    async def metrics(_: web.Request) -> web.Response:
        if before_scrape is not None:
            before_scrape()
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def probes_app(registry: CollectorRegistry, waiting: Callable[[], list[str]], describe: Callable[[list[str]], str],
               before_scrape: Callable[[], object] | None = None) -> web.Application:
    """An application serving only the probes and metrics (`add_probes`)."""
    return add_probes(web.Application(), registry, waiting, describe, before_scrape)


def stop_on_signals(signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM)) -> asyncio.Event:
    """An event set when the running loop receives one of `signals`: the program's cue to stop cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    return stop
