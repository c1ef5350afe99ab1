"""The backfill gate across tenants (agent/planner/backfill.py plan_backfill, fair_share): one plan decides at most
MAX_DECISIONS gated pods, taken in turns across namespaces, and lets go every pod past backfill.maxGateWait whatever
its rank, so one tenant's flood of older gated pods keeps no other tenant's pods on the gate."""
from __future__ import annotations

from datetime import timedelta

from agent.planner.backfill import MAX_DECISIONS, fair_share
from agent.planner.plan import plan
from agent.planner.reservations import MAX_HANDOVER_DECISIONS
from shared import keys
from shared.config import load_config
from shared.timestamps import stamp
from shared.views import PodView
from tests.builders import NOW, node, snap
from tests.unit.test_backfill_plan import gated, run

S = timedelta(seconds=1)
CONFIG = load_config("""
maxLockedNodePercent: 90
starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 100}
backfill: {namespaces: ['*'], margin: 5s, maxGateWait: 30s}
""")


def test_turns_across_namespaces_oldest_first_in_each() -> None:
    flood = [gated(f"a-{i}", ns="flood", age=(500 - i) * S) for i in range(300)]  # all older than anyone else's
    others = [gated(f"b-{i}", ns="team-b", age=(20 - i) * S) for i in range(3)] + [gated("c-0", ns="team-c", age=S)]
    chosen = fair_share(flood + others, 10)
    assert len(chosen) == 10
    keys = {p.key for p in chosen}
    assert {"team-b/b-0", "team-b/b-1", "team-b/b-2", "team-c/c-0"} <= keys, keys
    assert {p.key for p in chosen if p.namespace == "flood"} == {f"flood/a-{i}" for i in range(6)}
    assert [p.created for p in chosen] == sorted(p.created for p in chosen)
    assert fair_share(others, 10) == sorted(others, key=lambda p: (p.created, p.key))


def test_a_flood_of_older_gated_pods_keeps_no_other_tenant_on_the_gate() -> None:
    flood = [gated(f"a-{i}", ns="flood", runtime="10m", age=(20 + i % 5) * S) for i in range(2 * MAX_DECISIONS)]
    mine = gated("mine", ns="team-b", runtime="10s", age=2 * S)
    result, lock = run([*flood, mine], config=CONFIG)
    decided = {p.pod.key for p in result.backfill.placed} | {f"{r.namespace}/{r.name}" for r in result.backfill.released}
    assert "team-b/mine" in decided, "the other tenant's pod waited behind the flood"
    assert len(decided) == MAX_DECISIONS


def test_every_pod_past_max_gate_wait_is_let_go_whatever_its_rank() -> None:
    overdue = [gated(f"old-{i}", ns="flood", age=(31 + i) * S) for i in range(3 * MAX_DECISIONS)]
    fresh = [gated(f"new-{i}", ns="flood", runtime="10m", age=S) for i in range(2 * MAX_DECISIONS)]
    result, _ = run([*overdue, *fresh], config=CONFIG)
    released = {f"{r.namespace}/{r.name}": r.reason for r in result.backfill.released}
    for pod in overdue:
        assert "maxGateWait" in released.get(pod.key, ""), (pod.key, released.get(pod.key))
    decided_fresh = [p for p in fresh if p.key in released or p.key in {b.pod.key for b in result.backfill.placed}]
    assert len(decided_fresh) == MAX_DECISIONS


def test_pods_past_max_gate_wait_are_let_go_a_bounded_batch_a_plan_in_turns() -> None:
    """Each release is a write: at most MAX_OVERDUE_RELEASES a plan, taken in turns across namespaces, so a tenant's
    flood of pods carrying the gate (any pod may write it) neither holds the writer for minutes nor another's pods."""
    from agent.planner.backfill import MAX_OVERDUE_RELEASES
    flood = [gated(f"a-{i}", ns="flood", age=(500 + i) * S) for i in range(MAX_OVERDUE_RELEASES + 50)]
    mine = gated("mine", ns="team-b", age=40 * S)
    result, _ = run([*flood, mine], config=CONFIG)
    released = {f"{r.namespace}/{r.name}" for r in result.backfill.released}
    assert len(released) == MAX_OVERDUE_RELEASES and "team-b/mine" in released
    assert any(f"decision=defer pods=51" in n for n in result.notes), result.notes


def test_a_flood_of_handover_gates_is_decided_in_turns_a_bounded_batch_at_a_time() -> None:
    """Anyone may write Reservoir's handover gate on their own pods: one plan decides at most MAX_HANDOVER_DECISIONS
    of them (each is claimed against every Reservation, and each decision is a write), in turns across namespaces, so
    a flood of older ones keeps no other tenant's owner waiting behind it."""
    def handover_gated(name: str, ns: str, age: timedelta) -> PodView:
        return PodView.from_obj({
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
                         "creationTimestamp": stamp(NOW - age)},
            "spec": {"schedulingGates": [{"name": keys.HANDOVER_GATE}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Pending"}})
    flood = [handover_gated(f"f-{i}", "flood", (900 - i) * S) for i in range(MAX_HANDOVER_DECISIONS + 50)]
    theirs = [handover_gated(f"b-{i}", "team-b", S) for i in range(2)]
    result = plan(snap([node("n1")], [*flood, *theirs], spare=1), CONFIG, NOW)  # no Reservation: every one ungated
    decided = {f"{h.namespace}/{h.name}" for h in result.handovers}
    assert len(decided) == MAX_HANDOVER_DECISIONS and {"team-b/b-0", "team-b/b-1"} <= decided
    assert any("more than" in note and "handover gate" in note for note in result.notes)
