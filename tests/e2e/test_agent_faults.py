"""The agent under faults, on the real control plane: two replicas (only the leader writes, the standby takes
over), a crash and restart (no duplicate or orphan taint, same lock), a crash between two node patches of one
reconcile (failpoint; the restart finishes it), an invalid config edit (last good kept,
Warning Event), and `reservoir release --all` (removes Reservoir's locks and nothing else)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from agent.writer import FAILPOINT
from localcluster.agent_process import AgentProcess
from shared import keys
from shared.ownership import JobRef, window_owner_id
from tests import logfmt
from tests.e2e.kit import REPO, Kit, apply_setup
from tests.e2e.scenarios import SETUP, STARVATION_CONFIG, configure, spare_node, window_config

FOREIGN = {"key": "example.com/dedicated", "value": "batch", "effect": "NoSchedule"}


@pytest.fixture
async def held_node(kit: Kit) -> AsyncIterator[str]:
    """A node kept busy by a pod that never ends, and a big pod starving for it; plus a taint not ours."""
    await apply_setup(kit, *SETUP)
    await configure(kit, STARVATION_CONFIG)
    await kit.create_node("held", {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    await kit.patch_node("held", [{"op": "add", "path": "/spec/taints", "value": [FOREIGN]}])
    toleration = {"key": FOREIGN["key"], "operator": "Exists"}
    await kit.create_pod("hog", {"cpu": "3"}, tolerations=[toleration])
    await kit.wait_pod("hog", lambda p: p.get("status", {}).get("phase") == "Running", "Running")
    await kit.create_pod("big", {"cpu": "4"}, tolerations=[toleration])
    yield JobRef(kit.namespace, "Pod", "big").owner_id
    await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
    await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")


async def taints(kit: Kit) -> list[dict]:
    return (await kit.read_node("held"))["spec"].get("taints") or []


async def lock_taints(kit: Kit) -> list[dict]:
    return [t for t in await taints(kit) if t["key"] == keys.LOCK]


async def wait_locked(kit: Kit, owner: str) -> dict:
    async def locked():
        ours = await lock_taints(kit)
        return ours if ours and ours[0].get("value") == owner else None
    await kit.wait_for(locked, what=f"node held locked for {owner}", timeout=30)
    return await kit.read_node("held")


async def lease_holder(kit: Kit) -> str | None:
    lease = await kit.attempt("GET", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")
    return (lease.get("spec") or {}).get("holderIdentity") if lease.get("kind") == "Lease" else None


def reservoir(kit: Kit, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reservoir.cli", *args, f"--kubeconfig={kit.cluster.kubeconfig}"],
                          capture_output=True, text=True, cwd=REPO)


async def test_leader_only_writes_crash_restart_and_takeover(kit: Kit, held_node: str) -> None:
    first = AgentProcess(kit.cluster, identity="agent-a")
    second = AgentProcess(kit.cluster, identity="agent-b")
    try:
        first.start()
        node = await wait_locked(kit, held_node)
        since = json.loads(node["metadata"]["annotations"][keys.LOCK_INFO])["since"]
        assert node["metadata"]["labels"][keys.LOCK] == held_node
        assert node["metadata"]["labels"][keys.LOCK_KIND] == "job"
        assert FOREIGN in await taints(kit)

        second.start()
        await kit.wait_for(lambda: _holder_is(kit, "agent-a"), what="agent-a holding the Lease")
        # crash the leader: the standby takes over within the lease duration and changes nothing that is right
        first.kill()
        await kit.wait_for(lambda: _holder_is(kit, "agent-b"), what="agent-b taking the Lease over", timeout=40)
        await kit.wait_for(lambda: _log_has(second, "leader=acquired"), what="agent-b leading", timeout=10)
        node = await wait_locked(kit, held_node)
        assert len(await lock_taints(kit)) == 1 and FOREIGN in await taints(kit)
        assert json.loads(node["metadata"]["annotations"][keys.LOCK_INFO])["since"] == since, "the same lock, kept"
        assert "decision=lock" not in second.log_text(), "the standby found the lock right and wrote nothing"

        # status shows it
        out = reservoir(kit, "status", "-o", "json")
        assert out.returncode == 0, out.stderr
        locks = json.loads(out.stdout)["locks"]
        assert [(l["node"], l["owner"]) for l in locks] == [("held", held_node)]
    finally:
        first.stop()
        second.stop()

    # release --all with the agent stopped: our lock goes, the foreign taint stays
    out = reservoir(kit, "release", "--all")
    assert out.returncode == 0 and "held: released job" in out.stdout, out.stdout + out.stderr
    node = await kit.read_node("held")
    assert await lock_taints(kit) == [] and FOREIGN in await taints(kit)
    assert keys.LOCK not in node["metadata"].get("labels", {}) and keys.LOCK_INFO not in node["metadata"].get("annotations", {})


async def test_invalid_config_edit_keeps_the_last_good_config(kit: Kit, held_node: str) -> None:
    agent = AgentProcess(kit.cluster, identity="agent-a")
    try:
        agent.start()
        await wait_locked(kit, held_node)
        await configure(kit, "starvation: {reservedNodePercent: lots}\n")  # no webhook here to refuse it
        async def warned() -> list:
            events = await kit.raw("GET", f"/api/v1/namespaces/{keys.NAMESPACE}/events?fieldSelector=reason=InvalidConfig")
            return events["items"]
        events = await kit.wait_for(warned, what="a Warning Event on the ConfigMap", timeout=20)
        assert events[0]["type"] == "Warning" and "starvation.reservedNodePercent" in events[0]["message"]
        assert events[0]["involvedObject"]["name"] == keys.CONFIGMAP_NAME
        # the last good config still rules: the lock stays
        await kit.wait_for(lambda: _log_has(agent, "config=rejected"), what="the agent rejecting the edit")
        assert [t["value"] for t in await lock_taints(kit)] == [held_node]
        # dryRun: true (a valid edit) takes effect without a restart: nothing new is written
        await configure(kit, STARVATION_CONFIG + "dryRun: true\n")
        async def dry_run_loaded() -> bool:
            return bool(logfmt.find(agent.log_text(), config="loaded", dryRun="true"))
        await kit.wait_for(dry_run_loaded, what="the dry-run config loaded")
    finally:
        agent.stop()


async def test_killed_between_two_node_patches_then_restarted(kit: Kit) -> None:
    """A window wants three of four nodes. The agent dies (failpoint: exit 137 right after its first node patch,
    before its Events) in the middle of that reconcile; one node is locked, two are not. Started again, it
    finishes the job: the same three nodes an uninterrupted run picks, one lock taint each, the first lock's
    `since` kept, the fourth node untouched."""
    await apply_setup(kit, *SETUP)
    await configure(kit, window_config("crash", "{pool: crash}", cpu="12", pod_num_to_reserve=None))
    names = [f"crash-{i}" for i in range(1, 5)]
    for name in names:
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"}, labels={"pool": "crash"})
    owner = window_owner_id("crash")

    async def locked() -> dict[str, list[dict]]:
        out = {}
        for name in names:
            node = await kit.read_node(name)
            ours = [t for t in node["spec"].get("taints") or [] if t["key"] == keys.LOCK]
            if ours:
                out[name] = ours
        return out

    crashing = AgentProcess(kit.cluster, identity="agent-a")
    again = AgentProcess(kit.cluster, identity="agent-a")
    try:
        crashing.start(env={FAILPOINT: "exit-after-node-patches:1"})
        assert crashing.process is not None
        assert await asyncio.to_thread(crashing.process.wait, 60) == 137, crashing.log_text()
        assert "failpoint=exit-after-node-patches:1" in crashing.log_text()
        half = await locked()
        assert list(half) == ["crash-1"], f"one node patched before the crash: {half}"
        first_since = json.loads((await kit.read_node("crash-1"))["metadata"]["annotations"][keys.LOCK_INFO])["since"]

        again.start()
        async def three() -> dict | None:
            now = await locked()
            return now if len(now) == 3 else None
        final = await kit.wait_for(three, what="three nodes locked after the restart", timeout=30)
        assert sorted(final) == names[:3]
        assert all(len(taints) == 1 and taints[0]["value"] == owner for taints in final.values())
        for name in names[:3]:
            node = await kit.read_node(name)
            assert node["metadata"]["labels"][keys.LOCK] == owner
            info = json.loads(node["metadata"]["annotations"][keys.LOCK_INFO])
            assert info["owner"] == owner
        assert json.loads((await kit.read_node("crash-1"))["metadata"]["annotations"][keys.LOCK_INFO])["since"] == first_since
        untouched = await kit.read_node("crash-4")
        assert keys.LOCK not in untouched["metadata"].get("labels", {})
        assert keys.LOCK_INFO not in untouched["metadata"].get("annotations", {})
        await asyncio.sleep(3)  # a resync later nothing moves
        assert await locked() == final and again.log_text().count("decision=lock") == 2
    finally:
        crashing.stop()
        again.stop()
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
        await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")


async def _holder_is(kit: Kit, identity: str) -> bool:
    return await lease_holder(kit) == identity


async def _log_has(agent: AgentProcess, text: str) -> bool:
    return text in agent.log_text()
