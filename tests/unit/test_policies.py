"""The planner's registry of named policies, the one displacement table, and what every policy shares: precedence,
the tag on every note, a kept lock's `since`, the context handed from one policy to the next."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from agent.planner.capacity import node_states
from agent.planner.displacement import DISPLACES, TAKES_FROM_LIVE_JOBS, displaces, may_take
from agent.planner.model import Lock, lock_on
from agent.planner.plan import POLICIES, plan
from agent.planner.policy import PlanContext, kept_since
from shared.config import load_config
from shared import keys
from shared.keys import LockKind
from shared.ownership import JobRef, queue_owner_id, reservation_owner_id, window_owner_id
from shared.timestamps import stamp
from shared.views import QueueView
from tests.builders import CONFIG, NOW, node, pod, snap

JOB = JobRef("ns", "Pod", "big").owner_id
OWNERS = {LockKind.JOB: JOB, LockKind.QUEUE: queue_owner_id("q"), LockKind.WINDOW: window_owner_id("w"),
          LockKind.RESERVATION: reservation_owner_id("r")}


def lock(kind: LockKind, node_name: str = "n1", since: datetime = NOW) -> Lock:
    return Lock(node=node_name, owner=OWNERS[kind], kind=kind, subject="s", reason="r", since=since)


def test_the_registry_runs_in_designs_precedence_with_unique_names() -> None:
    assert [p.name for p in POLICIES] == ["reservation", "guarantee", "window", "starvation"]
    assert [p.kind for p in POLICIES] == [LockKind.RESERVATION, LockKind.QUEUE, LockKind.WINDOW, LockKind.JOB]
    assert [p.seed for p in POLICIES] == ["003", "002", "004", "000"]


def test_the_displacement_table_has_a_row_for_every_policy() -> None:
    assert set(DISPLACES) == set(LockKind) == {p.kind for p in POLICIES}
    assert TAKES_FROM_LIVE_JOBS <= set(LockKind)


@pytest.mark.parametrize("policy, takes", [
    (LockKind.RESERVATION, set()),
    (LockKind.QUEUE, {LockKind.WINDOW, "idle job"}),
    (LockKind.WINDOW, {LockKind.JOB, "idle job"}),
    (LockKind.JOB, {LockKind.RESERVATION, LockKind.QUEUE, LockKind.WINDOW, "idle job"}),
])
def test_what_each_policy_may_take_over(policy: LockKind, takes: set) -> None:
    """The module docstring's table: a live job's lock (JOB), the same job's lock once it is not live ("idle job")."""
    for kind in LockKind:
        assert displaces(policy, lock(kind), live_jobs={JOB}) == (kind in takes), kind
    assert displaces(policy, lock(LockKind.JOB), live_jobs=set()) == ("idle job" in takes)


def test_a_policy_may_always_keep_its_own_lock_and_an_unlocked_node() -> None:
    for policy in LockKind:
        assert may_take(policy, None, owner="anyone", live_jobs={JOB})
        for kind in LockKind:
            assert may_take(policy, lock(kind), owner=OWNERS[kind], live_jobs={JOB})


def test_a_window_takes_a_live_jobs_node_a_guarantee_does_not() -> None:
    """The documented asymmetry, through the planner: a live starving job holds n0 (it is still pending)."""
    held = lock(LockKind.JOB, "n0")
    nodes = [node("n0", labels={"business": "ebook"}, lock=held), node("n1")]
    big = pod("big", "4")
    windows = load_config("""
maxLockedNodePercent: 90
starvation: {enabled: false}
windows:
- {name: w, nodeSelector: {business: ebook}, resources: {cpu: "4"}, cron: "0 13 - 14 * * *", startReserveAgo: 2h}
""")
    assert plan(snap(nodes, [big]), windows, NOW).locks["n0"].owner == window_owner_id("w")
    queue = QueueView.from_obj({"metadata": {"name": "q", "uid": "q", "creationTimestamp": stamp(NOW),
                                             "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                                "spec": {"guarantee": {"resource": {"cpu": "4"}}}})
    guaranteed = plan(replace(snap(nodes, [big]), queues={"q": queue}), windows.model_copy(update={"windows": []}), NOW)
    assert [n for n, held in guaranteed.locks.items() if held.owner == queue_owner_id("q")] == ["n1"]


def test_every_note_is_tagged_with_its_policy() -> None:
    running = [pod(f"s-{i}", "1", node_name="n1") for i in range(4)]
    urgent = pod("urgent", "2", priority=100, age=timedelta(seconds=1))
    result = plan(snap([node("n1"), node("n2", cpu="8")], running + [pod("big", "4", priority=1), urgent]),
                  CONFIG, NOW)
    assert result.notes == ["policy=starvation job=ns/Pod/big decision=wait reason=higher-priority pod ns/urgent "
                            "can be placed now"]
    queue = QueueView.from_obj({"metadata": {"name": "huge", "uid": "q", "creationTimestamp": stamp(NOW),
                                             "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                                "spec": {"guarantee": {"resource": {"cpu": "100"}}}})
    result = plan(replace(snap([node("n1")], []), queues={"huge": queue}), CONFIG, NOW)
    assert len(result.notes) == 1 and result.notes[0].startswith("policy=guarantee queue=huge decision=no-lock ")


def test_a_kept_lock_keeps_its_since_and_a_node_changing_hands_starts_afresh() -> None:
    earlier = NOW - timedelta(hours=1)
    current = {"n1": lock(LockKind.QUEUE, since=earlier)}
    assert kept_since(current, node="n1", owner=OWNERS[LockKind.QUEUE], now=NOW) == earlier
    assert kept_since(current, node="n1", owner=OWNERS[LockKind.WINDOW], now=NOW) == NOW
    assert kept_since(current, node="n2", owner=OWNERS[LockKind.QUEUE], now=NOW) == NOW


def test_a_starvation_lock_kept_through_a_replan_keeps_since_and_expiry() -> None:
    small = [pod(f"small-{i}", "1", node_name="n1") for i in range(4)]
    first = plan(snap([node("n1")], small + [pod("big", "4")], spare=1), CONFIG, NOW)
    later = plan(snap([node("n1", lock=first.locks["n1"])], small + [pod("big", "4")], spare=1), CONFIG,
                 NOW + timedelta(minutes=5))
    assert later.locks["n1"].since == NOW and later.locks["n1"].expires == NOW + CONFIG.starvation.max_lock_duration


def test_the_context_hands_taken_nodes_and_the_budget_on() -> None:
    snapshot = snap([node("n1"), node("n2")], [])
    context = PlanContext(snapshot=snapshot, config=CONFIG, now=NOW, states=node_states(snapshot.nodes, ()),
                          current={}, taken=frozenset({"n0"}), budget=3)
    after = context.after({"n1": lock(LockKind.WINDOW, "n1"), "n2": lock(LockKind.WINDOW, "n2")})
    assert after.taken == {"n0", "n1", "n2"} and after.budget == 1 and context.budget == 3
    assert context.after({}) is context


def test_lock_info_is_written_whole_and_read_back() -> None:
    held = Lock(node="n1", owner=JOB, kind=LockKind.JOB, subject="ns/Pod/big", reason="r", since=NOW,
                expires=NOW + timedelta(hours=2), tasks=("ns/big",))
    assert set(held.info()) == {"owner", "kind", "subject", "reason", "since", "expires", "reserved", "tasks"}
    assert lock_on(node("n1", lock=held)) == held
