"""Backfill on the real control plane (issue 17): seed 000's draining node, locked for a starving big pod, lends its
idle cpu to a short pod that declares its runtime and opts in; the webhook holds it on the gate, the agent narrows it
to the node with the lock's toleration and activeDeadlineSeconds (accepted by the pod-locks check because of the
agent's grant on the node), lifts the gate, and the big pod still binds once the node has drained. A pod whose
runtime would cross the moment the node is needed is let go unchanged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER
from shared import keys
from shared.backfill import pinned_to, read_grants
from shared.ownership import JobRef
from tests.e2e.kit import Kit, apply_setup, running_webhook
from tests.e2e.scenarios import SETUP, STARVATION_CONFIG, configure, scheduled_at

BACKFILL_CONFIG = STARVATION_CONFIG + "backfill: {namespaces: ['*'], margin: 5s}\n"
NODE = "bf-node"
RUNNING = 40  # seconds the node's two running pods declare (and run): the big pod fits when they end


@pytest.fixture
async def running(kit: Kit) -> AsyncIterator[AgentProcess]:
    await apply_setup(kit, *SETUP, "deploy/webhook-rbac.yaml")
    await configure(kit, BACKFILL_CONFIG)
    agent = AgentProcess(kit.cluster)
    try:
        async with running_webhook(kit):
            agent.start()
            try:
                yield agent
            finally:
                agent.stop()
    finally:
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
        await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")


def opting_in(runtime: str, runs: str) -> dict[str, str]:
    return {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: runtime, COMPLETE_AFTER: runs}


async def webhook_gates(kit: Kit) -> None:
    """Wait until the webhook's caches have the config: a dry-run pod that opts in comes back gated."""
    async def probe() -> bool:
        body = kit.pod_body("probe", {"cpu": "1"}, annotations=opting_in("10s", "5s"))
        made = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods?dryRun=All", body=body)
        return any(g["name"] == keys.BACKFILL_GATE for g in made["spec"].get("schedulingGates") or [])
    await kit.wait_for(probe, what="the webhook holding pods that opt into backfill", timeout=20)


async def test_seed_000_a_short_pod_backfills_the_draining_node_and_the_big_pod_still_binds(
        kit: Kit, running: AgentProcess) -> None:
    await kit.create_node(NODE, {"cpu": "3", "memory": "16Gi"})
    await kit.create_node("spare", {"cpu": "100m", "memory": "1Gi"})  # one node alone locks nothing (90%)
    for i in (2, 3):  # seed 000 at Time2: pod-1 done, pod-2 and pod-3 running with their runtimes declared
        await kit.create_pod(f"pod-{i}", {"cpu": "1"}, extra_spec={"nodeName": NODE},
                             annotations={keys.MAXIMUM_RUNTIME: f"{RUNNING}s", COMPLETE_AFTER: f"{RUNNING}s"})
    await webhook_gates(kit)
    await kit.create_pod("pod-4", {"cpu": "3"})
    owner = JobRef(kit.namespace, "Pod", "pod-4").owner_id

    async def locked() -> bool:
        node = await kit.read_node(NODE)
        return any(t["key"] == keys.LOCK and t.get("value") == owner for t in node["spec"].get("taints") or [])
    await kit.wait_for(locked, what="the node locked for the starving pod-4", timeout=30)

    short = await kit.create_pod("short", {"cpu": "1"}, annotations=opting_in("10s", "8s"))
    assert any(g["name"] == keys.BACKFILL_GATE for g in short["spec"].get("schedulingGates") or []), short["spec"]
    long = await kit.create_pod("long", {"cpu": "1"}, annotations=opting_in("10m", "8s"))
    assert any(g["name"] == keys.BACKFILL_GATE for g in long["spec"].get("schedulingGates") or [])

    async def bound_short() -> dict | None:
        pod = await kit.read_pod("short")
        return pod if pod["spec"].get("nodeName") else None
    try:
        pod = await kit.wait_for(bound_short, what="the short pod bound on the locked node", timeout=20)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{running.log_text()[-3000:]}") from None
    spec = pod["spec"]
    assert spec["nodeName"] == NODE and spec["activeDeadlineSeconds"] == 10
    assert {"key": keys.LOCK, "operator": "Equal", "value": owner, "effect": "NoSchedule"} in spec["tolerations"]
    assert pinned_to(spec, NODE) and not spec.get("schedulingGates")
    grants = read_grants((await kit.read_node(NODE))["metadata"]["annotations"].get(keys.BACKFILL_GRANTS))
    assert grants[pod["metadata"]["uid"]].owner == owner, grants
    events = await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/events?fieldSelector=involvedObject.name=short")
    assert any(e["reason"] == "Backfilled" and NODE in e["message"] for e in events["items"]), json.dumps(events)

    async def released_long() -> dict | None:
        pod = await kit.read_pod("long")
        return pod if not pod["spec"].get("schedulingGates") else None
    long = await kit.wait_for(released_long, what="the long pod let go unchanged", timeout=20)
    assert not long["spec"].get("nodeName") and "activeDeadlineSeconds" not in long["spec"]
    # (the webhook gave it its own job's and queue's lock tolerations, as every pod; never pod-4's)
    assert not any(t.get("value") == owner for t in long["spec"].get("tolerations") or []), long["spec"]

    async def bound_big() -> dict | None:
        pod = await kit.read_pod("pod-4")
        return pod if pod["spec"].get("nodeName") else None
    big = await kit.wait_for(bound_big, what="pod-4 bound once the node drained", timeout=RUNNING + 30)
    assert big["spec"]["nodeName"] == NODE
    assert (scheduled_at(big) or 0) > (scheduled_at(pod) or 0)
