"""Seed 000 (starvation) as its users check it (issue 11), through plan(): node choice by kube-scheduler's own
predicate, scheduling gates, `minMember - bound` tasks, maxLockDuration's cool-down kept on the nodes, no lock where a
task fits now, and the budget on small clusters. Each test uses the seed's numbers where it gives them."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

import pytest

from agent.planner.jobs import build_jobs
from agent.planner.model import Lock, Snapshot
from agent.planner.plan import plan
from agent.planner.starvation import MAX_POD_RECORDS, pod_records, task_record
from agent.writer import node_patch
from shared import keys
from shared.config import ConfigError, KueueConfig, load_config
from shared.keys import LockKind
from shared.ownership import JobRef
from shared.timestamps import stamp
from shared.views import NodeView, PodGroupView, PodView, ReservationView
from tests.builders import CONFIG, NOW, node, pod, snap

DEFAULTS = load_config("")  # the shipped config: reservedNodePercent 20, maxLockedNodePercent 50, threshold 10m


def job_owner(name: str, kind: str = "Pod", ns: str = "ns") -> str:
    return JobRef(ns, kind, name).owner_id


def full(name: str, cpu_used: int = 4) -> list[PodView]:
    """Pods of 1 cpu that run forever on `name` (4 cpu): the node never drains by itself."""
    return [pod(f"{name}-fill-{i}", "1", node_name=name) for i in range(cpu_used)]


def spec_pod(name: str, cpu: str, spec: dict[str, Any], *, group: str | None = None,
             age: timedelta = timedelta(minutes=5)) -> PodView:
    """A pending pod with extra spec fields (affinity, tolerations, schedulingGates)."""
    annotations = {keys.GROUP_NAME: group} if group else {}
    return PodView.from_obj({
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations,
                     "creationTimestamp": stamp(NOW - age)},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}], **spec},
        "status": {"phase": "Pending"}})


def zone_affinity(zone: str) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": [zone]}]}]}}}}


def podgroup(name: str, min_member: int) -> PodGroupView:
    return PodGroupView.from_obj({"metadata": {"name": name, "namespace": "ns",
                                               "creationTimestamp": stamp(NOW - timedelta(hours=1))},
                                  "spec": {"minMember": min_member}})


def with_annotation(view: NodeView, key: str, value: str) -> NodeView:
    """The node as the writer leaves it after writing `key` (its lock, if any, removed)."""
    return NodeView.from_obj({"metadata": {"name": view.name, "labels": {}, "annotations": {key: value},
                                           "creationTimestamp": stamp(view.created)},
                              "status": {"allocatable": view.allocatable.to_quantities()}})


def patched(raw: dict[str, Any], ops: list[dict[str, Any]] | None) -> dict[str, Any]:
    """`raw` after the writer's node patch (its first op tests the resourceVersion, as the API server would)."""
    assert ops is not None and ops[0] == {"op": "test", "path": "/metadata/resourceVersion",
                                          "value": raw["metadata"]["resourceVersion"]}
    doc = copy.deepcopy(raw)
    for op in ops[1:]:  # add and remove on objects: all a node patch holds
        *parents, last = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        target = doc
        for token in parents:
            target = target[token]
        if op["op"] == "add":
            target[last] = copy.deepcopy(op["value"])
        else:
            assert op["op"] == "remove" and last in target, op
            del target[last]
    return doc


# --- 1. one kube-scheduler predicate ---

def test_seed_000_pod_requiring_zone_a_never_gets_a_lock_on_a_zone_b_node() -> None:
    """Issue 11: a pod requiring zone=a got a lock on a zone-b node, which drained for nothing. The zone-b node is
    the better one by the seed's score (more idle, both never free by themselves): it must still not be chosen."""
    nodes = [node("a-1", labels={"zone": "a"}), node("b-1", labels={"zone": "b"})]
    running = full("a-1", 2) + full("b-1", 1)
    big = spec_pod("big", "4", zone_affinity("a"))
    result = plan(snap(nodes, [*running, big], spare=1), CONFIG, NOW)
    assert set(result.locks) == {"a-1"} and result.locks["a-1"].owner == job_owner("big")
    # only zone-b nodes: no lock at all, and the job says why
    nowhere = plan(snap([node("b-1", labels={"zone": "b"})], [*full("b-1", 1), big], spare=1), CONFIG, NOW)
    assert nowhere.locks == {} and "cannot reserve" in next(j for j in nowhere.jobs if j.subject == "ns/Pod/big").reason


