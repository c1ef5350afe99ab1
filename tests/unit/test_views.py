from datetime import timedelta

from shared import keys
from shared.views import NodeView, PodGroupView, PodView, QueueView, ReservationView


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
    assert queue.guarantee.resource["cpu"] == 2000 and queue.guarantee.percentage_value == 0.2
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
