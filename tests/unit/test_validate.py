from __future__ import annotations

import pytest

from shared import keys
from webhook.validate import validate_configmap, validate_pod, validate_podgroup, validate_queue, validate_reservation


def queue(spec: dict) -> dict:
    return {"metadata": {"name": "q1"}, "spec": spec}


@pytest.mark.parametrize(("annotations", "message"), [
    ({keys.MAXIMUM_RUNTIME: "2 hours"}, 'Pod ns/p: metadata.annotations["volcano.sh/maximum-runtime"]: duration \'2 hours\''),
    ({keys.MAXIMUM_RUNTIME: "0"}, "expected a positive duration"),
    ({keys.RESERVEABLE: "yes"}, 'is \'yes\': expected "true" or "false"'),
    ({keys.RESERVATION_AFFINITY: "{bad"}, "reservation affinity '{bad' is not valid"),
])
def test_pod_annotations_denied_with_field_and_fix(annotations: dict, message: str) -> None:
    verdict = validate_pod({"metadata": {"name": "p", "namespace": "ns", "annotations": annotations}, "spec": {}})
    assert not verdict.allowed and message in verdict.message


def test_good_pod_and_blanket_toleration_warning() -> None:
    good = {"metadata": {"name": "p", "annotations": {keys.MAXIMUM_RUNTIME: "2h30m", keys.RESERVEABLE: "true"}},
            "spec": {"tolerations": [{"operator": "Exists"}]}}
    verdict = validate_pod(good)
    assert verdict.allowed and verdict.warnings and "ignores every reservoir.sh/lock lock" in verdict.warnings[0]
    assert validate_pod({"metadata": {"name": "p"}, "spec": {"tolerations": [{"key": "a", "operator": "Exists"}]}}).warnings == []


def test_podgroup_annotations() -> None:
    assert not validate_podgroup({"metadata": {"name": "g", "namespace": "n", "annotations": {keys.MAXIMUM_RUNTIME: "x"}}}).allowed
    assert validate_podgroup({"metadata": {"name": "g", "annotations": {keys.MAXIMUM_RUNTIME: "500s"}}}).allowed


@pytest.mark.parametrize(("spec", "message"), [
    ({"guarantee": {"policy": "Sometimes", "resource": {"cpu": "1"}}}, "spec.guarantee.policy is 'Sometimes': expected Best-Effort or Guaranteed"),
    ({"guarantee": {"percentage": {"dimensions": ["cpu"], "value": 1.5}}}, "percentage.value is 1.5: expected a number in [0, 1]"),
    ({"guarantee": {"percentage": {"dimensions": ["gpus"], "value": 0.5}}}, "unknown resource name 'gpus'"),
    ({"guarantee": {"percentage": {"value": 0.5}}}, "percentage.dimensions is None"),
    ({"guarantee": {"resource": {"cpu": "lots"}}}, "spec.guarantee.resource: quantity 'lots' is not valid"),
    ({"guarantee": {"resource": {"cpu": "8"}}, "capability": {"cpu": "4"}},
     "spec.guarantee.resource.cpu (8) exceeds spec.capability.cpu (4)"),
    ({"guarantee": {"policy": "Guaranteed"}}, "needs resource and/or percentage"),
])
def test_queue_guarantee_denied(spec: dict, message: str) -> None:
    verdict = validate_queue(queue(spec))
    assert not verdict.allowed and message in verdict.message and "Queue q1" in verdict.message


def test_queue_guarantee_larger_than_the_cluster_denied() -> None:
    from shared.resources import Resources
    cluster = Resources.parse({"cpu": "12", "memory": "48Gi"})
    verdict = validate_queue(queue({"guarantee": {"resource": {"cpu": "16"}}}), cluster)
    assert not verdict.allowed and "spec.guarantee.resource.cpu (16) is more than the cluster's schedulable nodes " \
        "hold (12)" in verdict.message
    assert validate_queue(queue({"guarantee": {"resource": {"cpu": "12"}}}), cluster).allowed
    assert validate_queue(queue({"guarantee": {"resource": {"cpu": "16"}}}), Resources()).allowed, "no node known yet"


def test_queue_guarantee_accepted() -> None:
    assert validate_queue(queue({"guarantee": {"policy": "Guaranteed", "resource": {"cpu": "2", "nvidia.com/gpu": 1},
                                               "percentage": {"dimensions": ["cpu", "memory"], "value": 0.2}},
                                 "capability": {"cpu": "4"}})).allowed
    assert validate_queue(queue({})).allowed


TEMPLATE = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}


@pytest.mark.parametrize(("spec", "message"), [
    ({"owners": [], "template": TEMPLATE}, "spec.owners is empty"),
    ({"owners": [{}], "template": TEMPLATE}, "spec.owners[0] sets none of object, controller, labelSelector"),
    ({"owners": [{"labelSelector": {}}], "template": TEMPLATE, "ttl": "1 day"}, "spec.ttl: duration '1 day'"),
    ({"owners": [{"labelSelector": {}}], "template": TEMPLATE, "expires": "tomorrow"}, "spec.expires is 'tomorrow'"),
    ({"owners": [{"labelSelector": {}}], "template": {"spec": {"containers": [{"name": "c"}]}}}, "requests nothing"),
    ({"owners": [{"labelSelector": {}}]}, "spec.template.spec.containers is missing"),
])
def test_reservation_denied(spec: dict, message: str) -> None:
    verdict = validate_reservation({"metadata": {"name": "r"}, "spec": spec})
    assert not verdict.allowed and message in verdict.message


def test_reservation_accepted() -> None:
    assert validate_reservation({"metadata": {"name": "r"}, "spec": {"owners": [{"object": {"name": "p"}}],
                                                                     "template": TEMPLATE, "ttl": "0"}}).allowed


def test_configmap() -> None:
    def cm(name: str, text: str) -> dict:
        return {"metadata": {"name": name, "namespace": keys.NAMESPACE}, "data": {keys.CONFIG_KEY: text}}
    verdict = validate_configmap(cm(keys.CONFIGMAP_NAME, "maxLockedNodePercent: 150"))
    assert not verdict.allowed and "maxLockedNodePercent" in verdict.message and "150" in verdict.message
    assert validate_configmap(cm(keys.CONFIGMAP_NAME, "dryRun: true")).allowed
    assert validate_configmap(cm("other", "garbage: [")).allowed


def test_queue_lock_guarantee_opt_in_is_true_or_false_and_its_absence_is_warned() -> None:
    """Issue 11: a guarantee locks no node until the Queue opts in; the webhook says so when it is written, and
    refuses an opt-in value it cannot read (a typo would silently lock nothing)."""
    guarantee = {"guarantee": {"resource": {"cpu": "2"}}}
    verdict = validate_queue(queue(guarantee))
    assert verdict.allowed and any(keys.QUEUE_LOCK_GUARANTEE in w and "locks no node" in w for w in verdict.warnings)
    opted = {"metadata": {"name": "q1", "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}}, "spec": guarantee}
    assert validate_queue(opted).allowed and validate_queue(opted).warnings == []
    typo = {"metadata": {"name": "q1", "annotations": {keys.QUEUE_LOCK_GUARANTEE: "yes"}}, "spec": guarantee}
    verdict = validate_queue(typo)
    assert not verdict.allowed and f'metadata.annotations["{keys.QUEUE_LOCK_GUARANTEE}"] is \'yes\'' in verdict.message
