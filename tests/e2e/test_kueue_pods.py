"""Kueue's pod integration beside Reservoir's webhook, against Kueue's own manager (localcluster/kueue_process.py).

A plain pod labelled `kueue.x-k8s.io/queue-name` is a Kueue job of its own: Kueue's pod webhook gates it
(`kueue.x-k8s.io/admission`) and marks it managed at CREATE, its manager makes a Workload owned by the pod, admits it
and lifts the gate. Reservoir's pod webhook mutates the same pod at the same CREATE (tolerations for the locks the pod
owns). The API server calls mutating webhook configurations one after the other in the order of their names, so
with the release names Kueue's (`kueue-mutating-webhook-configuration`) comes first; a cluster may well name them
otherwise. Each story here is told in both orders (Reservoir's configuration registered under a name that sorts
after Kueue's, then before it): the pod carries both webhooks' marks and gets its node in each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.cluster import LocalCluster
from localcluster.kueue_process import MUTATING, KueueManager
from localcluster.webhook_process import CONFIG_NAME
from shared import keys
from shared.ownership import KUEUE_POD_GROUP, JobRef
from tests.e2e.kit import Kit
from tests.e2e.kueue_scenarios import LOCAL_QUEUE, condition, kueue_queues, running_kueue, workloads
from tests.e2e.scenarios import (
    STARVATION_CONFIG,
    STREAM_SECONDS,
    running_agent,
    scheduled_at,
    spare_node,
    stream_fills,
    stream_small_pods,
)

KUEUE_GATE = "kueue.x-k8s.io/admission"
KUEUE_MANAGED = "kueue.x-k8s.io/managed"
MUTATING_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
# a name that sorts before Kueue's, so that Reservoir's mutation runs first
RESERVOIR_FIRST = "0-reservoir"
assert RESERVOIR_FIRST < MUTATING < CONFIG_NAME


@pytest.fixture(scope="module")
def kueue(cluster: LocalCluster) -> Iterator[KueueManager]:
    """One Kueue manager for the module with its pod integration on (and batch/job, as a release has it)."""
    with running_kueue(cluster, frameworks=("batch/job", "pod")) as manager:
        yield manager


@pytest.fixture
async def queues(kit: Kit, kueue: KueueManager) -> AsyncIterator[str]:
    """A ClusterQueue of 16 cpu and 64Gi for the test's namespace and a LocalQueue in it; after, the namespace's pods
    are deleted while Kueue still runs (it takes its finalizer off the pods it manages)."""
    async with kueue_queues(kit, {"cpu": "16", "memory": "64Gi"}):
        try:
            yield LOCAL_QUEUE
        finally:
            await kit.attempt("DELETE", f"/api/v1/namespaces/{kit.namespace}/pods?gracePeriodSeconds=0")

            async def gone() -> bool:
                return not (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
            await kit.wait_for(gone, what="the test's pods gone (Kueue's finalizer lifted)", timeout=60)


async def reservoir_first(kit: Kit) -> None:
    """Reservoir's mutating configuration re-registered under RESERVOIR_FIRST (and the original removed)."""
    config = await kit.raw("GET", f"{MUTATING_CONFIGURATIONS}/{CONFIG_NAME}")
    config["metadata"] = {"name": RESERVOIR_FIRST}
    await kit.raw("POST", MUTATING_CONFIGURATIONS, config)
    await kit.raw("DELETE", f"{MUTATING_CONFIGURATIONS}/{CONFIG_NAME}")


@pytest.fixture(params=["kueue-first", "reservoir-first"])
async def reservoir(request: pytest.FixtureRequest, kit: Kit, queues: str) -> AsyncIterator[AgentProcess]:
    """Reservoir's webhook and agent as their ServiceAccounts with deploy/components/kueue's RBAC and `kueue.workloads`
    on; the webhook's mutating configuration named to run after Kueue's, or before it."""
    config = STARVATION_CONFIG + "kueue: {workloads: true}\n"
    async with running_agent(kit, config, "deploy/components/kueue/rbac.yaml", webhook=True) as agent:
        if request.param == "reservoir-first":
            await reservoir_first(kit)
        try:
            yield agent
        finally:
            await kit.attempt("DELETE", f"{MUTATING_CONFIGURATIONS}/{RESERVOIR_FIRST}")


def kueue_pod(kit: Kit, name: str, requests: dict[str, str]) -> dict[str, Any]:
    """A plain pod as a user of Kueue's pod integration writes it: the LocalQueue in its label."""
    return kit.pod_body(name, requests, labels={keys.KUEUE_QUEUE_NAME: LOCAL_QUEUE})


