"""Seed 000's story on the real control plane: one node, a stream of small pods keeps it full, a big pod needs
the whole node. Without the agent the big pod waits until the stream ends; with it, once the big pod has
starved past the threshold the node is locked, drains, and the big pod is bound while small pods wait."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

from agent.planner.starvation import task_record
from localcluster.agent_process import AgentProcess
from shared import keys
from shared.ownership import JobRef
from shared.timestamps import parse_time
from tests.e2e.kit import Kit
from tests.e2e.scenarios import (
    STARVATION_CONFIG,
    STREAM_SECONDS,
    locked_nodes,
    running_agent,
    scheduled_at,
    small_pods,
    stream_fills,
    stream_small_pods,
)


@pytest.fixture
async def agent(kit: Kit) -> AsyncIterator[AgentProcess]:
    async with running_agent(kit, STARVATION_CONFIG) as process:
        yield process


async def run_story(kit: Kit) -> tuple[float, float, dict, list[dict]]:
    """Returns (stream end, big pod bind time or inf, big pod, small pods)."""
    await kit.create_node("starve-node", {"cpu": "4", "memory": "16Gi"})
    # maxLockedNodePercent is at most 90 (floor): one node alone locks nothing, so a second, where no pod here fits
    await kit.create_node("spare", {"cpu": "100m", "memory": "1Gi"})
    stream = asyncio.create_task(stream_small_pods(kit, STREAM_SECONDS))
    await stream_fills(kit, stream, ["starve-node"], 4)  # the node is full of small pods
    await kit.create_pod("big", {"cpu": "4"})
    await stream
    stream_end = time.time()
    await asyncio.sleep(1)
    big = await kit.read_pod("big")
    small = await small_pods(kit)
    bound = scheduled_at(big)
    return stream_end, bound if bound is not None else float("inf"), big, small


async def test_without_the_agent_the_big_pod_waits_for_the_stream_to_end(kit: Kit) -> None:
    stream_end, big_bound, big, small = await run_story(kit)
    assert big_bound > stream_end - 1, "without the agent the big pod should starve while the stream lasts"
    assert sum(1 for p in small if scheduled_at(p)) >= 20, "the stream kept the node busy"


async def test_with_the_agent_the_node_is_locked_drained_and_given_to_the_big_pod(kit: Kit, agent: AgentProcess) -> None:
    stream_end, big_bound, big, small = await run_story(kit)
    if big_bound >= stream_end - 5:  # what the scheduler and the node saw, for whoever reads a failure
        node = await kit.read_node("starve-node")
        on_node = [(p["metadata"]["name"], p["status"].get("phase")) for p in small
                   if p["spec"].get("nodeName") == "starve-node" and p["status"].get("phase") == "Running"]
        detail = (f"big conditions {big['status'].get('conditions')}\nbig tolerations {big['spec'].get('tolerations')}\n"
                  f"node taints {node['spec'].get('taints')}\nrunning small pods {on_node}\n")
        raise AssertionError(f"big pod bound at {big_bound}, stream ended at {stream_end}:\n{detail}"
                             f"{agent.log_text()[-3000:]}")
    # repair gave the big pod the toleration for its job's lock (no webhook runs in this test)
    assert any(t.get("key") == keys.LOCK for t in big["spec"].get("tolerations", [])), big["spec"].get("tolerations")
    # small pods waiting when the node was locked for the big pod stayed pending until it was bound
    events = (await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=starve-node"))["items"]
    # this test's lock: a node's Events outlive the tests, and other stories lock a node of this name for a Pod/big
    locked_at = min(parse_time(e["firstTimestamp"]).timestamp() for e in events
                    if e["reason"] == "NodeLocked" and f" {kit.namespace}/Pod/big:" in e["message"])
    # (the lock lands within a second of the event; a pod bound in that second may have beaten the taint)
    waited = [p for p in small if parse_time(p["metadata"]["creationTimestamp"]).timestamp() < big_bound
              and (scheduled_at(p) or float("inf")) > locked_at + 1]
    early = [(p["metadata"]["name"], scheduled_at(p)) for p in waited if (scheduled_at(p) or float("inf")) < big_bound]
    assert waited, f"no small pod was pending while the node drained (locked {locked_at}, big bound {big_bound})"
    assert not early, f"small pods bound on the locked node before the big pod: {early}"
    # the job is ready now: its lock is released (small pods past the 3 s threshold may lock the node next)
    big_owner = JobRef(kit.namespace, "Pod", "big").owner_id

    async def released() -> bool:
        node = await kit.read_node("starve-node")
        return not any(t["key"] == keys.LOCK and t.get("value") == big_owner for t in node["spec"].get("taints") or [])
    await kit.wait_for(released, what="the big job's lock released once the big pod was bound", timeout=20)
    events = await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=starve-node")
    reasons = {e["reason"] for e in events["items"]}
    assert {"NodeLocked", "NodeReleased"} <= reasons, reasons


# --- issue 11, seed 000 as its users check it: kube-scheduler's predicate, and minMember - bound tasks ---

def zone_affinity(zone: str) -> dict:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": [zone]}]}]}}}}


async def fill(kit: Kit, node: str, count: int) -> None:
    """`count` pods of 1 cpu bound to `node` that run until the test ends: the node never drains by itself."""
    for i in range(count):
        await kit.create_pod(f"{node}-fill-{i}", {"cpu": "1"}, extra_spec={"nodeName": node})


async def held_for(kit: Kit, names: list[str], owner: str) -> dict[str, list[str]]:
    """The nodes of `names` locked for `owner`, with the tasks their lock-info names."""
    out = {}
    for name, value in (await locked_nodes(kit, names)).items():
        if value == owner:
            info = (await kit.read_node(name))["metadata"].get("annotations", {}).get(keys.LOCK_INFO, "{}")
            out[name] = json.loads(info).get("tasks", [])
    return out


async def steady(kit: Kit, names: list[str], owner: str, seconds: float) -> dict[str, list[str]]:
    """The locks for `owner` once they have stayed the same for `seconds` (several agent resyncs of 2 s)."""
    seen = await held_for(kit, names, owner)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = await held_for(kit, names, owner)
        assert now == seen, f"the locks changed from {seen} to {now}"
    return seen


async def test_seed_000_pod_requiring_a_zone_locks_only_nodes_of_that_zone(kit: Kit, agent: AgentProcess) -> None:
    """Issue 11: a pod that requires zone=a got a lock on a zone-b node. Here the zone-b nodes are the better ones by
    the seed's score (more idle; nothing on either ever ends): only a zone-a node may be locked."""
    names = ["zone-a-0", "zone-a-1", "zone-b-0", "zone-b-1"]
    for name in names:
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"}, labels={"zone": name.split("-")[1]})
    for name in names:
        await fill(kit, name, 2 if "-a-" in name else 1)
    await kit.create_pod("big", {"cpu": "4"}, extra_spec=zone_affinity("a"))
    owner = JobRef(kit.namespace, "Pod", "big").owner_id
    await kit.wait_for(lambda: held_for(kit, names, owner), what="a node locked for the zone-a pod", timeout=30)
    held = await steady(kit, names, owner, seconds=6)
    assert len(held) == 1 and set(held) <= {"zone-a-0", "zone-a-1"}, held
    assert held == {next(iter(held)): [f"{kit.namespace}/big"]}
    assert not await locked_nodes(kit, ["zone-b-0", "zone-b-1"]), "no zone-b node is locked, for anyone"


