"""The mutating webhook's decisions, as pure functions: object in, JSON Patch out (DESIGN section 3).

Every mutation is idempotent (a second pass over its own output yields no patch) and deterministic (owner ids
are sorted). Nothing here does I/O: what the request needs from the cluster arrives in a `Lookup` built from
watch caches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared import keys
from shared.backfill import declared_runtime, hold_refusal
from shared.entitlement import Entitlement, admitted_queue, entitlement, honoured_queue, kueue_queue
from shared.jsonpatch import Op, add, pointer
from shared.keys import LockKind, owner_kind
from shared.ownership import (
    job_of,
    podgroup_of,
    queue_of,
    reservation_owner_id,
)
from shared.predicates import DEFAULT_SCHEDULER
from shared.priority import job_class
from shared.reservation_affinity import affinity_text, ignores_reservations, parse_reservation_affinity
from shared.resources import pod_requests
from shared.tolerations import toleration_ops
from shared.views import PodGroupView
from webhook.lookup import Lookup

PREFERRED_WEIGHT = 100
COPIED_FROM_PODGROUP = (keys.RESERVEABLE, keys.MAXIMUM_RUNTIME)


@dataclass(frozen=True)
class Mutation:
    patch: list[Op]
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # what was changed and why, for the log line


def _inherit_priority(spec: Mapping[str, Any], podgroup: PodGroupView | None, queue_name: str, namespace: str,
                      lookup: Lookup, with_value: bool) -> tuple[list[Op], str]:
    """Seed 001 "Job's Priority inherits Queue's Priority", by the seed's `cache.go` rule (shared.priority.job_class,
    which the planner's job priority follows too): an object with no class chosen (none, or the cluster's
    globalDefault filled in by the Priority admission plugin) takes its PodGroup's own class, else its queue's. For
    pods, `priority` and `preemptionPolicy` are set from the class too, since the Priority plugin re-validates them
    after webhooks; the ResourceQuota admission plugin, after every webhook, judges the pod with that class as if the
    tenant had named it (shared.priority: the PodGroup route gives no more than naming the class on the pod). A queue
    that does not admit `namespace` (shared.entitlement.admitted_queue, issue 29) lends it no class: naming a queue
    bound to another team is no way to that team's priority."""
    chosen = spec.get("priorityClassName") or ""
    if chosen and chosen != lookup.global_default_class:
        return [], ""
    admitted = admitted_queue(queue_name, lookup.queues, namespace)
    found = job_class(podgroup, lookup.queues.get(admitted) if admitted is not None else None,
                      lookup.priority_classes)
    if found is None or found[0].name == chosen:
        return [], ""
    inherited, source = found
    ops = [add("/spec/priorityClassName", inherited.name)]
    if with_value:
        ops += [add("/spec/priority", inherited.value), add("/spec/preemptionPolicy", inherited.preemption_policy)]
    return ops, f"priorityClassName={inherited.name} inherited from {source}"


def _add_annotations(meta: Mapping[str, Any], new: Mapping[str, str]) -> list[Op]:
    """Seed 004: JSON Patch adding the annotations copied from the PodGroup, sorted."""
    if not new:
        return []
    if meta.get("annotations") is None:
        return [add("/metadata/annotations", dict(sorted(new.items())))]
    return [add(pointer("metadata", "annotations", k), v) for k, v in sorted(new.items())]


def named_reservations(annotations: Mapping[str, str], lookup: Lookup) -> list[str] | None:
    """Seed 003, issue 18: the keys (ReservationView.key) of the Reservations the pod's affinity names or selects
    (shared.reservation_affinity: a name, or Koordinator's JSON with name, reservationSelector,
    reservationSelectorTerms, ANDed), of both sources; None when the pod names none (no annotation, or tolerations
    only). A name no Reservation has yet stands for Reservoir's Reservation of that name (the pod waits for it)."""
    found = affinity_text(annotations)
    if found is None:
        return None
    affinity = parse_reservation_affinity(found[1])
    if not affinity.restricts:
        return None
    selected = sorted(r.key for r in lookup.reservations.values() if affinity.selects(r))
    if not selected and affinity.name and affinity.selector is None and affinity.terms is None:
        return [affinity.name]
    return selected


def _lock_expression(owners: list[str]) -> dict[str, Any]:
    """Seeds 003 and 004: a node selector requirement for nodes locked for any of `owners`."""
    return {"key": keys.LOCK, "operator": "In", "values": owners}


def _affinity_ops(spec: Mapping[str, Any], preferred: list[str], required: list[str] | None) -> list[Op]:
    """Step 4, seed 003 (and the locks of seed 004's windows): preferred (weight 100) node affinity to nodes locked
    for any of `preferred`; a required term for `required`. Existing affinity is kept: required expressions are
    ANDed into every existing nodeSelectorTerm."""
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


