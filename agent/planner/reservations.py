"""Seed 003, Reservation objects (DESIGN 4.4): place each on a node, hold exactly its resources there with a placeholder
pod, and hand them over to its owners.

A Reservation holds what it reserves, not its node (DESIGN 1, "Reserved amount"; seed "Only owners may use the reserved
resources"). Koordinator's scheduler models a Reservation as a reserved pod in its own cache; on the default
kube-scheduler Reservoir makes that pod real: a **placeholder** (model.Placeholder) in Reservoir's namespace, bound to
the node with `spec.nodeName`, requesting what the Reservation still holds, at the `reservoir-placeholder`
PriorityClass (no ordinary pod can preempt it). kube-scheduler counts those resources as used; every other pod may
use the rest of the node, and several Reservations share a node. Reservoir's own locks are left for the brief moments
a placeholder changes size, and for preAllocation's drain.

Phases, decided in this order each plan (`reservation_turn`):
- Succeeded / Failed stay so; the object is deleted `reservations.gcGracePeriod` after it got there (`stays_ended`;
  seed "Expiration and Cleanup").
- Failed (Expired) once `expires` (exclusive) or creation + `ttl` has passed (ttl 0: never) (`expiry`).
- Failed (NodeDeleted) when its node is gone ("the available and waiting reservations on the node should be marked as
  `Failed`").
- Succeeded (reason `Succeeded`) with `allocateOnce` once an owner handed over through it is bound on its node (or
  ended there): its placeholder goes. An owner that ran on the node before does not count (`holding`).
- Placed (`status.nodeName`): `hold` keeps the placeholder the size of what is left, `allocatable` minus the requests
  of the current owners (each dimension at least 0). Available while that placeholder stands (or nothing is left to
  hold); while it is being created, the phase it had (Pending when just placed); Waiting, with a drain lock on the node
  (Reservoir's `reservation` lock: only the owners tolerate it), while the node has no room for it: with
  preAllocation ("Usage in Pre-allocation": "`Waiting` until the resources are released"), or when a placeholder that
  stood is gone (deleted by hand) and its room was taken meanwhile. Without preAllocation, a Reservation whose room was
  taken before its first placeholder stood is placed again.
- Not placed (`schedule_reservation`, seed "Schedule Reservations"): the node must match the template (the one
  predicate, shared.predicates: nodeName, nodeSelector, required node affinity with matchFields, tolerations other than
  Reservoir's lock), be schedulable and its allocatable cover the request; Reservations together hold at most
  `reservations.maxReservedPercent` of the cluster's allocatable in each dimension. Among the nodes whose idle covers it
  now, **best fit over normalised shares**: the least idle left, each requested dimension as a fraction of the node's
  allocatable, averaged (raw sums would let bytes outvote millicores); with preAllocation, if none fits now, the node
  that fits soonest (capacity.time_to_fit) and the Reservation waits there. Else Pending (Unschedulable).

Handover (`claim`, `hold`): the webhook holds an owner of an Available Reservation at CREATE with the scheduling gate
keys.HANDOVER_GATE. Each plan, the gated pods not yet handed over, oldest first, are matched to the Reservations they
may take ("allocatable for a pod": Available, not unschedulable, the pod an owner, its placement allowing the node as
it will be during the handover, enough free in the reservation by `allocatePolicy`); of those, the seed's
**MostAllocated** rule picks one (the largest share of the reservation's dimensions the pod takes, each as a fraction
of the reservation, averaged; ties to the oldest). The pod is recorded at once among the Reservation's
`status.currentOwners` and the node is locked for the Reservation's owners; once that lock is on the node (read back
in a later plan), the placeholder shrinks, and the writer narrows the pod's required node affinity to the node
(matchFields metadata.name, allowed while gated), adds the lock's toleration and lifts the gate. kube-scheduler binds
it there; no other pod can take the freed resources meanwhile (they do not tolerate the lock; kube-scheduler's
`nominatedNodeName` set by the agent, KEP-5278, would hold only against pods of no higher priority: `make
bench-handover`, README). The lock goes when no
owner is in flight and the placeholder has its size. A pod that matches no Reservation it may take is ungated at once
and scheduled as usual; one whose only Reservations sit on a node locked for someone else waits. A handover that has
not bound its pod within `reservations.handoverTimeout` of the lock is given up.

allocatePolicy (seed's enum; Koordinator's meaning): Default and Aligned let an owner take what is left of the
reservation and the rest from the node's free resources; on the default scheduler a pod only ever draws on one
Reservation, which is all Aligned adds. Restricted: the pod's requests in the reservation's dimensions must fit in
what is left of it, else the pod is not handed over (it is ungated and scheduled as usual, away from the reserved
resources). allocateOnce false: owners come and go; an owner that ends returns what it held (the placeholder grows
back, under the lock, when the node has room, else the lock drains the node until it has).

`status.allocatable` is the template's requests without `pods`; `status.allocated` the current owners' requests, each
dimension at most `allocatable` (a Default owner larger than the reservation takes the rest from the node);
`status.currentOwners` the owners handed over: read back (recorded_owners), it is what says which pods drew on the
Reservation. The `reservoir.sh/reservation-allocated` annotation is written for humans and tools, never read to decide
(anyone who may edit a pod can write it, issue 10).

Issue 18: Koordinator's own Reservations, when the config serves them, go through all of the above beside Reservoir's
(one model, two sources): keyed `scheduling.koordinator.sh/<name>` (ReservationView.key: holdings, owner ids,
placeholders and statuses never mix a name of one group with the other's); a pod may use a Reservation by Koordinator's
rules (shared.reservation_affinity.may_use: owners, `reservation-ignored`, `spec.taints`); among several that can take
a pod, Koordinator's `reservation-order` label comes before MostAllocated (`preference`); owners are annotated with
Koordinator's `reservation-allocated` too. One whose status another field manager last wrote is served by another
scheduler: it is left alone (`left_alone`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from agent.planner.capacity import FOREVER, NodeState, schedulable, time_to_fit
from agent.planner.displacement import may_take
from agent.planner.model import (
    MAX_LOCK_TASKS,
    Handover,
    Lock,
    Placeholder,
    ReservationStatus,
    koordinator_allocated,
)
from agent.planner.policy import PlanContext, Policy, PolicyResult, Statuses, earliest, fair_share, kept_since
from shared import keys
from shared.keys import LockKind
from shared.ownership import NATIVE_PODGROUP, reservation_owner_id
from shared.predicates import DEFAULT_SCHEDULER, Placement, schedulable_on
from shared.reservation_affinity import may_use
from shared.resources import PODS, Resources
from shared.timestamps import parse_time, stamp
from shared.tolerations import lock_toleration
from shared.views import NodeView, PodView, ReservationView, Taint

TERMINAL_PHASES = ("Succeeded", "Failed")
HELD_PHASES = ("Available", "Waiting")


def expiry(reservation: ReservationView) -> datetime | None:
    """Seed 003 `expires`, else creation + `ttl`; None when neither is set (ttl 0)."""
    if reservation.expires is not None:
        return reservation.expires
    return reservation.created + reservation.ttl if reservation.ttl else None


def without_pods(requests: Resources) -> Resources:
    """Requests without the `pods` count pod_requests adds: what a placeholder or a reservation holds."""
    return Resources((name, amount) for name, amount in requests.items() if name != PODS)


def reserved_amount(reservation: ReservationView) -> Resources:
    """Seed 003 `status.allocatable`: the template's requests, without the `pods` count."""
    return without_pods(reservation.requests)


