"""Label selectors and Reservation owner matching (shared.matching): the semantics on well-formed input, and
totality on anything else: a malformed selector, requirement or owner matches nothing and never raises (issue 10: a
Reservation owner the matcher cannot read made every pod mutation answer 500)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.matching import expression_holds, label_selector_matches, owner_matches, reservation_matches

LABELS = {"app": "train", "tier": "gpu", "size": "8"}


def pod(labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "uid": "u1", "labels": dict(LABELS if labels is None else labels), **meta}}


@pytest.mark.parametrize(("selector", "matches"), [
    ({}, True),
    ({"matchLabels": {"app": "train"}}, True),
    ({"matchLabels": {"app": "serve"}}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]}, False),
    ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
    ({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, True),
    ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, False),
    ({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}, False),  # only in node terms
])
def test_label_selector_semantics(selector: dict[str, Any], matches: bool) -> None:
    assert label_selector_matches(selector, LABELS) is matches


def test_none_matches_nothing() -> None:
    assert label_selector_matches(None, LABELS) is False


def test_numeric_operators_in_node_terms() -> None:
    assert expression_holds({"key": "size", "operator": "Gt", "values": ["4"]}, LABELS, numeric=True)
    assert not expression_holds({"key": "size", "operator": "Lt", "values": ["4"]}, LABELS, numeric=True)
    assert not expression_holds({"key": "app", "operator": "Gt", "values": ["4"]}, LABELS, numeric=True)
    assert not expression_holds({"key": "size", "operator": "Gt", "values": ["9" * 5000]}, LABELS, numeric=True)


@pytest.mark.parametrize("selector", [
    "app=train", ["app"], 5,
    {"matchLabels": ["app", "train"]},
    {"matchLabels": {"app": ["train"]}},
    {"matchExpressions": "app"},
    {"matchExpressions": {"key": "app", "operator": "Exists"}},
    {"matchExpressions": ["app"]},
    {"matchExpressions": [{"key": ["app"], "operator": "Exists"}]},
    {"matchExpressions": [{"key": {"a": 1}, "operator": "In", "values": ["x"]}]},
    {"matchExpressions": [{"key": "app", "operator": "In", "values": "train"}]},  # a string is not a list
    {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": "serve"}]},
    {"matchExpressions": [{"key": "app", "operator": "In", "values": [["train"]]}]},
    {"matchExpressions": [{"key": "app", "operator": "In", "values": {"train": 1}}]},
    {"matchExpressions": [{"key": "app", "operator": "Sideways", "values": ["train"]}]},
    {"matchExpressions": [{"key": "app", "operator": ["Exists"]}]},
])
def test_a_malformed_selector_matches_nothing(selector: Any) -> None:
    assert label_selector_matches(selector, LABELS) is False


@pytest.mark.parametrize("owner", [
    "train", 5, None, ["object"],
    {},
    {"object": ["p"]},
    {"object": "p"},
    {"object": {"name": ["p"]}},
    {"controller": "job"},
    {"controller": [{"name": "j"}]},
    {"labelSelector": "app=train"},
    {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": "train"}]}},
    {"labelSelector": {"matchLabels": {"app": "train"}}, "object": {"kind": ["Pod"], "name": "p"}},
])
def test_a_malformed_owner_matches_nothing(owner: Any) -> None:
    assert owner_matches(owner, pod(), "ns") is False
    assert reservation_matches([owner], pod(), "ns") is False


def test_well_formed_owners_match_as_before() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "ju", "controller": True}
    assert owner_matches({"object": {"name": "p", "namespace": "ns"}}, pod(), "ns")
    assert not owner_matches({"object": {"name": "p", "namespace": "other"}}, pod(), "ns")
    assert owner_matches({"controller": {"name": "j", "kind": "Job", "namespace": "ns"}}, pod(ownerReferences=[job]),
                         "ns")
    # issue 18: a controller entry not confined to a namespace matches nothing (a forged ownerReference)
    assert not owner_matches({"controller": {"name": "j", "kind": "Job"}}, pod(ownerReferences=[job]), "ns")
    assert owner_matches({"labelSelector": {"matchLabels": {"app": "train"}}}, pod(), "ns")
    assert reservation_matches([{"labelSelector": "bad"}, {"labelSelector": {"matchLabels": {"app": "train"}}}],
                               pod(), "ns"), "one malformed owner does not hide a good one"


@pytest.mark.parametrize("selector", [{}, {"matchLabels": {}}, {"matchLabels": {}, "matchExpressions": []}])
def test_an_empty_owner_selector_matches_no_pod(selector: dict[str, Any]) -> None:
    """metav1 reads an empty selector as every pod; as an owner it would hand the Reservation to every pod of the
    cluster, in every namespace (review finding M3), so it matches none, with or without other fields."""
    assert label_selector_matches(selector, LABELS), "as a plain selector it still matches everything"
    assert not owner_matches({"labelSelector": selector}, pod(), "ns")
    assert not owner_matches({"object": {"namespace": "ns"}, "labelSelector": selector}, pod(), "ns")


@pytest.mark.parametrize("target", [
    "pod", [], {"metadata": "p"}, {"metadata": {"labels": ["a"]}}, {"metadata": {"ownerReferences": "j"}},
    {"metadata": {"ownerReferences": ["j", {"controller": True, "name": "j"}]}},
])
def test_a_malformed_pod_matches_without_raising(target: Any) -> None:
    """None of these owners matches these pods, nor would it a readable one: an empty selector, a controller
    confined to no namespace, an object named by its name alone."""
    for owner in ({"labelSelector": {}}, {"controller": {"name": "j"}}, {"object": {"name": "p"}}):
        assert owner_matches(owner, target, "ns") is False


@pytest.mark.parametrize("owners", [None, "owners", 5, {"labelSelector": {}}])
def test_owners_that_are_not_a_list_match_nothing(owners: Any) -> None:
    assert reservation_matches(owners, pod(), "ns") is False


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "app", "train", "key", "values"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["object", "controller", "labelSelector", "matchLabels", "matchExpressions", "key",
                         "operator", "values", "name", "uid", "kind", "namespace", "apiVersion", "app"]) | st.text(
            max_size=4), inner, max_size=5),
    max_leaves=25)


# --- the reference the property below compares with: the rules of shared.matching's docstrings, from JSON ---

REF_FIELDS = ("name", "namespace", "uid", "kind", "apiVersion")


def strings_or_absent(ref: dict[str, Any], fields: tuple[str, ...]) -> bool:
    return all(ref.get(f) is None or isinstance(ref.get(f), str) for f in fields)


def want_requirement(expression: Any, labels: dict[str, str], numeric: bool) -> bool:
    """In / NotIn (an absent label is not in) / Exists / DoesNotExist, and with `numeric` Gt / Lt between integers of
    at most 20 characters; the key a string (absent: "", which no label has), the values a list of strings (absent:
    none), else it holds for no label set."""
    if not isinstance(expression, dict):
        return False
    key, operator, values = expression.get("key", ""), expression.get("operator"), expression.get("values")
    values = [] if values is None else values
    if not isinstance(key, str) or not isinstance(values, list) or any(not isinstance(v, str) for v in values):
        return False
    present = key in labels
    if operator in ("In", "NotIn"):
        return (present and labels[key] in values) is (operator == "In")
    if operator in ("Exists", "DoesNotExist"):
        return present is (operator == "Exists")
    if not (numeric and operator in ("Gt", "Lt") and present and values):
        return False
    texts = (labels[key], values[0])
    if any(len(t) > 20 for t in texts):
        return False
    try:
        have, bound = (int(t) for t in texts)
    except ValueError:
        return False
    return have > bound if operator == "Gt" else have < bound


def want_selector(selector: Any, labels: dict[str, str]) -> bool:
    """Every matchLabels pair (string to string) and every matchExpression holds; absent parts hold; wrong ones
    don't."""
    if not isinstance(selector, dict):
        return False
    pairs = selector.get("matchLabels")
    pairs = {} if pairs is None else pairs  # absent holds; a falsy non-map (False, 0, "") is as wrong as any other
    expressions = selector.get("matchExpressions")
    expressions = [] if expressions is None else expressions
    if not isinstance(pairs, dict) or not isinstance(expressions, list):
        return False
    return (all(isinstance(v, str) and labels.get(k) == v for k, v in pairs.items())
            and all(want_requirement(e, labels, numeric=False) for e in expressions))


