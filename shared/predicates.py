"""Where a pod (or a Reservation's template) may go, as kube-scheduler's filters judge these fields: one predicate,
`schedulable_on(placement, node, pods_on_node=..., ignore_lock=...)`, that every policy calls (starvation's node choice
and its "placeable now", a Reservation's node, the fit checks of the other policies where they judge a pod).

The fields, each as the kube-scheduler plugin that filters on it:
- `spec.nodeName` (NodeName): when set, the node's name.
- `spec.nodeSelector` (NodeAffinity): every label equal.
- required node affinity (NodeAffinity, component-helpers `nodeaffinity.GetRequiredNodeAffinity`): the terms of
  `requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms` ORed; within a term, `matchExpressions` (on the
  node's labels: In, NotIn, Exists, DoesNotExist, Gt, Lt) and `matchFields` (on the node's fields, of which there is
  one, `metadata.name`: In or NotIn with exactly one value) ANDed. A nil or empty term matches no node, and so does a
  term with a requirement kube would not parse (an unknown operator, In/NotIn without values, Exists/DoesNotExist with
  values, Gt/Lt without exactly one int64, a matchFields requirement other than In/NotIn of one value); so
  `nodeSelectorTerms: []` matches no node. No required affinity at all (absent or null) lets every node through.
- taints (TaintToleration): every NoSchedule / NoExecute taint tolerated (`shared.tolerations.tolerates_taint` is the
  per-taint rule). Reservoir's own lock taint is skipped when `ignore_lock`: the planner is choosing who holds it.
- `pods` (NodeResourcesFit): the node's allocatable `pods` (0 when the node reports none) above the pods already on
  it (`pods_on_node`). The planner's resource vectors count it too (`shared.resources.pod_requests` adds `pods: 1`),
  so the two agree.

Costs. A required node affinity is compiled once per object, when its view is built (`PodView.required_affinity`,
`ReservationView.placement`), never per plan: a plan evaluates small tuples (a frozenset per In/NotIn), no JSON; a
pod's `Placement` is a thin wrapper the planner takes once per task shape (`PodView.placement`). Compiling is total
(any JSON compiles; what kube would not parse matches no node) and bounded: a required affinity of more than
MAX_REQUIREMENTS requirements, or more than MAX_TOLERATIONS tolerations, is compiled as matching no node (kube has
no such limit; real pods carry a handful of each). A tenant's pod therefore costs at most a few hundred
comparisons per node, can never crash a plan, and an absurd one is never placeable and never given a lock.
Label key and value syntax is not checked (the API server checks a pod's; a bad key matches no node label).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared import keys
from shared.resources import PODS
from shared.tolerations import tolerates_taint

if TYPE_CHECKING:  # views import this module to compile their placements
    from shared.views import NodeView

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
MAX_REQUIREMENTS = 128  # matchExpressions + matchFields over all terms of one required node affinity
MAX_TOLERATIONS = 128
NODE_NAME_FIELD = "metadata.name"  # the one node field kube-scheduler's matchFields reads
# kube-scheduler's own name, a pod's spec.schedulerName when it names none: the only scheduler Reservoir plans for
DEFAULT_SCHEDULER = "default-scheduler"

_IN, _NOT_IN, _EXISTS, _DOES_NOT_EXIST, _GT, _LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
_INT64 = re.compile(r"[+-]?[0-9]{1,19}")


def _int64(text: str) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64), or None where it errs (no spaces, no underscores, no overflow)."""
    if not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


@dataclass(frozen=True, slots=True)
class Requirement:
    """One parsed node selector requirement. For labels: In / NotIn (`values`), Exists / DoesNotExist, Gt / Lt
    (`bound`); for fields: In / NotIn of the single value in `values`."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()
    bound: int = 0

    def holds(self, labels: Mapping[str, str]) -> bool:
        """k8s.io/apimachinery labels.Requirement.Matches."""
        operator = self.operator
        if operator == _IN:
            value = labels.get(self.key)
            return value is not None and value in self.values
        if operator == _NOT_IN:
            value = labels.get(self.key)
            return value is None or value not in self.values
        if operator == _EXISTS:
            return self.key in labels
        if operator == _DOES_NOT_EXIST:
            return self.key not in labels
        value = labels.get(self.key)  # Gt, Lt
        number = _int64(value) if value is not None else None
        if number is None:
            return False
        return number > self.bound if operator == _GT else number < self.bound

    def holds_for_field(self, name: str) -> bool:
        """k8s.io/apimachinery fields.OneTermEqualSelector / OneTermNotEqualSelector over the node's fields."""
        actual = name if self.key == NODE_NAME_FIELD else ""
        return (actual in self.values) == (self.operator == _IN)


