"""The mutation builder over realistic pods: every case also checks idempotency (a second pass is a no-op)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from shared import keys
from shared.config import load_config
from shared.ownership import JobRef, queue_owner_id, reservation_owner_id, window_owner_id
from shared.views import PodGroupView, PriorityClassView, QueueView, ReservationView
from shared.jsonpatch import apply, pointer
from shared.tolerations import BYPASS_TOLERATION, EXCLUSIVE_BYPASS_TOLERATION, exclusive_toleration, lock_toleration
from webhook.lookup import Lookup
from webhook.mutate import mutate_pod, mutate_podgroup, parse_reservation_affinity

NS = "team-a"


def queue(name: str, priority_class: str = "", annotation: str = "") -> QueueView:
    return QueueView.from_obj({"metadata": {"name": name, "annotations": {keys.QUEUE_PRIORITY_CLASS: annotation}
                                            if annotation else {}},
                               "spec": {"priorityClassName": priority_class}})


def pclass(name: str, value: int, global_default: bool = False, policy: str = "PreemptLowerPriority") -> PriorityClassView:
    return PriorityClassView(name, value, global_default, policy)


def podgroup(name: str, queue_name: str, annotations: dict | None = None) -> PodGroupView:
    return PodGroupView.from_obj({"metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
                                  "spec": {"minMember": 2, "queue": queue_name}})


def reservation(name: str, owners: list, phase: str = "Available", labels: dict | None = None) -> ReservationView:
    return ReservationView.from_obj({"metadata": {"name": name, "labels": labels or {}},
                                     "spec": {"owners": owners, "template": {"spec": {"containers": [
                                         {"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}},
                                     "status": {"phase": phase}})


LOOKUP = Lookup(
    podgroups={(NS, "train"): podgroup("train", "research", {keys.RESERVEABLE: "true", keys.MAXIMUM_RUNTIME: "2h"})},
    queues={"research": queue("research", "research-high"), "batch": queue("batch", annotation="batch-low")},
    priority_classes={"research-high": pclass("research-high", 1000), "batch-low": pclass("batch-low", 10, policy="Never"),
                      "cluster-default": pclass("cluster-default", 5, global_default=True)},
    reservations={"r1": reservation("r1", [{"labelSelector": {"matchLabels": {"app": "web"}}}]),
                  "r-pending": reservation("r-pending", [{"labelSelector": {"matchLabels": {"app": "web"}}}], "Pending"),
                  "sel": reservation("sel", [{"object": {"name": "named", "namespace": NS}}], labels={"pool": "gpu"})},
    config=load_config("windows: [{name: nightly, resources: {cpu: 8}, schedule: '0 3 * * *', duration: 1h}]"),
)


def pod(name: str | None = "p", *, annotations: dict | None = None, labels: dict | None = None, requests: dict | None = None,
        owners: list | None = None, spec_extra: dict | None = None, init: list | None = None) -> dict:
    meta: dict = {"namespace": NS}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = "p-"
    if annotations is not None:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    if owners:
        meta["ownerReferences"] = owners
    container: dict = {"name": "main", "image": "busybox"}
    if requests is not None:
        container["resources"] = {"requests": requests}
    spec: dict = {"containers": [container]}
    if init:
        spec["initContainers"] = init
    spec.update(spec_extra or {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def mutated(obj: dict, lookup: Lookup = LOOKUP) -> tuple[dict, list]:
    result = mutate_pod(obj, NS, lookup)
    out = apply(obj, result.patch)
    again = mutate_pod(out, NS, lookup)
    assert again.patch == [], f"not idempotent: second pass patched {again.patch}"
    return out, result.patch


def tolerated_owners(obj: dict) -> set[str]:
    return {t["value"] for t in obj["spec"].get("tolerations", []) if t.get("key") == keys.LOCK and "value" in t}


def test_volcano_job_pod_gets_annotations_priority_tolerations_and_affinity() -> None:
    original = pod("train-0", annotations={keys.GROUP_NAME: "train"}, requests={"cpu": "2"},
                   init=[{"name": "sidecar", "image": "x", "restartPolicy": "Always"}])
    out, patch = mutated(original)
    annotations = out["metadata"]["annotations"]
    assert annotations[keys.RESERVEABLE] == "true" and annotations[keys.MAXIMUM_RUNTIME] == "2h"
    assert (out["spec"]["priorityClassName"], out["spec"]["priority"], out["spec"]["preemptionPolicy"]) == \
        ("research-high", 1000, "PreemptLowerPriority")
    expected = {JobRef(NS, "PodGroup", "train").owner_id, queue_owner_id("research"), window_owner_id("nightly")}
    assert tolerated_owners(out) == expected
    preferred = out["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [{"weight": 100, "preference": {"matchExpressions": [
        {"key": keys.LOCK, "operator": "In", "values": sorted(expected)}]}}]
    assert original["metadata"]["annotations"] == {keys.GROUP_NAME: "train"}, "input must not be modified"
    # annotation keys containing "/" are escaped in the patch paths
    assert pointer("metadata", "annotations", keys.RESERVEABLE) in {op["path"] for op in patch}
    assert "/metadata/annotations/volcano.sh~1reserveable" in {op["path"] for op in patch}


def test_pod_own_annotation_wins_over_podgroup() -> None:
    out, _ = mutated(pod(annotations={keys.GROUP_NAME: "train", keys.MAXIMUM_RUNTIME: "5m"}, requests={"cpu": "1"}))
    assert out["metadata"]["annotations"][keys.MAXIMUM_RUNTIME] == "5m"


def test_missing_annotations_and_tolerations_are_created() -> None:
    out, patch = mutated(pod(annotations=None, requests={"cpu": "1"}, owners=[
        {"apiVersion": "batch/v1", "kind": "Job", "name": "etl", "uid": "u", "controller": True}]))
    assert {op["path"] for op in patch} >= {"/spec/tolerations", "/spec/affinity"}
    assert tolerated_owners(out) == {JobRef(NS, "Job", "etl").owner_id, queue_owner_id("default")}


def test_existing_tolerations_and_affinity_are_kept() -> None:
    user_toleration = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    user_preferred = {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
    user_required = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
                                           {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
    original = pod("named", annotations={keys.RESERVATION_AFFINITY: "sel"}, requests={"cpu": "1"}, spec_extra={
        "tolerations": [user_toleration],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [user_preferred],
                                      "requiredDuringSchedulingIgnoredDuringExecution": user_required},
                     "podAntiAffinity": {"x": 1}}})
    out, _ = mutated(original)
    assert out["spec"]["tolerations"][0] == user_toleration
    node_affinity = out["spec"]["affinity"]["nodeAffinity"]
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"][0] == user_preferred
    assert out["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}
    required_expression = {"key": keys.LOCK, "operator": "In", "values": [reservation_owner_id("sel")]}
    terms = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(required_expression in term["matchExpressions"] for term in terms), terms
    assert terms[0]["matchExpressions"][0]["key"] == "disk"
    assert reservation_owner_id("sel") in tolerated_owners(out)


def test_reservation_owner_by_label_only_when_available() -> None:
    out, _ = mutated(pod("web-1", labels={"app": "web"}, requests={"cpu": "1"}))
    owners = tolerated_owners(out)
    assert reservation_owner_id("r1") in owners and reservation_owner_id("r-pending") not in owners
    other, _ = mutated(pod("api-1", labels={"app": "api"}, requests={"cpu": "1"}))
    assert reservation_owner_id("r1") not in tolerated_owners(other)


def test_unschedulable_reservation_takes_no_new_owners() -> None:
    closed = ReservationView.from_obj({"metadata": {"name": "closed"}, "spec": {
        "owners": [{"labelSelector": {"matchLabels": {"app": "web"}}}], "unschedulable": True,
        "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}},
        "status": {"phase": "Available"}})
    out, _ = mutated(pod("web-1", labels={"app": "web"}, requests={"cpu": "1"}),
                     replace(LOOKUP, reservations={"closed": closed}))
    assert reservation_owner_id("closed") not in tolerated_owners(out)
    opened, _ = mutated(pod("web-1", labels={"app": "web"}, requests={"cpu": "1"}),
                        replace(LOOKUP, reservations={"closed": replace(closed, unschedulable=False)}))
    assert reservation_owner_id("closed") in tolerated_owners(opened)


def test_koordinator_reservation_affinity_json_selector() -> None:
    out, _ = mutated(pod("x", annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: '{"reservationSelector": {"pool": "gpu"}}'},
                         requests={"cpu": "1"}))
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": keys.LOCK, "operator": "In", "values": [reservation_owner_id("sel")]}]}]


def test_best_effort_and_daemonset_pods_tolerate_every_lock() -> None:
    best_effort, patch = mutated(pod("be", annotations={}))
    assert best_effort["spec"]["tolerations"] == [{"key": keys.LOCK, "operator": "Exists"}]
    assert "affinity" not in best_effort["spec"]
    ds_ref = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": True}]
    daemon, _ = mutated(pod("ds", requests={"cpu": "100m"}, owners=ds_ref),
                        replace(LOOKUP, daemonsets={(NS, "agent"): "u"}))  # the DaemonSet exists with that uid
    assert daemon["spec"]["tolerations"] == [{"key": keys.LOCK, "operator": "Exists"},
                                             {"key": keys.LOCK_EXCLUSIVE, "operator": "Exists"}]
    forged, _ = mutated(pod("ds", requests={"cpu": "100m"}, owners=ds_ref))  # no such DaemonSet: an ownerReference
    assert {"key": keys.LOCK, "operator": "Exists"} not in forged["spec"].get("tolerations", [])
    off = Lookup(config=load_config("webhook: {tolerateBestEffort: false}"))
    out, _ = mutated(pod("be2"), off)
    assert {"key": keys.LOCK, "operator": "Exists"} not in out["spec"].get("tolerations", [])


def test_priority_inheritance_rules() -> None:
    in_batch = {keys.QUEUE_NAME: "batch"}
    out, _ = mutated(pod(annotations=in_batch, requests={"cpu": "1"}))
    assert (out["spec"]["priorityClassName"], out["spec"]["priority"], out["spec"]["preemptionPolicy"]) == \
        ("batch-low", 10, "Never")
    # the globalDefault class the Priority plugin filled in counts as "no class chosen"
    defaulted = pod(annotations=in_batch, requests={"cpu": "1"}, spec_extra={"priorityClassName": "cluster-default", "priority": 5})
    out, _ = mutated(defaulted)
    assert out["spec"]["priorityClassName"] == "batch-low" and out["spec"]["priority"] == 10
    # an explicit class is kept
    chosen = pod(annotations=in_batch, requests={"cpu": "1"}, spec_extra={"priorityClassName": "research-high", "priority": 1000})
    out, patch = mutated(chosen)
    assert out["spec"]["priorityClassName"] == "research-high"
    assert not [op for op in patch if op["path"].startswith("/spec/priority")]
    # a queue whose class does not exist changes nothing
    missing = Lookup(queues={"q": queue("q", "nope")})
    out, patch = mutated(pod(annotations={keys.QUEUE_NAME: "q"}, requests={"cpu": "1"}), missing)
    assert "priorityClassName" not in out["spec"]


def test_generate_name_pod_without_controller_gets_queue_toleration_only() -> None:
    out, _ = mutated(pod(None, annotations={}, requests={"cpu": "1"}))
    assert tolerated_owners(out) == {queue_owner_id("default")}


def test_a_nodes_mirror_pods_are_left_alone_and_anyone_elses_are_mutated() -> None:
    """Only a node's own identity makes a mirror pod (NodeRestriction): the annotation from a tenant is no exemption."""
    mirror = pod(annotations={"kubernetes.io/config.mirror": "x"}, requests={"cpu": "1"})
    assert mutate_pod(mirror, NS, LOOKUP, "system:node:n1", ("system:nodes", "system:authenticated")).patch == []
    # a user named like a node but not in the nodes' group (a misconfigured authenticator) is no node
    assert mutate_pod(mirror, NS, LOOKUP, "system:node:n1", ("system:authenticated",)).patch != []
    for sender in ("", "system:serviceaccount:team-a:tenant", "alice", "system:nodes"):
        assert mutate_pod(mirror, NS, LOOKUP, sender).patch == mutate_pod(pod(requests={"cpu": "1"}), NS, LOOKUP).patch
        assert mutate_pod(mirror, NS, LOOKUP, sender).patch != []


