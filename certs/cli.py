"""`reservoir certs`: create or renew the webhook's CA and serving certificate, write them to files and/or a
`kubernetes.io/tls` Secret, and inject the CA bundle into the webhook configurations' caBundle."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from certs.rotation import Subject, ensure
from shared.kube import new_api_client

log = logging.getLogger("reservoir.certs")


async def inject_ca_bundle(api: client.ApiClient, name: str, bundle: bytes) -> list[str]:
    """Set caBundle on every webhook of the Mutating and Validating configurations called `name`."""
    encoded = base64.b64encode(bundle).decode()
    admission = client.AdmissionregistrationV1Api(api)
    done = []
    for kind, read, patch in (
        ("MutatingWebhookConfiguration", admission.read_mutating_webhook_configuration,
         admission.patch_mutating_webhook_configuration),
        ("ValidatingWebhookConfiguration", admission.read_validating_webhook_configuration,
         admission.patch_validating_webhook_configuration),
    ):
        try:
            config = await read(name)
        except ApiException as err:
            if err.status == 404:
                continue
            raise
        ops = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
               for i in range(len(config.webhooks or []))]
        if ops:
            await patch(name, ops)
            done.append(f"{kind}/{name}")
    return done


async def write_secret(api: client.ApiClient, namespace: str, name: str, out_dir: Path) -> None:
    core = client.CoreV1Api(api)
    data = {key: base64.b64encode((out_dir / file).read_bytes()).decode()
            for key, file in (("tls.crt", "tls.crt"), ("tls.key", "tls.key"), ("ca.crt", "ca-bundle.crt"))}
    body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace}, "data": data}
    try:
        await core.replace_namespaced_secret(name, namespace, body)
    except ApiException as err:
        if err.status != 404:
            raise
        await core.create_namespaced_secret(namespace, body)


async def run(out_dir: Path, service: str, namespace: str, dns: list[str], ips: list[str],
              inject: list[str], secret: str | None, kubeconfig: str | None) -> list[str]:
    outcome = ensure(out_dir, Subject(service, namespace, tuple(dns), tuple(ips)))
    actions = list(outcome.actions) or ["certificates are current: nothing to renew"]
    if inject or secret:
        api = await new_api_client(kubeconfig)
        try:
            for name in inject:
                actions += [f"caBundle injected into {what}" for what in await inject_ca_bundle(api, name, outcome.bundle)]
            if secret:
                await write_secret(api, namespace, secret, out_dir)
                actions.append(f"Secret {namespace}/{secret} written")
        finally:
            await api.close()
    for action in actions:
        log.info("certs: %s", action)
    return actions
