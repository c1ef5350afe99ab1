"""Label selectors and Reservation owner matching (seed 003: owners ORed, fields within one owner ANDed), by
Koordinator's rules (issue 18, its pkg/util/reservation) for both Reservation sources, but for the two cases where those
would let a tenant reach further (`_object_matches`, `_controller_matches`).

Every function here is total over arbitrary JSON: a selector, requirement or owner whose shape is wrong (a string
where an object belongs, `values` that is not a list of strings, a key that is not a string, an unknown operator)
matches nothing and never raises. A Reservation the webhook's validation let in, or one created while it was down,
can therefore never make a pod mutation or a plan fail; it only matches no pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _list(value: Any) -> Sequence[Any] | None:
    """A JSON array (list or tuple), () for an absent one (None), None when it is something else."""
    if value is None:
        return ()
    return value if isinstance(value, (list, tuple)) else None


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: matchLabels and every matchExpression must hold; an empty selector
    matches everything; a None selector matches nothing, and so does a malformed one (module docstring)."""
    if not isinstance(selector, Mapping) or not isinstance(labels, Mapping):
        return False
    match_labels = selector.get("matchLabels")
    if match_labels is not None and not isinstance(match_labels, Mapping):
        return False
    for key, value in (match_labels or {}).items():
        if not isinstance(key, str) or not isinstance(value, str) or labels.get(key) != value:
            return False
    expressions = _list(selector.get("matchExpressions"))
    if expressions is None:
        return False
    return all(expression_holds(e, labels) for e in expressions)


def expression_holds(expression: Mapping[str, Any], labels: Mapping[str, str], numeric: bool = False) -> bool:
    """One selector requirement: In, NotIn (an absent label is not in), Exists, DoesNotExist; with `numeric`
    (node selector terms) also Gt and Lt, comparing integers. An unknown operator, or a requirement whose key is not
    a string or whose values are not a list of strings, matches nothing."""
    if not isinstance(expression, Mapping) or not isinstance(labels, Mapping):
        return False
    key, operator, values = expression.get("key", ""), expression.get("operator"), _list(expression.get("values"))
    if not isinstance(key, str) or values is None or not all(isinstance(v, str) for v in values):
        return False
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return not (key in labels and labels[key] in values)
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if numeric and operator in ("Gt", "Lt") and key in labels and values:
        have, bound = labels[key], values[0]
        # Kubernetes reads both as int64: a longer text is not one (and int() of thousands of digits is slow)
        if not isinstance(have, str) or len(have) > 20 or len(bound) > 20:
            return False
        try:
            have_int, bound_int = int(have), int(bound)
        except ValueError:
            return False
        return have_int > bound_int if operator == "Gt" else have_int < bound_int
    return False


_REF_FIELDS = ("name", "namespace", "uid", "kind", "apiVersion")


def _ref_fields_readable(ref: Mapping[str, Any], fields: Sequence[str]) -> bool:
    return all(ref.get(f) is None or isinstance(ref.get(f), str) for f in fields)


def _object_matches(ref: Any, meta: Mapping[str, Any], namespace: str, confined: bool = False) -> bool:
    """Koordinator's MatchObjectRef (issue 18): each of name, namespace and uid that the reference sets must be the
    pod's; `kind` and `apiVersion` are ignored (only pods are compared). A namespace alone matches every pod of that
    namespace. Departs from Koordinator in two cases, both judged as the namespace-less `controller` entry is
    (`_controller_matches`): a reference setting none of name, namespace, uid matches no pod (Koordinator's would match
    every pod of the cluster, in every tenant's namespace), and neither does one setting a name alone (any tenant can
    name a pod X in its own namespace): it must be confined by a namespace (its own, or, `confined`, the same entry's
    controller's, ANDed with it), or name a uid, which the API server assigns and nobody can forge
    (docs/tasks/koordinator.md)."""
    if not isinstance(ref, Mapping) or not _ref_fields_readable(ref, _REF_FIELDS):
        return False
    if not ref.get("namespace") and not ref.get("uid") and not confined:
        return False
    checks = {"name": meta.get("name"), "namespace": namespace, "uid": meta.get("uid")}
    for field, actual in checks.items():
        wanted = ref.get(field)
        if wanted and wanted != actual:
            return False
    return True


