"""Issue 34: the pod index kept up to date from changes (agent/planner/podindex.py) against the index built from
scratch, its oracle; plans from either are equal; the agent's index follows its pod cache through watch events and
relists."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agent.controller import Agent
from agent.planner.model import Snapshot
from agent.planner.plan import current_locks, plan
from agent.planner.podindex import PodIndex
from shared import keys
from shared.config import load_config
from shared.timestamps import stamp
from shared.views import PodGroupView, PodView
from tests.builders import NOW, node

CONFIG = load_config("starvation: {starvingJobTimeThreshold: 30s, reservedNodePercent: 100}\n"
                     "maxLockedNodePercent: 90\nbackfill: {namespaces: [a, b]}")
NODES = ("n1", "n2", "n3", "n4")
NAMES = tuple(f"p{i}" for i in range(10))
GROUPS = {("a", "timed"): PodGroupView.from_obj({"metadata": {"name": "timed", "namespace": "a",
                                                              "annotations": {keys.MAXIMUM_RUNTIME: "10m"},
                                                              "creationTimestamp": stamp(NOW - timedelta(hours=1))},
                                                 "spec": {"minMember": 2}}),
          ("a", "plain"): PodGroupView.from_obj({"metadata": {"name": "plain", "namespace": "a",
                                                              "creationTimestamp": stamp(NOW - timedelta(hours=1))},
                                                 "spec": {"minMember": 1}})}


def pod_obj(name: str, ns: str, *, cpu: int, node_name: str, phase: str, group: str, runtime: str, uid: str,
            age: int, gated: bool, deleting: bool, zone: str = "") -> dict[str, Any]:
    annotations = {}
    if group:
        annotations[keys.GROUP_NAME] = group
    if runtime:
        annotations[keys.MAXIMUM_RUNTIME] = runtime
    if gated:
        annotations[keys.BACKFILL] = "true"
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid, "annotations": annotations,
                            "creationTimestamp": stamp(NOW - timedelta(seconds=age)), "resourceVersion": "1"}
    if deleting:
        meta["deletionTimestamp"] = stamp(NOW + timedelta(seconds=30))
    spec: dict[str, Any] = {"nodeName": node_name,
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": f"{cpu}m",
                                                                                    "memory": "1Gi"}}}]}
    if zone:
        spec["nodeSelector"] = {"zone": zone}
    if gated:
        spec["schedulingGates"] = [{"name": keys.BACKFILL_GATE}]
    status: dict[str, Any] = {"phase": phase}
    if node_name:
        status["startTime"] = stamp(NOW - timedelta(seconds=age))
    return {"metadata": meta, "spec": spec, "status": status}


@st.composite
def pod_objs(draw: st.DrawFn) -> dict[str, Any]:
    bound = draw(st.booleans())
    return pod_obj(draw(st.sampled_from(NAMES)), draw(st.sampled_from(("a", "b"))),
                   cpu=draw(st.sampled_from((500, 1000, 2000, 3000))),
                   node_name=draw(st.sampled_from(NODES)) if bound else "",
                   phase=draw(st.sampled_from(("Running", "Running", "Succeeded"))) if bound
                   else draw(st.sampled_from(("Pending", "Pending", "Failed"))),
                   group=draw(st.sampled_from(("", "", "timed", "plain"))),
                   runtime=draw(st.sampled_from(("", "", "5m"))),
                   # a uid another pod may carry too: only a hand-made snapshot has that, and the index says who wins
                   uid=draw(st.sampled_from(("u1", "u2", "u3", "u4", "u5", "u6", ""))),
                   age=draw(st.integers(0, 600)), gated=not bound and draw(st.booleans()),
                   deleting=draw(st.integers(0, 9)) == 0, zone=draw(st.sampled_from(("", "", "a", "b"))))


# every run starts here: each node full with three 1-cpu pods that end within 5 minutes (in the timed PodGroup or
# declaring it), and a 4-cpu pod pending for 5 minutes: starving, a lock to drain a node for it
FULL = [pod_obj(f"run-{n}-{i}", "c", cpu=1000, node_name=n, phase="Running", group="", runtime="5m", uid=f"r{n}{i}",
                age=60, gated=False, deleting=False) for n in NODES for i in range(3)] + [
    pod_obj("big", "c", cpu=4000, node_name="", phase="Pending", group="", runtime="", uid="big", age=300,
            gated=False, deleting=False)]
# one change: a pod created or changed (its new object), or a pod key deleted
changes = st.lists(st.one_of(pod_objs(), st.tuples(st.just("delete"), st.sampled_from(NAMES),
                                                   st.sampled_from(("a", "b"))),
                             # a node's view changes (its zone label): its state and what it remembers go
                             st.tuples(st.just("node"), st.sampled_from(NODES), st.sampled_from(("a", "b")))),
                   min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(changes, min_size=1, max_size=8))
def test_an_index_kept_up_to_date_equals_the_index_built_again_and_plans_alike(batches: list) -> None:
    """Random changes, a batch per plan: the updated index equals PodIndex.of the pods now, and a plan over a snapshot
    carrying it (handed the previous plan, as the agent plans) equals a plan from scratch over the same pods."""
    nodes = {n: node(n, cpu="4", labels={"zone": "a"}) for n in NODES}
    live: dict[str, PodView] = {}
    index = PodIndex()
    previous = None
    locks_seen = 0
    for step, batch in enumerate([FULL, *batches]):
        last: dict[str, PodView | None] = {}  # each key's last word in the batch, as the agent records them
        for change in batch:
            if isinstance(change, tuple) and change[0] == "node":
                nodes = {**nodes, change[1]: node(change[1], cpu="4", labels={"zone": change[2]})}
            elif isinstance(change, tuple):
                key = f"{change[2]}/{change[1]}"
                live.pop(key, None)
                last[key] = None
            else:
                view = PodView.from_obj(change)
                live[view.key] = view
                last[view.key] = view
        changed = [view for view in last.values() if view is not None]
        removed = [key for key, view in last.items() if view is None]
        before = index
        index = index.updated(changed, removed)
        assert index == PodIndex.of(live.values())
        if not changed and not any(k in before.pods for k in removed):
            assert index is before
        # a node the batch did not touch keeps its very tuple: node_states tells by identity
        touched = {p.node_name for p in changed} | {before.pods[k].node_name for k in removed if k in before.pods} | {
            before.pods[p.key].node_name for p in changed if p.key in before.pods}
        assert all(index.on_node[n] is before.on_node[n] for n in before.on_node if n not in touched and
                   n in index.on_node)
        now = NOW + timedelta(seconds=10 * step)
        snapshot = Snapshot(nodes=nodes, pods=list(live.values()), podgroups=GROUPS)
        fresh = plan(snapshot, CONFIG, now)
        kept = plan(Snapshot(nodes=nodes, pods=list(live.values()), podgroups=GROUPS).with_index(index), CONFIG,
                    now, current_locks(snapshot), previous=previous)
        assert kept == fresh
        assert kept.states.keys() == fresh.states.keys() and all(
            kept.states[n].pods == fresh.states[n].pods and kept.states[n].used == fresh.states[n].used
            for n in fresh.states)
        locks_seen += bool(fresh.locks)
        assert step or fresh.locks, "the first batch starves a job on a full cluster: every run plans a lock"
        previous = kept
    event(f"plans with a lock: {min(locks_seen, 3)}")


def test_a_key_given_twice_keeps_its_last_view_and_a_duplicate_uid_goes_to_the_greatest_key() -> None:
    first = PodView.from_obj(pod_obj("x", "a", cpu=1000, node_name="n1", phase="Running", group="", runtime="",
                                     uid="u", age=5, gated=False, deleting=False))
    second = replace(first, node_name="n2")
    other = PodView.from_obj(pod_obj("y", "a", cpu=1000, node_name="", phase="Pending", group="", runtime="",
                                     uid="u", age=5, gated=False, deleting=False))
    index = PodIndex.of([first, second, other])
    assert index.pods == {"a/x": second, "a/y": other} and index.on_node == {"n2": (second,)}
    assert index.by_uid == {"u": other} and index.unbound == {"a/y": other}
    gone = index.updated(removed=["a/y"])
    assert gone.by_uid == {"u": second}, "the other pod with the uid takes it back"
    assert gone.updated(removed=["a/x"]).by_uid == {} and gone.updated(removed=["a/nope"]) is gone
    assert index.pods == {"a/x": second, "a/y": other}, "an update leaves the index it came from alone"


def test_the_agents_index_follows_its_pod_cache_through_events_deletes_and_a_relist() -> None:
    agent = Agent(None)  # type: ignore[arg-type]

    def obj(name: str, node_name: str = "", phase: str = "Pending", rv: str = "1") -> dict[str, Any]:
        made = pod_obj(name, "a", cpu=1000, node_name=node_name, phase=phase, group="", runtime="", uid=f"u-{name}",
                       age=5, gated=False, deleting=False)
        made["metadata"]["resourceVersion"] = rv
        return made

    cache = agent.pods
    cache._replace([obj("p1"), obj("p2", "n1", "Running")])
    assert agent.pod_index() == PodIndex.of(cache.items.values()) and len(agent.pod_index().pods) == 2
    cache.apply_event({"type": "MODIFIED", "object": obj("p1", "n2", "Running", rv="2")})
    cache.apply_event({"type": "ADDED", "object": obj("p3", rv="3")})
    cache.apply_event({"type": "DELETED", "object": obj("p3", rv="4")})  # added and gone before the next snapshot
    cache.apply_event({"type": "DELETED", "object": obj("p2", "n1", "Running", rv="5")})
    assert agent._pod_changes.keys() == {"a/p1", "a/p2"}, "a pod the index never held is forgotten when deleted"
    index = agent.snapshot().index
    assert index == PodIndex.of(cache.items.values()) and set(index.on_node) == {"n2"}
    cache._replace([obj("p4", rv="6"), obj("p1", "n2", "Running", rv="2")])  # a relist: p1 kept, p4 new
    assert agent.pod_index() == PodIndex.of(cache.items.values()) and set(agent._pod_index.pods) == {"a/p1", "a/p4"}
    for i in range(50):  # a standby takes no snapshot: what it records stays one entry per pod that exists
        cache.apply_event({"type": "ADDED", "object": obj(f"q{i}", rv=str(100 + 2 * i))})
        cache.apply_event({"type": "DELETED", "object": obj(f"q{i}", rv=str(101 + 2 * i))})
    assert agent._pod_changes == {}
