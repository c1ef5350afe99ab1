"""The one kube-scheduler predicate (shared.predicates.schedulable_on): nodeName, nodeSelector, required node affinity
with kube's semantics (component-helpers nodeaffinity: terms ORed, an empty or unparsable term matches no node,
matchFields on metadata.name), taints against tolerations, the node's `pods` capacity; total and bounded over
hostile input."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import keys
from shared.predicates import (
    MAX_REQUIREMENTS,
    MAX_TOLERATIONS,
    NO_NODE,
    Placement,
    node_selector,
    required_node_affinity,
    schedulable_on,
)
from shared.tolerations import lock_toleration
from shared.views import NodeView, PodView

OWNER = "job-ns-Pod-big-0a1b2c"


def node(name: str = "n1", labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         pods: str | None = "110") -> NodeView:
    status = {"allocatable": {"cpu": "4", **({"pods": pods} if pods is not None else {})}}
    return NodeView.from_obj({"metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []},
                              "status": status})


def required(*terms: Any) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expression["values"] = list(values)
    return expression


def allows(spec: dict[str, Any], target: NodeView, *, pods_on_node: int = 0, ignore_lock: bool = False) -> bool:
    """What kube-scheduler says of a pod with `spec` on `target`, through the pod view, as the planner asks it."""
    pod = PodView.from_obj({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    return schedulable_on(pod.placement, target, pods_on_node=pods_on_node, ignore_lock=ignore_lock)


@pytest.mark.parametrize(("expression", "allowed"), [
    (expr("pool", "In", "gpu", "cpu"), True),
    (expr("pool", "In", "cpu"), False),
    (expr("missing", "In", "gpu"), False),
    (expr("pool", "NotIn", "cpu"), True),
    (expr("pool", "NotIn", "gpu"), False),
    (expr("missing", "NotIn", "gpu"), True),
    (expr("pool", "Exists"), True),
    (expr("missing", "Exists"), False),
    (expr("pool", "DoesNotExist"), False),
    (expr("missing", "DoesNotExist"), True),
    (expr("gpus", "Gt", "4"), True),
    (expr("gpus", "Gt", "8"), False),
    (expr("gpus", "Lt", "9"), True),
    (expr("gpus", "Lt", "8"), False),
    (expr("gpus", "Gt", "+4"), True),  # Go's ParseInt takes a sign
    (expr("pool", "Gt", "1"), False),
    (expr("missing", "Lt", "1"), False),
    (expr("underscored", "Gt", "1"), False),  # "1_0": Python's int() reads it, Go's ParseInt does not
    # requirements kube does not parse make their term match no node
    (expr("gpus", "Gt", "many"), False),
    (expr("gpus", "Gt", "4", "5"), False),
    (expr("gpus", "Gt", "99999999999999999999"), False),  # beyond int64
    (expr("pool", "In"), False),
    (expr("missing", "NotIn"), False),  # NotIn without values: an error in kube, not "every node"
    (expr("pool", "Exists", "gpu"), False),
    (expr("missing", "DoesNotExist", "x"), False),
    (expr("pool", "Like", "gpu"), False),
])
def test_required_node_affinity_operators_as_kube_parses_them(expression: dict[str, Any], allowed: bool) -> None:
    gpu = node(labels={"pool": "gpu", "gpus": "8", "underscored": "1_0"})
    assert allows(required({"matchExpressions": [expression]}), gpu) is allowed


def test_empty_and_null_terms_match_no_node_and_terms_are_ored() -> None:
    """component-helpers nodeaffinity: "nil or empty term selects no objects"; the terms ORed. (Reservoir read an
    empty term as matching every node.)"""
    gpu = node(labels={"pool": "gpu", "zone": "a"})
    in_gpu, in_b = expr("pool", "In", "gpu"), expr("zone", "In", "b")
    assert not allows(required({}), gpu), "an empty term matches no node"
    assert not allows(required({"matchExpressions": [], "matchFields": []}), gpu)
    assert not allows(required(None), gpu)
    assert not allows(required(), gpu), "nodeSelectorTerms: [] matches no node"
    assert allows(required({}, {"matchExpressions": [in_gpu]}), gpu), "an empty term does not spoil the others"
    assert not allows(required({"matchExpressions": [in_gpu, in_b]}), gpu), "expressions of a term ANDed"
    assert allows(required({"matchExpressions": [in_b]}, {"matchExpressions": [in_gpu]}), gpu), "terms ORed"
    assert allows(required({"matchExpressions": [in_b]}, {"matchExpressions": [expr("x", "Bad")]},
                           {"matchExpressions": [in_gpu]}), gpu), "an unparsable term is skipped, the rest ORed"
    # no required affinity at all (absent, null, or only a preferred one) lets every node through
    assert allows({}, gpu) and allows({"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": None}}}, gpu)
    assert allows({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [in_b]}}]}}}, gpu)


def test_match_fields_on_metadata_name() -> None:
    """kube-scheduler's matchFields: `metadata.name`, In or NotIn with exactly one value, ANDed with the term's
    matchExpressions. (Reservoir ignored matchFields: every node matched.)"""
    one, two = node("n1", labels={"zone": "a"}), node("n2", labels={"zone": "a"})
    named = required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]})
    assert allows(named, one) and not allows(named, two)
    not_named = required({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]})
    assert not allows(not_named, one) and allows(not_named, two)
    both = required({"matchExpressions": [expr("zone", "In", "b")],
                     "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]})
    assert not allows(both, one), "matchExpressions and matchFields of one term ANDed"
    # what kube refuses to parse matches no node: two values, another operator, no values
    for bad in ({"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]},
                {"key": "metadata.name", "operator": "Exists"},
                {"key": "metadata.name", "operator": "In"},
                {"key": "metadata.name", "operator": "In", "values": "n1"},
                {"key": 7, "operator": "In", "values": ["n1"]}, "metadata.name", None):
        assert not allows(required({"matchFields": [bad]}), one), bad
    # another field: the node has none, so In never holds and NotIn always does (fields.Set.Get returns "")
    assert not allows(required({"matchFields": [{"key": "spec.unschedulable", "operator": "In",
                                                 "values": ["false"]}]}), one)
    assert allows(required({"matchFields": [{"key": "spec.unschedulable", "operator": "NotIn",
                                             "values": ["false"]}]}), one)


def test_node_name_selector_taints_and_pods_capacity() -> None:
    tainted = node(labels={"zone": "a"}, taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                                                 {"key": "drain", "value": "", "effect": "NoExecute"},
                                                 {"key": "soft", "value": "", "effect": "PreferNoSchedule"}])
    tolerant = {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"},
                                {"key": "drain", "operator": "Exists", "effect": "NoExecute"}]}
    assert allows(tolerant, tainted), "PreferNoSchedule does not block"
    assert not allows({"tolerations": tolerant["tolerations"][:1]}, tainted), "NoExecute blocks too"
    assert not allows({**tolerant, "nodeSelector": {"zone": "b"}}, tainted)
    assert allows({**tolerant, "nodeSelector": {"zone": "a"}}, tainted)
    # Reservoir's lock: skipped only when the planner is choosing who holds it
    locked = node(taints=[{"key": keys.LOCK, "value": OWNER, "effect": keys.LOCK_EFFECT}])
    assert not allows({}, locked) and allows({}, locked, ignore_lock=True)
    assert allows({"tolerations": [lock_toleration(OWNER)]}, locked)
    # pods: allocatable pods above the pods on the node; a node reporting none takes none (NodeResourcesFit)
    assert allows({}, node(pods="3"), pods_on_node=2) and not allows({}, node(pods="3"), pods_on_node=3)
    assert not allows({}, node(pods=None))
    # nodeName (a Reservation's template)
    assert schedulable_on(Placement.of(node_name="n1"), node("n1"), pods_on_node=0)
    assert not schedulable_on(Placement.of(node_name="n1"), node("n2"), pods_on_node=0)


def test_a_gated_pod_view_says_so() -> None:
    gated = PodView.from_obj({"metadata": {"name": "p", "namespace": "ns"},
                              "spec": {"schedulingGates": [{"name": "example.com/quota"}]}})
    assert gated.gated
    assert not PodView.from_obj({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"schedulingGates": []}}).gated


def test_hostile_placements_are_bounded_and_match_no_node() -> None:
    """A tenant's pod may carry any affinity and tolerations: over the bounds it matches no node (never placeable,
    never given a lock), and reading it stays cheap."""
    many = [{"matchExpressions": [expr("zone", "In", "a")]} for _ in range(MAX_REQUIREMENTS + 1)]
    assert required_node_affinity(required(*many)) is NO_NODE
    assert not allows(required(*many), node(labels={"zone": "a"}))
    within = many[:MAX_REQUIREMENTS]
    assert allows(required(*within), node(labels={"zone": "a"}))
    tolerations = [{"key": f"k{i}", "operator": "Exists"} for i in range(MAX_TOLERATIONS + 1)]
    assert not allows({"tolerations": tolerations}, node())
    # a huge In list is one requirement, read as a set: cheap per node. The cost is counted as the comparisons the
    # node's label takes part in (a scan of the list would be 100,000 per evaluation), never timed here
    # (`python -m bench.unit_speed` times it)
    names = [f"node-{i}" for i in range(100_000)]
    spec = required({"matchExpressions": [expr("kubernetes.io/hostname", "In", *names)]})
    pod = PodView.from_obj({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    compared: list[str] = []

    class Counted(str):
        def __eq__(self, other: object) -> bool:
            compared.append("eq")
            return str.__eq__(self, other)

        def __hash__(self) -> int:
            compared.append("hash")
            return str.__hash__(self)

    target = node(labels={"kubernetes.io/hostname": Counted("node-99999")})
    assert all(schedulable_on(pod.placement, target, pods_on_node=0) for _ in range(5000))
    assert 0 < len(compared) <= 2 * 5000, "one hash and at most one comparison per evaluation"
    assert not schedulable_on(pod.placement, node(labels={"kubernetes.io/hostname": "node-100000"}), pods_on_node=0)
    # wrong shapes anywhere: no error, no node
    for affinity in ("x", {"nodeAffinity": "x"}, {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                                   "x"}},
                     {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}},
                     {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                         {"matchExpressions": "x"}]}}}):
        assert required_node_affinity({"affinity": affinity}) == NO_NODE
        assert not schedulable_on(Placement.of(affinity=required_node_affinity({"affinity": affinity})), node(),
                                  pods_on_node=0)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["nodeSelectorTerms", "matchExpressions", "matchFields", "key", "operator",
                                         "values", "x"]), inner, max_size=4), max_leaves=30)
VALUES = {"In": (1, 2), "NotIn": (1, 2), "Exists": (0, 0), "DoesNotExist": (0, 0), "Gt": (1, 1), "Lt": (1, 1)}


@st.composite
def requirement(draw: st.DrawFn, on_field: bool = False) -> dict[str, Any]:
    """A requirement of kube's shape over the target's labels (or its name), so that most parse and many hold; one in
    ten is one kube refuses (an unknown operator, the wrong number of values for its operator)."""
    if on_field:
        operators, keys = ["In", "NotIn"], ["metadata.name"]
    else:
        operators, keys = list(VALUES), ["key", "zone", "gpus", "absent"]
    operator = draw(st.sampled_from(operators))
    low, high = (1, 1) if on_field else VALUES[operator]
    if draw(st.integers(0, 9)) == 0:
        operator, low, high = draw(st.sampled_from([operator, "Bogus"])), 0, 2
    words = ["3", "4", "+5", "-1", "1_0", "x"] if operator in ("Gt", "Lt") else ["x", "a", "b", "4", "n1", "n2"]
    values = draw(st.lists(st.sampled_from(words), min_size=low, max_size=high))
    raw = {"key": draw(st.sampled_from([*keys, "x"])), "operator": operator}
    return {**raw, "values": values} if values or draw(st.booleans()) else raw


TERM = st.fixed_dictionaries({}, optional={"matchExpressions": st.lists(requirement(), min_size=1, max_size=2),
                                           "matchFields": st.lists(requirement(on_field=True), max_size=1)})
# a term is any JSON one time in four (one_of picks among its branches alike)
SELECTOR = st.fixed_dictionaries({"nodeSelectorTerms": st.lists(st.one_of(TERM, TERM, TERM, JSON), max_size=3)})


def go_int64(text: str) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64): an optional sign and ASCII digits, within int64; None where it errs."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def kube_requirement(raw: Any, labels: dict[str, str], name: str, *, on_field: bool) -> bool | None:
    """One nodeSelectorRequirement as kube reads it (labels.NewRequirement / the metadata.name field selector), on
    the node: whether it holds, None when kube refuses it. Written from kube's rules, not from shared.predicates."""
    if not isinstance(raw, dict):
        return None
    key, operator, values = raw.get("key"), raw.get("operator"), raw.get("values")
    values = [] if values is None else values
    if not isinstance(key, str) or not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return None
    if on_field:
        if operator not in ("In", "NotIn") or len(values) != 1:
            return None
        return ((name if key == "metadata.name" else "") == values[0]) is (operator == "In")
    have = labels.get(key)
    if operator in ("In", "NotIn"):
        return None if not values else (have is not None and have in values) is (operator == "In")
    if operator in ("Exists", "DoesNotExist"):
        return None if values else (key in labels) is (operator == "Exists")
    if operator in ("Gt", "Lt") and len(values) == 1 and (bound := go_int64(values[0])) is not None:
        number = go_int64(have) if have is not None else None
        return number is not None and (number > bound if operator == "Gt" else number < bound)
    return None


