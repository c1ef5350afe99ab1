"""The image end to end: `make image` builds it, and it runs as the webhook and as the agent the way the Deployments in
deploy/ run it, against the local control plane.

Read from the manifests (deploy/webhook.yaml, deploy/agent.yaml, the `images:` entry of deploy/kustomization.yaml),
not repeated here: the image, the args, the env, the securityContext (user, read-only root filesystem, no privilege
escalation, capabilities dropped), the emptyDir mounts, the ServiceAccount and its namespace, the readiness probe.
In-cluster configuration as a Pod has it: a token of the Deployment's ServiceAccount (TokenRequest), the cluster CA
and the namespace at /var/run/secrets/kubernetes.io/serviceaccount, KUBERNETES_SERVICE_HOST/PORT pointing at the
local kube-apiserver on 127.0.0.1 (`--network host`; its serving certificate names 127.0.0.1).

One difference, because there is no Service routing here: the local kube-apiserver calls the webhook by URL at
https://127.0.0.1:<port> (localcluster.webhook_process.configurations, as the suite registers it), so the webhook
is given `--cert-ip=127.0.0.1` after the manifest's args, for its certificate to name that address too.

Needs podman (image/host.sh installs it, image/base.sh makes a base when python:3.11-slim cannot be pulled);
skipped without it, failed under RESERVOIR_REQUIRE_CLUSTER=1 as every end-to-end test.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.cluster import LocalCluster
from localcluster.webhook_process import CONFIG_NAME, WebhookProcess, configurations, register
from shared import keys
from shared.ownership import JobRef
from tests.conftest import unavailable
from tests.e2e.kit import REPO, Kit, apply_setup
from tests.e2e.scenarios import SETUP, STARVATION_CONFIG, configure, locked_nodes, spare_node

BASE_ENV = "RESERVOIR_IMAGE_BASE"  # a Python 3.11 base for `make image BASE=`; default: image/base.sh's, if built
LOCAL_BASE = "localhost/reservoir-base"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
VOLCANO = f"/apis/{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
SECRET_PATH = f"/api/v1/namespaces/{keys.NAMESPACE}/secrets/reservoir-webhook-tls"
CERT_LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-webhook-certs"
AGENT_LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent"


def _podman() -> str:
    podman = shutil.which("podman")
    if podman is None:
        message = "podman not installed (image/host.sh installs it)"
        unavailable(message)
    return podman


# --- the manifests ---

def manifest(name: str, kind: str = "Deployment") -> dict[str, Any]:
    for doc in yaml.safe_load_all((REPO / "deploy" / name).read_text()):
        if doc and doc.get("kind") == kind:
            return doc
    raise AssertionError(f"no {kind} in deploy/{name}")


def image_name(short: str) -> str:
    """The full name kustomize gives the image the Deployments call `short` (deploy/kustomization.yaml `images:`)."""
    kustomization = yaml.safe_load((REPO / "deploy/kustomization.yaml").read_text())
    name, _, tag = short.partition(":")
    for entry in kustomization.get("images") or []:
        if entry["name"] == name:
            return f"{entry.get('newName', name)}:{entry.get('newTag', tag or 'latest')}"
    return short


@dataclass
class PodRun:
    """A Deployment's pod as `podman run` arguments: what the manifest says, translated; what this test cannot
    translate fails loudly instead of being left out."""

    deployment: dict[str, Any]
    extra_args: list[str] = field(default_factory=list)

    @property
    def pod(self) -> dict[str, Any]:
        return self.deployment["spec"]["template"]["spec"]

    @property
    def container(self) -> dict[str, Any]:
        containers = self.pod["containers"]
        assert len(containers) == 1, "one container per pod"
        return containers[0]

    @property
    def namespace(self) -> str:
        return self.deployment["metadata"]["namespace"]

    @property
    def service_account(self) -> str:
        return self.pod.get("serviceAccountName") or "default"

    @property
    def pod_name(self) -> str:
        return f"{self.deployment['metadata']['name']}-e2e-{os.getpid()}"

    def port(self, name_or_number: str | int) -> int:
        if isinstance(name_or_number, int):
            return name_or_number
        return next(p["containerPort"] for p in self.container.get("ports") or [] if p.get("name") == name_or_number)

    def env(self) -> dict[str, str]:
        out = {}
        for var in self.container.get("env") or []:
            if "value" in var:
                out[var["name"]] = str(var["value"])
                continue
            ref = (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            fields = {"metadata.namespace": self.namespace, "metadata.name": self.pod_name,
                      "spec.serviceAccountName": self.service_account, "status.podIP": "127.0.0.1",
                      "spec.nodeName": socket.gethostname()}
            assert ref in fields, f"env {var['name']}: this test cannot give {var.get('valueFrom')}"
            out[var["name"]] = fields[ref]
        return out

    def security(self) -> list[str]:
        pod, container = self.pod.get("securityContext") or {}, self.container.get("securityContext") or {}
        user = container.get("runAsUser", pod.get("runAsUser"))
        group = container.get("runAsGroup", pod.get("runAsGroup"))
        out = [f"--user={user}:{group if group is not None else user}"] if user is not None else []
        if container.get("readOnlyRootFilesystem"):
            out.append("--read-only")
        if container.get("allowPrivilegeEscalation") is False:
            out.append("--security-opt=no-new-privileges")
        out += [f"--cap-drop={cap.lower()}" for cap in (container.get("capabilities") or {}).get("drop") or []]
        out += [f"--cap-add={cap.lower()}" for cap in (container.get("capabilities") or {}).get("add") or []]
        return out

    def mounts(self, service_account_dir: Path) -> list[str]:
        volumes = {v["name"]: v for v in self.pod.get("volumes") or []}
        out = [f"--volume={service_account_dir}:{SERVICE_ACCOUNT_DIR}:ro"]
        for mount in self.container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            assert "emptyDir" in volume, f"volume {mount['name']}: this test mounts only emptyDir volumes"
            out.append(f"--tmpfs={mount['mountPath']}:rw,mode=1777")  # an emptyDir is world-writable too
        return out

    def podman_args(self, cluster: LocalCluster, service_account_dir: Path, name: str) -> list[str]:
        env = {**self.env(), "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cluster.api_port)}
        command = self.container.get("command")
        return ["run", "--detach", f"--name={name}", "--network=host", f"--hostname={self.pod_name}",
                *self.security(), *self.mounts(service_account_dir), *[f"--env={k}={v}" for k, v in env.items()],
                *([f"--entrypoint={command[0]}"] if command else []), image_name(self.container["image"]),
                *(command[1:] if command else []), *self.container.get("args", []), *self.extra_args]


# --- running a pod's container ---

@dataclass
class Container:
    podman: str
    name: str
    run: PodRun

    def logs(self) -> str:
        out = subprocess.run([self.podman, "logs", self.name], capture_output=True, text=True)
        return out.stdout + out.stderr

    def running(self) -> bool:
        out = subprocess.run([self.podman, "inspect", "--format={{.State.Running}}", self.name],
                             capture_output=True, text=True)
        return out.stdout.strip() == "true"

    def ready(self) -> bool:
        """The readiness probe as the kubelet runs it (HTTPS without verifying the certificate)."""
        probe = self.run.container["readinessProbe"]["httpGet"]
        scheme = probe.get("scheme", "HTTP").lower()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        url = f"{scheme}://127.0.0.1:{self.run.port(probe['port'])}{probe['path']}"
        try:
            with urllib.request.urlopen(url, timeout=2, context=context if scheme == "https" else None) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False


def service_account_files(cluster: LocalCluster, run: PodRun, directory: Path) -> Path:
    """token (TokenRequest for the Deployment's ServiceAccount), ca.crt and namespace, readable by the pod's user
    only, as the kubelet projects them."""
    token = subprocess.run([*cluster.kubectl, "create", "token", run.service_account, "-n", run.namespace,
                            "--duration=1h"], capture_output=True, text=True, check=True).stdout.strip()
    directory.mkdir(mode=0o700)
    files = {"token": token.encode(), "ca.crt": cluster.path("ca.crt").read_bytes(),
             "namespace": run.namespace.encode()}
    uid = (run.pod.get("securityContext") or {}).get("runAsUser", 0)
    for name, data in files.items():
        (directory / name).write_bytes(data)
        (directory / name).chmod(0o400)
        os.chown(directory / name, uid, uid)
    os.chown(directory, uid, uid)
    return directory


@pytest.fixture(scope="module")
def image() -> str:
    """`make image` (cached layers make a rebuild of unchanged code take seconds); the name it tags."""
    podman = _podman()
    base = os.environ.get(BASE_ENV)
    if base is None and subprocess.run([podman, "image", "exists", LOCAL_BASE]).returncode == 0:
        base = LOCAL_BASE
    began = time.monotonic()
    build = subprocess.run(["make", "--no-print-directory", "image", *([f"BASE={base}"] if base else [])], cwd=REPO,
                           capture_output=True, text=True)
    assert build.returncode == 0, f"make image failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}"
    name = image_name(manifest("webhook.yaml")["spec"]["template"]["spec"]["containers"][0]["image"])
    assert subprocess.run([podman, "image", "exists", name]).returncode == 0, f"make image did not tag {name}"
    size = subprocess.run([podman, "image", "inspect", "--format={{.Size}}", name], capture_output=True, text=True)
    print(f"image: {name} built in {time.monotonic() - began:.1f}s, {int(size.stdout or 0) / 1e6:.0f} MB")
    return name


Start = Callable[[PodRun], Container]


def port_free(port: int) -> None:
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} (from deploy/) is taken on this host"


@pytest.fixture
def containers(cluster: LocalCluster, image: str) -> Iterator[Start]:
    """Start pods' containers with `start(run)`; each is stopped and removed (by its name) at the end."""
    podman = _podman()
    started: list[Container] = []
    workdir = Path(tempfile.mkdtemp(prefix="reservoir-image-"))

    def start(run: PodRun) -> Container:
        name = f"reservoir-e2e-{run.deployment['metadata']['name']}-{os.getpid()}"
        subprocess.run([podman, "rm", "--force", "--ignore", name], capture_output=True)
        tokens = service_account_files(cluster, run, workdir / name)
        out = subprocess.run([podman, *run.podman_args(cluster, tokens, name)], capture_output=True, text=True)
        assert out.returncode == 0, f"podman run failed: {out.stderr}"
        container = Container(podman, name, run)
        started.append(container)
        return container

    yield start
    for container in started:
        print(f"--- {container.name} ---\n{container.logs()[-5000:]}")
        subprocess.run([podman, "rm", "--force", "--time=5", container.name], capture_output=True)
    shutil.rmtree(workdir, ignore_errors=True)


# --- the webhook ---

@pytest.fixture
async def webhook_setup(kit: Kit) -> AsyncIterator[None]:
    await apply_setup(kit, *SETUP, "deploy/webhook-rbac.yaml")
    for path in (SECRET_PATH, CERT_LEASE_PATH):
        await kit.raw("DELETE", path)
    yield
    WebhookProcess.unregister(kit.cluster.kubectl)
    for path in (SECRET_PATH, CERT_LEASE_PATH):
        await kit.raw("DELETE", path)


async def test_the_image_runs_as_the_webhook_creates_its_certificate_and_is_called(
        kit: Kit, webhook_setup: None, containers: Start) -> None:
    run = PodRun(manifest("webhook.yaml"), extra_args=["--cert-ip=127.0.0.1"])
    args = run.container["args"]
    port = next(int(a.split("=", 1)[1]) for a in args if a.startswith("--port="))
    port_free(port)
    register(kit.cluster.kubectl, configurations(f"https://127.0.0.1:{port}", None))
    webhook = containers(run)

    async def secret() -> dict | None:
        found = await kit.attempt("GET", SECRET_PATH)
        return found if found.get("kind") == "Secret" else None
    try:
        written = await kit.wait_for(secret, what="the webhook's Secret, written by the container", timeout=60)
    except AssertionError:
        raise AssertionError(f"{webhook.logs()[-3000:]}") from None
    bundle = base64.b64decode(written["data"]["ca.crt"])

    async def injected() -> bool:
        hooks = []
        for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            hooks += (await kit.raw("GET", f"{ADMISSION}/{plural}/{CONFIG_NAME}"))["webhooks"]
        return all(base64.b64decode(h["clientConfig"].get("caBundle") or "") == bundle for h in hooks)
    await kit.wait_for(injected, what="the CA bundle injected by the container", timeout=30)

    async def ready() -> bool:
        return webhook.ready()
    await kit.wait_for(ready, what="the webhook's readiness probe", timeout=60)

    # kube-apiserver's admission calls reach it: a bad Queue refused with the webhook's own message
    body = {"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
            "metadata": {"name": f"greedy-{kit.namespace}"[:60]},
            "spec": {"capability": {"cpu": "4"}, "guarantee": {"resource": {"cpu": "8"}}}}

    async def refused() -> str | None:
        message = (await kit.attempt("POST", f"{VOLCANO}/queues?dryRun=All", body=body)).get("message") or ""
        return message if "spec.guarantee.resource.cpu (8) exceeds spec.capability.cpu (4)" in message else None
    await kit.wait_for(refused, what="a bad Queue refused by the webhook in the container", timeout=30)

    # and a pod CREATE is mutated by it: a pod of a PodGroup gets the PodGroup's reserve annotations
    await kit.custom.create_namespaced_custom_object(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, kit.namespace,
                                                     keys.PODGROUP_PLURAL, {
        "apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "PodGroup",
        "metadata": {"name": "train", "annotations": {keys.RESERVEABLE: "true", keys.MAXIMUM_RUNTIME: "2h"}},
        "spec": {"minMember": 1}})
    pod = kit.pod_body("train-0", {"cpu": "1"}, annotations={keys.GROUP_NAME: "train"})

    async def mutated() -> dict | None:
        answer = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods?dryRun=All", body=pod)
        return answer if (answer.get("metadata", {}).get("annotations") or {}).get(keys.RESERVEABLE) else None
    await kit.wait_for(mutated, what="a pod CREATE mutated by the webhook in the container", timeout=30)
    assert webhook.running()


# --- the agent ---

@pytest.fixture
async def agent_setup(kit: Kit) -> AsyncIterator[None]:
    await apply_setup(kit, *SETUP)
    await configure(kit, STARVATION_CONFIG)
    await kit.raw("DELETE", AGENT_LEASE_PATH)
    yield
    await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
    await kit.raw("DELETE", AGENT_LEASE_PATH)


async def test_the_image_runs_as_the_agent_and_locks_a_node_for_a_starving_pod(
        kit: Kit, agent_setup: None, containers: Start) -> None:
    run = PodRun(manifest("agent.yaml"))
    port_free(run.port(run.container["readinessProbe"]["httpGet"]["port"]))
    await kit.create_node("image-node", {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    await kit.create_pod("hog", {"cpu": "3"})
    await kit.wait_pod("hog", lambda p: p.get("status", {}).get("phase") == "Running", "Running")
    agent = containers(run)

    async def ready() -> bool:
        return agent.ready()
    try:
        await kit.wait_for(ready, what="the agent's readiness probe", timeout=60)
    except AssertionError:
        raise AssertionError(agent.logs()[-3000:]) from None

    async def leading() -> str | None:
        lease = await kit.attempt("GET", AGENT_LEASE_PATH)  # 404 until the agent has made it
        return (lease.get("spec") or {}).get("holderIdentity")
    holder = await kit.wait_for(leading, what="the agent holding its Lease, as its ServiceAccount", timeout=30)
    assert holder.startswith(run.pod_name), holder  # the Pod's host name: the default identity

    # a pod that needs the whole node starves behind the hog: past the threshold (3 s) the agent locks the node
    await kit.create_pod("big", {"cpu": "4"})

    async def locked() -> dict[str, str] | None:
        return await locked_nodes(kit, ["image-node"]) or None
    locks = await kit.wait_for(locked, what="image-node locked by the agent in the container", timeout=45)
    assert locks == {"image-node": JobRef(kit.namespace, "Pod", "big").owner_id}, locks

    # the starving pod gone: its lock is released
    await kit.raw("DELETE", f"/api/v1/namespaces/{kit.namespace}/pods/big?gracePeriodSeconds=0")

    async def released() -> bool:
        return not await locked_nodes(kit, ["image-node"])
    await kit.wait_for(released, what="image-node released by the agent in the container", timeout=45)
    assert agent.running()
