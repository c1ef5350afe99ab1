"""Seed 003, Reservation objects (DESIGN 4.4): place each on a node, lock it for the Reservation's owners, and
follow its phase.

Phases, decided in this order each plan (`reservation_turn`):
- Succeeded / Failed stay so; the object is deleted `reservations.gcGracePeriod` after it got there
  (`stays_ended`; seed "Expiration and Cleanup": "the scheduler will cleanup them with a custom garbage collection
  period").
- Failed (Expired) once `expires` (exclusive) or creation + `ttl` has passed (ttl 0: never) (`expiry`; "When a
  reservation has been created for a long time exceeding the `TTL` or `Expires`").
- Failed (NodeDeleted) when its node is gone ("When a node is deleted, the available and waiting reservations on
  the node should be marked as `Failed`").
- Succeeded (Allocated) with `allocateOnce` once an owner pod is bound on its node: the node is released
  (`bound_owners`).
- Placed already: Available, or Waiting (preAllocation) until the node's idle covers the request (`hold_node`;
  "Usage in Pre-allocation": "`Waiting` until the resources are released").
- Not placed (`schedule_reservation`, seed "Schedule Reservations"): the node must match the template's nodeName,
  nodeSelector and required node affinity, its taints (other than Reservoir's lock) must be tolerated by the template,
  it must be schedulable, not taken in this plan, open to a Reservation by the displacement table (held by no other
  owner), and its allocatable must cover the request. Among nodes whose idle covers it now, the one with the least
  idle (best fit, keeping big holes open) wins; with preAllocation, if none does, the node that fits soonest
  (capacity.time_to_fit) is taken and the Reservation waits there. Else Pending (Scheduled False, Unschedulable;
  "If all nodes are unscheduled for the reservation, the scheduler keeps its status as `Pending`").

Owner pods bound on the node while it is Available or Waiting are the Reservation's current owners; they get the
`reservoir.sh/reservation-allocated` annotation and their requests make up `status.allocated`.

Whether an ended pod was allocated through a Reservation is decided from what the agent itself recorded: its uid is in
the Reservation's `status.currentOwners` (ReservationStatus.status() writes each owner's uid there). The
`reservoir.sh/reservation-allocated` annotation is written for humans and tools, and read only to know whether it still
has to be written (`annotate`), never to decide: any user who may edit a pod can write it (issue 10, attack 2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agent.planner.capacity import FOREVER, NodeState, schedulable, time_to_fit
from agent.planner.displacement import may_take
from agent.planner.model import Lock, ReservationStatus
from agent.planner.policy import PlanContext, Policy, PolicyResult, Statuses, kept_since
from shared import keys
from shared.keys import LockKind
from shared.matching import reservation_matches
from shared.ownership import reservation_owner_id
from shared.predicates import schedulable_on
from shared.resources import Resources
from shared.timestamps import parse_time, stamp
from shared.views import NodeView, PodView, ReservationView

TERMINAL_PHASES = ("Succeeded", "Failed")


def expiry(reservation: ReservationView) -> datetime | None:
    """Seed 003 `expires`, else creation + `ttl`; None when neither is set (ttl 0)."""
    if reservation.expires is not None:
        return reservation.expires
    return reservation.created + reservation.ttl if reservation.ttl else None


def pod_meta(pod: PodView) -> dict[str, Any]:
    """Seed 003 owner matching and entitlement (shared.entitlement): the metadata they read, from a pod view."""
    return {"metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "labels": dict(pod.labels),
                         "annotations": dict(pod.annotations), "ownerReferences": [
        {"apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid, "controller": o.controller}
        for o in pod.owners]}}


def is_owner(reservation: ReservationView, pod: PodView) -> bool:
    """Seed 003 `spec.owners`: the pod matches one of them (object / controller / labelSelector, ORed)."""
    return reservation_matches(reservation.owners, pod_meta(pod), pod.namespace)


def recorded_owners(reservation: ReservationView) -> frozenset[str]:
    """The uids of the pods the agent recorded as the Reservation's current owners (`status.currentOwners`, written by
    ReservationStatus.status()); entries that are not objects with a string uid are ignored."""
    entries = reservation.status.get("currentOwners")
    if not isinstance(entries, (list, tuple)):
        return frozenset()
    return frozenset(uid for e in entries if isinstance(e, Mapping) and isinstance(uid := e.get("uid"), str) and uid)


def node_allowed(reservation: ReservationView, node: NodeView) -> bool:
    """Seed 003 "Schedule Reservations": the template's nodeName, nodeSelector, required node affinity (kube's
    semantics, matchFields included) and tolerations allow this node: the one predicate, shared.predicates
    (schedulable_on; Reservoir's lock taint skipped, it is the planner's to give; the `pods` count is the caller's
    resource fit, pod_requests counting one pod)."""
    return schedulable_on(reservation.placement, node, pods_on_node=0, ignore_lock=True)


def _condition(kind: str, status: bool, reason: str, message: str, previous: Mapping[str, Any],
               now: datetime) -> dict[str, Any]:
    """Seed 003 `status.conditions`: a condition; its lastTransitionTime is kept while status and reason stay the same.
    """
    old: Mapping[str, Any] = next((c for c in previous.get("conditions") or () if c.get("type") == kind), {})
    value = "True" if status else "False"
    unchanged = old.get("status") == value and old.get("reason") == reason
    since = old.get("lastTransitionTime") if unchanged else None
    return {"type": kind, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since or stamp(now)}


@dataclass(frozen=True, kw_only=True)
class Round:
    """Seed 003: what every Reservation's turn reads in one plan."""

    states: Mapping[str, NodeState]
    current: Mapping[str, Lock]
    live_jobs: frozenset[str]
    on_node: Mapping[str, Sequence[PodView]]  # node -> pods bound there
    gc_grace: timedelta
    now: datetime

    def status(self, r: ReservationView, *, phase: str, node: str, reason: str, message: str,
               owners: Sequence[PodView] = (), final: bool = False) -> ReservationStatus:
        """Seed 003 status: one Reservation's conditions Scheduled (on its node, or Unschedulable with `message`) and
        Ready (True only when Available, with `reason`); `owners` become current owners and allocated, those lacking the
        allocated annotation (read only so that it is written once) are to be annotated; an ended one is due for
        deletion `gc_grace` after it ended."""
        now = self.now
        scheduled = _condition("Scheduled", bool(node), "Scheduled" if node else "Unschedulable",
                               f"on node {node}" if node else message, r.status, now)
        ready = _condition("Ready", phase == "Available", reason, message, r.status, now)
        ended = parse_time(ready["lastTransitionTime"]) or now
        live = tuple(sorted(owners, key=lambda p: p.key))
        return ReservationStatus(r.name, phase, node, reason, message, r.requests,
                                 Resources.total(p.requests for p in live), live,
                                 annotate=tuple(p.key for p in live
                                                if p.annotations.get(keys.RESERVATION_ALLOCATED) != r.name),
                                 delete=phase in TERMINAL_PHASES and now - ended >= self.gc_grace, final=final,
                                 conditions=(scheduled, ready))


