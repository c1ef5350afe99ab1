"""deploy/ as kustomize renders it (kubectl kustomize, no cluster), held to what the code assumes of it: Volcano's
CRDs only through their component; `reservoir uninstall`'s names are deploy/'s; one image name and version; hardened
pods. And the pure parts of agent/uninstall.py. (The Helm chart against kustomize: tests/e2e/test_install.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import uninstall
from localcluster import binaries
from shared import keys
from tests.conftest import unavailable

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "reservoir"
VOLCANO_CRDS = {"queues.scheduling.volcano.sh", "podgroups.scheduling.volcano.sh"}
PLURALS = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
           "PriorityClass": "priorityclasses", "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
           "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
           "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
           "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}


def kustomize(path: Path, components: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    kubectl = binaries.bin_dir() / "kubectl"
    if not os.access(kubectl, os.X_OK):
        message = f"kubectl not built ({kubectl}): run `make cluster-bin`"
        unavailable(message)
    with tempfile.TemporaryDirectory() as overlay:
        target = str(path)
        if components:
            relative = Path(os.path.relpath(path, overlay))
            (Path(overlay) / "kustomization.yaml").write_text(yaml.safe_dump({
                "resources": [str(relative)],
                "components": [str(relative / "components" / c) for c in components]}))
            target = overlay
        done = subprocess.run([str(kubectl), "kustomize", target], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def crds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"}


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return kustomize(DEPLOY)


# --- Volcano's CRDs: a component, never the default ---

def test_the_default_install_has_the_reservation_crd_and_no_volcano_crd(default: list[dict[str, Any]]) -> None:
    assert crds(default) == {"reservations.reservoir.sh"}


def test_the_volcano_crds_component_adds_both(default: list[dict[str, Any]]) -> None:
    with_volcano = kustomize(DEPLOY, ("volcano-crds",))
    assert crds(with_volcano) == {"reservations.reservoir.sh", *VOLCANO_CRDS}
    others = [d for d in with_volcano if d["kind"] != "CustomResourceDefinition"]
    assert others == [d for d in default if d["kind"] != "CustomResourceDefinition"], "it adds the CRDs, nothing else"


def test_the_local_cluster_set_of_crds_has_all_three() -> None:
    """localcluster and bench apply deploy/crds: a cluster without Volcano, so Volcano's CRDs are in it."""
    assert crds(kustomize(DEPLOY / "crds")) == {"reservations.reservoir.sh", *VOLCANO_CRDS}


def test_the_old_paths_of_the_volcano_crds_still_read_the_component_files() -> None:
    for name in ("scheduling.volcano.sh_queues.yaml", "scheduling.volcano.sh_podgroups.yaml"):
        assert (DEPLOY / "crds" / name).read_text() == (DEPLOY / "components" / "volcano-crds" / name).read_text()


# --- `reservoir uninstall` names what deploy/ installs ---

def test_uninstall_deletes_the_webhook_configurations_deploy_installs_by_their_names() -> None:
    manifest = [d for d in yaml.safe_load_all((DEPLOY / "webhook-configurations.yaml").read_text()) if d]
    want = {(d["apiVersion"], PLURALS[d["kind"]], d["metadata"]["name"]) for d in manifest}
    assert set(uninstall.WEBHOOK_CONFIGURATIONS) == want


def test_uninstall_deletes_exactly_the_cluster_scoped_objects_of_the_default_install(
        default: list[dict[str, Any]]) -> None:
    """Every cluster-scoped object of `kubectl apply -k deploy/` but the namespace, the CRDs (only with --crds) and
    the webhook configurations (step 1): an object added to deploy/ and not to INSTALLED fails here."""
    cluster_scoped = {(d["apiVersion"], PLURALS.get(d["kind"], d["kind"]), d["metadata"]["name"]) for d in default
                      if not d["metadata"].get("namespace")
                      and d["kind"] not in ("Namespace", "CustomResourceDefinition")}
    assert cluster_scoped - set(uninstall.WEBHOOK_CONFIGURATIONS) == set(uninstall.INSTALLED)
    assert {d["metadata"]["name"] for d in default if d["kind"] == "Namespace"} == {keys.NAMESPACE}
    assert uninstall.RESERVATION_CRD[2] in crds(default)


