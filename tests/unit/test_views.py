from datetime import timedelta
from fractions import Fraction

import pytest

from shared import keys
from shared.views import NodeView, PodGroupView, PodView, PriorityClassView, QueueView, ReservationView, ViewError


def test_node_view_reads_lock_taint_and_allocatable() -> None:
    node = NodeView.from_obj({
        "metadata": {"name": "n1", "labels": {"a": "b"}, "creationTimestamp": "2026-11-22T10:00:00Z"},
        "spec": {"unschedulable": True, "taints": [
            {"key": "other", "value": "v", "effect": "NoExecute"},
            {"key": keys.LOCK, "value": "job-x-abcdef", "effect": "NoSchedule"},
        ]},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
    })
    assert node.lock_owner == "job-x-abcdef"
    assert node.unschedulable
    assert node.allocatable["cpu"] == 4000 and node.allocatable["pods"] == 110


def test_pod_view() -> None:
    pod = PodView.from_obj({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                     "annotations": {keys.MAXIMUM_RUNTIME: "2h30m", keys.RESERVEABLE: "true", keys.GROUP_NAME: "pg"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u2",
                                          "controller": True}]},
        "spec": {"nodeName": "n1", "priority": 7, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running", "startTime": "2026-11-22T10:00:00Z"},
    })
    assert pod.key == "ns/p" and pod.holds_resources and pod.reserveable
    assert pod.maximum_runtime == timedelta(hours=2, minutes=30)
    assert pod.controller is not None and pod.controller.kind == "Job"
    assert pod.group_name == "pg" and pod.priority == 7 and not pod.best_effort
    assert pod.requests["cpu"] == 1000


def test_pod_with_bad_runtime_reads_as_none() -> None:
    pod = PodView.from_obj({"metadata": {"annotations": {keys.MAXIMUM_RUNTIME: "forever"}}, "spec": {"containers": []}})
    assert pod.maximum_runtime is None and pod.best_effort and not pod.is_bound


def test_podgroup_and_queue_defaults() -> None:
    group = PodGroupView.from_obj({"metadata": {"name": "g", "namespace": "ns"}, "spec": {}})
    assert group.queue == keys.DEFAULT_QUEUE and group.min_member == 1
    queue = QueueView.from_obj({"metadata": {"name": "q"}, "spec": {
        "guarantee": {"resource": {"cpu": "2"}, "percentage": {"dimensions": ["cpu"], "value": 0.2}}}})
    assert queue.guarantee is not None and queue.guarantee.policy == "Best-Effort"
    assert queue.guarantee.resource["cpu"] == 2000 and queue.guarantee.percentage_value == Fraction(1, 5)
    assert QueueView.from_obj({"metadata": {"name": "q"}, "spec": {}}).guarantee is None


def test_reservation_ttl_defaults() -> None:
    base = {"metadata": {"name": "r"}, "spec": {"owners": [{"labelSelector": {}}], "template": {
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}}}}
    assert ReservationView.from_obj(base).ttl == timedelta(hours=24)
    with_ttl = {**base, "spec": {**base["spec"], "ttl": "0"}}
    assert ReservationView.from_obj(with_ttl).ttl is None
    with_expires = {**base, "spec": {**base["spec"], "expires": "2026-12-01T00:00:00Z"}}
    view = ReservationView.from_obj(with_expires)
    assert view.ttl is None and view.expires is not None and view.allocate_once
    assert view.requests["cpu"] == 2000 and view.phase == "Pending"


# --- issue 10: a field of the wrong type makes that one object unreadable, with the field named ---


def _pod(**spec: object) -> dict:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [], **spec}}