async def test_a_kueue_managed_pod_carries_both_webhooks_marks_and_gets_its_node_locked(
        kit: Kit, reservoir: AgentProcess) -> None:
    """Seed 000 with Kueue's pod integration: small pods keep a 4-cpu node full; a plain 4-cpu pod of the LocalQueue
    is created. At CREATE it gets Kueue's gate and managed label and Reservoir's toleration of its own job's lock,
    whichever webhook runs first; Kueue admits its Workload (owned by the pod) and lifts the gate; the pod starves,
    Reservoir locks the node for it (job Pod/big, found with its Workload by owner) and it binds while the stream
    still runs; its start estimate is on its Workload."""
    await kit.create_node("starve-node", {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    stream = asyncio.create_task(stream_small_pods(kit, STREAM_SECONDS))
    await stream_fills(kit, stream, ["starve-node"], 4)  # the node is full of small pods
    owner = JobRef(kit.namespace, "Pod", "big")
    created = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods",
                            kueue_pod(kit, "big", {"cpu": "4", "memory": "1Gi"}))
    gates = [g["name"] for g in created["spec"].get("schedulingGates") or ()]
    tolerations = created["spec"].get("tolerations") or ()
    assert KUEUE_GATE in gates, f"Kueue's webhook gated the pod: {gates}"
    assert created["metadata"]["labels"].get(KUEUE_MANAGED) == "true", created["metadata"]["labels"]
    assert any(t.get("key") == keys.LOCK and t.get("value") == owner.owner_id for t in tolerations), \
        f"Reservoir's webhook gave the pod its own lock's toleration: {tolerations}"
    await stream
    stream_end = time.time()
    await asyncio.sleep(1)
    big = await kit.read_pod("big")
    bound = scheduled_at(big)
    assert bound is not None and bound < stream_end - 5, \
        f"the big pod bound at {bound}, the stream ended at {stream_end}:\n{reservoir.log_text()[-3000:]}"
    assert big["spec"]["nodeName"] == "starve-node"
    events = await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=starve-node")
    locked = [e["message"] for e in events["items"] if e["reason"] == "NodeLocked"]
    assert any(owner.full_name in message for message in locked), locked
    [workload] = [w for w in await workloads(kit)
                  if any(r.get("kind") == "Pod" and r.get("name") == "big"
                         for r in w["metadata"].get("ownerReferences") or ())]
    assert condition(workload, "Admitted"), workload.get("status")
    assert keys.EXPECTED_START in (workload["metadata"].get("annotations") or {}), workload["metadata"]


PAIR_STREAM_EXTRA = 15  # seconds more of the stream for the pod group's story (two nodes to fill)


@pytest.mark.parametrize("reservoir", ["kueue-first"], indirect=True)
async def test_a_kueue_pod_group_is_one_job_and_gets_a_node_for_each_pod(kit: Kit, reservoir: AgentProcess) -> None:
    """A pod group of Kueue's pod integration (two 4-cpu pods labelled `kueue.x-k8s.io/pod-group-name: pair`, total
    count 2), created while small pods keep two 4-cpu nodes full: Kueue admits the group's one Workload, Reservoir
    locks both nodes for the one job `PodGroup.kueue.x-k8s.io/pair` (minMember 2, the Workload's count), and both
    pods bind while the stream still runs."""
    for name in ("node-a", "node-b"):
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    # two nodes to fill, where the other stories fill one: the stream runs PAIR_STREAM_EXTRA seconds longer, so the
    # pair's lock, the nodes' drain and the binds fit in it however long the filling took (CI once saw both pods bind
    # 3 s before a 30-s stream ended, inside the 5-s margin below)
    stream = asyncio.create_task(stream_small_pods(kit, STREAM_SECONDS + PAIR_STREAM_EXTRA, keep_pending=6))
    await stream_fills(kit, stream, ["node-a", "node-b"], 8)
    owner = JobRef(kit.namespace, KUEUE_POD_GROUP, "pair")
    for i in range(2):
        body = kueue_pod(kit, f"pair-{i}", {"cpu": "4", "memory": "1Gi"})
        body["metadata"]["labels"][keys.KUEUE_POD_GROUP_NAME] = "pair"
        body["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] = "2"
        created = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods", body)
        assert any(t.get("value") == owner.owner_id for t in created["spec"].get("tolerations") or ()), created["spec"]
    await stream
    stream_end = time.time()
    await asyncio.sleep(1)
    bound = {name: scheduled_at(await kit.read_pod(name)) for name in ("pair-0", "pair-1")}
    assert all(t is not None and t < stream_end - 5 for t in bound.values()), \
        f"bound at {bound}, the stream ended at {stream_end}:\n{reservoir.log_text()[-3000:]}"
    events = await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=reason=NodeLocked")
    locked = {e["involvedObject"]["name"] for e in events["items"] if owner.full_name in e["message"]}
    assert locked == {"node-a", "node-b"}, locked
    [workload] = await workloads(kit)
    assert workload["metadata"]["name"] == "pair" and condition(workload, "Admitted")
