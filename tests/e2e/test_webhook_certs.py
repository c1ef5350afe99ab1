"""`reservoir webhook --manage-certs` end to end: two replicas run as the suite runs the webhook (real processes,
impersonating the webhook's ServiceAccount, so deploy/webhook-rbac.yaml is what they may do), registered through the
real webhook configurations with no caBundle. One replica is elected by the Lease and creates the CA and serving
pair in the Secret, injects the bundle, and kube-apiserver's admission calls reach the webhook over it; both serve
the Secret's pair. An almost expired serving certificate written into the Secret is renewed and served without a
restart."""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certs import pki
from localcluster.cluster import LocalCluster, free_port
from localcluster.process import ReservoirProcess
from localcluster.webhook_process import CONFIG_NAME, WEBHOOK_USER, WebhookProcess, configurations, register
from shared import keys
from tests.e2e.kit import Kit, apply_setup
from tests.e2e.scenarios import SETUP

SECRET, LEASE = "reservoir-webhook-tls", "reservoir-webhook-certs"
SECRET_PATH = f"/api/v1/namespaces/{keys.NAMESPACE}/secrets/{SECRET}"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/{LEASE}"
VOLCANO = f"/apis/{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


class ManagedWebhook(ReservoirProcess):
    """`reservoir webhook --manage-certs` on 127.0.0.1 (an IP the serving certificate must name, since the local
    kube-apiserver calls it by URL, not through the Service)."""

    name = "webhook-managed"

    def __init__(self, cluster: LocalCluster, identity: str) -> None:
        super().__init__()
        self.cluster, self.identity, self.port = cluster, identity, free_port()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.spawn(["webhook", "--manage-certs", "--cert-ip=127.0.0.1", "--host=127.0.0.1", f"--port={self.port}",
                    f"--kubeconfig={self.cluster.kubeconfig}", f"--as={WEBHOOK_USER}"])


