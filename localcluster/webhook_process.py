"""Run `reservoir webhook` as a real process against the local cluster, registered through the real webhook
configurations in deploy/ (clientConfig switched from the in-cluster Service to a loopback url + caBundle).
Used by `make up` and by the end-to-end tests."""

from __future__ import annotations

import base64
import copy
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from certs.rotation import Subject, ensure
from localcluster.cluster import LocalCluster, free_port

REPO = Path(__file__).resolve().parents[1]

WEBHOOK_USER = "system:serviceaccount:reservoir-system:reservoir-webhook"
CONFIG_NAME = "reservoir"


class WebhookProcess:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.dir = Path(tempfile.mkdtemp(prefix="reservoir-webhook-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        ensure(self.dir, Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",)))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self.log = open(self.dir / "webhook.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shared.cli", "webhook", f"--cert-file={self.dir / 'tls.crt'}",
             f"--key-file={self.dir / 'tls.key'}", "--host=127.0.0.1", f"--port={self.port}",
             f"--kubeconfig={self.cluster.kubeconfig}", f"--as={WEBHOOK_USER}"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        context = ssl.create_default_context(cafile=str(self.dir / "ca-bundle.crt"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"webhook exited {self.process.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1, context=context) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"webhook not ready in {timeout}s:\n{self.log_text()}")

    def stop(self, remove_files: bool = True) -> None:
        """Stop the process (SIGTERM, SIGKILL after 10 s) and remove its certificates and log."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if remove_files:
            import shutil
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return (self.dir / "webhook.log").read_text(errors="replace")
        except OSError:
            return "(log removed)"

    def configurations(self) -> list[dict]:
        """deploy/webhook-configurations.yaml with each clientConfig pointed at this process."""
        bundle = base64.b64encode((self.dir / "ca-bundle.crt").read_bytes()).decode()
        out = []
        for doc in yaml.safe_load_all((REPO / "deploy/webhook-configurations.yaml").read_text()):
            doc = copy.deepcopy(doc)
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"{self.url}{path}", "caBundle": bundle}
            out.append(doc)
        return out

    def register(self, kubectl: list[str]) -> None:
        """Apply the webhook configurations with kubectl."""
        subprocess.run([*kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-"],
                       input=yaml.safe_dump_all(self.configurations()).encode(), check=True, stdout=subprocess.DEVNULL)

    @staticmethod
    def unregister(kubectl: list[str]) -> None:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            subprocess.run([*kubectl, "delete", kind, CONFIG_NAME, "--ignore-not-found"], check=True,
                           stdout=subprocess.DEVNULL)
