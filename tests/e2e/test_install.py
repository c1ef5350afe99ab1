"""The two ways to install, against the local kube-apiserver: `kubectl apply -k deploy/ --dry-run=server` and
`helm template ... | kubectl apply --dry-run=server -f -` are accepted, with no Pod Security warning in the
`restricted` namespace; `helm lint` passes; and for the same settings the two render the same objects.

Same objects: every object of either render, keyed by apiVersion, kind, namespace and name, equal in full once both
are normalised by one rule (`normalised`):
- the chart's pre-delete hook (objects annotated `helm.sh/hook`) is left out: kustomize users run `reservoir
  uninstall` by hand instead;
- Helm's own labels (HELM_LABELS) and its `helm.sh/resource-policy` annotation are dropped from each object's
  metadata (the chart puts them nowhere else: not on selectors, not on pod templates);
- a ConfigMap's `*.yaml` data is compared as the YAML it holds, not as text (comments and key order differ).
Nothing else is excused, so a manifest added to deploy/ and missing from the chart (or the other way) fails here.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import binaries
from localcluster.cluster import LocalCluster
from tests.conftest import unavailable
from tests.e2e.kit import REPO, Kit, apply_setup
from tests.e2e.scenarios import SETUP

DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "reservoir"
COMPONENTS = DEPLOY / "components"
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")
HELM_ANNOTATIONS = ("helm.sh/resource-policy",)
HOOK = "helm.sh/hook"

# The same settings, each way: the kustomize components over deploy/, and the chart's values.
SETTINGS = {
    "defaults": ((), ()),
    "volcano-crds": (("volcano-crds",), ("volcanoCRDs.enabled=true",)),
    "metrics-service": (("metrics-service",), ("metrics.service.enabled=true",)),
    "cert-manager": (("cert-manager",), ("certificates.mode=cert-manager",)),
    "monitoring": (("metrics-service", "monitoring", "grafana-dashboard"),
                   ("metrics.service.enabled=true", "metrics.serviceMonitor.enabled=true",
                    "metrics.prometheusRule.enabled=true", "metrics.grafanaDashboard.enabled=true")),
    "everything": (("volcano-crds", "metrics-service", "cert-manager", "monitoring", "grafana-dashboard"),
                   ("volcanoCRDs.enabled=true", "metrics.service.enabled=true", "certificates.mode=cert-manager",
                    "metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
                    "metrics.grafanaDashboard.enabled=true")),
}


@pytest.fixture(scope="module")
def helm() -> Path:
    if binaries.helm_missing():
        message = f"helm not built ({binaries.helm()}): run `make cluster-bin`"
        unavailable(message)
    return binaries.helm()


def run(args: list[str | Path], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(map(str, args))}:\n{done.stderr}"
    return done


def components_exist(names: tuple[str, ...]) -> bool:
    return all((COMPONENTS / name / "kustomization.yaml").is_file() for name in names)


def kustomize(kubectl: list[str], components: tuple[str, ...] = ()) -> str:
    """`kubectl kustomize` of deploy/, with `components` (names under deploy/components) through an overlay."""
    if not components:
        return run([*kubectl, "kustomize", DEPLOY]).stdout
    with tempfile.TemporaryDirectory() as overlay:
        relative = Path(os.path.relpath(DEPLOY, overlay))
        (Path(overlay) / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [str(relative)], "components": [str(relative / "components" / c) for c in components]}))
        return run([*kubectl, "kustomize", overlay]).stdout


def helm_template(helm: Path, values: tuple[str, ...] = ()) -> str:
    sets = [arg for value in values for arg in ("--set", value)]
    return run([helm, "template", "reservoir", CHART, *sets]).stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def normalised(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """The module docstring's rule: hooks out, Helm's labels and annotation out, ConfigMap YAML parsed."""
    out = {}
    for doc in docs:
        meta = doc.setdefault("metadata", {})
        if HOOK in (meta.get("annotations") or {}):
            continue
        for field, drop in (("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)):
            kept = {k: v for k, v in (meta.get(field) or {}).items() if k not in drop}
            if kept:
                meta[field] = kept
            else:
                meta.pop(field, None)
        if doc["kind"] == "ConfigMap":
            data = doc.get("data") or {}
            doc["data"] = {k: yaml.safe_load(v) if k.endswith(".yaml") else v for k, v in data.items()}
        key = (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, f"{key} rendered twice"
        out[key] = doc
    return out


def differences(kustomized: dict, helmed: dict) -> list[str]:
    lines = [f"only in kustomize: {k}" for k in sorted(set(kustomized) - set(helmed))]
    lines += [f"only in helm: {k}" for k in sorted(set(helmed) - set(kustomized))]
    for key in sorted(set(kustomized) & set(helmed)):
        if kustomized[key] != helmed[key]:
            lines.append(f"differs: {key}\n  kustomize: {kustomized[key]}\n  helm:      {helmed[key]}")
    return lines


@pytest.fixture
async def setup(kit: Kit) -> AsyncIterator[None]:
    """Reservoir's namespace with its pod-security labels and the CRDs, as a cluster being upgraded has them: a
    server-side dry run cannot create a namespace for the objects that go in it."""
    await apply_setup(kit, *SETUP)
    yield None


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_kustomize_and_helm_render_the_same_objects(cluster: LocalCluster, helm: Path, setting: str) -> None:
    components, values = SETTINGS[setting]
    if not components_exist(components):
        pytest.skip(f"deploy/components lacks one of {components}")
    kustomized = normalised(documents(kustomize(cluster.kubectl, components)))
    helmed = normalised(documents(helm_template(helm, values)))
    assert not differences(kustomized, helmed), "\n".join(differences(kustomized, helmed))


def test_helm_lint_passes(helm: Path) -> None:
    for values in ((), SETTINGS["everything"][1]):
        sets = [arg for value in values for arg in ("--set", value)]
        done = run([helm, "lint", "--strict", CHART, *sets])
        assert "0 chart(s) failed" in done.stdout, done.stdout


def test_helm_renders_exactly_one_pre_delete_hook_job_that_runs_uninstall(helm: Path) -> None:
    hooks = [d for d in documents(helm_template(helm)) if HOOK in (d["metadata"].get("annotations") or {})]
    jobs = [d for d in hooks if d["kind"] == "Job"]
    assert len(jobs) == 1 and jobs[0]["metadata"]["annotations"][HOOK] == "pre-delete"
    container = jobs[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["uninstall", "--leave-install"]
    without = documents(helm_template(helm, ("uninstallHook.enabled=false",)))
    assert without and not [d for d in without if HOOK in (d["metadata"].get("annotations") or {})]


@pytest.mark.parametrize("setting", ["defaults", "volcano-crds", "metrics-service"])
async def test_the_api_server_accepts_both_renders_with_no_pod_security_warning(
        kit: Kit, setup: None, helm: Path, setting: str) -> None:
    components, values = SETTINGS[setting]
    kubectl = kit.cluster.kubectl
    applied = {
        "kustomize": run([*kubectl, "apply", "--dry-run=server", "-f", "-"], stdin=kustomize(kubectl, components)),
        "helm": run([*kubectl, "apply", "--dry-run=server", "-f", "-"], stdin=helm_template(helm, values)),
    }
    if not components:  # the command an operator types, as typed
        applied["kubectl apply -k"] = run([*kubectl, "apply", "-k", DEPLOY, "--dry-run=server"])
    for way, done in applied.items():
        assert "PodSecurity" not in done.stderr and "would violate" not in done.stderr, (way, done.stderr)
        assert "(server dry run)" in done.stdout, (way, done.stdout)
    # the hook's Job and its RBAC went through the same checks
    assert "job.batch/reservoir-uninstall" in applied["helm"].stdout
