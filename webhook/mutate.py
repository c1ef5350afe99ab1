"""The mutating webhook's decisions, as pure functions: object in, JSON Patch out (DESIGN section 3).

Every mutation is idempotent (a second pass over its own output yields no patch) and deterministic (owner ids
are sorted). Nothing here does I/O: what the request needs from the cluster arrives in a `Lookup` built from
watch caches.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from shared import keys
from shared.config import ReservoirConfig
from shared.jobs import job_of, podgroup_of, queue_of, queue_owner_id, reservation_owner_id, window_owner_id
from shared.matching import label_selector_matches, reservation_matches
from shared.resources import Resources, is_best_effort
from shared.views import NodeView, PodGroupView, PriorityClassView, QueueView, ReservationView
from webhook.jsonpatch import Op, add, pointer

MIRROR_POD = "kubernetes.io/config.mirror"
PREFERRED_WEIGHT = 100
COPIED_FROM_PODGROUP = (keys.RESERVEABLE, keys.MAXIMUM_RUNTIME)
BYPASS_TOLERATION = {"key": keys.LOCK, "operator": "Exists"}


@dataclass(frozen=True)
class Lookup:
    """What the request path may read: snapshots of the watch caches."""

    podgroups: Mapping[tuple[str, str], PodGroupView] = field(default_factory=dict)
    queues: Mapping[str, QueueView] = field(default_factory=dict)
    priority_classes: Mapping[str, PriorityClassView] = field(default_factory=dict)
    reservations: Mapping[str, ReservationView] = field(default_factory=dict)
    config: ReservoirConfig = field(default_factory=ReservoirConfig)
    nodes: Mapping[str, NodeView] = field(default_factory=dict)

    @cached_property
    def schedulable_allocatable(self) -> Resources:
        """What the schedulable nodes hold together (a Queue guarantee above it can never be met)."""
        return Resources.total(n.allocatable for n in self.nodes.values() if not n.unschedulable)

    @cached_property
    def global_default_class(self) -> str:
        return next((pc.name for pc in self.priority_classes.values() if pc.global_default), "")

    @cached_property
    def _reservation_index(self) -> tuple[dict[tuple[str, str], list[ReservationView]], dict[str, list[ReservationView]],
                                          list[ReservationView]]:
        """Usable reservations (Available, schedulable) bucketed so a pod is checked against few of them: an
        owner that needs a label value goes under one (key, value) it needs, an owner naming a pod under that
        name, any other owner in `always`."""
        by_label: dict[tuple[str, str], list[ReservationView]] = defaultdict(list)
        by_name: dict[str, list[ReservationView]] = defaultdict(list)
        always: list[ReservationView] = []
        for reservation in self.reservations.values():
            if reservation.phase != "Available" or reservation.unschedulable:
                continue
            for owner in reservation.owners:
                selector = owner.get("labelSelector") if isinstance(owner, Mapping) else None
                obj = owner.get("object") if isinstance(owner, Mapping) else None
                match_labels = (selector or {}).get("matchLabels") if isinstance(selector, Mapping) else None
                if isinstance(obj, Mapping) and obj.get("name"):
                    by_name[obj["name"]].append(reservation)
                elif isinstance(match_labels, Mapping) and match_labels:
                    key = min(match_labels)
                    by_label[(key, str(match_labels[key]))].append(reservation)
                else:
                    always.append(reservation)
        return by_label, by_name, always

    def reservation_candidates(self, labels: Mapping[str, str], name: str) -> list[ReservationView]:
        """Reservations that may match a pod with these labels and name (a superset; check each)."""
        by_label, by_name, always = self._reservation_index
        seen: dict[str, ReservationView] = {r.name: r for r in always}
        for item in labels.items():
            for reservation in by_label.get(item, ()):
                seen[reservation.name] = reservation
        for reservation in by_name.get(name, ()):
            seen[reservation.name] = reservation
        return list(seen.values())


@dataclass(frozen=True)
class Mutation:
    patch: list[Op]
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # what was changed and why, for the log line


def lock_toleration(owner: str) -> dict[str, str]:
    return {"key": keys.LOCK, "operator": "Equal", "value": owner, "effect": keys.LOCK_EFFECT}


def queue_priority_class(queue: QueueView | None, lookup: Lookup) -> PriorityClassView | None:
    """Seed 001: the PriorityClass the queue names (QueueView.class_name), if it exists."""
    if queue is None or not queue.class_name:
        return None
    return lookup.priority_classes.get(queue.class_name)


def _inherit_priority(spec: Mapping[str, Any], queue_name: str, lookup: Lookup, with_value: bool) -> tuple[list[Op], str]:
    """Seed 001 "Job's Priority inherits Queue's Priority": an object with no class chosen (none, or the cluster's
    globalDefault filled in by the Priority admission plugin) takes its queue's class. For pods, `priority` and
    `preemptionPolicy` are set from the class too, since the Priority plugin re-validates them after webhooks."""
    chosen = spec.get("priorityClassName") or ""
    if chosen and chosen != lookup.global_default_class:
        return [], ""
    inherited = queue_priority_class(lookup.queues.get(queue_name), lookup)
    if inherited is None or inherited.name == chosen:
        return [], ""
    ops = [add("/spec/priorityClassName", inherited.name)]
    if with_value:
        ops += [add("/spec/priority", inherited.value), add("/spec/preemptionPolicy", inherited.preemption_policy)]
    return ops, f"priorityClassName={inherited.name} inherited from queue {queue_name}"


def _add_annotations(meta: Mapping[str, Any], new: Mapping[str, str]) -> list[Op]:
    if not new:
        return []
    if meta.get("annotations") is None:
        return [add("/metadata/annotations", dict(sorted(new.items())))]
    return [add(pointer("metadata", "annotations", k), v) for k, v in sorted(new.items())]


def named_reservations(annotations: Mapping[str, str], lookup: Lookup) -> list[str] | None:
    """Reservations the pod names (required affinity): `reservoir.sh/reservation-affinity` holds a name or
    Koordinator's JSON (`{"name": ...}` or `{"reservationSelector": {...}}`); so does Koordinator's own key.
    None when the pod names none."""
    text = annotations.get(keys.RESERVATION_AFFINITY) or annotations.get(keys.KOORDINATOR_RESERVATION_AFFINITY)
    if not text:
        return None
    parsed = parse_reservation_affinity(text)
    if "name" in parsed:
        return [parsed["name"]]
    selector = {"matchLabels": parsed["reservationSelector"]}
    return sorted(r.name for r in lookup.reservations.values() if label_selector_matches(selector, r.labels))


def parse_reservation_affinity(text: str) -> dict[str, Any]:
    """`name`, `{"name": "x"}` or `{"reservationSelector": {"k": "v"}}`; ValueError names what is accepted."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        if not stripped:
            raise ValueError("empty reservation affinity")
        return {"name": stripped}
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("name"), str) and data["name"]:
        return {"name": data["name"]}
    if isinstance(data, dict) and isinstance(data.get("reservationSelector"), dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in data["reservationSelector"].items()
    ):
        return {"reservationSelector": data["reservationSelector"]}
    raise ValueError(
        f"reservation affinity {text!r} is not valid: expected a Reservation name, "
        '{"name": "<reservation>"} or {"reservationSelector": {"<label>": "<value>"}}'
    )


