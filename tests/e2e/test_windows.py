"""Seed 004's story on the real control plane: low-priority pods fill the nodes; a window opens (the config makes
it open within the minute, with startReserveAgo putting its lock at once); its nodes drain; reserve pods are bound
on them, ordinary pods are not; after podNumToReserve reserve pods the nodes are released. Without the agent the
ordinary pods, which came first, take the room."""

from __future__ import annotations

import asyncio

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER
from shared import keys
from shared.ownership import window_owner_id
from tests import logfmt
from tests.e2e.kit import Kit, apply_setup
from tests.e2e.scenarios import SETUP, configure, locked_nodes, scheduled_at, window_config

LABELS = {"business": "ebook"}


async def fill_and_queue(kit: Kit) -> None:
    for node in ("ebook-1", "ebook-2"):
        await kit.create_node(node, {"cpu": "4", "memory": "16Gi"}, labels=LABELS)
    # a third, unrelated node: maxLockedNodePercent (at most 90) of 3 schedulable nodes lets the window lock 2
    await kit.create_node("spare-1", {"cpu": "4", "memory": "16Gi"})
    for i in range(4):
        await kit.create_pod(f"filler-{i}", {"cpu": "2"}, annotations={COMPLETE_AFTER: "4s"},
                             extra_spec={"nodeSelector": LABELS})
    for i in range(4):
        await kit.wait_pod(f"filler-{i}", lambda p: p.get("status", {}).get("phase") == "Running", "Running")


async def create_contenders(kit: Kit) -> None:
    for i in range(4):
        await kit.create_pod(f"ordinary-{i}", {"cpu": "2"}, annotations={COMPLETE_AFTER: "3s"},
                             extra_spec={"nodeSelector": LABELS})
    await asyncio.sleep(1)
    for i in range(2):
        await kit.create_pod(f"reserve-{i}", {"cpu": "4"}, annotations={keys.RESERVEABLE: "true", COMPLETE_AFTER: "3s"},
                             extra_spec={"nodeSelector": LABELS})


async def bind_times(kit: Kit, prefix: str, count: int) -> list[float]:
    pods = [await kit.wait_pod(f"{prefix}-{i}", lambda p: scheduled_at(p) is not None, "bound", timeout=60)
            for i in range(count)]
    return sorted(scheduled_at(p) for p in pods)


@pytest.mark.parametrize("agent_on", [True, False], ids=["agent-on", "agent-off"])
async def test_window_reserves_nodes_for_reserve_pods(kit: Kit, agent_on: bool) -> None:
    await apply_setup(kit, *SETUP)
    await configure(kit, window_config())
    agent = AgentProcess(kit.cluster)
    try:
        # The agent starts once the fillers run: the window's lock is due at once, and an agent that sees the new
        # nodes first would lock them before kube-scheduler places a filler (kube-scheduler 1.30 retries a pod
        # only after its backoff; from 1.33 it takes pods out of backoff when it has nothing else to do).
        await fill_and_queue(kit)
        if agent_on:
            agent.start()
        owner = window_owner_id("ebook")
        if agent_on:
            async def both_locked() -> bool:
                nodes = [await kit.read_node(n) for n in ("ebook-1", "ebook-2")]
                return all(any(t["key"] == keys.LOCK and t["value"] == owner for t in n["spec"].get("taints") or [])
                           for n in nodes)
            await kit.wait_for(both_locked, what="both ebook nodes locked for the window", timeout=30)
        await create_contenders(kit)
        reserve = await bind_times(kit, "reserve", 2)
        ordinary = await bind_times(kit, "ordinary", 4)
        if agent_on:
            assert reserve[-1] <= ordinary[0], f"reserve pods {reserve} must be bound before ordinary pods {ordinary}"
            async def released() -> bool:
                nodes = [await kit.read_node(n) for n in ("ebook-1", "ebook-2")]
                return not any(t["key"] == keys.LOCK for n in nodes for t in n["spec"].get("taints") or [])
            await kit.wait_for(released, what="window released after podNumToReserve reserve pods", timeout=20)
            assert logfmt.find(agent.log_text(), policy="window", window="ebook", decision="release",
                               reason="2 reserve pods scheduled on its nodes (podNumToReserve 2)")
        else:
            assert ordinary[0] < reserve[0], f"without the agent ordinary pods {ordinary} came first, reserve {reserve}"
    finally:
        agent.stop()
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")


EBOOK_NODES = ["ebook-1", "ebook-2"]