def test_annotation_keys_with_tilde_and_slash_are_escaped() -> None:
    weird = podgroup("w", "default", {keys.RESERVEABLE: "true"})
    lookup = Lookup(podgroups={(NS, "w"): weird})
    original = pod(annotations={keys.GROUP_NAME: "w", "a~b/c": "kept"}, requests={"cpu": "1"})
    out, patch = mutated(original, lookup)
    assert out["metadata"]["annotations"]["a~b/c"] == "kept"
    assert pointer("metadata", "annotations", "a~b/c") == "/metadata/annotations/a~0b~1c"


def test_podgroup_inherits_queue_class() -> None:
    group = {"metadata": {"name": "g", "namespace": NS}, "spec": {"queue": "research", "minMember": 1}}
    result = mutate_podgroup(group, "team", LOOKUP)
    assert apply(group, result.patch)["spec"]["priorityClassName"] == "research-high"
    assert mutate_podgroup(apply(group, result.patch), "team", LOOKUP).patch == []
    explicit = copy.deepcopy(group)
    explicit["spec"]["priorityClassName"] = "batch-low"
    assert mutate_podgroup(explicit, "team", LOOKUP).patch == []


def test_a_queue_bound_to_another_namespace_lends_no_priority_class() -> None:
    """Issue 29: naming a Queue whose reservoir.sh/namespaces leaves the namespace out gives neither the pod nor the
    PodGroup its PriorityClass; a namespace it lists gets it."""
    bound = queue("research", "research-high")
    bound = replace(bound, annotations={keys.QUEUE_NAMESPACES: "lab, other"})
    lookup = replace(LOOKUP, queues={**LOOKUP.queues, "research": bound})
    named = pod(annotations={keys.QUEUE_NAME: "research"}, requests={"cpu": "1"})
    out, _ = mutated(named, lookup)
    assert "priorityClassName" not in out["spec"] and "priority" not in out["spec"]
    group = {"metadata": {"name": "g", "namespace": NS}, "spec": {"queue": "research", "minMember": 1}}
    assert mutate_podgroup(group, NS, lookup).patch == []
    assert apply(group, mutate_podgroup(group, "lab", lookup).patch)["spec"]["priorityClassName"] == "research-high"
    out = apply(named, mutate_pod({**named, "metadata": {**named["metadata"], "namespace": "lab"}}, "lab",
                                  lookup).patch)
    assert out["spec"]["priorityClassName"] == "research-high"


