"""Label selectors and Reservation owner matching (seed 003: owners ORed, fields within one owner ANDed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: matchLabels and every matchExpression must hold; an empty selector
    matches everything; a None selector matches nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(expression_holds(e, labels) for e in selector.get("matchExpressions") or ())


def expression_holds(expression: Mapping[str, Any], labels: Mapping[str, str], numeric: bool = False) -> bool:
    """One selector requirement: In, NotIn (an absent label is not in), Exists, DoesNotExist; with `numeric`
    (node selector terms) also Gt and Lt, comparing integers. An unknown operator matches nothing."""
    key, operator, values = expression.get("key", ""), expression.get("operator"), expression.get("values") or ()
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return not (key in labels and labels[key] in values)
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if numeric and operator in ("Gt", "Lt") and key in labels and values:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _object_matches(ref: Mapping[str, Any], meta: Mapping[str, Any], namespace: str) -> bool:
    checks = {"name": meta.get("name"), "namespace": namespace, "uid": meta.get("uid")}
    for field, actual in checks.items():
        wanted = ref.get(field)
        if wanted and wanted != actual:
            return False
    if ref.get("kind") and ref["kind"] != "Pod":
        return False
    return any(ref.get(f) for f in ("name", "uid"))


def _controller_matches(ref: Mapping[str, Any], meta: Mapping[str, Any], namespace: str) -> bool:
    if ref.get("namespace") and ref["namespace"] != namespace:
        return False
    for owner in meta.get("ownerReferences") or ():
        if not owner.get("controller"):
            continue
        if all(not ref.get(f) or ref.get(f) == owner.get(f) for f in ("uid", "name", "kind", "apiVersion")):
            return True
    return False


def owner_matches(owner: Mapping[str, Any], pod: Mapping[str, Any], namespace: str) -> bool:
    """One ReservationOwner: every field it sets must match (ANDed); an owner with no field matches nothing."""
    meta = pod.get("metadata") or {}
    fields = [f for f in ("object", "controller", "labelSelector") if owner.get(f) is not None]
    if not fields:
        return False
    if "object" in fields and not _object_matches(owner["object"], meta, namespace):
        return False
    if "controller" in fields and not _controller_matches(owner["controller"], meta, namespace):
        return False
    if "labelSelector" in fields and not label_selector_matches(owner["labelSelector"], meta.get("labels") or {}):
        return False
    return True


def reservation_matches(owners: tuple[Mapping[str, Any], ...] | list[Mapping[str, Any]],
                        pod: Mapping[str, Any], namespace: str) -> bool:
    """Seed 003: the pod may use the reservation when any owner matches it."""
    return any(owner_matches(owner, pod, namespace) for owner in owners)