@dataclass(frozen=True, kw_only=True)
class Turn:
    """Seed 003: one Reservation's outcome in this plan."""

    status: ReservationStatus
    lock: Lock | None = None
    note: str | None = None


def plan_reservations(*, context: PlanContext) -> PolicyResult:
    """Seed 003: locks and statuses for every Reservation (oldest first), at most `context.budget` nodes."""
    config, snapshot = context.config.reservations, context.snapshot
    if not (config.enabled and snapshot.reservations):
        return PolicyResult()
    on_node: dict[str, list[PodView]] = {}
    for pod in snapshot.pods:
        if pod.node_name:
            on_node.setdefault(pod.node_name, []).append(pod)
    shared = Round(states=context.states, current=context.current, live_jobs=context.live_jobs,
                   on_node=on_node, gc_grace=config.gc_grace_period, now=context.now)
    locks: dict[str, Lock] = {}
    statuses: list[ReservationStatus] = []
    notes: list[str] = []
    taken, budget = set(context.taken), context.budget
    for r in sorted(snapshot.reservations.values(), key=lambda r: (r.created, r.name)):
        turn = reservation_turn(r, shared=shared, taken=taken, budget=budget)
        statuses.append(turn.status)
        notes += [turn.note] if turn.note else []
        if turn.lock is not None:
            locks[turn.lock.node] = turn.lock
            taken.add(turn.lock.node)
            budget -= 1
    return PolicyResult(locks=locks, statuses=Statuses(reservations=tuple(statuses)), notes=tuple(notes))


def reservation_turn(r: ReservationView, *, shared: Round, taken: set[str], budget: int) -> Turn:
    """Seed 003: one Reservation's phase, in the order of the module docstring, and its lock while it holds a node."""
    if r.phase in TERMINAL_PHASES:
        return stays_ended(r, shared=shared)
    ends = expiry(r)
    if ends is not None and shared.now >= ends:
        return concluded(r, shared=shared, phase="Failed", reason="Expired", message=f"expired at {stamp(ends)}")
    if r.node_name and r.node_name not in shared.states:
        return concluded(r, shared=shared, phase="Failed", reason="NodeDeleted",
                         message=f"node {r.node_name} was deleted")
    if r.node_name:
        bound = bound_owners(r, shared=shared)
        if r.allocate_once and bound:
            return concluded(r, shared=shared, phase="Succeeded", reason="Allocated",
                             message=f"allocated once, to {bound[0].key}", owners=bound)
        node = r.node_name
    else:
        placed = schedule_reservation(r, shared=shared, taken=taken)
        if placed is None:
            return unschedulable(r, shared=shared)
        node, bound = placed, []
    if budget <= 0:
        why = "maxLockedNodePercent leaves no node to lock"
        return Turn(status=shared.status(r, phase="Pending", node="", reason="Unschedulable", message=why),
                    note=f"reservation={r.name} decision=pending reason={why}")
    return hold_node(r, node=node, bound=bound, ends=ends, shared=shared)