def _has_toleration(tolerations: list[Mapping[str, Any]], wanted: Mapping[str, str]) -> bool:
    def norm(t: Mapping[str, Any]) -> tuple:
        return (t.get("key", ""), t.get("operator") or "Equal", t.get("value", ""), t.get("effect", ""))
    return any(norm(t) == norm(wanted) for t in tolerations)


def toleration_ops(tolerations: list[Mapping[str, Any]] | None, wanted: list[dict[str, str]]) -> list[Op]:
    """JSON Patch adding to a pod's `tolerations` (None when the field is absent) those of `wanted` it lacks."""
    existing = list(tolerations or [])
    missing = [t for t in wanted if not _has_toleration(existing, t)]
    if not missing:
        return []
    if tolerations is None:
        return [add("/spec/tolerations", missing)]
    return [add("/spec/tolerations/-", t) for t in missing]


def _lock_expression(owners: list[str]) -> dict[str, Any]:
    return {"key": keys.LOCK, "operator": "In", "values": owners}


def _affinity_ops(spec: Mapping[str, Any], preferred: list[str], required: list[str] | None) -> list[Op]:
    """Preferred (weight 100) node affinity to nodes locked for any of `preferred`; a required term for `required`.
    Existing affinity is kept: required expressions are ANDed into every existing nodeSelectorTerm."""
    affinity = spec.get("affinity")
    node_affinity = (affinity or {}).get("nodeAffinity")
    new_node_affinity: dict[str, Any] = {}
    ops: list[Op] = []
    base = ("spec", "affinity", "nodeAffinity")

    if preferred:
        term = {"weight": PREFERRED_WEIGHT, "preference": {"matchExpressions": [_lock_expression(preferred)]}}
        current = (node_affinity or {}).get("preferredDuringSchedulingIgnoredDuringExecution")
        if current is None:
            new_node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [term]
        elif term not in current:
            ops.append(add(pointer(*base, "preferredDuringSchedulingIgnoredDuringExecution", "-"), term))

    if required:
        expression = _lock_expression(required)
        current_required = (node_affinity or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        terms = (current_required or {}).get("nodeSelectorTerms") or []
        if not terms:
            if current_required is None:
                new_node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
                    "nodeSelectorTerms": [{"matchExpressions": [expression]}]}
            else:
                ops.append(add(pointer(*base, "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"),
                               [{"matchExpressions": [expression]}]))
        for index, term in enumerate(terms):
            expressions = term.get("matchExpressions")
            term_path = (*base, "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", index)
            if expressions is None:
                ops.append(add(pointer(*term_path, "matchExpressions"), [expression]))
            elif expression not in expressions:
                ops.append(add(pointer(*term_path, "matchExpressions", "-"), expression))

    if new_node_affinity:
        if affinity is None:
            ops.insert(0, add("/spec/affinity", {"nodeAffinity": new_node_affinity}))
        elif node_affinity is None:
            ops.insert(0, add(pointer("spec", "affinity", "nodeAffinity"), new_node_affinity))
        else:
            ops[:0] = [add(pointer(*base, name), value) for name, value in new_node_affinity.items()]
    return ops


