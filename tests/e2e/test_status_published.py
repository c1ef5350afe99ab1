"""Issue 14: the agent publishes its plan (ConfigMap reservoir-status, written as the agent's own ServiceAccount under
deploy/agent-rbac.yaml), and `reservoir status` shows the locks and the starving jobs from it and the nodes, without
listing a pod; `--why POD` explains a pod covered by its job's lock and one the plan could not lock for."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.agent_process import AgentProcess
from shared import keys
from shared.ownership import JobRef
from tests.e2e.kit import REPO, Kit, apply_setup
from tests.e2e.scenarios import STARVATION_CONFIG, running_agent, spare_node

RESERVOIR = Path(sys.executable).parent / "reservoir"


def reservoir(kit: Kit, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The installed `reservoir` command against the local control plane, found through $KUBECONFIG only (the
    admin's unless `kubeconfig`)."""
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig or kit.cluster.kubeconfig), "HOME": str(REPO)}
    return subprocess.run([str(RESERVOIR), *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)


async def run_json(kit: Kit, *args: str, kubeconfig: Path | None = None) -> dict[str, Any]:
    done = await asyncio.to_thread(reservoir, kit, *args, "-o", "json", kubeconfig=kubeconfig)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


async def service_account_kubeconfig(kit: Kit, name: str, path: Path) -> Path:
    """A kubeconfig that authenticates as ServiceAccount `name` of the test namespace, with a token from the
    TokenRequest API: its RBAC is real, nothing is impersonated."""
    await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/serviceaccounts",
                  {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    token = (await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/serviceaccounts/{name}/token",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "spec": {"expirationSeconds": 600}}))["status"]["token"]
    config = yaml.safe_load(kit.cluster.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def binding(kind: str, role: str, name: str, namespace: str | None, account: str) -> dict[str, Any]:
    """A (Cluster)RoleBinding of ServiceAccount `account` ("namespace/name") to `role` ("ClusterRole/x", "Role/x")."""
    role_kind, role_name = role.split("/")
    account_namespace, account_name = account.split("/")
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": account_name, "namespace": account_namespace}]}


@pytest.fixture
async def agent(kit: Kit) -> AsyncIterator[AgentProcess]:
    async with running_agent(kit, STARVATION_CONFIG, identity="agent-status") as process:
        yield process


async def test_status_and_why_read_what_the_agent_published(kit: Kit, agent: AgentProcess, tmp_path: Path) -> None:
    node = f"why-{kit.namespace[-5:]}"
    await kit.create_node(node, {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit, f"spare-{kit.namespace[-5:]}")
    # runs for ever: the node never drains, the lock stays; smaller than big, so a lock protects big from its like
    await kit.create_pod("hog", {"cpu": "3"})
    await kit.wait_pod("hog", lambda p: p["spec"].get("nodeName") == node, f"bound to {node}")
    await kit.create_pod("big", {"cpu": "4"})  # starving after 3s: its job locks the node
    await kit.create_pod("huge", {"cpu": "64"})  # starving too, but fits on no node: no lock
    big = JobRef(kit.namespace, "Pod", "big")

    async def locked_for_big() -> dict[str, Any] | None:
        document = await run_json(kit, "status")
        ours = [lock for lock in document["locks"] if lock["node"] == node]
        jobs = {j["subject"]: j for j in document["starvingJobs"]}
        if ours and ours[0]["owner"] == big.owner_id and big.full_name in jobs \
                and f"{kit.namespace}/Pod/huge" in jobs:
            return document
        return None

    document = await kit.wait_for(locked_for_big, what=f"`reservoir status` showing {node} locked for big",
                                  timeout=60, interval=1)
    assert document["plan"]["agent"] == "agent-status" and document["plan"]["warning"] is None
    jobs = {j["subject"]: j for j in document["starvingJobs"]}
    assert jobs[big.full_name]["nodes"] == [node] and jobs[big.full_name]["starvingSince"]
    huge = jobs[f"{kit.namespace}/Pod/huge"]
    assert huge["nodes"] == [] and huge["reason"]

    # the pod its job's lock is held for: covered once the agent's repair has given it the lock's toleration
    async def covered() -> dict[str, Any] | None:
        answer = await run_json(kit, "status", "--why", "big", "-n", kit.namespace)
        return answer if answer["reason"] == "locked" else None

    answer = await kit.wait_for(covered, what="--why big: covered", timeout=30, interval=1)
    assert answer["covered"] is True and answer["nodes"] == [node] and answer["tolerates"] is True
    assert answer["explanation"].startswith(
        f"Pod {kit.namespace}/big: is covered by a lock: its job {big.full_name} holds a job lock on 1 node ({node}) "
        "(held for this very pod)")

    # starving, no lock: the planner's own reason, as published
    published = json.loads((await kit.raw("GET", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/"
                                                  f"{keys.STATUS_CONFIGMAP}"))["data"][keys.STATUS_KEY])
    entry = next(j for j in published["jobs"] if j["subject"] == f"{kit.namespace}/Pod/huge")
    answer = await run_json(kit, "status", "--why", "huge", "-n", kit.namespace)
    assert (answer["reason"], answer["covered"], answer["nodes"]) == ("starving-no-lock", False, [])
    assert f"but holds no lock: {entry['reason']}." in answer["explanation"]

    # the bound pod is not pending; the table form is one paragraph and the plan it was read from
    text = await asyncio.to_thread(reservoir, kit, "status", "--why", "hog", "-n", kit.namespace)
    assert text.returncode == 0, text.stderr
    first, second = text.stdout.splitlines()
    assert first == (f"Pod {kit.namespace}/hog: is not pending: it is bound to node {node}; that node is locked for "
                     f"{big.full_name} (job).")
    assert second.startswith("(plan published by agent-status at ")

    missing = await asyncio.to_thread(reservoir, kit, "status", "--why", "nope", "-n", kit.namespace)
    assert missing.returncode == 1 and missing.stderr == (
        f"reservoir: error: pod {kit.namespace}/nope not found (give its namespace with -n)\n")

    # deploy/status-rbac.yaml is all an operator needs; a tenant (deploy/tenant-rbac.yaml) gets nothing of it
    await apply_setup(kit, "deploy/status-rbac.yaml", "deploy/tenant-rbac.yaml")
    operator = await service_account_kubeconfig(kit, "operator", tmp_path / "operator.kubeconfig")
    tenant = await service_account_kubeconfig(kit, "tenant", tmp_path / "tenant.kubeconfig")
    cluster_binding = f"reservoir-status-{kit.namespace}"
    await kit.server_side_apply(binding("ClusterRoleBinding", "ClusterRole/reservoir-status", cluster_binding, None,
                                        f"{kit.namespace}/operator"))
    try:
        await kit.server_side_apply(binding("RoleBinding", "Role/reservoir-status", f"operator-{kit.namespace}",
                                            keys.NAMESPACE, f"{kit.namespace}/operator"))
        await kit.server_side_apply(binding("RoleBinding", "ClusterRole/reservoir-tenant", "tenant", kit.namespace,
                                            f"{kit.namespace}/tenant"))
        async def operator_status() -> dict[str, Any] | None:  # the bindings reach the authorizer's cache first
            done = await asyncio.to_thread(reservoir, kit, "status", "-o", "json", kubeconfig=operator)
            return json.loads(done.stdout) if done.returncode == 0 else None

        shown = await kit.wait_for(operator_status, what="`reservoir status` as the operator", timeout=20)
        assert [lock["owner"] for lock in shown["locks"] if lock["node"] == node] == [big.owner_id]
        assert shown["plan"]["agent"] == "agent-status"
        assert (await run_json(kit, "status", "--why", "big", "-n", kit.namespace, kubeconfig=operator))[
            "reason"] == "locked"
        for args in (("status",), ("status", "--why", "big", "-n", kit.namespace)):
            refused = await asyncio.to_thread(reservoir, kit, *args, kubeconfig=tenant)
            assert refused.returncode == 1 and refused.stdout == "", refused.stdout
            assert refused.stderr.startswith("reservoir: error: API error 403 Forbidden: "), refused.stderr
    finally:
        await kit.raw("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{cluster_binding}")
        await kit.raw("DELETE", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{keys.NAMESPACE}/rolebindings/"
                                f"operator-{kit.namespace}")