def served_certificate(port: int) -> x509.Certificate | None:
    """The certificate the server on 127.0.0.1:`port` presents now (not verified), or None when it does not answer."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock, \
                context.wrap_socket(sock) as tls:
            der = tls.getpeercert(binary_form=True)
    except OSError:
        return None
    return x509.load_der_x509_certificate(der) if der else None


def ready_over_verified_tls(port: int, bundle: bytes) -> bool:
    """/readyz answers 200 over TLS verified against `bundle`, for the name 127.0.0.1."""
    context = ssl.create_default_context(cadata=bundle.decode())
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock, \
                context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return tls.recv(64).startswith(b"HTTP/1.1 200")
    except (OSError, ssl.SSLError):
        return False


def secret_field(secret: dict, key: str) -> bytes:
    return base64.b64decode((secret.get("data") or {}).get(key) or "")


@dataclass
class World:
    kit: Kit
    replicas: list[ManagedWebhook]


async def _clean(kit: Kit) -> None:
    WebhookProcess.unregister(kit.cluster.kubectl)
    for path in (SECRET_PATH, LEASE_PATH):
        await kit.raw("DELETE", path)


@pytest.fixture
async def world(kit: Kit) -> AsyncIterator[World]:
    await apply_setup(kit, *SETUP, "deploy/webhook-rbac.yaml")
    await _clean(kit)
    replicas = [ManagedWebhook(kit.cluster, "replica-a"), ManagedWebhook(kit.cluster, "replica-b")]
    # the configurations as deploy/ has them, pointed at the first replica, with no caBundle: the webhook injects it
    register(kit.cluster.kubectl, configurations(replicas[0].url, None))
    for replica in replicas:
        replica.start()
    try:
        yield World(kit, replicas)
    finally:
        for replica in replicas:
            if replica.running():
                replica.stop(remove_files=False)
        await _clean(kit)
        for replica in replicas:
            print(f"--- {replica.identity} ---\n{replica.log_text()[-4000:]}")
            replica.stop()


async def _secret(kit: Kit) -> dict | None:
    secret = await kit.attempt("GET", SECRET_PATH)
    return secret if secret.get("kind") == "Secret" and secret_field(secret, "tls.crt") else None


async def _bundles(kit: Kit) -> list[bytes]:
    out = []
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        config = await kit.raw("GET", f"{ADMISSION}/{plural}/{CONFIG_NAME}")
        out += [base64.b64decode(hook["clientConfig"].get("caBundle") or "") for hook in config["webhooks"]]
    return out


async def _queue_refused(kit: Kit) -> dict | None:
    """A dry-run create of a Queue whose guarantee exceeds its capability: refused by the webhook, with its message
    (a webhook kube-apiserver cannot reach or does not trust is a different refusal: failurePolicy Fail)."""
    body = {"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
            "metadata": {"name": f"greedy-{kit.namespace}"[:60]},
            "spec": {"capability": {"cpu": "4"}, "guarantee": {"resource": {"cpu": "8"}}}}
    answer = await kit.attempt("POST", f"{VOLCANO}/queues?dryRun=All", body=body)
    message = answer.get("message") or ""
    return answer if "spec.guarantee.resource.cpu (8) exceeds spec.capability.cpu (4)" in message else None


async def test_the_elected_replica_creates_injects_and_renews_without_a_restart(world: World) -> None:
    kit, replicas = world.kit, world.replicas
    secret = await kit.wait_for(lambda: _secret(kit), what=f"Secret {SECRET} written by the webhook", timeout=60)
    bundle = secret_field(secret, "ca.crt")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca-signing.crt", "ca-signing.key"}

    # one writer: the Lease names one replica (host name and pid, as a Pod's name and pid are its identity)
    lease = await kit.raw("GET", LEASE_PATH)
    identities = {f"{socket.gethostname()}-{replica.process.pid}" for replica in replicas if replica.process}
    assert lease["spec"]["holderIdentity"] in identities, lease

    async def injected() -> bool:
        return all(b == bundle for b in await _bundles(kit))
    await kit.wait_for(injected, what="the CA bundle in every webhook's caBundle", timeout=30)

    # both replicas serve the Secret's pair, trusted by the bundle for the address kube-apiserver calls
    serving = x509.load_pem_x509_certificate(secret_field(secret, "tls.crt"))
    for replica in replicas:
        async def serves(replica: ManagedWebhook = replica) -> bool:
            return await asyncio.to_thread(served_certificate, replica.port) == serving and \
                await asyncio.to_thread(ready_over_verified_tls, replica.port, bundle)
        await kit.wait_for(serves, what=f"{replica.identity} serving the Secret's certificate", timeout=30)

    # kube-apiserver's admission calls reach the webhook through the injected bundle
    await kit.wait_for(lambda: _queue_refused(kit), what="a bad Queue refused by the webhook", timeout=30)

    # an almost expired serving certificate (past 2/3 of its life) written into the Secret: renewed by the writer
    # and served by both replicas, without a restart
    pids = [replica.process.pid for replica in replicas if replica.process]
    ca = pki.KeyPair(serialization.load_pem_private_key(secret_field(secret, "ca-signing.key"), None),  # type: ignore[arg-type]
                     x509.load_pem_x509_certificate(secret_field(secret, "ca-signing.crt")))
    dns = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    expiring = pki.issue(ca, "reservoir-webhook.reservoir-system.svc", timedelta(seconds=90),
                         dns_names=dns.get_values_for_type(x509.DNSName), ip_addresses=["127.0.0.1"], server=True)
    secret["data"]["tls.crt"] = base64.b64encode(expiring.cert_pem).decode()
    secret["data"]["tls.key"] = base64.b64encode(expiring.key_pem).decode()
    await kit.raw("PUT", SECRET_PATH, body=secret)
    planted = time.monotonic()

    async def renewed() -> x509.Certificate | None:
        current = await _secret(kit)
        cert = x509.load_pem_x509_certificate(secret_field(current, "tls.crt")) if current else None
        fresh = cert is not None and cert.not_valid_after_utc > datetime.now(UTC) + timedelta(days=300)
        return cert if fresh and cert != serving else None
    fresh = await kit.wait_for(renewed, what="the expiring certificate renewed in the Secret", timeout=40)
    written = time.monotonic() - planted
    for replica in replicas:
        async def serves_fresh(replica: ManagedWebhook = replica) -> bool:
            return await asyncio.to_thread(served_certificate, replica.port) == fresh
        await kit.wait_for(serves_fresh, what=f"{replica.identity} serving the renewed certificate", timeout=30)
        print(f"renewal: written {written:.1f}s after the expiring pair was planted, served by {replica.identity} "
              f"{time.monotonic() - planted:.1f}s after")
    assert [replica.process.pid for replica in replicas if replica.process] == pids
    assert all(replica.running() for replica in replicas)
    assert secret_field(await _secret(kit) or {}, "ca.crt") == bundle  # a renewal under the same CA: no new bundle
    await kit.wait_for(lambda: _queue_refused(kit), what="a bad Queue refused after the renewal", timeout=30)
