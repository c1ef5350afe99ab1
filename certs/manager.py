"""The webhook's certificates with no workstation step, as Kyverno keeps its own: one replica, elected by a Lease
(certs.lease), keeps the CA and the serving pair in a Secret and the CA bundle in the webhook configurations.

Each round (every `interval` seconds, sooner when a renewal falls due) the elected replica reads the Secret and the
named Mutating/ValidatingWebhookConfigurations, lets `certs.rotation.decide` (pure) say what is due, writes the
Secret when it changed (a PUT carrying the resourceVersion it read: a concurrent writer makes it a 409, and the
round ends) and patches `clientConfig.caBundle` of each webhook whose bundle differs (a JSON Patch that first tests
the configuration's resourceVersion). Rotation keeps the overlapping-bundle scheme of certs.rotation: a new CA joins
the bundle beside the old one, and the serving certificate moves to it only once every webhook of the
configurations trusts it (`trusted_bundle`). Every replica serves the pair from the Secret (webhook.certs_secret);
the writer tells its own replica at once (`refresh`).

Secret keys: `tls.crt`, `tls.key` (the serving pair, as a `kubernetes.io/tls` Secret has them), `ca.crt` (the bundle:
every CA a client should trust, as `reservoir certs --secret` writes it), `ca-signing.crt`, `ca-signing.key` (the
current CA, which signs; only the webhook's ServiceAccount may read the Secret).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from cryptography import x509
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from certs.lease import LeaseHolder
from certs.rotation import (
    DEFAULT_CA_VALIDITY,
    DEFAULT_RENEW_FRACTION,
    DEFAULT_VALIDITY,
    Material,
    Subject,
    decide,
)
from shared.kube import JSON_PATCH, Conflict, Invalid, NotFound, get_json, resource_path, send_json
from shared.logs import fields as log_fields

log = logging.getLogger("reservoir.certs")
ADMISSION = "admissionregistration.k8s.io/v1"
CONFIGURATION_PLURALS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
SECRET_KEYS = {"tls_cert": "tls.crt", "tls_key": "tls.key", "bundle": "ca.crt", "ca_cert": "ca-signing.crt",
               "ca_key": "ca-signing.key"}
DEFAULT_INTERVAL = 10.0
LEASE_NAME = "reservoir-webhook-certs"
MIN_WAIT = 0.5  # never look again sooner than this, whatever falls due


def default_identity() -> str:
    """The replica's name in the Lease: its host name (the Pod's name in a cluster) and process id."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Settings:
    """What the elected writer keeps: the Secret `namespace/secret`, for `subject`'s DNS names and IPs, and the
    caBundle of the webhook configurations named `configurations` (Mutating and Validating of each name)."""

    secret: str
    namespace: str
    subject: Subject
    configurations: tuple[str, ...]
    validity: timedelta = DEFAULT_VALIDITY
    ca_validity: timedelta = DEFAULT_CA_VALIDITY
    renew_fraction: float = DEFAULT_RENEW_FRACTION
    interval: float = DEFAULT_INTERVAL
    lease: str = LEASE_NAME
    identity: str = field(default_factory=default_identity)


# --- pure: the Secret and the configurations as data ---

def material_of(secret: dict[str, Any] | None) -> Material:
    """The Material a Secret holds (b"" for each key it lacks or cannot decode)."""
    data = (secret or {}).get("data") or {}

    def decoded(key: str) -> bytes:
        try:
            return base64.b64decode(data.get(key) or "", validate=True)
        except (binascii.Error, ValueError):
            return b""
    return Material(**{name: decoded(key) for name, key in SECRET_KEYS.items()})


def secret_body(settings: Settings, material: Material, previous: dict[str, Any] | None) -> dict[str, Any]:
    """The Secret to write: `previous` (its labels, annotations, other keys, resourceVersion) with the Material's keys
    replaced; a new `kubernetes.io/tls` Secret when there is none."""
    body = dict(previous or {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls"})
    metadata = dict(body.get("metadata") or {})
    metadata.update(name=settings.secret, namespace=settings.namespace)
    data = dict(body.get("data") or {})
    data.update({key: base64.b64encode(getattr(material, name)).decode() for name, key in SECRET_KEYS.items()})
    body.update(metadata=metadata, data=data)
    return body


def _bundle_certs(encoded: str | None) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(base64.b64decode(encoded or "", validate=True)) if encoded else []
    except (binascii.Error, ValueError):
        return []


def trusted_bundle(configurations: Sequence[dict[str, Any]]) -> bytes | None:
    """The CAs every webhook of `configurations` trusts (in its caBundle), as PEM; None when there is no webhook,
    so nobody has to be waited for."""
    webhooks = [hook for config in configurations for hook in config.get("webhooks") or []]
    if not webhooks:
        return None
    from cryptography.hazmat.primitives.serialization import Encoding

    common: list[x509.Certificate] | None = None
    for hook in webhooks:
        certs = _bundle_certs((hook.get("clientConfig") or {}).get("caBundle"))
        common = certs if common is None else [c for c in common if c in certs]
    return b"".join(c.public_bytes(Encoding.PEM) for c in common or [])


def injection_patch(configuration: dict[str, Any], bundle: bytes) -> list[dict[str, Any]]:
    """A JSON Patch setting `clientConfig.caBundle` to `bundle` on each webhook whose bundle differs, guarded by a
    test of the resourceVersion it was read at; [] when every webhook has it already."""
    encoded = base64.b64encode(bundle).decode()
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
        for i, hook in enumerate(configuration.get("webhooks") or [])
        if (hook.get("clientConfig") or {}).get("caBundle") != encoded]
    if not ops:
        return []
    version = (configuration.get("metadata") or {}).get("resourceVersion")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]


