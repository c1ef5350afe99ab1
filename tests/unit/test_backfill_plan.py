"""Backfill through the whole plan (issue 17): the gated pods decided in one plan (let onto a locked node, or let go
unchanged with the reason), the grants recorded on the node, the rules the webhook and the agent share
(shared.backfill: who is held, grants read total, pinned to one node), the entitlement the grant gives and nothing
else does, the webhook's gate, and the writer's deadline patch."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.planner.backfill import grant_lives
from agent.planner.model import MAX_NAMESPACE_UNBOUND_GRANTS, MAX_NODE_GRANTS, Lock, Plan
from agent.planner.plan import plan
from agent.writer import deadline_patch, narrow_patch
from shared import keys
from shared.backfill import Grant, Room, grants_text, hold_refusal, pinned_to, read_grants, read_room
from shared.config import BackfillConfig, load_config
from shared.entitlement import Grounds, entitlement, unentitled
from shared.resources import Resources
from shared.timestamps import stamp
from shared.tolerations import lock_toleration
from shared.views import NodeView, PodView
from tests.builders import NOW, node, pod, snap
from webhook.lookup import Lookup
from webhook.mutate import mutate_pod

S = timedelta(seconds=1)
CONFIG = load_config("""
maxLockedNodePercent: 90
starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 100}
backfill: {namespaces: [ns], margin: 5s}
""")


def gated(name: str, cpu: str = "1", *, runtime: str | None = "10s", opt_in: bool = True, age: timedelta = 2 * S,
          grace: int = 0, ns: str = "ns", deadline: int | None = None, scheduler: str | None = None) -> PodView:
    """A pod the webhook held on the backfill gate (or, with opt_in False, one that wrote the gate itself)."""
    annotations = {}
    if runtime:
        annotations[keys.MAXIMUM_RUNTIME] = runtime
    if opt_in:
        annotations[keys.BACKFILL] = "true"
    spec: dict[str, Any] = {"schedulingGates": [{"name": keys.BACKFILL_GATE}], "terminationGracePeriodSeconds": grace,
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return PodView.from_obj({
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": annotations,
                     "creationTimestamp": (NOW - age).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "spec": spec, "status": {"phase": "Pending"}})


def seed_000(extra: list[PodView], *, grants: dict[str, Grant] | None = None) -> tuple[list[NodeView], list[PodView],
                                                                                        Lock]:
    """Seed 000 at `Time2`, the lock already on the node: one 3-cpu node, pod-2 and pod-3 (1 cpu, 60 s runtimes,
    started 50 s and 20 s ago) running, pod-4 (3 cpu) starving: 1 cpu idle now, pod-4 fits at +40 s."""
    pods = [pod("pod-2", "1", node_name="n1", runtime="60s", started_ago=50 * S),
            pod("pod-3", "1", node_name="n1", runtime="60s", started_ago=20 * S),
            pod("pod-4", "3", age=timedelta(minutes=5))]
    first = plan(snap([node("n1", cpu="3")], pods, spare=1), CONFIG, NOW)
    lock = first.locks["n1"]
    n1 = node("n1", cpu="3", lock=lock)
    if grants:
        raw = {"metadata": {"name": "n1", "annotations": {**n1.annotations, keys.BACKFILL_GRANTS: grants_text(
            grants.values())}, "labels": dict(n1.labels), "creationTimestamp": "2026-11-21T12:00:00Z"},
            "spec": {"taints": [{"key": keys.LOCK, "value": lock.owner, "effect": "NoSchedule"}]},
            "status": {"allocatable": {"cpu": "3", "memory": "16Gi", "pods": "110"}}}
        n1 = NodeView.from_obj(raw)
    return [n1], pods + extra, lock


def run(extra: list[PodView], config: Any = CONFIG, **kw: Any) -> tuple[Plan, Lock]:
    nodes, pods, lock = seed_000(extra, **kw)
    return plan(snap(nodes, pods, spare=1), config, NOW), lock


def test_a_short_pod_backfills_the_draining_node_with_its_deadline_and_grant() -> None:
    result, lock = run([gated("short", runtime="10s")])
    (placed,) = result.backfill.placed
    assert (placed.pod.key, placed.node, placed.owner, placed.deadline) == ("ns/short", "n1", lock.owner, 10)
    assert placed.ends == NOW + 15 * S and placed.needed_by == NOW + 40 * S
    grants = read_grants(result.node_marks["n1"][keys.BACKFILL_GRANTS])
    assert grants == {"uid-short": Grant("uid-short", "ns/short", lock.owner, NOW + 15 * S)}
    assert result.locks["n1"] == lock, "the lock stays: pod-4 still needs the node at +40 s"
    assert any("decision=backfill node=n1" in n for n in result.notes)


def test_every_gated_pod_is_decided_now_and_the_others_let_go_with_the_reason() -> None:
    result, _ = run([gated("long", runtime="60s"), gated("forever", runtime=None), gated("no-opt-in", opt_in=False),
                     gated("other-ns", ns="elsewhere"), gated("stale", age=3 * 60 * S),
                     gated("nobodys", scheduler="no-such-scheduler")])
    assert result.backfill.placed == ()
    why = {r.key: r.reason for r in result.backfill.released}
    assert "after n1 is needed" in why["ns/long"]
    assert keys.MAXIMUM_RUNTIME in why["ns/forever"]
    assert "does not opt in" in why["ns/no-opt-in"]
    assert "cover neither namespace elsewhere" in why["elsewhere/other-ns"]
    assert "maxGateWait" in why["ns/stale"]
    # a pod no running scheduler binds would keep its grant, and the room it takes, as long as it exists
    assert "scheduled by 'no-such-scheduler', not default-scheduler" in why["ns/nobodys"]


def test_the_pods_termination_grace_counts_in_its_margin() -> None:
    """10 s + 5 s margin + 25 s grace ends at +40 s, when pod-4 fits; 26 s of grace is a second too many."""
    assert run([gated("short", grace=25)])[0].backfill.placed
    (released,) = run([gated("short", grace=26)])[0].backfill.released
    assert "after n1 is needed" in released.reason


def test_a_smaller_own_deadline_wins() -> None:
    (placed,) = run([gated("short", deadline=4)])[0].backfill.placed
    assert placed.deadline == 4


def test_two_candidates_do_not_share_the_one_idle_cpu() -> None:
    result, _ = run([gated("first", age=3 * S), gated("second", age=2 * S)])
    assert [b.pod.key for b in result.backfill.placed] == ["ns/first"]
    assert "does not fit the room" in result.backfill.released[0].reason


def granted_unbound(until: datetime, owner: str | None = None) -> tuple[Plan, Lock]:
    """`first` was let go onto n1 in an earlier plan (its grant, ending at `until`, on the node, its gate lifted, not
    bound yet), under the lock of `owner` (default: the lock on n1 now); `second`, as large, waits on the gate for
    the node's one idle cpu."""
    first = gated("first")
    let_go = PodView.from_obj({"metadata": {"name": "first", "namespace": "ns", "uid": "uid-first",
                                            "annotations": dict(first.annotations),
                                            "creationTimestamp": "2026-11-22T11:59:58Z"},
                               "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
                               "status": {"phase": "Pending"}})
    _, _, lock = seed_000([])
    return run([let_go, gated("second")],
               grants={"uid-first": Grant("uid-first", "ns/first", owner or lock.owner, until)})