def copy_reserve_annotations(meta: Mapping[str, Any], podgroup: PodGroupView | None) -> tuple[list[Op], dict[str, str]]:
    """Step 1, seed 004: `volcano.sh/reserveable` and `volcano.sh/maximum-runtime` copied from the PodGroup when the
    pod lacks them. Returns the patch and what was copied."""
    annotations = meta.get("annotations") or {}
    copied = {k: podgroup.annotations[k] for k in COPIED_FROM_PODGROUP
              if podgroup is not None and k not in annotations and k in podgroup.annotations}
    return _add_annotations(meta, copied), copied


def entitled(pod: Mapping[str, Any], namespace: str, lookup: Lookup) -> Entitlement:
    """Steps 3 and 5: what the pod may use, by the one rule (shared.entitlement): its job's, its queue's, its windows'
    (seed 004) and its Reservations' (seed 003) locks, or every lock for a BestEffort (seed 000) or DaemonSet pod.
    Only the Reservations the lookup's index names as candidates are matched."""
    meta = pod.get("metadata") or {}
    candidates = lookup.reservation_candidates(meta.get("labels") or {}, meta.get("name") or "")
    return entitlement(pod, namespace, lookup.grounds, reservations=candidates)


def required_reservations(annotations: Mapping[str, str], lookup: Lookup,
                          warnings: list[str]) -> list[str] | None:
    """Step 4, seed 003: owner ids of the Reservations the pod names (required affinity), None when it names none;
    an unreadable or empty affinity is a warning, not a refusal (the validating webhook refuses malformed ones)."""
    try:
        named = named_reservations(annotations, lookup)
    except ValueError as err:
        warnings.append(str(err))
        return None
    if named is None:
        return None
    if not named:
        warnings.append("the reservation affinity selects no Reservation: the pod is not restricted")
    return sorted(reservation_owner_id(name) for name in named) or None


