"""`kubectl reservoir status -o yaml` through kubectl's real plugin mechanism: kubectl finds the `kubectl-reservoir`
executable the package installs in PATH and runs it with the arguments after `kubectl reservoir`; the plugin finds
the cluster as kubectl does, from $KUBECONFIG."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from agent.planner.model import Lock
from agent.writer import Writer
from shared import keys
from shared.resources import Resources
from tests.e2e.kit import REPO, Kit

VENV_BIN = Path(sys.executable).parent


def kubectl_reservoir(kit: Kit, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl reservoir ARGS` with only the venv's scripts and kubectl's directory in PATH."""
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{kit.cluster.bin_dir}{os.pathsep}/usr/bin:/bin",
           "KUBECONFIG": str(kit.cluster.kubeconfig)}
    return subprocess.run([str(kit.cluster.bin_dir / "kubectl"), "reservoir", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)


async def test_kubectl_reservoir_status_yaml_through_the_plugin_mechanism(kit: Kit) -> None:
    assert (VENV_BIN / "kubectl-reservoir").exists(), "pip install -e . installs the kubectl-reservoir script"
    plugins = await asyncio.to_thread(kubectl_reservoir, kit)  # `kubectl reservoir` alone: the plugin's usage
    listed = await asyncio.to_thread(
        subprocess.run, [str(kit.cluster.bin_dir / "kubectl"), "plugin", "list", "--name-only"], capture_output=True,
        text=True, env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}/usr/bin:/bin"})
    assert "kubectl-reservoir" in listed.stdout, (listed.stdout, listed.stderr)
    assert plugins.returncode == 2 and plugins.stderr.startswith("usage: kubectl reservoir"), plugins.stderr

    name = f"cli-{kit.namespace[-5:]}"
    await kit.create_node(name, {"cpu": "4", "memory": "16Gi"})
    since = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=3)
    lock = Lock(node=name, owner=keys.owner_id(keys.LockKind.JOB, f"{kit.namespace}/Pod/big"),
                kind=keys.LockKind.JOB, subject=f"{kit.namespace}/Pod/big", reason="held for the CLI test",
                since=since, expires=since + timedelta(hours=1), reserved=Resources.parse({"cpu": "4"}),
                tasks=(f"{kit.namespace}/big",))
    writer = Writer(kit.api, component="reservoir-cli-test")
    try:
        await writer.set_lock(name, lock)
        shown = await asyncio.to_thread(kubectl_reservoir, kit, "status", "-o", "yaml")
        assert shown.returncode == 0, shown.stderr
        document = yaml.safe_load(shown.stdout)
        assert list(document) == ["locks", "starvingJobs", "windows", "guarantees", "skipped", "plan"]
        ours = [entry for entry in document["locks"] if entry["node"] == name]
        assert len(ours) == 1, document["locks"]
        entry = ours[0]
        assert {k: entry[k] for k in ("owner", "kind", "subject", "reason", "reserved", "tasks", "exclusive")} == {
            "owner": lock.owner, "kind": "job", "subject": lock.subject, "reason": "held for the CLI test",
            "reserved": {"cpu": "4"}, "tasks": [f"{kit.namespace}/big"], "exclusive": False}
        assert entry["unreadable"] is None and entry["since"] == since.strftime("%Y-%m-%dT%H:%M:%SZ")

        # a context that the kubeconfig does not define: one line, exit 1, no traceback
        wrong = await asyncio.to_thread(kubectl_reservoir, kit, "status", "--context", "no-such-context")
        assert wrong.returncode == 1 and wrong.stdout == ""
        assert wrong.stderr == f'kubectl reservoir: error: context "no-such-context" not found in ' \
                               f"{kit.cluster.kubeconfig}\n"
    finally:
        await writer.set_lock(name, None)
