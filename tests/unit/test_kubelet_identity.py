"""Who may claim to be the kubelet: a mirror pod is left alone only when a node's own identity sends it, in the
webhook's code (shared.keys.is_kubelets_mirror_pod) and in the webhook configurations' matchConditions alike."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shared import keys
from webhook.admission import parse_review

REPO = Path(__file__).resolve().parents[2]


NODES = ("system:nodes", "system:authenticated")


@pytest.mark.parametrize(("annotations", "username", "groups", "left_alone"), [
    ({keys.MIRROR_POD: "x"}, "system:node:n1", NODES, True),
    ({keys.MIRROR_POD: "x"}, "system:node:n1", ("system:authenticated",), False),  # named like a node, not one
    ({keys.MIRROR_POD: "x"}, "system:serviceaccount:team-a:tenant", NODES, False),
    ({keys.MIRROR_POD: "x"}, "", NODES, False),
    ({keys.MIRROR_POD: "x"}, "system:nodes", NODES, False),  # the nodes' group name is not a node's user name
    ({}, "system:node:n1", NODES, False),  # a node's pod without the annotation is an ordinary pod
    ("not a map", "system:node:n1", NODES, False),
])
def test_only_a_nodes_own_identity_makes_a_mirror_pod(annotations: object, username: str, groups: tuple[str, ...],
                                                       left_alone: bool) -> None:
    assert keys.is_kubelets_mirror_pod(annotations, username, groups) is left_alone


def test_the_review_carries_who_sent_it() -> None:
    def body(user: object) -> bytes:
        return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "operation": "CREATE", "namespace": "ns", "object": {"metadata": {"name": "p"}},
            "userInfo": user}}).encode()
    review = parse_review(body({"username": "system:node:n1", "groups": ["system:nodes", 5, "system:authenticated"]}))
    assert (review.username, review.groups) == ("system:node:n1", ("system:nodes", "system:authenticated"))
    for odd in (None, "system:node:n1", {"username": 7, "groups": "system:nodes"}, {"username": ["system:node:n1"]}):
        assert (parse_review(body(odd)).username, parse_review(body(odd)).groups) == ("", ())


def test_every_webhook_that_steps_aside_for_mirror_pods_asks_who_sent_them() -> None:
    """The matchConditions' CEL: the annotation alone never skips a webhook; only with a node's user name."""
    stepping_aside = []
    for doc in yaml.safe_load_all((REPO / "deploy/webhook-configurations.yaml").read_text()):
        for hook in doc["webhooks"]:
            for condition in hook.get("matchConditions") or ():
                if keys.MIRROR_POD in condition["expression"]:
                    stepping_aside.append(hook["name"])
                    assert f"request.userInfo.username.startsWith('{keys.NODE_USER_PREFIX}')" in \
                        condition["expression"], (hook["name"], condition)
                    assert f"('{keys.NODE_GROUP}' in request.userInfo.groups)" in condition["expression"], condition
    assert sorted(stepping_aside) == ["pod-locks.validate.reservoir.sh", "pods.mutate.reservoir.sh"]


def test_the_critical_priority_policy_guards_the_placeholders_priority() -> None:
    """deploy/critical-priority-policy.yaml: a pod at or above the placeholder's priority (deploy/priorityclass.yaml)
    is refused outside kube-system, Reservoir's namespace and the namespaces labelled CRITICAL_PRIORITY_LABEL=allowed;
    the message names the label (its CEL runs on the local control plane: tests/e2e/test_hostile_tenant.py)."""
    placeholder = yaml.safe_load((REPO / "deploy/priorityclass.yaml").read_text())
    policy, binding = yaml.safe_load_all((REPO / "deploy/critical-priority-policy.yaml").read_text())
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == keys.CRITICAL_PRIORITY_POLICY
    assert binding["metadata"]["name"] == keys.CRITICAL_PRIORITY_POLICY
    (validation,) = policy["spec"]["validations"]
    assert validation["expression"] == f"!has(object.spec.priority) || object.spec.priority < {placeholder['value']}"
    assert f"{keys.CRITICAL_PRIORITY_LABEL}=allowed" in validation["messageExpression"]
    assert policy["spec"]["failurePolicy"] == "Fail" and binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", keys.NAMESPACE]},
        {"key": keys.CRITICAL_PRIORITY_LABEL, "operator": "NotIn", "values": ["allowed"]}]
