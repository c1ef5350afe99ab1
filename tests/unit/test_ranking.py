"""Issue 34: what plans keep from one to the next and bring up to date from the changes alone, against the same thing
made from scratch: a shape's node ranking (capacity.ShapeRanking, synced from NodeStates.changed; its `split` at a
`now` moving either way), placeable_now through the kept rankings, the higher-priority blockers asked lazily, and the
pod index's Layered mappings."""

from __future__ import annotations

import gc
import weakref
from datetime import timedelta
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

import agent.planner.capacity as capacity
import agent.planner.podindex as podindex
from agent.planner.capacity import (
    MAX_RANKINGS,
    MOST_RANKINGS,
    NodeStates,
    ShapeRanking,
    kept_ranking,
    node_states,
)
from agent.planner.jobs import build_jobs
from agent.planner.podindex import PodIndex
from agent.planner.starvation import Blockers, higher_priority_blocker, placeable_now
from shared.views import PodView
from tests.builders import NOW, node, pod, snap

NAMES = ("n0", "n1", "n2", "n3", "n4", "n5")
TASK = pod("task", "2")

# one step of a cluster: each node present or not, with its cpu and what runs on it (cpu, runtime)
node_step = st.tuples(st.booleans(), st.sampled_from(("2", "4", "8")),
                      st.lists(st.tuples(st.sampled_from(("500m", "1", "2")), st.sampled_from((None, "3m", "10m"))),
                               max_size=3))
cluster_steps = st.lists(st.tuples(st.lists(node_step, min_size=len(NAMES), max_size=len(NAMES)),
                                   st.integers(-5, 15), st.booleans()), min_size=1, max_size=8)


def cluster(step: list, cache: dict) -> tuple[dict, list[PodView]]:
    """The nodes and running pods of one step; a node spec seen before gives the very same views (as a watch cache
    keeps an unchanged object's view), so node_states reuses its state."""
    nodes, pods = {}, []
    for name, (present, cpu, running) in zip(NAMES, step, strict=True):
        if not present:
            continue
        spec = (name, cpu, tuple(running))
        if spec not in cache:
            cache[spec] = (node(name, cpu=cpu), [pod(f"{name}-{j}", req, node_name=name, runtime=runtime,
                                                     started_ago=timedelta(minutes=5))
                                                 for j, (req, runtime) in enumerate(running)])
        view, mine = cache[spec]
        nodes[name] = view
        pods += mine
    return nodes, pods


@settings(max_examples=200, deadline=None)
@given(cluster_steps)
def test_a_ranking_kept_through_changes_equals_one_made_now_and_splits_alike_at_any_now(steps: list) -> None:
    """Node states chained plan to plan (nodes changed, gone, back; some plans skip the shape, so its ranking syncs
    across more than one step by checking every node), a `now` moving forward and back: the kept ranking's order is
    a fresh ranking's, and its split at `now` (the fitting part kept across plans) is the fresh split."""
    cache: dict = {}
    kept = ShapeRanking()
    previous: NodeStates | None = None
    incremental = 0
    for nodes_step, minutes, used in steps:
        nodes, pods = cluster(nodes_step, cache)
        states = node_states(nodes, pods, previous)
        assert states.changed == ({n for n in states if previous is None or previous.get(n) is not states[n]}
                                  | (set(previous) - set(states) if previous is not None else set()))
        now = NOW + timedelta(minutes=minutes)
        if used:
            incremental += kept.synced is not None and kept.synced == states.base
            kept.sync(states, TASK.requests, TASK.placement)
            fresh = ShapeRanking()
            fresh.sync(states, TASK.requests, TASK.placement)
            assert kept.order == fresh.order
            assert kept.split(now) == fresh.split(now)
            assert {n for n, (state, _) in kept.entries.items()} == set(states)
        previous = states
    event(f"incremental syncs: {min(incremental, 2)}")