async def test_gang_of_min_member_3_with_8_pending_pods_gets_3_tasks_worth_of_locked_nodes(
        kit: Kit, agent: AgentProcess) -> None:
    """Issue 11: the seed's "reach ready" rule reserves minMember - bound tasks. Five nodes with one task's room each
    after a drain: 8 tasks never fit (no lock at all, before), 3 do."""
    names = [f"gang-{i}" for i in range(5)]
    for name in names:
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"})
        await fill(kit, name, 1)
    await kit.custom.create_namespaced_custom_object(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, kit.namespace,
                                                     keys.PODGROUP_PLURAL, {
        "apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "PodGroup",
        "metadata": {"name": "train"}, "spec": {"minMember": 3}})
    for i in range(8):
        await kit.create_pod(f"train-{i}", {"cpu": "4"}, annotations={keys.GROUP_NAME: "train"})
    owner = JobRef(kit.namespace, "PodGroup", "train").owner_id
    await kit.wait_for(lambda: held_for(kit, names, owner), what="nodes locked for the gang", timeout=30)
    held = await steady(kit, names, owner, seconds=6)
    assert len(held) == 3, held
    assert sorted(t for tasks in held.values() for t in tasks) == [f"{kit.namespace}/train-{i}" for i in range(3)]


# --- softDrain: before the threshold, kube-scheduler steers other pods off the node the big pod will fit on soonest ---