def test_a_pod_granted_earlier_and_not_bound_yet_keeps_its_room() -> None:
    """The node's state does not count `first`, its grant does."""
    result, _ = granted_unbound(NOW + 15 * S)
    assert result.backfill.placed == ()
    assert "does not fit the room" in result.backfill.released[0].reason
    assert keys.BACKFILL_GRANTS not in result.node_marks.get("n1", {}), "the live grant stays as it is"


def test_a_granted_pod_still_unbound_when_its_grant_ends_holds_no_room() -> None:
    """A pod kube-scheduler never binds (a host port taken, pod anti-affinity: filters Reservoir does not model) would
    hold the room for as long as it exists; past its grant's `until` it holds none, and `second` takes it. Its grant
    goes too, so such pods fill no place under MAX_NODE_GRANTS past their time: should it bind now, the deadline cut
    of a pod with no grant ends it at once."""
    result, _ = granted_unbound(NOW - S)
    assert [b.pod.key for b in result.backfill.placed] == ["ns/second"]
    assert {"uid-second"} == read_grants(result.node_marks["n1"][keys.BACKFILL_GRANTS]).keys()


def test_a_granted_pod_not_bound_loses_its_grant_with_its_owners_lock() -> None:
    """`first` was granted under a lock no longer on n1 (its owner's tasks bound, or the lock expired; the job now
    locking n1 is another): nothing needs its grant any more (deadline_cuts cuts only under the grant's owner's lock),
    and a pod kube-scheduler never binds would keep it, and a place under MAX_NODE_GRANTS, for as long as it exists."""
    result, _ = granted_unbound(NOW + 15 * S, owner="job:gone")
    assert [b.pod.key for b in result.backfill.placed] == ["ns/second"]
    assert read_grants(result.node_marks["n1"][keys.BACKFILL_GRANTS]).keys() == {"uid-second"}


def test_which_grants_a_node_keeps() -> None:
    """grant_lives: a pod gone or finished keeps none; a pod not bound to the node (gated, or let go) none past `until`
    and only while the node is locked for the grant's owner; a pod bound there while it runs, whatever the lock."""
    grant = Grant("uid-a", "ns/a", "job:x", NOW + 10 * S)
    waiting = replace(gated("a"), backfill_gated=False)
    bound = replace(waiting, node_name="n1", phase="Running")
    assert not grant_lives(None, grant, NOW, node="n1", owner="job:x")
    assert not grant_lives(replace(bound, phase="Succeeded"), grant, NOW, node="n1", owner="job:x")
    assert grant_lives(gated("a"), grant, NOW + 10 * S, node="n1", owner="job:x")
    assert not grant_lives(gated("a"), grant, NOW + 11 * S, node="n1", owner="job:x")
    assert grant_lives(waiting, grant, NOW + 10 * S, node="n1", owner="job:x")
    assert not grant_lives(waiting, grant, NOW + 11 * S, node="n1", owner="job:x")
    assert not grant_lives(waiting, grant, NOW, node="n1", owner="job:y")
    assert not grant_lives(waiting, grant, NOW, node="n1", owner=None)
    assert grant_lives(bound, grant, NOW + 11 * S, node="n1", owner=None)
    assert not grant_lives(bound, grant, NOW, node="n2", owner=None)


LONG_NAME = "x" * 248  # with "-0000": 253 characters, the longest a pod's name may be