def unschedulable(r: ReservationView, *, shared: Round) -> Turn:
    """Seed 003: "If all nodes are unscheduled for the reservation, the scheduler keeps its status as `Pending` and
    sets `Conditions` with the failure message" (noted when it becomes so)."""
    why = "no node matches the template and has allocatable for " + str(r.requests.to_quantities())
    status = shared.status(r, phase="Pending", node="", reason="Unschedulable", message=why)
    logged = r.phase != "Pending" or not r.status.get("conditions")
    return Turn(status=status, note=f"reservation={r.name} decision=pending reason={why}" if logged else None)


def stays_ended(r: ReservationView, *, shared: Round) -> Turn:
    """Seed 003 "Expiration and Cleanup": Succeeded and Failed are final: the status stays as written when it ended (its
    Ready condition's reason and message), and the object is deleted gcGracePeriod after."""
    ready: Mapping[str, Any] = next((c for c in r.status.get("conditions") or () if c.get("type") == "Ready"), {})
    return concluded(r, shared=shared, phase=r.phase, reason=ready.get("reason") or r.phase,
                     message=ready.get("message") or "", final=True)


def concluded(r: ReservationView, *, shared: Round, phase: str, reason: str, message: str,
              owners: Sequence[PodView] = (), final: bool = False) -> Turn:
    """Seed 003: a phase decided without a lock (Failed, Succeeded), noted when it changes."""
    status = shared.status(r, phase=phase, node=r.node_name, reason=reason, message=message, owners=owners,
                           final=final)
    note = f"reservation={r.name} decision={phase} reason={reason}: {message}" if phase != r.phase else None
    return Turn(status=status, note=note)


def bound_owners(r: ReservationView, *, shared: Round) -> list[PodView]:
    """Seed 003 allocation: the owner pods bound on the Reservation's node (running or pending there), then the ended
    pods there that were allocated to it: those whose uid the agent recorded in its `status.currentOwners` (never the
    pod's own allocated annotation, which anyone who may edit the pod can write)."""
    here = shared.on_node.get(r.node_name, ())
    bound = [p for p in here if not p.is_terminal and not p.deleting and is_owner(r, p)]
    recorded = recorded_owners(r)
    return bound + [p for p in here if p.is_terminal and p.uid and p.uid in recorded]


def hold_node(r: ReservationView, *, node: str, bound: Sequence[PodView], ends: datetime | None,
              shared: Round) -> Turn:
    """Seed 003: hold the node: Available when the node's idle covers the request now (or it was Available, or an
    owner is bound), else Waiting with preAllocation ("Usage in Pre-allocation"); without preAllocation it is
    Available on the node it was placed on."""
    fits_now = shared.states[node].idle.covers(r.requests) or r.phase == "Available" or bool(bound)
    if fits_now or not r.pre_allocation:
        phase, reason, message = "Available", "Available", f"reserved on {node}"
    else:
        phase, reason = "Waiting", "Waiting"
        message = f"preAllocation: waiting on {node} for running pods to free {r.requests.to_quantities()}"
    owner = reservation_owner_id(r.name)
    lock = Lock(node=node, owner=owner, kind=LockKind.RESERVATION, subject=f"reservation/{r.name}",
                reason=f"Reservation {r.name} ({'preAllocation' if r.pre_allocation else 'free'})",
                since=kept_since(shared.current, node=node, owner=owner, now=shared.now), expires=ends,
                reserved=r.requests)
    live = [p for p in bound if not p.is_terminal]
    status = shared.status(r, phase=phase, node=node, reason=reason, message=message, owners=live)
    changed = phase != r.phase or node != r.node_name
    return Turn(status=status, lock=lock,
                note=f"reservation={r.name} decision={phase} node={node} reason={message}" if changed else None)


def schedule_reservation(r: ReservationView, *, shared: Round, taken: set[str]) -> str | None:
    """Seed 003 "Schedule Reservations": the node for a Reservation not placed yet (module docstring), or None."""
    owner = reservation_owner_id(r.name)
    fit_now: list[tuple[int, str]] = []
    later: list[tuple[timedelta, str]] = []
    for name, state in shared.states.items():
        if name in taken or not may_take(LockKind.RESERVATION, shared.current.get(name), owner=owner,
                                         live_jobs=shared.live_jobs):
            continue
        if not schedulable(state.node):
            continue
        if not r.requests.fits_in(state.node.allocatable) or not node_allowed(r, state.node):
            continue
        if state.idle.covers(r.requests):
            fit_now.append((sum(state.idle.values()), name))
        elif r.pre_allocation:
            wait = time_to_fit(state, r.requests, Resources(), shared.now)
            later.append((wait if wait != FOREVER else timedelta.max, name))
    if fit_now:
        return min(fit_now)[1]
    if later:
        return min(later)[1]
    return None


RESERVATIONS = Policy(name="reservation", kind=LockKind.RESERVATION, seed="003", run=plan_reservations)
