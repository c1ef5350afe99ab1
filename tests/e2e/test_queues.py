"""Queues on the real control plane (seeds 001 and 002): a guarantee locks nodes that only its queue's pods land on
and writes status.reservation; removing it releases them; two queues competing for the cap are served in
QueueScoreOrder; a guarantee larger than the cluster is refused with a Warning Event; `Guaranteed` evicts other
pods through the Eviction API (a PodDisruptionBudget blocks one, reported); and a queue's PriorityClass makes
kube-scheduler preempt a lower queue's pod. The agent and the webhook run as their ServiceAccounts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.webhook_process import WebhookProcess
from shared import keys
from shared.ownership import queue_owner_id
from tests.e2e.kit import REPO, Kit, apply_setup, running_webhook
from tests.e2e.scenarios import QUEUE_CONFIG, SETUP, configure, locked_nodes

VOLCANO = f"/apis/{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"


@pytest.fixture
async def queues(kit: Kit) -> AsyncIterator[list[str]]:
    """Setup (CRDs, RBAC for both components) and the Queues a test creates, deleted afterwards."""
    await apply_setup(kit, *SETUP, "deploy/webhook-rbac.yaml")
    created: list[str] = []
    yield created
    for name in created:
        await kit.raw("DELETE", f"{VOLCANO}/queues/{name}")
    for name in ("reservoir-test-gold", "reservoir-test-bronze"):
        await kit.raw("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
    await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
    await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")


@pytest.fixture
async def webhook(kit: Kit, queues: list[str]) -> AsyncIterator[WebhookProcess]:
    async with running_webhook(kit) as process:
        yield process


async def apply_queue(kit: Kit, created: list[str], name: str, spec: dict) -> None:
    await kit.server_side_apply({"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
                                 "metadata": {"name": name}, "spec": spec})
    if name not in created:
        created.append(name)


async def priority_class(kit: Kit, name: str, value: int) -> None:
    await kit.server_side_apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                 "metadata": {"name": name}, "value": value})


async def wait_locks(kit: Kit, names: list[str], want: dict[str, int], timeout: float = 30) -> dict[str, str]:
    """Until the lock owners over `names` count as `want` (owner -> number of nodes)."""
    async def probe() -> list[dict[str, str]] | None:
        locks = await locked_nodes(kit, names)
        counts: dict[str, int] = {}
        for owner in locks.values():
            counts[owner] = counts.get(owner, 0) + 1
        return [locks] if counts == want else None  # a list, so that no locks at all still counts as found
    return (await kit.wait_for(probe, what=f"locks {want}", timeout=timeout))[0]


def reservoir(kit: Kit, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reservoir.cli", *args, f"--kubeconfig={kit.cluster.kubeconfig}"],
                          capture_output=True, text=True, cwd=REPO)


async def queue_events(kit: Kit, reason: str) -> list[dict]:
    events = await kit.raw("GET", f"/api/v1/namespaces/default/events?fieldSelector=reason={reason}")
    return events["items"]


async def test_guarantee_locks_nodes_for_its_queue_only_and_is_released_when_removed(
        kit: Kit, queues: list[str], webhook: WebhookProcess) -> None:
    await configure(kit, QUEUE_CONFIG)
    names = [f"gq-{i}" for i in range(1, 5)]
    for name in names:
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"})
    queue = f"gold-{kit.namespace[-5:]}"
    owner = queue_owner_id(queue)
    await apply_queue(kit, queues, queue, {"weight": 1, "guarantee": {"resource": {"cpu": "8"}}})
    agent = AgentProcess(kit.cluster)
    agent.start()
    try:
        locks = await wait_locks(kit, names, {owner: 2})
        async def status_written() -> dict | None:
            reservation = ((await kit.raw("GET", f"{VOLCANO}/queues/{queue}")).get("status") or {}).get("reservation")
            return reservation if reservation and sorted(reservation.get("nodes", [])) == sorted(locks) else None
        reservation = await kit.wait_for(status_written, what="Queue status.reservation", timeout=20)
        assert reservation["resource"]["cpu"] == "8", reservation

        # ten 1-cpu pods outside the queue: eight fill the two free nodes, two wait; the queue's pods take the rest
        for i in range(10):
            await kit.create_pod(f"other-{i}", {"cpu": "1"})
        for i in range(4):
            await kit.create_pod(f"mine-{i}", {"cpu": "2"}, annotations={keys.QUEUE_NAME: queue})
        async def placed() -> list[dict] | None:
            pods = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
            bound = [p for p in pods if p["spec"].get("nodeName")]
            return pods if len(bound) == 12 else None
        pods = await kit.wait_for(placed, what="eight other pods and four queue pods bound", timeout=40)
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if pod["metadata"]["name"].startswith("mine-"):
                assert node in locks, f"{pod['metadata']['name']} on {node}, not on the queue's nodes"
            elif node:
                assert node not in locks, f"{pod['metadata']['name']} (not in the queue) landed on locked {node}"
        assert sum(1 for p in pods if not p["spec"].get("nodeName")) == 2

        # the guarantee removed (apply without it): released, status cleared, without a restart
        await apply_queue(kit, queues, queue, {"weight": 1})
        await wait_locks(kit, names, {})
        async def status_cleared() -> bool:
            return not ((await kit.raw("GET", f"{VOLCANO}/queues/{queue}")).get("status") or {}).get("reservation")
        await kit.wait_for(status_cleared, what="status.reservation cleared", timeout=20)
        assert f"queue={queue} decision=status" in agent.log_text()
    finally:
        agent.stop()


async def test_two_queues_compete_for_the_cap_in_queue_score_order(kit: Kit, queues: list[str]) -> None:
    """maxLockedNodePercent 50 over four nodes leaves two lockable; both queues want two nodes' worth. gold has the
    higher PriorityClass, so the higher score: it wins, bronze gets nothing. A guarantee larger than the cluster
    (no webhook here to refuse it) is reported with a Warning Event and ignored."""
    await configure(kit, QUEUE_CONFIG.replace("maxLockedNodePercent: 90", "maxLockedNodePercent: 50"))
    names = [f"cq-{i}" for i in range(1, 5)]
    for name in names:
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"})
    await priority_class(kit, "reservoir-test-gold", 1000)
    suffix = kit.namespace[-5:]
    gold, bronze, huge = f"gold-{suffix}", f"bronze-{suffix}", f"huge-{suffix}"
    await apply_queue(kit, queues, bronze, {"weight": 1, "guarantee": {"resource": {"cpu": "8"}}})
    await apply_queue(kit, queues, gold, {"weight": 1, "priorityClassName": "reservoir-test-gold",
                                          "guarantee": {"resource": {"cpu": "8"}}})
    await apply_queue(kit, queues, huge, {"weight": 1, "guarantee": {"resource": {"cpu": "100"}}})
    agent = AgentProcess(kit.cluster)
    agent.start()
    try:
        await wait_locks(kit, names, {queue_owner_id(gold): 2})
        out = reservoir(kit, "status", "--queues", "-o", "json")
        assert out.returncode == 0, out.stderr
        order = [q["name"] for q in json.loads(out.stdout) if q["name"] in (gold, bronze, huge)]
        assert order[0] == gold, order
        table = reservoir(kit, "status", "--queues").stdout
        assert gold in table and "SCORE" in table
        assert f"queue={bronze} decision=no-lock" in agent.log_text()

        async def refused() -> list[dict]:
            return [e for e in await queue_events(kit, "GuaranteeRefused") if e["involvedObject"]["name"] == huge]
        events = await kit.wait_for(refused, what="a GuaranteeRefused Warning Event on the huge queue", timeout=20)
        assert events[0]["type"] == "Warning" and "more than the cluster" in events[0]["message"]
        assert len(await refused()) == 1, "reported once, not on every reconcile"
    finally:
        agent.stop()


async def test_guaranteed_policy_evicts_other_pods_and_respects_disruption_budgets(kit: Kit, queues: list[str]) -> None:
    await configure(kit, QUEUE_CONFIG)
    await kit.create_node("ev-1", {"cpu": "4", "memory": "16Gi"})
    await kit.create_pod("free", {"cpu": "1"}, labels={"app": "free"})
    await kit.create_pod("protected", {"cpu": "1"}, labels={"app": "protected"})
    for name in ("free", "protected"):
        await kit.wait_pod(name, lambda p: p.get("status", {}).get("phase") == "Running", "Running")
    await kit.raw("POST", f"/apis/policy/v1/namespaces/{kit.namespace}/poddisruptionbudgets", body={
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "protected"}}}})
    async def budget_counted() -> bool:
        pdb = await kit.raw("GET", f"/apis/policy/v1/namespaces/{kit.namespace}/poddisruptionbudgets/keep")
        return (pdb.get("status") or {}).get("currentHealthy") == 1
    await kit.wait_for(budget_counted, what="the PodDisruptionBudget observing its pod", timeout=30)
    queue = f"strict-{kit.namespace[-5:]}"
    await apply_queue(kit, queues, queue, {"weight": 1, "guarantee": {"policy": "Guaranteed", "resource": {"cpu": "4"}}})
    agent = AgentProcess(kit.cluster)
    agent.start()
    try:
        await wait_locks(kit, ["ev-1"], {queue_owner_id(queue): 1})
        async def free_gone() -> bool:
            pods = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
            return "free" not in {p["metadata"]["name"] for p in pods}
        await kit.wait_for(free_gone, what="the unprotected pod evicted", timeout=30)
        async def blocked() -> list[dict]:
            return [e for e in await queue_events(kit, "EvictionBlocked") if e["involvedObject"]["name"] == queue]
        events = await kit.wait_for(blocked, what="an EvictionBlocked Warning Event", timeout=30)
        assert f"{kit.namespace}/protected" in events[0]["message"]
        await asyncio.sleep(5)  # retried on every reconcile (resync 2s), reported once
        assert len(await blocked()) == 1 and agent.log_text().count(
            f"pod={kit.namespace}/protected decision=evict outcome=blocked") >= 2
        assert (await kit.read_pod("protected"))["status"]["phase"] == "Running", "the budget held"
        assert f"pod={kit.namespace}/free decision=evict outcome=evicted" in agent.log_text()
    finally:
        agent.stop()
        await kit.raw("DELETE", f"/apis/policy/v1/namespaces/{kit.namespace}/poddisruptionbudgets/keep")


async def test_queue_priority_class_lets_kube_scheduler_preempt_a_lower_queue(
        kit: Kit, queues: list[str], webhook: WebhookProcess) -> None:
    """Seed 001: pods take their queue's PriorityClass (the webhook); kube-scheduler's own preemption then puts
    the higher queue's pod in place of the lower one's."""
    await priority_class(kit, "reservoir-test-gold", 1000)
    await priority_class(kit, "reservoir-test-bronze", 10)
    suffix = kit.namespace[-5:]
    high, low = f"high-{suffix}", f"low-{suffix}"
    await apply_queue(kit, queues, high, {"weight": 1, "priorityClassName": "reservoir-test-gold"})
    await apply_queue(kit, queues, low, {"weight": 1, "priorityClassName": "reservoir-test-bronze"})
    await kit.create_node("pre-1", {"cpu": "4", "memory": "16Gi"})
    await kit.create_pod("low-pod", {"cpu": "4"}, annotations={keys.QUEUE_NAME: low})
    running = await kit.wait_pod("low-pod", lambda p: p.get("status", {}).get("phase") == "Running", "Running")
    assert running["spec"]["priorityClassName"] == "reservoir-test-bronze" and running["spec"]["priority"] == 10
    await kit.create_pod("high-pod", {"cpu": "4"}, annotations={keys.QUEUE_NAME: high})
    bound = await kit.wait_pod("high-pod", lambda p: p["spec"].get("nodeName") == "pre-1", "bound on pre-1",
                               timeout=60)
    assert bound["spec"]["priority"] == 1000
    pods = {p["metadata"]["name"] for p in (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]}
    assert "low-pod" not in pods, "preempted by kube-scheduler"