@settings(max_examples=150, deadline=None)
@given(cluster_steps, st.lists(st.sampled_from(("1", "2", "3", "6")), min_size=1, max_size=4))
def test_placeable_now_through_kept_rankings_equals_a_scan_of_every_node(steps: list, task_cpus: list) -> None:
    """Seed 000's "a higher-priority pod can be placed now": asked through the kept rankings (only the nodes that fit
    now are asked) it gives what asking every node gives, plan after plan."""
    cache: dict = {}
    rankings: dict = {}
    previous: NodeStates | None = None
    found = 0
    for nodes_step, minutes, _ in steps:
        nodes, pods = cluster(nodes_step, cache)
        tasks = [pod(f"t{k}", cpu, age=timedelta(hours=1)) for k, cpu in enumerate(task_cpus)]
        snapshot = snap(list(nodes.values()), pods + tasks)
        states = node_states(snapshot.nodes, snapshot.index, previous)
        jobs = build_jobs(snapshot)
        now = NOW + timedelta(minutes=minutes)
        for task in tasks[::2]:  # some shapes have a ranking, some not
            kept_ranking(rankings, states, task, now)
        through = placeable_now(jobs, states, rankings)
        assert through == placeable_now(jobs, node_states(snapshot.nodes, snapshot.index))
        found += bool(through)
        previous = states
    event(f"plans with a placeable pod: {min(found, 2)}")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 40), st.one_of(st.none(), st.integers(0, 5))), max_size=12),
                max_size=12))
def test_a_layered_mapping_equals_a_dict_through_changes_and_folds(batches: list[list[tuple[int, Any]]]) -> None:
    """podindex.Layered against a dict given the same changes (None removes a key), with the fold threshold low so
    that folds happen: lookups, membership, length, iteration and equality agree; an older Layered is unchanged."""
    saved = podindex.LAYER_MIN, podindex.LAYER_FRACTION
    podindex.LAYER_MIN, podindex.LAYER_FRACTION = 4, 2
    try:
        layered: podindex.Layered[int, int] = podindex.Layered({})
        plain: dict[int, int] = {}
        history: list[tuple[podindex.Layered[int, int], dict[int, int]]] = []
        folds = 0
        for batch in batches:
            changes = {key: podindex._GONE if value is None else value for key, value in batch}
            before_base = layered._base
            layered = layered.with_changes(changes)
            folds += layered._base is not before_base
            for key, value in changes.items():
                if value is podindex._GONE:
                    plain.pop(key, None)
                else:
                    plain[key] = value
            assert len(layered) == len(plain) and dict(layered.items()) == plain and layered == plain
            assert all(layered.get(k) == plain.get(k) and (k in layered) == (k in plain) for k in range(41))
            history.append((layered, dict(plain)))
        assert all(old == copy for old, copy in history)
        event(f"folds: {min(folds, 2)}")
    finally:
        podindex.LAYER_MIN, podindex.LAYER_FRACTION = saved


def test_an_index_update_shares_the_pods_it_did_not_touch() -> None:
    """One pod event costs the change, not a copy of every pod: the updated index's Layered mappings share the base
    of the one before, which still reads as before."""
    pods = [pod(f"p{i}", "1", node_name=f"n{i % 3}") for i in range(50)] + [pod("waiting", "1")]
    index = PodIndex.of(pods)
    bound = pod("waiting", "1", node_name="n0")
    after = index.updated([bound])
    assert isinstance(after.pods, podindex.Layered) and after.pods._base is index.pods._base  # type: ignore[attr-defined]
    assert after == PodIndex.of([*pods[:-1], bound])
    assert index == PodIndex.of(pods) and index.pods["ns/waiting"] is pods[-1]


@settings(max_examples=150, deadline=None)
@given(cluster_steps, st.lists(st.tuples(st.sampled_from(("1", "2", "3", "6")), st.integers(0, 3),
                                         st.sampled_from(("a", "b", None))), min_size=1, max_size=6))
def test_blockers_asked_job_by_job_equal_the_whole_placeable_list(steps: list, tasks_spec: list) -> None:
    """Seed 000's "a higher-priority job that can be placed now goes first", as the planner asks it (Blockers: only
    the pods of higher priority than the asking job are decided, and only until one fits), equals
    higher_priority_blocker over the whole placeable_now list, for every job, asked in any order, with and without
    kept rankings; jobs of several pods (a group) included."""
    cache: dict = {}
    rankings: dict = {}
    previous: NodeStates | None = None
    blocked = 0
    for nodes_step, minutes, reverse in steps:
        nodes, pods = cluster(nodes_step, cache)
        tasks = [pod(f"t{k}", cpu, age=timedelta(hours=1), priority=priority, group=group)
                 for k, (cpu, priority, group) in enumerate(tasks_spec)]
        snapshot = snap(list(nodes.values()), pods + tasks)
        states = node_states(snapshot.nodes, snapshot.index, previous)
        jobs = build_jobs(snapshot)
        now = NOW + timedelta(minutes=minutes)
        for task in tasks[::2]:
            kept_ranking(rankings, states, task, now)
        whole = placeable_now(jobs, states, rankings)
        for kept in (rankings, None):
            lazy = Blockers(jobs, states, kept)
            for job in (jobs[::-1] if reverse else jobs):
                assert lazy.blocker(job) == higher_priority_blocker(job, whole)
                blocked += lazy.blocker(job) is not None
        previous = states
    event(f"jobs blocked: {min(blocked, 2)}")