def crowded(running: int, *, gone: int = 0, waiting: list[PodView] | None = None, granted: int = 0,
            config: Any = CONFIG) -> Plan:
    """Seed 000 on a node allowing 1,000 pods that holds the grants of `running` running backfilled pods of the
    longest names, of `gone` pods deleted since and of the first `granted` of `waiting` (default: 20 short pods of 1m
    cpu), which wait on the gate; the room takes them all."""
    _, seed, lock = seed_000([])
    pods = [PodView.from_obj({
        "metadata": {"name": f"{LONG_NAME}-{i:04}", "namespace": "ns", "uid": f"uid-old-{i}",
                     "annotations": {keys.MAXIMUM_RUNTIME: "10s", keys.BACKFILL: "true"},
                     "creationTimestamp": stamp(NOW - 2 * S)},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1m"}}}]},
        "status": {"phase": "Running", "startTime": stamp(NOW - S)}}) for i in range(running)]
    grants = [Grant(p.uid, p.key, lock.owner, NOW + 14 * S) for p in pods]
    grants += [Grant(f"uid-gone-{i}", f"ns/gone-{i}", lock.owner, NOW + 14 * S) for i in range(gone)]
    if waiting is None:
        waiting = [gated(f"{LONG_NAME[:-4]}new-{i:04}", cpu="1m") for i in range(20)]
    grants += [Grant(p.uid, p.key, lock.owner, NOW + 14 * S) for p in waiting[:granted]]
    n1 = NodeView.from_obj({
        "metadata": {"name": "n1", "creationTimestamp": "2026-11-21T12:00:00Z",
                     "labels": {keys.LOCK: lock.owner, keys.LOCK_KIND: lock.kind.value},
                     "annotations": {keys.LOCK_INFO: lock.info_json(), keys.BACKFILL_GRANTS: grants_text(grants)}},
        "spec": {"taints": [{"key": keys.LOCK, "value": lock.owner, "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "3", "memory": "1000Gi", "pods": "1000"}}})
    return plan(snap([n1], seed + pods + waiting, spare=1), config, NOW)


def test_a_node_holds_at_most_max_node_grants_so_its_annotation_stays_writable() -> None:
    """A node allowing 1,000 pods already holds 120 grants of running backfilled pods with the longest names a pod
    can have; 20 more short pods wait on the gate and the room takes them all. Grants are never dropped while their
    pods run, so without a bound they pile up past the 256 KiB the API server allows a node's annotations; the node
    takes MAX_NODE_GRANTS and the others are told why."""
    result = crowded(120)
    assert len(result.backfill.placed) == MAX_NODE_GRANTS - 120 == 8
    text = result.node_marks["n1"][keys.BACKFILL_GRANTS]
    assert text is not None and len(read_grants(text)) == MAX_NODE_GRANTS
    assert len(text) < 100 * 1024, "with the lock's 82 KiB at most, far below 256 KiB"
    refused = [r for r in result.backfill.released if "new-" in r.name]
    assert len(refused) == 12 and all("holds 128 backfill grants" in r.reason for r in refused)


def test_the_bound_counts_only_the_grants_the_plan_keeps() -> None:
    """The node holds 128 grants, 10 of them of pods deleted since: this plan drops those 10 (grant_marks), so 10 of
    the 20 waiting pods take their places and the node ends with 128 again."""
    result = crowded(118, gone=10)
    assert len(result.backfill.placed) == 10
    assert len(read_grants(result.node_marks["n1"][keys.BACKFILL_GRANTS])) == MAX_NODE_GRANTS


def test_a_pod_holding_a_grant_is_granted_again_at_the_bound() -> None:
    """A pod let onto the node in an earlier plan and still gated (the narrowing not finished) is a candidate again:
    with 127 other grants on the node its own is replaced, not counted as a 129th."""
    again = gated(f"{LONG_NAME[:-4]}new-0000", cpu="1m")
    result = crowded(127, waiting=[again], granted=1)
    assert [b.pod.uid for b in result.backfill.placed] == [again.uid]
    assert len(read_grants(result.node_marks["n1"][keys.BACKFILL_GRANTS])) == MAX_NODE_GRANTS


def test_a_namespace_holds_a_bounded_share_of_a_nodes_grants_not_bound_yet() -> None:
    """A tenant's 1m-cpu pods, granted and never bound (pinned to the node and kept off it by a filter Reservoir does
    not model), would keep their grants while the lock stands: 40 of its pods on the gate take
    MAX_NAMESPACE_UNBOUND_GRANTS places, and those already granted count; another namespace's pods still get theirs."""
    tenant = [gated(f"t-{i:02}", cpu="1m", age=3 * S) for i in range(40)]
    guests = [gated(f"g-{i}", cpu="1m", ns="guest") for i in range(3)]
    config = CONFIG.model_copy(update={"backfill": BackfillConfig(namespaces=["ns", "guest"], margin=5 * S)})
    result = crowded(0, waiting=tenant + guests, granted=5, config=config)
    placed = [b.pod.key for b in result.backfill.placed]
    assert placed == [p.key for p in tenant[:MAX_NAMESPACE_UNBOUND_GRANTS]] + [p.key for p in guests]
    refused = [r for r in result.backfill.released if r.name.startswith("t-")]
    assert len(refused) == 40 - MAX_NAMESPACE_UNBOUND_GRANTS
    assert all("32 backfill grants of namespace ns's pods not bound yet" in r.reason for r in refused)
    (later,) = crowded(0, waiting=[*tenant[:MAX_NAMESPACE_UNBOUND_GRANTS], gated("t-late", cpu="1m")],
                       granted=MAX_NAMESPACE_UNBOUND_GRANTS, config=config).backfill.released
    assert later.name == "t-late" and "MAX_NAMESPACE_UNBOUND_GRANTS" in later.reason


def test_a_node_at_the_bound_notes_no_room() -> None:
    """The webhook gates a pod with a runtime only where some node notes room (shared.backfill "Room"); a node whose
    grants are at MAX_NODE_GRANTS can grant nothing, so it notes none and pods are not held on the gate for it."""
    full, below = crowded(MAX_NODE_GRANTS, waiting=[]), crowded(MAX_NODE_GRANTS - 1, waiting=[])
    assert full.node_marks.get("n1", {}).get(keys.BACKFILL_ROOM) is None
    assert read_room(below.node_marks["n1"][keys.BACKFILL_ROOM]) is not None


def test_grants_of_pods_gone_or_finished_are_dropped() -> None:
    _, _, lock = seed_000([])
    gone = Grant("uid-gone", "ns/gone", lock.owner, NOW)
    result, _ = run([], grants={"uid-gone": gone})
    assert result.node_marks["n1"][keys.BACKFILL_GRANTS] is None


def test_without_the_switch_nothing_is_held_or_backfilled() -> None:
    config = load_config("maxLockedNodePercent: 90\nstarvation: {starvingJobTimeThreshold: 60s, "
                         "reservedNodePercent: 100}")
    result, _ = run([gated("short")], config=config)
    assert result.backfill.placed == () and "cover neither" in result.backfill.released[0].reason


def test_a_dry_run_lets_every_gated_pod_go() -> None:
    config = CONFIG.model_copy(update={"dry_run": True})
    result, _ = run([gated("short")], config=config)
    assert [r.reason for r in result.backfill.released] == ["dryRun"]


# --- the shared rules ---


def test_hold_refusal() -> None:
    on = BackfillConfig(namespaces=["ns"])
    runtime = {keys.MAXIMUM_RUNTIME: "10s"}
    assert hold_refusal({keys.BACKFILL: "true", **runtime}, {}, namespace="ns", queue="default", config=on) is None
    assert hold_refusal(runtime, {keys.BACKFILL: "true"}, namespace="ns", queue="default", config=on) is None
    assert hold_refusal({keys.BACKFILL: "true"}, runtime, namespace="ns", queue="default", config=on) is None
    assert hold_refusal(runtime, {}, namespace="ns", queue="default", config=on) == ""
    assert hold_refusal({keys.BACKFILL: "yes", **runtime}, {}, namespace="ns", queue="default", config=on) == ""
    assert "cover neither" in hold_refusal({keys.BACKFILL: "true", **runtime}, {}, namespace="other", queue="q",
                                           config=on)
    by_queue = BackfillConfig(queues=["q"])
    assert hold_refusal({keys.BACKFILL: "true", **runtime}, {}, namespace="x", queue="q", config=by_queue) is None
    assert hold_refusal({keys.BACKFILL: "true", **runtime}, {}, namespace="x", queue="z",
                        config=BackfillConfig(namespaces=["*"])) is None
    assert "not a duration" in hold_refusal({keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "soon"}, {},
                                            namespace="ns", queue="q", config=on)
    assert "not positive" in hold_refusal({keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "0s"}, {},
                                          namespace="ns", queue="q", config=on)


def test_grants_read_total_over_any_text() -> None:
    good = Grant("u1", "ns/a", "job-x", NOW)
    assert read_grants(grants_text([good])) == {"u1": good}
    for text in ("", "not json", "[1]", "[" * 100_000, json.dumps({"u1": "x"}),
                 json.dumps({"u1": {"pod": "ns/a", "owner": "job-x", "until": "yesterday"}}),
                 json.dumps({"u1": {"pod": 1, "owner": "job-x", "until": "2026-11-22T12:00:00Z"}})):
        assert read_grants(text) == {}
    assert grants_text([]) is None


def test_pinned_to() -> None:
    pinned = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}
    assert pinned_to(pinned, "n1") and not pinned_to(pinned, "n2")
    assert not pinned_to({}, "n1")
    two = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]}}}}
    assert not pinned_to(two, "n1"), "a second term lets the pod elsewhere"
    wide = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]}]}}}}
    assert not pinned_to(wide, "n1")
    assert not pinned_to({**pinned, "nodeName": "n2"}, "n1")