@pytest.mark.parametrize("text", ["", "{", '{"name": 3}', '{"reservationSelector": "x"}'])
def test_bad_reservation_affinity_warns_instead_of_failing(text: str) -> None:
    """The pod is mutated as one without the annotation; an unreadable affinity adds a warning naming it, an empty
    one is no affinity at all and adds none."""
    result = mutate_pod(pod(annotations={keys.RESERVATION_AFFINITY: text}, requests={"cpu": "1"}), NS, LOOKUP)
    plain = mutate_pod(pod(annotations={}, requests={"cpu": "1"}), NS, LOOKUP)
    assert result.patch == plain.patch != []
    if text:
        assert [w for w in result.warnings if "reservation affinity" in w] and len(result.warnings) == 1
    else:
        assert result.warnings == plain.warnings == []


def test_naming_a_reservation_narrows_but_never_grants_its_toleration() -> None:
    """Issue 10, attack 1: a pod that names a Reservation it does not own is held to that Reservation's nodes
    (required affinity) but gets no toleration for it, so it cannot land there; an empty selector is refused."""
    stranger, _ = mutated(pod("x", annotations={keys.RESERVATION_AFFINITY: "r1"}, requests={"cpu": "1"}))
    assert reservation_owner_id("r1") not in tolerated_owners(stranger)
    terms = stranger["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": keys.LOCK, "operator": "In", "values": [reservation_owner_id("r1")]}]}]
    owner, _ = mutated(pod("y", labels={"app": "web"}, annotations={keys.RESERVATION_AFFINITY: "r1"},
                           requests={"cpu": "1"}))
    assert reservation_owner_id("r1") in tolerated_owners(owner)
    with pytest.raises(ValueError, match="empty reservationSelector"):
        parse_reservation_affinity('{"reservationSelector": {}}')


