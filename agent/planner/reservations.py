"""Seed 003, Reservation objects (DESIGN 4.4): place each on a node, lock it for the Reservation's owners, and
follow its phase.

Phases, decided in this order each plan:
- Succeeded / Failed stay so; the object is deleted `reservations.gcGracePeriod` after it got there.
- Failed (Expired) once `expires` (exclusive) or creation + `ttl` has passed (ttl 0: never).
- Failed (NodeDeleted) when its node is gone.
- Succeeded (Allocated) with `allocateOnce` once an owner pod is bound on its node: the node is released.
- Placed already: Available, or Waiting (preAllocation) until the node's idle covers the request.
- Not placed: the node must match the template's nodeName, nodeSelector and required node affinity, its taints
  (other than Reservoir's lock) must be tolerated by the template, it must be schedulable and held by no other
  lock, and its allocatable must cover the request. Among nodes whose idle covers it now, the one with the least
  idle (best fit, keeping big holes open) wins; with preAllocation, if none does, the node that fits soonest
  (capacity.time_to_fit) is taken and the Reservation waits there. Else Pending (Scheduled False, Unschedulable).

Owner pods bound on the node while it is Available or Waiting are the Reservation's current owners; they get the
`reservoir.sh/reservation-allocated` annotation and their requests make up `status.allocated`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agent.planner.capacity import FOREVER, NodeState, schedulable, time_to_fit
from agent.planner.model import Lock
from shared import keys
from shared.ownership import reservation_owner_id
from shared.keys import LockKind
from shared.matching import reservation_matches
from shared.predicates import node_affinity_allows, required_node_affinity_terms, selects, tolerations_allow
from shared.resources import Resources
from shared.timestamps import parse_time, stamp
from shared.views import NodeView, PodView, ReservationView

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class ReservationStatus:
    name: str
    phase: str
    node: str
    reason: str  # the Ready condition's reason
    message: str
    allocatable: Resources
    allocated: Resources
    owners: tuple[PodView, ...] = ()  # current owners
    annotate: tuple[str, ...] = ()  # owner pods ("namespace/name") still lacking the allocated annotation
    delete: bool = False  # terminal for longer than the grace period: garbage-collect the object
    final: bool = False  # ended in an earlier plan: its status stays as written then
    conditions: tuple[dict[str, Any], ...] = field(default=())

    def status(self) -> dict[str, Any]:
        """The object's `status`, as the agent writes it."""
        return {
            "phase": self.phase, "nodeName": self.node or None, "conditions": list(self.conditions),
            "allocatable": self.allocatable.to_quantities(), "allocated": self.allocated.to_quantities(),
            "currentOwners": [{"namespace": p.namespace, "name": p.name, "uid": p.uid} for p in self.owners],
        }


def expiry(reservation: ReservationView) -> datetime | None:
    if reservation.expires is not None:
        return reservation.expires
    return reservation.created + reservation.ttl if reservation.ttl else None


