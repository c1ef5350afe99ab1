"""Seed 003, Reservations in the planner: placement by best fit over normalised shares, placeholders that hold only
the reserved resources, the owner's handover (claim, lock, shrink, narrow and ungate, bind), allocateOnce,
allocatePolicy, owners coming and going, preAllocation, expiry, node deletion, garbage collection, the caps.

A small `Cluster` plays what the writer and kube-scheduler make of each plan (locks on nodes, placeholder pods,
handover patches through the writer's own patch builders, statuses on the Reservations), so a test reads as the
sequence of reconciles a real cluster goes through. Time is an input."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from agent.planner.model import MAX_LOCK_TASKS, Lock, Plan, Snapshot, placeholder_name
from agent.planner.plan import plan
from agent.writer import narrow_patch, placeholder_pod, ungate_patch
from shared import keys
from shared.config import ReservoirConfig, load_config
from shared.jsonpatch import apply
from shared.ownership import reservation_owner_id
from shared.resources import Resources
from shared.timestamps import stamp
from shared.views import NodeView, PodView, ReservationView
from tests.builders import NOW, pod, spare_nodes

CONFIG = load_config("maxLockedNodePercent: 90\nstarvation: {enabled: false}\n"
                     "reservations: {gcGracePeriod: 1h, maxReservedPercent: 90}")
OWNERS = [{"labelSelector": {"matchLabels": {"app": "owner"}}}]


def node_obj(name: str, cpu: str = "4", memory: str = "16Gi", labels: dict | None = None,
             taints: list | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(labels or {}), "annotations": {},
                         "creationTimestamp": stamp(NOW - timedelta(days=1))},
            "spec": {"taints": list(taints or [])},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}}}


def pod_obj(name: str, cpu: str, *, memory: str = "1Gi", node_name: str = "", owner: bool = False,
            gated: bool = False, phase: str = "", age: timedelta = timedelta(minutes=1)) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    if node_name:
        spec["nodeName"] = node_name
    if gated:
        spec["schedulingGates"] = [{"name": keys.HANDOVER_GATE}]
    if owner:
        spec["tolerations"] = [{"key": keys.LOCK, "operator": "Equal", "value": reservation_owner_id("r1"),
                                "effect": "NoSchedule"}]
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": {"app": "owner"} if owner else {}, "creationTimestamp": stamp(NOW - age)},
            "spec": spec, "status": {"phase": phase or ("Running" if node_name else "Pending")}}


def reservation(name: str, cpu: str = "2", *, memory: str | None = None, owners: list | None = None,
                age: timedelta = timedelta(minutes=1), status: dict | None = None, **spec: Any) -> ReservationView:
    requests = {"cpu": cpu, **({"memory": memory} if memory else {})}
    template = {"spec": {"containers": [{"name": "r", "resources": {"requests": requests}}],
                         **spec.pop("template_spec", {})}}
    return ReservationView.from_obj({
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": stamp(NOW - age)},
        "spec": {"template": template, "owners": owners or OWNERS, **spec}, "status": status or {}})


@dataclass
class Cluster:
    """Nodes, pods and Reservations as raw objects; `reconcile` plans and then does what the writer would."""

    nodes: dict[str, dict[str, Any]]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    reservations: dict[str, ReservationView] = field(default_factory=dict)
    config: ReservoirConfig = CONFIG
    now: datetime = NOW
    last: Plan | None = None

    @classmethod
    def of(cls, *nodes: dict[str, Any], pods: tuple[dict[str, Any], ...] = (), spare: int = 1,
           reservations: tuple[ReservationView, ...] = (), config: ReservoirConfig = CONFIG) -> Cluster:
        extra_nodes, extra_pods = spare_nodes(spare)
        raw_nodes = {n["metadata"]["name"]: n for n in nodes}
        raw_nodes.update({n.name: node_obj(n.name, cpu="100m") for n in extra_nodes})
        cluster = cls(raw_nodes, config=config, reservations={r.name: r for r in reservations})
        for p in (*pods, *(pod_obj(p.name, "100m", node_name=p.node_name) for p in extra_pods)):
            cluster.add(p)
        return cluster

    def add(self, raw: dict[str, Any]) -> None:
        self.pods[f"{raw['metadata']['namespace']}/{raw['metadata']['name']}"] = raw

    def snapshot(self) -> Snapshot:
        return Snapshot(nodes={n: NodeView.from_obj(o) for n, o in self.nodes.items()},
                        pods=[PodView.from_obj(o) for o in self.pods.values()], reservations=dict(self.reservations))

    def plan(self) -> Plan:
        self.last = plan(self.snapshot(), self.config, self.now)
        return self.last

    def reconcile(self, *, bind: bool = True) -> Plan:
        """One plan, written: locks, placeholders (deleted, then created), handovers, statuses; then kube-scheduler
        binds each ungated pod narrowed to one node (`bind`)."""
        result = self.plan()
        for name, raw in self.nodes.items():
            self._lock(raw, result.locks.get(name))
        want = {p.name: p for p in result.placeholders}
        for key in [k for k, o in self.pods.items() if o["metadata"]["namespace"] == keys.NAMESPACE
                    and keys.PLACEHOLDER in o["metadata"].get("labels", {})]:
            if key.split("/")[1] not in want:
                del self.pods[key]
        for name, placeholder in want.items():
            if f"{keys.NAMESPACE}/{name}" not in self.pods:
                raw = placeholder_pod(placeholder, "pause")
                raw["metadata"]["uid"] = f"uid-{name}"
                raw["metadata"]["creationTimestamp"] = stamp(self.now)
                raw["status"] = {"phase": "Running"}
                self.add(raw)
        for handover in result.handovers:
            raw = self.pods[handover.key]
            if handover.node:
                raw = apply(raw, narrow_patch(raw, handover.node, handover.tolerate))
            self.pods[handover.key] = apply(raw, ungate_patch(raw))
        for status in result.reservations:
            r = self.reservations[status.name]
            if status.delete:
                del self.reservations[status.name]
            elif not status.final:
                self.reservations[status.name] = replace(r, phase=status.phase, node_name=status.node,
                                                         status=status.status())
        if bind:
            for raw in self.pods.values():
                self._schedule(raw)
        return result

    def _lock(self, raw: dict[str, Any], lock: Lock | None) -> None:
        meta, spec = raw["metadata"], raw["spec"]
        spec["taints"] = [t for t in spec.get("taints", []) if t["key"] not in keys.LOCK_TAINT_KEYS]
        for k in (keys.LOCK, keys.LOCK_KIND):
            meta["labels"].pop(k, None)
        meta["annotations"].pop(keys.LOCK_INFO, None)
        if lock is not None:
            spec["taints"].append({"key": keys.LOCK, "value": lock.owner, "effect": "NoSchedule"})
            meta["labels"].update({keys.LOCK: lock.owner, keys.LOCK_KIND: lock.kind.value})
            meta["annotations"][keys.LOCK_INFO] = lock.info_json()

    def _schedule(self, raw: dict[str, Any]) -> None:
        """kube-scheduler, as far as these tests need: an ungated pending pod narrowed to one node by matchFields is
        bound there."""
        spec = raw["spec"]
        if spec.get("nodeName") or spec.get("schedulingGates"):
            return
        terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
        names = {v for t in terms for f in t.get("matchFields", []) for v in f["values"]}
        if len(names) == 1:
            spec["nodeName"] = names.pop()
            raw["status"]["phase"] = "Running"

    def status(self, name: str):
        assert self.last is not None
        return next(s for s in self.last.reservations if s.name == name)

    def placeholders(self) -> dict[str, dict[str, str]]:
        """placeholder pod name -> its requests, as they stand."""
        return {o["metadata"]["name"]: o["spec"]["containers"][0]["resources"]["requests"]
                for o in self.pods.values() if keys.PLACEHOLDER in o["metadata"].get("labels", {})}


def test_placed_by_best_fit_over_normalised_shares_and_held_by_a_placeholder_not_a_lock() -> None:
    # raw sums would pick "wide" (its idle bytes are few); as shares of each node, "deep" is the tighter fit
    deep = node_obj("deep", cpu="4", memory="64Gi")   # after: cpu 2/4, memory 63/64 -> 0.74
    wide = node_obj("wide", cpu="16", memory="8Gi")   # after: cpu 14/16, memory 7/8 -> 0.875
    cluster = Cluster.of(deep, wide, reservations=(reservation("r1", "2", memory="1Gi"),))
    first = cluster.reconcile()
    assert cluster.status("r1").node == "deep" and cluster.status("r1").phase == "Pending"
    assert first.locks == {} and [p.node for p in first.placeholders] == ["deep"]
    assert cluster.placeholders() == {placeholder_name(reservation_owner_id("r1"), Resources.parse(
        {"cpu": "2", "memory": "1Gi"})): {"cpu": "2", "memory": "1Gi"}}
    cluster.reconcile()
    status = cluster.status("r1")
    assert status.phase == "Available" and status.reason == "Available"
    assert status.status()["allocatable"] == {"cpu": "2", "memory": "1Gi"}, "no `pods` in status.allocatable"
    conditions = {c["type"]: c for c in status.conditions}
    assert conditions["Scheduled"]["status"] == "True" and conditions["Ready"]["status"] == "True"
    assert cluster.plan().locks == {} and len(cluster.placeholders()) == 1, "steady: nothing more to do"


def test_several_reservations_share_a_node_and_do_not_count_as_locked_nodes() -> None:
    half = load_config("maxLockedNodePercent: 50\nstarvation: {enabled: false}\nreservations: {maxReservedPercent: 90}")
    cluster = Cluster.of(node_obj("n1", cpu="8"), spare=0,
                         reservations=(reservation("a", "3", age=timedelta(minutes=2)), reservation("b", "3")),
                         config=half)
    cluster.reconcile()
    cluster.reconcile()
    assert {cluster.status(n).phase for n in ("a", "b")} == {"Available"}
    assert {cluster.status(n).node for n in ("a", "b")} == {"n1"}
    assert sorted(r["cpu"] for r in cluster.placeholders().values()) == ["3", "3"]
    # a third does not fit beside them (8 - 6 = 2 cpu left): Pending, Unschedulable
    cluster.reservations["c"] = reservation("c", "3")
    cluster.reconcile()
    assert cluster.status("c").phase == "Pending" and cluster.status("c").reason == "Unschedulable"


def test_a_template_with_only_match_fields_is_placed_on_that_node() -> None:
    only = reservation("r1", template_spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}})
    cluster = Cluster.of(node_obj("a"), node_obj("b", cpu="8"), reservations=(only,))
    cluster.reconcile()
    assert cluster.status("r1").node == "b"


def test_template_constraints_are_honoured() -> None:
    by_selector = reservation("sel", template_spec={"nodeSelector": {"zone": "b"}})
    named = reservation("named", template_spec={"nodeName": "zzz"})
    gpu = {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}], "labels": {"zone": "t"}}
    tolerant = reservation("tolerant", template_spec={"nodeSelector": {"zone": "t"},
                                                      "tolerations": [{"key": "gpu", "operator": "Exists"}]})
    intolerant = reservation("intolerant", template_spec={"nodeSelector": {"zone": "t"}})
    cluster = Cluster.of(node_obj("a", labels={"zone": "a"}), node_obj("b", labels={"zone": "b"}),
                         node_obj("t", cpu="8", **gpu), reservations=(by_selector, named, tolerant, intolerant))
    cluster.reconcile()
    assert cluster.status("sel").node == "b" and cluster.status("tolerant").node == "t"
    for name in ("named", "intolerant"):
        assert (cluster.status(name).phase, cluster.status(name).reason) == ("Pending", "Unschedulable")


def test_an_owner_is_handed_over_under_a_brief_lock_and_allocate_once_succeeds() -> None:
    cluster = Cluster.of(node_obj("n1"), reservations=(reservation("r1", "3"),))
    cluster.reconcile()
    cluster.reconcile()
    assert cluster.status("r1").phase == "Available"
    cluster.add(pod_obj("owner", "3", owner=True, gated=True))
    claim = cluster.reconcile()
    # the claim: recorded as current owner, the node locked for the Reservation's owners; the placeholder stands
    assert [p.name for p in cluster.status("r1").owners] == ["owner"]
    assert claim.locks["n1"].owner == reservation_owner_id("r1") and claim.locks["n1"].tasks == ("ns/owner",)
    assert claim.handovers == [] and list(cluster.placeholders().values()) == [{"cpu": "3"}]
    # the lock is on the node: the placeholder goes, the pod is narrowed to n1 and let go; kube-scheduler binds it
    handover = cluster.reconcile()
    assert [(h.key, h.node) for h in handover.handovers] == [("ns/owner", "n1")]
    assert cluster.placeholders() == {} and "n1" in handover.locks
    owner = cluster.pods["ns/owner"]
    assert owner["spec"]["nodeName"] == "n1" and not owner["spec"]["schedulingGates"]
    assert {"key": keys.LOCK, "operator": "Equal", "value": reservation_owner_id("r1"),
            "effect": "NoSchedule"} in owner["spec"]["tolerations"]
    done = cluster.reconcile()
    status = cluster.status("r1")
    assert status.phase == "Succeeded" and status.reason == "Succeeded" and done.locks == {}
    assert status.status()["allocated"] == {"cpu": "3"} and status.annotate == ("ns/owner",)
    assert cluster.plan().placeholders == []


def test_a_handover_lock_names_at_most_max_lock_tasks_owners_and_its_reason_a_few() -> None:
    """Owners of the longest names, 300 in flight at once (allocateOnce false, kube-scheduler slow to bind): the lock
    names MAX_LOCK_TASKS of them and its reason five, so its annotation stays small however many owners a selector
    matches (all 300 named twice would be 153 KiB of a node's 256 KiB of annotations)."""
    cluster = Cluster.of(node_obj("n1", cpu="400", memory="4000Gi"),
                         reservations=(reservation("r1", "300", allocateOnce=False),))
    cluster.nodes["n1"]["status"]["allocatable"]["pods"] = "1000"
    cluster.reconcile()
    cluster.reconcile()
    names = [f"{'o' * 248}-{i:04}" for i in range(300)]
    for name in names:
        cluster.add(pod_obj(name, "1", owner=True, gated=True))
    locks = [cluster.reconcile(bind=False).locks.get("n1") for _ in range(4)]
    widest = max((lock for lock in locks if lock is not None), key=lambda lock: len(lock.tasks))
    assert len(widest.tasks) == MAX_LOCK_TASKS and set(widest.tasks) <= {f"ns/{n}" for n in names}
    assert widest.reason.endswith(" and 295 more") and widest.reason.count("ns/") == 5
    assert len(widest.info_json()) < 100 * 1024


def test_an_owner_running_on_the_node_before_does_not_use_the_reservation_up() -> None:
    before = pod_obj("early", "1", owner=True, node_name="n1")
    cluster = Cluster.of(node_obj("n1", cpu="8"), pods=(before,),
                         reservations=(reservation("r1", "3", template_spec={"nodeName": "n1"}),))
    for _ in range(3):
        cluster.reconcile()
    status = cluster.status("r1")
    assert status.phase == "Available" and status.owners == () and status.allocated == Resources()
    assert list(cluster.placeholders().values()) == [{"cpu": "3"}]


def test_allocate_once_false_owners_come_and_go_and_the_placeholder_follows() -> None:
    cluster = Cluster.of(node_obj("n1", cpu="8"), reservations=(reservation("r1", "3", allocateOnce=False),))
    cluster.reconcile()
    cluster.reconcile()
    sizes = []
    for i in range(3):
        cluster.add(pod_obj(f"o{i}", "1", owner=True, gated=True))
        for _ in range(3):
            cluster.reconcile()
        assert cluster.pods[f"ns/o{i}"]["spec"]["nodeName"] == "n1"
        sizes.append(sorted(r["cpu"] for r in cluster.placeholders().values()))
        assert cluster.status("r1").phase == "Available"
    assert sizes == [["2"], ["1"], []], "each owner takes one cpu of the three"
    assert cluster.last is not None and cluster.last.locks == {}, "no lock once no owner is in flight"
    assert cluster.status("r1").status()["allocated"] == {"cpu": "3"}
    # owners end: what they held goes back to the placeholder; a new one at once (nothing is deleted) ...
    cluster.pods["ns/o0"]["status"]["phase"] = "Succeeded"
    regrown = cluster.reconcile()
    assert regrown.locks == {} and list(cluster.placeholders().values()) == [{"cpu": "1"}]
    assert [p.name for p in cluster.status("r1").owners] == ["o1", "o2"]
    # ... a bigger one in place of one that stands only under the lock, so no pod slips in between
    cluster.pods["ns/o1"]["status"]["phase"] = "Succeeded"
    resize = cluster.reconcile()
    assert "n1" in resize.locks and list(cluster.placeholders().values()) == [{"cpu": "1"}], "the lock first"
    cluster.reconcile()
    assert list(cluster.placeholders().values()) == [{"cpu": "2"}]
    assert cluster.reconcile().locks == {} and cluster.status("r1").phase == "Available"


def test_restricted_lets_an_owner_larger_than_the_reservation_go_default_lets_it_take_the_rest_from_the_node() -> None:
    for policy, handed in (("Restricted", False), ("Default", True), ("Aligned", True)):
        cluster = Cluster.of(node_obj("n1", cpu="8"), reservations=(reservation("r1", "3", allocatePolicy=policy),))
        cluster.reconcile()
        cluster.reconcile()
        cluster.add(pod_obj("big", "4", owner=True, gated=True))
        first = cluster.reconcile(bind=False)
        if handed:
            assert [p.name for p in cluster.status("r1").owners] == ["big"], policy
            cluster.reconcile()
            assert cluster.pods["ns/big"]["spec"]["nodeName"] == "n1", policy
            cluster.reconcile()
            assert cluster.status("r1").status()["allocated"] == {"cpu": "3"}, "at most allocatable"
        else:
            assert [(h.key, h.node) for h in first.handovers] == [("ns/big", "")], "ungated, scheduled as usual"
            assert not cluster.pods["ns/big"]["spec"].get("schedulingGates") and cluster.status("r1").owners == ()


def test_most_allocated_picks_among_reservations_and_a_pod_no_reservation_can_take_is_ungated() -> None:
    cluster = Cluster.of(node_obj("n1"), node_obj("n2"), spare=2,
                         reservations=(reservation("r1", "4", template_spec={"nodeName": "n1"}),
                                       reservation("r2", "2", template_spec={"nodeName": "n2"})))
    cluster.reconcile()
    cluster.reconcile()
    cluster.add(pod_obj("o", "2", owner=True, gated=True))
    cluster.add(pod_obj("stranger", "1", gated=True))  # a tenant's own copy of the gate: let go at once
    first = cluster.reconcile()
    assert [p.name for p in cluster.status("r2").owners] == ["o"], "2 of 2 beats 2 of 4"
    assert [(h.key, h.node) for h in first.handovers] == [("ns/stranger", "")]


def test_a_handover_waits_while_the_node_is_locked_for_another_owner() -> None:
    job_lock = Lock(node="n1", owner="job-x-abcdef", kind=keys.LockKind.JOB, subject="job", reason="starving",
                    since=NOW - timedelta(minutes=1))
    cluster = Cluster.of(node_obj("n1", cpu="8"), reservations=(reservation("r1", "3"),))
    cluster.reconcile()
    cluster.reconcile()
    cluster._lock(cluster.nodes["n1"], job_lock)
    cluster.add(pod_obj("o", "1", owner=True, gated=True))
    result = cluster.plan()
    assert result.handovers == [], "neither handed over nor let go: its gate stays"
    assert "n1" not in result.locks or result.locks["n1"].owner != reservation_owner_id("r1"), "no lock for r1"
    assert [s.owners for s in result.reservations if s.name == "r1"] == [()], "not claimed while it waits"
    # the other owner's lock gone, the handover goes on: r1 claims the pod and locks n1 for it, then hands it over
    cluster.reconcile(bind=False)
    claimed = cluster.reconcile(bind=False)
    assert [p.name for p in cluster.status("r1").owners] == ["o"]
    assert claimed.locks["n1"].owner == reservation_owner_id("r1")
    assert [(h.key, h.node) for h in cluster.reconcile(bind=False).handovers] == [("ns/o", "n1")]


def test_a_placeholder_deleted_by_hand_comes_back_and_a_full_node_is_drained_for_it() -> None:
    cluster = Cluster.of(node_obj("n1"), reservations=(reservation("r1", "3"),))
    cluster.reconcile()
    cluster.reconcile()
    (name,) = cluster.placeholders()
    del cluster.pods[f"{keys.NAMESPACE}/{name}"]
    cluster.reconcile()
    assert list(cluster.placeholders()) == [name] and cluster.status("r1").phase == "Available"
    # deleted again, and a stranger took the room meanwhile: Waiting, the node drained for it
    del cluster.pods[f"{keys.NAMESPACE}/{name}"]
    cluster.add(pod_obj("stranger", "2", node_name="n1"))
    waiting = cluster.reconcile()
    assert cluster.status("r1").phase == "Waiting" and waiting.locks["n1"].owner == reservation_owner_id("r1")
    # and says what happened, for as long as it waits (an Event goes with the phase change: agent/writer.py)
    assert cluster.status("r1").reason == "PlaceholderLost" and "placeholder" in cluster.status("r1").message
    cluster.reconcile()
    assert cluster.status("r1").phase == "Waiting" and cluster.status("r1").reason == "PlaceholderLost"
    cluster.pods["ns/stranger"]["status"]["phase"] = "Succeeded"
    cluster.reconcile()
    assert list(cluster.placeholders()) == [name] and "n1" in cluster.last.locks, "the lock stays until it stands"
    cluster.reconcile()
    assert cluster.status("r1").phase == "Available" and cluster.last.locks == {}


def test_pre_allocation_waits_on_a_full_node_until_it_drains() -> None:
    running = tuple(pod_obj(f"run-{i}", "1", node_name="n1") for i in range(4))
    cluster = Cluster.of(node_obj("n1"), pods=running, reservations=(reservation("pre", "3", preAllocation=True),))
    cluster.reconcile()
    assert cluster.status("pre").phase == "Waiting" and "n1" in cluster.last.locks
    assert cluster.status("pre").reason == "Waiting", "no placeholder stood yet: none was lost"
    plain = Cluster.of(node_obj("n1"), pods=running, reservations=(reservation("plain", "3"),))
    plain.reconcile()
    assert plain.status("plain").phase == "Pending"
    for p in running:
        cluster.pods[f"ns/{p['metadata']['name']}"]["status"]["phase"] = "Succeeded"
    cluster.reconcile()
    assert cluster.placeholders() and "n1" in cluster.last.locks
    cluster.reconcile()
    assert cluster.status("pre").phase == "Available" and cluster.last.locks == {}


def test_expiry_node_deletion_and_garbage_collection() -> None:
    cluster = Cluster.of(node_obj("n1"))
    for r in (reservation("short", ttl="5s", age=timedelta(seconds=6), status={"phase": "Available", "nodeName": "n1"}),
              reservation("forever", ttl="0s", age=timedelta(days=30)), reservation("until", expires=stamp(NOW)),
              reservation("orphan", status={"phase": "Available", "nodeName": "gone"})):
        cluster.reservations[r.name] = r
    result = cluster.reconcile()
    assert (cluster.status("short").phase, cluster.status("short").reason) == ("Failed", "Expired")
    assert cluster.status("until").reason == "Expired" and cluster.status("orphan").reason == "NodeDeleted"
    assert [p.reservation for p in result.placeholders] == ["forever"] and result.locks == {}
    failed = {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "reason": "Expired", "message": "",
                                                "lastTransitionTime": stamp(NOW - timedelta(minutes=59))}]}
    old = Cluster.of(node_obj("n1"), reservations=(reservation("old", status=failed),))
    assert not old.plan().reservations[0].delete
    old.now = NOW + timedelta(minutes=2)
    assert old.plan().reservations[0].delete