def test_plans_asking_for_more_shapes_than_max_rankings_keep_them_all_on_a_small_cluster() -> None:
    """A plan weighs every starving job's shape; on 10 nodes, 3 x MAX_RANKINGS shapes asked in turn at each plan are
    each ranked once, not again at every plan (an LRU of MAX_RANKINGS made each anew: a cyclic order defeats it)."""
    nodes = {f"n{i}": node(f"n{i}", cpu="64") for i in range(10)}
    states = node_states(nodes, [])
    tasks = [pod(f"t{k}", f"{k + 1}m") for k in range(3 * MAX_RANKINGS)]
    rankings: dict[str, ShapeRanking] = {}
    first = [kept_ranking(rankings, states, task, NOW) for task in tasks]
    again = [kept_ranking(rankings, states, task, NOW + timedelta(seconds=1)) for task in tasks]
    assert all(a is b for a, b in zip(first, again, strict=True))


def test_plans_asking_for_more_shapes_than_the_cap_keep_the_last_plans_on_a_large_cluster(monkeypatch) -> None:
    """On a large cluster the cap is MAX_RANKINGS (MAX_RANKED_NODES // nodes is less): 3 x MAX_RANKINGS shapes asked
    in turn at each of three plans are each ranked once, not again at every plan (bench-simulate at 5,000 nodes made
    3,456 of 3,968 rankings anew so); a shape no plan asked for since the one before the last goes first."""
    monkeypatch.setattr(capacity, "MAX_RANKED_NODES", 10)  # 10 nodes stand for a cluster past MAX_RANKED_NODES // 16
    nodes = {f"n{i}": node(f"n{i}", cpu="64") for i in range(10)}
    states = node_states(nodes, [])
    tasks = [pod(f"t{k}", f"{k + 1}m") for k in range(3 * MAX_RANKINGS)]
    rankings: dict[str, ShapeRanking] = {}
    first = [kept_ranking(rankings, states, task, NOW) for task in tasks]
    for plan in (1, 2):
        again = [kept_ranking(rankings, states, task, NOW + timedelta(seconds=plan)) for task in tasks]
        assert all(a is b for a, b in zip(first, again, strict=True))
    assert len(rankings) == 3 * MAX_RANKINGS
    kept_ranking(rankings, states, pod("once", "999m"), NOW + timedelta(seconds=3))
    later = NOW + timedelta(seconds=4)  # the last plan asked for one shape, the one before it for all the others
    kept_ranking(rankings, states, pod("new", "998m"), later)
    assert len(rankings) == MAX_RANKINGS, "the shapes of the plan before the last went, down to the cap"
    assert {r.used for r in rankings.values()} == {NOW + timedelta(seconds=2), NOW + timedelta(seconds=3), later}


