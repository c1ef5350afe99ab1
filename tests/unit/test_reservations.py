"""Seed 003, Reservations in the planner: placement by the template, phases, allocateOnce, expiry, node deletion,
preAllocation, garbage collection. Time is an input."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from agent.planner.plan import plan
from shared.config import load_config
from shared.ownership import reservation_owner_id
from shared.views import NodeView, ReservationView
from shared.timestamps import stamp
from tests.builders import NOW, node, pod, snap

CONFIG = load_config("maxLockedNodePercent: 90\nstarvation: {enabled: false}\nreservations: {gcGracePeriod: 1h}")


def reservation(name: str, cpu: str = "2", *, owners: list | None = None, age: timedelta = timedelta(minutes=1),
                status: dict | None = None, **spec) -> ReservationView:
    template = {"spec": {"containers": [{"name": "r", "resources": {"requests": {"cpu": cpu}}}],
                         **spec.pop("template_spec", {})}}
    return ReservationView.from_obj({
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": stamp(NOW - age)},
        "spec": {"template": template, "owners": owners or [{"labelSelector": {"matchLabels": {"app": "owner"}}}],
                 **spec},
        "status": status or {}})


def with_reservations(snapshot, *reservations):
    return replace(snapshot, reservations={r.name: r for r in reservations})


def owner_pod(name: str, node_name: str = "", **kw):
    base = pod(name, "1", node_name=node_name, **kw)
    return replace(base, labels={"app": "owner"})


def placed(result, name: str):
    return next(s for s in result.reservations if s.name == name)


def test_placed_on_the_best_fitting_node_and_locked() -> None:
    nodes = [node("big", cpu="8"), node("small", cpu="4"), node("other", cpu="4", labels={"zone": "b"})]
    busy = [pod("busy", "1", node_name="small")]
    r = reservation("r1", "2", template_spec={"nodeSelector": {}})
    result = plan(with_reservations(snap(nodes, busy), r), CONFIG, NOW)
    status = placed(result, "r1")
    assert status.phase == "Available" and status.node in ("small", "other")
    assert status.node == "small", "least idle that fits: small has 3 free, other 4, big 8"
    lock = result.locks["small"]
    assert lock.owner == reservation_owner_id("r1") and lock.expires == NOW - timedelta(minutes=1) + timedelta(hours=24)
    conditions = {c["type"]: c for c in status.conditions}
    assert conditions["Scheduled"]["status"] == "True" and conditions["Ready"]["reason"] == "Available"


def test_template_constraints_are_honoured() -> None:
    nodes = [node("a", labels={"zone": "a"}), node("b", labels={"zone": "b", "gpu": "yes"})]
    by_selector = reservation("sel", template_spec={"nodeSelector": {"zone": "b"}})
    by_affinity = reservation("aff", template_spec={"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]}}}})
    named = reservation("named", template_spec={"nodeName": "zzz"})
    result = plan(with_reservations(snap(nodes, [], spare=1), by_selector, by_affinity, named), CONFIG, NOW)
    assert placed(result, "sel").node == "b" and placed(result, "aff").node == "a"
    assert placed(result, "named").phase == "Pending" and placed(result, "named").reason == "Unschedulable"
    # a tainted node only for a template that tolerates the taint
    tainted = NodeView.from_obj({"metadata": {"name": "t", "creationTimestamp": stamp(NOW - timedelta(days=1))},
                                 "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]},
                                 "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}})
    plain = reservation("plain")
    tolerant = reservation("tolerant", template_spec={"tolerations": [{"key": "gpu", "operator": "Exists"}]})
    assert placed(plan(with_reservations(snap([tainted], [], spare=1), plain), CONFIG, NOW), "plain").phase == "Pending"
    assert placed(plan(with_reservations(snap([tainted], [], spare=1), tolerant), CONFIG, NOW), "tolerant").node == "t"


def test_allocate_once_succeeds_when_an_owner_is_bound_and_frees_the_node() -> None:
    nodes = [node("n1")]
    r = reservation("r1", status={"phase": "Available", "nodeName": "n1"})
    waiting = plan(with_reservations(snap(nodes, [owner_pod("o1")], spare=1), r), CONFIG, NOW)
    assert "n1" in waiting.locks and placed(waiting, "r1").phase == "Available"
    bound = plan(with_reservations(snap(nodes, [owner_pod("o1", node_name="n1")], spare=1), r), CONFIG, NOW)
    assert placed(bound, "r1").phase == "Succeeded" and bound.locks == {}
    # without allocateOnce the owner becomes a current owner, annotated, and the node stays held
    many = reservation("r1", allocateOnce=False, status={"phase": "Available", "nodeName": "n1"})
    pods = [owner_pod("o1", node_name="n1"), pod("stranger", "1", node_name="n1")]
    result = plan(with_reservations(snap(nodes, pods, spare=1), many), CONFIG, NOW)
    status = placed(result, "r1")
    assert status.phase == "Available" and [p.name for p in status.owners] == ["o1"]
    assert status.annotate == ("ns/o1",) and status.allocated["cpu"] == 1000 and "n1" in result.locks


def test_expiry_node_deletion_and_garbage_collection() -> None:
    empty = snap([node("n1")], [], spare=1)
    short = reservation("short", ttl="5s", age=timedelta(seconds=6), status={"phase": "Available", "nodeName": "n1"})
    result = plan(with_reservations(empty, short), CONFIG, NOW)
    assert placed(result, "short").phase == "Failed" and placed(result, "short").reason == "Expired" and result.locks == {}
    forever = reservation("forever", ttl="0s", age=timedelta(days=30))
    assert placed(plan(with_reservations(empty, forever), CONFIG, NOW), "forever").phase == "Available"
    until = reservation("until", expires=stamp(NOW))
    assert placed(plan(with_reservations(empty, until), CONFIG, NOW), "until").reason == "Expired"
    orphan = reservation("orphan", status={"phase": "Available", "nodeName": "gone"})
    assert placed(plan(with_reservations(empty, orphan), CONFIG, NOW), "orphan").reason == "NodeDeleted"
    failed = {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "reason": "Expired", "message": "",
                                                "lastTransitionTime": stamp(NOW - timedelta(minutes=59))}]}
    old = reservation("old", status=failed)
    assert not placed(plan(with_reservations(empty, old), CONFIG, NOW), "old").delete
    assert placed(plan(with_reservations(empty, old), CONFIG, NOW + timedelta(minutes=2)), "old").delete


def test_pre_allocation_waits_on_a_full_node_until_it_drains() -> None:
    nodes = [node("n1")]
    running = [pod(f"run-{i}", "1", node_name="n1", runtime="10m", started_ago=timedelta(minutes=5)) for i in range(4)]
    r = reservation("pre", "4", preAllocation=True)
    result = plan(with_reservations(snap(nodes, running, spare=1), r), CONFIG, NOW)
    assert placed(result, "pre").phase == "Waiting" and "n1" in result.locks
    plain = reservation("plain", "4")
    assert placed(plan(with_reservations(snap(nodes, running), plain), CONFIG, NOW), "plain").phase == "Pending"
    waiting = reservation("pre", "4", preAllocation=True, status={"phase": "Waiting", "nodeName": "n1"})
    drained = [replace(p, phase="Succeeded") for p in running]
    result = plan(with_reservations(snap(nodes, drained, spare=1), waiting), CONFIG, NOW + timedelta(minutes=6))
    assert placed(result, "pre").phase == "Available" and "n1" in result.locks


def test_reservations_take_precedence_and_count_in_the_cap() -> None:
    nodes = [node("n1"), node("n2")]
    half = load_config("maxLockedNodePercent: 50\nstarvation: {enabled: false}")
    first, second = reservation("first", age=timedelta(minutes=2)), reservation("second")
    result = plan(with_reservations(snap(nodes, []), first, second), half, NOW)
    assert placed(result, "first").phase == "Available" and placed(result, "second").phase == "Pending"
    assert "maxLockedNodePercent" in placed(result, "second").message


def test_an_ended_pod_counts_as_allocated_only_when_the_agent_recorded_its_uid_in_current_owners() -> None:
    """Issue 10, attack 2: a finished pod on the node with a hand-written `reservoir.sh/reservation-allocated`
    annotation does not make someone else's allocateOnce Reservation Succeeded; one the agent recorded (by uid) does."""
    from shared import keys

    nodes = [node("n1")]
    forged = replace(pod("intruder", "1", node_name="n1", phase="Succeeded"),
                     annotations={keys.RESERVATION_ALLOCATED: "r1"})
    r = reservation("r1", status={"phase": "Available", "nodeName": "n1", "currentOwners": [
        {"namespace": "ns", "name": "someone", "uid": "uid-someone"}]})
    result = plan(with_reservations(snap(nodes, [forged], spare=1), r), CONFIG, NOW)
    assert placed(result, "r1").phase == "Available" and "n1" in result.locks
    # the same name and namespace as a recorded owner but another uid: still not allocated
    same_name = replace(forged, name="someone", uid="uid-other")
    result = plan(with_reservations(snap(nodes, [same_name], spare=1), r), CONFIG, NOW)
    assert placed(result, "r1").phase == "Available" and "n1" in result.locks
    # recorded by uid (annotation or not): allocated once, the node is freed
    recorded = replace(pod("someone", "1", node_name="n1", phase="Succeeded"), uid="uid-someone")
    result = plan(with_reservations(snap(nodes, [recorded], spare=1), r), CONFIG, NOW)
    assert placed(result, "r1").phase == "Succeeded" and placed(result, "r1").reason == "Allocated"
    assert result.locks == {}
    # a recorded pod on another node is not on the Reservation's node: not allocated here
    elsewhere = replace(recorded, node_name="n2")
    result = plan(with_reservations(snap([node("n1"), node("n2")], [elsewhere]), r), CONFIG, NOW)
    assert placed(result, "r1").phase == "Available"


def test_the_allocated_annotation_is_still_written_for_current_owners_lacking_it() -> None:
    from shared import keys

    many = reservation("r1", allocateOnce=False, status={"phase": "Available", "nodeName": "n1"})
    marked = replace(owner_pod("o1", node_name="n1"), annotations={keys.RESERVATION_ALLOCATED: "r1"})
    owners = [marked, owner_pod("o2", node_name="n1")]
    result = plan(with_reservations(snap([node("n1")], owners, spare=1), many), CONFIG, NOW)
    status = placed(result, "r1")
    assert [p.name for p in status.owners] == ["o1", "o2"] and status.annotate == ("ns/o2",)
    assert status.status()["currentOwners"] == [{"namespace": "ns", "name": "o1", "uid": "uid-o1"},
                                                {"namespace": "ns", "name": "o2", "uid": "uid-o2"}]
