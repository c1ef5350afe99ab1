"""`reservoir webhook`: run the admission webhook until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiohttp import web

from shared import keys
from shared.kube import new_api_client
from shared.logs import fields
from shared.serving import stop_on_signals
from shared.watchcache import count_skips
from webhook.caches import WebhookCaches
from webhook.server import Metrics, ReloadingTLS, make_app, make_runner

log = logging.getLogger("reservoir.webhook")


async def run(cert_file: Path, key_file: Path, host: str, port: int, kubeconfig: str | None,
              namespace: str = keys.NAMESPACE, impersonate: str | None = None) -> None:
    api = await new_api_client(kubeconfig, impersonate=impersonate)
    metrics = Metrics()
    caches = WebhookCaches(api, namespace, on_skip=count_skips(metrics.registry))  # objects no cache can read
    tls = ReloadingTLS(cert_file, key_file, metrics)
    app = make_app(caches.lookup, caches.synced, metrics)
    runner = make_runner(app)  # the server's limits: keep-alive, header sizes (webhook.server)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls.context, backlog=1024)
    caches.start()
    await site.start()
    reload_task = asyncio.create_task(tls.watch(), name="tls-reload")
    log.info("webhook listening", extra=fields(webhook="listening", address=f"{host}:{port}", cert=str(cert_file)))
    stop = stop_on_signals()
    try:
        await stop.wait()
    finally:
        log.info("webhook stopping", extra=fields(webhook="stopping"))
        reload_task.cancel()
        await asyncio.gather(reload_task, return_exceptions=True)
        await caches.stop()
        await runner.cleanup()
        await api.close()
