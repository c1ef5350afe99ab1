"""Kueue on the real control plane: Kueue's own manager, built from the module version localcluster/versions.env pins,
with its CRDs, its webhooks and its certificate management (localcluster/kueue_process.py), against the local
control plane of either supported Kubernetes version."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER, LocalCluster
from localcluster.kueue_process import KueueManager
from shared import keys
from shared.ownership import JobRef
from tests.e2e.kit import Kit
from tests.e2e.kueue_scenarios import (
    LOCAL_QUEUE,
    condition,
    job_body,
    job_pods,
    kueue_queues,
    running_kueue,
    workloads,
)
from tests.e2e.scenarios import (
    STARVATION_CONFIG,
    STREAM_SECONDS,
    running_agent,
    scheduled_at,
    spare_node,
    stream_fills,
    stream_small_pods,
)


@pytest.fixture(scope="module")
def kueue(cluster: LocalCluster) -> Iterator[KueueManager]:
    """One Kueue manager for the module (waitForPodsReady off)."""
    with running_kueue(cluster) as manager:
        yield manager


@pytest.fixture
async def queues(kit: Kit, kueue: KueueManager) -> AsyncIterator[str]:
    """A ClusterQueue of 16 cpu and 64Gi for the test's namespace and a LocalQueue in it; yields the LocalQueue."""
    async with kueue_queues(kit, {"cpu": "16", "memory": "64Gi"}):
        yield LOCAL_QUEUE


async def test_kueue_admits_a_job_and_its_pods_name_their_workload(kit: Kit, queues: str) -> None:
    """Kueue's webhook suspends the Job at creation, its manager makes the Workload, admits it against the
    ClusterQueue's quota and lets the Job run: its pods name the Workload (the annotation Reservoir reads) and are
    placed by kube-scheduler."""
    await kit.create_node("kueue-node", {"cpu": "8", "memory": "32Gi"})
    job = await kit.raw("POST", f"/apis/batch/v1/namespaces/{kit.namespace}/jobs",
                        job_body("train", {"cpu": "1", "memory": "1Gi"}, 2, queue=queues))
    assert job["spec"]["suspend"] is True, "Kueue's webhook suspends a queued Job at creation"

    async def admitted() -> dict[str, Any] | None:
        return next((w for w in await workloads(kit) if condition(w, "Admitted")), None)

    workload = await kit.wait_for(admitted, what="the Job's Workload admitted", timeout=60)
    assert workload["status"]["admission"]["clusterQueue"].startswith("cq-")

    async def placed() -> list[dict[str, Any]] | None:
        pods = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
        return pods if len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = await kit.wait_for(placed, what="the Job's two pods placed", timeout=60)
    assert {p["metadata"]["annotations"].get(keys.KUEUE_WORKLOAD) for p in pods} == {workload["metadata"]["name"]}


# --- seed 000's story with a Kueue Job: Reservoir off, then on ---

KUEUE_STARVATION = STARVATION_CONFIG + "kueue: {workloads: true}\n"


@pytest.fixture
async def agent(kit: Kit) -> AsyncIterator[AgentProcess]:
    """The agent as its ServiceAccount, with deploy/components/kueue's RBAC and `kueue.workloads` on."""
    async with running_agent(kit, KUEUE_STARVATION, "deploy/components/kueue/rbac.yaml") as process:
        yield process


