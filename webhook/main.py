"""`reservoir webhook`: run the admission webhook until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiohttp import web

from shared import keys
from shared.kube import new_api_client
from shared.logs import fields
from shared.metrics import cache_freshness
from shared.serving import stop_on_signals
from shared.watchcache import count_skips
from webhook.caches import WebhookCaches
from webhook.certs_secret import SecretSource, SecretTLS
from webhook.server import Metrics, ReloadingTLS, make_app, make_runner

log = logging.getLogger("reservoir.webhook")


async def run(cert_file: Path | None, key_file: Path | None, host: str, port: int, kubeconfig: str | None,
              namespace: str = keys.NAMESPACE, impersonate: str | None = None,
              secret: SecretSource | None = None) -> None:
    """Serve with the pair in `cert_file`/`key_file`, or with the one in the Secret `secret` names (--manage-certs:
    kept there by the elected writer it runs beside the server)."""
    api = await new_api_client(kubeconfig, impersonate=impersonate)
    metrics = Metrics()
    caches = WebhookCaches(api, namespace, on_skip=count_skips(metrics.registry))  # objects no cache can read
    cache_freshness(metrics.registry, lambda: caches.all)
    if secret is not None:
        tls: ReloadingTLS | SecretTLS = await secret.open(api, metrics)
    else:
        assert cert_file is not None and key_file is not None, "--cert-file and --key-file, or --manage-certs"
        tls = ReloadingTLS(cert_file, key_file, metrics)
    app = make_app(caches.lookup, caches.synced, metrics)
    runner = make_runner(app)  # the server's limits: keep-alive, header sizes (webhook.server)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls.context, backlog=1024)
    caches.start()
    await site.start()
    reload_task = asyncio.create_task(tls.watch(), name="tls-reload")
    where = f"secret {secret.namespace}/{secret.name}" if secret is not None else str(cert_file)
    log.info("webhook listening", extra=fields(webhook="listening", address=f"{host}:{port}", cert=where))
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
