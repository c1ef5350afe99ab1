"""Start and stop a real control plane on 127.0.0.1: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and kwok, with generated certificates and an admin kubeconfig.

Every process is started in its own process group with PR_SET_PDEATHSIG, so it dies with the Python process
that started it even on SIGKILL; its pid is written to the work directory, and a later start reaps the
processes and directories of an owner that is gone. `stop()` stops exactly the processes it started, by pid.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import yaml

from certs import pki
from certs.rotation import write_file
from localcluster import binaries

WORKDIR_PREFIX = "reservoir-cluster-"
OWNER_FILE = "owner.pid"
PIDS_FILE = "pids.json"
SERVICE_CIDR = "10.96.0.0/24"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
# Test-harness key (not Reservoir's): a running pod with it becomes Succeeded after this Go duration.
COMPLETE_AFTER = "localcluster.reservoir.sh/complete-after"
STAGES = Path(__file__).resolve().parent / "stages" / "stages.yaml"
_PR_SET_PDEATHSIG = 1


def kwok_node(name: str, allocatable: dict[str, str], labels: dict[str, str] | None = None) -> dict:
    """A Node that kwok manages, with the given allocatable (and capacity), 110 pods unless given."""
    resources = {"pods": "110", **allocatable}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE},
                     "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})}},
        "status": {"allocatable": resources, "capacity": resources},
    }


PARKED_RETRY_SECONDS = 20  # the suite's retry of parked pods on kube-scheduler before 1.32 (scheduler_version_flags)


def scheduler_version_flags(version: str) -> list[str]:
    """kube-scheduler flags that differ by Kubernetes minor (docs/development.md).

    Before 1.32 (SchedulerQueueingHints off by default) kube-scheduler moves a pod it parked as unschedulable when a
    node changes only if the pod fits that node at that moment: a pod kept off by a lock released while the node is
    still full, then freed by pods that finish, waits for the periodic retry of parked pods (5 minutes by default).
    On those versions the suite shortens that retry to 20 s (a deprecated flag 1.30 still has), so the same stories
    finish in test time; the default retry, not a feature gate, is what a 1.30 cluster runs with.
    """
    return [f"--pod-max-in-unschedulable-pods-duration={PARKED_RETRY_SECONDS}s"] if parks_pods(version) else []


def parks_pods(version: str) -> bool:
    """Whether kube-scheduler `version` keeps a pod parked as unschedulable until its periodic retry when a node frees
    up by pods finishing (before 1.32, scheduler_version_flags)."""
    return int(version.removeprefix("v1.").split(".")[0]) < 32


class ClusterError(RuntimeError):
    """The control plane could not start; the message names the component and the tail of its log."""


def _die_with_parent() -> None:
    os.setpgid(0, 0)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def reap_stale(tmp_root: Path | None = None, log: Callable[[str], None] = print) -> int:
    """Kill the leftovers of runs whose owner process is gone and remove their work directories.

    A pid is killed only while its command line still names that run's work directory, so a pid reused by an
    unrelated process is never touched. Returns how many directories were removed.
    """
    root = tmp_root or Path(tempfile.gettempdir())
    removed = 0
    for workdir in root.glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = int((workdir / OWNER_FILE).read_text())
        except (OSError, ValueError):
            owner = -1
        if owner > 0 and _pid_alive(owner):
            continue
        try:
            pids = json.loads((workdir / PIDS_FILE).read_text())
        except (OSError, ValueError):
            pids = {}
        for name, pid in pids.items():
            if _pid_alive(pid) and str(workdir) in _cmdline(pid):
                log(f"localcluster: killing leftover {name} (pid {pid}) of a run that is gone")
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(workdir, ignore_errors=True)
        removed += 1
    return removed


@dataclass
class Component:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class LocalCluster:
    """One control plane. `start()` returns when the apiserver is ready and the default ServiceAccount exists."""

    bin_dir: Path = field(default_factory=binaries.bin_dir)
    log: Callable[[str], None] = print
    workdir: Path | None = None
    api_port: int = 0
    components: list[Component] = field(default_factory=list)
    start_seconds: float = 0.0
    # feature gates (`Name=true`) for the API server, kube-scheduler and kube-controller-manager, and the API server's
    # --runtime-config (`group/version=true`, an alpha API): a cluster of its own for a test that needs them
    feature_gates: tuple[str, ...] = ()
    runtime_config: tuple[str, ...] = ()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        assert self.workdir is not None, "cluster not started"
        return self.workdir / "admin.kubeconfig"

    @property
    def kubectl(self) -> list[str]:
        """The kubectl command line for this cluster."""
        return [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}"]

    def path(self, name: str) -> Path:
        assert self.workdir is not None, "cluster not started"
        return self.workdir / name

    # --- lifecycle ---

    def start(self, timeout: float = 180.0) -> LocalCluster:
        began = time.monotonic()
        reap_stale(log=self.log)
        missing = [n for n in binaries.NAMES if not os.access(self.bin_dir / n, os.X_OK)]
        if missing:
            raise ClusterError(f"binaries missing in {self.bin_dir}: {', '.join(missing)}; run localcluster/build.sh")
        self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (self.workdir / OWNER_FILE).write_text(str(os.getpid()))
        try:
            self._write_pki()
            self._start_etcd(deadline=began + timeout)
            self._start_apiserver(deadline=began + timeout)
            self._write_kubeconfig()
            self._start_controllers()
            self._wait_default_service_account(deadline=began + timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        self.log(f"localcluster: control plane ready at {self.server} in {self.start_seconds:.1f}s "
                 f"(kubeconfig {self.kubeconfig})")
        return self

    def stop(self) -> None:
        """SIGTERM every started process group (newest first), SIGKILL after 10 s, remove the work directory."""
        for component in reversed(self.components):
            if component.process.poll() is None:
                try:
                    os.killpg(component.process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for component in reversed(self.components):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                component.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(component.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                component.process.wait()
        self.components.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        """Raise ClusterError naming any component that has exited."""
        for component in self.components:
            code = component.process.poll()
            if code is not None:
                raise ClusterError(f"{component.name} exited with code {code}:\n{component.log_tail()}")

    # --- pieces ---

    def _spawn(self, name: str, args: list[str]) -> Component:
        assert self.workdir is not None
        log_path = self.workdir / f"{name}.log"
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                preexec_fn=_die_with_parent,
            )
        component = Component(name, process, log_path)
        self.components.append(component)
        pids = {c.name: c.process.pid for c in self.components}
        (self.workdir / PIDS_FILE).write_text(json.dumps(pids))
        return component

    def _write_pki(self) -> None:
        valid = timedelta(days=7)
        ca = pki.make_ca("reservoir-local-ca", valid)
        serving = pki.issue(
            ca, "kube-apiserver", valid, server=True,
            dns_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                       "kubernetes.default.svc.cluster.local"],
            ip_addresses=["127.0.0.1", "10.96.0.1"],
        )
        admin = pki.issue(ca, "reservoir-admin", valid, organizations=["system:masters"], client=True)
        service_accounts = pki.new_key()
        files = {
            "ca.crt": ca.cert_pem, "ca.key": ca.key_pem,
            "apiserver.crt": serving.cert_pem, "apiserver.key": serving.key_pem,
            "admin.crt": admin.cert_pem, "admin.key": admin.key_pem,
            "sa.key": pki.key_pem(service_accounts), "sa.pub": pki.public_key_pem(service_accounts),
        }
        for name, data in files.items():
            write_file(self.path(name), data, 0o600)  # created at 0600: a key is never readable by others

    def _start_etcd(self, deadline: float) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            "--name=reservoir", f"--data-dir={self.path('etcd-data')}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=reservoir=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296",
        ])
        self._wait("etcd", deadline, lambda: self._http_ok(f"{self.etcd_url}/health", None))

    def _start_apiserver(self, deadline: float) -> None:
        self.api_port = free_port()
        self._spawn("kube-apiserver", [
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
            f"--cert-dir={self.path('apiserver-certs')}",
            f"--tls-cert-file={self.path('apiserver.crt')}", f"--tls-private-key-file={self.path('apiserver.key')}",
            f"--client-ca-file={self.path('ca.crt')}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.path('sa.pub')}",
            f"--service-account-signing-key-file={self.path('sa.key')}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
            *self._gates(), *([f"--runtime-config={','.join(self.runtime_config)}"] if self.runtime_config else []),
        ])
        self._wait("kube-apiserver", deadline, lambda: self._http_ok(f"{self.server}/readyz", self._ssl_context()))

    def _write_kubeconfig(self) -> None:
        def b64(name: str) -> str:
            return base64.b64encode(self.path(name).read_bytes()).decode()

        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "reservoir-local",
            "clusters": [{"name": "reservoir-local",
                          "cluster": {"server": self.server, "certificate-authority-data": b64("ca.crt")}}],
            "users": [{"name": "admin",
                       "user": {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")}}],
            "contexts": [{"name": "reservoir-local", "context": {"cluster": "reservoir-local", "user": "admin"}}],
        }
        write_file(self.kubeconfig, yaml.safe_dump(config).encode(), 0o600)  # it holds the admin's client key

    def _start_controllers(self) -> None:
        kubeconfig = str(self.kubeconfig)
        self._spawn("kube-scheduler", [
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--v=1",
            *scheduler_version_flags(binaries.versions()["KUBERNETES_VERSION"]), *self._gates(),
        ])
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--service-account-private-key-file={self.path('sa.key')}", f"--root-ca-file={self.path('ca.crt')}",
            "--use-service-account-credentials=false",
            # As in a real cluster: node lifecycle (it lifts the not-ready taint new nodes are created with; kwok
            # renews node Leases), service accounts, namespaces, garbage collection, PodDisruptionBudgets, Jobs,
            # ReplicaSets, pod GC. Off: what needs a cloud, real volumes or pod CIDRs.
            "--controllers=*,-node-ipam-controller,-persistentvolume-binder-controller,"
            "-persistentvolume-attach-detach-controller,-service-lb-controller,-cloud-node-lifecycle-controller,-node-route-controller",
            # Its client's default 20 requests/s made new nodes Ready at about 9 a second in bench-scale (each needs
            # the not-ready taint lifted); a large cluster's controller-manager runs with limits like these.
            "--kube-api-qps=200", "--kube-api-burst=400",
            "--v=1", *self._gates(),
        ])
        self._spawn("kwok", [
            f"--kubeconfig={kubeconfig}", f"--config={STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
            "--cidr=10.244.0.1/16", "--node-ip=10.240.0.1", "--node-lease-duration-seconds=40",
        ])

    def _gates(self) -> list[str]:
        return [f"--feature-gates={','.join(self.feature_gates)}"] if self.feature_gates else []

    def _wait_default_service_account(self, deadline: float) -> None:
        def ready() -> bool:
            return self._http_ok(f"{self.server}/api/v1/namespaces/default/serviceaccounts/default",
                                 self._ssl_context(client=True))
        self._wait("kube-controller-manager (default ServiceAccount)", deadline, ready)

    def _ssl_context(self, client: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.path("ca.crt")))
        if client:
            context.load_cert_chain(str(self.path("admin.crt")), str(self.path("admin.key")))
        return context

    @staticmethod
    def _http_ok(url: str, context: ssl.SSLContext | None) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _wait(self, what: str, deadline: float, ready: Callable[[], bool]) -> None:
        began = time.monotonic()
        while time.monotonic() < deadline:
            self.check_alive()
            if ready():
                self.log(f"localcluster: {what} ready after {time.monotonic() - began:.1f}s")
                return
            time.sleep(0.2)
        logs = "\n".join(f"--- {c.name} ---\n{c.log_tail()}" for c in self.components)
        raise ClusterError(f"{what} not ready before the deadline\n{logs}")
