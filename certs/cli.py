"""`reservoir certs`: create or renew the webhook's CA and serving certificate, write them to files and/or a
`kubernetes.io/tls` Secret, and inject the CA bundle into the webhook configurations' caBundle."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

from kubernetes_asyncio import client

from certs.rotation import Subject, ensure
from shared.kube import JSON_PATCH, NotFound, get_json, new_api_client, resource_path, send_json

log = logging.getLogger("reservoir.certs")
ADMISSION = "admissionregistration.k8s.io/v1"


async def inject_ca_bundle(api: client.ApiClient, name: str, bundle: bytes) -> list[str]:
    """Set caBundle on every webhook of the Mutating and Validating configurations called `name`."""
    encoded = base64.b64encode(bundle).decode()
    done = []
    for kind, plural in (("MutatingWebhookConfiguration", "mutatingwebhookconfigurations"),
                         ("ValidatingWebhookConfiguration", "validatingwebhookconfigurations")):
        path = resource_path(ADMISSION, plural, name)
        try:
            config = await get_json(api, path)
        except NotFound:
            continue
        ops = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
               for i in range(len(config.get("webhooks") or []))]
        if ops:
            await send_json(api, "PATCH", path, ops, content_type=JSON_PATCH)
            done.append(f"{kind}/{name}")
    return done


async def write_secret(api: client.ApiClient, namespace: str, name: str, out_dir: Path) -> None:
    data = {key: base64.b64encode((out_dir / file).read_bytes()).decode()
            for key, file in (("tls.crt", "tls.crt"), ("tls.key", "tls.key"), ("ca.crt", "ca-bundle.crt"))}
    body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace}, "data": data}
    try:
        await send_json(api, "PUT", resource_path("v1", "secrets", name, namespace), body)
    except NotFound:
        await send_json(api, "POST", resource_path("v1", "secrets", namespace=namespace), body)


async def run(out_dir: Path, service: str, namespace: str, dns: list[str], ips: list[str],
              inject: list[str], secret: str | None, kubeconfig: str | None) -> list[str]:
    outcome = ensure(out_dir, Subject(service, namespace, tuple(dns), tuple(ips)))
    actions = list(outcome.actions) or ["certificates are current: nothing to renew"]
    if inject or secret:
        api = await new_api_client(kubeconfig)
        try:
            for name in inject:
                injected = await inject_ca_bundle(api, name, outcome.bundle)
                actions += [f"caBundle injected into {what}" for what in injected]
            if secret:
                await write_secret(api, namespace, secret, out_dir)
                actions.append(f"Secret {namespace}/{secret} written")
        finally:
            await api.close()
    for action in actions:
        log.info("certs: %s", action)
    return actions
