"""The planner as pure functions: snapshot + config + now in, desired locks out. Time is an input."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from agent.planner.model import Lock, lock_on
from agent.planner.plan import plan
from shared import keys
from shared.config import load_config
from shared.timestamps import stamp
from tests.builders import CONFIG, NOW, node, pod, snap
from shared.ownership import JobRef, window_owner_id
from shared.keys import LockKind
from shared.resources import Resources
from shared.views import NodeView, PodGroupView, PodView

def owner_of(name: str, ns: str = "ns") -> str:
    return JobRef(ns, "Pod", name).owner_id


def test_seed_000_story_locks_the_node_for_the_big_pod_after_the_threshold() -> None:
    small = [pod(f"small-{i}", "1", node_name="n1") for i in range(4)]
    big = pod("big", "4", age=timedelta(minutes=5))
    result = plan(snap([node("n1")], small + [big], spare=1), CONFIG, NOW)
    lock = result.locks["n1"]
    assert lock.owner == owner_of("big") and lock.kind is LockKind.JOB
    assert lock.tasks == ("ns/big",) and lock.reserved["cpu"] == 4000
    assert lock.since == NOW and lock.expires == NOW + CONFIG.starvation.max_lock_duration
    # before the threshold: nothing
    young = pod("big", "4", age=timedelta(seconds=30))
    assert plan(snap([node("n1")], small + [young], spare=1), CONFIG, NOW).locks == {}


def test_lock_is_stable_and_released_when_the_job_is_ready() -> None:
    small = [pod(f"small-{i}", "1", node_name="n1") for i in range(4)]
    big = pod("big", "4")
    first = plan(snap([node("n1")], small + [big], spare=1), CONFIG, NOW)
    locked = node("n1", lock=first.locks["n1"])
    later = plan(snap([locked], small + [big], spare=1), CONFIG, NOW + timedelta(minutes=3))
    assert later.locks["n1"].same_hold(first.locks["n1"]), "a kept lock keeps its since and annotation"
    bound = pod("big", "4", node_name="n1")
    assert plan(snap([locked], [bound], spare=1), CONFIG, NOW + timedelta(minutes=4)).locks == {}


def test_node_that_frees_soonest_is_chosen() -> None:
    forever = [pod(f"a-{i}", "1", node_name="n-a") for i in range(4)]
    soon = [pod(f"b-{i}", "1", node_name="n-b", runtime="10m", started_ago=timedelta(minutes=8)) for i in range(4)]
    later = [pod(f"c-{i}", "1", node_name="n-c", runtime="1h", started_ago=timedelta(minutes=1)) for i in range(4)]
    result = plan(snap([node("n-a"), node("n-b"), node("n-c")], forever + soon + later + [pod("big", "4")]), CONFIG, NOW)
    assert list(result.locks) == ["n-b"]


def test_a_plan_handed_the_previous_one_gives_the_same_result_and_resums_only_changed_nodes() -> None:
    nodes = [node("n-a"), node("n-b")]
    a = [pod(f"a-{i}", "1", node_name="n-a", runtime="10m", started_ago=timedelta(minutes=8)) for i in range(4)]
    b = [pod(f"b-{i}", "1", node_name="n-b", runtime="1h", started_ago=timedelta(minutes=1)) for i in range(4)]
    big = pod("big", "4")
    first = plan(snap(nodes, a + b + [big]), CONFIG, NOW, current={})
    assert list(first.locks) == ["n-a"]
    # the pods on n-b are replaced by ones that end sooner than n-a's; nothing on n-a changes
    b = [pod(f"b-{i}", "1", node_name="n-b", runtime="5m", started_ago=timedelta(minutes=4)) for i in range(4)]
    later = snap(nodes, a + b + [big])
    again = plan(later, CONFIG, NOW, current={}, previous=first)
    assert again == plan(later, CONFIG, NOW, current={}) and list(again.locks) == ["n-b"]
    untouched = plan(later, CONFIG, NOW, current={}, previous=again)
    assert all(untouched.states[n] is again.states[n] for n in ("n-a", "n-b")), "unchanged nodes are reused"
    assert again.states["n-a"] is first.states["n-a"] and again.states["n-b"] is not first.states["n-b"]


def test_gang_job_reserves_every_pending_task_or_nothing() -> None:
    group = PodGroupView.from_obj({"metadata": {"name": "train", "namespace": "ns", "creationTimestamp": stamp(NOW - timedelta(hours=1))},
                                   "spec": {"minMember": 3}})
    tasks = [pod(f"train-{i}", "3", group="train") for i in range(3)]
    fillers = [pod(f"f-{n}", "2", node_name=n) for n in ("n1", "n2", "n3")]
    nodes = [node("n1"), node("n2"), node("n3")]
    result = plan(snap(nodes, tasks + fillers, [group], spare=1), CONFIG, NOW)
    owner = JobRef("ns", "PodGroup", "train").owner_id
    assert {l.owner for l in result.locks.values()} == {owner} and len(result.locks) == 3
    # within a budget of 2 nodes the job can not be reserved: no lock at all
    tight = load_config("starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 66}\nmaxLockedNodePercent: 90")
    result = plan(snap(nodes, tasks + fillers, [group], spare=1), tight, NOW)
    assert result.locks == {} and any("needs 3 nodes, starvation may lock 2: reservedNodePercent 66% of 4 "
                                      "schedulable nodes is 2 nodes" in n for n in result.notes), result.notes


def test_no_lock_while_a_higher_priority_pod_can_be_placed_now() -> None:
    nodes = [node("n1"), node("n2", cpu="8")]
    running = [pod(f"s-{i}", "1", node_name="n1") for i in range(4)]
    big = pod("big", "4", priority=1)
    urgent = pod("urgent", "2", priority=100, age=timedelta(seconds=1))
    result = plan(snap(nodes, running + [big, urgent]), CONFIG, NOW)
    assert result.locks == {} and any("higher-priority pod ns/urgent" in n for n in result.notes)


def test_a_higher_priority_pod_kube_scheduler_finds_no_node_for_past_the_threshold_blocks_no_lock() -> None:
    """Seed 000's "can be scheduled successfully in this round", read from what kube-scheduler said: a pod at priority
    100 that fits now by Reservoir's predicate but that kube-scheduler has found Unschedulable for longer than the
    starving job's threshold (a missing PersistentVolumeClaim: a filter Reservoir does not model) no longer keeps the
    job waiting; found Unschedulable more recently, it still does."""
    from dataclasses import replace

    nodes = [node("n1"), node("n2", cpu="8")]
    running = [*(pod(f"s-{i}", "1", node_name="n1") for i in range(4)),
               *(pod(f"t-{i}", "1", node_name="n2") for i in range(6))]  # big fits nowhere now, stuck on n2
    big = pod("big", "4", priority=1)
    threshold = CONFIG.starvation.starving_job_time_threshold
    for since, locked in ((NOW - threshold - timedelta(seconds=1), True), (NOW - threshold / 2, False)):
        stuck = replace(pod("stuck", "1m", priority=100, age=2 * threshold), unschedulable_since=since)
        result = plan(snap(nodes, [*running, big, stuck]), CONFIG, NOW)
        assert bool(result.locks) is locked, since
        (status,) = [j for j in result.jobs if j.subject == "ns/Pod/big"]
        assert (status.reason == "waiting for a higher-priority job") is not locked


def test_cordoned_nodes_are_never_locked_and_caps_hold() -> None:
    running = [pod(f"s-{i}", "1", node_name="n1") for i in range(4)]
    result = plan(snap([node("n1", unschedulable=True)], running + [pod("big", "4")]), CONFIG, NOW)
    assert result.locks == {}
    half = load_config("starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 100}\nmaxLockedNodePercent: 50")
    nodes = [node(f"n{i}") for i in range(4)]
    fill = [pod(f"s-{n.name}-{i}", "1", node_name=n.name) for n in nodes for i in range(4)]
    bigs = [pod(f"big-{i}", "4", age=timedelta(minutes=10 - i)) for i in range(4)]
    result = plan(snap(nodes, fill + bigs), half, NOW)
    assert len(result.locks) == 2
    assert {l.subject for l in result.locks.values()} == {"ns/Pod/big-0", "ns/Pod/big-1"}, "oldest jobs first"


def test_max_lock_duration_sends_the_job_to_the_back() -> None:
    fill = [pod(f"s-{i}", "1", node_name="n1") for i in range(4)]
    old_lock = Lock(node="n1", owner=owner_of("giant"), kind=LockKind.JOB, subject="ns/Pod/giant", reason="x",
                    since=NOW - timedelta(hours=3), tasks=("ns/giant",))
    giant = pod("giant", "4", age=timedelta(hours=4))
    other = pod("other", "4", age=timedelta(minutes=10))
    result = plan(snap([node("n1", lock=old_lock)], fill + [giant, other], spare=1), CONFIG, NOW)
    assert result.locks["n1"].owner == owner_of("other")


def test_lock_info_round_trips_through_the_node() -> None:
    lock = Lock(node="n1", owner=owner_of("big"), kind=LockKind.JOB, subject="ns/Pod/big", reason="r", since=NOW,
                expires=NOW + timedelta(hours=2), reserved=Resources({"cpu": 4000}), tasks=("ns/big",))
    assert lock_on(node("n1", lock=lock)) == lock
    broken = NodeView.from_obj({"metadata": {"name": "n2", "annotations": {keys.LOCK_INFO: "{not json"}},
                                "spec": {"taints": [{"key": keys.LOCK, "value": "job-x-abcdef", "effect": "NoSchedule"}]}})
    assert lock_on(broken).owner == "job-x-abcdef", "a lock with a broken annotation is still found"


# The window tests (seed 004) are in test_windows.py.


def test_plan_is_deterministic() -> None:
    nodes = [node(f"n{i}") for i in range(6)]
    fill = [pod(f"s-{n.name}-{i}", "1", node_name=n.name) for n in nodes for i in range(4)]
    bigs = [pod(f"big-{i}", "4", age=timedelta(minutes=10)) for i in range(3)]
    assert plan(snap(nodes, fill + bigs), CONFIG, NOW) == plan(snap(nodes, list(reversed(fill + bigs))), CONFIG, NOW)


from hypothesis import given, settings
from hypothesis import strategies as st

from agent.planner.capacity import idle_fraction, node_states, time_to_fit
from agent.planner.jobs import build_jobs
from agent.planner.starvation import NodeChooser, reserve_tasks


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["2", "4", "8"]), st.lists(st.tuples(st.sampled_from(["500m", "1", "2"]),
                                                                                 st.sampled_from([None, "10m", "1h"])),
                                                                       max_size=5)), min_size=1, max_size=8),
       st.lists(st.sampled_from(["1", "2", "3", "4"]), min_size=1, max_size=4))
def test_node_chooser_matches_a_brute_force_scan(node_specs, task_cpus) -> None:
    """The heap-based chooser picks, task by task, exactly what scanning every node with the documented score
    (time_to_fit, -idle_fraction, name), counting what the job reserved so far, would pick."""
    nodes = [node(f"n{i}", cpu=cpu) for i, (cpu, _) in enumerate(node_specs)]
    running = [pod(f"r{i}-{j}", req, node_name=f"n{i}", runtime=rt, started_ago=timedelta(minutes=5))
               for i, (_, pods) in enumerate(node_specs) for j, (req, rt) in enumerate(pods)]
    tasks = [pod(f"t{k}", cpu, group="g") for k, cpu in enumerate(task_cpus)]
    group = PodGroupView.from_obj({"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": len(tasks)}})
    snapshot = snap(nodes, running + tasks, [group])
    states = node_states(snapshot.nodes, snapshot.pods)
    job = next(j for j in build_jobs(snapshot) if j.ref.name == "g")
    reserved = reserve_tasks(job, job.pending, NodeChooser(states, set(), {}, NOW), set())
    chosen = None if reserved is None else {**reserved.drain, **reserved.fit_now}

    reserved: dict[str, Resources] = {}
    expected: dict[str, list] = {}
    for task in job.pending:
        options = []
        for name, state in states.items():
            already = reserved.get(name, Resources())
            if (already + task.requests).fits_in(state.node.allocatable):
                options.append(((time_to_fit(state, task.requests, already, NOW), -idle_fraction(state), name), name))
        if not options:
            expected = None
            break
        best = min(options)[1]
        reserved[best] = reserved.get(best, Resources()) + task.requests
        expected.setdefault(best, []).append(task)
    assert chosen == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["2", "4", "8"]), st.lists(st.tuples(st.sampled_from(["500m", "1", "2"]),
                                                                                 st.sampled_from([None, "3m", "10m"])),
                                                                       max_size=5), st.booleans()),
                min_size=1, max_size=8),
       st.lists(st.sampled_from(["1", "2", "3", "4"]), min_size=1, max_size=4), st.integers(0, 12))
def test_node_chooser_with_rankings_kept_from_an_earlier_plan_matches_a_brute_force_scan(
        node_specs, task_cpus, minutes_later) -> None:
    """Issue 34: the shapes' rankings kept from a plan on an earlier cluster (some nodes' pods different, a node
    since gone, `minutes_later` minutes before: pods' ends past by now tie at 0) give the same choice as a brute-force
    scan of the cluster now."""
    def cluster(earlier: bool):  # type: ignore[no-untyped-def]
        nodes = [node(f"n{i}", cpu=cpu) for i, (cpu, _, _) in enumerate(node_specs)] + (
            [node("gone", cpu="8")] if earlier else [])
        running = [pod(f"r{i}-{j}", req, node_name=f"n{i}", runtime=rt, started_ago=timedelta(minutes=5))
                   for i, (_, pods, changes) in enumerate(node_specs)
                   for j, (req, rt) in enumerate(pods) if not (earlier and changes and j == 0)]
        tasks = [pod(f"t{k}", cpu, group="g") for k, cpu in enumerate(task_cpus)]
        group = PodGroupView.from_obj({"metadata": {"name": "g", "namespace": "ns"},
                                       "spec": {"minMember": len(tasks)}})
        return snap(nodes, running + tasks, [group])

    before, snapshot = cluster(True), cluster(False)
    old_states = node_states(before.nodes, before.pods)
    rankings: dict = {}
    earlier_job = next(j for j in build_jobs(before) if j.ref.name == "g")
    reserve_tasks(earlier_job, earlier_job.pending,
                  NodeChooser(old_states, set(), {}, NOW - timedelta(minutes=minutes_later), rankings), set())
    states = node_states(snapshot.nodes, snapshot.pods, old_states)  # unchanged nodes keep their states
    job = next(j for j in build_jobs(snapshot) if j.ref.name == "g")
    reserved = reserve_tasks(job, job.pending, NodeChooser(states, set(), {}, NOW, rankings), set())
    chosen = None if reserved is None else {**reserved.drain, **reserved.fit_now}
    fresh = reserve_tasks(job, job.pending, NodeChooser(states, set(), {}, NOW), set())
    assert chosen == (None if fresh is None else {**fresh.drain, **fresh.fit_now})
    taken: dict[str, Resources] = {}
    expected: dict[str, list] | None = {}
    for task in job.pending:
        options = [((time_to_fit(state, task.requests, taken.get(name, Resources()), NOW), -idle_fraction(state),
                     name), name) for name, state in states.items()
                   if (taken.get(name, Resources()) + task.requests).fits_in(state.node.allocatable)]
        if not options:
            expected = None
            break
        best = min(options)[1]
        taken[best] = taken.get(best, Resources()) + task.requests
        assert expected is not None
        expected.setdefault(best, []).append(task)
    assert chosen == expected
    assert all(entry[0]() is states[name] for ranking in rankings.values() for name, entry in ranking.entries.items())


def test_a_partly_pending_replicaset_is_not_starving_but_a_lone_big_pod_is() -> None:
    def rs_pod(name: str, node_name: str = "") -> PodView:
        base = pod(name, "1", node_name=node_name)
        return PodView.from_obj({"metadata": {"name": name, "namespace": "ns", "creationTimestamp": stamp(NOW - timedelta(minutes=5)),
                                              "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                                                   "uid": "u", "controller": True}]},
                                 "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
                                 "status": {"phase": "Running" if node_name else "Pending"}}) if base else base
    stream = [rs_pod(f"rs-{i}", "n1") for i in range(4)] + [rs_pod("rs-4"), rs_pod("rs-5")]
    result = plan(snap([node("n1")], stream + [pod("big", "4")], spare=1), CONFIG, NOW)
    assert [l.subject for l in result.locks.values()] == ["ns/Pod/big"]
    rs = next(j for j in result.jobs if j.subject == "ns/ReplicaSet/rs")
    assert not rs.starving and rs.reason == "ready"


from hypothesis import given, settings
from hypothesis import strategies as st

from agent.planner.capacity import FOREVER, NodeState


def linear_time_to_fit(state: NodeState, request: Resources, now) -> object:
    """The definition, scanned end by end: the first moment idle plus everything freed so far covers `request`."""
    if state.idle.covers(request):
        return timedelta(0)
    ending = sorted((p.started + p.maximum_runtime, p.key, p.requests) for p in state.pods if p.maximum_runtime)
    freed = Resources()
    for end, _, requests in ending:
        freed = freed + requests
        if (state.idle + freed).covers(request):
            return max(end - now, timedelta(0))
    return FOREVER


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.one_of(st.none(), st.integers(1, 90))), max_size=12),
       st.integers(0, 16), st.integers(0, 16))
def test_time_to_fit_bisection_matches_a_linear_scan(running, want_cpu, want_mem) -> None:
    """time_to_fit bisects per-dimension release curves; it must agree with scanning the pods' ends in order
    (each pod also holds 1Gi of the node's 16Gi, so memory binds too when many run)."""
    pods = [pod(f"r{i}", str(cpu), node_name="n1", started_ago=timedelta(minutes=30),
                runtime=f"{minutes}m" if minutes else None)
            for i, (cpu, minutes) in enumerate(running)]
    state = node_states({"n1": node("n1", cpu="16")}, pods)["n1"]
    request = Resources.parse({"cpu": str(want_cpu), "memory": f"{want_mem}Gi"})
    assert time_to_fit(state, request, Resources(), NOW) == linear_time_to_fit(state, request, NOW)