def kube_selects(raw: Any, labels: dict[str, str], name: str) -> bool:
    """component-helpers nodeaffinity over a raw v1.NodeSelector: absent (null) lets every node through; terms ORed;
    a term matches when it has a requirement, kube parses all of them and every one holds; any other shape matches no
    node (shared.predicates' totality rule)."""
    if raw is None:
        return True
    terms = raw.get("nodeSelectorTerms") if isinstance(raw, dict) else "not an object"
    terms = [] if terms is None else terms
    if not isinstance(terms, list):
        return False
    for term in terms:
        if not isinstance(term, dict):
            continue
        expressions, fields = term.get("matchExpressions"), term.get("matchFields")
        expressions, fields = [] if expressions is None else expressions, [] if fields is None else fields
        if not isinstance(expressions, list) or not isinstance(fields, list) or not (expressions or fields):
            continue
        held = [kube_requirement(e, labels, name, on_field=False) for e in expressions] + [
            kube_requirement(f, labels, name, on_field=True) for f in fields]
        if all(h is True for h in held):
            return True
    return False


def test_the_reference_reads_node_selectors_as_kube_does() -> None:
    """The reference the property below compares with, on the cases of test_required_node_affinity_semantics."""
    labels = {"pool": "gpu", "gpus": "8", "underscored": "1_0"}
    on = {"nodeSelectorTerms": [{"matchExpressions": [expr("pool", "In", "gpu")]}]}
    assert kube_selects(None, labels, "n1") and kube_selects(on, labels, "n1")
    assert not kube_selects({"nodeSelectorTerms": []}, labels, "n1")
    assert not kube_selects({"nodeSelectorTerms": [{"matchExpressions": [expr("pool", "In")]}]}, labels, "n1")
    assert kube_selects({"nodeSelectorTerms": [{"matchExpressions": [expr("gpus", "Gt", "+4")]}]}, labels, "n1")
    assert not kube_selects({"nodeSelectorTerms": [{"matchExpressions": [expr("underscored", "Gt", "1")]}]}, labels,
                            "n1")
    assert kube_selects({"nodeSelectorTerms": [{"matchFields": [expr("metadata.name", "NotIn", "n2")]}]}, labels, "n1")
    assert not kube_selects({"nodeSelectorTerms": [{"matchFields": [expr("metadata.name", "In", "n2")]}]}, labels,
                            "n1")


@settings(max_examples=300, deadline=None)
@given(SELECTOR | JSON)
def test_any_json_as_a_node_selector_compiles_and_matches_as_kube_does(raw: Any) -> None:
    labels = {"key": "x", "zone": "a", "gpus": "4"}
    compiled = node_selector(raw)
    result = schedulable_on(Placement.of(affinity=compiled), node("n1", labels=labels), pods_on_node=0)
    assert result is kube_selects(raw, labels, "n1")