def controller_namespace(entry: Mapping[str, Any]) -> str:
    """The namespace a `controller` owner entry is confined to: its own `namespace`, else the same entry's
    `object.namespace` (ANDed anyway); "" when neither is set (it then matches no pod: `_controller_matches`)."""
    for ref in (entry.get("controller"), entry.get("object")):
        if isinstance(ref, Mapping) and isinstance(ref.get("namespace"), str) and ref["namespace"]:
            return str(ref["namespace"])
    return ""


def _controller_matches(ref: Any, meta: Mapping[str, Any], namespace: str, confined_to: str) -> bool:
    """Koordinator's MatchReservationControllerReference (issue 18): some ownerReference of the pod has each of uid,
    name, kind and apiVersion the reference sets; `controller`, when the reference sets it, must be the same on the
    ownerReference (unset: any ownerReference, controller or not). Departs from Koordinator in one case: the entry
    must confine it to a namespace (`controller.namespace`, or the entry's `object.namespace`), else it matches no
    pod: a tenant can write any ownerReference on its own pod, so a namespace-less controller entry would let a pod in
    any namespace match by forging one (docs/tasks/koordinator.md)."""
    if not isinstance(ref, Mapping) or not _ref_fields_readable(ref, _REF_FIELDS):
        return False
    if not confined_to or confined_to != namespace:
        return False
    wanted_controller = ref.get("controller")
    if wanted_controller is not None and not isinstance(wanted_controller, bool):
        return False
    for owner in _list(meta.get("ownerReferences")) or ():
        if not isinstance(owner, Mapping):
            continue
        if wanted_controller is not None and bool(owner.get("controller")) is not wanted_controller:
            continue
        if all(not ref.get(f) or ref.get(f) == owner.get(f) for f in ("uid", "name", "kind", "apiVersion")):
            return True
    return False


def owner_matches(owner: Mapping[str, Any], pod: Mapping[str, Any], namespace: str) -> bool:
    """One ReservationOwner: every field it sets must match (ANDed); an owner with no field matches nothing, and so
    does one that is not an object, whose fields are malformed (module docstring), or whose labelSelector is empty
    (`is_empty_selector`)."""
    if not isinstance(owner, Mapping) or not isinstance(pod, Mapping):
        return False
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return False
    fields = [f for f in ("object", "controller", "labelSelector") if owner.get(f) is not None]
    if not fields:
        return False
    confined = "controller" in fields and bool(controller_namespace(owner))
    if "object" in fields and not _object_matches(owner["object"], meta, namespace, confined):
        return False
    if "controller" in fields and not _controller_matches(owner["controller"], meta, namespace,
                                                           controller_namespace(owner)):
        return False
    labels = meta.get("labels") or {}
    if "labelSelector" in fields and (is_empty_selector(owner["labelSelector"])
                                      or not label_selector_matches(owner["labelSelector"], labels)):
        return False
    return True


def is_empty_selector(selector: Any) -> bool:
    """A label selector with neither matchLabels nor matchExpressions (`{}`, `{matchLabels: {}}`). As an owner's
    `labelSelector` it matches no pod: metav1 reads it as "every pod", which in an owner entry would hand the
    Reservation to every pod of the cluster, in every tenant's namespace (the same departure as `_object_matches`;
    docs/tasks/koordinator.md)."""
    return (isinstance(selector, Mapping) and not selector.get("matchLabels")
            and not selector.get("matchExpressions"))


def reservation_matches(owners: tuple[Mapping[str, Any], ...] | list[Mapping[str, Any]],
                        pod: Mapping[str, Any], namespace: str) -> bool:
    """Seed 003: the pod may use the reservation when any owner matches it (none when `owners` is not a list)."""
    return any(owner_matches(owner, pod, namespace) for owner in _list(owners) or ())