async def bound(kit: Kit, name: str) -> dict:
    return await kit.wait_pod(name, lambda p: scheduled_at(p) is not None, "bound", timeout=30)


async def still_held(kit: Kit, owner: str, ordinary: str, why: str) -> None:
    """A few resyncs (2 s) later: both ebook nodes still locked for the window, the ordinary pod still unbound."""
    await asyncio.sleep(4)
    assert await locked_nodes(kit, EBOOK_NODES + ["video-1"]) == dict.fromkeys(EBOOK_NODES, owner), why
    assert scheduled_at(await kit.read_pod(ordinary)) is None, f"{why}: the ordinary pod must wait"


async def test_seed_story_reserve_pods_in_waves_keep_the_window_until_pod_num_to_reserve(kit: Kit) -> None:
    """Seed 004's story as the seed tells it (issue 11): reserve pods arrive in waves over the window and
    podNumToReserve (5) is larger than the first wave (2). The window's two nodes stay locked through the first and
    second waves (an ordinary pod waits), a reserve pod bound on an unrelated node changes nothing, and the fifth
    reserve pod scheduled on the window's nodes releases them (the ordinary pod is bound then). The fifth is a
    reserve pod only by its PodGroup's annotation (no webhook runs to copy it): the agent reads the PodGroup, gives
    the pod the window's toleration (repair) and counts it."""
    await apply_setup(kit, *SETUP)
    await configure(kit, window_config(pod_num_to_reserve=5))
    for name in EBOOK_NODES:
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"}, labels=LABELS)
    await kit.create_node("video-1", {"cpu": "4", "memory": "16Gi"}, labels={"business": "video"})
    owner = window_owner_id("ebook")
    agent = AgentProcess(kit.cluster)
    reserve = {keys.RESERVEABLE: "true", COMPLETE_AFTER: "3s"}
    try:
        agent.start()
        await kit.wait_for(lambda: locked_nodes(kit, EBOOK_NODES + ["video-1"]), what="the window's nodes locked",
                           timeout=30)
        assert await locked_nodes(kit, EBOOK_NODES + ["video-1"]) == dict.fromkeys(EBOOK_NODES, owner)
        await kit.create_pod("ordinary", {"cpu": "1"}, extra_spec={"nodeSelector": LABELS})
        await kit.custom.create_namespaced_custom_object(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, kit.namespace,
                                                         keys.PODGROUP_PLURAL, {
            "apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "PodGroup",
            "metadata": {"name": "report", "annotations": {keys.RESERVEABLE: "true"}}, "spec": {"minMember": 1}})

        # a reserve pod on an unrelated node: not the window's, changes nothing
        await kit.create_pod("elsewhere", {"cpu": "1"}, annotations={keys.RESERVEABLE: "true"},
                             extra_spec={"nodeSelector": {"business": "video"}})
        assert (await bound(kit, "elsewhere"))["spec"]["nodeName"] == "video-1"
        await still_held(kit, owner, "ordinary", "a reserve pod on an unrelated node released the window")

        waves = [["reserve-0", "reserve-1"], ["reserve-2", "reserve-3"], ["report-0"]]
        for number, wave in enumerate(waves, start=1):
            for name in wave:
                annotations = reserve if name.startswith("reserve") else {keys.GROUP_NAME: "report",
                                                                          COMPLETE_AFTER: "3s"}
                await kit.create_pod(name, {"cpu": "2"}, annotations=annotations, extra_spec={"nodeSelector": LABELS})
            for name in wave:
                assert (await bound(kit, name))["spec"]["nodeName"] in EBOOK_NODES
            if number < len(waves):
                await still_held(kit, owner, "ordinary", f"released after wave {number} of {len(waves)}")

        async def released() -> bool:
            return not await locked_nodes(kit, EBOOK_NODES)
        await kit.wait_for(released, what="the window released after the fifth reserve pod", timeout=20)
        assert logfmt.find(agent.log_text(), policy="window", window="ebook", decision="release",
                           reason="5 reserve pods scheduled on its nodes (podNumToReserve 5)")
        assert (await bound(kit, "ordinary"))["spec"]["nodeName"] in EBOOK_NODES
        await asyncio.sleep(4)  # a few resyncs later: released for good, not locked again
        assert await locked_nodes(kit, EBOOK_NODES + ["video-1"]) == {}
        assert len(logfmt.find(agent.log_text(), decision="lock")) == 2, agent.log_text()
    finally:
        agent.stop()
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
