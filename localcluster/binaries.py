"""Where the control-plane binaries (and helm, for the chart's tests) live, and building them when they are missing
(localcluster/build.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "kwok")


# RESERVOIR_KUBERNETES picks the Kubernetes set, as in build.sh: `latest` (default) or `oldest` (the oldest minor
# Reservoir supports); each is cached in its own directory, with the same etcd and kwok.
KUBERNETES_SET = "RESERVOIR_KUBERNETES"
SETS = {"latest": "KUBERNETES", "oldest": "KUBERNETES_OLDEST"}


def kubernetes_set() -> str:
    """The set RESERVOIR_KUBERNETES names; ValueError naming the variable and its values for anything else."""
    chosen = os.environ.get(KUBERNETES_SET) or "latest"
    if chosen not in SETS:
        raise ValueError(f"{KUBERNETES_SET}={chosen!r}: expected one of {', '.join(SETS)}")
    return chosen


def versions() -> dict[str, str]:
    """The pinned versions, read from versions.env (the one file that pins them), with KUBERNETES_VERSION and
    KUBERNETES_STAGING_VERSION those of the set RESERVOIR_KUBERNETES picks."""
    out = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    prefix = SETS[kubernetes_set()]
    out["KUBERNETES_VERSION"] = out[f"{prefix}_VERSION"]
    out["KUBERNETES_STAGING_VERSION"] = out[f"{prefix}_STAGING_VERSION"]
    return out


def cache_root() -> Path:
    return Path(os.environ.get("RESERVOIR_CACHE", Path.home() / ".cache" / "reservoir"))


def bin_dir() -> Path:
    v = versions()
    tag = f"k8s-{v['KUBERNETES_VERSION']}-etcd-{v['ETCD_VERSION']}-kwok-{v['KWOK_VERSION']}"
    return cache_root() / "bin" / tag


def missing() -> list[str]:
    return [name for name in NAMES if not os.access(bin_dir() / name, os.X_OK)]


def helm() -> Path:
    """helm, built by build.sh into a directory of its own (a new HELM_VERSION leaves the control plane cached)."""
    return cache_root() / "bin" / f"helm-{versions()['HELM_VERSION']}" / "helm"


def helm_missing() -> bool:
    return not os.access(helm(), os.X_OK)


def promtool() -> Path:
    """promtool (the alert rules' tests), built by build.sh into a directory of its own, like helm."""
    return cache_root() / "bin" / f"promtool-{versions()['PROMTOOL_VERSION']}" / "promtool"


def promtool_missing() -> bool:
    return not os.access(promtool(), os.X_OK)


def kueue_dir() -> Path:
    """Kueue's manager (`kueue`), its CRDs (`crd/`) and its webhook manifests (`webhooks.yaml`), from the one module
    version versions.env pins, built by build.sh into a directory of its own, like helm."""
    return cache_root() / "bin" / f"kueue-{versions()['KUEUE_VERSION']}"


def kueue_missing() -> bool:
    return not (os.access(kueue_dir() / "kueue", os.X_OK) and (kueue_dir() / "crd").is_dir())


def ensure_built() -> Path:
    """Build whatever is missing, helm, promtool and Kueue too (progress goes to stderr), and return the control
    plane's bin directory."""
    if missing() or helm_missing() or promtool_missing() or kueue_missing():
        subprocess.run([str(HERE / "build.sh")], check=True, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    return bin_dir()