def test_node_choice_honours_match_fields_empty_terms_and_other_taints() -> None:
    nodes = [node(f"n{i}") for i in range(1, 4)]
    running = full("n1", 1) + full("n2", 2) + full("n3", 3)  # n1 the most idle
    on_n3 = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n3"]}]}]}}}}
    result = plan(snap(nodes, [*running, spec_pod("pinned", "4", on_n3)], spare=1), CONFIG, NOW)
    assert set(result.locks) == {"n3"}, "matchFields metadata.name is kube-scheduler's, and Reservoir's"
    empty_term = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{}]}}}}
    assert plan(snap(nodes, [*running, spec_pod("nowhere", "4", empty_term)], spare=1), CONFIG, NOW).locks == {}
    # a NoExecute taint the pod does not tolerate keeps it off a node, as NoSchedule does
    tainted = NodeView.from_obj({"metadata": {"name": "n1", "creationTimestamp": stamp(NOW - timedelta(days=1))},
                                 "spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]},
                                 "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}})
    result = plan(snap([tainted, *nodes[1:]], [*running, pod("big", "4")], spare=1), CONFIG, NOW)
    assert set(result.locks) == {"n2"}


def reservation(name: str, template_spec: dict[str, Any]) -> ReservationView:
    return ReservationView.from_obj({
        "metadata": {"name": name, "creationTimestamp": stamp(NOW - timedelta(minutes=1))},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                                       **template_spec}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "owner"}}}]}})


def test_a_reservation_template_is_judged_by_the_same_predicate() -> None:
    """Seed 003's node_allowed calls the one predicate: an empty term matches no node, matchFields is honoured."""
    nodes = [node("a"), node("b")]
    empty = reservation("empty", {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{}]}}}})
    on_b = reservation("on-b", {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}})
    base = snap(nodes, [], spare=1)
    result = plan(Snapshot(nodes=base.nodes, pods=base.pods, reservations={"empty": empty, "on-b": on_b}),
                  load_config("starvation: {enabled: false}\nmaxLockedNodePercent: 90"), NOW)
    phases = {r.name: (r.phase, r.node) for r in result.reservations}
    assert phases == {"empty": ("Pending", ""), "on-b": ("Pending", "b")}  # on b, its placeholder being created


# --- 2. scheduling gates ---

def test_a_pod_held_by_scheduling_gates_is_not_starving() -> None:
    gated = spec_pod("big", "4", {"schedulingGates": [{"name": "example.com/quota"}]}, age=timedelta(hours=1))
    result = plan(snap([node("n1")], [*full("n1"), gated], spare=1), CONFIG, NOW)
    assert result.locks == {} and not any(j.starving for j in result.jobs)
    # a gang whose ungated pods cannot reach minMember gets nothing either, and says why
    group = podgroup("train", 3)
    tasks = [spec_pod(f"train-{i}", "4", {}, group="train") for i in range(2)]
    tasks.append(spec_pod("train-2", "4", {"schedulingGates": [{"name": "example.com/quota"}]}, group="train"))
    nodes = [node(f"n{i}") for i in range(3)]
    result = plan(snap(nodes, [*(p for n in nodes for p in full(n.name, 1)), *tasks], [group], spare=1), CONFIG, NOW)
    (train,) = [j for j in result.jobs if j.subject == "ns/PodGroup/train"]
    assert result.locks == {} and train.pending == 2 and "only 2 pending" in train.reason


# --- 3. minMember - bound tasks ---

