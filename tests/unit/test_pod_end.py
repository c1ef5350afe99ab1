"""A running pod's end (agent/planner/capacity.py pod_end, DESIGN 4.8): the earliest of its declared runtime, its
activeDeadlineSeconds plus grace, and its backfill grant's until. A tenant rewrites the annotation whenever it likes;
nothing it writes after a grant moves a bound later, so no second backfill is granted against the lie."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from agent.planner.backfill import backfill_slot, backfill_verdict
from agent.planner.capacity import NodeState, future_idle, node_states, pod_end
from agent.planner.model import Lock
from shared import keys
from shared.backfill import Grant
from shared.keys import LockKind
from shared.timestamps import stamp
from shared.views import NodeView, PodView
from tests.builders import NOW, pod

S = timedelta(seconds=1)
OWNER = "job-team-b-big"


def running(name: str, cpu: str, *, runtime: str | None, started_ago: timedelta, deadline: int | None = None,
            grace: int = 30) -> PodView:
    spec: dict = {"nodeName": "n1", "terminationGracePeriodSeconds": grace,
                  "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return PodView.from_obj({
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                     "annotations": {keys.MAXIMUM_RUNTIME: runtime} if runtime else {},
                     "creationTimestamp": stamp(NOW - started_ago - S)},
        "spec": spec, "status": {"phase": "Running", "startTime": stamp(NOW - started_ago)}})


def locked_node(grants: dict[str, Grant]) -> NodeView:
    lock = Lock(node="n1", owner=OWNER, kind=LockKind.JOB, subject="team-b/big", reason="starving job", since=NOW)
    return NodeView.from_obj({
        "metadata": {"name": "n1", "creationTimestamp": stamp(NOW - timedelta(days=1)),
                     "labels": {keys.LOCK: OWNER, keys.LOCK_KIND: "job"},
                     "annotations": {keys.LOCK_INFO: lock.info_json(),
                                     keys.BACKFILL_GRANTS: json.dumps({uid: g.entry() for uid, g in grants.items()})}},
        "spec": {"taints": [{"key": keys.LOCK, "value": OWNER, "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}})


def state(pods: list[PodView], grants: dict[str, Grant]) -> NodeState:
    return node_states({"n1": locked_node(grants)}, pods)["n1"]


def test_the_earliest_of_the_three_bounds() -> None:
    started = NOW - 10 * S
    assert pod_end(running("p", "1", runtime="120s", started_ago=10 * S)) == started + 120 * S
    assert pod_end(running("p", "1", runtime=None, started_ago=10 * S)) is None
    # the kubelet ends it at its deadline, and kills it within its grace
    assert pod_end(running("p", "1", runtime=None, started_ago=10 * S, deadline=60, grace=5)) == started + 65 * S
    assert pod_end(running("p", "1", runtime="3h", started_ago=10 * S, deadline=60, grace=0)) == started + 60 * S
    assert pod_end(running("p", "1", runtime="30s", started_ago=10 * S, deadline=60)) == started + 30 * S
    grant = {"uid-p": Grant("uid-p", "team-a/p", OWNER, NOW + 20 * S)}
    assert pod_end(running("p", "1", runtime="3h", started_ago=10 * S, deadline=600), grant) == NOW + 20 * S
    assert pod_end(running("p", "1", runtime=None, started_ago=10 * S), grant) == NOW + 20 * S
    # another pod's grant is not this pod's bound
    assert pod_end(running("q", "1", runtime=None, started_ago=10 * S), grant) is None
    # a deadline of int64 seconds bounds nothing a plan looks at, and overflows nothing
    assert pod_end(running("p", "1", runtime="1h", started_ago=10 * S, deadline=2**63 - 1)) == started + 3600 * S


@given(first=st.integers(1, 7200), later=st.sampled_from(["1s", "90s", "3h", "8760h", "2562047h"]),
       deadline=st.one_of(st.none(), st.integers(1, 7200)), grace=st.integers(0, 600),
       until=st.one_of(st.none(), st.integers(1, 7200)))
def test_a_runtime_raised_after_the_fact_never_moves_the_end_later_than_a_deadline_or_a_grant(
        first: int, later: str, deadline: int | None, grace: int, until: int | None) -> None:
    before = running("p", "1", runtime=f"{first}s", started_ago=10 * S, deadline=deadline, grace=grace)
    after = replace(running("p", "1", runtime=later, started_ago=10 * S, deadline=deadline, grace=grace))
    grants = {"uid-p": Grant("uid-p", "team-a/p", OWNER, NOW + until * S)} if until is not None else {}
    bounds = [NOW - 10 * S + (deadline + grace) * S] if deadline is not None else []
    bounds += [NOW + until * S] if until is not None else []
    end_after = pod_end(after, grants)
    if bounds:
        assert end_after is not None and end_after <= min(bounds)
        end_before = pod_end(before, grants)
        assert end_before is not None and end_after <= max(end_before, min(bounds))


def test_a_backfilled_pods_raised_runtime_does_not_open_the_node_to_a_second_backfill() -> None:
    """The attack: a pod backfilled with 120s declared (its grant ends at +115 s, its deadline the same) raises the
    annotation to 3h. The node's release curve still ends it by its grant, so the owner's needed-by time stays, and
    a 30-minute pod is refused where the lie would have let it in."""
    grants = {"uid-bf": Grant("uid-bf", "team-a/bf", OWNER, NOW + 115 * S)}
    filler = running("filler", "2", runtime="60s", started_ago=50 * S, grace=0)  # ends at +10 s
    honest = running("bf", "1", runtime="120s", started_ago=10 * S, deadline=120, grace=0)
    lying = running("bf", "1", runtime="3h", started_ago=10 * S, deadline=120, grace=0)
    big = pod("big", "4").requests  # the owner's task: the whole node
    lock = Lock(node="n1", owner=OWNER, kind=LockKind.JOB, subject="team-b/big", reason="starving job", since=NOW)
    honest_slot = backfill_slot(lock, state([filler, honest], grants), now=NOW, tasks=[big])
    lying_slot = backfill_slot(lock, state([filler, lying], grants), now=NOW, tasks=[big])
    assert honest_slot.needed_by == NOW + 110 * S  # bf started 10 s ago with a 120 s deadline
    assert lying_slot.needed_by == honest_slot.needed_by
    second = pod("second", "1", runtime="30m")
    allowed, reason = backfill_verdict(second, runtime=second.maximum_runtime, fits_unlocked=False, is_owner=False,
                                       slot=lying_slot, now=NOW, margin=5 * S)
    assert not allowed and "after n1 is needed" in reason, reason
    # and a window's future idle reads the same bound
    assert future_idle(state([filler, lying], grants), NOW + 116 * S).get("cpu") == 4000


def test_a_runtime_that_is_not_positive_says_nothing() -> None:
    """"-1h" (admitted while the webhook was down, or past it with reservoir.sh/ignore) would read as a pod that ended
    before it started: it is no runtime, and the pod's end is its other bounds'."""
    for text in ("-1h", "0s", "-5m30s"):
        assert running("p", "1", runtime=text, started_ago=10 * S).maximum_runtime is None
        assert pod_end(running("p", "1", runtime=text, started_ago=10 * S)) is None
        assert pod_end(running("p", "1", runtime=text, started_ago=10 * S, deadline=60, grace=0)) == NOW + 50 * S