def mutate_pod(pod: Mapping[str, Any], namespace: str, lookup: Lookup, username: str = "",
               groups: tuple[str, ...] = ()) -> Mutation:
    """DESIGN section 3, mutating pod CREATE, steps 1-7 in order: 1 and 2 for every pod; then 3, 4 and 6 (the locks
    the pod is entitled to, and the handover gate of a Reservation's owner) or 7 (issue 17, the backfill gate), or 5
    instead for a pod exempt from locks. Seed 004 (step 1, and windows in step 3), seed 001 (step 2), seed 003
    (Reservations in steps 3, 4 and 6), seed 000 (BestEffort pods in step 5). A kubelet's mirror pod (the annotation
    on a request made as a node, `username` and `groups`) is left alone; the annotation alone, from anyone else, is
    not enough."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = dict(meta.get("annotations") or {})
    if keys.is_kubelets_mirror_pod(annotations, username, groups):
        return Mutation([], reasons=["mirror pod: left alone"])
    reasons: list[str] = []
    warnings: list[str] = []

    podgroup = podgroup_of(pod, namespace, lookup.podgroups)
    ops, copied = copy_reserve_annotations(meta, podgroup)  # 1
    if copied and podgroup is not None:
        reasons.append(f"copied {', '.join(sorted(copied))} from PodGroup {podgroup.name}")
    annotations.update(copied)

    queue = queue_of(pod, podgroup)
    priority_ops, why = _inherit_priority(spec, podgroup, queue, namespace, lookup, with_value=True)  # 2
    ops += priority_ops
    if why:
        reasons.append(why)

    rights = entitled(pod, namespace, lookup)
    if rights.every_lock is not None:  # 5 (an exclusive lock only its own queue's, or every one for a DaemonSet's)
        bypass = toleration_ops(spec.get("tolerations"), rights.tolerations())
        if bypass:
            reasons.append(f"tolerates every lock: {rights.every_lock}")
        return Mutation(ops + bypass, warnings, reasons)

    owners = sorted(rights.owners)  # 3 (both tolerations of an owner whose locks are exclusive)
    # 4: naming a Reservation only narrows where the pod may go; its toleration comes from being an owner (step 3)
    labels = meta.get("labels")
    ignored = ignores_reservations(labels if isinstance(labels, Mapping) else {})  # issue 18: as if none existed
    required = None if ignored else required_reservations(annotations, lookup, warnings)
    added_tolerations = toleration_ops(spec.get("tolerations"), rights.tolerations())
    if added_tolerations:
        reasons.append(f"tolerations for {len(owners)} lock owners")
    ops += added_tolerations
    affinity_ops = _affinity_ops(spec, owners, required)
    if affinity_ops:
        reasons.append("node affinity to its locked nodes" + (" (required: named reservation)" if required else ""))
    ops += affinity_ops
    gate_ops = handover_gate(spec, owners, lookup)  # 6
    if gate_ops:
        reasons.append("held for its Reservation's handover")
    else:
        job = job_of(pod, namespace)
        cluster_queue = kueue_queue((namespace, job.kind, job.name) if job else None, lookup.workloads)
        gate_ops, why_not = backfill_gate(spec, annotations, podgroup, namespace, queue, lookup, warnings,
                                          cluster_queue=cluster_queue)  # 7
        if gate_ops:
            reasons.append("held for the agent's backfill choice")
        elif why_not:
            reasons.append(why_not)
    return Mutation(ops + gate_ops, warnings, reasons)


def backfill_gate(spec: Mapping[str, Any], annotations: Mapping[str, str], podgroup: PodGroupView | None,
                  namespace: str, queue: str, lookup: Lookup, warnings: list[str],
                  now: datetime | None = None, cluster_queue: str | None = None) -> tuple[list[Op], str]:
    """Step 7, issue 17: a pod backfill may hold (shared.backfill.hold_refusal: it opts in, the config's switch covers
    it, it declares a maximum runtime) gets the scheduling gate keys.BACKFILL_GATE, which the agent lifts within one
    resync (agent/planner/backfill.py); not a bound pod, not in a dry run. A pod that opts in but may not be held is
    let in ungated, with a warning that says why. Issue 30: held only when some locked node's backfill room takes it
    in time (Lookup.backfill_room_for, shared.backfill "Room"); else let in ungated, so that where nothing is
    locked, or no lock has room for it, its wait is kube-scheduler's alone. Returns the patch, and why a pod that
    may be held is not (for the log). `cluster_queue`: the ClusterQueue of the pod's Kueue Workload (issue 32), its
    queue for backfill's `queues` in place of the one it names."""
    config = lookup.grounds.config
    if spec.get("nodeName") or config.dry_run:
        return [], ""
    group_annotations = podgroup.annotations if podgroup is not None else {}
    why = hold_refusal(annotations, group_annotations, namespace=namespace,
                       queue=cluster_queue or honoured_queue(queue, lookup.grounds.queues, namespace),
                       config=config.backfill, scheduler=str(spec.get("schedulerName") or DEFAULT_SCHEDULER))
    if why is not None:
        if why:
            warnings.append(why)
        return [], ""
    runtime = declared_runtime(annotations, group_annotations)
    assert runtime is not None, "hold_refusal lets through only pods that declare a positive runtime"
    if not lookup.backfill_room_for(pod_requests(spec), runtime, now or datetime.now(UTC)):
        return [], "not held for backfill: no locked node has room for it in time"
    return _gate_ops(spec, keys.BACKFILL_GATE), ""


def _gate_ops(spec: Mapping[str, Any], name: str) -> list[Op]:
    """The JSON Patch adding the scheduling gate `name`, [] when the pod has it (a gate can only be given at
    creation)."""
    gates = spec.get("schedulingGates")
    if isinstance(gates, list) and any(isinstance(g, Mapping) and g.get("name") == name for g in gates):
        return []
    gate = {"name": name}
    return [add("/spec/schedulingGates/-", gate) if isinstance(gates, list) and gates
            else add("/spec/schedulingGates", [gate])]


def handover_gate(spec: Mapping[str, Any], owners: Sequence[str], lookup: Lookup) -> list[Op]:
    """Step 6, seed 003: an owner of an Available Reservation (step 3) that is not bound yet is held by the scheduling
    gate keys.HANDOVER_GATE, so the agent can hand the reserved resources over to it (agent/planner/reservations.py);
    not when Reservations are disabled or the config is a dry run (the agent would only lift the gate). A gate can
    only be given at creation."""
    config = lookup.grounds.config
    if spec.get("nodeName") or not config.reservations.enabled or config.dry_run:
        return []
    if not any(owner_kind(owner) is LockKind.RESERVATION for owner in owners):
        return []
    return _gate_ops(spec, keys.HANDOVER_GATE)


def mutate_podgroup(podgroup: Mapping[str, Any], namespace: str, lookup: Lookup) -> Mutation:
    """Seed 001 for PodGroups: no priorityClassName -> the queue's class (a PodGroup's own class comes first), when
    the queue admits `namespace` (the request's)."""
    spec = podgroup.get("spec") or {}
    queue = spec.get("queue") or keys.DEFAULT_QUEUE
    ops, why = _inherit_priority(spec, None, queue, namespace, lookup, with_value=False)
    if ops and podgroup.get("spec") is None:
        ops = [add("/spec", {"priorityClassName": ops[0]["value"]})]
    return Mutation(ops, reasons=[why] if why else [])