def test_gang_of_min_member_3_with_8_pending_pods_gets_3_tasks_worth_of_nodes() -> None:
    """Issue 11: "a gang with minMember 3 and 8 pending pods needs 8 tasks' worth of nodes and can fail the budget
    when 3 would do". Five nodes, one task each after a drain: 8 never fit, 3 do."""
    group = podgroup("train", 3)
    tasks = [pod(f"train-{i}", "4", group="train") for i in range(8)]
    nodes = [node(f"n{i}") for i in range(5)]
    running = [p for n in nodes for p in full(n.name, 1)]
    result = plan(snap(nodes, [*running, *tasks], [group]), CONFIG, NOW)
    owner = job_owner("train", "PodGroup")
    assert len(result.locks) == 3 and {lock.owner for lock in result.locks.values()} == {owner}
    assert sorted(t for lock in result.locks.values() for t in lock.tasks) == ["ns/train-0", "ns/train-1",
                                                                                "ns/train-2"]
    assert all("reserves 1 of the 3 tasks it needs (8 pending)" in lock.reason for lock in result.locks.values())
    # one bound already: 2 more reach minMember
    bound = pod("train-0", "4", node_name="n0", group="train")
    result = plan(snap(nodes, [*running, bound, *tasks[1:]], [group]), CONFIG, NOW)
    assert len(result.locks) == 2 and sum(len(lock.tasks) for lock in result.locks.values()) == 2


def test_a_lock_reserves_at_most_max_lock_tasks_so_its_annotation_stays_writable() -> None:
    """A gang of 1,100 tiny pods of the longest names a pod can have, on nodes allowing 1,100 pods: every task fits on
    one node, but a lock naming them all would be 279 KiB of lock-info, past the 256 KiB the API server allows a
    node's annotations: never written, planned again at every plan. A lock reserves for at most MAX_LOCK_TASKS; the
    rest go to the next nodes."""
    count = 1100
    group = podgroup("swarm", count)
    long_name = "x" * 248  # with "-0000": 253 characters
    tasks = [pod(f"{long_name}-{i:04}", "100m", group="swarm") for i in range(count)]
    big = [NodeView.from_obj({"metadata": {"name": f"big-{i}", "creationTimestamp": stamp(NOW - timedelta(days=1))},
                              "status": {"allocatable": {"cpu": "200", "memory": "2000Gi", "pods": "1100"}}})
           for i in range(5)]
    running = [pod(f"big-{i}-fill", "200", node_name=f"big-{i}") for i in range(5)]  # full: each must drain
    result = plan(snap(big, [*running, *tasks], [group], spare=1), CONFIG, NOW)
    assert sorted(len(lock.tasks) for lock in result.locks.values()) == [76, 256, 256, 256, 256]
    assert sorted(t for lock in result.locks.values() for t in lock.tasks) == sorted(t.key for t in tasks)
    assert max(len(lock.info_json()) for lock in result.locks.values()) < 100 * 1024
    assert len(json.dumps([t.key for t in tasks])) > 256 * 1024, "the names of all would not have fitted"


# --- 4. maxLockDuration's cool-down ---

def test_an_expired_lock_cools_down_before_the_job_locks_again_and_the_record_lives_on_the_node() -> None:
    """Issue 11: maxLockDuration sent the job to the back for one plan only, and it was re-locked at once on another
    node with a fresh clock. Now it waits `lockCooldown` (30m by default); the fact lives on the released node, so a
    plan made from scratch (a restarted agent) knows it, and is removed once the cool-down has passed."""
    giant = job_owner("giant")
    expired = Lock(node="n1", owner=giant, kind=LockKind.JOB, subject="ns/Pod/giant", reason="x",
                   since=NOW - timedelta(hours=2, minutes=1), tasks=("ns/giant",))
    running = full("n1") + full("n2")
    big = pod("giant", "4", age=timedelta(hours=3))
    first = plan(snap([node("n1", lock=expired), node("n2")], [*running, big], spare=1), CONFIG, NOW)
    assert first.locks == {}, "not re-locked elsewhere with a fresh clock"
    record = first.node_marks["n1"][keys.LOCK_EXPIRED]
    assert json.loads(record) == {giant: stamp(NOW), task_record("ns/giant"): stamp(NOW)}, "the job's, its pod's"
    (status,) = [j for j in first.jobs if j.owner == giant]
    assert status.starving and f"cooling down until {stamp(NOW + timedelta(minutes=30))}" in status.reason
    # the writer releases the lock and writes the record in one patch
    raw = {"metadata": {"name": "n1", "resourceVersion": "7", "labels": {keys.LOCK: giant, keys.LOCK_KIND: "job"},
                        "annotations": {keys.LOCK_INFO: expired.info_json(), "other": "kept"}},
           "spec": {"taints": [{"key": keys.LOCK, "value": giant, "effect": keys.LOCK_EFFECT}]}}
    written = patched(raw, node_patch(raw, None, first.node_marks["n1"]))
    assert written["metadata"]["annotations"] == {keys.LOCK_EXPIRED: record, "other": "kept"}
    assert "taints" not in written["spec"] and written["metadata"]["labels"] == {}
    # a plan from scratch 10 minutes later (no previous plan, a restarted agent): still cooling, nothing to change
    released = with_annotation(node("n1"), keys.LOCK_EXPIRED, record)
    later = plan(snap([released, node("n2")], [*running, big], spare=1), CONFIG, NOW + timedelta(minutes=10))
    assert later.locks == {} and later.node_marks == {}
    # after the cool-down the job may lock again, and the record is removed in the same plan
    after = plan(snap([released, node("n2")], [*running, big], spare=1), CONFIG, NOW + timedelta(minutes=31))
    assert {lock.owner for lock in after.locks.values()} == {giant}
    assert after.node_marks == {"n1": {keys.LOCK_EXPIRED: None}}
    carrying = {"metadata": {"resourceVersion": "8", "annotations": {keys.LOCK_EXPIRED: record}}, "spec": {}}
    removed = patched(carrying, node_patch(carrying, None, after.node_marks["n1"]))
    assert removed["metadata"]["annotations"] == {}


