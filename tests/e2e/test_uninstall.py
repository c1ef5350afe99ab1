"""`reservoir uninstall` on the real control plane, with the webhook registered and the agent running (as their
ServiceAccounts) and three kinds of lock held: a starving job's, a window's and a queue guarantee's. Afterwards no
node carries a `reservoir.sh/` taint, label or annotation (and the keys of others are still there), no Reservoir
webhook configuration is left, every Queue and PodGroup (and Volcano's CRDs) still exists, Reservoir's scheduling
gate is lifted and no other, the placeholder pod is gone; a second run has nothing to do and exits 0.

The command deletes the session's shared Reservoir setup (namespace, RBAC, PriorityClass): the test waits for the
namespace to be gone and applies that setup again, so the test files after it find the cluster as before."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from agent.uninstall import NOTHING_TO_DO
from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER
from shared import keys
from tests.e2e.kit import REPO, Kit, apply_setup, running_webhook
from tests.e2e.scenarios import SETUP, configure

VOLCANO = f"/apis/{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"
# the session's setup, as the other test files apply it: applied again once the namespace is gone
RESTORE = (*SETUP, "deploy/webhook-rbac.yaml", "deploy/tenant-rbac.yaml")
WINDOW = "ebook"
EBOOK = {"business": "ebook"}
OTHERS = "example.com/keep"  # a taint, label and annotation key that is not Reservoir's: it must stay
OTHER_GATE = "example.com/hold"
OUR_GATE = f"{keys.DOMAIN}/test-hold"


def three_policy_config() -> str:
    """Starvation (3 s), a window on the `business: ebook` node whose lock is due now, queue guarantees."""
    start = (datetime.now(UTC) + timedelta(minutes=1)).replace(second=0, microsecond=0)
    return f"""
starvation: {{starvingJobTimeThreshold: 3s, reservedNodePercent: 100, maxLockDuration: 10m}}
maxLockedNodePercent: 90
resyncPeriod: 2s
debounce: 200ms
windows:
- name: {WINDOW}
  nodeSelector: {{business: ebook}}
  resources: {{cpu: "4"}}
  schedule: "{start.minute} {start.hour} * * *"
  duration: 10m
  startReserveAgo: 3m
"""


def uninstall(kit: Kit, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reservoir.cli", "uninstall", *args,
                           f"--kubeconfig={kit.cluster.kubeconfig}"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def not_found(answer: dict) -> bool:
    """Kit.attempt hands back an error's Status instead of raising."""
    return answer.get("kind") == "Status" and answer.get("code") == 404


async def namespace_state(kit: Kit) -> str:
    """"live", "deleting" or "gone"."""
    namespace = await kit.attempt("GET", f"/api/v1/namespaces/{keys.NAMESPACE}")
    if not_found(namespace):
        return "gone"
    return "deleting" if namespace["metadata"].get("deletionTimestamp") else "live"


@pytest.fixture
async def restored(kit: Kit) -> AsyncIterator[list[str]]:
    """The Queues the test creates; afterwards they are deleted, and the setup the command removed is put back."""
    queues: list[str] = []
    yield queues
    for name in queues:
        await kit.raw("DELETE", f"{VOLCANO}/queues/{name}")
    if await namespace_state(kit) == "deleting":
        async def gone() -> bool:
            return await namespace_state(kit) == "gone"
        await kit.wait_for(gone, what=f"namespace {keys.NAMESPACE} deleted", timeout=120)
    await apply_setup(kit, *RESTORE)


def reservoir_keys(node: dict) -> list[str]:
    meta = node["metadata"]
    return sorted([f"taint {t['key']}" for t in node["spec"].get("taints") or []
                   if t["key"].startswith(f"{keys.DOMAIN}/")]
                  + [f"label {k}" for k in meta.get("labels") or {} if k.startswith(f"{keys.DOMAIN}/")]
                  + [f"annotation {k}" for k in meta.get("annotations") or {} if k.startswith(f"{keys.DOMAIN}/")])


async def lock_kinds(kit: Kit) -> dict[str, str]:
    """node -> lock kind label, over the nodes this test made."""
    out = {}
    for name in kit.nodes:
        kind = ((await kit.read_node(name))["metadata"].get("labels") or {}).get(keys.LOCK_KIND)
        if kind:
            out[name] = kind
    return out