def _pod_meta(pod: PodView) -> dict[str, Any]:
    """The fields owner matching reads, from a pod view."""
    return {"metadata": {"name": pod.name, "uid": pod.uid, "labels": dict(pod.labels), "ownerReferences": [
        {"apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid, "controller": o.controller}
        for o in pod.owners]}}


def is_owner(reservation: ReservationView, pod: PodView) -> bool:
    return reservation_matches(reservation.owners, _pod_meta(pod), pod.namespace)


def node_allowed(reservation: ReservationView, node: NodeView) -> bool:
    """The template's nodeName, nodeSelector, required node affinity (terms ORed, expressions ANDed) and
    tolerations allow this node."""
    spec = reservation.template.get("spec") or {}
    if spec.get("nodeName") and spec["nodeName"] != node.name:
        return False
    if not selects(spec.get("nodeSelector") or {}, node):
        return False
    if not node_affinity_allows(required_node_affinity_terms(spec), node):
        return False
    return tolerations_allow(spec.get("tolerations") or (), node, ignore_lock=True)


def _condition(kind: str, status: bool, reason: str, message: str, previous: Mapping[str, Any],
               now: datetime) -> dict[str, Any]:
    """A condition; its lastTransitionTime is kept while status and reason stay the same."""
    old = next((c for c in previous.get("conditions") or () if c.get("type") == kind), None)
    value = "True" if status else "False"
    since = old.get("lastTransitionTime") if old and old.get("status") == value and old.get("reason") == reason else None
    return {"type": kind, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since or stamp(now)}


def _status(r: ReservationView, phase: str, node: str, reason: str, message: str, owners: Sequence[PodView],
            allocated_to: Mapping[str, str | None], gc_grace: timedelta, now: datetime,
            final: bool = False) -> ReservationStatus:
    """One Reservation's status: conditions Scheduled (on its node, or Unschedulable with `message`) and Ready
    (True only when Available, with `reason`); `owners` become current owners and allocated, those lacking the
    allocated annotation are to be annotated; an ended one is due for deletion `gc_grace` after it ended."""
    scheduled = _condition("Scheduled", bool(node), "Scheduled" if node else "Unschedulable",
                           f"on node {node}" if node else message, r.status, now)
    ready = _condition("Ready", phase == "Available", reason, message, r.status, now)
    ended = parse_time(ready["lastTransitionTime"]) or now
    live = tuple(sorted(owners, key=lambda p: p.key))
    return ReservationStatus(r.name, phase, node, reason, message, r.requests,
                             Resources.total(p.requests for p in live), live,
                             annotate=tuple(p.key for p in live if allocated_to.get(p.key) != r.name),
                             delete=phase in TERMINAL_PHASES and now - ended >= gc_grace, final=final,
                             conditions=(scheduled, ready))


def plan_reservations(
    reservations: Sequence[ReservationView],
    states: Mapping[str, NodeState],
    pods: Sequence[PodView],
    current: Mapping[str, Lock],
    taken: set[str],
    budget: int,
    gc_grace: timedelta,
    now: datetime,
) -> tuple[dict[str, Lock], list[ReservationStatus], list[str]]:
    """Locks and statuses for every Reservation (oldest first), at most `budget` nodes."""
    locks: dict[str, Lock] = {}
    statuses: list[ReservationStatus] = []
    notes: list[str] = []
    allocated_to = {p.key: p.annotations.get(keys.RESERVATION_ALLOCATED) for p in pods
                    if p.annotations.get(keys.RESERVATION_ALLOCATED)}
    on_node: dict[str, list[PodView]] = {}
    for pod in pods:
        if pod.node_name:
            on_node.setdefault(pod.node_name, []).append(pod)

    for r in sorted(reservations, key=lambda r: (r.created, r.name)):
        owner = reservation_owner_id(r.name)

        def done(phase: str, reason: str, message: str, node: str = r.node_name, owners: Sequence[PodView] = (),
                 final: bool = False) -> None:
            statuses.append(_status(r, phase, node, reason, message, owners, allocated_to, gc_grace, now, final))
            if phase != r.phase:
                notes.append(f"reservation={r.name} decision={phase} reason={reason}: {message}")

        if r.phase in TERMINAL_PHASES:
            ready = next((c for c in r.status.get("conditions") or () if c.get("type") == "Ready"), {})
            done(r.phase, ready.get("reason") or r.phase, ready.get("message") or "", final=True)
            continue
        ends = expiry(r)
        if ends is not None and now >= ends:
            done("Failed", "Expired", f"expired at {stamp(ends)}")
            continue
        if r.node_name and r.node_name not in states:
            done("Failed", "NodeDeleted", f"node {r.node_name} was deleted")
            continue
        node = r.node_name
        if node:
            bound = [p for p in on_node.get(node, ()) if not p.is_terminal and not p.deleting and is_owner(r, p)]
            bound += [p for p in on_node.get(node, ()) if p.is_terminal and allocated_to.get(p.key) == r.name]
            if r.allocate_once and bound:
                done("Succeeded", "Allocated", f"allocated once, to {bound[0].key}", owners=bound)
                continue
        else:
            node = _place(r, states, current, taken, owner, now)
            if node is None:
                why = "no node matches the template and has allocatable for " + str(r.requests.to_quantities())
                statuses.append(_status(r, "Pending", "", "Unschedulable", why, (), allocated_to, gc_grace, now))
                if r.phase != "Pending" or not r.status.get("conditions"):
                    notes.append(f"reservation={r.name} decision=pending reason={why}")
                continue
            bound = []
        if budget <= 0:
            why = "maxLockedNodePercent leaves no node to lock"
            statuses.append(_status(r, "Pending", "", "Unschedulable", why, (), allocated_to, gc_grace, now))
            notes.append(f"reservation={r.name} decision=pending reason={why}")
            continue
        state = states[node]
        fits_now = state.idle.covers(r.requests) or r.phase == "Available" or bool(bound)
        phase = "Available" if fits_now else "Waiting"
        reason = "Available" if fits_now else "Waiting"
        message = (f"reserved on {node}" if fits_now else
                   f"preAllocation: waiting on {node} for running pods to free {r.requests.to_quantities()}")
        if not fits_now and not r.pre_allocation:
            phase, reason, message = "Available", "Available", f"reserved on {node}"
        kept = current.get(node)
        since = kept.since if kept is not None and kept.owner == owner else now
        locks[node] = Lock(node=node, owner=owner, kind=LockKind.RESERVATION, subject=f"reservation/{r.name}",
                           reason=f"Reservation {r.name} ({'preAllocation' if r.pre_allocation else 'free'})",
                           since=since, expires=ends, reserved=r.requests)
        taken.add(node)
        budget -= 1
        live = [p for p in bound if not p.is_terminal]
        statuses.append(_status(r, phase, node, reason, message, live, allocated_to, gc_grace, now))
        if phase != r.phase or node != r.node_name:
            notes.append(f"reservation={r.name} decision={phase} node={node} reason={message}")
    return locks, statuses, notes


def _place(r: ReservationView, states: Mapping[str, NodeState], current: Mapping[str, Lock], taken: set[str],
           owner: str, now: datetime) -> str | None:
    """The node for a Reservation not placed yet (module docstring), or None."""
    fit_now: list[tuple[int, str]] = []
    later: list[tuple[timedelta, str]] = []
    for name, state in states.items():
        lock = current.get(name)
        if name in taken or (lock is not None and lock.owner != owner) or not schedulable(state.node):
            continue
        if not r.requests.fits_in(state.node.allocatable) or not node_allowed(r, state.node):
            continue
        if state.idle.covers(r.requests):
            fit_now.append((sum(state.idle.values()), name))
        elif r.pre_allocation:
            wait = time_to_fit(state, r.requests, Resources(), now)
            later.append((wait if wait != FOREVER else timedelta.max, name))
    if fit_now:
        return min(fit_now)[1]
    if later:
        return min(later)[1]
    return None