SOFT_DRAIN_CONFIG = """
starvation: {starvingJobTimeThreshold: 10m, reservedNodePercent: 100, softDrain: true}
maxLockedNodePercent: 90
resyncPeriod: 2s
debounce: 200ms
"""


async def drain_taints(kit: Kit, name: str) -> list[dict]:
    return [t for t in (await kit.read_node(name))["spec"].get("taints") or [] if t["key"] == keys.DRAIN]


async def test_soft_drain_marks_the_soonest_node_before_the_threshold_and_kube_scheduler_sends_pods_elsewhere(
        kit: Kit) -> None:
    """Two 4-cpu nodes, each running three 1-cpu pods: soft-a's declare 30 minutes, soft-b's 2. A 4-cpu pod fits on
    neither; long before its 10 minute threshold the agent marks soft-b (where it fits soonest) PreferNoSchedule and
    locks nothing. A 1-cpu pod then goes to soft-a, though both nodes have the same room; once the big pod is gone the
    mark goes."""
    for node, runtime in (("soft-a", "30m"), ("soft-b", "2m")):
        await kit.create_node(node, {"cpu": "4", "memory": "16Gi"})
        for i in range(3):
            await kit.create_pod(f"{node}-run-{i}", {"cpu": "1"}, annotations={"volcano.sh/maximum-runtime": runtime},
                                 extra_spec={"nodeName": node})
    async with running_agent(kit, SOFT_DRAIN_CONFIG) as agent:
        await kit.create_pod("big", {"cpu": "4"})
        owner = JobRef(kit.namespace, "Pod", "big").owner_id

        async def marked() -> list[dict]:
            return await drain_taints(kit, "soft-b")
        try:
            taints = await kit.wait_for(marked, what="soft-b marked for the big pod", timeout=30)
        except AssertionError:
            raise AssertionError(agent.log_text()[-3000:]) from None
        assert taints == [{"key": keys.DRAIN, "value": owner, "effect": keys.DRAIN_EFFECT}], taints
        assert await drain_taints(kit, "soft-a") == []
        assert await locked_nodes(kit, ["soft-a", "soft-b"]) == {}, "no lock before the threshold"
        await kit.create_pod("small", {"cpu": "1"})
        small = await kit.wait_pod("small", lambda p: bool(p["spec"].get("nodeName")), "small bound")
        assert small["spec"]["nodeName"] == "soft-a", "TaintToleration's score sent it off the marked node"
        assert (await kit.read_pod("big"))["spec"].get("nodeName") in (None, ""), "big fits nowhere yet"
        logged = agent.log_text()
        assert "decision=soft-drain" in logged and "nodes=soft-b " in logged, logged[-2000:]
        await kit.raw("DELETE", f"/api/v1/namespaces/{kit.namespace}/pods/big")

        async def unmarked() -> bool:
            return not await drain_taints(kit, "soft-b")
        await kit.wait_for(unmarked, what="soft-b's mark removed once the big pod is gone", timeout=30)


