"""Issue 34: the backfill gate decided between plans (agent/planner/plan.py plan_gate), against the next full plan:
when only gated pods arrived since the last plan, the gate pass and the full plan decide them alike."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import event, given, settings
from hypothesis import strategies as st

from agent.planner.model import Snapshot
from agent.planner.plan import current_locks, plan, plan_gate
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