async def test_uninstall_removes_every_lock_and_webhook_and_leaves_volcano_alone(
        kit: Kit, restored: list[str]) -> None:
    await apply_setup(kit, *RESTORE)
    await configure(kit, three_policy_config())
    # a starving job: a 4-cpu pod pinned to a node a running pod keeps 1 cpu of
    await kit.create_node("starve-node", {"cpu": "4", "memory": "16Gi"})
    # a window: its node busy with pods that run for long, so it must drain
    await kit.create_node("ebook-1", {"cpu": "4", "memory": "16Gi"}, labels=EBOOK)
    # a queue guarantee of one node's cpu, on nodes of its own
    for name in ("gq-1", "gq-2"):
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"}, labels={"pool": "gq"})
    await kit.create_node("spare", {"cpu": "100m", "memory": "1Gi"})
    others = [{"op": "add", "path": "/spec/taints", "value": [{"key": OTHERS, "value": "yes",
                                                                "effect": "PreferNoSchedule"}]},
              {"op": "add", "path": "/metadata/labels/example.com~1keep", "value": "yes"},
              {"op": "add", "path": "/metadata/annotations/example.com~1keep", "value": "yes"}]
    await kit.patch_node("spare", others)

    queue = f"gq-{kit.namespace[-5:]}"
    async with running_webhook(kit):
        agent = AgentProcess(kit.cluster)
        agent.start()
        try:
            await kit.create_pod("hog", {"cpu": "1"}, annotations={COMPLETE_AFTER: "10m"},
                                 extra_spec={"nodeName": "starve-node"})
            for i in range(2):
                await kit.create_pod(f"filler-{i}", {"cpu": "2"}, annotations={COMPLETE_AFTER: "10m"},
                                     extra_spec={"nodeName": "ebook-1"})
            await kit.create_pod("big", {"cpu": "4"},
                                 extra_spec={"nodeSelector": {"kubernetes.io/hostname": "starve-node"}})
            await kit.server_side_apply({
                "apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
                "metadata": {"name": queue, "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                "spec": {"weight": 1, "guarantee": {"resource": {"cpu": "4"}}}})
            restored.append(queue)
            await kit.custom.create_namespaced_custom_object(
                keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, kit.namespace, keys.PODGROUP_PLURAL,
                {"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "PodGroup",
                 "metadata": {"name": "gang"}, "spec": {"minMember": 1, "queue": queue}})

            async def three_kinds() -> dict[str, str] | None:
                kinds = await lock_kinds(kit)
                return kinds if {"job", "window", "queue"} <= set(kinds.values()) else None
            held = await kit.wait_for(three_kinds, what="a job, a window and a queue lock", timeout=90)

            # what Reservoir added today and must not leave behind: its gate on a pod, a placeholder pod
            gated = kit.pod_body("gated", {"cpu": "1"}, extra_spec={
                "schedulingGates": [{"name": OUR_GATE}, {"name": OTHER_GATE}]})
            await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods", body=gated)
            placeholder = kit.pod_body("placeholder-test", {"cpu": "1"}, labels={keys.PLACEHOLDER: "test"},
                                       extra_spec={"nodeSelector": {"example.com/nowhere": "true"}})
            placeholder["metadata"]["namespace"] = keys.NAMESPACE
            placeholder["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 65532,
                                                      "seccompProfile": {"type": "RuntimeDefault"}}
            placeholder["spec"]["containers"][0]["securityContext"] = {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
            await kit.raw("POST", f"/api/v1/namespaces/{keys.NAMESPACE}/pods", body=placeholder)
            podgroups_before = await kit.raw("GET", f"{VOLCANO}/podgroups")
            queues_before = await kit.raw("GET", f"{VOLCANO}/queues")

            first = uninstall(kit)
            assert first.returncode == 0, first.stderr
            lines = first.stdout.splitlines()
            for line in ("mutatingwebhookconfiguration.admissionregistration.k8s.io/reservoir deleted",
                         "validatingwebhookconfiguration.admissionregistration.k8s.io/reservoir deleted",
                         f"pod/{kit.namespace}/gated scheduling gate removed ({OUR_GATE})",
                         f"namespace/{keys.NAMESPACE} deleted",
                         "clusterrole.rbac.authorization.k8s.io/reservoir-agent deleted",
                         "clusterrolebinding.rbac.authorization.k8s.io/reservoir-webhook deleted",
                         f"priorityclass.scheduling.k8s.io/{keys.PLACEHOLDER_PRIORITY_CLASS} deleted"):
                assert line in lines, first.stdout
            for node in held:
                assert any(line.startswith(f"node/{node} released (") for line in lines), first.stdout
            assert lines.index("validatingwebhookconfiguration.admissionregistration.k8s.io/reservoir deleted") < \
                min(i for i, line in enumerate(lines) if line.startswith("node/")), "webhooks go first"

            # the agent is still running: give it time to write again if it could (resync 2 s, debounce 200 ms)
            await asyncio.sleep(5)
            for name in kit.nodes:
                node = await kit.read_node(name)
                assert reservoir_keys(node) == [], (name, reservoir_keys(node))
            spare = await kit.read_node("spare")
            assert spare["metadata"]["labels"][OTHERS] == "yes" and spare["metadata"]["annotations"][OTHERS] == "yes"
            assert [t["key"] for t in spare["spec"]["taints"]] == [OTHERS]
            for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
                names = [o["metadata"]["name"] for o in
                         (await kit.raw("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}"))["items"]]
                assert "reservoir" not in names, names
            assert (await kit.read_pod("gated"))["spec"]["schedulingGates"] == [{"name": OTHER_GATE}]
            async def placeholder_gone() -> bool:
                pods = await kit.raw("GET", f"/api/v1/namespaces/{keys.NAMESPACE}/pods")
                return not [p for p in pods["items"] if keys.PLACEHOLDER in (p["metadata"].get("labels") or {})
                            and not p["metadata"].get("deletionTimestamp")]
            assert await placeholder_gone()
            # Volcano's objects and CRDs, and the Reservation CRD (no --crds), are all still there
            def names(listing: dict) -> set[tuple[str, str]]:
                return {(o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in listing["items"]}
            # this test's namespace only: an earlier test's namespace may still be going away, PodGroups with it
            def own(found: set[tuple[str, str]]) -> set[tuple[str, str]]:
                return {(ns, name) for ns, name in found if ns == kit.namespace}
            assert own(names(await kit.raw("GET", f"{VOLCANO}/podgroups"))) == own(names(podgroups_before))
            assert names(await kit.raw("GET", f"{VOLCANO}/queues")) == names(queues_before)
            assert (kit.namespace, "gang") in names(podgroups_before) and ("", queue) in names(queues_before)
            for crd in ("queues.scheduling.volcano.sh", "podgroups.scheduling.volcano.sh", "reservations.reservoir.sh"):
                got = await kit.raw("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
                assert got.get("kind") == "CustomResourceDefinition", got
                assert not got["metadata"].get("deletionTimestamp"), got

            second = uninstall(kit)
            assert second.returncode == 0, second.stderr
            assert second.stdout.splitlines() == [NOTHING_TO_DO], second.stdout
        finally:
            agent.stop()