def pod_meta(pod: PodView) -> dict[str, Any]:
    """Seed 003 owner matching and entitlement (shared.entitlement): the metadata they read, from a pod view, and the
    one field of its spec its job is read from (`spec.schedulingGroup`, issue 32)."""
    obj: dict[str, Any] = {"metadata": {
        "name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "labels": dict(pod.labels),
        "annotations": dict(pod.annotations), "ownerReferences": [
            {"apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid, "controller": o.controller}
            for o in pod.owners]}}
    if pod.job[1] == NATIVE_PODGROUP:
        obj["spec"] = {"schedulingGroup": {"podGroupName": pod.job[2]}}
    return obj


def is_owner(reservation: ReservationView, pod: PodView) -> bool:
    """Seed 003 `spec.owners`: the pod matches one of them (object / controller / labelSelector, ORed; Koordinator's
    rules, issue 18), does not ignore Reservations (`reservation-ignored`) and tolerates the Reservation's
    `spec.taints` through its affinity's tolerations (shared.reservation_affinity.may_use)."""
    return may_use(reservation, pod_meta(pod), pod.namespace)


def allocated_to(pod: PodView, r: ReservationView) -> bool:
    """The owner already carries both allocated annotations for `r`: Reservoir's (the Reservation's key) and
    Koordinator's (JSON name and uid, issue 18)."""
    return (pod.annotations.get(keys.RESERVATION_ALLOCATED) == r.key
            and pod.annotations.get(keys.KOORDINATOR_RESERVATION_ALLOCATED) == koordinator_allocated(r.name, r.uid))


def preference(r: ReservationView, score: float) -> tuple[bool, int, float]:
    """Issue 18, Koordinator's `reservation-order` label: among the Reservations allocatable for a pod, the lowest
    non-zero order first, then those without one; within the same order, MostAllocated (the highest score). Lower
    is better."""
    return (r.order == 0, r.order, -score)


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


def as_locked_for(node: NodeView, owner: str) -> NodeView:
    """The node as it is during a handover: Reservoir's lock taint and labels for `owner` in place of any other
    Reservoir lock (what a pod's placement must allow to be handed over there: a pod naming a Reservation requires
    the lock label, shared.entitlement)."""
    taints = tuple(t for t in node.taints if t.key not in keys.LOCK_TAINT_KEYS) + (
        Taint(keys.LOCK, owner, keys.LOCK_EFFECT),)
    labels = {**node.labels, keys.LOCK: owner, keys.LOCK_KIND: LockKind.RESERVATION.value}
    return replace(node, taints=taints, labels=labels)


def shares(amount: Mapping[str, int], of: Mapping[str, int], dimensions: Sequence[str]) -> float:
    """The mean, over `dimensions`, of amount/of (a dimension `of` lacks counts 0): normalised shares, so that no unit
    (millicores, bytes, GPUs) outweighs another."""
    if not dimensions:
        return 0.0
    return sum(amount.get(d, 0) / of[d] for d in dimensions if of.get(d, 0) > 0) / len(dimensions)


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


@dataclass
class Holding:
    """Seed 003: one placed Reservation's owners, as recorded in its `status.currentOwners` and found in the cluster
    (`holding`), and the gated owners claimed for it in this plan."""

    reservation: ReservationView
    bound: list[PodView] = field(default_factory=list)  # recorded, running on its node
    ended_here: list[PodView] = field(default_factory=list)  # recorded, ended (or ending) on its node
    in_flight: list[PodView] = field(default_factory=list)  # recorded, not bound yet: a handover under way
    claimed: list[PodView] = field(default_factory=list)  # gated owners matched to it in this plan

    @property
    def owners(self) -> list[PodView]:
        return self.bound + self.in_flight + self.claimed

    @property
    def used(self) -> bool:
        """allocateOnce: some owner took it already."""
        return bool(self.bound or self.ended_here or self.in_flight or self.claimed)

    def left(self) -> Resources:
        """What the reservation still holds: allocatable minus its owners' requests, each dimension at least 0."""
        alloc = reserved_amount(self.reservation)
        taken = Resources.total(p.requests for p in self.owners)
        return Resources((d, amount - taken.get(d, 0)) for d, amount in alloc.items() if amount > taken.get(d, 0))

    def allocated(self) -> Resources:
        """Seed 003 `status.allocated`: the owners' requests in the reservation's dimensions, each at most its
        allocatable."""
        alloc = reserved_amount(self.reservation)
        taken = Resources.total(p.requests for p in self.owners)
        return Resources((d, min(taken.get(d, 0), amount)) for d, amount in alloc.items() if taken.get(d, 0))


def holding(r: ReservationView, by_uid: Mapping[str, PodView]) -> Holding:
    """Seed 003: the recorded owners of a placed Reservation, sorted by where they are (Holding); those bound on
    another node or gone are no longer its owners."""
    held = Holding(r)
    for uid in sorted(recorded_owners(r)):
        pod = by_uid.get(uid)
        if pod is None:
            continue
        if pod.is_terminal or pod.deleting:
            if pod.node_name == r.node_name:
                held.ended_here.append(pod)
        elif pod.node_name == r.node_name:
            held.bound.append(pod)
        elif not pod.node_name:
            held.in_flight.append(pod)
    return held


@dataclass(frozen=True, kw_only=True)
class Round:
    """Seed 003: what every Reservation's turn reads in one plan, and what the turns before took (`spent`: node ->
    resources placeholders created in this plan will use; `taken`: nodes locked in this plan)."""

    states: Mapping[str, NodeState]
    current: Mapping[str, Lock]
    live_jobs: frozenset[str]
    placeholders: Mapping[str, Sequence[PodView]]  # Reservation owner id -> its placeholder pods standing
    gc_grace: timedelta
    handover_timeout: timedelta
    max_reserved_percent: int
    now: datetime
    spent: dict[str, Resources] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    cluster: Resources = field(default_factory=Resources)  # the schedulable nodes' allocatable, summed

    def idle(self, node: str) -> Resources:
        """The node's idle resources (placeholders counted as used), less what this plan's placeholders will use."""
        idle = self.states[node].idle
        spent = self.spent.get(node)
        return (idle - spent).clamp_negative() if spent else idle

    def spend(self, node: str, amount: Resources) -> None:
        self.spent[node] = self.spent.get(node, Resources()) + amount

    def free_for(self, node: str, owner: str) -> bool:
        """The node may be locked for `owner` now: not taken in this plan, and unlocked or already `owner`'s."""
        if node in self.taken:
            return False
        lock = self.current.get(node)
        return lock is None or lock.owner == owner

    def status(self, r: ReservationView, *, phase: str, node: str, reason: str, message: str,
               held: Holding | None = None, final: bool = False) -> ReservationStatus:
        """Seed 003 status: one Reservation's conditions Scheduled (on its node, or Unschedulable with `message`) and
        Ready (True only when Available, with `reason`); `held`'s owners become current owners and allocated, those
        lacking the allocated annotation (read only so that it is written once) are to be annotated once bound; an
        ended one is due for deletion `gc_grace` after it ended."""
        now = self.now
        scheduled = _condition("Scheduled", bool(node), "Scheduled" if node else "Unschedulable",
                               f"on node {node}" if node else message, r.status, now)
        ready = _condition("Ready", phase == "Available", reason, message, r.status, now)
        ended = parse_time(ready["lastTransitionTime"]) or now
        owners = tuple(sorted(held.owners, key=lambda p: p.key)) if held is not None else ()
        allocated = held.allocated() if held is not None else Resources()
        return ReservationStatus(r.key, phase, node, reason, message, reserved_amount(r), allocated, owners,
                                 annotate=tuple(p.key for p in owners if p.node_name and not allocated_to(p, r)),
                                 object_name=r.name, uid=r.uid, api_version=r.api_version,
                                 delete=phase in TERMINAL_PHASES and now - ended >= self.gc_grace, final=final,
                                 conditions=(scheduled, ready))


@dataclass(frozen=True, kw_only=True)
class Turn:
    """Seed 003: one Reservation's outcome in this plan."""

    status: ReservationStatus
    lock: Lock | None = None
    drains: bool = False  # the lock waits for the node to drain: it counts in maxLockedNodePercent
    placeholders: tuple[Placeholder, ...] = ()
    handovers: tuple[Handover, ...] = ()
    note: str | None = None
    wake_at: datetime | None = None


# issue 29: the most pods on the handover gate one plan decides (each is claimed against every Reservation, and
# each decision is a write); anyone may write the gate on their own pods, so more are taken in turns across
# namespaces (policy.fair_share), the rest in the next plans
MAX_HANDOVER_DECISIONS = 200
HANDOVER_NAMED = 5  # the owners a handover lock's reason names (the rest counted)


def plan_reservations(*, context: PlanContext) -> PolicyResult:
    """Seed 003: placeholders, handovers, locks and statuses for every Reservation (oldest first); drain locks at most
    `context.budget` nodes."""
    config, snapshot = context.config.reservations, context.snapshot
    gated = sorted((p for p in snapshot.index.unbound.values() if p.handover_gated and not p.deleting),
                   key=lambda p: (p.created, p.key))
    deferred: list[str] = []
    if len(gated) > MAX_HANDOVER_DECISIONS:  # anyone may write the gate on their pods: a flood is decided in turns
        deferred.append(f"decision=defer pods={len(gated) - MAX_HANDOVER_DECISIONS} reason=more than "
                        f"{MAX_HANDOVER_DECISIONS} pods on the handover gate: decided fairly across namespaces, the "
                        "rest wait for the next plan")
        gated = fair_share(gated, MAX_HANDOVER_DECISIONS)
    if not (config.enabled and snapshot.reservations):
        why = "Reservations are disabled" if not config.enabled else "no Reservation"
        return PolicyResult(statuses=Statuses(handovers=tuple(ungate(p, why) for p in gated)),
                            notes=tuple(deferred))
    by_uid = snapshot.index.by_uid
    standing: dict[str, list[PodView]] = {}
    for pod in snapshot.pods:
        owner = placeholder_of(pod)
        if owner and not pod.deleting and not pod.is_terminal:
            standing.setdefault(owner, []).append(pod)
    shared = Round(states=context.states, current=context.current, live_jobs=context.live_jobs,
                   placeholders=standing, gc_grace=config.gc_grace_period,
                   handover_timeout=config.handover_timeout, max_reserved_percent=config.max_reserved_percent,
                   now=context.now, taken=set(context.taken),
                   cluster=Resources.total(s.node.allocatable for s in context.states.values() if schedulable(s.node)))
    # issue 18: a Koordinator Reservation whose status another field manager writes is left alone, and said so
    foreign = [r for r in snapshot.reservations.values() if r.second_writer]
    ordered = sorted((r for r in snapshot.reservations.values() if not r.second_writer),
                     key=lambda r: (r.created, r.key))
    reserved = Resources()  # what the Reservations whose turn came hold, summed (maxReservedPercent)
    holdings = {r.key: holding(r, by_uid) for r in ordered
                if r.node_name and r.phase not in TERMINAL_PHASES and r.node_name in shared.states}
    recorded = {p.uid for h in holdings.values() for p in h.bound + h.in_flight}
    handovers, notes = claim([p for p in gated if p.uid not in recorded], holdings, shared)
    notes = deferred + notes
    locks: dict[str, Lock] = {}
    statuses: list[ReservationStatus] = []
    placeholders: list[Placeholder] = []
    wake_at: datetime | None = None
    budget = context.budget
    brief: set[str] = set()  # nodes locked for a handover or a resize: not counted in maxLockedNodePercent
    # the placed first (they hold already), then the rest, each oldest first: what the placed hold is known before any
    # new one is measured against maxReservedPercent
    for r in sorted(ordered, key=lambda r: not r.node_name):
        turn = reservation_turn(r, held=holdings.get(r.key), shared=shared, budget=budget, reserved=reserved)
        if turn.status.node and turn.status.phase not in TERMINAL_PHASES:
            reserved = reserved + reserved_amount(r)
        statuses.append(turn.status)
        placeholders += turn.placeholders
        handovers += turn.handovers
        notes += [turn.note] if turn.note else []
        wake_at = earliest(wake_at, turn.wake_at)
        if turn.lock is not None:
            locks[turn.lock.node] = turn.lock
            shared.taken.add(turn.lock.node)
            if turn.drains:
                budget -= 1
            else:
                brief.add(turn.lock.node)
    for r in sorted(foreign, key=lambda r: r.key):
        statuses.append(left_alone(r))
        notes.append(f"reservation={r.key} decision=left-alone reason=its status is written by {r.second_writer}")
    return PolicyResult(locks=locks, statuses=Statuses(reservations=tuple(statuses), placeholders=tuple(placeholders),
                                                       handovers=tuple(handovers)),
                        notes=tuple(notes), wake_at=wake_at, uncounted=frozenset(brief))


def left_alone(r: ReservationView) -> ReservationStatus:
    """Issue 18, never two writers: a Koordinator Reservation whose last status write was by another field manager
    (Koordinator's own scheduler): its status as it is, marked `left_alone` (the writer writes nothing to it, records
    an Event once and logs why); no placeholder, no handover, no lock."""
    ready: Mapping[str, Any] = next((c for c in r.status.get("conditions") or () if isinstance(c, Mapping)
                                     and c.get("type") == "Ready"), {})
    return ReservationStatus(r.key, r.phase, r.node_name, str(ready.get("reason") or r.phase),
                             str(ready.get("message") or ""), reserved_amount(r), Resources(), final=True,
                             object_name=r.name, uid=r.uid, api_version=r.api_version, left_alone=r.second_writer)


def ungate(pod: PodView, why: str, reservation: str = "") -> Handover:
    """Seed 003: let a gated pod go, to be scheduled as usual."""
    return Handover(namespace=pod.namespace, name=pod.name, uid=pod.uid, reservation=reservation, reason=why)


def claim(gated: Sequence[PodView], holdings: Mapping[str, Holding],
          shared: Round) -> tuple[list[Handover], list[str]]:
    """Seed 003 "Allocate Reserved Resources": each gated pod not handed over yet, oldest first, is claimed by the
    Reservation MostAllocated picks among those allocatable for it (module docstring), recorded in its Holding; a pod
    with none is ungated; one whose only Reservations sit on a node another owner holds locked waits. A pod that
    kube-scheduler would not place once handed over, held by a gate that is not Reservoir's or scheduled by another
    scheduler, is ungated as one with none: a handover waits for its pod to bind, and such a pod would keep the
    Reservation's node locked (a brief lock, outside the caps) for as long as its tenant liked, never found
    Unschedulable, so never given up."""
    handovers: list[Handover] = []
    notes: list[str] = []
    for pod in gated:
        why = (f"scheduled by {pod.scheduler_name!r}, not default-scheduler" if pod.scheduler_name != DEFAULT_SCHEDULER
               else "held by a scheduling gate that is not Reservoir's" if pod.foreign_gates else "")
        if why:
            handovers.append(ungate(pod, f"{why}: not handed over, scheduled as usual"))
            notes.append(f"pod={pod.key} decision=ungate reason={why}")
            continue
        best: tuple[tuple[bool, int, float], float, Holding] | None = None
        busy: list[str] = []
        for held in holdings.values():
            score = allocatable_for(held, pod, shared)
            if score is None:
                continue
            r = held.reservation
            if not shared.free_for(r.node_name, reservation_owner_id(r.key)):
                busy.append(r.key)
            elif best is None or preference(r, score) < best[0]:
                best = (preference(r, score), score, held)
        if best is not None:
            held = best[2]
            held.claimed.append(pod)
            extra = (pod.requests - held.left()).clamp_negative()
            shared.spend(held.reservation.node_name, Resources((d, a) for d, a in extra.items() if d != PODS and a))
            notes.append(f"reservation={held.reservation.key} decision=claim pod={pod.key} "
                         f"node={held.reservation.node_name} reason=MostAllocated {best[1]:.2f}"
                         + (f" order={held.reservation.order}" if held.reservation.order else ""))
        elif not busy:
            handovers.append(ungate(pod, "no Reservation it owns can take it now: scheduled as usual"))
            notes.append(f"pod={pod.key} decision=ungate reason=no Reservation it owns can take it now")
    return handovers, notes


def placement_allows(pod: PodView, r: ReservationView, state: NodeState) -> bool:
    """The pod's placement (its tolerations and the Reservation's lock toleration) allows the Reservation's node as it
    is during the handover (as_locked_for)."""
    owner = reservation_owner_id(r.key)
    placement = Placement.of(node_selector=pod.node_selector, affinity=pod.required_affinity,
                             tolerations=(*pod.tolerations, lock_toleration(owner)))
    return schedulable_on(placement, as_locked_for(state.node, owner), pods_on_node=len(state.pods))


def allocatable_for(held: Holding, pod: PodView, shared: Round) -> float | None:
    """Seed 003: the reservation is allocatable for the pod (Available, schedulable for new pods, the pod an owner
    whose placement allows the node as locked for the reservation, something of it left that the pod requests,
    enough free by allocatePolicy; allocateOnce: not taken yet); the MostAllocated score if so (the mean share of the
    reservation's dimensions the pod takes), else None."""
    r = held.reservation
    if r.phase != "Available" or r.unschedulable or (r.allocate_once and held.used):
        return None
    if not is_owner(r, pod):
        return None
    if not placement_allows(pod, r, shared.states[r.node_name]):
        return None
    left = held.left()
    asked = Resources((d, a) for d, a in pod.requests.items() if d != PODS)
    takes = Resources((d, min(asked.get(d, 0), amount)) for d, amount in left.items() if asked.get(d, 0))
    if not takes:
        return None
    rest = (asked - takes).clamp_negative()
    if r.allocate_policy == "Restricted" and any(asked.get(d, 0) > left.get(d, 0) for d in reserved_amount(r)):
        return None
    if not shared.idle(r.node_name).covers(rest):
        return None
    alloc = reserved_amount(r)
    return shares(takes, alloc, list(alloc))


def reservation_turn(r: ReservationView, *, held: Holding | None, shared: Round, budget: int,
                     reserved: Resources) -> Turn:
    """Seed 003: one Reservation's phase, in the order of the module docstring, its placeholder, its lock and its
    handovers; `reserved`: what the Reservations before it hold (maxReservedPercent, for placing it)."""
    if r.phase in TERMINAL_PHASES:
        return stays_ended(r, shared=shared)
    ends = expiry(r)
    wake = ends if ends is not None and ends > shared.now else None
    if ends is not None and shared.now >= ends:
        return concluded(r, shared=shared, phase="Failed", reason="Expired", message=f"expired at {stamp(ends)}")
    if r.node_name and r.node_name not in shared.states:
        return concluded(r, shared=shared, phase="Failed", reason="NodeDeleted",
                         message=f"node {r.node_name} was deleted")
    if held is not None:
        if r.allocate_once and (held.bound or held.ended_here):
            first = (held.bound + held.ended_here)[0]
            return concluded(r, shared=shared, phase="Succeeded", reason="Succeeded",
                             message=f"allocated once, to {first.key}", held=replace(held, in_flight=[], claimed=[]))
        turn = hold(r, held=held, node=r.node_name, ends=ends, shared=shared, budget=budget)
        if turn is not None:
            return replace(turn, wake_at=earliest(turn.wake_at, wake))
    placed, refused = schedule_reservation(r, shared=shared, reserved=reserved)
    turn = hold(r, held=Holding(r), node=placed, ends=ends, shared=shared, budget=budget) if placed else None
    if turn is None:
        return unschedulable(r, shared=shared, why=refused)
    return replace(turn, wake_at=earliest(turn.wake_at, wake))


def hold(r: ReservationView, *, held: Holding, node: str, ends: datetime | None, shared: Round,
         budget: int) -> Turn | None:
    """Seed 003: hold what the Reservation has left on `node` with its placeholder, and carry its handovers on (module
    docstring). None when it must be placed again: no placeholder stood yet, the node has no room for it, and it
    cannot wait there (no preAllocation)."""
    owner = reservation_owner_id(r.key)
    standing = [p for p in shared.placeholders.get(owner, ()) if p.node_name == node]
    current = shared.current.get(node)
    lock_here = current is not None and current.owner == owner
    note: str | None = None
    # given up: pods let go by the gate that kube-scheduler has found no node for for handoverTimeout (each pod's own
    # PodScheduled condition), and gated ones whose placement no longer allows the node (edited while gated)
    stuck = [p for p in held.in_flight if not p.handover_gated and p.unschedulable_since is not None
             and shared.now >= p.unschedulable_since + shared.handover_timeout]
    barred = [p for p in held.in_flight if p.handover_gated and not placement_allows(p, r, shared.states[node])]
    released = [ungate(p, f"its placement no longer allows node {node}", r.key) for p in barred]
    if stuck or barred:
        note = (f"reservation={r.key} decision=handover-given-up node={node} pods="
                f"{','.join(p.key for p in stuck + barred)} reason=unschedulable there for handoverTimeout, "
                f"or its placement no longer allows the node")
        held = replace(held, in_flight=[p for p in held.in_flight if p not in stuck and p not in barred])
    in_flight = held.in_flight
    left = held.left()
    target = Placeholder(reservation=r.key, reservation_uid=r.uid, owner=owner, node=node, requests=left,
                         object_name=r.name, api_version=r.api_version)
    stands = len(standing) == 1 and standing[0].name == target.name
    wanted: list[Placeholder] = []
    handovers: list[Handover] = []
    drains = False
    room = shared.idle(node) + Resources.total(p.requests for p in standing)
    fits = room.covers(left) if standing else shared.idle(node).covers(left)
    if stands:
        phase, reason, message = "Available", "Available", f"reserved on {node}"
        wanted = [target]
    elif not standing and not left:  # its owners hold all of it: nothing to hold for them
        phase, reason, message = "Available", "Available", f"reserved on {node}, all of it allocated"
    elif not standing and fits:
        wanted = [target]
        phase = r.phase if r.phase in HELD_PHASES else "Pending"
        reason, message = ("Available", f"reserved on {node}") if phase == "Available" else (
            "Placing", f"placeholder being created on {node}")
    elif not standing and (r.pre_allocation or r.phase in HELD_PHASES):
        phase, reason, drains = "Waiting", "Waiting", True
        message = f"waiting on {node} for running pods to free {left.to_quantities()}"
        if r.phase == "Available" or (r.phase == "Waiting" and not r.pre_allocation):
            # it stood and is gone (preempted by a pod of a critical class, or deleted), and its room was taken: the
            # status says so for as long as it waits (without preAllocation nothing else makes it Waiting)
            reason = "PlaceholderLost"
            message = f"its placeholder on {node} is gone (preempted or deleted) and pods took its room: " + message
    elif not standing:
        return None
    elif lock_here and fits:  # a resize (an owner handed over, or returning what it held), under the lock
        wanted = [target] if left else []
        phase, reason, message = "Available", "Available", f"reserved on {node}"
    else:  # keep what stands until the lock is on the node (or, growing back, until the node has room)
        wanted = [Placeholder(reservation=r.key, reservation_uid=r.uid, owner=owner, node=node,
                              requests=without_pods(p.requests), object_name=r.name, api_version=r.api_version)
                  for p in standing]
        phase, reason, message = "Available", "Available", f"reserved on {node}"
        drains = lock_here and not fits and not (held.in_flight or held.claimed)
        if drains:
            message = f"reserved on {node}; waiting for it to free {left.to_quantities()} to hold again"
    if lock_here and not standing and wanted:
        drains = True  # the drain's lock stays until the placeholder it waited for stands
    wants_lock = bool(held.claimed or in_flight or drains or (standing and not stands))
    lock_out: Lock | None = None
    if wants_lock:
        if not shared.free_for(node, owner) or (drains and not lock_here and budget <= 0):
            why = "maxLockedNodePercent leaves no node to lock" if shared.free_for(node, owner) else (
                f"node {node} is locked for another owner")
            note = note or f"reservation={r.key} decision=wait node={node} reason={why}"
            if phase == "Waiting" and not r.node_name:
                return Turn(status=shared.status(r, phase="Pending", node="", reason="Unschedulable", message=why),
                            note=note)
        else:
            handed = sorted(p.key for p in held.claimed + in_flight)
            # the lock names the owners it hands over for `reservoir status` and `why` (MAX_LOCK_TASKS of them: its
            # annotation must stay small however many owners a selector matches), its reason the first few
            tasks = tuple(handed[:MAX_LOCK_TASKS])
            more = f" and {len(handed) - HANDOVER_NAMED} more" if len(handed) > HANDOVER_NAMED else ""
            lock_out = Lock(node=node, owner=owner, kind=LockKind.RESERVATION, subject=f"reservation/{r.key}",
                            reason=(f"Reservation {r.name}: handover of {', '.join(handed[:HANDOVER_NAMED])}{more}"
                                    if tasks else
                                    f"Reservation {r.name}: " + ("preAllocation drain" if phase == "Waiting"
                                                                  else "placeholder resize")),
                            since=kept_since(shared.current, node=node, owner=owner, now=shared.now),
                            expires=expiry(r), reserved=reserved_amount(r), tasks=tasks)
    if lock_here and wanted == ([target] if left else []):
        handovers = [Handover(namespace=p.namespace, name=p.name, uid=p.uid, reservation=r.key, node=node,
                              tolerate=(lock_toleration(owner),), reason=f"handed over Reservation {r.name}")
                     for p in in_flight if p.handover_gated]
    if not standing:
        for p in wanted:
            shared.spend(node, p.requests)
    status = shared.status(r, phase=phase, node=node, reason=reason, message=message, held=held)
    changed = phase != r.phase or node != r.node_name
    wake = earliest(*(p.unschedulable_since + shared.handover_timeout for p in in_flight
                      if p.unschedulable_since is not None and not p.handover_gated))
    return Turn(status=status, lock=lock_out, drains=drains, placeholders=tuple(wanted),
                handovers=tuple(released + handovers),
                note=note or (f"reservation={r.key} decision={phase} node={node} reason={message}" if changed
                              else None), wake_at=wake)


def unschedulable(r: ReservationView, *, shared: Round, why: str = "") -> Turn:
    """Seed 003: "If all nodes are unscheduled for the reservation, the scheduler keeps its status as `Pending` and
    sets `Conditions` with the failure message" (noted when it becomes so)."""
    why = why or "no node matches the template and has allocatable for " + str(reserved_amount(r).to_quantities())
    status = shared.status(r, phase="Pending", node="", reason="Unschedulable", message=why)
    logged = r.phase != "Pending" or not r.status.get("conditions") or r.node_name
    return Turn(status=status, note=f"reservation={r.key} decision=pending reason={why}" if logged else None)


def stays_ended(r: ReservationView, *, shared: Round) -> Turn:
    """Seed 003 "Expiration and Cleanup": Succeeded and Failed are final: the status stays as written when it ended (its
    Ready condition's reason and message), and the object is deleted gcGracePeriod after."""
    ready: Mapping[str, Any] = next((c for c in r.status.get("conditions") or () if c.get("type") == "Ready"), {})
    return concluded(r, shared=shared, phase=r.phase, reason=ready.get("reason") or r.phase,
                     message=ready.get("message") or "", final=True)


def concluded(r: ReservationView, *, shared: Round, phase: str, reason: str, message: str,
              held: Holding | None = None, final: bool = False) -> Turn:
    """Seed 003: a phase decided without a lock or a placeholder (Failed, Succeeded), noted when it changes."""
    status = shared.status(r, phase=phase, node=r.node_name, reason=reason, message=message, held=held, final=final)
    note = f"reservation={r.key} decision={phase} reason={reason}: {message}" if phase != r.phase else None
    return Turn(status=status, note=note)


def within_share(reserved: Resources, request: Resources, shared: Round) -> str | None:
    """`reservations.maxReservedPercent`: None when the placed Reservations (`reserved`) and this one (`request`)
    hold at most that share of the schedulable nodes' allocatable in each of the request's dimensions; else why
    not."""
    cluster = shared.cluster
    for d, amount in request.items():
        if 100 * (reserved.get(d, 0) + amount) > shared.max_reserved_percent * cluster.get(d, 0):
            return (f"maxReservedPercent {shared.max_reserved_percent}: Reservations would hold more than that share "
                    f"of the cluster's {d}")
    return None


def schedule_reservation(r: ReservationView, *, shared: Round, reserved: Resources) -> tuple[str | None, str]:
    """Seed 003 "Schedule Reservations": the node for a Reservation not placed yet (module docstring), or None and
    why not ("" when no node will do: the caller says so)."""
    request = reserved_amount(r)
    refused = within_share(reserved, request, shared)
    if refused is not None:
        return None, refused
    owner = reservation_owner_id(r.key)
    dimensions = list(request)
    fit_now: list[tuple[float, str]] = []
    later: list[tuple[timedelta, str]] = []
    for name, state in shared.states.items():
        if not may_take(LockKind.RESERVATION, shared.current.get(name), owner=owner, live_jobs=shared.live_jobs):
            continue
        if not schedulable(state.node) or not r.requests.fits_in(state.node.allocatable):
            continue
        if not node_allowed(r, state.node) or len(state.pods) >= state.node.allocatable.get(PODS, 0):
            continue
        idle = shared.idle(name)
        if idle.covers(request):
            fit_now.append((shares((idle - request).clamp_negative(), state.node.allocatable, dimensions), name))
        elif r.pre_allocation and name not in shared.taken:
            wait = time_to_fit(state, request, Resources(), shared.now)
            later.append((wait if wait != FOREVER else timedelta.max, name))
    if fit_now:
        return min(fit_now)[1], ""
    if later:
        return min(later)[1], ""
    return None, ""


def placeholder_of(pod: PodView) -> str | None:
    """The Reservation owner id a pod is the placeholder of (label keys.PLACEHOLDER, only in Reservoir's namespace:
    nobody else may create pods there), else None."""
    return pod.labels.get(keys.PLACEHOLDER) if pod.namespace == keys.NAMESPACE else None


RESERVATIONS = Policy(name="reservation", kind=LockKind.RESERVATION, seed="003", run=plan_reservations)