@pytest.mark.parametrize(("view", "obj", "field"), [
    (PodView, _pod(priority="abc"), "spec.priority"),
    (PodView, _pod(nodeName=5), "spec.nodeName"),
    (PodView, _pod(tolerations="all"), "spec.tolerations"),
    (PodView, _pod(tolerations=["x"]), "spec.tolerations[0]"),
    (PodView, _pod(nodeSelector=["a"]), "spec.nodeSelector"),
    (PodView, _pod(containers=[{"resources": {"requests": {"cpu": "banana"}}}]), "spec (resources)"),
    (PodView, {"metadata": {"name": 5}, "spec": {}}, "metadata.name"),
    (PodView, {"metadata": {"name": "p", "annotations": ["a"]}}, "metadata.annotations"),
    (PodView, {"metadata": {"name": "p", "labels": {"a": 1}}}, "metadata.labels['a']"),
    (PodView, {"metadata": {"name": "p", "ownerReferences": {"kind": "Job"}}}, "metadata.ownerReferences"),
    (PodView, {"metadata": {"name": "p", "creationTimestamp": "yesterday"}}, "metadata.creationTimestamp"),
    (PodView, {"metadata": "p"}, "metadata"),
    (PodView, {"metadata": {"name": "p"}, "spec": "s"}, "spec"),
    (PodGroupView, {"metadata": {"name": "g"}, "spec": {"minMember": "x"}}, "spec.minMember"),
    (PodGroupView, {"metadata": {"name": "g"}, "spec": {"minMember": True}}, "spec.minMember"),
    (PodGroupView, {"metadata": {"name": "g"}, "spec": {"minMember": float("inf")}}, "spec.minMember"),
    (PodGroupView, {"metadata": {"name": "g"}, "spec": {"queue": ["q"]}}, "spec.queue"),
    (QueueView, {"metadata": {"name": "q"}, "spec": {"capability": {"cpu": "banana"}}}, "spec.capability.cpu"),
    (QueueView, {"metadata": {"name": "q"}, "spec": {"deserved": {"cpu": "1e1.5"}}}, "spec.deserved.cpu"),
    (QueueView, {"metadata": {"name": "q"}, "spec": {"priority": "abc"}}, "spec.priority"),
    (QueueView, {"metadata": {"name": "q"}, "spec": {"weight": {}}}, "spec.weight"),
    (QueueView, {"metadata": {"name": "q"}, "spec": {"guarantee": "all"}}, "spec.guarantee"),
    (QueueView, {"metadata": {"name": "q"}, "spec": {"guarantee": {"percentage": {"value": "lots"}}}},
     "spec.guarantee.percentage.value"),
    (QueueView, {"metadata": {"name": "q"}, "spec": {"guarantee": {"percentage": {"value": "nan"}}}},
     "spec.guarantee.percentage.value"),
    (QueueView, {"metadata": {"name": "q"}, "spec": {"guarantee": {"percentage": {"dimensions": "cpu"}}}},
     "spec.guarantee.percentage.dimensions"),
    (QueueView, {"metadata": {"name": "q"}, "status": {"reservation": ["n1"]}}, "status.reservation"),
    (PriorityClassView, {"metadata": {"name": "pc"}, "value": "high"}, "value"),
    (PriorityClassView, {"metadata": {"name": "pc"}, "globalDefault": "yes"}, "globalDefault"),
    (NodeView, {"metadata": {"name": "n"}, "spec": {"taints": [{"key": 1}]}}, "spec.taints[0].key"),
    (NodeView, {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "1e10000000"}}}, "status.allocatable.cpu"),
    (NodeView, {"metadata": {"name": "n"}, "spec": {"unschedulable": "yes"}}, "spec.unschedulable"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"ttl": "999999999999h"}}, "spec.ttl"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"ttl": 5}}, "spec.ttl"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"expires": "soon"}}, "spec.expires"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"expires": "9999-12-31T23:59:59Z"}}, "spec.expires"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"owners": {"object": {}}}}, "spec.owners"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"template": []}}, "spec.template"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"template": {"spec": {"nodeSelector": {"a": 1}}}}},
     "spec.template.spec.nodeSelector['a']"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"template": {"spec": {"tolerations": "all"}}}},
     "spec.template.spec.tolerations"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ["x"]}}}}}}},
     "nodeSelectorTerms[0]"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"template": {"spec": {"containers": [
        {"resources": {"requests": {"cpu": "banana"}}}]}}}}, "spec.template.spec (resources)"),
    (ReservationView, {"metadata": {"name": "r"}, "spec": {"allocateOnce": "false"}}, "spec.allocateOnce"),
    (ReservationView, {"metadata": {"name": "r"}, "status": {"phase": 3}}, "status.phase"),
])
def test_a_field_of_the_wrong_type_names_the_object_and_the_field(view: type, obj: dict, field: str) -> None:
    with pytest.raises(ViewError) as err:
        view.from_obj(obj)
    message = str(err.value)
    assert field in message, message
    name = (obj.get("metadata") or {}).get("name") if isinstance(obj.get("metadata"), dict) else None
    if isinstance(name, str):
        assert name in message


