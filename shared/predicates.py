"""Which nodes a pod (or a Reservation's template) may go to, by the rules kube-scheduler applies: nodeSelector,
required node affinity, and taints against tolerations (shared.tolerations holds the per-taint rule).

Reservoir's own lock taint is the planner's business: callers say whether to skip it (`ignore_lock`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared import keys
from shared.matching import expression_holds
from shared.tolerations import tolerates_taint
from shared.views import NodeView

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def selects(node_selector: Mapping[str, str], node: NodeView) -> bool:
    """`spec.nodeSelector`: every label equal."""
    return all(node.labels.get(k) == v for k, v in node_selector.items())


def required_node_affinity_terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """`spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`."""
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or ())


def node_affinity_allows(terms: Sequence[Mapping[str, Any]], node: NodeView) -> bool:
    """Required node affinity: terms ORed, the expressions of a term ANDed (with Gt/Lt); no terms allow all."""
    return not terms or any(all(expression_holds(e, node.labels, numeric=True) for e in term.get("matchExpressions")
                                or ()) for term in terms)


def tolerations_allow(tolerations: Sequence[Mapping[str, Any]], node: NodeView, ignore_lock: bool = False) -> bool:
    """Every NoSchedule/NoExecute taint of the node is tolerated; Reservoir's lock taint is skipped when
    `ignore_lock` (the planner is choosing who holds it)."""
    for taint in node.taints:
        if taint.effect not in BLOCKING_EFFECTS:
            continue
        if ignore_lock and taint.key == keys.LOCK:
            continue
        if not any(tolerates_taint(t, taint.key, taint.value, taint.effect) for t in tolerations):
            return False
    return True