def test_uninstall_deletes_exactly_the_cluster_scoped_objects_the_optional_components_add(
        default: list[dict[str, Any]]) -> None:
    """deploy/components/koordinator and kueue: what each adds cluster-wide beside the default install's."""
    def cluster_scoped(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        return {(d["apiVersion"], PLURALS.get(d["kind"], d["kind"]), d["metadata"]["name"]) for d in docs
                if not d["metadata"].get("namespace") and d["kind"] not in ("Namespace", "CustomResourceDefinition")}
    added = cluster_scoped(kustomize(DEPLOY, ("koordinator", "kueue"))) - cluster_scoped(default)
    assert added == set(uninstall.COMPONENTS_INSTALLED)


def test_uninstall_never_names_volcanos_objects() -> None:
    names = [*uninstall.INSTALLED, uninstall.RESERVATION_CRD, *uninstall.WEBHOOK_CONFIGURATIONS]
    assert not [n for n in names if keys.VOLCANO_GROUP in n[0] or keys.VOLCANO_GROUP in n[2]]


# --- one image, one version ---

def test_the_image_is_named_once_and_its_tag_is_the_version_everywhere(default: list[dict[str, Any]]) -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    version = next(line.split('"')[1] for line in (REPO / "pyproject.toml").read_text().splitlines()
                   if line.startswith("version = "))
    assert image["newTag"] == version == chart["appVersion"] and values["image"]["tag"] == ""
    assert values["image"]["repository"] == image["newName"]
    images = {c["image"] for d in default if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {f"{image['newName']}:{version}"}


def test_every_link_in_the_chart_reads_a_deploy_manifest() -> None:
    links = sorted((CHART / "files").iterdir())
    assert links
    for link in links:
        assert link.is_symlink() and link.resolve().is_file(), link
        assert DEPLOY in link.resolve().parents, link


# --- hardened pods ---

def test_every_pod_is_hardened_and_probed_on_a_port_it_declares(default: list[dict[str, Any]]) -> None:
    deployments = [d for d in default if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"reservoir-agent", "reservoir-webhook"}
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                          "seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["terminationGracePeriodSeconds"] >= 10
        for container in pod["containers"]:
            assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                                    "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
            ports = {p["name"] for p in container["ports"]}
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            probed = {container[probe]["httpGet"]["port"] for probe in ("readinessProbe", "livenessProbe")}
            assert probed <= ports
            assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]["memory"]
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_the_namespace_enforces_the_restricted_pod_security_level(default: list[dict[str, Any]]) -> None:
    (namespace,) = [d for d in default if d["kind"] == "Namespace"]
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"


def test_the_webhook_replicas_have_a_disruption_budget_and_spread(default: list[dict[str, Any]]) -> None:
    budgets = {d["metadata"]["name"]: d["spec"] for d in default if d["kind"] == "PodDisruptionBudget"}
    (webhook,) = [d for d in default if d["kind"] == "Deployment" and d["metadata"]["name"] == "reservoir-webhook"]
    assert budgets["reservoir-webhook"]["selector"] == webhook["spec"]["selector"]
    assert webhook["spec"]["replicas"] > budgets["reservoir-webhook"]["maxUnavailable"]
    spread = webhook["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}


# --- metrics and alerts (issue 14): Services, ServiceMonitors, PrometheusRule, dashboard; kustomize and Helm ---

MONITORING = ("metrics-service", "monitoring", "grafana-dashboard")
MONITORING_VALUES = ("metrics.service.enabled=true", "metrics.serviceMonitor.enabled=true",
                     "metrics.prometheusRule.enabled=true", "metrics.grafanaDashboard.enabled=true")


def helm_template(*values: str) -> subprocess.CompletedProcess[str]:
    if binaries.helm_missing():
        message = f"helm not built ({binaries.helm()}): run `make cluster-bin`"
        unavailable(message)
    sets = [arg for value in values for arg in ("--set", value)]
    return subprocess.run([str(binaries.helm()), "template", "reservoir", str(CHART), *sets], capture_output=True,
                          text=True, check=False, timeout=120)


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def check_monitoring(docs: list[dict[str, Any]]) -> None:
    """What both renders hold with every monitoring switch on: a metrics Service per program on the port its pods
    declare, a ServiceMonitor selecting each, the rules, and the dashboard for Grafana's sidecar."""
    services = by_kind(docs, "Service")
    deployments = by_kind(docs, "Deployment")
    monitors = by_kind(docs, "ServiceMonitor")
    assert set(monitors) == {"reservoir-agent", "reservoir-webhook"}
    for program, port, scheme in (("agent", "metrics", "http"), ("webhook", "https", "https")):
        service = services[f"reservoir-{program}-metrics"]
        pod = deployments[f"reservoir-{program}"]["spec"]["template"]
        assert all(pod["metadata"]["labels"][k] == v for k, v in service["spec"]["selector"].items())
        declared = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [port] and port in declared
        monitor = monitors[f"reservoir-{program}"]["spec"]
        labels = service["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in monitor["selector"]["matchLabels"].items()), program
        [endpoint] = monitor["endpoints"]
        assert endpoint["port"] == port and endpoint.get("scheme", "http") == scheme
    tls = monitors["reservoir-webhook"]["spec"]["endpoints"][0]["tlsConfig"]
    assert tls["ca"]["secret"] == {"name": "reservoir-webhook-tls", "key": "ca.crt"}
    assert tls["serverName"] == "reservoir-webhook.reservoir-system.svc"
    [rule] = by_kind(docs, "PrometheusRule").values()
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert len(alerts) >= 5 and all({"summary", "description", "runbook"} <= set(r["annotations"]) for r in alerts)
    dashboard = by_kind(docs, "ConfigMap")["reservoir-grafana-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["reservoir-dashboard.json"])["uid"] == "reservoir"


def test_the_monitoring_components_render_services_monitors_rules_and_dashboard() -> None:
    check_monitoring(kustomize(DEPLOY, MONITORING))


def test_the_chart_renders_the_same_monitoring_behind_its_values() -> None:
    done = helm_template(*MONITORING_VALUES)
    assert done.returncode == 0, done.stderr
    check_monitoring([d for d in yaml.safe_load_all(done.stdout) if d])


def test_monitoring_is_off_by_default_and_a_service_monitor_needs_the_services() -> None:
    default = helm_template()
    assert default.returncode == 0, default.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(default.stdout) if d}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert "reservoir-grafana-dashboard" not in default.stdout and "reservoir-agent-metrics" not in default.stdout
    alone = helm_template("metrics.serviceMonitor.enabled=true")
    assert alone.returncode != 0 and "needs metrics.service.enabled=true" in alone.stderr, alone.stderr


def test_a_prometheus_selector_label_reaches_the_monitors_and_the_rules() -> None:
    done = helm_template(*MONITORING_VALUES, "metrics.serviceMonitor.labels.release=kps",
                         "metrics.prometheusRule.labels.release=kps")
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    labelled = [d for d in docs if d["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert len(labelled) == 3 and all(d["metadata"]["labels"]["release"] == "kps" for d in labelled)
    assert all("release" not in (d["metadata"].get("labels") or {}) for d in docs if d not in labelled)


# --- agent/uninstall.py, the pure parts ---

def node(taints: list[dict[str, str]] | None = None, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n", "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"taints": taints or []}}


@pytest.mark.parametrize("marked", [
    node(taints=[{"key": keys.LOCK, "value": "job-x", "effect": "NoSchedule"}]),
    node(taints=[{"key": keys.LOCK_EXCLUSIVE, "value": "queue-x", "effect": "NoSchedule"}]),
    node(labels={keys.LOCK: "job-x"}), node(labels={keys.LOCK_KIND: "job"}),
    node(annotations={keys.LOCK_INFO: "{}"}), node(annotations={keys.LOCK_EXPIRED: "{}"}),
])
def test_a_node_with_any_key_the_agent_writes_is_released(marked: dict[str, Any]) -> None:
    assert uninstall.carries_lock_keys(marked)


@pytest.mark.parametrize("unmarked", [
    node(), node(labels={"example.com/lock": "x", f"{keys.DOMAIN}/pool": "a"}),  # a user's own reservoir.sh/ label
    node(taints=[{"key": keys.LOCK, "value": "x", "effect": "NoExecute"}]),  # not the effect Reservoir writes
    node(annotations={keys.QUEUE_LOCK_GUARANTEE: "true"}),
])
def test_a_node_without_them_is_left_alone(unmarked: dict[str, Any]) -> None:
    assert not uninstall.carries_lock_keys(unmarked)


def test_only_reservoirs_gates_are_lifted() -> None:
    pod = {"spec": {"schedulingGates": [{"name": keys.HANDOVER_GATE}, {"name": "example.com/hold"}]}}
    assert uninstall.reservoir_gates(pod) == [keys.HANDOVER_GATE]
    assert uninstall.ungate_patch(pod) == [
        {"op": "test", "path": "/spec/schedulingGates", "value": pod["spec"]["schedulingGates"]},
        {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "example.com/hold"}]}]
    alone = {"spec": {"schedulingGates": [{"name": keys.HANDOVER_GATE}]}}
    assert uninstall.ungate_patch(alone)[-1] == {"op": "remove", "path": "/spec/schedulingGates"}
    assert uninstall.ungate_patch({"spec": {"schedulingGates": [{"name": "example.com/hold"}]}}) is None
    assert uninstall.ungate_patch({"spec": {}}) is None


def test_objects_are_named_as_kubectl_names_them() -> None:
    assert uninstall.display("v1", "namespaces", "reservoir-system") == "namespace/reservoir-system"
    assert uninstall.display("v1", "pods", "p", "team-a") == "pod/team-a/p"
    assert (uninstall.display("scheduling.k8s.io/v1", "priorityclasses", "x")
            == "priorityclass.scheduling.k8s.io/x")
    assert (uninstall.display("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", "reservoir")
            == "validatingwebhookconfiguration.admissionregistration.k8s.io/reservoir")


def test_the_lease_is_taken_over_and_a_live_holder_is_recognised() -> None:
    now = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    lease = {"metadata": {"name": "reservoir-agent", "resourceVersion": "7"},
             "spec": {"holderIdentity": "agent-0", "leaseDurationSeconds": 15, "leaseTransitions": 2,
                      "renewTime": (now - timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
    assert uninstall.held_by_another(lease, now) == "agent-0"
    assert uninstall.held_by_another(lease, now + timedelta(seconds=20)) is None  # expired: nobody writes
    taken = uninstall.lease_takeover(lease, now)
    assert taken["metadata"]["resourceVersion"] == "7"  # a replace guarded by what was read
    assert taken["spec"]["holderIdentity"] == uninstall.HOLDER and taken["spec"]["leaseTransitions"] == 3
    assert uninstall.held_by_another(taken, now) is None
    renewed = uninstall.lease_takeover(taken, now + timedelta(seconds=2))
    assert renewed["spec"]["leaseTransitions"] == 3 and renewed["spec"]["acquireTime"] == taken["spec"]["acquireTime"]
