"""Kueue's manager run for real beside the local cluster (the Kueue tests, `python -m localcluster up --kueue`).

What runs is Kueue as its users install it, from the one module version versions.env pins (KUEUE_VERSION, built by
build.sh with its CRDs and webhook manifests): the manager binary, its CRDs with their conversion webhooks, its own
mutating and validating webhooks, and its own certificate management (the manager makes its CA and serving
certificate, keeps them in a Secret and injects the CA into its webhook configurations and CRDs), as the release
manifests set it up. Two things differ, because the local cluster runs no pods and no kube-proxy:
- the manager is a process on 127.0.0.1, and its webhook Service is an ExternalName Service naming 127.0.0.1: the
  API server resolves a webhook's Service to the ExternalName and the webhook's port (and still checks the serving
  certificate against `kueue-webhook-service.kueue-system.svc`, the name Kueue's certificate carries);
- the manager's serving certificate reaches its certificate directory by a copy from its Secret (start(), where a
  pod would have the Secret mounted);
- the visibility API server is off (FEATURES_OFF);
- only the integrations a test asks for are on (`frameworks`: `batch/job`, and `pod` for Kueue's pod integration),
  and only their webhooks and those of Kueue's own kinds are registered: a registered webhook the manager does not
  serve would refuse every object of its kind.
It runs with the control plane's admin credentials (Kueue's RBAC is the release's business, not the tests').
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from localcluster import binaries
from localcluster.cluster import LocalCluster, _die_with_parent, free_port

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"  # Kueue's certificate is for <SERVICE>.<NAMESPACE>.svc
SECRET = "kueue-webhook-server-cert"
# Kueue's certificate management injects its CA into the webhook configurations named after its Service
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
FRAMEWORKS = ("batch/job",)
# the webhooks registered: Kueue's own kinds, and those of the integrations on (by the path Kueue serves them on)
KUEUE_HOOKS = "kueue-x-k8s-io"
FRAMEWORK_HOOKS = {"batch/job": "-batch-v1-job", "pod": "--v1-pod"}
API_VERSION = "kueue.x-k8s.io/v1beta2"
# The CRDs whose versions Kueue's webhook converts (its kustomization's webhook_in_* patches, the CRDs its
# certificate management injects its CA into); the others' versions convert without a webhook.
CONVERTED = frozenset(f"{plural}.kueue.x-k8s.io" for plural in (
    "localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters"))
# The on-demand visibility API is an aggregated API server that reads its delegated authentication in-cluster only
# (and writes its certificate under /visibility): off, as nothing here reads it.
FEATURES_OFF = ("VisibilityOnDemand=false",)


class KueueError(RuntimeError):
    """Kueue's manager did not start or did not get ready; the message holds its log's tail."""


class KueueManager:
    """One Kueue manager against `cluster`. `install()` applies what a release install applies (namespace, Service,
    CRDs, webhook configurations); `start()` runs the manager and returns once its webhooks answer; `stop()` ends it
    and removes its webhook configurations (nothing is left to refuse objects once it is gone); CRDs stay.
    `wait_for_pods_ready`: Kueue's waitForPodsReady timeout in seconds (None: off); `frameworks`: the integrations
    on (FRAMEWORK_HOOKS' keys)."""

    def __init__(self, cluster: LocalCluster, *, wait_for_pods_ready: float | None = None,
                 recovery_timeout: float | None = None, frameworks: tuple[str, ...] = FRAMEWORKS) -> None:
        unknown = sorted(set(frameworks) - set(FRAMEWORK_HOOKS))
        if unknown:
            raise ValueError(f"frameworks: {unknown} unknown here; known: {sorted(FRAMEWORK_HOOKS)}")
        self.frameworks = frameworks
        self.cluster = cluster
        self.home = binaries.kueue_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="reservoir-kueue-"))
        self.webhook_port, self.health_port = free_port(), free_port()
        self.metrics_port = free_port()
        self.wait_for_pods_ready = wait_for_pods_ready
        self.recovery_timeout = recovery_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.dir / "kueue.log"

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # --- what a release install applies ---

    def manifests(self) -> list[dict[str, Any]]:
        """The namespace, the webhook Service (ExternalName 127.0.0.1), the Secret for its certificates, Kueue's CRDs
        (the CONVERTED ones with their conversion webhook, as its kustomization patches them) and its webhook
        configurations, each hook's Service pointed at the manager's port."""
        service = {"namespace": NAMESPACE, "name": SERVICE, "port": self.webhook_port}
        docs: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
             "spec": {"type": "ExternalName", "externalName": "127.0.0.1",
                      "ports": [{"port": self.webhook_port, "protocol": "TCP"}]}},
            # the release's empty Secret (its internalcert component): the manager writes its certificates there
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE}},
        ]
        for path in sorted((self.home / "crd").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            if crd["metadata"]["name"] in CONVERTED:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"service": {**service, "path": "/convert"}},
                    "conversionReviewVersions": ["v1"]}}
            docs.append(crd)
        names = {"MutatingWebhookConfiguration": MUTATING, "ValidatingWebhookConfiguration": VALIDATING}
        for doc in yaml.safe_load_all((self.home / "webhooks.yaml").read_text()):
            doc = copy.deepcopy(doc)
            doc["metadata"] = {"name": names[doc["kind"]]}
            hooks = []
            served = (KUEUE_HOOKS, *(FRAMEWORK_HOOKS[name] for name in self.frameworks))
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                if any(part in path for part in served):
                    hook["clientConfig"] = {"service": {**service, "path": path}}
                    hooks.append(hook)
            doc["webhooks"] = hooks
            docs.append(doc)
        return docs

    def install(self) -> None:
        subprocess.run([*self.cluster.kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-"],
                       input=yaml.safe_dump_all(self.manifests()).encode(), check=True, stdout=subprocess.DEVNULL)
        subprocess.run([*self.cluster.kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                        *(f"crd/{doc['metadata']['name']}" for doc in self.manifests()
                          if doc["kind"] == "CustomResourceDefinition")],
                       check=True, stdout=subprocess.DEVNULL)

    # --- the manager ---

    def configuration(self) -> dict[str, Any]:
        """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for this process: every port on 127.0.0.1, no leader
        election, its own certificate management for the Service above."""
        config: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"port": self.webhook_port, "host": "127.0.0.1", "certDir": str(self.dir / "certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
            "integrations": {"frameworks": list(self.frameworks)},
        }
        if self.wait_for_pods_ready is not None:
            ready: dict[str, Any] = {"timeout": f"{self.wait_for_pods_ready:g}s", "blockAdmission": False}
            if self.recovery_timeout is not None:
                ready["recoveryTimeout"] = f"{self.recovery_timeout:g}s"
            config["waitForPodsReady"] = ready
        return config

    def start(self, timeout: float = 120.0) -> None:
        """Run the manager; return when it reports ready and its webhooks answer through the API server."""
        config = self.dir / "config.yaml"
        config.write_text(yaml.safe_dump(self.configuration()))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(self.home / "kueue"), f"--config={config}", f"--feature-gates={','.join(FEATURES_OFF)}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir,
                env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        self._wait("ready", deadline, lambda: self._mount_certificates() and self._ready())
        self._wait("webhooks answering", deadline, self._webhooks_answer)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 10 s), remove its webhook configurations, then its files."""
        if self.running():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.cluster.workdir is not None:
            for kind, name in (("mutatingwebhookconfiguration", MUTATING),
                               ("validatingwebhookconfiguration", VALIDATING)):
                subprocess.run([*self.cluster.kubectl, "delete", kind, name, "--ignore-not-found"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _mount_certificates(self) -> bool:
        """The kubelet's part: Kueue writes its serving certificate into its Secret and waits for it to appear in its
        certificate directory, where the Secret is mounted in a pod. Copied there once the Secret holds it."""
        certs = self.dir / "certs"
        if (certs / "tls.crt").exists():
            return True
        done = subprocess.run([*self.cluster.kubectl, "get", "secret", "-n", NAMESPACE, SECRET, "-o", "json"],
                              capture_output=True)
        data = json.loads(done.stdout).get("data") or {} if done.returncode == 0 else {}
        if not data.get("tls.crt") or not data.get("tls.key"):
            return False
        certs.mkdir(mode=0o700, exist_ok=True)
        for name in sorted(data, key=lambda n: n == "tls.crt"):  # tls.crt last: Kueue waits for it alone
            path = certs / name
            path.write_bytes(base64.b64decode(data[name]))
            path.chmod(0o600)
        return True

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _webhooks_answer(self) -> bool:
        """A dry-run create of a ResourceFlavor goes through Kueue's mutating and validating webhooks: it succeeds only
        once the API server trusts the manager's certificate."""
        flavor = {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": "reservoir-probe"}}
        done = subprocess.run([*self.cluster.kubectl, "create", "--dry-run=server", "-f", "-"],
                              input=yaml.safe_dump(flavor).encode(), capture_output=True)
        return done.returncode == 0

    def _wait(self, what: str, deadline: float, ready: Any) -> None:
        while time.monotonic() < deadline:
            if not self.running():
                raise KueueError(f"kueue exited with code {self.process.returncode if self.process else None}:\n"
                                 f"{self.log_tail()}")
            if ready():
                return
            time.sleep(0.3)
        raise KueueError(f"kueue not {what} before the deadline:\n{self.log_tail()}")