async def test_a_job_renamed_after_its_lock_expired_still_cools_down(kit: Kit) -> None:
    """A tenant whose lock outlived maxLockDuration rewrites its pending pod's group annotation: a new job id, as old
    as the pod, so starving at once. It used to lock again at once, a fresh maxLockDuration per rename; the cool-down
    record names the pod the lock reserved for, and the renamed job cools down too."""
    config = ("starvation: {starvingJobTimeThreshold: 2s, reservedNodePercent: 100, maxLockDuration: 4s, "
              "lockCooldown: 10m}\n")
    async with running_agent(kit, config) as process:
        await kit.create_node("cool-node", {"cpu": "4", "memory": "16Gi"})
        await kit.create_node("spare", {"cpu": "100m", "memory": "1Gi"})
        await kit.create_pod("filler", {"cpu": "3"}, extra_spec={"nodeName": "cool-node"})
        await kit.create_pod("big", {"cpu": "4"})
        owner = JobRef(kit.namespace, "Pod", "big").owner_id

        async def locked() -> bool:
            return await locked_nodes(kit, ["cool-node"]) == {"cool-node": owner}
        await kit.wait_for(locked, what="the big pod's lock", timeout=30)

        async def expired() -> str | None:
            node = await kit.read_node("cool-node")
            record = (node["metadata"].get("annotations") or {}).get(keys.LOCK_EXPIRED)
            return record if record and not await locked_nodes(kit, ["cool-node"]) else None
        record = json.loads(await kit.wait_for(expired, what="the lock expired, its cool-down recorded", timeout=30))
        assert set(record) == {owner, task_record(f"{kit.namespace}/big")}, record
        await kit.raw("PATCH", f"/api/v1/namespaces/{kit.namespace}/pods/big",
                      body={"metadata": {"annotations": {keys.GROUP_NAME: "big-again"}}},
                      content_type="application/merge-patch+json")

        async def cooling() -> bool:
            return any("decision=cool-down" in line and f"{kit.namespace}/PodGroup/big-again" in line
                       for line in process.log_text().splitlines())
        await kit.wait_for(cooling, what="the renamed job's cool-down in the agent's log", timeout=20)
        await asyncio.sleep(3)  # several plans (the threshold is 2 s: the renamed job is starving all along)
        relocked = [line for line in process.log_text().splitlines()
                    if "decision=lock " in line and f"{kit.namespace}/PodGroup/big-again" in line]
        assert not relocked and await locked_nodes(kit, ["cool-node"]) == {}, relocked or process.log_text()[-3000:]


async def test_a_group_name_no_podgroup_can_have_is_no_job_and_its_lock_is_written(kit: Kit) -> None:
    """A pod the webhook never judged (labelled reservoir.sh/ignore, or made while it was down) naming a PodGroup of
    262,100 characters (the API server bounds a pod's annotations at 256 KiB in all, not this one): the job's name went
    into its lock's lock-info annotation, past the API server's 256 KiB for a node's annotations, so every patch of
    the lock was refused while each plan planned it again, holding the starvation budget, never written, so never
    expired. A name no PodGroup can have names no job: the pod is its own, and its lock lands. (A controller
    reference of such a name did the same, until kube-controller-manager's garbage collector deleted the pod of an
    owner that does not exist.)"""
    config = "starvation: {starvingJobTimeThreshold: 2s, reservedNodePercent: 100, maxLockDuration: 10m}\n"
    async with running_agent(kit, config) as process:
        await kit.create_node("long-node", {"cpu": "4", "memory": "16Gi"})
        await kit.create_node("spare", {"cpu": "100m", "memory": "1Gi"})
        await kit.create_pod("filler", {"cpu": "3"}, extra_spec={"nodeName": "long-node"})
        await kit.create_pod("big", {"cpu": "4"}, labels={keys.IGNORE: "true"},
                             annotations={keys.GROUP_NAME: "g" * 262_100})
        owner = JobRef(kit.namespace, "Pod", "big").owner_id

        async def locked() -> bool:
            return await locked_nodes(kit, ["long-node"]) == {"long-node": owner}
        await kit.wait_for(locked, what="the lock of the pod, its own job", timeout=30)
        info = (await kit.read_node("long-node"))["metadata"]["annotations"][keys.LOCK_INFO]
        assert len(info) < 4096 and f"{kit.namespace}/Pod/big" in info
        assert "level=error" not in process.log_text(), process.log_text()[-3000:]