# --- entitlement: the grant, and only the grant ---


def backfilled_pod(uid: str = "uid-short", name: str = "short", node_name: str = "n1", owner: str = "job-x",
                   deadline: int | None = 10) -> dict:
    pod = {"metadata": {"name": name, "namespace": "ns", "uid": uid},
           "spec": {"tolerations": [lock_toleration(owner)],
                    **({"activeDeadlineSeconds": deadline} if deadline is not None else {}),
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
    return json.loads(json.dumps(pod)) | {"spec": {**pod["spec"], **{"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}}}}}


def test_the_agents_grant_lets_the_pod_carry_that_one_lock_toleration() -> None:
    grant = Grant("uid-short", "ns/short", "job-x", datetime.now(UTC) + timedelta(hours=1))
    grounds = Grounds(backfill_grants={"uid-short": ("n1", grant)})
    pod = backfilled_pod()
    rights = entitlement(pod, "ns", grounds)
    assert "job-x" in rights.owners and "backfills node n1" in rights.owners["job-x"]
    assert unentitled(pod, "ns", rights, {"n1": "job-x"}) == []
    # the same pod without the grant, another pod's uid, a pod pinned to another node, another lock's toleration
    assert unentitled(pod, "ns", entitlement(pod, "ns", Grounds()), {})
    other = backfilled_pod(uid="uid-other")
    assert unentitled(other, "ns", entitlement(other, "ns", grounds), {})
    elsewhere = backfilled_pod(node_name="n2")
    assert unentitled(elsewhere, "ns", entitlement(elsewhere, "ns", grounds), {})
    renamed = backfilled_pod(name="renamed")
    assert unentitled(renamed, "ns", entitlement(renamed, "ns", grounds), {})
    second = backfilled_pod(owner="job-y")
    assert unentitled(second, "ns", entitlement(second, "ns", grounds), {})
    undated = backfilled_pod(deadline=None)
    assert unentitled(undated, "ns", entitlement(undated, "ns", grounds), {}), "the toleration comes with a deadline"
    spent = Grounds(backfill_grants={"uid-short": ("n1", replace(grant, until=datetime.now(UTC) - S))})
    assert unentitled(pod, "ns", entitlement(pod, "ns", spent), {}), "a grant whose time has passed gives nothing"
    tight = Grounds(backfill_grants={"uid-short": ("n1", replace(grant, until=datetime.now(UTC) + 5 * S))})
    assert unentitled(pod, "ns", entitlement(pod, "ns", tight), {}), "a deadline of 10 s would outlast the grant"
    huge = backfilled_pod(deadline=2**62)
    assert unentitled(huge, "ns", entitlement(huge, "ns", grounds), {})


def test_a_grant_of_a_pod_still_gated_lasts_until_its_time_and_no_longer() -> None:
    """A pod whose narrowing the agent did not finish (its gate still on: a failed patch, or the cache behind) keeps
    its grant until the grant's `until`, then loses it; the pod-locks check never lets its toleration outlast it."""
    _, _, lock = seed_000([])
    live = Grant("uid-long", "ns/long", lock.owner, NOW + 15 * S)
    result, _ = run([gated("long", runtime="60s")], grants={"uid-long": live})
    assert result.backfill.released and keys.BACKFILL_GRANTS not in result.node_marks.get("n1", {})
    spent = Grant("uid-long", "ns/long", lock.owner, NOW - S)
    result, _ = run([gated("long", runtime="60s")], grants={"uid-long": spent})
    assert result.node_marks["n1"][keys.BACKFILL_GRANTS] is None


def test_a_pod_with_other_gates_or_a_huge_grace_period_is_let_go_and_nothing_breaks() -> None:
    other = gated("other")
    other = PodView.from_obj({"metadata": {"name": "other", "namespace": "ns", "uid": "uid-other",
                                           "annotations": dict(other.annotations),
                                           "creationTimestamp": "2026-11-22T11:59:58Z"},
                              "spec": {"schedulingGates": [{"name": keys.BACKFILL_GATE}, {"name": "mine"}],
                                       "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
                              "status": {"phase": "Pending"}})
    result, _ = run([other, gated("huge", grace=2**62)])
    why = {r.key: r.reason for r in result.backfill.released}
    assert "other scheduling gates" in why["ns/other"]
    assert "after n1 is needed" in why["ns/huge"]


def test_the_webhooks_lookup_indexes_the_grants_on_its_nodes() -> None:
    grant = Grant("uid-short", "ns/short", "job-x", NOW)
    n1 = NodeView.from_obj({"metadata": {"name": "n1", "annotations": {keys.BACKFILL_GRANTS: grants_text([grant])}},
                            "status": {"allocatable": {"cpu": "3"}}})
    assert Lookup(nodes={"n1": n1}).grounds.backfill_grants == {"uid-short": ("n1", grant)}


# --- the webhook's gate ---


def new_pod(annotations: dict[str, str], **spec: Any) -> dict:
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}], **spec}}


def roomy(name: str, room: dict[str, str], until: datetime, *, locked: bool = True) -> NodeView:
    """A node the agent noted backfill room on (keys.BACKFILL_ROOM), carrying a lock unless `locked` is False."""
    taints = [{"key": keys.LOCK, "value": "job-x", "effect": "NoSchedule"}] if locked else []
    return NodeView.from_obj({"metadata": {"name": name, "annotations": {keys.BACKFILL_ROOM: Room(
        Resources.parse(room), until).text()}}, "spec": {"taints": taints}, "status": {"allocatable": {"cpu": "8"}}})


def test_the_webhook_gates_a_pod_that_opts_in_and_says_why_it_does_not() -> None:
    now = datetime.now(UTC)
    lookup = Lookup(config=CONFIG, nodes={"n1": roomy("n1", {"cpu": "2", "memory": "4Gi"}, now + timedelta(hours=1))})
    wants = {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10m"}
    mutation = mutate_pod(new_pod(wants), "ns", lookup)
    assert {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": keys.BACKFILL_GATE}]} in mutation.patch
    keeps = mutate_pod(new_pod(wants, schedulingGates=[{"name": "other"}]), "ns", lookup)
    assert {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": keys.BACKFILL_GATE}} in keeps.patch
    for given, namespace, warned in (({keys.BACKFILL: "true"}, "ns", keys.MAXIMUM_RUNTIME),
                                           (wants, "elsewhere", "cover neither"),
                                           ({keys.MAXIMUM_RUNTIME: "10m"}, "ns", None)):
        mutation = mutate_pod(new_pod(given), namespace, lookup)
        assert not any("schedulingGates" in op["path"] for op in mutation.patch)
        assert (warned is None and not mutation.warnings) or any(warned in w for w in mutation.warnings)
    assert not any("schedulingGates" in op["path"] for op in mutate_pod(new_pod(wants, nodeName="n1"), "ns",
                                                                        lookup).patch)
    other = mutate_pod(new_pod(wants, schedulerName="volcano"), "ns", lookup)
    assert not any("schedulingGates" in op["path"] for op in other.patch)
    assert any("scheduled by 'volcano', not default-scheduler" in w for w in other.warnings), other.warnings
    assert any("schedulingGates" in op["path"] for op in mutate_pod(
        new_pod(wants, schedulerName="default-scheduler"), "ns", lookup).patch)
    dry = Lookup(config=CONFIG.model_copy(update={"dry_run": True}), nodes=lookup.nodes)
    assert not any("schedulingGates" in op["path"] for op in mutate_pod(new_pod(wants), "ns", dry).patch)


def test_the_webhook_holds_a_pod_only_where_a_locked_nodes_room_takes_it_in_time() -> None:
    """Issue 30: with no lock, or no lock whose room takes the pod before its needed-by time, the pod opting in is
    let in ungated (no warning: nothing is wrong with it), and the log says why."""
    now = datetime.now(UTC)
    wants = {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10m"}

    def held(*nodes: NodeView, requests: dict[str, str] | None = None) -> bool:
        pod = new_pod(wants)
        pod["spec"]["containers"][0]["resources"]["requests"] = requests or {"cpu": "1"}
        mutation = mutate_pod(pod, "ns", Lookup(config=CONFIG, nodes={n.name: n for n in nodes}))
        gated = any("schedulingGates" in op["path"] for op in mutation.patch)
        assert gated or "no locked node has room for it in time" in "; ".join(mutation.reasons), mutation.reasons
        assert not mutation.warnings
        return gated
    hour = now + timedelta(hours=1)
    assert not held(), "nothing locked"
    assert not held(roomy("n1", {"cpu": "2"}, hour, locked=False)), "a note left on a node whose lock is gone"
    assert not held(roomy("n1", {"cpu": "2"}, now + timedelta(minutes=9))), "ends after the room's until"
    assert held(roomy("n1", {"cpu": "2"}, now + timedelta(minutes=11)))
    assert not held(roomy("n1", {"cpu": "2"}, hour), requests={"cpu": "3"}), "too big for the room"
    assert not held(roomy("n1", {"cpu": "2"}, hour), requests={"cpu": "1", "nvidia.com/gpu": "1"})
    assert held(roomy("n1", {"cpu": "2"}, hour), roomy("n2", {"cpu": "4", "nvidia.com/gpu": "2"}, hour),
                requests={"cpu": "1", "nvidia.com/gpu": "1"}), "the second node's room takes it"
    unreadable = NodeView.from_obj({"metadata": {"name": "n3", "annotations": {keys.BACKFILL_ROOM: "{not json"}},
                                    "spec": {"taints": [{"key": keys.LOCK, "value": "job-x", "effect": "NoSchedule"}]},
                                    "status": {"allocatable": {"cpu": "8"}}})
    assert unreadable.backfill_room is None and not held(unreadable)
    for text in ('{"room": {"cpu": "x"}, "until": "2026-01-01T00:00:00Z"}', '{"room": {"cpu": "1"}, "until": 5}',
                 '{"room": [], "until": "2026-01-01T00:00:00Z"}', '{"room": {"cpu": "1"}, "until": "99999-01-01"}',
                 "[]", ""):
        assert read_room(text) is None, text


def test_the_agent_notes_each_slots_room_until_its_needed_by_time_less_the_margin() -> None:
    """Seed 000 at Time2: n1 has 1 cpu idle until pod-4 fits at +40 s; with the 5 s margin the room lasts until +35 s.
    The note is written once (not again while it holds) and removed when the lock goes."""
    result, lock = run([])
    room = read_room(result.node_marks["n1"][keys.BACKFILL_ROOM])
    assert room == Room(Resources.parse({"cpu": "1", "memory": "14Gi"}), NOW + 35 * S), room
    nodes, pods, _ = seed_000([])
    noted = replace(nodes[0], backfill_room=room)
    again = plan(snap([noted], pods, spare=1), CONFIG, NOW)
    assert keys.BACKFILL_ROOM not in again.node_marks.get("n1", {}), "unchanged: not rewritten"
    gone = plan(snap([replace(noted, taints=(), labels={}, annotations={})], pods[:2], spare=1), CONFIG, NOW)
    assert gone.node_marks["n1"][keys.BACKFILL_ROOM] is None
    off = plan(snap([noted], pods, spare=1), CONFIG.model_copy(update={"dry_run": True}), NOW)
    assert off.node_marks["n1"][keys.BACKFILL_ROOM] is None


# --- the writer's patches ---


def test_deadline_patch() -> None:
    assert deadline_patch({"spec": {}}, 10) == [{"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 10}]
    assert deadline_patch({"spec": {"activeDeadlineSeconds": 5}}, 10) == []
    assert deadline_patch({"spec": {"activeDeadlineSeconds": 50}}, 10)[0]["value"] == 10


def test_the_narrowing_the_writer_makes_is_what_the_grant_accepts() -> None:
    pod = {"metadata": {"resourceVersion": "7"}, "spec": {}}
    ops = narrow_patch(pod, "n1", (lock_toleration("job-x"),))
    spec: dict[str, Any] = {}
    for op in ops[1:]:
        assert op["op"] == "add"
        if op["path"] == "/spec/affinity":
            spec["affinity"] = op["value"]
    assert pinned_to(spec, "n1")


def test_a_flood_of_gated_pods_is_decided_a_bounded_batch_at_a_time() -> None:
    from agent.planner.backfill import MAX_DECISIONS
    # all within maxGateWait: past it, a pod is let go whatever its rank (test_backfill_gate_fairness)
    flood = [gated(f"f{i:04d}", runtime="10m", age=(10 + i) * S) for i in range(MAX_DECISIONS + 20)]
    result, _ = run(flood, config=CONFIG.model_copy(update={"backfill": CONFIG.backfill.model_copy(
        update={"max_gate_wait": timedelta(minutes=10)})}))
    assert len(result.backfill.released) == MAX_DECISIONS
    assert {r.name for r in result.backfill.released} == {f"f{i:04d}" for i in range(20, MAX_DECISIONS + 20)}, \
        "the oldest first"
    assert any("decision=defer pods=20" in n for n in result.notes)


# --- start estimates (issue 17): every waiting owner's expected start, published with the plan ---


def test_seed_000_pod_4_is_expected_to_start_when_pod_3_ends_with_or_without_backfill() -> None:
    """Seed 000 at Time2: pod-3 (60 s, started 20 s ago) ends at +40 s, when pod-4's 3 cpu fit. A pod backfilled
    meanwhile ends by then (with the margin), so the estimate is the same and the owner counts it."""
    without, lock = run([])
    (estimate,) = without.backfill.estimates
    assert (estimate.owner, estimate.kind, estimate.at, estimate.unknown) == (lock.owner, lock.kind, NOW + 40 * S, "")
    assert estimate.nodes == ("n1",) and estimate.backfilled == 0 and estimate.text == "2026-11-22T12:00:40Z"
    placed, _ = run([gated("short", runtime="10s")])
    assert placed.backfill.estimates[0].at == NOW + 40 * S
    grant = Grant("uid-short", "ns/short", lock.owner, NOW + 15 * S)
    short = replace(gated("short"), node_name="n1", backfill_gated=False, gated=False)
    later, _ = run([short], grants={grant.uid: grant})
    assert later.backfill.estimates[0].backfilled == 1 and later.backfill.estimates[0].at == NOW + 40 * S


def test_an_estimate_is_unknown_where_a_pod_without_a_maximum_runtime_must_end_first() -> None:
    pods = [pod("pod-2", "1", node_name="n1", started_ago=50 * S),
            pod("pod-3", "1", node_name="n1", runtime="60s", started_ago=20 * S),
            pod("pod-4", "3", age=timedelta(minutes=5))]
    first = plan(snap([node("n1", cpu="3")], pods, spare=1), CONFIG, NOW)
    result = plan(snap([node("n1", cpu="3", lock=first.locks["n1"])], pods, spare=1), CONFIG, NOW)
    (estimate,) = result.backfill.estimates
    assert estimate.at is None and estimate.text == "unknown: 1 pod without a maximum runtime on node n1"


def test_the_estimate_is_published_and_status_shows_it_with_the_backfill_count() -> None:
    from agent.commands import status_document, status_tables
    from agent.planner.plan import current_locks
    from agent.published import published_document

    nodes, pods, lock = seed_000([])
    snapshot = snap(nodes, pods, spare=1)
    document = json.loads(json.dumps(published_document(plan(snapshot, CONFIG, NOW), agent="a", planned=NOW,
                                                         config=CONFIG)))
    assert document["estimates"] == [{"owner": lock.owner, "kind": "job", "subject": lock.subject,
                                      "start": "2026-11-22T12:00:40Z", "unknown": None, "nodes": ["n1"],
                                      "backfilled": 0}]
    status = status_document(current_locks(snapshot), document, [], NOW)
    assert status["locks"][0]["start"] == "2026-11-22T12:00:40Z" and status["locks"][0]["backfilled"] == 0
    assert status["starvingJobs"][0]["start"] == "2026-11-22T12:00:40Z"
    table = status_tables(status)
    assert table[0].split()[5:7] == ["START", "BACKFILLED"] and table[1].split()[5:7] == ["2026-11-22T12:00:40Z", "0"]


def test_why_gives_the_owners_expected_start() -> None:
    from agent.planner.plan import current_locks
    from agent.published import published_document
    from agent.why import explain

    nodes, pods, lock = seed_000([])
    snapshot = snap(nodes, pods, spare=1)
    document = json.loads(json.dumps(published_document(plan(snapshot, CONFIG, NOW), agent="a", planned=NOW,
                                                         config=CONFIG)))
    pod_4 = {"metadata": {"name": "pod-4", "namespace": "ns", "uid": "uid-pod-4",
                          "creationTimestamp": "2026-11-22T11:55:00Z"},
             "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}],
                      "tolerations": [lock_toleration(lock.owner)]},
             "status": {"phase": "Pending"}}
    answer = explain(pod_4, podgroup=None, queue=None, reservations={}, locks=current_locks(snapshot),
                     published=document, config=CONFIG, now=NOW)
    assert (answer["reason"], answer["start"]) == ("locked", "2026-11-22T12:00:40Z")
    assert "; expected start 2026-11-22T12:00:40Z." in answer["explanation"], answer["explanation"]


def test_the_estimate_is_written_on_the_owners_pending_pod_once_and_again_only_when_it_moves() -> None:
    from agent.planner.backfill import ESTIMATE_TOLERANCE, estimate_marks

    result, _ = run([])
    (mark,) = result.backfill.estimate_marks
    assert (mark.kind, mark.namespace, mark.name, mark.text) == ("Pod", "ns", "pod-4", "2026-11-22T12:00:40Z")
    (estimate,) = result.backfill.estimates
    nodes, pods, _ = seed_000([])
    by_key = {p.key: p for p in pods}

    def written(text: str) -> dict[str, PodView]:
        return {**by_key, "ns/pod-4": replace(by_key["ns/pod-4"], annotations={keys.EXPECTED_START: text})}

    assert estimate_marks([estimate], written(mark.text), {}, NOW) == ()
    near = (NOW + 40 * S + ESTIMATE_TOLERANCE - S).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert estimate_marks([estimate], written(near), {}, NOW) == ()
    far = (NOW + 40 * S + ESTIMATE_TOLERANCE).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert estimate_marks([estimate], written(far), {}, NOW) == (mark,)
    for junk in ("soon", "2026-11-22T12:00:40", "9" * 5000, ""):  # a tenant's text is replaced, never an error
        assert estimate_marks([estimate], written(junk), {}, NOW) == (mark,)
    # never a time in the past: an estimate that says "now"
    assert estimate_marks([estimate], by_key, {}, NOW + 60 * S)[0].text == "2026-11-22T12:01:00Z"


def test_an_object_named_by_two_owners_carries_the_soonest_start_and_is_not_rewritten_back_and_forth() -> None:
    """A tenant can make one pod a task of two owners (two windows open to its namespace): one text, the soonest,
    written once; had each owner compared its own text, they would rewrite it at every plan."""
    from agent.planner.backfill import estimate_marks

    result, _ = run([])
    (estimate,) = result.backfill.estimates
    other = replace(estimate, owner="window-w", at=NOW + 90 * S)
    unknown = replace(estimate, owner="window-u", at=None,
                      unknown="unknown: 1 pod without a maximum runtime on node n1")
    _, pods, _ = seed_000([])
    by_key = {p.key: p for p in pods}
    for order in ([estimate, other, unknown], [unknown, other, estimate]):
        (mark,) = estimate_marks(order, by_key, {}, NOW)
        assert mark.text == "2026-11-22T12:00:40Z"
        done = {**by_key, "ns/pod-4": replace(by_key["ns/pod-4"], annotations={keys.EXPECTED_START: mark.text})}
        assert estimate_marks(order, done, {}, NOW) == ()


def test_an_estimate_that_says_now_or_unknown_on_the_same_node_is_not_rewritten() -> None:
    """A start in the past (an open window, a pod running past its maximum runtime) is "now" at every plan; the count
    of pods without a maximum runtime on the node moves whenever someone adds one: neither rewrites the annotation
    at every plan. Another node's unknown, or a real time again, does."""
    from agent.planner.backfill import estimate_marks

    result, _ = run([])
    (estimate,) = result.backfill.estimates
    _, pods, _ = seed_000([])
    by_key = {p.key: p for p in pods}

    def written(text: str) -> dict[str, PodView]:
        return {**by_key, "ns/pod-4": replace(by_key["ns/pod-4"], annotations={keys.EXPECTED_START: text})}

    past = replace(estimate, at=NOW - 30 * S)
    assert estimate_marks([past], written("2026-11-22T11:59:00Z"), {}, NOW + 60 * S) == ()
    assert estimate_marks([past], written("2026-11-22T12:00:00Z"), {}, NOW) == ()
    two = replace(estimate, at=None, unknown="unknown: 2 pods without a maximum runtime on node n1")
    assert estimate_marks([two], written("unknown: 1 pod without a maximum runtime on node n1"), {}, NOW) == ()
    (mark,) = estimate_marks([two], written("unknown: 1 pod without a maximum runtime on node n2"), {}, NOW)
    assert mark.text == two.unknown
    (mark,) = estimate_marks([estimate], written("unknown: 1 pod without a maximum runtime on node n1"), {}, NOW)
    assert mark.text == "2026-11-22T12:00:40Z"


def test_a_pod_made_again_under_the_same_name_is_not_counted_against_the_first_ones_estimate() -> None:
    from agent.planner.backfill import estimate_errors

    result, _ = run([])
    (estimate,) = result.backfill.estimates
    _, pods, _ = seed_000([])
    by_key = {p.key: p for p in pods}
    remembered, _ = estimate_errors({}, [estimate], by_key, NOW)
    again = replace(by_key["ns/pod-4"], uid="uid-another", node_name="n1", started=NOW + 300 * S)
    assert estimate_errors(remembered, [], {**by_key, "ns/pod-4": again}, NOW + 300 * S) == ({}, [])


def test_the_estimate_error_is_the_bind_against_the_first_estimate_once_and_memory_stays_bounded() -> None:
    from agent.planner.backfill import FORGET_ESTIMATE_AFTER, EstimateError, estimate_errors

    result, lock = run([])
    (estimate,) = result.backfill.estimates
    _, pods, _ = seed_000([])
    by_key = {p.key: p for p in pods}
    remembered, errors = estimate_errors({}, [estimate], by_key, NOW)
    assert errors == [] and remembered["ns/pod-4"].at == NOW + 40 * S
    later = replace(estimate, at=NOW + 50 * S)  # a later plan moves it: the first estimate is kept
    remembered, errors = estimate_errors(remembered, [later], by_key, NOW + 10 * S)
    assert errors == [] and remembered["ns/pod-4"].at == NOW + 40 * S
    bound = {**by_key, "ns/pod-4": replace(by_key["ns/pod-4"], node_name="n1", started=NOW + 43 * S)}
    remembered, errors = estimate_errors(remembered, [], bound, NOW + 44 * S)
    assert errors == [EstimateError(lock.kind, 3.0)] and remembered == {}
    remembered, errors = estimate_errors({}, [estimate], by_key, NOW)
    assert estimate_errors(remembered, [], {}, NOW + S) == ({}, []), "a pod gone is forgotten, not counted"
    kept, _ = estimate_errors(remembered, [], by_key, NOW + FORGET_ESTIMATE_AFTER)
    assert kept == remembered
    assert estimate_errors(remembered, [], by_key, NOW + FORGET_ESTIMATE_AFTER + S) == ({}, [])
    unknown = replace(estimate, at=None, unknown="unknown: 1 pod without a maximum runtime on node n1")
    assert estimate_errors({}, [unknown], by_key, NOW) == ({}, [])


def backfilled(name: str, *, started: datetime, deadline: int | None = 10, grace: int = 0, node_name: str = "n1",
               phase: str = "Running") -> PodView:
    """A pod let onto n1 earlier: bound, started at `started` (status.startTime, whole seconds as the kubelet writes
    it), with the activeDeadlineSeconds it was given."""
    spec: dict[str, Any] = {"nodeName": node_name, "terminationGracePeriodSeconds": grace,
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return PodView.from_obj({
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "creationTimestamp": "2026-11-22T11:59:00Z",
                     "annotations": {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10s"}},
        "spec": spec, "status": {"phase": phase, "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")}})


def cuts_of(pods: list[PodView], until: datetime) -> dict[str, int]:
    _, _, lock = seed_000([])
    grants = {p.uid: Grant(p.uid, p.key, lock.owner, until) for p in pods}
    result, _ = run(pods, grants=grants)
    assert all(c.owner == lock.owner and c.until == until and c.node == "n1" for c in result.backfill.cuts)
    return {c.key: c.deadline for c in result.backfill.cuts}


def test_a_backfilled_pod_that_started_within_its_margin_keeps_its_deadline() -> None:
    """Granted at NOW - 3 s with 10 s + 5 s margin (until NOW + 12 s), bound 4 s later: 10 s still ends by until."""
    assert cuts_of([backfilled("on-time", started=NOW + S)], until=NOW + 12 * S) == {}


def test_a_backfilled_pod_that_started_late_has_its_deadline_cut_to_end_by_its_grant() -> None:
    """kube-scheduler bound it 8 s after the margin was spent: 10 s would run 8 s into the owner's time. Cut to
    until - grace - startTime, to the second below; at least 1 when it started after until (the kubelet then stops it
    at once); a cut pod is not cut again; its grace counts."""
    until = NOW + 12 * S
    assert cuts_of([backfilled("late", started=NOW + 10 * S)], until) == {"ns/late": 2}
    assert cuts_of([backfilled("very-late", started=NOW + 20 * S)], until) == {"ns/very-late": 1}
    assert cuts_of([backfilled("graceful", started=NOW, grace=5)], until) == {"ns/graceful": 7}
    assert cuts_of([backfilled("cut", started=NOW + 10 * S, deadline=2)], until) == {}
    assert cuts_of([backfilled("no-deadline", started=NOW + 10 * S, deadline=None)], until) == {"ns/no-deadline": 2}


def narrowed_earlier(name: str, owner: str, *, started: datetime, deadline: int | None = 10) -> PodView:
    """A pod narrowed for a grant of `owner`'s lock on n1 in the past (the lock toleration, the pin, the deadline),
    whose grant ended before it bound; bound to n1 since, started at `started`."""
    obj = backfilled_pod(uid=f"uid-{name}", name=name, owner=owner, deadline=deadline)
    obj["metadata"] |= {"creationTimestamp": "2026-11-22T11:50:00Z",
                        "annotations": {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10s"}}
    obj["spec"] |= {"nodeName": "n1", "terminationGracePeriodSeconds": 0}
    return PodView.from_obj({**obj, "status": {"phase": "Running",
                                               "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")}})


def test_a_pod_narrowed_for_a_grant_that_ended_and_bound_under_the_owners_next_lock_is_stopped() -> None:
    """Its grant went with the owner's earlier lock (grant_lives), its toleration and pin stayed: bound under the same
    owner's lock now, with no grant to cut to, it would run its whole deadline into the owner's time. It is cut to 1
    (the kubelet stops it at once), the writer saying why, whether it carries the toleration as narrowing writes it or
    as its tenant wrote it while its grant let it (no effect: narrowing then adds none); not when it started before
    this lock began (it ran there already when the lock chose the node), has no deadline (narrowing writes one),
    tolerates another owner's lock, or never opted into backfill (no grant could have narrowed it)."""
    _, _, lock = seed_000([])
    late = narrowed_earlier("late", lock.owner, started=NOW + 2 * S)
    result, _ = run([late])
    assert [(c.key, c.deadline, c.ungranted, c.until) for c in result.backfill.cuts] == [
        ("ns/late", 1, True, lock.since)]
    own = narrowed_earlier("own", lock.owner, started=NOW + 2 * S)
    own = replace(own, tolerations=({"key": keys.LOCK, "operator": "Equal", "value": lock.owner},))
    result, _ = run([own])
    assert [c.key for c in result.backfill.cuts] == ["ns/own"]
    for other in (narrowed_earlier("before", lock.owner, started=lock.since - 5 * S),
                  narrowed_earlier("no-deadline", lock.owner, started=NOW + 2 * S, deadline=None),
                  narrowed_earlier("cut", lock.owner, started=NOW + 2 * S, deadline=1),
                  narrowed_earlier("elsewhere", "job:other", started=NOW + 2 * S),
                  replace(late, annotations={keys.MAXIMUM_RUNTIME: "10s"})):
        result, _ = run([other])
        assert result.backfill.cuts == (), other.key


def test_a_pod_bound_under_its_own_grant_or_entitled_to_the_lock_is_not_stopped() -> None:
    """With a live grant naming it the grant's own cut decides (none here: it started within its margin); the lock's
    owner's pods carry the same toleration by right, and trusted namespaces' whatever they bring."""
    _, _, lock = seed_000([])
    granted = narrowed_earlier("granted", lock.owner, started=NOW + S)
    result, _ = run([granted], grants={granted.uid: Grant(granted.uid, granted.key, lock.owner, NOW + 12 * S)})
    assert result.backfill.cuts == ()
    trusting = load_config("""
maxLockedNodePercent: 90
starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 100}
backfill: {namespaces: [ns], margin: 5s}
webhook: {trustedNamespaces: [ns]}
""")
    result, _ = run([narrowed_earlier("trusted", lock.owner, started=NOW + 2 * S)], config=trusting)
    assert result.backfill.cuts == ()


def test_no_cut_once_the_node_is_no_longer_locked_for_the_grants_owner() -> None:
    """The owner's lock went (its job deleted, say): nobody needs the node back by `until`, the late pod runs on."""
    late = backfilled("late", started=NOW + 10 * S)
    result, _ = run([late], grants={late.uid: Grant(late.uid, late.key, "job-gone", NOW + 12 * S)})
    assert result.backfill.cuts == ()


def test_a_grant_with_a_time_out_of_range_is_not_read() -> None:
    """A hand edit of the node (only node writers can) with a year-1 `until` would overflow the cut's arithmetic
    at every plan: it is not read, as views read no time outside 1970-9000."""
    text = json.dumps({"u1": {"pod": "ns/p", "owner": "job-x", "until": "0001-01-01T00:00:00Z"},
                       "u2": {"pod": "ns/q", "owner": "job-x", "until": "9999-12-31T23:59:59Z"},
                       "u3": {"pod": "ns/r", "owner": "job-x", "until": "2026-11-22T12:00:15Z"}})
    assert set(read_grants(text)) == {"u3"}


def test_only_running_pods_of_the_grant_on_its_node_are_cut() -> None:
    until = NOW + 12 * S
    assert cuts_of([backfilled("done", started=NOW + 10 * S, phase="Succeeded"),
                    backfilled("elsewhere", started=NOW + 10 * S, node_name="n2")], until) == {}
    # a pod that tolerates the lock without a grant (an owner, a DaemonSet) is none of backfill's business
    result, _ = run([backfilled("ungranted", started=NOW + 10 * S)])
    assert result.backfill.cuts == ()
