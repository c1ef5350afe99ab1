"""Queues on the real control plane (seeds 001 and 002): a guarantee locks nothing until its Queue opts in
(`reservoir.sh/lock-guarantee: "true"`); then it locks nodes that only its queue's pods land on, writes
status.reservation and reports NodeLocked on the Queue; removing it releases them; two queues competing for the cap
are served in QueueScoreOrder; a pod of a guaranteed queue created without the webhook gets its queue's toleration
from the agent; a guarantee larger than the cluster is refused with a Warning Event; `Guaranteed` evicts other pods
through the Eviction API (a PodDisruptionBudget blocks one, reported) and its node takes no BestEffort pod of another
queue; and a queue's PriorityClass (or a PodGroup's own) makes kube-scheduler preempt a lower queue's pod. The agent
and the webhook run as their ServiceAccounts."""

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
from shared.tolerations import lock_toleration
from tests import logfmt
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


OPT_IN = {keys.QUEUE_LOCK_GUARANTEE: "true"}  # a guarantee locks nodes only for a Queue annotated so


async def apply_queue(kit: Kit, created: list[str], name: str, spec: dict,
                      annotations: dict[str, str] | None = None) -> None:
    await kit.server_side_apply({"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
                                 "metadata": {"name": name, "annotations": dict(annotations or {})}, "spec": spec})
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
    # as a Volcano cluster has it: a guarantee (Volcano's quota floor), no opt-in. Reservoir changes nothing for it.
    await apply_queue(kit, queues, queue, {"weight": 1, "guarantee": {"resource": {"cpu": "8"}}})
    agent = AgentProcess(kit.cluster)
    agent.start()
    try:
        async def left_alone() -> bool:
            return any(line["reason"].startswith("not locked")
                       for line in logfmt.find(agent.log_text(), queue=queue, decision="no-lock"))
        await kit.wait_for(left_alone, what="the agent leaving the guarantee alone, and saying so", timeout=30)
        assert await locked_nodes(kit, names) == {}
        assert not ((await kit.raw("GET", f"{VOLCANO}/queues/{queue}")).get("status") or {}).get("reservation")

        await apply_queue(kit, queues, queue, {"weight": 1, "guarantee": {"resource": {"cpu": "8"}}}, OPT_IN)
        locks = await wait_locks(kit, names, {owner: 2})
        async def status_written() -> dict | None:
            reservation = ((await kit.raw("GET", f"{VOLCANO}/queues/{queue}")).get("status") or {}).get("reservation")
            return reservation if reservation and sorted(reservation.get("nodes", [])) == sorted(locks) else None
        reservation = await kit.wait_for(status_written, what="Queue status.reservation", timeout=20)
        assert reservation["resource"]["cpu"] == "8", reservation
        async def reported() -> list[dict]:
            return [e for e in await queue_events(kit, "NodeLocked") if e["involvedObject"]["name"] == queue]
        events = await kit.wait_for(reported, what="NodeLocked Events on the Queue", timeout=20)
        assert events[0]["involvedObject"]["kind"] == "Queue" and events[0]["involvedObject"].get("uid")
        assert {e["message"].split()[1] for e in await reported()} == set(locks)

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
        await apply_queue(kit, queues, queue, {"weight": 1}, OPT_IN)
        await wait_locks(kit, names, {})
        async def status_cleared() -> bool:
            return not ((await kit.raw("GET", f"{VOLCANO}/queues/{queue}")).get("status") or {}).get("reservation")
        await kit.wait_for(status_cleared, what="status.reservation cleared", timeout=20)
        assert logfmt.find(agent.log_text(), queue=queue, decision="status")
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
    await apply_queue(kit, queues, bronze, {"weight": 1, "guarantee": {"resource": {"cpu": "8"}}}, OPT_IN)
    await apply_queue(kit, queues, gold, {"weight": 1, "priorityClassName": "reservoir-test-gold",
                                          "guarantee": {"resource": {"cpu": "8"}}}, OPT_IN)
    await apply_queue(kit, queues, huge, {"weight": 1, "guarantee": {"resource": {"cpu": "100"}}}, OPT_IN)
    agent = AgentProcess(kit.cluster)
    agent.start()
    try:
        gold_nodes = sorted(await wait_locks(kit, names, {queue_owner_id(gold): 2}))
        out = reservoir(kit, "status", "--queues", "-o", "json")
        assert out.returncode == 0, out.stderr
        order = [q["name"] for q in json.loads(out.stdout) if q["name"] in (gold, bronze, huge)]
        assert order[0] == gold, order
        table = reservoir(kit, "status", "--queues").stdout
        assert gold in table and "SCORE" in table
        assert logfmt.find(agent.log_text(), queue=bronze, decision="no-lock")

        async def refused() -> list[dict]:
            return [e for e in await queue_events(kit, "GuaranteeRefused") if e["involvedObject"]["name"] == huge]
        events = await kit.wait_for(refused, what="a GuaranteeRefused Warning Event on the huge queue", timeout=20)
        assert events[0]["type"] == "Warning" and "more than the cluster" in events[0]["message"]
        assert len(await refused()) == 1, "reported once, not on every reconcile"

        # no webhook runs here: a pod of gold, pinned to one of gold's nodes, has no toleration of its lock and waits;
        # the agent's repair adds its queue's toleration, and it lands there
        await kit.create_pod("gold-late", {"cpu": "1"}, annotations={keys.QUEUE_NAME: gold},
                             extra_spec={"nodeSelector": {"kubernetes.io/hostname": gold_nodes[0]}})
        bound = await kit.wait_pod("gold-late", lambda p: p["spec"].get("nodeName") == gold_nodes[0],
                                   f"repaired and bound on {gold_nodes[0]}", timeout=40)
        assert lock_toleration(queue_owner_id(gold)) in bound["spec"]["tolerations"]
        assert logfmt.find(agent.log_text(), pod=f"{kit.namespace}/gold-late", decision="repair")
    finally:
        agent.stop()