def want_owner(owner: Any, target: dict[str, Any], namespace: str) -> bool:
    """Each part the owner sets (object, controller, labelSelector) matches the pod; an owner setting none matches
    nothing. An object reference agrees with the pod's name, namespace and uid where it sets them, and sets the
    namespace or the uid unless the entry's controller part confines it; a controller reference is confined to the
    pod's namespace (its own, else the object's) and agrees with one ownerReference; an empty labelSelector matches
    nothing."""
    if not isinstance(owner, dict):
        return False
    meta = target.get("metadata") or {}
    parts = {k: v for k, v in owner.items() if k in ("object", "controller", "labelSelector") and v is not None}
    if not parts:
        return False
    confined = [r["namespace"] for r in (owner.get("controller"), owner.get("object")) if isinstance(r, dict)
                and isinstance(r.get("namespace"), str) and r["namespace"]]
    if "object" in parts:
        ref = parts["object"]
        if not isinstance(ref, dict) or not strings_or_absent(ref, REF_FIELDS):
            return False
        actual = {"name": meta.get("name"), "namespace": namespace, "uid": meta.get("uid")}
        named = [f for f in actual if ref.get(f)]
        if not ("namespace" in named or "uid" in named or ("controller" in parts and confined)):
            return False
        if any(ref[f] != actual[f] for f in named):
            return False
    if "controller" in parts:
        ref = parts["controller"]
        if not isinstance(ref, dict) or not strings_or_absent(ref, REF_FIELDS):
            return False
        if not confined or confined[0] != namespace:
            return False
        flag = ref.get("controller")
        if flag is not None and not isinstance(flag, bool):
            return False
        references = meta.get("ownerReferences")
        references = references if isinstance(references, list) else []
        if not any(isinstance(r, dict) and (flag is None or bool(r.get("controller")) is flag)
                   and all(r.get(f) == ref[f] for f in ("uid", "name", "kind", "apiVersion") if ref.get(f))
                   for r in references):
            return False
    if "labelSelector" in parts:
        selector = parts["labelSelector"]
        empty = isinstance(selector, dict) and not selector.get("matchLabels") and not selector.get("matchExpressions")
        if empty or not want_selector(selector, meta.get("labels") or {}):
            return False
    return True