def test_reservations_hold_at_most_max_reserved_percent_of_the_cluster() -> None:
    quarter = load_config("starvation: {enabled: false}\nreservations: {maxReservedPercent: 25}")
    cluster = Cluster.of(node_obj("n1", cpu="8"), node_obj("n2", cpu="8"), spare=0, config=quarter,
                         reservations=(reservation("a", "3", age=timedelta(minutes=2)), reservation("b", "2")))
    cluster.reconcile()
    assert cluster.status("a").node and cluster.status("b").phase == "Pending"
    assert "maxReservedPercent 25" in cluster.status("b").message


def test_an_ended_pod_counts_as_allocated_only_when_the_agent_recorded_its_uid_in_current_owners() -> None:
    """Issue 10, attack 2: a finished pod on the node with a hand-written `reservoir.sh/reservation-allocated`
    annotation does not make someone else's allocateOnce Reservation Succeeded; one the agent recorded (by uid) does."""
    forged = pod_obj("intruder", "1", node_name="n1", phase="Succeeded")
    forged["metadata"]["annotations"] = {keys.RESERVATION_ALLOCATED: "r1"}
    recorded = {"phase": "Available", "nodeName": "n1",
                "currentOwners": [{"namespace": "ns", "name": "someone", "uid": "uid-someone"}]}
    cluster = Cluster.of(node_obj("n1"), pods=(forged,), reservations=(reservation("r1", status=recorded),))
    cluster.reconcile()
    assert cluster.status("r1").phase != "Succeeded"
    same_name = pod_obj("someone", "1", node_name="n1", phase="Succeeded")
    same_name["metadata"]["uid"] = "uid-other"
    cluster = Cluster.of(node_obj("n1"), pods=(same_name,), reservations=(reservation("r1", status=recorded),))
    cluster.reconcile()
    assert cluster.status("r1").phase != "Succeeded"
    ended = pod_obj("someone", "1", node_name="n1", phase="Succeeded")
    cluster = Cluster.of(node_obj("n1"), pods=(ended,), reservations=(reservation("r1", status=recorded),))
    cluster.reconcile()
    assert (cluster.status("r1").phase, cluster.status("r1").reason) == ("Succeeded", "Succeeded")


