"""The serving pair read from a Secret through the API (`reservoir webhook --manage-certs`), so every replica serves
what the elected certificate writer (certs.manager, run beside the server) keeps there, without a restart.

Why through the API and not a mounted Secret volume: the Secret is created by the webhook itself, and a volume of a
Secret that does not exist yet holds the Pod in ContainerCreating; the kubelet refreshes a mounted Secret only on
its periodic sync (a minute or more), while a GET every SECRET_POLL_INTERVAL seconds (10) is seen by every replica
within that, and at once by the replica that wrote it (`refresh`). And why a periodic GET rather than a watch: it
is one small request per replica every 10 s, needs only `get` on one Secret name, and nothing here is urgent (a
serving certificate is renewed at 2/3 of its life; a new CA is trusted beside the old one before it signs).

The pair is handed to OpenSSL from memory (a memfd, `load_pair`): nothing is written to the filesystem, which may
be read-only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from shared import logs
from shared.kube import NotFound, get_json, resource_path
from webhook.server import Metrics

log = logging.getLogger("reservoir.webhook")
SECRET_POLL_INTERVAL = 10.0
FIRST_PAIR_INTERVAL = 1.0  # while the Secret does not hold a pair yet
# The elected writer run beside the server: given the server's ApiClient and a function that makes every
# certificate change it wrote be served at once.
Writer = Callable[[client.ApiClient, Callable[[], Awaitable[bool]]], Coroutine[Any, Any, None]]


@contextlib.contextmanager
def _in_memory(data: bytes) -> Iterator[str]:
    """A path OpenSSL can open that holds `data`: an anonymous memory file (Linux), else a 0600 temporary file
    removed at once after use."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("reservoir-tls", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp(prefix="reservoir-tls-")  # O_EXCL, 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        yield path
    finally:
        os.unlink(path)


def load_pair(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a certificate chain and its key, from memory, into `context` (new handshakes use them). ssl.SSLError
    when they do not parse or do not belong together; the context then keeps what it had."""
    with _in_memory(cert_pem) as cert_path, _in_memory(key_pem) as key_path:
        context.load_cert_chain(cert_path, key_path)


def pair_of(secret: dict[str, Any] | None) -> tuple[bytes, bytes] | None:
    """(tls.crt, tls.key) of a Secret, or None when either is missing or not base64."""
    data = (secret or {}).get("data") or {}
    try:
        cert = base64.b64decode(data.get("tls.crt") or "", validate=True)
        key = base64.b64decode(data.get("tls.key") or "", validate=True)
    except (binascii.Error, ValueError):
        return None
    return (cert, key) if cert and key else None


class SecretTLS:
    """A server SSLContext serving the pair of the Secret `namespace/name`, re-read every `interval` seconds and on
    `refresh()`; the same interface as webhook.server.ReloadingTLS (`context`, `watch()`)."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, metrics: Metrics | None = None,
                 interval: float = SECRET_POLL_INTERVAL, writer: Writer | None = None) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.metrics, self.interval, self.writer = metrics, interval, writer
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.serving: tuple[bytes, bytes] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._loaded = asyncio.Event()  # set once a pair is served: the writer's first write ends the wait at once

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def open(self) -> SecretTLS:
        """Start the writer (when given) and return once the Secret holds a pair this context serves."""
        if self.writer is not None:
            self._writer_task = asyncio.create_task(self.writer(self.api, self.refresh), name="certificate-writer")
        waited = False
        try:
            while not await self.refresh():
                if not waited:
                    log.info("waiting for the serving certificate", extra=logs.fields(certificate="waiting",
                                                                                      secret=self.where))
                    waited = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._loaded.wait(), FIRST_PAIR_INTERVAL)
        except BaseException:
            await self.close()
            raise
        return self

    async def refresh(self) -> bool:
        """Read the Secret; load its pair when it differs from the one served. True when a pair is served."""
        async with self._lock:
            try:
                secret = await get_json(self.api, resource_path("v1", "secrets", self.name, self.namespace))
            except NotFound:
                secret = None
            except (ApiException, TimeoutError, aiohttp.ClientError, OSError) as err:
                log.warning("serving Secret unreadable, keeping the current certificate",
                            extra=logs.fields(secret=self.where, error=repr(err)[:300]))
                return self.serving is not None
            pair = pair_of(secret)
            if pair is None or pair == self.serving:
                return self.serving is not None
            try:
                load_pair(self.context, *pair)
            except (ssl.SSLError, OSError) as err:
                log.warning("serving Secret holds no usable pair, keeping the current certificate",
                            extra=logs.fields(secret=self.where, error=str(err)[:300]))
                return self.serving is not None
            first = self.serving is None
            self.serving = pair
            self._loaded.set()
            if self.metrics:
                self.metrics.serving(pair[0])
            if self.metrics and not first:
                self.metrics.cert_reloads.inc()
            log.info("certificate loaded" if first else "certificate reloaded",
                     extra=logs.fields(certificate="loaded" if first else "reloaded", secret=self.where,
                                       version=(secret or {}).get("metadata", {}).get("resourceVersion")))
            return True

    async def watch(self) -> None:
        """Re-read the Secret every `interval` seconds until cancelled; then stop the writer."""
        try:
            while True:
                await asyncio.sleep(self.interval)
                await self.refresh()
        finally:
            await self.close()

    async def close(self) -> None:
        task, self._writer_task = self._writer_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@dataclass(frozen=True)
class SecretSource:
    """Where `reservoir webhook --manage-certs` takes its pair: the Secret `namespace/name`, and the writer that
    keeps it (None: another process keeps it)."""

    namespace: str
    name: str
    writer: Writer | None = None
    interval: float = SECRET_POLL_INTERVAL

    async def open(self, api: client.ApiClient, metrics: Metrics | None = None) -> SecretTLS:
        return await SecretTLS(api, self.namespace, self.name, metrics, self.interval, self.writer).open()
