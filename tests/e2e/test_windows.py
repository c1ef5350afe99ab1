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
from tests.e2e.kit import Kit, apply_setup
from tests.e2e.scenarios import SETUP, configure, scheduled_at, window_config

LABELS = {"business": "ebook"}


async def fill_and_queue(kit: Kit) -> None:
    for node in ("ebook-1", "ebook-2"):
        await kit.create_node(node, {"cpu": "4", "memory": "16Gi"}, labels=LABELS)
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
        if agent_on:
            agent.start()
        await fill_and_queue(kit)
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
            assert "window=ebook decision=release reason=2 reserve pods started (podNumToReserve 2)" in agent.log_text()
        else:
            assert ordinary[0] < reserve[0], f"without the agent ordinary pods {ordinary} came first, reserve {reserve}"
    finally:
        agent.stop()
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
