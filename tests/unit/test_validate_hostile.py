"""Validation against hostile objects (issue 10): quantities in PodGroups and Queues checked with the field, the
value and the fix; UPDATE judged only for what it changes; every validator total over odd JSON."""

from __future__ import annotations

import pytest

from shared import keys
from tests.builders import YAML_ALIAS_BOMB
from shared.resources import Resources
from webhook import admission
from webhook.validate import (
    judge_update,
    validate_configmap,
    validate_pod,
    validate_podgroup,
    validate_queue,
    validate_reservation,
)

TEMPLATE = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}


def podgroup(min_resources: object) -> dict:
    return {"metadata": {"name": "g", "namespace": "n"}, "spec": {"minMember": 2, "minResources": min_resources}}


def queue(spec: dict, name: str = "q1") -> dict:
    return {"metadata": {"name": name, "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}}, "spec": spec}


# --- PodGroup spec.minResources ---

@pytest.mark.parametrize(("quantities", "message"), [
    ({"cpu": "banana"}, "PodGroup n/g: spec.minResources: quantity 'banana' is not valid: expected a number with an "
                        "optional suffix"),
    ({"cpu": "banana"}, "(at spec.minResources.cpu)"),
    ({"cpu": "1e1.5"}, "quantity '1e1.5' is not valid"),
    ({"memory": "1e999999999"}, "(at spec.minResources.memory)"),
    ({"memory": "9" * 5000}, "spec.minResources: quantity"),
    ({"cpu": 1.5}, "(at spec.minResources.cpu)"),
    ({"cpu": ["1"]}, "(at spec.minResources.cpu)"),
    ({"gpu": "1"}, "spec.minResources: unknown resource name 'gpu': expected cpu, memory, ephemeral-storage, pods, "
                   "hugepages-<size> or a prefixed name such as nvidia.com/gpu"),
    ({"cpu": "-1"}, "spec.minResources.cpu is negative: expected a quantity >= 0"),
    (["cpu", "1"], "spec.minResources must be a mapping of resource names to quantities such as"),
    ("4", "spec.minResources must be a mapping"),
])
def test_podgroup_min_resources_denied_naming_field_value_and_fix(quantities: object, message: str) -> None:
    verdict = validate_podgroup(podgroup(quantities))
    assert not verdict.allowed
    assert message in verdict.message


def test_podgroup_min_resources_accepted() -> None:
    assert validate_podgroup(podgroup({"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": 4, "pods": "8"})).allowed
    assert validate_podgroup({"metadata": {"name": "g"}, "spec": {"minMember": 1}}).allowed


def test_a_long_resource_name_is_quoted_short() -> None:
    verdict = validate_podgroup(podgroup({"x" * 100_000: "1"}))
    assert not verdict.allowed and len(verdict.message) < 500


# --- Queue spec.capability and spec.deserved ---

@pytest.mark.parametrize(("spec", "message"), [
    ({"capability": {"cpu": "lots"}}, "spec.capability: quantity 'lots' is not valid"),
    ({"capability": {"cpu": "lots"}}, "(at spec.capability.cpu)"),
    ({"deserved": {"memory": "1e1.5"}}, "spec.deserved: quantity '1e1.5' is not valid"),
    ({"deserved": {"memory": "1e1.5"}}, "(at spec.deserved.memory)"),
    ({"deserved": {"cpu": "1e99"}}, "(at spec.deserved.cpu)"),
    ({"deserved": {"gpu": "1"}}, "spec.deserved: unknown resource name 'gpu'"),
    ({"deserved": {"cpu": "-2"}}, "spec.deserved.cpu is negative"),
    ({"deserved": [1]}, "spec.deserved must be a mapping of resource names to quantities"),
    ({"capability": {"x" * 400 + "/gpu": "1"}}, "unknown resource name"),
])
def test_queue_capability_and_deserved_checked_as_quantities(spec: dict, message: str) -> None:
    verdict = validate_queue(queue(spec))
    assert not verdict.allowed and message in verdict.message and "Queue q1" in verdict.message


def test_queue_deserved_accepted() -> None:
    assert validate_queue(queue({"deserved": {"cpu": "32", "memory": "128Gi"}, "capability": {"cpu": 64}})).allowed


# --- UPDATE: only what the update changes ---

def _update(check, new: dict, old: dict):
    verdict = check(new, old)
    return judge_update(verdict, check(old, None)) if not verdict.allowed else verdict


def test_pod_admitted_with_bad_annotations_can_have_its_finalizers_removed() -> None:
    old = {"metadata": {"name": "p", "namespace": "ns", "finalizers": ["example.com/keep"],
                        "annotations": {keys.MAXIMUM_RUNTIME: "forever", keys.RESERVEABLE: "yes"}}, "spec": {}}
    new = {"metadata": {**old["metadata"], "finalizers": []}, "spec": {}}
    check = lambda obj, _old: validate_pod(obj)  # noqa: E731
    assert not validate_pod(new).allowed, "on CREATE it is refused"
    verdict = _update(check, new, old)
    assert verdict.allowed
    assert any("this update does not change it" in w and "maximum-runtime" in w for w in verdict.warnings)


def test_pod_update_that_changes_a_bad_annotation_to_another_bad_one_is_refused() -> None:
    old = {"metadata": {"name": "p", "annotations": {keys.MAXIMUM_RUNTIME: "forever"}}, "spec": {}}
    new = {"metadata": {"name": "p", "annotations": {keys.MAXIMUM_RUNTIME: "for ever"}}, "spec": {}}
    verdict = _update(lambda obj, _old: validate_pod(obj), new, old)
    assert not verdict.allowed and "'for ever'" in verdict.message and "'forever'" not in verdict.message


def test_pod_update_that_adds_a_new_problem_is_refused_for_it_only() -> None:
    old = {"metadata": {"name": "p", "annotations": {keys.MAXIMUM_RUNTIME: "forever"}}, "spec": {}}
    new = {"metadata": {"name": "p", "annotations": {keys.MAXIMUM_RUNTIME: "forever", keys.RESERVEABLE: "yes"}},
           "spec": {}}
    verdict = _update(lambda obj, _old: validate_pod(obj), new, old)
    assert not verdict.allowed and "reserveable" in verdict.message and "maximum-runtime" not in verdict.message
    assert any("maximum-runtime" in w for w in verdict.warnings)


CLUSTER = Resources.parse({"cpu": "4", "memory": "16Gi"})


def _queue_update(new_spec: dict, old_spec: dict):
    return _update(lambda obj, old: validate_queue(obj, CLUSTER, old), queue(new_spec), queue(old_spec))


def test_queue_whose_guarantee_no_longer_fits_a_shrunken_cluster_can_still_be_edited() -> None:
    guarantee = {"policy": "Guaranteed", "resource": {"cpu": "8"}}
    assert not validate_queue(queue({"guarantee": guarantee}), CLUSTER).allowed, "on CREATE it is refused"
    # an edit that leaves the guarantee alone
    verdict = _queue_update({"weight": 3, "guarantee": guarantee}, {"weight": 1, "guarantee": guarantee})
    assert verdict.allowed
    assert verdict.warnings == ["Queue q1: spec.guarantee.resource.cpu (8) is more than the cluster's schedulable "
                                "nodes hold (4): kept as it was (this update does not raise it), but it cannot be met "
                                "until it is lowered or nodes are added"]
    # an edit that lowers it, still above the cluster
    assert _queue_update({"guarantee": {"resource": {"cpu": "6"}}}, {"guarantee": guarantee}).allowed
    # an edit that lowers it in one dimension and keeps the other
    assert _queue_update({"guarantee": {"resource": {"cpu": "6", "memory": "32Gi"}}},
                         {"guarantee": {"resource": {"cpu": "8", "memory": "32Gi"}}}).allowed


def test_queue_update_that_raises_the_guarantee_past_the_cluster_is_refused() -> None:
    verdict = _queue_update({"guarantee": {"resource": {"cpu": "10"}}}, {"guarantee": {"resource": {"cpu": "8"}}})
    assert not verdict.allowed and "spec.guarantee.resource.cpu (10) is more than the cluster's schedulable nodes " \
        "hold (4)" in verdict.message
    verdict = _queue_update({"guarantee": {"resource": {"cpu": "8"}}}, {"guarantee": {"resource": {"cpu": "2"}}})
    assert not verdict.allowed
    verdict = _queue_update({"guarantee": {"resource": {"cpu": "8"}}}, {"weight": 1})
    assert not verdict.allowed, "a guarantee added by the update is judged whole"


def test_queue_update_still_checks_what_it_changes_within_the_object() -> None:
    guarantee = {"resource": {"cpu": "8"}}
    verdict = _queue_update({"guarantee": {"resource": {"cpu": "8"}, "policy": "Always"}}, {"guarantee": guarantee})
    assert not verdict.allowed and "spec.guarantee.policy is 'Always'" in verdict.message
    assert "more than the cluster" not in verdict.message


# --- Reservations: odd types denied with the field ---

@pytest.mark.parametrize(("spec", "message"), [
    ({"owners": [{"object": 1}], "template": TEMPLATE}, "spec.owners[0].object is 1: expected an object"),
    ({"owners": "x", "template": TEMPLATE}, "spec.owners is empty"),
    ({"owners": [{"labelSelector": {}}], "template": TEMPLATE, "ttl": {"a": 1}},
     "spec.ttl is {'a': 1}: expected a Go duration string"),
    ({"owners": [{"labelSelector": {}}], "template": TEMPLATE, "ttl": "999999999999h"}, "spec.ttl: duration"),
    ({"owners": [{"labelSelector": {}}], "template": TEMPLATE, "expires": ["2026"]}, "spec.expires is ['2026']"),
    ({"owners": [{"labelSelector": {}}], "template": {"spec": {"containers": {"c": 1}}}},
     "spec.template.spec.containers must be a list, not an object"),
    ({"owners": [{"labelSelector": {}}], "template": {"spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "1e1.5"}}}]}}},
     'spec.template.spec.containers[0].resources.requests["cpu"]: quantity \'1e1.5\' is not valid'),
])
def test_reservation_odd_fields_denied(spec: dict, message: str) -> None:
    verdict = validate_reservation({"metadata": {"name": "r"}, "spec": spec})
    assert not verdict.allowed and message in verdict.message


# --- the ConfigMap: YAML bounds before the model ---

def _config(text: object):
    return validate_configmap({"metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.NAMESPACE},
                               "data": {keys.CONFIG_KEY: text}})


def test_config_yaml_alias_bomb_is_refused() -> None:
    verdict = _config(YAML_ALIAS_BOMB)
    assert not verdict.allowed and "once its YAML aliases are expanded" in verdict.message


@pytest.mark.parametrize(("text", "message"), [
    ("windows: " + "[" * 20_000, "nests deeper than 32 levels"),
    ("a: " + "{a: " * 5000, "nests deeper than 32 levels"),
    ("dryRun: true\n# " + "x" * 70_000, "at most 65536"),
    ("guarantee: {searchBudget: " + "9" * 5000 + "}", 'data["config.yaml"]'),
])
@pytest.mark.parametrize("loader", ["libyaml", "pure Python"])
def test_config_yaml_out_of_bounds_is_refused(text: str, message: str, loader: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Both of PyYAML's parsers are held to the same refusal: libyaml stops at its own nesting limit while it scans
    ahead, the pure-Python parser hands the walk every event."""
    import yaml

    from shared import config
    if loader == "libyaml":
        assert config._YAML_LOADER is yaml.CSafeLoader, "PyYAML was installed without libyaml"
    else:
        monkeypatch.setattr(config, "_YAML_LOADER", yaml.SafeLoader)
    verdict = _config(text)
    assert not verdict.allowed and message in verdict.message, verdict.message


def test_config_with_anchors_within_bounds_is_accepted() -> None:
    text = ("windows:\n- &w {name: a, resources: {cpu: 1}, schedule: '0 3 * * *', duration: 1h}\n"
            "- {name: b, resources: {cpu: 1}, schedule: '0 4 * * *', duration: 1h}\n")
    assert _config(text).allowed


# --- validators are total over what the shape check lets through ---

def test_validators_never_raise_on_odd_crd_fields() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
        | st.sampled_from(["1e999999", "banana", "500m", "2Gi", "999999999999h", "1h", "-1", ""]),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
            st.sampled_from(["cpu", "memory", "resource", "policy", "percentage", "value", "dimensions", "name",
                             "matchLabels", "spec", "containers", "x"]), inner, max_size=4),
        max_leaves=25)
    spec = st.dictionaries(st.sampled_from(["guarantee", "capability", "deserved", "minResources", "owners", "ttl",
                                            "expires", "template", "allocatePolicy", "queue"]), json_values,
                           max_size=5)

    @settings(max_examples=400, deadline=None)
    @given(spec, spec)
    def check(new: dict, old: dict) -> None:
        obj, before = {"metadata": {"name": "x"}, "spec": new}, {"metadata": {"name": "x"}, "spec": old}
        for verdict in (validate_queue(obj, CLUSTER, before), validate_podgroup(obj), validate_reservation(obj)):
            assert verdict.allowed or verdict.problems
            assert len(verdict.message) < 20_000

    check()


def test_shape_check_names_the_field() -> None:
    pod = {"metadata": {"name": "p", "annotations": {"a": 5}}, "spec": {}}
    assert admission.POD.check(pod, "request.object") == \
        'request.object.metadata.annotations["a"] must be a string, not a number'
    assert admission.POD.check({"spec": {"tolerations": {}}}, "o") == "o.spec.tolerations must be a list, not an object"
    assert admission.POD.check({"metadata": []}, "o") == "o.metadata must be an object, not a list"
    assert admission.POD.check({"spec": {"priority": True}}, "o") == "o.spec.priority must be an integer, not a boolean"
    assert admission.POD.check({"metadata": {"name": "n" * 300}}, "o") == \
        "o.metadata.name is 300 characters long: at most 253"
    good = {"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "1", "memory": 5}}}], "tolerations": [{"operator": "Exists"}]}}
    assert admission.POD.check(good, "o") is None
    assert admission.POD.problem({"spec": {"containers": [{"resources": {"limits": {"cpu": "x"}}}]}}, "o", deep=True) \
        .startswith('o.spec.containers[0].resources.limits["cpu"]: quantity \'x\' is not valid')


def test_a_resource_list_of_thousands_of_names_is_refused_without_reading_each() -> None:
    many = {f"example.com/r{i}": "1" for i in range(5000)}
    verdict = validate_queue(queue({"capability": many, "deserved": many, "guarantee": {"resource": many}}))
    assert not verdict.allowed and "spec.capability names 5000 resources: at most 128" in verdict.message
    assert validate_queue(queue({"capability": {f"example.com/r{i}": "1" for i in range(128)}})).allowed


# --- the names a pod's job is known by (review finding M1) ---

def named_pod(annotations: dict | None = None, refs: list | None = None) -> dict:
    meta: dict = {"name": "p", "namespace": "n", "annotations": annotations or {}}
    if refs is not None:
        meta["ownerReferences"] = refs
    return {"metadata": meta, **TEMPLATE}


@pytest.mark.parametrize("group", ["x" * 254, "Big", "a b", "a/b", "", 'x" decision=lock', 7])
def test_a_group_name_no_podgroup_can_have_is_refused(group: object) -> None:
    verdict = validate_pod(named_pod({keys.GROUP_NAME: group}))
    assert not verdict.allowed
    assert f'metadata.annotations["{keys.GROUP_NAME}"]' in verdict.message and "DNS subdomain" in verdict.message
    assert len(verdict.message) < 600, "the value is quoted short"


@pytest.mark.parametrize("name", ["x" * 254, "a b", "a/b", "tab\there", "new\nline"])
def test_a_controller_name_no_object_can_have_is_refused(name: str) -> None:
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": "u", "controller": True}
    verdict = validate_pod(named_pod(refs=[{"apiVersion": "v1", "kind": "X", "name": "fine", "uid": "v"}, ref]))
    assert not verdict.allowed and "metadata.ownerReferences[1].name" in verdict.message


def test_names_objects_can_have_are_let_in() -> None:
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f", "uid": "u", "controller": True}
    assert validate_pod(named_pod({keys.GROUP_NAME: "train.v2-" + "x" * 240}, [ref])).allowed
    # a reference that is not the controller does not name the job: only the controller's is judged
    other = {"apiVersion": "v1", "kind": "X", "name": "a b", "uid": "v"}
    assert validate_pod(named_pod(refs=[other])).allowed


def test_an_existing_bad_group_name_does_not_block_other_updates() -> None:
    old = validate_pod(named_pod({keys.GROUP_NAME: "Bad"}))
    new = validate_pod(named_pod({keys.GROUP_NAME: "Bad", "x": "y"}))
    assert judge_update(new, old).allowed