@pytest.mark.parametrize("renamed", ["group annotation", "new controller"])
def test_a_job_renamed_after_its_lock_expired_cools_down_all_the_same(renamed: str) -> None:
    """A tenant whose job's lock outlived maxLockDuration renames the job (its pending pod's group annotation, which
    it may edit at any time, or a controller reference) to a job id with no record: the new job is as old as its
    pod, so starving at once, and locked again at once, a fresh maxLockDuration for each rename. The record of the
    task the lock reserved for ("pod:ns/giant") keeps it cooling; another job's pod is not held by it."""
    giant = job_owner("giant")
    expired = Lock(node="n1", owner=giant, kind=LockKind.JOB, subject="ns/Pod/giant", reason="x",
                   since=NOW - timedelta(hours=2, minutes=1), tasks=("ns/giant",))
    running = full("n1") + full("n2")
    first = plan(snap([node("n1", lock=expired), node("n2")], [*running, pod("giant", "4", age=timedelta(hours=3))],
                      spare=1), CONFIG, NOW)
    released = with_annotation(node("n1"), keys.LOCK_EXPIRED, first.node_marks["n1"][keys.LOCK_EXPIRED])
    if renamed == "group annotation":
        again = pod("giant", "4", age=timedelta(hours=3), group="giant-again")
    else:
        again = PodView.from_obj({
            "metadata": {"name": "giant", "namespace": "ns", "uid": "uid-giant",
                         "creationTimestamp": stamp(NOW - timedelta(hours=3)),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "giant-again",
                                              "uid": "j", "controller": True}]},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]},
            "status": {"phase": "Pending"}})
    assert again.job != ("ns", "Pod", "giant")
    later = plan(snap([released, node("n2")], [*running, again], spare=1), CONFIG, NOW + timedelta(minutes=1))
    assert later.locks == {}, "not locked again under its new name"
    (status,) = [j for j in later.jobs if j.subject.endswith("giant-again")]
    assert f"cooling down until {stamp(NOW + timedelta(minutes=30))}" in status.reason
    other = pod("other", "4", age=timedelta(hours=3))
    fair = plan(snap([released, node("n2")], [*running, other], spare=1), CONFIG, NOW + timedelta(minutes=1))
    assert {lock.owner for lock in fair.locks.values()} == {job_owner("other")}, "another job's pod is not held"
    after = plan(snap([released, node("n2")], [*running, again], spare=1), CONFIG, NOW + timedelta(minutes=31))
    assert len(after.locks) == 1, "after the cool-down it may lock again"