def _is_daemonset_pod(meta: Mapping[str, Any]) -> bool:
    return any(r.get("controller") and r.get("kind") == "DaemonSet" for r in meta.get("ownerReferences") or ())


def mutate_pod(pod: Mapping[str, Any], namespace: str, lookup: Lookup) -> Mutation:
    """DESIGN section 3, mutating pod CREATE, steps 1-5."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = dict(meta.get("annotations") or {})
    if MIRROR_POD in annotations:
        return Mutation([], reasons=["mirror pod: left alone"])
    ops: list[Op] = []
    reasons: list[str] = []
    warnings: list[str] = []

    # 1. reserve annotations from the PodGroup
    podgroup = podgroup_of(pod, namespace, lookup.podgroups)
    copied = {k: podgroup.annotations[k] for k in COPIED_FROM_PODGROUP
              if podgroup is not None and k not in annotations and k in podgroup.annotations}
    ops += _add_annotations(meta, copied)
    if copied:
        reasons.append(f"copied {', '.join(sorted(copied))} from PodGroup {podgroup.name}")  # type: ignore[union-attr]
    annotations.update(copied)

    # 2. queue priority inheritance
    queue = queue_of(pod, podgroup)
    priority_ops, why = _inherit_priority(spec, queue, lookup, with_value=True)
    ops += priority_ops
    if why:
        reasons.append(why)

    # 5. BestEffort and DaemonSet pods may use every locked node
    webhook_config = lookup.config.webhook
    if (webhook_config.tolerate_best_effort and is_best_effort(spec)) or (
        webhook_config.tolerate_daemonsets and _is_daemonset_pod(meta)
    ):
        bypass = toleration_ops(spec.get("tolerations"), [BYPASS_TOLERATION])
        if bypass:
            reasons.append("tolerates every lock (BestEffort or DaemonSet pod)")
        return Mutation(ops + bypass, warnings, reasons)

    # 3. tolerations for the locks the pod may use
    owners: list[str] = []
    job = job_of(pod, namespace)
    if job is not None:
        owners.append(job.owner_id)
    owners.append(queue_owner_id(queue))
    if annotations.get(keys.RESERVEABLE) == "true":
        owners += [window_owner_id(w.name) for w in lookup.config.windows]
    candidates = lookup.reservation_candidates(meta.get("labels") or {}, meta.get("name") or "")
    usable = [r.name for r in candidates if reservation_matches(r.owners, pod, namespace)]
    owners += [reservation_owner_id(name) for name in usable]

    # 4. reservation affinity: required for the reservations the pod names
    required: list[str] | None = None
    try:
        named = named_reservations(annotations, lookup)
    except ValueError as err:
        named = None
        warnings.append(str(err))
    if named is not None:
        required = sorted(reservation_owner_id(name) for name in named) or None
        if not named:
            warnings.append("the reservation affinity selects no Reservation: the pod is not restricted")
        owners += required or []
    owners = sorted(set(owners))

    added_tolerations = toleration_ops(spec.get("tolerations"), [lock_toleration(o) for o in owners])
    if added_tolerations:
        reasons.append(f"tolerations for {len(owners)} lock owners")
    ops += added_tolerations
    affinity_ops = _affinity_ops(spec, owners, required)
    if affinity_ops:
        reasons.append("node affinity to its locked nodes" + (" (required: named reservation)" if required else ""))
    ops += affinity_ops
    return Mutation(ops, warnings, reasons)


def mutate_podgroup(podgroup: Mapping[str, Any], lookup: Lookup) -> Mutation:
    """Seed 001 for PodGroups: no priorityClassName -> the queue's class."""
    spec = podgroup.get("spec") or {}
    queue = spec.get("queue") or keys.DEFAULT_QUEUE
    ops, why = _inherit_priority(spec, queue, lookup, with_value=False)
    if ops and podgroup.get("spec") is None:
        ops = [add("/spec", {"priorityClassName": ops[0]["value"]})]
    return Mutation(ops, reasons=[why] if why else [])