def test_the_reference_agrees_with_the_cases_above() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "ju", "controller": True}
    assert want_owner({"object": {"name": "p", "namespace": "ns"}}, pod(), "ns")
    assert not want_owner({"object": {"name": "p", "namespace": "other"}}, pod(), "ns")
    assert want_owner({"controller": {"name": "j", "kind": "Job", "namespace": "ns"}}, pod(ownerReferences=[job]), "ns")
    assert not want_owner({"controller": {"name": "j", "kind": "Job"}}, pod(ownerReferences=[job]), "ns")
    assert want_owner({"labelSelector": {"matchLabels": {"app": "train"}}}, pod(), "ns")
    assert not want_owner({"labelSelector": {}}, pod(), "ns")
    assert want_selector({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]}, LABELS)
    assert not want_selector({"matchExpressions": [{"key": "app", "operator": "In", "values": "train"}]}, LABELS)
    assert want_requirement({"key": "size", "operator": "Gt", "values": ["4"]}, LABELS, numeric=True)
    assert not want_requirement({"key": "size", "operator": "Gt", "values": ["4"]}, LABELS, numeric=False)


# owners, selectors, requirements and references of the right shape over the pod's own words, so that many match
_requirement = st.fixed_dictionaries(
    {"key": st.sampled_from(["app", "tier", "size", "zone"]),
     "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"])},
    optional={"values": st.lists(st.sampled_from(["train", "gpu", "serve", "4", "9"]), max_size=2)})
_selector = st.fixed_dictionaries({}, optional={
    "matchLabels": st.dictionaries(st.sampled_from(["app", "tier"]), st.sampled_from(["train", "gpu"]), max_size=2),
    "matchExpressions": st.lists(_requirement, max_size=2)})
_reference = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["p", "j"]), "namespace": st.sampled_from(["ns", "other"]), "uid": st.just("u1"),
    "kind": st.sampled_from(["Job", "Pod"]), "controller": st.booleans()})
_owner = (st.fixed_dictionaries({"object": _reference}) | st.fixed_dictionaries({"labelSelector": _selector})
          | st.fixed_dictionaries({}, optional={"object": _reference, "controller": _reference,
                                                "labelSelector": _selector}))
_shaped = st.one_of(_owner, _selector, _requirement, _reference)


@settings(max_examples=500)
@given(_shaped | _json, _shaped | _json)
def test_matching_is_total_over_arbitrary_json_and_agrees_with_the_reference(owner: Any, selector: Any) -> None:
    assert owner_matches(owner, pod(), "ns") is want_owner(owner, pod(), "ns")
    assert reservation_matches([owner, selector], pod(), "ns") is (want_owner(owner, pod(), "ns")
                                                                    or want_owner(selector, pod(), "ns"))
    assert label_selector_matches(selector, LABELS) is want_selector(selector, LABELS)
    assert expression_holds(selector, LABELS, numeric=True) is want_requirement(selector, LABELS, numeric=True)
    assert owner_matches({"labelSelector": selector}, pod(), "ns") is want_owner({"labelSelector": selector}, pod(),
                                                                                  "ns")
    assert owner_matches({"controller": selector}, pod(ownerReferences=[selector]), "ns") is want_owner(
        {"controller": selector}, pod(ownerReferences=[selector]), "ns")