# --- issue 11 ---

def test_a_podgroups_own_class_comes_before_its_queues() -> None:
    """Seed 001 `cache.go`, issue 11's report: a PodGroup of class `research-high` in queue `batch` (class
    `batch-low`, preemptionPolicy Never) gives its pods `research-high` with its value and policy, not the queue's. A
    PodGroup naming a class that does not exist falls back to the queue's; a pod's own class is kept."""
    groups = {(NS, "hi"): PodGroupView.from_obj({"metadata": {"name": "hi", "namespace": NS},
                                                  "spec": {"queue": "batch", "priorityClassName": "research-high"}}),
              (NS, "ghost"): PodGroupView.from_obj({"metadata": {"name": "ghost", "namespace": NS},
                                                     "spec": {"queue": "batch", "priorityClassName": "nope"}})}
    lookup = replace(LOOKUP, podgroups=groups)
    out, _ = mutated(pod("hi-0", annotations={keys.GROUP_NAME: "hi"}, requests={"cpu": "1"}), lookup)
    assert (out["spec"]["priorityClassName"], out["spec"]["priority"], out["spec"]["preemptionPolicy"]) == \
        ("research-high", 1000, "PreemptLowerPriority")
    # the globalDefault class the Priority plugin filled in still counts as "no class chosen"
    defaulted = pod("hi-1", annotations={keys.GROUP_NAME: "hi"}, requests={"cpu": "1"},
                    spec_extra={"priorityClassName": "cluster-default", "priority": 5})
    assert mutated(defaulted, lookup)[0]["spec"]["priorityClassName"] == "research-high"
    out, _ = mutated(pod("ghost-0", annotations={keys.GROUP_NAME: "ghost"}, requests={"cpu": "1"}), lookup)
    assert (out["spec"]["priorityClassName"], out["spec"]["preemptionPolicy"]) == ("batch-low", "Never")
    chosen = pod("hi-2", annotations={keys.GROUP_NAME: "hi"}, requests={"cpu": "1"},
                 spec_extra={"priorityClassName": "batch-low", "priority": 10})
    out, patch = mutated(chosen, lookup)
    assert out["spec"]["priorityClassName"] == "batch-low" and not [o for o in patch if "priority" in o["path"]]