@dataclass(frozen=True, slots=True)
class Term:
    """One nodeSelectorTerm that kube parses and that is not empty: its requirements ANDed."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, node: NodeView) -> bool:
        labels = node.labels
        for requirement in self.labels:
            if not requirement.holds(labels):
                return False
        if self.fields and node.name:  # nodeaffinity: a node without a name has no fields to test
            return all(requirement.holds_for_field(node.name) for requirement in self.fields)
        return True


@dataclass(frozen=True, slots=True)
class NodeAffinity:
    """A parsed required node affinity (a v1.NodeSelector): its usable terms, ORed; none matches no node."""

    terms: tuple[Term, ...] = ()

    def matches(self, node: NodeView) -> bool:
        return any(term.matches(node) for term in self.terms)


NO_NODE = NodeAffinity(())  # matches no node


def _list(value: Any) -> Sequence[Any] | None:
    """A JSON array, () for null; None for anything else."""
    if value is None:
        return ()
    return value if isinstance(value, (list, tuple)) else None


def _strings(values: Any) -> tuple[str, ...] | None:
    items = _list(values)
    if items is None or not all(isinstance(v, str) for v in items):
        return None
    return tuple(items)


def _label_requirement(raw: Any) -> Requirement | None:
    """labels.NewRequirement over a nodeSelectorRequirement, or None where kube errs."""
    if not isinstance(raw, Mapping):
        return None
    key, operator, values = raw.get("key"), raw.get("operator"), _strings(raw.get("values"))
    if not isinstance(key, str) or values is None:
        return None
    if operator in (_IN, _NOT_IN):
        return Requirement(key, operator, frozenset(values)) if values else None
    if operator in (_EXISTS, _DOES_NOT_EXIST):
        return None if values else Requirement(key, operator)
    if operator in (_GT, _LT) and len(values) == 1:
        bound = _int64(values[0])
        return None if bound is None else Requirement(key, operator, bound=bound)
    return None


def _field_requirement(raw: Any) -> Requirement | None:
    """nodeaffinity.nodeSelectorRequirementsAsFieldSelector over one requirement, or None where kube errs."""
    if not isinstance(raw, Mapping):
        return None
    key, operator, values = raw.get("key"), raw.get("operator"), _strings(raw.get("values"))
    if not isinstance(key, str) or values is None or operator not in (_IN, _NOT_IN) or len(values) != 1:
        return None
    return Requirement(key, operator, frozenset(values))


def _term(raw: Any) -> Term | None:
    """One nodeSelectorTerm, or None when it matches no node (empty, or a requirement kube would not parse)."""
    if not isinstance(raw, Mapping):
        return None
    expressions, fields = _list(raw.get("matchExpressions")), _list(raw.get("matchFields"))
    if expressions is None or fields is None or not (expressions or fields):
        return None
    labels = tuple(_label_requirement(e) for e in expressions)
    matched = tuple(_field_requirement(f) for f in fields)
    if any(r is None for r in labels) or any(r is None for r in matched):
        return None
    return Term(tuple(r for r in labels if r is not None), tuple(r for r in matched if r is not None))


def node_selector(required: Any) -> NodeAffinity | None:
    """A v1.NodeSelector (`requiredDuringSchedulingIgnoredDuringExecution`) parsed as kube-scheduler does; None when
    it is absent (null): no constraint. Total over any JSON: a wrong shape or more than MAX_REQUIREMENTS requirements
    matches no node (module docstring)."""
    if required is None:
        return None
    if not isinstance(required, Mapping):
        return NO_NODE
    terms = _list(required.get("nodeSelectorTerms"))
    if terms is None:
        return NO_NODE
    size = 0
    for term in terms:
        if isinstance(term, Mapping):
            for part in ("matchExpressions", "matchFields"):
                items = term.get(part)
                size += len(items) if isinstance(items, (list, tuple)) else 0
        if size > MAX_REQUIREMENTS:
            return NO_NODE
    parsed = tuple(t for t in (_term(raw) for raw in terms) if t is not None)
    return NodeAffinity(parsed) if parsed else NO_NODE


def required_node_affinity(spec: Mapping[str, Any]) -> NodeAffinity | None:
    """A pod spec's (or a pod template spec's) required node affinity, parsed (node_selector); None without one."""
    affinity = spec.get("affinity")
    if affinity is None:
        return None
    if not isinstance(affinity, Mapping):
        return NO_NODE
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return None
    if not isinstance(node_affinity, Mapping):
        return NO_NODE
    return node_selector(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))


@dataclass(frozen=True, slots=True, eq=False)
class Placement:
    """What kube-scheduler's filters read of one pod (or a Reservation's template) for the fields of the module
    docstring, parsed once. `affinity` None: no required node affinity."""

    node_name: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: NodeAffinity | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()
    _key: tuple[Any, ...] | None = field(default=None, init=False, repr=False)  # `key`, made at the first ask
    _digest: str = field(default="", init=False, repr=False)  # `digest`, made at the first ask

    @classmethod
    def of(cls, *, node_name: str = "", node_selector: Mapping[str, str] | None = None,
           affinity: NodeAffinity | None = None, tolerations: Sequence[Mapping[str, Any]] = ()) -> Placement:
        """A placement; more than MAX_TOLERATIONS tolerations make it match no node (module docstring)."""
        if len(tolerations) > MAX_TOLERATIONS:
            return cls(node_name, dict(node_selector or {}), NO_NODE, ())
        return cls(node_name, node_selector or {}, affinity, tuple(tolerations))

    @property
    def key(self) -> tuple[Any, ...]:
        """Equal keys, same answer on every node: (nodeName, nodeSelector, affinity, tolerations), hashable; made
        once per placement."""
        key = self._key
        if key is None:
            tolerations = tuple(sorted(tuple(sorted((str(k), str(v)) for k, v in t.items()))
                                       for t in self.tolerations))
            key = (self.node_name, tuple(sorted(self.node_selector.items())), self.affinity, tolerations)
            object.__setattr__(self, "_key", key)
        return key

    @property
    def digest(self) -> str:
        """`key` as 32 characters (BLAKE2b, 128 bits), made once per placement: what a planner keeps per shape of pod
        (agent.planner.capacity.shape_id) costs that, however large the nodeSelector or tolerations."""
        if not self._digest:
            object.__setattr__(self, "_digest", hashlib.blake2b(repr(self.key).encode(), digest_size=16).hexdigest())
        return self._digest


ANYWHERE = Placement()


def selects(node_selector: Mapping[str, str], node: NodeView) -> bool:
    """`spec.nodeSelector`: every label equal."""
    labels = node.labels
    return all(labels.get(k) == v for k, v in node_selector.items())


def tolerations_allow(tolerations: Sequence[Mapping[str, Any]], node: NodeView, ignore_lock: bool = False) -> bool:
    """Every NoSchedule/NoExecute taint of the node is tolerated; Reservoir's lock taint is skipped when
    `ignore_lock` (the planner is choosing who holds it)."""
    for taint in node.taints:
        if taint.effect not in BLOCKING_EFFECTS:
            continue
        if ignore_lock and taint.key in keys.LOCK_TAINT_KEYS:
            continue
        if not any(tolerates_taint(t, taint.key, taint.value, taint.effect) for t in tolerations):
            return False
    return True


def schedulable_on(placement: Placement, node: NodeView, *, pods_on_node: int, ignore_lock: bool = False) -> bool:
    """The one predicate (module docstring): kube-scheduler's NodeName, NodeAffinity (nodeSelector and required node
    affinity), TaintToleration and NodeResourcesFit's `pods` let the pod onto `node`, which holds `pods_on_node` pods
    already. Cheapest checks first: this runs per task shape per candidate node."""
    if pods_on_node >= node.allocatable[PODS] or not selected_by(placement, node):
        return False
    return not node.taints or tolerations_allow(placement.tolerations, node, ignore_lock)


def selected_by(placement: Placement, node: NodeView) -> bool:
    """kube-scheduler's NodeName and NodeAffinity filters (nodeName, nodeSelector, required node affinity): the part
    of the one predicate that reads only the node's name and labels."""
    if placement.node_name and placement.node_name != node.name:
        return False
    if placement.node_selector and not selects(placement.node_selector, node):
        return False
    return placement.affinity is None or placement.affinity.matches(node)