def test_a_handover_kube_scheduler_does_not_finish_is_given_up_after_handover_timeout() -> None:
    cluster = Cluster.of(node_obj("n1", cpu="8"), reservations=(reservation("r1", "3"),))
    cluster.reconcile()
    cluster.reconcile()
    cluster.add(pod_obj("o", "1", owner=True, gated=True))
    cluster.reconcile(bind=False)
    cluster.reconcile(bind=False)  # narrowed and let go, but never bound (say, a host port taken)
    assert not cluster.pods["ns/o"]["spec"].get("schedulingGates") and "n1" in cluster.last.locks
    cluster.pods["ns/o"]["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                                     "reason": "Unschedulable", "lastTransitionTime": stamp(NOW)}]
    assert cluster.reconcile(bind=False).wake_at == NOW + CONFIG.reservations.handover_timeout, "its own clock"
    assert [p.name for p in cluster.status("r1").owners] == ["o"], "not before"
    cluster.now = NOW + CONFIG.reservations.handover_timeout
    given_up = cluster.reconcile(bind=False)
    assert cluster.status("r1").owners == () and any("handover-given-up" in n for n in given_up.notes)
    for _ in range(2):
        cluster.reconcile(bind=False)
    assert cluster.last.locks == {} and list(cluster.placeholders().values()) == [{"cpu": "3"}], "held again"


@pytest.mark.parametrize("held", ["own gate", "other scheduler"])
def test_an_owner_kube_scheduler_would_not_place_is_not_handed_over(held: str) -> None:
    """An owner created with a scheduling gate of its own beside the handover gate, or naming another scheduler, is
    never found Unschedulable once handed over: the handover was never given up, and the Reservation's node stayed
    locked (a brief lock, outside the caps) until the Reservation's ttl, closed to everyone else, while its tenant
    kept the pod back. Such a pod is ungated and not claimed; the Reservation stays whole for another owner."""
    cluster = Cluster.of(node_obj("n1", cpu="8"), reservations=(reservation("r1", "3"),))
    cluster.reconcile()
    cluster.reconcile()
    sly = pod_obj("o", "1", owner=True, gated=True)
    if held == "own gate":
        sly["spec"]["schedulingGates"].append({"name": "example.com/mine"})
    else:
        sly["spec"]["schedulerName"] = "no-such-scheduler"
    cluster.add(sly)
    result = cluster.reconcile(bind=False)
    assert [(h.key, h.node) for h in result.handovers] == [("ns/o", "")], "let go, not narrowed to n1"
    assert any("decision=ungate" in n and "ns/o" in n for n in result.notes)
    assert result.locks == {} and cluster.status("r1").owners == ()
    cluster.add(pod_obj("o2", "1", owner=True, gated=True))
    cluster.reconcile()
    cluster.reconcile()
    assert [p.name for p in cluster.status("r1").owners] == ["o2"], "the Reservation is still there for an owner"


def test_gated_pods_are_let_go_when_reservations_are_disabled() -> None:
    off = load_config("starvation: {enabled: false}\nreservations: {enabled: false}")
    cluster = Cluster.of(node_obj("n1"), pods=(pod_obj("o", "1", owner=True, gated=True),), config=off,
                         reservations=(reservation("r1"),))
    result = cluster.reconcile()
    assert [(h.key, h.node) for h in result.handovers] == [("ns/o", "")] and result.placeholders == []


def test_narrow_patch_adds_the_node_to_every_term_and_is_idempotent() -> None:
    raw = pod_obj("p", "1", gated=True)
    raw["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                              {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]}]}}}
    tolerate = ({"key": keys.LOCK, "operator": "Equal", "value": "reservation-r-abcdef", "effect": "NoSchedule"},)
    narrowed = apply(raw, narrow_patch(raw, "n1", tolerate))
    terms = narrowed["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    want = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    assert all(want in t["matchFields"] for t in terms) and terms[0]["matchExpressions"]
    assert narrowed["spec"]["tolerations"] == [tolerate[0]]
    assert narrow_patch(narrowed, "n1", tolerate) == []
    assert ungate_patch(apply(narrowed, ungate_patch(narrowed))) == []
    stale = copy.deepcopy(raw)
    stale["metadata"]["resourceVersion"] = "2"
    try:
        apply(stale, narrow_patch(raw, "n1", tolerate))
    except ValueError:
        pass
    else:
        raise AssertionError("a patch built from an older read must fail its test")


def test_the_placeholder_pod_is_bound_owned_and_unpreemptible() -> None:
    cluster = Cluster.of(node_obj("n1"), reservations=(reservation("r1", "2", memory="1Gi"),))
    (placeholder,) = cluster.plan().placeholders
    body = placeholder_pod(placeholder, "registry.k8s.io/pause:3.10")
    spec, meta = body["spec"], body["metadata"]
    assert spec["nodeName"] == "n1" and spec["priorityClassName"] == keys.PLACEHOLDER_PRIORITY_CLASS
    assert meta["namespace"] == keys.NAMESPACE and meta["labels"] == {keys.PLACEHOLDER: reservation_owner_id("r1")}
    assert meta["ownerReferences"][0]["uid"] == "uid-r1" and meta["ownerReferences"][0]["kind"] == "Reservation"
    resources = spec["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "2", "memory": "1Gi"}
    assert PodView.from_obj({**body, "status": {}}).requests == pod("x", "2").requests


def test_a_claimed_owner_edited_while_gated_to_exclude_the_node_is_let_go_and_the_lock_goes() -> None:
    """Hostile review: an owner adds a nodeSelector that excludes its Reservation's node while gated, to hold the node
    locked: the claim is dropped, the pod let go (not narrowed), the lock released."""
    cluster = Cluster.of(node_obj("n1", cpu="8"), reservations=(reservation("r1", "3"),))
    cluster.reconcile()
    cluster.reconcile()
    cluster.add(pod_obj("o", "1", owner=True, gated=True))
    cluster.reconcile(bind=False)
    cluster.pods["ns/o"]["spec"]["nodeSelector"] = {"zone": "elsewhere"}
    result = cluster.reconcile(bind=False)
    assert [(h.key, h.node) for h in result.handovers] == [("ns/o", "")] and cluster.status("r1").owners == ()
    assert "affinity" not in cluster.pods["ns/o"]["spec"]
    cluster.reconcile(bind=False)
    assert cluster.last.locks == {} and list(cluster.placeholders().values()) == [{"cpu": "3"}]


def test_a_waiting_reservation_says_when_it_is_expected_to_start_in_its_ready_message() -> None:
    """Issue 17: pre-allocation on a full 4-cpu node whose four 1-cpu pods declare 60 s and started 10, 20, 30 and 40 s
    ago (ending at +50, +40, +30, +20 s): its 3 cpu are free when the third of them ends, 40 s from now. Its Ready
    message ends with that time, written once: a later plan whose estimate moved less than the tolerance keeps the
    text (no status write at every plan)."""
    running = []
    for i in range(4):
        raw = pod_obj(f"run-{i}", "1", node_name="n1")
        raw["metadata"]["annotations"] = {keys.MAXIMUM_RUNTIME: "60s"}
        raw["status"]["startTime"] = stamp(NOW - timedelta(seconds=10 * (i + 1)))
        running.append(raw)
    cluster = Cluster.of(node_obj("n1"), pods=tuple(running),
                         reservations=(reservation("pre", "3", preAllocation=True),))
    cluster.reconcile()
    assert cluster.status("pre").phase == "Waiting" and "n1" in cluster.last.locks
    cluster.reconcile()  # the lock is on the node now: its slot, and the estimate
    ready = next(c for c in cluster.status("pre").conditions if c["type"] == "Ready")
    assert ready["message"].endswith("; expected start 2026-11-22T12:00:40Z"), ready["message"]
    assert cluster.status("pre").message == ready["message"]
    (estimate,) = cluster.last.backfill.estimates
    assert estimate.at == NOW + timedelta(seconds=40)
    cluster.pods["ns/run-1"]["status"]["startTime"] = stamp(NOW - timedelta(seconds=23))  # it now ends at +37 s:
    cluster.reconcile()  # 3 s sooner than written, within the tolerance: the written text stays
    assert cluster.last.backfill.estimates[0].at == NOW + timedelta(seconds=37)
    ready = next(c for c in cluster.status("pre").conditions if c["type"] == "Ready")
    assert ready["message"].endswith("; expected start 2026-11-22T12:00:40Z"), ready["message"]
    assert ready["message"].count("expected start") == 1
    cluster.pods["ns/run-1"]["status"]["startTime"] = stamp(NOW - timedelta(seconds=30))  # +30: 10 s sooner
    cluster.reconcile()
    ready = next(c for c in cluster.status("pre").conditions if c["type"] == "Ready")
    assert ready["message"].endswith("; expected start 2026-11-22T12:00:30Z"), ready["message"]