GUARANTEED = QueueView.from_obj({"metadata": {"name": "gold", "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                                 "spec": {"guarantee": {"policy": "Guaranteed", "resource": {"cpu": "4"}}}})


def test_best_effort_pods_get_no_toleration_for_a_guaranteed_queues_exclusive_locks() -> None:
    """Issue 11 (seed 002 `Guaranteed`): the BestEffort exemption's toleration does not reach the exclusive taint of a
    `Guaranteed` queue's locks; a BestEffort pod of that queue gets that queue's exclusive toleration, a DaemonSet's
    pod every one, and the queue's other pods both of its tolerations. Only opted-in queues lock (exclusively)."""
    lookup = replace(LOOKUP, queues={**LOOKUP.queues, "gold": GUARANTEED})
    gold = queue_owner_id("gold")
    stranger, _ = mutated(pod("be", annotations={}), lookup)
    assert stranger["spec"]["tolerations"] == [BYPASS_TOLERATION]
    member, _ = mutated(pod("be-gold", annotations={keys.QUEUE_NAME: "gold"}), lookup)
    assert member["spec"]["tolerations"] == [BYPASS_TOLERATION, exclusive_toleration(gold)]
    worker, _ = mutated(pod("w", annotations={keys.QUEUE_NAME: "gold"}, requests={"cpu": "1"}), lookup)
    assert lock_toleration(gold) in worker["spec"]["tolerations"]
    assert exclusive_toleration(gold) in worker["spec"]["tolerations"]
    ds_ref = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": True}]
    daemon, _ = mutated(pod("ds", owners=ds_ref), replace(lookup, daemonsets={(NS, "agent"): "u"}))
    assert daemon["spec"]["tolerations"] == [BYPASS_TOLERATION, EXCLUSIVE_BYPASS_TOLERATION]
    # a Best-Effort guarantee, or one not opted in, locks nothing exclusively
    best_effort = QueueView.from_obj({"metadata": {"name": "gold", "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                                      "spec": {"guarantee": {"resource": {"cpu": "4"}}}})
    not_opted = replace(GUARANTEED, annotations={})
    for queue_view in (best_effort, not_opted):
        plain, _ = mutated(pod("w", annotations={keys.QUEUE_NAME: "gold"}, requests={"cpu": "1"}),
                           replace(LOOKUP, queues={"gold": queue_view}))
        assert not [t for t in plain["spec"]["tolerations"] if t.get("key") == keys.LOCK_EXCLUSIVE]
