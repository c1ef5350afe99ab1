"""Issue 34: the backfill gate decided between plans (agent/planner/plan.py plan_gate), against the next full plan:
when only gated pods arrived since the last plan, the gate pass and the full plan decide them alike."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import event, given, settings
from hypothesis import strategies as st

from dataclasses import replace

from agent.controller import Agent, OwnWrites
from agent.planner.model import Snapshot
from agent.planner.plan import current_locks, plan, plan_gate
from shared import keys
from shared.ownership import JobRef
from tests.builders import NOW, node, pod, snap
from tests.unit.test_backfill_plan import CONFIG, gated, seed_000

S = timedelta(seconds=1)


def decisions(backfill) -> tuple:  # type: ignore[no-untyped-def]
    return (tuple((b.pod.key, b.node, b.owner, b.deadline, b.ends) for b in backfill.placed),
            tuple(sorted((r.key, r.reason) for r in backfill.released)), backfill.marks)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("500m", "1", "2")), st.sampled_from(("5s", "10s", "35s", "2m", None)),
                          st.sampled_from(("ns", "other")), st.integers(1, 20)), min_size=1, max_size=8),
       st.integers(0, 5))
def test_the_gate_pass_decides_new_gated_pods_as_the_next_full_plan_would(arrivals: list, later: int) -> None:
    """Seed 000's lock on n1 (1 cpu idle, the owner fits at +40 s) and a plan made; then gated pods arrive (any size,
    runtime, namespace) and `later` seconds pass: plan_gate on the new snapshot with the last plan equals the backfill
    of a full plan on it."""
    nodes, pods, lock = seed_000([])
    first = plan(snap(nodes, pods, spare=1), CONFIG, NOW)
    assert first.locks["n1"].owner == lock.owner
    held = [gated(f"g{i}", cpu, runtime=runtime, ns=ns, age=age * S / 10)
            for i, (cpu, runtime, ns, age) in enumerate(arrivals)]
    after = snap(nodes, pods + held, spare=1)
    now = NOW + later * S
    full = plan(after, CONFIG, now, current_locks(after), previous=first)
    assert full.locks == first.locks
    fast = plan_gate(after, CONFIG, now, first)
    assert decisions(fast) == decisions(full.backfill)
    event(f"backfilled: {min(len(fast.placed), 2)}")


def test_the_gate_pass_places_a_short_pod_under_the_lock_and_lets_a_long_one_go() -> None:
    nodes, pods, lock = seed_000([])
    first = plan(snap(nodes, pods, spare=1), CONFIG, NOW)
    fast = plan_gate(snap(nodes, pods + [gated("short", runtime="10s"), gated("long", runtime="2m")], spare=1),
                     CONFIG, NOW + S, first)
    assert [(b.pod.key, b.node, b.owner) for b in fast.placed] == [("ns/short", "n1", lock.owner)]
    (released,) = fast.released
    assert released.key == "ns/long" and "after n1 is needed" in released.reason
    assert "n1" in fast.marks, "the grant is written on the node before the pod is let on"


def test_the_gate_pass_uses_the_node_states_of_now_not_of_the_last_plan() -> None:
    """A pod bound on n1 since the last plan takes the room: the gate pass sees it (node_states from the snapshot)."""
    nodes, pods, _ = seed_000([])
    first = plan(snap(nodes, pods, spare=1), CONFIG, NOW)
    filler = pod("filler", "1", node_name="n1", runtime="10s")
    fast = plan_gate(Snapshot(nodes={n.name: n for n in [*nodes, node("spare-0", cpu="100m")]},
                              pods=[*pods, filler, gated("short", runtime="10s")]), CONFIG, NOW + S, first)
    assert not fast.placed and "does not fit the room on n1" in fast.released[0].reason


def pod_obj(name: str, *, gated: bool = False, node_name: str = "", rv: str = "1",
            owner: str = "") -> dict:  # type: ignore[type-arg]
    spec: dict = {"nodeName": node_name,  # type: ignore[type-arg]
                  "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": keys.BACKFILL_GATE}]
    meta: dict = {"name": name, "namespace": "ns", "uid": f"uid-{name}",  # type: ignore[type-arg]
                  "resourceVersion": rv, "creationTimestamp": "2026-11-22T11:59:00Z",
                  "annotations": {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10s"} if gated else {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": "j",
                                    "controller": True}]
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


def test_a_gated_arrival_wakes_the_gate_and_a_change_it_cannot_judge_leaves_the_pods_to_the_next_plan() -> None:
    """Agent bookkeeping for gate passes: a pod arriving on the gate wakes the gate loop and keeps passes safe; a new
    pending pod of a job the last plan locked for (its needed-by may move), a change of a Queue, PodGroup or
    Reservation, or of the config, makes the next gate pass step aside until a plan has read it; pods of other jobs
    binding or arriving do not."""
    agent = Agent(None)  # type: ignore[arg-type]
    agent._locked_owners = frozenset({JobRef("ns", "Job", "train").owner_id})
    agent.pods._replace([pod_obj("busy", node_name="n1")])
    assert not agent._gate_unsafe and not agent.gate.is_set()
    agent.pods.apply_event({"type": "ADDED", "object": pod_obj("short", gated=True, rv="2")})
    assert agent.gate.is_set() and not agent._gate_unsafe
    agent.pods.apply_event({"type": "ADDED", "object": pod_obj("web-1", rv="3", owner="web")})
    agent.pods.apply_event({"type": "MODIFIED", "object": pod_obj("short", rv="4")})  # its gate lifted
    assert not agent._gate_unsafe, "another job's pod, or a gate lifted, changes no lock's needed-by"
    agent.pods.apply_event({"type": "ADDED", "object": pod_obj("train-7", rv="5", owner="train")})
    assert agent._gate_unsafe, "a new task of the locked job"
    agent._gate_unsafe = False
    agent.queues.apply_event({"type": "ADDED", "object": {"metadata": {"name": "q", "uid": "q", "resourceVersion": "6",
                                                                       "creationTimestamp": "2026-11-22T11:00:00Z"},
                                                          "spec": {"weight": 1}}})
    assert agent._gate_unsafe, "a Queue changed"


def test_a_pass_waits_until_the_caches_show_the_gates_it_lifted_and_the_grants_it_wrote() -> None:
    nodes, pods, _ = seed_000([])
    first = plan(snap(nodes, pods, spare=1), CONFIG, NOW)
    fast = plan_gate(snap(nodes, pods + [gated("short", runtime="10s"), gated("long", runtime="2m")], spare=1),
                     CONFIG, NOW + S, first)
    writes = OwnWrites.of(fast, dry_run=False)
    assert set(writes.lifted) == {("ns", "short"), ("ns", "long")} and writes.granted == {"n1": {"uid-short"}}
    still = {("ns", "short"): gated("short"), ("ns", "long"): gated("long")}
    assert not writes.seen(still, {"n1": nodes[0]})
    lifted = {key: replace(view, backfill_gated=False, gated=False) for key, view in still.items()}
    assert not writes.seen(lifted, {"n1": nodes[0]}), "the grant is not on the node yet"
    granted = replace(nodes[0], backfill_grants={"uid-short": fast.placed[0]})  # type: ignore[dict-item]
    assert writes.seen(lifted, {"n1": granted}) and writes.seen({}, {}), "seen, or gone"
    assert OwnWrites.of(fast, dry_run=True).granted == {}, "a dry run grants nothing"