async def test_guaranteed_policy_evicts_other_pods_and_respects_disruption_budgets(
        kit: Kit, queues: list[str], webhook: WebhookProcess) -> None:
    """`Guaranteed` evicts the other pods of its node through the Eviction API (a PodDisruptionBudget holds one);
    the node carries the exclusive taint too, so a BestEffort pod of another queue, admitted by the webhook with its
    every-lock toleration, is kept off it and never evicted."""
    await configure(kit, QUEUE_CONFIG)
    await kit.create_node("ev-1", {"cpu": "4", "memory": "16Gi"})
    # maxLockedNodePercent is at most 90 (floor of 90% of the schedulable nodes): one lock needs a second node, one
    # no pod of this story fits on
    await kit.create_node("ev-spare", {"cpu": "100m", "memory": "1Gi"})
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
    strict = {"weight": 1, "guarantee": {"policy": "Guaranteed", "resource": {"cpu": "4"}}}
    await apply_queue(kit, queues, queue, strict, OPT_IN)
    agent = AgentProcess(kit.cluster)
    agent.start()
    try:
        await wait_locks(kit, ["ev-1"], {queue_owner_id(queue): 1})
        taints = {(t["key"], t["value"]) for t in (await kit.read_node("ev-1"))["spec"].get("taints") or []}
        assert (keys.LOCK_EXCLUSIVE, queue_owner_id(queue)) in taints, taints
        async def free_gone() -> bool:
            pods = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
            return "free" not in {p["metadata"]["name"] for p in pods}
        await kit.wait_for(free_gone, what="the unprotected pod evicted", timeout=30)
        async def blocked() -> list[dict]:
            return [e for e in await queue_events(kit, "EvictionBlocked") if e["involvedObject"]["name"] == queue]
        events = await kit.wait_for(blocked, what="an EvictionBlocked Warning Event", timeout=30)
        assert f"{kit.namespace}/protected" in events[0]["message"]
        await asyncio.sleep(5)  # retried on every reconcile (resync 2s), reported once
        assert len(await blocked()) == 1 and len(logfmt.find(
            agent.log_text(), pod=f"{kit.namespace}/protected", decision="evict", outcome="blocked")) >= 2
        assert (await kit.read_pod("protected"))["status"]["phase"] == "Running", "the budget held"
        assert logfmt.find(agent.log_text(), pod=f"{kit.namespace}/free", decision="evict", outcome="evicted")

        # a BestEffort pod of another queue, asking for that very node, is kept off it: it tolerates every lock but
        # not the exclusive taint (so no eviction brings it back again and again)
        await kit.create_pod("best-effort", extra_spec={"nodeSelector": {"kubernetes.io/hostname": "ev-1"}})
        def unschedulable(pod: dict) -> bool:
            return any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
                       for c in pod.get("status", {}).get("conditions") or [])
        waiting = await kit.wait_pod("best-effort", unschedulable, "Unschedulable", timeout=30)
        assert {"key": keys.LOCK, "operator": "Exists"} in waiting["spec"]["tolerations"], "admitted as BestEffort"
        assert keys.LOCK_EXCLUSIVE not in {t.get("key") for t in waiting["spec"]["tolerations"]}
        assert "untolerated taint" in (next(c for c in waiting["status"]["conditions"]
                                            if c["type"] == "PodScheduled").get("message") or "")
        assert not logfmt.find(agent.log_text(), pod=f"{kit.namespace}/best-effort", decision="evict")
    finally:
        agent.stop()
        await kit.raw("DELETE", f"/apis/policy/v1/namespaces/{kit.namespace}/poddisruptionbudgets/keep")