def test_pods_of_a_job_whose_lock_expired_cool_down_in_whatever_job_they_move_to() -> None:
    """Review of the record by pod: it named only the pods the lock reserved for. A PodGroup of minMember 1 with two
    pending pods locks for one; once that lock expired, the other pod, moved to another PodGroup (its group annotation
    rewritten), locked at once with a fresh maxLockDuration. Every pod of the job not bound is recorded (hashed, 40
    bytes each, at most MAX_POD_RECORDS)."""
    groups = [podgroup("g", 1), podgroup("g2", 1)]
    running = full("n1") + full("n2")
    p1, p2 = (pod(name, "4", age=timedelta(hours=3), group="g") for name in ("p1", "p2"))
    first = plan(snap([node("n1"), node("n2")], [*running, p1, p2], groups, spare=1), CONFIG, NOW)
    ((name, lock),) = first.locks.items()
    other = node("n2" if name == "n1" else "n1")
    expiry = NOW + timedelta(hours=2, minutes=1)
    expired = plan(snap([node(name, lock=lock), other], [*running, p1, p2], groups, spare=1), CONFIG, expiry)
    record = json.loads(expired.node_marks[name][keys.LOCK_EXPIRED])
    assert set(record) == {job_owner("g", "PodGroup"), task_record("ns/p1"), task_record("ns/p2")}
    released = with_annotation(node(name), keys.LOCK_EXPIRED, expired.node_marks[name][keys.LOCK_EXPIRED])
    moved = pod("p2", "4", age=timedelta(hours=3), group="g2")
    split = plan(snap([released, other], [*running, p1, moved], groups, spare=1), CONFIG, expiry + timedelta(minutes=1))
    assert split.locks == {}, "neither the job nor its moved pod locks during the cool-down"
    many = PodGroupView.from_obj({"metadata": {"name": "many", "namespace": "ns", "creationTimestamp": stamp(NOW)},
                                  "spec": {"minMember": 1}})
    crowd = [pod(f"c{i:04d}-{'x' * 200}", "4", group="many") for i in range(MAX_POD_RECORDS + 50)]
    job = build_jobs(snap([node("n1")], crowd, [many]), KueueConfig(), timedelta(minutes=10))[0]
    entries = pod_records(job)
    assert len(entries) == MAX_POD_RECORDS and all(len(e) == 20 for e in entries), "bounded, whatever the names"


def test_the_cool_down_records_are_read_once_per_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 11 review: lock_cooldowns ran twice per plan (in the starvation policy and again for Plan.node_marks),
    each parsing every node's `reservoir.sh/lock-expired`. It runs once (PlanContext.cooldowns), and both read it."""
    from agent.planner import starvation

    giant = job_owner("giant")
    record = f'{{"{giant}":"{stamp(NOW - timedelta(minutes=10))}"}}'
    running = full("n1") + full("n2")
    big = pod("giant", "4", age=timedelta(hours=3))
    parsed: list[str] = []
    read = starvation.read_expiries

    def counting(text: str) -> dict:
        parsed.append(text)
        return read(text)

    monkeypatch.setattr(starvation, "read_expiries", counting)
    nodes = [with_annotation(node("n1"), keys.LOCK_EXPIRED, record), node("n2")]
    result = plan(snap(nodes, [*running, big], spare=1), CONFIG, NOW)
    assert parsed == [record], "one node carries a record: parsed once"
    (status,) = [j for j in result.jobs if j.owner == giant]
    assert "cooling down until" in status.reason and result.locks == {} and result.node_marks == {}