@pytest.mark.parametrize("obj", [None, [], "pod", 5])
def test_something_that_is_not_an_object_is_a_view_error(obj: object) -> None:
    for view in (NodeView, PodView, PodGroupView, QueueView, PriorityClassView, ReservationView):
        with pytest.raises(ViewError):
            view.from_obj(obj)  # type: ignore[arg-type]


def test_a_pod_with_an_overflowing_runtime_reads_as_none() -> None:
    """`volcano.sh/maximum-runtime: "999999999999h"` raised OverflowError and dropped the pod from the cache."""
    pod = PodView.from_obj({"metadata": {"name": "p", "annotations": {keys.MAXIMUM_RUNTIME: "999999999999h"}},
                            "spec": {"containers": []}})
    assert pod.maximum_runtime is None and pod.name == "p"


def test_tolerated_shapes_read_as_before() -> None:
    group = PodGroupView.from_obj({"metadata": {"name": "g"}, "spec": {"minMember": "3", "minResources": {
        "cpu": "banana"}, "junk": {"anything": [1, {"goes": None}]}}})
    assert group.min_member == 3, "a string of an integer was read before, and still is"
    assert PodGroupView.from_obj({"metadata": {"name": "g"}, "spec": {"minMember": 2.0}}).min_member == 2
    assert PodView.from_obj(_pod(priority=None)).priority == 0
    queue = QueueView.from_obj({"metadata": {"name": "q"}, "spec": {"priority": 5, "guarantee": {
        "percentage": {"dimensions": ["cpu"], "value": "0.5"}}}})
    assert queue.priority == 5 and queue.guarantee is not None and queue.guarantee.percentage_value == Fraction(1, 2)
    assert QueueView.from_obj({"metadata": {"name": "q"}, "spec": {}}).priority is None


def test_a_reservation_owner_that_is_not_an_object_is_dropped_the_rest_kept() -> None:
    view = ReservationView.from_obj({"metadata": {"name": "r"}, "spec": {"owners": [
        "text", 5, {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": "abc"}]}}]}})
    assert view.owners == ({"labelSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": "abc"}]}},)


def test_raw_subtrees_a_view_keeps_are_bounded_in_depth() -> None:
    from shared.views import MAX_DEPTH

    nested: dict = {}
    inner = nested
    for _ in range(MAX_DEPTH + 5):
        inner["x"] = {}
        inner = inner["x"]
    with pytest.raises(ViewError) as err:
        ReservationView.from_obj({"metadata": {"name": "r"}, "spec": {"template": {"metadata": nested}}})
    assert "spec.template" in str(err.value) and "nested more than" in str(err.value)
    with pytest.raises(ViewError):
        ReservationView.from_obj({"metadata": {"name": "r"}, "spec": {"owners": [{"object": nested}]}})
    # a PodGroup keeps no raw subtree: deep junk under spec is simply not read
    assert PodGroupView.from_obj({"metadata": {"name": "g"}, "spec": {"junk": nested}}).name == "g"
