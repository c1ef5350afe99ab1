"""A lock read back from every taint Reservoir writes (keys.LOCK_TAINT_KEYS), and the rules and constants of the
hostile-tenant review of issue 11."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from agent.planner.model import lock_on
from agent.planner.plan import current_locks, plan
from agent.planner.reserve import is_reserve_pod
from agent.writer import node_patch
from shared import keys
from shared.config import load_config
from shared.entitlement import entitlement, unentitled
from shared.jsonpatch import apply
from shared.keys import LockKind
from shared.ownership import queue_owner_id
from shared.timestamps import stamp
from shared.views import NodeView, PodGroupView, QueueView
from tests.builders import NOW, pod, snap
from webhook.lookup import Lookup

CONFIG = load_config("maxLockedNodePercent: 90\nstarvation: {enabled: false}")
GOLD = queue_owner_id("gold")
OTHER = queue_owner_id("silver")


def gold(policy: str = "Guaranteed") -> QueueView:
    return QueueView.from_obj({"metadata": {"name": "gold", "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                               "spec": {"weight": 1, "guarantee": {"policy": policy, "resource": {"cpu": "4"}}}})


def locked_node(name: str, taints: list[tuple[str, str]], owner: str = GOLD) -> dict[str, Any]:
    """A node as the writer leaves an exclusive lock of `owner` (labels and info annotation), with `taints`
    (key, value) instead of the two it writes."""
    info = {"owner": owner, "kind": "queue", "subject": "queue/gold", "reason": "guarantee of queue gold",
            "since": stamp(NOW), "expires": None, "reserved": {"cpu": "4"}, "tasks": []}
    return {"metadata": {"name": name, "resourceVersion": "7", "creationTimestamp": stamp(NOW),
                         "labels": {keys.LOCK: owner, keys.LOCK_KIND: "queue"},
                         "annotations": {keys.LOCK_INFO: json.dumps(info)}},
            "spec": {"taints": [{"key": k, "value": v, "effect": keys.LOCK_EFFECT} for k, v in taints]},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}}


def written(node: dict[str, Any], ops: list[Any] | None) -> dict[str, Any]:
    return apply(node, [op for op in ops or [] if op["op"] != "test"])


def test_a_lone_exclusive_taint_is_read_back_as_a_lock_and_reconciled() -> None:
    """Review of issue 11: a node carrying only `reservoir.sh/lock-exclusive` (its lock taint removed by hand, or a
    crash between writes) read as no lock: closed to almost every pod, never removed, not shown. It is a lock of its
    owner now, said inconsistent (Lock.unreadable): released (both taints go) when not desired, rewritten whole
    when it is, and the webhook's nodeName check sees it too."""
    obj = locked_node("n0", [(keys.LOCK_EXCLUSIVE, GOLD)])
    view = NodeView.from_obj(obj)
    assert view.lock_owner == GOLD
    lock = lock_on(view)
    assert lock is not None and lock.owner == GOLD and lock.kind is LockKind.QUEUE and lock.exclusive
    assert f"{keys.LOCK_EXCLUSIVE} taint without a {keys.LOCK} taint" in lock.unreadable
    # not desired (no queue guarantees it): the plan releases it, and the release removes every Reservoir key
    nodes = [view, NodeView.from_obj(locked_node("n1", [])), NodeView.from_obj(locked_node("n2", []))]
    nodes[1:] = [replace(n, labels={}, annotations={}) for n in nodes[1:]]
    released = snap(nodes, [])
    assert current_locks(released) == {"n0": lock} and "n0" not in plan(released, CONFIG, NOW).locks
    release = [op for op in node_patch(obj, None) or [] if op["op"] != "test"]
    assert {"op": "remove", "path": "/spec/taints"} in release and len(release) == 4, "taints, 2 labels, annotation"
    # desired (the queue keeps the node it holds): rewritten whole, both taints again
    held = plan(replace(released, queues={"gold": gold()}), CONFIG, NOW)
    want = held.locks["n0"]
    assert want.owner == GOLD and want.exclusive and want.since == lock.since
    fixed = written(obj, node_patch(obj, want))
    assert {(t["key"], t["value"]) for t in fixed["spec"]["taints"]} == {(keys.LOCK, GOLD), (keys.LOCK_EXCLUSIVE, GOLD)}
    assert lock_on(NodeView.from_obj(fixed)) == want and lock_on(NodeView.from_obj(fixed)).unreadable == ""
    # the webhook: a BestEffort pod may not name that node
    lookup = Lookup(queues={"gold": gold()}, nodes={"n0": view})
    assert lookup.lock_of_node == {"n0": GOLD}
    squatter = {"metadata": {"name": "s", "namespace": "ns"}, "spec": {"nodeName": "n0", "containers": [{}]}}
    [problem] = unentitled(squatter, "ns", entitlement(squatter, "ns", lookup.grounds), lookup.lock_of_node)
    assert "spec.nodeName 'n0'" in problem


def test_an_exclusive_taint_naming_another_owner_does_not_make_the_lock_exclusive() -> None:
    """Review of issue 11: an exclusive taint whose value names another owner made the lock read as exclusive, so
    the desired exclusive lock was the same hold and the taint (which keeps the owner's own pods off) was never
    rewritten. It counts only when its value is the lock's owner; otherwise the lock is not exclusive and says why."""
    obj = locked_node("n0", [(keys.LOCK, GOLD), (keys.LOCK_EXCLUSIVE, OTHER)])
    lock = lock_on(NodeView.from_obj(obj))
    assert lock is not None and lock.owner == GOLD and not lock.exclusive
    assert f"{keys.LOCK_EXCLUSIVE} taint names {OTHER!r}" in lock.unreadable
    want = replace(lock, exclusive=True, unreadable="")
    assert not want.same_hold(lock), "the writer rewrites it"
    fixed = written(obj, node_patch(obj, want))
    assert {(t["key"], t["value"]) for t in fixed["spec"]["taints"]} == {(keys.LOCK, GOLD), (keys.LOCK_EXCLUSIVE, GOLD)}
    assert lock_on(NodeView.from_obj(fixed)) == want
    # desired not exclusive: the same hold, but unreadable, so the writer still patches, dropping the stray taint
    plain = replace(lock, unreadable="")
    assert plain.same_hold(lock) and lock.unreadable
    assert [t["key"] for t in written(obj, node_patch(obj, plain))["spec"]["taints"]] == [keys.LOCK]
    # consistent taints read back clean
    both = lock_on(NodeView.from_obj(locked_node("n0", [(keys.LOCK, GOLD), (keys.LOCK_EXCLUSIVE, GOLD)])))
    assert both is not None and both.exclusive and both.unreadable == ""


def test_the_reserve_pod_rule_is_the_one_entitlement_applies() -> None:
    """Review of issue 11: `is_reserve_pod` was written twice (shared.entitlement and agent.planner.reserve). The
    planner's reads a pod view through the one rule: the pod's own annotation first, else its PodGroup's."""
    group = PodGroupView.from_obj({"metadata": {"name": "etl", "namespace": "ns",
                                                "annotations": {keys.RESERVEABLE: "true"}}, "spec": {}})
    groups = {("ns", "etl"): group}
    for own, expected in ((None, True), ("false", False), ("true", True), ("yes", False)):
        view = pod("p", "1", group="etl")
        if own is not None:
            view = replace(view, annotations={**view.annotations, keys.RESERVEABLE: own})
        assert is_reserve_pod(view, groups) is expected