def wait_seconds(next_due: datetime, now: datetime, interval: float) -> float:
    """How long to sleep before the next round: until `next_due`, at most `interval`, at least MIN_WAIT."""
    return min(interval, max(MIN_WAIT, (next_due - now).total_seconds()))


# --- the edge: the rounds, the API calls ---

Refresh = Callable[[], Awaitable[object]]
API_ERRORS = (ApiException, TimeoutError, aiohttp.ClientError, OSError)


async def _get_or_none(api: client.ApiClient, path: str) -> dict[str, Any] | None:
    try:
        return await get_json(api, path)
    except NotFound:
        return None


@dataclass
class CertWriter:
    """Runs beside the webhook server (`run`, given its ApiClient and how to make it re-read the Secret)."""

    settings: Settings
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    async def run(self, api: client.ApiClient, refresh: Refresh) -> None:
        settings = self.settings
        lease = LeaseHolder(api, settings.namespace, settings.lease, settings.identity,
                            duration=max(30, int(3 * settings.interval)))
        while True:
            wait = settings.interval
            try:
                if await lease.hold(self.clock()):
                    next_due = await self.round(api, refresh)
                    wait = wait_seconds(next_due, self.clock(), settings.interval)
            except API_ERRORS as err:
                log.warning("certificate round failed, trying again", extra=log_fields(
                    certs="retry", secret=f"{settings.namespace}/{settings.secret}", error=repr(err)[:300]))
            except Exception:  # a bug must not stop the renewals: log it and go on with the next round
                log.exception("certificate round failed", extra=log_fields(certs="error"))
            await asyncio.sleep(wait)

    async def round(self, api: client.ApiClient, refresh: Refresh) -> datetime:
        """One round as the elected writer; returns when the next one is due at the latest."""
        settings = self.settings
        secret_path = resource_path("v1", "secrets", settings.secret, settings.namespace)
        secret = await _get_or_none(api, secret_path)
        configurations: list[tuple[str, dict[str, Any]]] = []
        for plural in CONFIGURATION_PLURALS:
            for name in settings.configurations:
                path = resource_path(ADMISSION, plural, name)
                found = await _get_or_none(api, path)
                if found is not None:
                    configurations.append((path, found))
        current = material_of(secret)
        now = self.clock()
        decision = decide(current, settings.subject, now=now, validity=settings.validity,
                          ca_validity=settings.ca_validity, renew_fraction=settings.renew_fraction,
                          trusted=trusted_bundle([c for _, c in configurations]))
        if decision.material != current:
            changed = [SECRET_KEYS[f.name] for f in fields(Material)
                       if getattr(decision.material, f.name) != getattr(current, f.name)]
            body = secret_body(settings, decision.material, secret)
            try:
                if secret is None:
                    await send_json(api, "POST", resource_path("v1", "secrets", namespace=settings.namespace), body)
                else:
                    await send_json(api, "PUT", secret_path, body)
            except Conflict:
                log.info("Secret changed by another writer; reading it again next round", extra=log_fields(
                    certs="conflict", secret=f"{settings.namespace}/{settings.secret}"))
                return now
            log.info("certificates written", extra=log_fields(
                certs="written", secret=f"{settings.namespace}/{settings.secret}",
                actions=list(decision.actions), keys=changed))
            await refresh()
        for path, configuration in configurations:
            ops = injection_patch(configuration, decision.material.bundle)
            if not ops:
                continue
            try:
                await send_json(api, "PATCH", path, ops, content_type=JSON_PATCH)
            except (Conflict, Invalid):  # changed since it was read (the test failed): again next round
                return now
            log.info("caBundle injected", extra=log_fields(
                certs="injected", configuration=path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1],
                webhooks=len(ops) - 1))
        return decision.next_due
