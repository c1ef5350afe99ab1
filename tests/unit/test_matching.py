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
    for owner in ({"labelSelector": {}}, {"controller": {"name": "j"}}, {"object": {"name": "p"}}):
        assert owner_matches(owner, target, "ns") in (True, False)


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


@settings(max_examples=500)
@given(_json, _json)
def test_matching_is_total_over_arbitrary_json(owner: Any, selector: Any) -> None:
    assert owner_matches(owner, pod(), "ns") in (True, False)
    assert reservation_matches([owner, selector], pod(), "ns") in (True, False)
    assert label_selector_matches(selector, LABELS) in (True, False)
    assert expression_holds(selector, LABELS, numeric=True) in (True, False)
    assert owner_matches({"labelSelector": selector}, pod(), "ns") in (True, False)
    assert owner_matches({"controller": selector}, pod(ownerReferences=[selector]), "ns") in (True, False)