def test_the_cool_down_record_is_read_totally_and_only_from_nodes() -> None:
    """A hand-edited record is read as none and rewritten (here: removed); the same key on a tenant's pod means
    nothing; lockCooldown 0 keeps the old behaviour (back of the order once, not onto the nodes it held)."""
    running = full("n1") + full("n2")
    big = pod("giant", "4", age=timedelta(hours=3))
    for text in ("{", "[]", '{"x": 1}', '{"job-ns-Pod-giant": "yesterday"}', "9" * 5000):
        result = plan(snap([with_annotation(node("n1"), keys.LOCK_EXPIRED, text), node("n2")], [*running, big],
                           spare=1), CONFIG, NOW)
        assert result.node_marks == {"n1": {keys.LOCK_EXPIRED: None}}
        assert {lock.owner for lock in result.locks.values()} == {job_owner("giant")}
    tenant = PodView.from_obj({"metadata": {"name": "giant", "namespace": "ns", "uid": "u",
                                            "annotations": {keys.LOCK_EXPIRED: f'{{"{job_owner("rival")}": '
                                                                              f'"{stamp(NOW)}"}}'},
                               "creationTimestamp": stamp(NOW - timedelta(hours=3))},
                               "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "4"}}}]}})
    rival = pod("rival", "4", age=timedelta(hours=1))
    result = plan(snap([node("n1"), node("n2")], [*running, tenant, rival], spare=1), CONFIG, NOW)
    assert job_owner("rival") in {lock.owner for lock in result.locks.values()}
    no_cooldown = load_config("starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 100, "
                              "lockCooldown: 0s}\nmaxLockedNodePercent: 90")
    expired = Lock(node="n1", owner=job_owner("giant"), kind=LockKind.JOB, subject="ns/Pod/giant", reason="x",
                   since=NOW - timedelta(hours=3), tasks=("ns/giant",))
    result = plan(snap([node("n1", lock=expired), node("n2")], [*running, big], spare=1), no_cooldown, NOW)
    assert set(result.locks) == {"n2"} and result.node_marks == {}


def test_lock_cooldown_is_configured_and_validated() -> None:
    assert DEFAULTS.starvation.lock_cooldown == timedelta(minutes=30)
    assert load_config("starvation: {lockCooldown: 2h}").starvation.lock_cooldown == timedelta(hours=2)
    for bad, field in (("starvation: {lockCooldown: -5m}", "starvation.lockCooldown"),
                       ("starvation: {lockCooldown: soon}", "starvation.lockCooldown"),
                       ("starvation: {maxLockDuration: 0s}", "starvation.maxLockDuration")):
        with pytest.raises(ConfigError) as refused:
            load_config(bad)
        assert field in str(refused.value)


# --- 5. lock only where a node must drain ---

def test_a_node_where_the_task_fits_now_is_not_locked() -> None:
    """Seed 000 "Node reserve logic": "If the idle resource of the current node has met the scheduling condition of
    the task, resources will be allocated to this task": nothing to drain, nothing to lock."""
    result = plan(snap([node("n1"), node("n2")], [*full("n2"), pod("big", "4")], spare=1), CONFIG, NOW)
    assert result.locks == {}
    (big,) = [j for j in result.jobs if j.subject == "ns/Pod/big"]
    assert "fit now on unlocked nodes" in big.reason
    # a gang of 2: one task fits on n1 now, the other needs n2 drained: only n2 is locked, for that task
    group = podgroup("pair", 2)
    tasks = [pod(f"pair-{i}", "4", group="pair") for i in range(2)]
    result = plan(snap([node("n1"), node("n2")], [*full("n2"), *tasks], [group], spare=1), CONFIG, NOW)
    assert set(result.locks) == {"n2"} and result.locks["n2"].tasks == ("ns/pair-1",)
    # a node locked for the job already stays locked once drained, until the job is ready
    held = Lock(node="n1", owner=job_owner("big"), kind=LockKind.JOB, subject="ns/Pod/big", reason="x",
                since=NOW - timedelta(minutes=5), tasks=("ns/big",))
    kept = plan(snap([node("n1", lock=held), node("n2")], [*full("n2"), pod("big", "4")], spare=1), CONFIG, NOW)
    assert set(kept.locks) == {"n1"}
    # ... but one still draining is released once the task fits on an unlocked node now
    moved = plan(snap([node("n1", lock=held), node("n2")], [*full("n1"), pod("big", "4")], spare=1), CONFIG, NOW)
    assert moved.locks == {}


# --- 6. small clusters ---

def test_with_the_shipped_defaults_a_three_node_cluster_locks_a_node_and_one_node_says_which_cap() -> None:
    """Issue 11: with reservedNodePercent 20 nothing happened below 5 nodes, and the status blamed "jobs ahead of
    it". Now at least one node (within maxLockedNodePercent), and the reason names the numbers."""
    nodes = [node(f"n{i}") for i in range(3)]
    running = [p for n in nodes for p in full(n.name)]
    big = pod("big", "4", age=timedelta(minutes=11))
    result = plan(snap(nodes, [*running, big]), DEFAULTS, NOW)
    assert len(result.locks) == 1 and next(iter(result.locks.values())).owner == job_owner("big")
    alone = plan(snap([node("n0")], [*full("n0"), big]), DEFAULTS, NOW)
    (status,) = alone.jobs
    assert alone.locks == {}
    assert status.reason == "no node for starvation: maxLockedNodePercent 50% of 1 schedulable node rounds down to " \
                            "0 nodes"
    # on 10 nodes 20% is 2: the third starving job is told they are held by the jobs ahead of it
    nodes = [node(f"n{i}") for i in range(10)]
    running = [p for n in nodes for p in full(n.name)]
    bigs = [pod(f"big-{i}", "4", age=timedelta(minutes=20 - i)) for i in range(3)]
    result = plan(snap(nodes, [*running, *bigs]), DEFAULTS, NOW)
    assert len(result.locks) == 2
    (third,) = [j for j in result.jobs if j.subject == "ns/Pod/big-2"]
    assert third.reason == ("the 2 nodes starvation may lock are held by jobs ahead of it (reservedNodePercent 20% "
                            "of 10 schedulable nodes is 2 nodes)")
    off = plan(snap(nodes, [*running, big]), load_config("starvation: {reservedNodePercent: 0}"), NOW)
    assert off.locks == {} and off.jobs[0].reason == "no node for starvation: reservedNodePercent is 0"


async def test_the_writer_patches_a_node_whose_only_change_is_its_cool_down_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan.node_marks reach the node even where the lock does not change (the record removed after its cool-down),
    in one guarded patch, with no lock Event."""
    import agent.writer as writer_module
    from agent.writer import Writer

    record = f'{{"{job_owner("giant")}":"{stamp(NOW)}"}}'
    nodes = {"n1": {"metadata": {"name": "n1", "resourceVersion": "5", "annotations": {keys.LOCK_EXPIRED: record}},
                    "spec": {}},
             "n2": {"metadata": {"name": "n2", "resourceVersion": "6"}, "spec": {}}}
    sent: list[tuple[str, str, Any]] = []

    async def get_json(api: Any, path: str, *_: Any, **__: Any) -> dict[str, Any]:
        return nodes[path.rsplit("/", 1)[-1]]

    async def send_json(api: Any, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        sent.append((method, path, body))
        return {}

    monkeypatch.setattr(writer_module, "get_json", get_json)
    monkeypatch.setattr(writer_module, "send_json", send_json)
    writer = Writer(None)  # type: ignore[arg-type]  # the two calls it makes are stood in for above
    await writer.apply({}, {}, {"n1": {keys.LOCK_EXPIRED: None}, "n2": {keys.LOCK_EXPIRED: None}})
    assert sent == [("PATCH", "/api/v1/nodes/n1", [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "5"},
        {"op": "remove", "path": "/metadata/annotations/reservoir.sh~1lock-expired"}])], "n2 has none: no patch"


def test_the_plan_names_the_moment_a_job_crosses_the_threshold_or_its_lock_expires() -> None:
    """Crossing `starvingJobTimeThreshold` changes nothing in the cluster: the plan says when it happens
    (Plan.wake_at), so the agent plans then rather than at its next resync (issue 15: lock under 1 s after the
    threshold). A held job lock names the moment it reaches maxLockDuration."""
    nodes = [node("n1"), node("n2")]
    busy = [pod(f"small-{name}-{i}", "1", node_name=name) for name in ("n1", "n2") for i in range(3)]
    young = pod("big", "4", age=timedelta(seconds=20))  # the builders' threshold is 60 s
    result = plan(snap(nodes, [*busy, young]), CONFIG, NOW)
    assert result.locks == {} and result.wake_at == NOW + timedelta(seconds=40)
    old = pod("big", "4", age=timedelta(minutes=5))
    locked = plan(snap(nodes, [*busy, old]), CONFIG, NOW)
    assert locked.locks, locked.notes
    held = [node(n.name, lock=locked.locks.get(n.name)) for n in nodes]
    again = plan(snap(held, [*busy, old]), CONFIG, NOW + timedelta(minutes=1))
    since = next(iter(again.locks.values())).since
    assert again.wake_at == since + CONFIG.starvation.max_lock_duration
