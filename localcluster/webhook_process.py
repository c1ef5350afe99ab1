"""Run `reservoir webhook` as a real process against the local cluster, registered through the real webhook
configurations in deploy/ (clientConfig switched from the in-cluster Service to a loopback url + caBundle).
Used by `make up` and by the end-to-end tests."""

from __future__ import annotations

import base64
import copy
import ssl
import subprocess
import time
import urllib.request

import yaml

from certs.rotation import Subject, ensure
from localcluster.cluster import LocalCluster, free_port
from localcluster.process import REPO, ReservoirProcess

WEBHOOK_USER = "system:serviceaccount:reservoir-system:reservoir-webhook"
CONFIG_NAME = "reservoir"


class WebhookProcess(ReservoirProcess):
    name = "webhook"

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__()
        self.cluster = cluster
        self.port = free_port()
        ensure(self.dir, Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",)))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self.spawn(["webhook", f"--cert-file={self.dir / 'tls.crt'}", f"--key-file={self.dir / 'tls.key'}",
                    "--host=127.0.0.1", f"--port={self.port}", f"--kubeconfig={self.cluster.kubeconfig}",
                    f"--as={WEBHOOK_USER}"])
        context = ssl.create_default_context(cafile=str(self.dir / "ca-bundle.crt"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise RuntimeError(f"webhook exited:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1, context=context) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"webhook not ready in {timeout}s:\n{self.log_text()}")

    def configurations(self) -> list[dict]:
        """deploy/webhook-configurations.yaml with each clientConfig pointed at this process."""
        return configurations(self.url, (self.dir / "ca-bundle.crt").read_bytes())

    def register(self, kubectl: list[str]) -> None:
        """Apply the webhook configurations with kubectl."""
        register(kubectl, self.configurations())

    @staticmethod
    def unregister(kubectl: list[str]) -> None:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            subprocess.run([*kubectl, "delete", kind, CONFIG_NAME, "--ignore-not-found"], check=True,
                           stdout=subprocess.DEVNULL)


def configurations(url: str, bundle: bytes | None) -> list[dict]:
    """deploy/webhook-configurations.yaml with each clientConfig pointed at `url` (https://host:port) and trusting
    `bundle`; None leaves caBundle out, for a webhook that injects it itself (--manage-certs)."""
    encoded = {"caBundle": base64.b64encode(bundle).decode()} if bundle is not None else {}
    out = []
    for doc in yaml.safe_load_all((REPO / "deploy/webhook-configurations.yaml").read_text()):
        doc = copy.deepcopy(doc)
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", **encoded}
        out.append(doc)
    return out


def register(kubectl: list[str], docs: list[dict]) -> None:
    """Apply webhook configurations with kubectl (server-side, taking over any field another manager set)."""
    subprocess.run([*kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-"],
                   input=yaml.safe_dump_all(docs).encode(), check=True, stdout=subprocess.DEVNULL)
