"""A gang job (Volcano PodGroup, minMember 2) starving behind a running pod: the agent locks the node for the
PodGroup, reports it on the PodGroup as well as on the node, and releases it once both pods are bound."""

from __future__ import annotations

import urllib.request

from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER, free_port
from shared import keys
from shared.ownership import JobRef
from tests.e2e.kit import Kit, apply_setup
from tests.e2e.scenarios import SETUP, STARVATION_CONFIG, configure, scheduled_at, spare_node


async def test_podgroup_gets_the_lock_and_the_events(kit: Kit) -> None:
    await apply_setup(kit, *SETUP)
    await configure(kit, STARVATION_CONFIG)
    agent = AgentProcess(kit.cluster, metrics_port=free_port())
    agent.start()

    def metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=2) as response:
            return response.read().decode()

    try:
        await kit.create_node("gang-node", {"cpu": "4", "memory": "16Gi"})
        await spare_node(kit)
        await kit.create_pod("hog", {"cpu": "3"}, annotations={COMPLETE_AFTER: "8s"})
        await kit.wait_pod("hog", lambda p: p.get("status", {}).get("phase") == "Running", "Running")
        await kit.custom.create_namespaced_custom_object(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, kit.namespace,
                                                         keys.PODGROUP_PLURAL, {
            "apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "PodGroup",
            "metadata": {"name": "gang"}, "spec": {"minMember": 2}})
        for i in range(2):
            await kit.create_pod(f"gang-{i}", {"cpu": "2"}, annotations={keys.GROUP_NAME: "gang"})
        owner = JobRef(kit.namespace, "PodGroup", "gang").owner_id

        async def locked() -> bool:
            node = await kit.read_node("gang-node")
            return any(t["key"] == keys.LOCK and t["value"] == owner for t in node["spec"].get("taints") or [])
        await kit.wait_for(locked, what="the node locked for the PodGroup", timeout=30)
        text = metrics()
        assert 'reservoir_locks{kind="job"} 1.0' in text and "reservoir_leader 1.0" in text, text
        assert "reservoir_starving_jobs 1.0" in text and "reservoir_reconcile_duration_seconds_count" in text
        info = (await kit.read_node("gang-node"))["metadata"]["annotations"][keys.LOCK_INFO]
        assert f'"subject":"{kit.namespace}/PodGroup/gang"' in info and f"{kit.namespace}/gang-0" in info

        for i in range(2):
            pod = await kit.wait_pod(f"gang-{i}", lambda p: scheduled_at(p) is not None, "bound", timeout=40)
            assert pod["spec"]["nodeName"] == "gang-node"

        async def released() -> bool:
            return not await locked()
        await kit.wait_for(released, what="the lock released once the gang is bound", timeout=20)
        assert 'reservoir_locks{kind="job"} 0.0' in metrics()
        events = await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/events?fieldSelector=involvedObject.kind=PodGroup")
        reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events["items"]}
        assert {("gang", "NodeLocked"), ("gang", "NodeReleased")} <= reasons, reasons
    finally:
        agent.stop()
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