async def test_guaranteed_policy_believes_a_mirror_or_daemonset_claim_only_when_the_uid_backs_it(
        kit: Kit, queues: list[str], webhook: WebhookProcess) -> None:
    """Issue 29: the mirror annotation and a DaemonSet ownerReference are words any pod creator may write. On the
    node a `Guaranteed` queue locks, a DaemonSet's real pod (made by the DaemonSet controller) and a pod that names
    the node by its uid as a kubelet's mirror does are spared; a pod carrying only the mirror annotation is evicted
    like any other. (A DaemonSet reference with a made-up uid is the garbage collector's to delete, so it is judged
    in the unit tests, tests/unit/test_guard_rails.py.)"""
    await configure(kit, QUEUE_CONFIG)
    await kit.create_node("claims-1", {"cpu": "4", "memory": "16Gi"})
    await kit.create_node("claims-spare", {"cpu": "100m", "memory": "1Gi"})
    node_uid = (await kit.read_node("claims-1"))["metadata"]["uid"]
    daemonset = await kit.raw("POST", f"/apis/apps/v1/namespaces/{kit.namespace}/daemonsets", body={
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "logs"},
        "spec": {"selector": {"matchLabels": {"app": "logs"}}, "template": {
            "metadata": {"labels": {"app": "logs"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "claims-1"}, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.invalid/reservoir-test:1",
                                     "resources": {"requests": {"cpu": "100m"}}}]}}}})
    mirror = {"kubernetes.io/config.mirror": "static-hash"}
    on_node = {"nodeName": "claims-1"}
    await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods", body={
        **(body := kit.pod_body("as-kubelet", {"cpu": "100m"}, annotations=mirror, extra_spec=on_node)),
        "metadata": {**body["metadata"], "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "claims-1", "uid": node_uid, "controller": True}]}})
    await kit.create_pod("forged-mirror", {"cpu": "100m"}, annotations=mirror, extra_spec=on_node)

    async def daemon_pod() -> str | None:
        pods = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods?labelSelector=app%3Dlogs"))["items"]
        return next((p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") == "claims-1"
                     and p["metadata"]["ownerReferences"][0]["uid"] == daemonset["metadata"]["uid"]), None)
    made = await kit.wait_for(daemon_pod, what="the DaemonSet controller's pod on claims-1", timeout=30)
    queue = f"claims-{kit.namespace[-5:]}"
    await apply_queue(kit, queues, queue, {"weight": 1, "guarantee": {"policy": "Guaranteed",
                                                                      "resource": {"cpu": "3"}}}, OPT_IN)
    agent = AgentProcess(kit.cluster)
    agent.start()
    try:
        await wait_locks(kit, ["claims-1"], {queue_owner_id(queue): 1})

        async def forged_gone() -> bool:
            pods = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
            return "forged-mirror" not in {p["metadata"]["name"] for p in pods}
        await kit.wait_for(forged_gone, what="the pod with only the mirror annotation evicted", timeout=30)
        assert logfmt.find(agent.log_text(), pod=f"{kit.namespace}/forged-mirror", decision="evict",
                           outcome="evicted")
        await asyncio.sleep(4)  # two more reconciles (resync 2s): the spared pods stay spared
        for name in ("as-kubelet", made):
            assert (await kit.read_pod(name))["metadata"].get("deletionTimestamp") is None, name
            assert not logfmt.find(agent.log_text(), pod=f"{kit.namespace}/{name}", decision="evict"), name
    finally:
        agent.stop()
        await kit.raw("DELETE", f"/apis/apps/v1/namespaces/{kit.namespace}/daemonsets/logs")


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


async def test_a_podgroups_own_priority_class_comes_before_its_queues(
        kit: Kit, queues: list[str], webhook: WebhookProcess) -> None:
    """Seed 001 `cache.go` (issue 11): a PodGroup of class gold in a queue of class bronze gives its pods gold, with
    its value and preemption policy, and kube-apiserver's Priority plugin accepts them; a PodGroup of no class gives
    them the queue's."""
    await priority_class(kit, "reservoir-test-gold", 1000)
    await priority_class(kit, "reservoir-test-bronze", 10)
    low = f"low-{kit.namespace[-5:]}"
    await apply_queue(kit, queues, low, {"weight": 1, "priorityClassName": "reservoir-test-bronze"})
    groups = f"{VOLCANO}/namespaces/{kit.namespace}/podgroups"
    for name, spec in (("golden", {"priorityClassName": "reservoir-test-gold"}), ("plain", {})):
        created = await kit.raw("POST", groups, body={"apiVersion": keys.VOLCANO_API_VERSION, "kind": "PodGroup",
                                                      "metadata": {"name": name},
                                                      "spec": {"minMember": 1, "queue": low, **spec}})
        assert created.get("kind") == "PodGroup", created
    pods = f"/api/v1/namespaces/{kit.namespace}/pods"
    want = {"golden": ("reservoir-test-gold", 1000), "plain": ("reservoir-test-bronze", 10)}
    for group, (klass, value) in want.items():
        body = kit.pod_body(f"{group}-0", {"cpu": "1"}, annotations={keys.GROUP_NAME: group})

        # the webhook reads its caches: a dry-run create until it has seen the Queue and the PodGroup
        async def seen(body: dict = body, klass: str = klass) -> bool:
            return (await kit.raw("POST", pods + "?dryRun=All", body=body))["spec"].get("priorityClassName") == klass
        await kit.wait_for(seen, what=f"the webhook seeing PodGroup {group}", timeout=20)
        pod = await kit.raw("POST", pods, body=body)
        assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == (klass, value), pod["spec"]
        assert pod["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
