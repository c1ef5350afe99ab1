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
    for expression in selector.get("matchExpressions") or ():
        key = expression.get("key", "")
        operator = expression.get("operator")
        values = expression.get("values") or ()
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


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