async def kueue_story(kit: Kit, queue: str) -> tuple[float, float, dict[str, Any]]:
    """Seed 000 with Kueue: small pods keep a 4-cpu node full; a Kueue Job of one 4-cpu pod is admitted at once (its
    ClusterQueue has quota) and its pod waits for the node. Returns (stream end, the big pod's bind time or inf, the
    Workload)."""
    await kit.create_node("starve-node", {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    stream = asyncio.create_task(stream_small_pods(kit, STREAM_SECONDS))
    await stream_fills(kit, stream, ["starve-node"], 4)  # the node is full of small pods
    await kit.raw("POST", f"/apis/batch/v1/namespaces/{kit.namespace}/jobs",
                  job_body("big", {"cpu": "4", "memory": "1Gi"}, 1, queue=queue))
    await stream
    stream_end = time.time()
    await asyncio.sleep(1)
    [workload] = await workloads(kit)
    [big] = await job_pods(kit, "big")
    bound = scheduled_at(big)
    return stream_end, bound if bound is not None else float("inf"), workload


async def test_without_reservoir_an_admitted_kueue_job_waits_for_the_stream_to_end(kit: Kit, queues: str) -> None:
    stream_end, big_bound, workload = await kueue_story(kit, queues)
    assert condition(workload, "Admitted")
    assert big_bound > stream_end - 1, "kube-scheduler alone leaves the admitted Job's pod waiting as the stream runs"


async def test_with_reservoir_the_admitted_kueue_job_gets_its_node_locked_for_its_workload(
        kit: Kit, queues: str, agent: AgentProcess) -> None:
    stream_end, big_bound, workload = await kueue_story(kit, queues)
    owner = JobRef(kit.namespace, "Job", "big")  # the Workload is found from its Job: the job keeps its name
    assert big_bound < stream_end - 5, f"the big pod bound at {big_bound}, the stream ended at {stream_end}:\n" \
                                       f"{agent.log_text()[-3000:]}"
    events = (await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=starve-node"))
    locked = [e["message"] for e in events["items"] if e["reason"] == "NodeLocked"]
    assert any(owner.full_name in message for message in locked), locked
    # its start estimate went where Kueue's users look: the Workload (kept once the job started)
    assert keys.EXPECTED_START in (workload["metadata"].get("annotations") or {}), workload["metadata"]


# --- backfill with Kueue Jobs: backfill's `queues` names the ClusterQueue ---

RUNNING = 40  # seconds the locked node's two pods declare (and run): the big Job's pod fits when they end


@pytest.fixture
async def backfilling(kit: Kit, queues: str) -> AsyncIterator[AgentProcess]:
    """The webhook and the agent as their ServiceAccounts with deploy/components/kueue's RBAC, `kueue.workloads` on
    and backfill open to the test's ClusterQueue alone (by its name: no namespace listed)."""
    [cluster_queue] = {q["spec"]["clusterQueue"] for q in (await kit.raw(
        "GET", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{kit.namespace}/localqueues"))["items"]}
    config = KUEUE_STARVATION + f"backfill: {{queues: [{cluster_queue}], margin: 5s}}\n"
    async with running_agent(kit, config, "deploy/components/kueue/rbac.yaml", webhook=True) as agent:
        yield agent


async def test_a_short_kueue_job_backfills_the_node_locked_for_a_starving_kueue_job(
        kit: Kit, backfilling: AgentProcess) -> None:
    """Seed 000's draining node (two pods running RUNNING s of its 3 cpu), locked for an admitted Kueue Job of one
    3-cpu pod; a second Kueue Job of one 500m pod that declares 10 s and opts into backfill, of the same ClusterQueue,
    is held on the gate by the webhook, narrowed by the agent to the locked node with activeDeadlineSeconds, and runs
    there while the node drains; the big Job's pod still binds once the two pods end."""
    await kit.create_node("bf-node", {"cpu": "3", "memory": "16Gi"})
    await spare_node(kit)
    for i in (2, 3):
        await kit.create_pod(f"pod-{i}", {"cpu": "1"}, extra_spec={"nodeName": "bf-node"},
                             annotations={keys.MAXIMUM_RUNTIME: f"{RUNNING}s", COMPLETE_AFTER: f"{RUNNING}s"})
    await kit.raw("POST", f"/apis/batch/v1/namespaces/{kit.namespace}/jobs",
                  job_body("big", {"cpu": "3", "memory": "1Gi"}, 1))

    async def locked() -> str | None:
        node = await kit.read_node("bf-node")
        return next((t.get("value") for t in node["spec"].get("taints") or [] if t["key"] == keys.LOCK), None)
    owner = await kit.wait_for(locked, what="bf-node locked for the big Job", timeout=30)
    assert owner == JobRef(kit.namespace, "Job", "big").owner_id

    async def room_noted() -> str | None:
        return (await kit.read_node("bf-node"))["metadata"].get("annotations", {}).get(keys.BACKFILL_ROOM)
    await kit.wait_for(room_noted, what="bf-node's backfill room noted by the agent", timeout=30)
    await asyncio.sleep(1)  # the webhook's node cache sees it (a watch event away)
    short = job_body("short", {"cpu": "500m", "memory": "1Gi"}, 1, runs="5s")
    short["spec"]["template"]["metadata"]["annotations"].update({keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10s"})
    await kit.raw("POST", f"/apis/batch/v1/namespaces/{kit.namespace}/jobs", short)

    async def backfilled() -> dict[str, Any] | None:
        pods = await job_pods(kit, "short")
        return pods[0] if pods and pods[0]["spec"].get("nodeName") else None
    try:
        pod = await kit.wait_for(backfilled, what="the short Job's pod backfilled", timeout=30)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{backfilling.log_text()[-4000:]}") from None
    assert pod["spec"]["nodeName"] == "bf-node" and pod["spec"].get("activeDeadlineSeconds") == 10, pod["spec"]
    assert any(t.get("value") == owner for t in pod["spec"].get("tolerations") or ()), pod["spec"]["tolerations"]

    async def big_bound() -> dict[str, Any] | None:
        pods = await job_pods(kit, "big")
        return pods[0] if pods and pods[0]["spec"].get("nodeName") else None
    big = await kit.wait_for(big_bound, what="the big Job's pod bound once the node drained", timeout=RUNNING + 30)
    assert big["spec"]["nodeName"] == "bf-node"