def test_make_room_drops_the_least_recently_used_of_older_plans_only() -> None:
    """make_room on rankings used by plans at t0 < t1 < t2 (the last) and now: down to the cap from the oldest, never
    one of the last plan's or this one's; at MOST_RANKINGS, or MOST_RANKED_NODES node entries, the least recently
    used whatever it is."""
    at = [NOW + timedelta(seconds=s) for s in range(4)]
    rankings = {f"r{k}": ShapeRanking(used=at[k % 4]) for k in range(8)}  # two of each
    capacity.make_room(rankings, 3, at[3], 10)
    assert sorted(rankings) == ["r2", "r3", "r6", "r7"], "t0 and t1 went; the cap is below what t2 and now hold"
    capacity.make_room(rankings, 3, at[3], 10)
    assert sorted(rankings) == ["r2", "r3", "r6", "r7"], "nothing older than the last plan is left to drop"
    capacity.make_room(rankings, 3, at[3], capacity.MOST_RANKED_NODES // 4)
    assert sorted(rankings) == ["r3", "r6", "r7"], "four rankings of so many nodes: the least recently used goes"
    full = {f"r{k:04}": ShapeRanking(used=at[3]) for k in range(MOST_RANKINGS)}
    capacity.make_room(full, 16, at[3], 3)
    assert len(full) == MOST_RANKINGS - 1 and "r0000" not in full


def test_a_tenants_thousands_of_shapes_on_a_small_cluster_keep_at_most_most_rankings() -> None:
    """Anyone may make pods of any number of shapes: on three nodes, 100,000 node entries would be 33,333 rankings;
    no more than MOST_RANKINGS are kept, the least recently used going first."""
    states = node_states({f"n{i}": node(f"n{i}", cpu="64") for i in range(3)}, [])
    rankings: dict[str, ShapeRanking] = {}
    for k in range(MOST_RANKINGS + 10):
        kept_ranking(rankings, states, pod(f"t{k}", f"{k + 1}m"), NOW + timedelta(seconds=k))
    assert len(rankings) == MOST_RANKINGS


def test_a_ranking_no_plan_uses_again_keeps_no_node_state_alive() -> None:
    """A kept ranking holds the node states it was ranked from weakly: one a tenant's shape made, never asked for
    again, must not keep a past plan's states and their pods alive (with up to MOST_RANKINGS kept, 1,024 past plans'
    states: 111.6 MiB of a tenant's 20 KB pods in a 5-node review script, 2.2 MiB held weakly)."""
    states = node_states({f"n{i}": node(f"n{i}", cpu="64") for i in range(3)},
                         [pod("running", "1", node_name="n0")])
    rankings: dict[str, ShapeRanking] = {}
    kept_ranking(rankings, states, pod("t", "1"), NOW)
    probe = weakref.ref(states["n0"])
    del states
    gc.collect()
    assert probe() is None
    assert rankings, "the ranking itself is kept"


def plans_of_four_shapes(monkeypatch, nodes: int) -> Any:
    """capacity.plan_rankings made 4 on a cluster of `nodes`, and a config that locks for a job starving a minute,
    up to 90% of the nodes."""
    from shared.config import load_config

    monkeypatch.setattr(capacity, "MAX_RANKINGS", 1)
    monkeypatch.setattr(capacity, "MOST_RANKED_NODES", 4 * nodes)
    assert capacity.plan_rankings(nodes) == 4
    return load_config("starvation: {starvingJobTimeThreshold: 1m, reservedNodePercent: 90}\n"
                       "maxLockedNodePercent: 90\n")


def test_a_plan_ranks_the_nodes_for_at_most_its_limit_of_shapes_and_keeps_each_namespace_its_share(
        monkeypatch) -> None:
    """Anyone may create starving pods of thousands of shapes, and a plan weighs each starving job: past
    capacity.plan_rankings shapes (here 4), a plan ranks no more, and a namespace's tasks go past their promise (their
    shapes, at most an equal share) only while the other namespaces' promises still fit, so a tenant's flood ahead in
    the order leaves another namespace's job its lock. A job whose shape is past the limit is told so, and a job
    holding a lock keeps it whatever the count (its own nodes are scored without a ranking)."""
    from agent.planner.model import Lock
    from agent.planner.plan import plan
    from agent.planner.starvation import NodeChooser
    from shared.keys import LockKind
    from shared.ownership import JobRef

    config = plans_of_four_shapes(monkeypatch, nodes=12)
    nodes = [node(f"n{i:02}") for i in range(12)]
    running = [pod(f"n{i:02}-fill-{j}", "2", node_name=f"n{i:02}", runtime="10m", started_ago=timedelta(minutes=5))
               for i in range(12) for j in range(2)]
    flood = [pod(f"flood-{k}", f"{3000 + k}m", ns="tenant", age=timedelta(minutes=30 - k / 10)) for k in range(10)]
    victim = pod("victim", "3500m", age=timedelta(minutes=2))
    made: list[NodeChooser] = []
    original = NodeChooser.__init__

    def spy(self: NodeChooser, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(NodeChooser, "__init__", spy)
    result = plan(snap(nodes, [*running, *flood, victim]), config, NOW)
    (chooser,) = made
    assert chooser.limit == 4 and chooser.promised == {"tenant": 2, "ns": 1} and len(chooser.ranked) == 4
    owners = {lock.owner for lock in result.locks.values()}
    assert JobRef("ns", "Pod", "victim").owner_id in owners, "the other namespace's job is weighed and locked for"
    assert len({o for o in owners if "tenant" in o}) == 3, "the flood's namespace: the limit less the other's promise"
    refused = [j for j in result.jobs if j.subject.startswith("tenant/") and "not weighed in this plan" in j.reason]
    assert len(refused) == 7 and "a plan ranks the nodes for at most 4 task shapes on 12 nodes" in refused[0].reason

    # the same flood in the victim's own namespace, ahead of it in the order: the victim, holding a lock, keeps it
    held = Lock(node="n11", owner=JobRef("tenant", "Pod", "victim").owner_id, kind=LockKind.JOB,
                subject="tenant/Pod/victim", reason="x", since=NOW - timedelta(seconds=30),
                tasks=("tenant/victim",))
    nodes[11] = node("n11", lock=held)
    mine = pod("victim", "3500m", ns="tenant", age=timedelta(minutes=2))
    made.clear()
    kept = plan(snap(nodes, [*running, *flood, mine]), config, NOW)
    assert capacity.shape(mine) in made[0].unranked, "the victim came past the limit"
    assert kept.locks["n11"].owner == held.owner


def test_past_the_limit_a_gang_keeps_its_locks_and_namespaces_beyond_it_take_turns(monkeypatch) -> None:
    """A gang holding a lock whose shape comes past the plan's limit keeps the lock unchanged (its other task, which
    fitted elsewhere now, cannot be weighed: without this the job lost its lock). When more namespaces have pods
    pending than a plan ranks shapes for, the promises go to as many of them in turns, by the minute: a tenant's
    namespaces ahead in the order cannot keep another's job from being weighed for good."""
    from agent.planner.model import Lock
    from agent.planner.plan import plan
    from agent.planner.starvation import namespace_shapes
    from shared.keys import LockKind
    from shared.ownership import JobRef
    from shared.timestamps import stamp
    from shared.views import PodGroupView

    config = plans_of_four_shapes(monkeypatch, nodes=12)
    owner = JobRef("tenant", "PodGroup", "g").owner_id
    held = Lock(node="n00", owner=owner, kind=LockKind.JOB, subject="tenant/PodGroup/g", reason="x",
                since=NOW - timedelta(seconds=30), tasks=("tenant/gang-0",))
    nodes = [node("n00", lock=held), *(node(f"n{i:02}") for i in range(1, 12))]
    running = [pod(f"n{i:02}-fill-{j}", "2", node_name=f"n{i:02}", runtime="10m", started_ago=timedelta(minutes=5))
               for i in range(11) for j in range(2)]  # n11 idle: one gang task fits there now
    group = PodGroupView.from_obj({"metadata": {"name": "g", "namespace": "tenant",
                                                "creationTimestamp": stamp(NOW - timedelta(minutes=5))},
                                   "spec": {"minMember": 2}})
    gang = [pod(f"gang-{k}", "3500m", ns="tenant", group="g", age=timedelta(minutes=5)) for k in range(2)]
    flood = [pod(f"flood-{k}", f"{3000 + k}m", ns="tenant", age=timedelta(hours=1)) for k in range(6)]
    alone = plan(snap(nodes, [*running, *gang], [group]), config, NOW)
    assert set(alone.locks) == {"n00"}, "the gang's lock, its other task fitting on n11 now"
    flooded = plan(snap(nodes, [*running, *gang, *flood], [group]), config, NOW)
    assert flooded.locks["n00"] == held
    (status,) = [j for j in flooded.jobs if j.subject == "tenant/PodGroup/g"]
    assert status.reason.startswith("kept its 1 locks unchanged: not weighed in this plan")

    # five namespaces, a plan of 4 shapes: four promised one each, in turns that change with the minute
    jobs = build_jobs(snap([], [pod(f"p{k}", f"{k + 1}", ns=f"ns-{k}") for k in range(5)]))
    turns = [namespace_shapes(jobs, 4, NOW + timedelta(minutes=m)) for m in range(12)]
    assert all(sorted(t.values()) == [0, 1, 1, 1, 1] for t in turns)
    assert {name for t in turns for name, promised in t.items() if not promised} == {f"ns-{k}" for k in range(5)}


def test_higher_priority_pods_of_more_shapes_than_a_plan_decides_block_no_job(monkeypatch) -> None:
    """Blockers decides node by node at most capacity.plan_rankings shapes no kept ranking answers (here 4); past
    them a pod is taken as not placeable now. A flood of higher-priority pods of many shapes made each plan walk
    every node for each; now the fifth shape's pod, though it fits now, does not hold the starving job back."""
    plans_of_four_shapes(monkeypatch, nodes=3)
    states = node_states({f"n{i}": node(f"n{i}", cpu="64") for i in range(3)}, [])
    pods = [pod(f"high-{k}", f"{100 + k}", priority=10, ns="tenant") for k in range(4)]  # fit nowhere
    pods.append(pod("high-fits", "1", priority=10, ns="tenant"))
    starving = pod("low", "2")
    jobs = build_jobs(snap([], [*pods, starving]))
    (low,) = [j for j in jobs if j.subject == "ns/Pod/low"]
    assert higher_priority_blocker(low, placeable_now(jobs, states)) == "tenant/high-fits", "the oracle"
    assert Blockers(jobs, states).blocker(low) is None, "the fifth shape is not decided"
    assert Blockers(jobs[-3:], states).blocker(low) == "tenant/high-fits", "within the four it is"
