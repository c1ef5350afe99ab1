"""Where the control-plane binaries (and helm, for the chart's tests) live, and building them when they are missing
(localcluster/build.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "kwok")


def versions() -> dict[str, str]:
    """The pinned versions, read from versions.env (the one file that pins them)."""
    out = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
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


def ensure_built() -> Path:
    """Build whatever is missing, helm too (progress goes to stderr), and return the control plane's bin directory."""
    if missing() or helm_missing():
        subprocess.run([str(HERE / "build.sh")], check=True, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    return bin_dir()
