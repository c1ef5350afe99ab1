"""Issue 10, guard rails: what `Guaranteed` never evicts, which nodes are never locked nor counted in the cap's base,
the per-minute limit of evictions, and the ceiling of maxLockedNodePercent.

The views are built here from API JSON (not from tests/builders.py) so the nodes can carry conditions and labels and
the pods every kind of protection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent.planner.capacity import control_plane, schedulable
from agent.planner.guarantee import Witnesses, eviction_grace, never_evicted, protected_namespaces
from agent.planner.model import Lock, Snapshot
from agent.planner.plan import plan, plan_context
from agent.writer import EvictionBudget, eviction_body
from shared import keys
from shared.config import ConfigError, ReservoirConfig, load_config
from shared.keys import LockKind
from shared.ownership import JobRef
from shared.timestamps import stamp
from shared.views import NodeView, PodView, QueueView, ReservationView

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CONTROL_PLANE = {"node-role.kubernetes.io/control-plane": ""}
STARVING = "starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 100}\nmaxLockedNodePercent: 90\n"
GUARANTEED = "starvation: {enabled: false}\nmaxLockedNodePercent: 90\n"


def node(name: str, cpu: str = "4", *, labels: dict[str, str] | None = None, ready: str | None = "True",
         taints: list[dict[str, str]] | None = None, lock: Lock | None = None) -> NodeView:
    meta: dict[str, Any] = {"name": name, "uid": f"node-uid-{name}", "labels": dict(labels or {}), "annotations": {},
                            "creationTimestamp": stamp(NOW - timedelta(days=1))}
    spec: dict[str, Any] = {"taints": list(taints or [])}
    if lock is not None:
        spec["taints"].append({"key": keys.LOCK, "value": lock.owner, "effect": keys.LOCK_EFFECT})
        meta["labels"].update({keys.LOCK: lock.owner, keys.LOCK_KIND: lock.kind.value})
        meta["annotations"][keys.LOCK_INFO] = lock.info_json()
    status: dict[str, Any] = {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"}}
    if ready is not None:
        status["conditions"] = [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]
    return NodeView.from_obj({"metadata": meta, "spec": spec, "status": status})


def pod(name: str, cpu: str = "1", *, ns: str = "team", node_name: str = "", priority: int = 0,
        priority_class: str = "", annotations: dict[str, str] | None = None,
        owners: list[dict[str, Any]] | None = None, deleting: bool = False, labels: dict[str, str] | None = None,
        age: timedelta = timedelta(minutes=5), deleted_in: timedelta = timedelta(0), grace: int = 30) -> PodView:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
                            "annotations": dict(annotations or {}), "labels": dict(labels or {}),
                            "ownerReferences": list(owners or []), "creationTimestamp": stamp(NOW - age)}
    if deleting:
        meta["deletionTimestamp"] = stamp(NOW + deleted_in)
    status: dict[str, Any] = {"phase": "Running" if node_name else "Pending"}
    if node_name:
        status["startTime"] = stamp(NOW - age)
    spec: dict[str, Any] = {"nodeName": node_name, "priority": priority, "terminationGracePeriodSeconds": grace,
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return PodView.from_obj({"metadata": meta, "spec": spec, "status": status})


def snapshot(nodes: list[NodeView], pods: list[PodView], queues: list[QueueView] = (),
             reservations: list[ReservationView] = ()) -> Snapshot:
    return Snapshot(nodes={n.name: n for n in nodes}, pods=pods, queues={q.name: q for q in queues},
                    reservations={r.name: r for r in reservations}, daemonsets=DAEMONSETS)


def guaranteed_queue(cpu: str = "8") -> QueueView:
    return QueueView.from_obj({"metadata": {"name": "gold", "creationTimestamp": stamp(NOW - timedelta(days=1)),
                                            "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                               "spec": {"guarantee": {"resource": {"cpu": cpu}, "policy": "Guaranteed"}}})


# --- what `Guaranteed` never evicts ---

DAEMONSET = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "logs", "uid": "ds-1", "controller": True}]
DAEMONSETS = {("team", "logs"): "ds-1"}  # the DaemonSets that exist, with their uids
MIRROR = {"kubernetes.io/config.mirror": "abc"}


def node_owner(name: str, uid: str | None = None) -> list[dict[str, Any]]:
    """The ownerReference a kubelet writes on its mirror pods: its Node, by name and uid."""
    return [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid or f"node-uid-{name}", "controller": True}]


def test_a_guaranteed_queue_evicts_only_ordinary_pods_of_other_queues() -> None:
    # n1 is the only node that covers 8 cpu alone: the guarantee takes it, and whatever runs there is judged
    nodes = [node("n1", "8"), node("n2", "2"), node("n3", "2"), node("n4", "2")]
    on_n1 = [
        pod("plain", ns="team", node_name="n1"),
        pod("dns", ns="kube-system", node_name="n1"),
        pod("webhook", ns=keys.NAMESPACE, node_name="n1"),
        pod("agent", ns="ops-reservoir", node_name="n1"),  # the agent's own --namespace
        pod("vault", ns="secrets", node_name="n1"),  # listed in guarantee.protectedNamespaces
        pod("static", node_name="n1", annotations=MIRROR, owners=node_owner("n1")),
        pod("logs-x", node_name="n1", owners=DAEMONSET),
        # issue 29: claims a tenant can write, which nothing backs, are judged as any pod's
        pod("forged-mirror", node_name="n1", annotations=MIRROR),
        pod("mirror-of-n2", node_name="n1", annotations=MIRROR, owners=node_owner("n2")),
        pod("mirror-guessed-uid", node_name="n1", annotations=MIRROR, owners=node_owner("n1", "guess")),
        pod("no-such-daemonset", node_name="n1", owners=[{**DAEMONSET[0], "name": "gone"}]),
        pod("daemonset-uid-forged", node_name="n1", owners=[{**DAEMONSET[0], "uid": "ds-2"}]),
        pod("daemonset-not-controller", node_name="n1", owners=[{**DAEMONSET[0], "controller": False}]),
        pod("critical", node_name="n1", priority=2_000_000_000),
        pod("node-critical", node_name="n1", priority_class="system-node-critical"),
        pod("leaving", node_name="n1", deleting=True),
    ]
    config = load_config(GUARANTEED + "guarantee: {protectedNamespaces: [secrets]}").protecting("ops-reservoir")
    result = plan(snapshot(nodes, on_n1, [guaranteed_queue()]), config, NOW)
    (gold,) = result.guarantees
    assert gold.nodes == ("n1",) and set(result.locks) == {"n1"}
    assert gold.evict == ("team/daemonset-not-controller", "team/daemonset-uid-forged", "team/forged-mirror",
                          "team/mirror-guessed-uid", "team/mirror-of-n2", "team/no-such-daemonset", "team/plain")


def test_without_the_agents_namespace_in_the_config_its_pods_would_be_evictable() -> None:
    nodes = [node("n1", "8"), node("n2", "2"), node("n3", "2"), node("n4", "2")]
    pods = [pod("agent", ns="ops-reservoir", node_name="n1")]
    config = load_config(GUARANTEED)
    cluster = snapshot(nodes, pods, [guaranteed_queue()])
    assert plan(cluster, config, NOW).guarantees[0].evict == ("ops-reservoir/agent",)
    protected = config.protecting("ops-reservoir")
    assert plan(cluster, protected, NOW).guarantees[0].evict == ()
    assert protected.protecting("ops-reservoir") is protected, "adding a namespace twice changes nothing"


@pytest.mark.parametrize(("kw", "why"), [
    ({"ns": "kube-system"}, "namespace kube-system is protected"),
    ({"ns": keys.NAMESPACE}, f"namespace {keys.NAMESPACE} is protected"),
    ({"annotations": MIRROR, "owners": node_owner("n1")}, "mirror pod"),
    ({"annotations": MIRROR}, None),
    ({"annotations": MIRROR, "owners": node_owner("n1", "guess")}, None),
    ({"owners": DAEMONSET}, "DaemonSet pod"),
    ({"owners": [{**DAEMONSET[0], "uid": "ds-2"}]}, None),
    ({"owners": DAEMONSET, "ns": "other"}, None),
    ({"priority": 2_000_000_000}, "system-critical priority"),
    ({"priority": 2_000_001_000}, "system-critical priority"),
    ({"priority_class": "system-cluster-critical"}, "system-critical priority"),
    ({"deleting": True}, "being deleted already"),
    ({"deleting": True, "deleted_in": timedelta(minutes=5)}, "being deleted already"),
    # issue 29: a grace period of years (a container ignoring SIGTERM) spares nothing: evicted again, with less
    ({"deleting": True, "deleted_in": timedelta(minutes=5, seconds=1)}, None),
    ({"priority": 1_999_999_999}, None),
    ({"owners": [{"kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": True}]}, None),
])
def test_never_evicted_names_the_guard_rail(kw: dict[str, Any], why: str | None) -> None:
    witnesses = Witnesses.of(snapshot([node("n1")], []))
    assert never_evicted(pod("p", node_name="n1", **kw), protected_namespaces(ReservoirConfig()), witnesses,
                         NOW) == why


def test_an_eviction_gives_a_pod_its_own_grace_period_up_to_five_minutes() -> None:
    assert eviction_grace(pod("p", grace=0)) == 0 and eviction_grace(pod("p", grace=30)) == 30
    assert eviction_grace(pod("p", grace=2_000_000_000)) == 300
    assert eviction_body("ns", "p", 300)["deleteOptions"] == {"gracePeriodSeconds": 300}
    assert "deleteOptions" not in eviction_body("ns", "p")


# --- nodes never locked, and not in the cap's base ---

def test_node_readiness_is_read_from_the_ready_condition_and_the_lifecycle_taints() -> None:
    assert node("a").ready and node("b", ready=None).ready, "True, or no Ready condition reported yet"
    assert not node("c", ready="False").ready and not node("d", ready="Unknown").ready
    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    assert not node("e", taints=[unreachable]).ready
    assert not node("f", taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]).ready
    assert control_plane(node("g", labels=CONTROL_PLANE))
    assert control_plane(node("h", labels={"node-role.kubernetes.io/master": "true"}))
    assert not schedulable(node("g", labels=CONTROL_PLANE)) and not schedulable(node("c", ready="False"))
    assert schedulable(node("a"))


def test_control_plane_and_not_ready_nodes_are_never_locked_nor_counted_in_the_cap() -> None:
    # by name and idleness "cp" and "down" would come first; they are never candidates
    nodes = [node("cp", "16", labels=CONTROL_PLANE), node("down", "16", ready="False"), node("n1"), node("n2")]
    # n1 and n2 each run a small pod, so the big one fits on neither now: a lock is needed (never on cp or down)
    starving = [pod("big", "4", age=timedelta(minutes=5)), *(pod(f"small-{n}", "1", node_name=n) for n in ("n1", "n2"))]
    config = load_config(STARVING)
    context = plan_context(snapshot=snapshot(nodes, starving), config=config, now=NOW, current={}, previous=None)
    assert context.schedulable_nodes == 2 and context.budget == 1, "90% of the 2 eligible nodes, not of 4"
    result = plan(snapshot(nodes, starving), config, NOW)
    assert set(result.locks) == {"n1"}


def test_no_eligible_node_means_no_lock_at_all() -> None:
    nodes = [node("cp", "16", labels=CONTROL_PLANE), node("down", "16", ready="Unknown")]
    result = plan(snapshot(nodes, [pod("big", "4")]), load_config(STARVING), NOW)
    assert result.locks == {}


def test_a_lock_on_a_node_that_became_not_ready_or_control_plane_is_released() -> None:
    owner = JobRef("team", "Pod", "big").owner_id
    held = {name: Lock(node=name, owner=owner, kind=LockKind.JOB, subject="team/Pod/big", reason="starving",
                       since=NOW - timedelta(minutes=1), tasks=("team/big",)) for name in ("down", "cp", "n1")}
    nodes = [node("down", ready="False", lock=held["down"]), node("cp", labels=CONTROL_PLANE, lock=held["cp"]),
             node("n1", lock=held["n1"]), node("n2"), node("n3"), node("n4")]
    result = plan(snapshot(nodes, [pod("big", "4")]), load_config(STARVING), NOW)
    assert "down" not in result.locks and "cp" not in result.locks, "the writer releases what the plan leaves out"
    assert set(result.locks) == {"n1"}


def test_a_waiting_reservation_loses_its_drain_lock_when_its_node_goes_not_ready() -> None:
    reservation = ReservationView.from_obj({
        "metadata": {"name": "r1", "creationTimestamp": stamp(NOW - timedelta(minutes=10))},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "owner"}}}], "ttl": "0s", "preAllocation": True},
        "status": {"phase": "Waiting", "nodeName": "n1"}})
    config = load_config("starvation: {enabled: false}\nmaxLockedNodePercent: 50")
    full = [pod(f"run-{i}", node_name="n1") for i in range(4)]
    nodes = [node("n1"), node("n2")]
    assert set(plan(snapshot(nodes, full, reservations=[reservation]), config, NOW).locks) == {"n1"}
    nodes = [node("n1", ready="False"), node("n2"), node("n3")]
    result = plan(snapshot(nodes, full, reservations=[reservation]), config, NOW)
    assert "n1" not in result.locks
    assert any(n.startswith("policy=guard node=n1 decision=no-lock") and "NotReady" in n for n in result.notes)


# --- the ceiling of maxLockedNodePercent ---

def test_max_locked_node_percent_is_at_most_90_so_some_node_always_stays_unlocked() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config("maxLockedNodePercent: 100")
    assert "maxLockedNodePercent" in str(refused.value) and "less than or equal to 90" in str(refused.value)
    assert load_config("maxLockedNodePercent: 90").max_locked_node_percent == 90
    # the cap is floor(90 x schedulable nodes / 100): one node locks nothing, 2 lock 1, 10 lock 9
    config = load_config(STARVING)
    for count, budget in ((1, 0), (2, 1), (10, 9)):
        cluster = snapshot([node(f"n{i}") for i in range(count)], [])
        context = plan_context(snapshot=cluster, config=config, now=NOW, current={}, previous=None)
        assert (context.schedulable_nodes, context.budget) == (count, budget)
    # on one node nothing is locked, and the statuses say why
    starving = [pod(f"small-{i}", node_name="n1") for i in range(4)] + [pod("big", "4")]
    result = plan(snapshot([node("n1")], starving), config, NOW)
    assert result.locks == {} and [(job.subject, job.starving) for job in result.jobs] == [("team/Pod/big", True)]
    reservation = ReservationView.from_obj({
        "metadata": {"name": "r1", "creationTimestamp": stamp(NOW - timedelta(minutes=1))},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "owner"}}}]}})
    result = plan(snapshot([node("n1")], [], [guaranteed_queue("4")], [reservation]), load_config(GUARANTEED), NOW)
    assert result.locks == {}
    (placed,) = result.reservations  # a Reservation takes no lock to hold what it reserves (seed 003, placeholders)
    assert (placed.phase, placed.node) == ("Pending", "n1") and [p.node for p in result.placeholders] == ["n1"]
    (gold,) = result.guarantees
    assert gold.nodes == () and gold.reason == "needs 1 nodes, 0 left within maxLockedNodePercent"


# --- evictions per minute ---

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_eviction_budget_is_a_sliding_minute() -> None:
    clock = Clock()
    budget = EvictionBudget(3, clock=clock)
    for _ in range(3):
        assert budget.allows()
        budget.spend()
        clock.now += 10
    assert not budget.allows() and budget.retry_after() == pytest.approx(30), "the first leaves the window at 60 s"
    clock.now += 30
    assert budget.allows() and budget.retry_after() == 0
    budget.spend()
    assert not budget.allows() and budget.retry_after() == pytest.approx(10)
    budget.per_minute = 5  # a config edit takes effect on the next check
    assert budget.allows()


def test_an_eviction_limit_of_zero_evicts_nothing() -> None:
    budget = EvictionBudget(0, clock=Clock())
    assert not budget.allows() and budget.retry_after() == 60


# --- the config ---

def test_eviction_guard_rail_settings() -> None:
    config = load_config("")
    assert config.guarantee.max_evictions_per_minute == 10 and config.guarantee.protected_namespaces == []
    assert load_config("guarantee: {maxEvictionsPerMinute: 0}").guarantee.max_evictions_per_minute == 0
    with pytest.raises(ConfigError, match="guarantee.maxEvictionsPerMinute"):
        load_config("guarantee: {maxEvictionsPerMinute: -1}")
    with pytest.raises(ConfigError, match="guarantee.protectedNamespaces"):
        load_config("guarantee: {protectedNamespaces: kube-public}")
    assert protected_namespaces(config.protecting("ops")) == {"kube-system", keys.NAMESPACE, "ops"}
