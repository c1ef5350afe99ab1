"""Entitlement (DESIGN section 1): which lock owners a pod may use, and the check of what a pod brings itself."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shared import keys
from shared.config import load_config
from shared.entitlement import Grounds, entitlement, lock_claims, unentitled
from shared.ownership import JobRef, queue_owner_id, reservation_owner_id, window_owner_id
from shared.tolerations import (
    BYPASS_TOLERATION,
    EXCLUSIVE_BYPASS_TOLERATION,
    exclusive_toleration,
    lock_toleration,
)
from shared.views import PodGroupView, QueueView, ReservationView

NS = "team-a"
WINDOWS = """
windows:
- {name: open, resources: {cpu: "1"}, schedule: "0 3 * * *", duration: 1h}
- {name: only-b, resources: {cpu: "1"}, schedule: "0 3 * * *", duration: 1h, namespaces: [team-b]}
- {name: only-gold, resources: {cpu: "1"}, schedule: "0 3 * * *", duration: 1h, queues: [gold]}
"""


def pod(name: str = "p", *, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
        requests: dict[str, str] | None = None, tolerations: list[dict[str, Any]] | None = None,
        owner_refs: list[dict[str, Any]] | None = None, node_name: str = "") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "x"}
    if requests is not None:
        container["resources"] = {"requests": requests}
    spec: dict[str, Any] = {"containers": [container]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if node_name:
        spec["nodeName"] = node_name
    meta: dict[str, Any] = {"name": name, "namespace": NS, "annotations": annotations or {}, "labels": labels or {}}
    if owner_refs:
        meta["ownerReferences"] = owner_refs
    return {"metadata": meta, "spec": spec}


def reservation(name: str, owners: list[dict[str, Any]], phase: str = "Available") -> ReservationView:
    return ReservationView.from_obj({"metadata": {"name": name}, "spec": {
        "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
        "owners": owners}, "status": {"phase": phase, "nodeName": "n1"}})


def queue(name: str, namespaces: str | None = None) -> QueueView:
    annotations = {keys.QUEUE_NAMESPACES: namespaces} if namespaces is not None else {}
    return QueueView.from_obj({"metadata": {"name": name, "annotations": annotations}, "spec": {"weight": 1}})


CPU = {"cpu": "1"}
GROUNDS = Grounds(config=load_config(WINDOWS))


def test_a_pod_may_use_its_job_and_its_queue() -> None:
    rights = entitlement(pod(requests=CPU), NS, GROUNDS)
    assert set(rights.owners) == {JobRef(NS, "Pod", "p").owner_id, queue_owner_id("default")}
    assert rights.every_lock is None


def test_a_queue_bound_to_namespaces_lets_only_those_in() -> None:
    bound = Grounds(queues={"gold": queue("gold", "team-b, team-c")})
    rights = entitlement(pod(annotations={keys.QUEUE_NAME: "gold"}, requests=CPU), NS, bound)
    assert queue_owner_id("gold") not in rights.owners
    inside = entitlement(pod(annotations={keys.QUEUE_NAME: "gold"}, requests=CPU), "team-c", bound)
    assert queue_owner_id("gold") in inside.owners


def test_reserve_pods_use_the_windows_their_namespace_and_queue_are_allowed() -> None:
    reserve = {keys.RESERVEABLE: "true"}
    rights = entitlement(pod(annotations=reserve, requests=CPU), NS, GROUNDS)
    assert window_owner_id("open") in rights.owners
    assert window_owner_id("only-b") not in rights.owners and window_owner_id("only-gold") not in rights.owners
    gold = entitlement(pod(annotations={**reserve, keys.QUEUE_NAME: "gold"}, requests=CPU), "team-b", GROUNDS)
    assert {window_owner_id(w) for w in ("open", "only-b", "only-gold")} <= set(gold.owners)
    assert window_owner_id("open") not in entitlement(pod(requests=CPU), NS, GROUNDS).owners


def test_a_podgroup_makes_its_pods_reserve_pods() -> None:
    group = PodGroupView.from_obj({"metadata": {"name": "g", "namespace": NS,
                                                "annotations": {keys.RESERVEABLE: "true"}}, "spec": {"minMember": 1}})
    grounds = Grounds(podgroups={(NS, "g"): group}, config=GROUNDS.config)
    rights = entitlement(pod(annotations={keys.GROUP_NAME: "g"}, requests=CPU), NS, grounds)
    assert window_owner_id("open") in rights.owners


def test_reservations_only_for_owners_and_only_while_available() -> None:
    grounds = Grounds(reservations={
        "mine": reservation("mine", [{"labelSelector": {"matchLabels": {"app": "train"}}}]),
        "waiting": reservation("waiting", [{"labelSelector": {"matchLabels": {"app": "train"}}}], phase="Waiting"),
        "theirs": reservation("theirs", [{"labelSelector": {"matchLabels": {"app": "other"}}}]),
    })
    named = {keys.RESERVATION_AFFINITY: "theirs"}  # naming a Reservation narrows, never grants
    rights = entitlement(pod(labels={"app": "train"}, annotations=named, requests=CPU), NS, grounds)
    assert reservation_owner_id("mine") in rights.owners
    assert reservation_owner_id("waiting") not in rights.owners
    assert reservation_owner_id("theirs") not in rights.owners


def test_exemptions_best_effort_daemonset_trusted_namespace() -> None:
    assert entitlement(pod(), NS, GROUNDS).every_lock is not None  # BestEffort
    gpu_only = entitlement(pod(requests={"nvidia.com/gpu": "8"}), NS, GROUNDS)
    assert gpu_only.every_lock is None, "an extended-resource request is a request"
    ds_ref = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u-1", "controller": True}]
    assert entitlement(pod(requests=CPU, owner_refs=ds_ref), NS, GROUNDS).every_lock is None, "forged DaemonSet"
    real = Grounds(daemonsets={(NS, "agent"): "u-1"})
    assert entitlement(pod(requests=CPU, owner_refs=ds_ref), NS, real).every_lock is not None
    other_uid = Grounds(daemonsets={(NS, "agent"): "u-2"})
    assert entitlement(pod(requests=CPU, owner_refs=ds_ref), NS, other_uid).every_lock is None
    trusted = Grounds(config=load_config(f"webhook: {{trustedNamespaces: [{NS}]}}"))
    in_trusted = entitlement(pod(requests=CPU, tolerations=[{"operator": "Exists"}]), NS, trusted)
    assert in_trusted.every_lock is None and in_trusted.trusted is not None, "trusted: let in, not given more"
    assert unentitled(pod(requests=CPU, tolerations=[{"operator": "Exists"}]), NS, in_trusted, {}) == []


def test_lock_claims_follow_the_one_toleration_rule() -> None:
    tolerations: list[Any] = [
        {"key": "dedicated", "operator": "Exists"},
        lock_toleration("job-x"),
        {"key": keys.LOCK, "operator": "Exists"},
        {"operator": "Exists"},
        {"operator": "Exists", "effect": "NoExecute"},  # does not tolerate a NoSchedule taint
        {"key": keys.LOCK, "operator": "Equal", "value": "queue-y", "effect": "NoExecute"},
        "not a toleration",
        {"key": keys.LOCK_EXCLUSIVE, "operator": "Exists"},
        exclusive_toleration("queue-z"),
    ]
    # a toleration of no key claims both taint keys: the lock's and the exclusive one
    assert [(c.index, c.owner, c.exclusive) for c in lock_claims(tolerations)] == [
        (1, "job-x", False), (2, None, False), (3, None, False), (3, None, True), (7, None, True), (8, "queue-z", True)]


def test_a_pod_bringing_a_lock_toleration_it_is_not_entitled_to_is_refused() -> None:
    own = JobRef(NS, "Pod", "p").owner_id
    fine = pod(requests=CPU, tolerations=[lock_toleration(own), lock_toleration(queue_owner_id("default"))])
    assert unentitled(fine, NS, entitlement(fine, NS, GROUNDS), {}) == []
    forged = pod(requests=CPU, tolerations=[lock_toleration("job-someone-else-abc123")])
    problems = unentitled(forged, NS, entitlement(forged, NS, GROUNDS), {})
    assert len(problems) == 1 and "spec.tolerations[0]" in problems[0] and "job-someone-else-abc123" in problems[0]
    for blanket in ({"key": keys.LOCK, "operator": "Exists"}, {"operator": "Exists"}):
        wide = pod(requests=CPU, tolerations=[blanket])
        problems = unentitled(wide, NS, entitlement(wide, NS, GROUNDS), {})
        assert len(problems) == 1 and "every Reservoir lock" in problems[0]
    best_effort = pod(tolerations=[BYPASS_TOLERATION])
    assert unentitled(best_effort, NS, entitlement(best_effort, NS, GROUNDS), {}) == []
    # a blanket toleration also tolerates the exclusive taint, which being BestEffort never entitles (issue 11 review)
    blanket_best_effort = pod(tolerations=[{"operator": "Exists"}])
    [problem] = unentitled(blanket_best_effort, NS, entitlement(blanket_best_effort, NS, GROUNDS), {})
    assert "every exclusive Reservoir lock" in problem


def test_node_name_on_a_locked_node_needs_the_lock() -> None:
    own = JobRef(NS, "Pod", "p").owner_id
    locks = {"n1": "job-someone-else-abc123", "n2": own}
    onto_other = pod(requests=CPU, node_name="n1")
    problems = unentitled(onto_other, NS, entitlement(onto_other, NS, GROUNDS), locks)
    assert len(problems) == 1 and "spec.nodeName 'n1'" in problems[0]
    for node in ("n2", "n3"):
        placed = pod(requests=CPU, node_name=node)
        assert unentitled(placed, NS, entitlement(placed, NS, GROUNDS), locks) == []


def test_a_best_effort_pod_may_not_use_a_guaranteed_queues_exclusive_locks() -> None:
    """Issue 11: the BestEffort exemption stops at the exclusive locks of `Guaranteed` queues opted into locks (their
    evictions would bring the pod back every reconcile): not its tolerations of them, not a blanket toleration while
    such a lock may exist, not a nodeName on such a node. Its own queue's it may use; a DaemonSet's pod every one."""
    strict = QueueView.from_obj({"metadata": {"name": "gold", "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                                 "spec": {"guarantee": {"policy": "Guaranteed", "resource": {"cpu": "4"}}}})
    grounds = Grounds(queues={"gold": strict}, daemonsets={(NS, "ds"): "u"})
    gold = queue_owner_id("gold")
    assert grounds.exclusive_owners == {gold}
    stranger = entitlement(pod(), NS, grounds)
    assert stranger.every_lock is not None and not stranger.allows(gold) and stranger.allows("job-anyone-abc123")
    member = entitlement(pod(annotations={keys.QUEUE_NAME: "gold"}), NS, grounds)
    assert member.allows(gold)
    daemon = entitlement(pod(owner_refs=[{"kind": "DaemonSet", "name": "ds", "uid": "u", "controller": True}]), NS,
                         grounds)
    assert daemon.allows(gold) and daemon.tolerations() == [BYPASS_TOLERATION, EXCLUSIVE_BYPASS_TOLERATION]

    def refusals(**fields: Any) -> list[str]:
        candidate = pod(**fields)
        return unentitled(candidate, NS, entitlement(candidate, NS, grounds), {"n1": gold})

    assert refusals(tolerations=[BYPASS_TOLERATION]) == [], "the lock key's Exists reaches no exclusive taint"
    [blanket] = refusals(tolerations=[{"operator": "Exists"}])
    assert "spec.tolerations[0]" in blanket and gold in blanket
    assert len(refusals(tolerations=[exclusive_toleration(gold)])) == 1
    assert len(refusals(tolerations=[{"key": keys.LOCK_EXCLUSIVE, "operator": "Exists"}])) == 1
    [pinned] = refusals(node_name="n1")
    assert "spec.nodeName 'n1'" in pinned
    assert refusals(annotations={keys.QUEUE_NAME: "gold"}, node_name="n1",
                    tolerations=[BYPASS_TOLERATION, exclusive_toleration(gold)]) == []
    # a Best-Effort guarantee, or no opt-in: nothing is exclusive
    for queue_view in (replace(strict, annotations={}),
                       QueueView.from_obj({"metadata": {"name": "gold",
                                                        "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                                           "spec": {"guarantee": {"resource": {"cpu": "4"}}}})):
        assert Grounds(queues={"gold": queue_view}).exclusive_owners == frozenset()


def test_an_exclusive_toleration_is_judged_by_entitlement_before_any_queue_is_exclusive() -> None:
    """Hostile-tenant review of issue 11: while no queue's locks are exclusive a BestEffort pod could bring
    `reservoir.sh/lock-exclusive` tolerations (Exists, or Equal naming a queue) and keep them on the nodes of a queue
    that opts in later. Every toleration of that key is judged by entitlement always: the owner's entitled pods and
    a DaemonSet's pods may carry it; being BestEffort entitles to none; a trusted namespace's pod carries what it
    brings."""
    assert GROUNDS.exclusive_owners == frozenset(), "no queue is exclusive now"
    gold = queue_owner_id("gold")
    every_exclusive = {"key": keys.LOCK_EXCLUSIVE, "operator": "Exists"}

    def refusals(candidate: dict[str, Any], grounds: Grounds = GROUNDS) -> list[str]:
        return unentitled(candidate, NS, entitlement(candidate, NS, grounds), {})

    [exists] = refusals(pod(tolerations=[BYPASS_TOLERATION, every_exclusive]))
    assert "spec.tolerations[1]" in exists and "every exclusive Reservoir lock" in exists
    [equal] = refusals(pod(tolerations=[exclusive_toleration(gold)]))
    assert "spec.tolerations[0]" in equal and f"the exclusive lock of {gold}" in equal
    equal_no_effect = {"key": keys.LOCK_EXCLUSIVE, "operator": "Equal", "value": gold}
    assert len(refusals(pod(tolerations=[equal_no_effect]))) == 1
    assert len(refusals(pod(requests=CPU, tolerations=[exclusive_toleration(gold)]))) == 1
    assert len(refusals(pod(requests=CPU, tolerations=[every_exclusive]))) == 1
    # entitled: the queue's own pods (BestEffort or not), a real DaemonSet's pod, a trusted namespace's
    member = {keys.QUEUE_NAME: "gold"}
    assert refusals(pod(annotations=member, tolerations=[exclusive_toleration(gold)])) == []
    assert refusals(pod(annotations=member, requests=CPU, tolerations=[exclusive_toleration(gold)])) == []
    ds_ref = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u-1", "controller": True}]
    with_ds = Grounds(daemonsets={(NS, "agent"): "u-1"})
    assert refusals(pod(owner_refs=ds_ref, tolerations=[every_exclusive]), with_ds) == []
    assert len(refusals(pod(owner_refs=ds_ref, tolerations=[every_exclusive]))) == 1, "forged DaemonSet"
    trusted = Grounds(config=load_config(f"webhook: {{trustedNamespaces: [{NS}]}}"))
    assert refusals(pod(tolerations=[every_exclusive, exclusive_toleration(gold)]), trusted) == []
    # a queue that does not let the namespace in entitles its pods to nothing, exclusive or not
    bound = Grounds(queues={"gold": queue("gold", "team-z")})
    assert len(refusals(pod(annotations=member, tolerations=[exclusive_toleration(gold)]), bound)) == 1
