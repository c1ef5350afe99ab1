"""The two Kubernetes sets the suite runs against (localcluster/versions.env, RESERVOIR_KUBERNETES): Python and
build.sh pick the same binaries, and the oldest supported minor is stated alike in versions.env, the Helm chart's
kubeVersion and the README."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from localcluster import binaries

ROOT = Path(__file__).resolve().parents[2]


def _minor(version: str) -> int:
    match = re.fullmatch(r"v1\.(\d+)\.\d+", version)
    assert match, version
    return int(match.group(1))


def test_the_default_set_is_the_latest_and_oldest_is_another_cached_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(binaries.KUBERNETES_SET, raising=False)
    latest = binaries.versions()
    latest_dir = binaries.bin_dir()
    monkeypatch.setenv(binaries.KUBERNETES_SET, "oldest")
    oldest = binaries.versions()
    assert oldest["KUBERNETES_VERSION"] == latest["KUBERNETES_OLDEST_VERSION"]
    assert oldest["KUBERNETES_STAGING_VERSION"] == latest["KUBERNETES_OLDEST_STAGING_VERSION"]
    assert _minor(oldest["KUBERNETES_VERSION"]) < _minor(latest["KUBERNETES_VERSION"])
    # a staging module's v0.M.P goes with Kubernetes v1.M.P
    for v in (latest, oldest):
        assert v["KUBERNETES_STAGING_VERSION"] == "v0." + v["KUBERNETES_VERSION"].removeprefix("v1.")
    assert binaries.bin_dir() != latest_dir and oldest["KUBERNETES_VERSION"] in binaries.bin_dir().name


def test_an_unknown_set_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(binaries.KUBERNETES_SET, "1.29")
    with pytest.raises(ValueError, match=r"RESERVOIR_KUBERNETES='1.29': expected one of latest, oldest"):
        binaries.bin_dir()
    refused = subprocess.run([str(ROOT / "localcluster" / "build.sh")], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "RESERVOIR_KUBERNETES": "1.29"})
    assert refused.returncode == 2
    assert "RESERVOIR_KUBERNETES=1.29: expected latest or oldest" in refused.stderr


def test_build_sh_knows_the_same_sets() -> None:
    script = (ROOT / "localcluster" / "build.sh").read_text()
    block = script[script.index("case ${RESERVOIR_KUBERNETES:-latest} in"):]
    block = block[:block.index("esac")]
    assert set(re.findall(r"^\s+([a-z]+)\)", block, re.MULTILINE)) == set(binaries.SETS)


def test_the_oldest_minor_is_stated_alike_in_the_chart_and_the_readme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(binaries.KUBERNETES_SET, raising=False)
    minor = _minor(binaries.versions()["KUBERNETES_OLDEST_VERSION"])
    latest = _minor(binaries.versions()["KUBERNETES_VERSION"])
    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "reservoir" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">=1.{minor}.0-0"
    readme = (ROOT / "README.md").read_text()
    assert f"Kubernetes 1.{minor} to 1.{latest}" in readme


def test_only_kube_scheduler_before_1_32_gets_the_short_retry_of_parked_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    """README "Supported Kubernetes versions": 1.30-1.31 retry a pod parked by a released lock only periodically."""
    from localcluster.cluster import scheduler_version_flags
    monkeypatch.delenv(binaries.KUBERNETES_SET, raising=False)
    assert scheduler_version_flags("v1.30.14") == ["--pod-max-in-unschedulable-pods-duration=20s"]
    assert scheduler_version_flags("v1.31.0") == ["--pod-max-in-unschedulable-pods-duration=20s"]
    assert scheduler_version_flags("v1.32.0") == []
    assert scheduler_version_flags(binaries.versions()["KUBERNETES_VERSION"]) == []
