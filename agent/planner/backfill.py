"""Backfill (DESIGN 4.6, beyond the seeds; issue 17): let a pod with a declared runtime use a locked node's idle room
until the lock's owner needs it.

A lock costs capacity. A starvation lock (seed 000) keeps a node's freed resources idle until enough running pods
end for the big task to fit; a window (seed 004) locks its nodes `startReserveAgo` before it opens; a Waiting
Reservation with preAllocation (seed 003) drains its node the same way. A pod whose runtime is known (seed 004
`volcano.sh/maximum-runtime`, its own or its PodGroup's: reserve.maximum_runtime) can use that idle room meanwhile,
as Slurm's backfill scheduler lets short jobs run ahead of a waiting big one.

Needed-by time (`needed_by`), per locked node: the moment from which the lock's owner needs the node:
- a window: its `start` (not `start - startReserveAgo`: the lead time exists only to drain the nodes), or the earliest
  moment one of its pending reserve pods fits on the node, when that comes first;
- a starvation lock or a Waiting Reservation: the earliest moment one of the owner's tasks waiting on the node fits
  there, by the node's release curve (capacity.time_to_fit: pods with a maximum runtime ending, earliest first),
  beside what the owner's tasks that fit now take (`fits_now`); None (unknown) when each waiting task needs a pod
  without a maximum runtime to end first;
- a queue guarantee (seed 002): None. Its queue's pods may arrive at any moment: nothing is backfilled there.

The rule (`backfill_verdict`, the one place it is written): a pod P may run on locked node N when
1. P is not the lock's owner (it would use the lock, not backfill it);
2. P is pending (not bound, not finished, not being deleted, not held for a Reservation's handover);
3. P fits on no unlocked node now (the caller's answer: kube-scheduler would place it there without backfill);
4. P declares a maximum runtime R;
5. N's needed-by time D is known;
6. kube-scheduler's filters let P onto N, the lock aside (shared.predicates.schedulable_on; N schedulable);
7. P's requests fit in N's room now: idle - what the owner's tasks that fit now take - what this plan already
   backfilled onto N;
8. now + held_for(R) + margin <= D, where held_for(R) is the activeDeadlineSeconds P is given (`deadline_seconds`),
   so the kubelet ends P by then.

Why no owner is delayed (tests/unit/test_backfill.py checks it against a brute-force timeline, every owner task
binding at the same second with backfill as without): the owner's tasks that fit now keep their room (clause 7);
before D none of its waiting tasks fits on N even with no backfill (D is the earliest such moment), so the room P
takes is room none of them could use; and by D every backfilled pod has ended (clause 8), so at D the node holds what
it would have held without backfill. A later plan sees the backfilled pods on N with their runtimes: its release curve
counts them ended by D, so its needed-by time is no later than D (earlier, if the pods still waiting fit sooner or
some task bound meanwhile: the same holds from there for those still waiting). The promise is against the expected
start, as Slurm's: pods that end before their maximum runtime may let an owner fit before D without backfill, and a
backfilled pod may take that early chance; with backfill the owner still fits by D.

What the margin covers: that `now` stands for the bind time (the pod binds, and its startTime is set, a little after
the plan that lets it), and that the kubelet, when activeDeadlineSeconds passes, stops the pod within its
terminationGracePeriodSeconds. A margin below those does not keep the promise.

Departures from the letter of issue 17: the owner's need is the list of its pending tasks on the node, not one sum:
with one sum, a smaller task that fits before the whole sum does could be kept waiting by a backfilled pod.
activeDeadlineSeconds is the declared runtime rounded up to a whole second (`deadline_seconds`: a pod is never
stopped before the maximum it declared), and clause 8 reckons with that rounded-up deadline, so rounding costs a
backfill at most a second, never the owner.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from fractions import Fraction
from functools import partial
from typing import NamedTuple

from agent.planner.capacity import FOREVER, NodeState, pod_end, schedulable, shape_id, time_to_fit
from agent.planner.model import (
    MAX_NAMESPACE_UNBOUND_GRANTS,
    MAX_NODE_GRANTS,
    NO_BACKFILL,
    Backfill,
    BackfillPlan,
    BackfillSlot,
    DeadlineCut,
    EstimateMark,
    Lock,
    Release,
    ReservationStatus,
    StartEstimate,
)
from agent.planner.podindex import PodIndex, as_index
from agent.planner.policy import fair_share, merged_marks
from agent.planner.reservations import pod_meta
from agent.planner.reserve import maximum_runtime, pod_group
from shared import keys
from shared.backfill import Grant, Room, grants_text, hold_refusal, opts_in
from shared.config import ReservoirConfig
from shared.entitlement import Grounds, backfill_queue, entitlement
from shared.keys import LockKind
from shared.ownership import reservation_owner_id
from shared.predicates import Placement, schedulable_on
from shared.resources import CPU, EMPTY, MEMORY, PODS, Resources
from shared.timestamps import parse_time, stamp
from shared.tolerations import tolerates_lock
from shared.views import NodeView, PodGroupView, PodView, ReservationView, WorkloadView

SECOND = timedelta(seconds=1)
# the locks backfill serves: those waiting for capacity to free (plan.plan_backfill_of); a queue guarantee's pods may
# arrive at any moment, so nothing is backfilled under it
BACKFILL_KINDS = frozenset((LockKind.JOB, LockKind.WINDOW, LockKind.RESERVATION))
# gated pods decided in one plan, oldest first; the others wait for the next (which comes at once: the writes change
# them). A plan weighs each candidate against every open node and every slot: this bounds what a flood of gated pods
# (anyone may create pods) costs one plan, so it cannot stall the locks of everyone else.
MAX_DECISIONS = 100
# pods past maxGateWait let go in one plan, in turns across namespaces (fair_share): letting go needs no decision,
# but each is a write, and the writer's batch must not be held for minutes by one tenant's flood
MAX_OVERDUE_RELEASES = 1000
# a pod's terminationGracePeriodSeconds as backfill counts it: any int64 is accepted by the API server, and one far
# beyond any needed-by time only refuses the pod; capped so the time arithmetic never overflows (a year)
MAX_GRACE_SECONDS = 365 * 24 * 3600
# a window's pending reserve pods weighed on each of its locked nodes, at most, the oldest (backfill_slots)
MAX_WINDOW_TASKS = 1000
_MICROS = 1_000_000


def deadline_seconds(runtime: timedelta, existing_active_deadline: int | None = None) -> int:
    """The `activeDeadlineSeconds` a backfilled pod is given: its declared maximum runtime rounded up to a whole second
    (at least 1: the API server refuses 0), or the pod's own activeDeadlineSeconds when that is smaller (the kubelet
    then stops it sooner still). ceil(runtime / 1s), exact to the microsecond."""
    micros = runtime // timedelta(microseconds=1)
    declared = max(1, -(-micros // _MICROS))
    if existing_active_deadline is not None and existing_active_deadline >= 1:
        return min(declared, existing_active_deadline)
    return declared


def held_for(runtime: timedelta) -> timedelta:
    """How long a backfilled pod may hold its node at most: the deadline it is given (`deadline_seconds`, ignoring a
    smaller one it may carry: that only ends it sooner)."""
    return deadline_seconds(runtime) * SECOND


def fits_now(state: NodeState, tasks: Sequence[Resources]) -> tuple[Resources, tuple[Resources, ...]]:
    """The owner's pending tasks on the node, split as kube-scheduler would place them now: those the node's idle
    covers, each beside those before it (in the order given; a task that does not fit is skipped for the next), summed;
    and the others, waiting for pods to end."""
    taken = EMPTY
    waiting: list[Resources] = []
    idle = state.idle
    for task in tasks:
        if (idle - taken).covers(task):
            taken = taken + task
        else:
            waiting.append(task)
    return taken, tuple(waiting)


def needed_by(kind: LockKind, state: NodeState, *, now: datetime, waiting: Sequence[Resources] = (),
              taken_now: Resources = EMPTY, start: datetime | None = None) -> datetime | None:
    """The needed-by time of one locked node (module docstring), or None when unknown.

    - WINDOW: `start`, the window's start (None when not given), or sooner when one of the window's pending reserve
      pods (`waiting`) fits on the node before it (a reserve pod binds on its window's node as soon as it fits);
    - JOB (seed 000) and RESERVATION (seed 003, a Waiting one): now + min over `waiting` (the owner's tasks on the
      node that do not fit now, `fits_now`) of time_to_fit(state, task, taken_now, now), `taken_now` being what the
      owner's tasks that fit now take; `now` when nothing waits (the owner takes its room now); None when every
      waiting task needs a pod without a maximum runtime to end first;
    - QUEUE (seed 002): None (its pods may come at any moment)."""
    if kind is LockKind.WINDOW:
        if start is None or not waiting:
            return start
        # a reserve pod already pending binds as soon as it fits, before the window opens: it is not kept waiting
        soonest = min(time_to_fit(state, task, taken_now, now) for task in set(waiting))
        return start if soonest == FOREVER else min(start, now + soonest)
    if kind not in (LockKind.JOB, LockKind.RESERVATION):
        return None
    if not waiting:
        return now
    soonest = min(time_to_fit(state, task, taken_now, now) for task in set(waiting))
    return None if soonest == FOREVER else now + soonest


def backfill_slot(lock: Lock, state: NodeState, *, now: datetime, tasks: Sequence[Resources] = (),
                  start: datetime | None = None, granted: Set[str] = frozenset(), task_keys: tuple[str, ...] = (),
                  unbound: Set[tuple[str, str]] = frozenset()) -> BackfillSlot:
    """The slot of one locked node: `tasks` are the requests of the owner's pending tasks on the node (a starvation
    lock: the tasks it reserved there, Lock.tasks; a Waiting Reservation: its requests; a window: its pending reserve
    pods the node would take now), `start` a window's start. Splits them (`fits_now`) and computes `needed_by`.
    `granted` (the uids of the grants the node keeps: grant_lives), `unbound` (uid and namespace of those whose pods
    are not bound yet) and `task_keys` go with it (BackfillSlot)."""
    taken, waiting = fits_now(state, tasks)
    return BackfillSlot(state=state, owner=lock.owner, kind=lock.kind, taken_now=taken,
                        needed_by=needed_by(lock.kind, state, now=now, waiting=waiting, taken_now=taken, start=start),
                        waiting=len(tasks), backfilled=len(granted), tasks=task_keys, granted=frozenset(granted),
                        unbound=frozenset(unbound))


class Verdict(NamedTuple):
    """backfill_verdict's answer: whether the pod may run on the node, and the clause that decided, in a sentence."""

    allowed: bool
    reason: str


def room(slot: BackfillSlot, backfilled: Sequence[PodView] = ()) -> Resources:
    """Clause 7's room on a locked node: idle - what the owner's tasks that fit now take - the requests of the pods
    backfilled onto it in this plan (negative where short)."""
    return slot.state.idle - slot.taken_now - Resources.total(p.requests for p in backfilled)


def pending_for_backfill(pod: PodView) -> str | None:
    """Clause 2: why the pod is not a pending pod backfill may place, or None when it is."""
    if pod.is_bound:
        return f"it is bound to {pod.node_name} already"
    if pod.is_terminal:
        return f"it has finished ({pod.phase})"
    if pod.deleting:
        return "it is being deleted"
    if pod.handover_gated:
        return "it is held for a Reservation's handover"
    return None


def pod_refusal(pod: PodView, *, runtime: timedelta | None, fits_unlocked: bool) -> str | None:
    """Clauses 2-4, those about the pod alone (the same on every node): why it may not be backfilled anywhere, or
    None."""
    why = pending_for_backfill(pod)
    if why is not None:
        return why
    if fits_unlocked:
        return "it fits on an unlocked node now: kube-scheduler places it without backfill"
    if runtime is None:
        return "it declares no volcano.sh/maximum-runtime (pod or PodGroup): when it ends is unknown"
    return None


def backfill_verdict(pod: PodView, *, runtime: timedelta | None, fits_unlocked: bool, is_owner: bool,
                     slot: BackfillSlot, backfilled: Sequence[PodView] = (), now: datetime,
                     margin: timedelta) -> Verdict:
    """The backfill rule (module docstring, clauses 1-8): may `pod` run on `slot`'s node? `runtime`: its maximum
    runtime (reserve.maximum_runtime: its own, else its PodGroup's); `fits_unlocked`: some unlocked node's idle takes
    it now and kube-scheduler's filters let it on (the caller's answer); `is_owner`: it is the lock's owner (the
    caller's answer, by shared.entitlement); `backfilled`: pods already backfilled onto the node in this plan; bind
    time is taken as `now`."""
    node = slot.node
    if is_owner:
        return Verdict(False, f"it is an owner of the lock on {node} ({slot.owner}): it uses the lock, not backfill")
    why = pod_refusal(pod, runtime=runtime, fits_unlocked=fits_unlocked)
    if why is not None:
        return Verdict(False, why)
    assert runtime is not None  # clause 4
    deadline = slot.needed_by
    if deadline is None:
        return Verdict(False, f"the needed-by time of {node} is unknown: a pod without a maximum runtime must end "
                              f"before the owner {slot.owner} fits there")
    state = slot.state
    if not schedulable(state.node) or not schedulable_on(pod.placement, state.node,
                                                         pods_on_node=len(state.pods) + len(backfilled),
                                                         ignore_lock=True):
        return Verdict(False, f"kube-scheduler would not place it on {node} (cordoned, not Ready, control-plane, or "
                              f"its nodeSelector, affinity or tolerations, or the pod count)")
    # the grants the node keeps after this plan besides the pod's own (a pod granted before and let go gated is a
    # candidate again: its grant is replaced, not added)
    held = len((slot.granted - {pod.uid}) | {p.uid for p in backfilled})
    if held >= MAX_NODE_GRANTS:  # a bound of this implementation, not a clause of the rule: the annotation's size
        return Verdict(False, f"{node} holds {held} backfill grants, the most one node records (MAX_NODE_GRANTS): "
                              f"no more until some of them end")
    # pods granted and not bound yet, of the pod's namespace: those of earlier plans and this plan's
    mine = ({uid for uid, namespace in slot.unbound if namespace == pod.namespace}
            | {p.uid for p in backfilled if p.namespace == pod.namespace}) - {pod.uid}
    if len(mine) >= MAX_NAMESPACE_UNBOUND_GRANTS:
        return Verdict(False, f"{node} holds {len(mine)} backfill grants of namespace {pod.namespace}'s pods not bound "
                              f"yet, the most one namespace holds on a node (MAX_NAMESPACE_UNBOUND_GRANTS): no more "
                              f"until some of them bind")
    left = room(slot, backfilled)
    if not left.covers(pod.requests):
        short = {name: amount - left[name] for name, amount in pod.requests.items() if left[name] < amount}
        return Verdict(False, f"it does not fit the room on {node} now (idle, less what the owner's tasks that fit now "
                              f"and this plan's backfills take): short of {Resources(short).to_quantities()}")
    ends = now + held_for(runtime) + margin
    if ends > deadline:
        return Verdict(False, f"it would end at {stamp(ends)} (runtime {seconds(runtime)} + margin {seconds(margin)}),"
                              f" after {node} is needed at {stamp(deadline)}")
    return Verdict(True, f"it ends at {stamp(ends)} (runtime {seconds(runtime)} + margin {seconds(margin)}), by "
                         f"{stamp(deadline)} when {node} is needed")


def seconds(span: timedelta) -> str:
    """`90s`, `1.5s`: a span in one token."""
    return f"{span.total_seconds():g}s"


@dataclass(frozen=True)
class Candidate:
    """A pending pod backfill may place, with what the caller knows of it: its maximum runtime
    (reserve.maximum_runtime), whether it fits on an unlocked node now, and the owner ids of the locks it is an owner
    of (shared.entitlement)."""

    pod: PodView
    runtime: timedelta | None
    fits_unlocked: bool = False
    owns: Set[str] = frozenset()
    # added to the margin for this pod: its terminationGracePeriodSeconds (the kubelet may take that long to stop it)
    grace: timedelta = timedelta(0)


@dataclass(frozen=True)
class Backfills:
    """choose_backfills' answer: the pods placed (in the order they were chosen), and why each other candidate was
    not (pod "namespace/name" -> reason)."""

    placed: tuple[Backfill, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)

    @property
    def nodes(self) -> dict[str, str]:
        """pod "namespace/name" -> node."""
        return {b.pod.key: b.node for b in self.placed}


def slack(left: Resources, slot: BackfillSlot, requests: Resources) -> Fraction:
    """Best fit's measure: the room a pod leaves on the node, as shares of the node's allocatable summed over the
    dimensions the pod asks for (`pods` aside), exact."""
    allocatable = slot.state.node.allocatable
    return sum((Fraction(left[name], allocatable[name]) for name in requests if name != PODS and allocatable[name]),
               Fraction(0))


def choose_backfills(candidates: Sequence[Candidate], slots: Sequence[BackfillSlot], *, now: datetime,
                     margin: timedelta, already: Mapping[str, Sequence[PodView]] | None = None) -> Backfills:
    """The backfills of one plan: the candidates oldest first (creation, then namespace/name), each onto the slot
    the rule allows (backfill_verdict, with `margin` plus the candidate's `grace`) where it leaves the least slack
    (best fit: `slack`, then the least time between its end and the node's needed-by time, then the node's name),
    counting the room earlier candidates took in this call and the pods of `already` (node -> pods granted in earlier
    plans and not bound yet: the node's state does not count them). Deterministic: the same inputs give the same
    answer whatever their order."""
    ordered = sorted(candidates, key=lambda c: (c.pod.created, c.pod.key))
    by_node = sorted(slots, key=lambda s: s.node)
    taken: dict[str, list[PodView]] = {s.node: list((already or {}).get(s.node, ())) for s in by_node}
    placed: list[Backfill] = []
    refused: dict[str, str] = {}
    for candidate in ordered:
        pod = candidate.pod
        best: tuple[tuple[Fraction, timedelta, str], BackfillSlot, Verdict] | None = None
        reasons: dict[str, str] = {}  # node -> why not there
        pod_margin = margin + candidate.grace
        alone = pod_refusal(pod, runtime=candidate.runtime, fits_unlocked=candidate.fits_unlocked)
        if alone is not None:  # issue 34: no slot can take it; only the slots it owns say something else (clause 1)
            reasons = {slot.node: backfill_verdict(pod, runtime=candidate.runtime, is_owner=True, slot=slot,
                                                   fits_unlocked=candidate.fits_unlocked, now=now,
                                                   margin=pod_margin).reason
                       for slot in by_node if slot.owner in candidate.owns}
            refused[pod.key] = refusal({slot.node: alone for slot in by_node} | reasons) if reasons else (
                alone if by_node else refusal({}))
            continue
        for slot in by_node:
            verdict = backfill_verdict(pod, runtime=candidate.runtime, fits_unlocked=candidate.fits_unlocked,
                                       is_owner=slot.owner in candidate.owns, slot=slot, backfilled=taken[slot.node],
                                       now=now, margin=pod_margin)
            if not verdict.allowed:
                reasons[slot.node] = verdict.reason
                continue
            assert candidate.runtime is not None and slot.needed_by is not None  # clauses 4 and 5
            ends = now + held_for(candidate.runtime) + pod_margin
            key = (slack(room(slot, taken[slot.node]) - pod.requests, slot, pod.requests), slot.needed_by - ends,
                   slot.node)
            if best is None or key < best[0]:
                best = (key, slot, verdict)
        if best is None:
            refused[pod.key] = refusal(reasons)
            continue
        _, slot, verdict = best
        assert candidate.runtime is not None and slot.needed_by is not None
        taken[slot.node].append(pod)
        placed.append(Backfill(pod=pod, node=slot.node, owner=slot.owner,
                               ends=now + held_for(candidate.runtime) + pod_margin, needed_by=slot.needed_by,
                               reason=verdict.reason,
                               deadline=deadline_seconds(candidate.runtime, pod.active_deadline)))
    return Backfills(placed=tuple(placed), refused=refused)


def refusal(reasons: Mapping[str, str]) -> str:
    """Why a candidate went nowhere, in one line: the reason once when every node gave it (a clause about the pod
    itself), else each node's."""
    if not reasons:
        return "no locked node to backfill"
    distinct = set(reasons.values())
    if len(distinct) == 1:
        return distinct.pop()
    return "; ".join(f"{node}: {reason}" for node, reason in reasons.items())


# --- one plan's backfill: the candidates, the slots, the gates lifted and the grants recorded ---


def gated_pods(pods: Iterable[PodView]) -> list[PodView]:
    """The pods held on the backfill gate and still waiting: not bound, not finished, not being deleted."""
    return [p for p in pods if p.backfill_gated and not p.node_name and not p.is_terminal and not p.deleting]


def plan_backfill(*, pods: PodIndex | Sequence[PodView], nodes: Mapping[str, NodeView], states: Mapping[str, NodeState],
                  locks: Mapping[str, Lock], config: ReservoirConfig, now: datetime,
                  podgroups: Mapping[tuple[str, str], PodGroupView], grounds: Grounds,
                  slots: Sequence[BackfillSlot] = (), already: Mapping[str, Sequence[PodView]] | None = None,
                  workloads: Mapping[tuple[str, str, str], WorkloadView] | None = None) -> BackfillPlan:
    """One plan's backfill (module docstring). Every gated pod (MAX_DECISIONS of them at most, taken in turns across
    namespaces: fair_share; every one past maxGateWait besides, let go unchanged) is decided now, never
    held for a later slot: let onto a locked node when the rule allows one (choose_backfills), else let go unchanged,
    with the reason. `slots` and `already` are backfill_slots' answer (the locks already on their nodes waiting for
    capacity, and the pods granted there not bound yet); the start estimates come from the same slots. A pod gated
    longer than `backfill.maxGateWait` is let go unchanged. Grants (shared.backfill) are kept while their pod lives
    and added for each pod placed. `pods`: the snapshot's index (podindex.PodIndex), or the pods to index."""
    index = as_index(pods)
    estimates = start_estimates(slots, locks)
    marks_of_estimates = estimate_marks(estimates, index.pods, podgroups, now, workloads or {})
    gated = sorted(gated_pods(index.unbound.values()), key=lambda p: (p.created, p.key))
    by_uid = index.by_uid
    rooms = room_marks(nodes, slots, already or {}, margin=config.backfill.margin, now=now,
                       enabled=config.backfill.enabled and not config.dry_run)
    marks = merged_marks(grant_marks(nodes, by_uid, (), now, locks), rooms)

    def spared(pod: PodView, owner: str) -> bool:
        """Not a pod narrowing could have let onto `owner`'s lock: it never opted into backfill (its own annotation or
        its PodGroup's), or it may use the owner's locks by its own rights."""
        group = pod_group(pod, podgroups)
        return not opts_in(pod.annotations, group.annotations if group else {}) or entitlement(
            pod_meta(pod), pod.namespace, grounds, best_effort=pod.best_effort).allows(owner)

    cuts = deadline_cuts(nodes, by_uid, locks, on_node=index.on_node, spared=spared)
    if not gated:
        return (BackfillPlan(marks=marks, slots=tuple(slots), estimates=estimates, estimate_marks=marks_of_estimates,
                             cuts=cuts)
                if marks or estimates or cuts else NO_BACKFILL)
    settings = config.backfill
    released: list[Release] = []
    notes: list[str] = []
    candidates: list[Candidate] = []

    def release(pod: PodView, why: str) -> None:
        released.append(Release(pod.namespace, pod.name, pod.uid, why))
        notes.append(f"pod={pod.key} decision=release reason={why}")

    # every pod past maxGateWait goes, whatever its rank: letting go costs nothing to decide, and no tenant's pods,
    # however many and however old, keep another's on the gate past the wait the config promises
    overdue = [pod for pod in gated if now - pod.created > settings.max_gate_wait]
    if len(overdue) > MAX_OVERDUE_RELEASES:  # each is a write: a flood of them (a tenant can write the gate itself)
        notes.append(f"decision=defer pods={len(overdue) - MAX_OVERDUE_RELEASES} reason=more than "
                     f"{MAX_OVERDUE_RELEASES} pods past backfill.maxGateWait: the rest are let go in the next plan")
    for pod in fair_share(overdue, MAX_OVERDUE_RELEASES):
        release(pod, f"held on the gate {seconds(now - pod.created)}, over backfill.maxGateWait "
                     f"{seconds(settings.max_gate_wait)}")
    gated = [pod for pod in gated if now - pod.created <= settings.max_gate_wait]
    if len(gated) > MAX_DECISIONS:
        notes.append(f"decision=defer pods={len(gated) - MAX_DECISIONS} reason=more than {MAX_DECISIONS} pods on the "
                     "backfill gate: decided fairly across namespaces, the rest wait for the next plan")
        gated = fair_share(gated, MAX_DECISIONS)

    for pod in gated:
        group = pod_group(pod, podgroups)
        why = hold_refusal(pod.annotations, group.annotations if group is not None else {}, namespace=pod.namespace,
                           queue=backfill_queue(pod, grounds), config=settings, scheduler=pod.scheduler_name)
        if why is not None:
            release(pod, why or f"it does not opt in ({keys.BACKFILL} is not \"true\" on it or its PodGroup)")
        elif config.dry_run:
            release(pod, "dryRun")
        elif pod.handover_gated:
            release(pod, "it is held for a Reservation's handover, which places it")
        elif pod.other_gates:
            release(pod, "it carries other scheduling gates: it could bind long after its slot, past its "
                         "needed-by time")
        else:
            rights = entitlement(pod_meta(pod), pod.namespace, grounds, best_effort=pod.best_effort)
            owns = frozenset(lock.owner for lock in locks.values()) if rights.every_lock else frozenset(rights.owners)
            candidates.append(Candidate(pod, maximum_runtime(pod, podgroups), owns=owns,
                                        grace=min(pod.termination_grace, MAX_GRACE_SECONDS) * SECOND))
    if not candidates:
        return BackfillPlan(released=tuple(released), marks=marks, slots=tuple(slots), notes=tuple(notes),
                            estimates=estimates, estimate_marks=marks_of_estimates, cuts=cuts)

    candidates = open_fits(candidates, states, locks)
    chosen = choose_backfills(candidates, slots, now=now, margin=settings.margin, already=already or {})
    placed_keys = {b.pod.key for b in chosen.placed}
    for candidate in candidates:
        if candidate.pod.key not in placed_keys:
            release(candidate.pod, chosen.refused.get(candidate.pod.key, "no locked node to backfill"))
    for b in chosen.placed:
        notes.append(f"pod={b.pod.key} decision=backfill node={b.node} owner={b.owner} deadline={b.deadline}s "
                     f"reason={b.reason}")
    return BackfillPlan(placed=chosen.placed, released=tuple(released),
                        marks=merged_marks(grant_marks(nodes, by_uid, chosen.placed, now, locks), rooms),
                        slots=tuple(slots), notes=tuple(notes),
                        estimates=estimates, estimate_marks=marks_of_estimates, cuts=cuts)


def fits_idle(state: NodeState, pod: PodView, placement: Placement, kept: str) -> bool:
    """Clause 3 on one node with nothing taken: its idle covers the pod and kube-scheduler's filters let it on, the
    lock aside; the filters' answer remembered by the node state under `kept` ("open" and the pod's shape_id; the
    idle is the state's own, so it is compared afresh, which costs less than the lookup)."""
    return state.idle.covers(pod.requests) and state.remembered(kept, lambda: schedulable_on(
        placement, state.node, pods_on_node=len(state.pods), ignore_lock=True))


# resources every pod or node names: the nodes with room for them are most nodes, an index would pass over few
_EVERYWHERE = frozenset((CPU, MEMORY, PODS))


class OpenNodes:
    """The nodes open to backfill's clause 3 (schedulable), by name, and per extended resource (a GPU: any resource
    but cpu, memory and pods) the nodes with some of it idle, by that idle amount: made once per plan, each resource's
    column at its first ask. `covering(requests)` is every open node whose idle may cover the requests, by name: those
    with enough idle of the request's scarcest extended resource, found by bisection; all of them when it asks for
    none. The callers check the rest (fits_idle): the answer is the walk over every node's, in less time where most
    nodes have none of a GPU idle (a busy GPU cluster: `reservoir simulate` at 5,000 nodes spent most of its gate
    passes walking every node for each pod shape gated)."""

    def __init__(self, states: Mapping[str, NodeState]) -> None:
        self.states = states
        self.names = sorted(n for n, s in states.items() if schedulable(s.node))
        self.columns: dict[str, tuple[list[int], list[int]]] = {}

    def column(self, resource: str) -> tuple[list[int], list[int]]:
        """For `resource`: the open nodes with some of it idle as (minus their idle amounts, ascending; their
        positions in `names`, in the same order)."""
        found = self.columns.get(resource)
        if found is None:
            states = self.states
            rows = sorted((-amount, position) for position, name in enumerate(self.names)
                          if (amount := states[name].idle[resource]) > 0)
            found = self.columns[resource] = ([a for a, _ in rows], [p for _, p in rows])
        return found

    def covering(self, requests: Resources) -> Sequence[str]:
        best: list[int] | None = None
        for resource, amount in requests.items():
            if resource in _EVERYWHERE or amount <= 0:
                continue
            amounts, positions = self.column(resource)
            enough = positions[:bisect_right(amounts, -amount)]
            if best is None or len(enough) < len(best):
                best = enough
        if best is None:
            return self.names
        names = self.names
        return [names[p] for p in sorted(best)]


def _fits_idle_at(states: Mapping[str, NodeState], pod: PodView, placement: Placement, kept: str, name: str) -> bool:
    return fits_idle(states[name], pod, placement, kept)


class ShapeFits:
    """The nodes of `nodes` (in their order) for which `fits` holds, found as far as anyone has iterated: each
    iteration yields those found, then goes on checking the rest, keeping what it finds for the next."""

    def __init__(self, nodes: Sequence[str], fits: Callable[[str], bool]) -> None:
        self.found: list[str] = []
        self.nodes, self.fits, self.checked = nodes, fits, 0

    def __iter__(self) -> Iterator[str]:
        at = 0
        while True:
            if at < len(self.found):
                yield self.found[at]
                at += 1
            elif self.checked < len(self.nodes):
                name = self.nodes[self.checked]
                self.checked += 1
                if self.fits(name):
                    self.found.append(name)
            else:
                return


def open_fits(candidates: Sequence[Candidate], states: Mapping[str, NodeState],
              locks: Mapping[str, Lock]) -> list[Candidate]:
    """Clause 3's answer for each candidate, oldest first: it fits now on a node open to it (not locked in this plan,
    or locked for an owner it may use), schedulable, kube-scheduler's filters letting it on (the lock aside), in the
    idle room the candidates before it have not taken (first fit, by node name; their share of `pods` too).

    For each pod shape, the open nodes it fits with nothing taken (ShapeFits) are found once per plan, as far as its
    candidates walk: from OpenNodes.covering (only the nodes with enough of the GPUs or other extended resources it
    asks for idle), by name, a candidate stopping at its first fit; the filters' answer remembered by each node state
    while it lives (issue 34: capacity.NodeState.ranks). A node no candidate took from is a fit without another check.
    A node the shape does not fit with nothing taken cannot fit it with some taken: the answer is the full walk's, for
    requests of 0 or more (the API server refuses negative quantities; a negative one would count in `used` as room
    given back)."""
    used: dict[str, Resources] = {}
    out = []
    open_nodes = OpenNodes(states)
    fitting: dict[str, ShapeFits] = {}  # by shape id
    for candidate in sorted(candidates, key=lambda c: (c.pod.created, c.pod.key)):
        pod = candidate.pod
        placement = pod.placement
        kept = "open" + shape_id(pod)
        names = fitting.get(kept)
        if names is None:
            names = fitting[kept] = ShapeFits(open_nodes.covering(pod.requests),
                                              partial(_fits_idle_at, states, pod, placement, kept))
        fits = None
        for name in names:
            lock = locks.get(name)
            if lock is not None and lock.owner not in candidate.owns:
                continue
            state = states[name]
            taken = used.get(name)
            if taken is None:
                fits = name
                break
            if not (state.idle - taken).covers(pod.requests):
                continue
            if schedulable_on(placement, state.node, pods_on_node=len(state.pods) + taken[PODS], ignore_lock=True):
                fits = name
                break
        if fits is not None:
            used[fits] = used.get(fits, EMPTY) + pod.requests  # its requests count its one `pods` already
        out.append(replace(candidate, fits_unlocked=fits is not None))
    return out


def backfill_slots(*, pods: PodIndex | Sequence[PodView], states: Mapping[str, NodeState], locks: Mapping[str, Lock],
                   current: Mapping[str, Lock], now: datetime,
                   window_starts: Mapping[str, datetime], window_tasks: Mapping[str, Sequence[PodView]],
                   waiting_reservations: Set[str]) -> tuple[list[BackfillSlot], dict[str, list[PodView]]]:
    """The slots (plan_backfill, start_estimates) and, per slot's node, the pods granted there and not bound yet.
    Slots are the planned locks already on their nodes (`current`, same owner) of a starvation job (its tasks:
    Lock.tasks still pending), a window (`window_starts` and `window_tasks`: owner id -> its start and its pending
    reserve pods) or a Waiting Reservation (`waiting_reservations`: their owner ids; its task: the reserved amount).

    A window's tasks are its oldest MAX_WINDOW_TASKS pending reserve pods: anyone may make a pod a reserve pod of a
    window open to its namespace, and every locked node of the window weighs every task at every plan. Departure:
    beyond that many pending reserve pods, the newer ones do not move the needed-by time (a pod pending for a window
    with a thousand others before it waits for those first)."""
    index = as_index(pods)
    by_key, by_uid = index.pods, index.by_uid
    slots = []
    already: dict[str, list[PodView]] = {}
    # a window's tasks and their keys, the same on each of its nodes: taken once, one tuple shared by its slots
    windows: dict[str, tuple[list[PodView], tuple[str, ...]]] = {}
    for name, lock in sorted(locks.items()):
        held = current.get(name)
        state = states.get(name)
        if held is None or held.owner != lock.owner or state is None:
            continue  # not on the node yet: nothing to backfill under it
        start = None
        task_pods: list[PodView] = []
        task_keys: tuple[str, ...] = ()
        if lock.kind is LockKind.JOB:
            task_pods = [p for k in lock.tasks if (p := by_key.get(k)) is not None and waiting_task(p)]
            task_keys = tuple(p.key for p in task_pods)
            tasks = [p.requests for p in task_pods]
        elif lock.kind is LockKind.WINDOW and lock.owner in window_starts:
            start = window_starts[lock.owner]
            if lock.owner not in windows:
                oldest = sorted(window_tasks.get(lock.owner, ()), key=lambda p: (p.created, p.key))[:MAX_WINDOW_TASKS]
                windows[lock.owner] = (oldest, tuple(p.key for p in oldest))
            task_pods, task_keys = windows[lock.owner]
            tasks = [p.requests for p in task_pods]
        elif lock.kind is LockKind.RESERVATION and lock.owner in waiting_reservations and not lock.tasks:
            tasks = [lock.reserved]
        else:
            continue
        live = [(p, grant) for uid, grant in state.node.backfill_grants.items()
                if grant_lives(p := by_uid.get(uid), grant, now, node=name, owner=lock.owner) and p is not None]
        slots.append(backfill_slot(lock, state, now=now, tasks=tasks, start=start,
                                   granted={p.uid for p, _ in live}, task_keys=task_keys,
                                   unbound={(p.uid, p.namespace) for p, _ in live if not p.node_name}))
        # granted in an earlier plan, narrowed and let go, not bound yet (one still gated is a candidate again), until
        # its grant's end: one that binds later is cut to end at once (deadline_cuts), and one kube-scheduler never
        # binds (a filter Reservoir does not model: a host port taken, pod anti-affinity) holds no room for ever
        pending = [p for p, grant in live if waiting_task(p) and not p.backfill_gated and now <= grant.until]
        if pending:
            already[name] = pending
    return slots, already


def unknown_start(state: NodeState) -> str:
    """Why a node's needed-by time is unknown, as published: the pods on it without a maximum runtime (one of them
    must end first, and nothing says when)."""
    count = sum(1 for p in state.pods if pod_end(p, state.node.backfill_grants) is None)
    return f"{UNKNOWN}{count} pod{'' if count == 1 else 's'} without a maximum runtime{ON_NODE}{state.node.name}"


UNKNOWN, ON_NODE = "unknown: ", " on node "  # unknown_start's text, as moved reads it back


def start_estimates(slots: Sequence[BackfillSlot], locks: Mapping[str, Lock]) -> tuple[StartEstimate, ...]:
    """Issue 17, every waiting owner's expected start, from the slots: a starvation job or a Waiting Reservation with
    a task pending on its locked nodes, and a window (its start, or sooner: needed_by). The owner starts when the
    last of its locked nodes is ready for it (a gang's tasks bind together; a Reservation has one node): the latest
    needed-by time over its slots; unknown (with the first such node's reason, unknown_start) when any is. Sorted by
    owner.

    Departure from the letter of issue 17: per owner, not per pod. A starvation job's pods are placed together by its
    PodGroup (seed 000's minMember), so one time is what its user waits for."""
    by_owner: dict[str, list[BackfillSlot]] = {}
    for slot in slots:
        if slot.waiting or slot.kind is LockKind.WINDOW:
            by_owner.setdefault(slot.owner, []).append(slot)
    out = []
    for owner, own in sorted(by_owner.items()):
        unknown = next((s for s in own if s.needed_by is None), None)
        lock = locks[own[0].node]
        at = None if unknown is not None else max(s.needed_by for s in own if s.needed_by is not None)
        out.append(StartEstimate(owner=owner, kind=lock.kind, subject=lock.subject, at=at,
                                 unknown=unknown_start(unknown.state) if unknown is not None else "",
                                 nodes=tuple(sorted(s.node for s in own)),
                                 backfilled=sum(s.backfilled for s in own),
                                 tasks=tuple(sorted({k for t in {id(s.tasks): s.tasks for s in own}.values()
                                                     for k in t}))))
    return tuple(out)


# an estimate written (keys.EXPECTED_START) is rewritten only when it moves by this much or more: one that tracks `now`
# (a pod running past its maximum runtime is counted as ending now) is not written again at every plan
ESTIMATE_TOLERANCE = 5 * SECOND
# an owner's pending pods that carry its estimate when it has no PodGroup, at most (the first, by key); the others
# read it from `reservoir status`
MAX_ESTIMATE_TARGETS = 20


def moved(have: str | None, want: str, now: datetime) -> bool:
    """Whether the written estimate `have` must be replaced by `want`. Not when they are the same text; nor two times
    less than ESTIMATE_TOLERANCE apart; nor two times both at or before now + ESTIMATE_TOLERANCE (both say "now": an
    open window's start, a pod running past its maximum runtime; rewriting "now" at every plan would wake every plan);
    nor two unknowns naming the same node (the count of pods without a maximum runtime there moves as pods come and
    go, which anyone may make happen: the written count stays, `reservoir status` has the live one). Anything else
    is replaced, and so is what a tenant wrote there that is not a time with a zone."""
    if have == want:
        return False
    if have is not None and have.startswith(UNKNOWN) and want.startswith(UNKNOWN):
        return have.rpartition(ON_NODE)[2] != want.rpartition(ON_NODE)[2]
    try:
        old, new = parse_time(have), parse_time(want)
        if old is None or new is None:
            return True
        due = now + ESTIMATE_TOLERANCE
        return abs(old - new) >= ESTIMATE_TOLERANCE and not (old <= due and new <= due)
    except (ValueError, TypeError, OverflowError):
        return True


def estimate_marks(estimates: Sequence[StartEstimate], pods: Mapping[str, PodView],
                   podgroups: Mapping[tuple[str, str], PodGroupView], now: datetime,
                   workloads: Mapping[tuple[str, str, str], WorkloadView] | None = None) -> tuple[EstimateMark, ...]:
    """Where each owner's estimate is written (keys.EXPECTED_START), only where what is there must change (moved): a
    starvation job's or a window's pending pods (the first MAX_ESTIMATE_TARGETS of the estimate's tasks), each through
    its PodGroup when it has one, or its Kueue Workload (issue 32: where Kueue's users look; an annotation, not a
    condition: Kueue's server-side applies of a Workload's status carry every condition it read, so one of ours would
    become Kueue's too), else itself. A time is never written in the past (an estimate that says "now"). A
    Reservation's goes at the end of its Ready message instead (with_expected_starts: the agent writes only its
    status). One object named by several owners (a reserve pod of two windows, a PodGroup holding a starving job's
    tasks and a window's reserve pods) carries one text, the soonest start (a known one before an unknown): each owner
    writing its own would rewrite it back and forth at every plan. The writer sends at most
    agent.writer.MAX_ESTIMATE_WRITES of them per plan."""
    chosen: dict[tuple[str, str, str], tuple[tuple[bool, datetime], str, str | None]] = {}
    for estimate in estimates:
        text = estimate.text if estimate.at is None else stamp(max(estimate.at, now))
        rank = (estimate.at is None, estimate.at or now)
        for key in estimate.tasks[:MAX_ESTIMATE_TARGETS]:
            pod = pods.get(key)
            if pod is None:
                continue
            namespace, kind, name = pod.job
            group = podgroups.get((namespace, name)) if kind == "PodGroup" else None
            workload = (workloads or {}).get(pod.job) if group is None else None
            holder: PodGroupView | WorkloadView | PodView = group or workload or pod
            target = (("PodGroup", namespace, name) if group is not None else
                      ("Workload", namespace, workload.name) if workload is not None else
                      ("Pod", pod.namespace, pod.name))
            have = holder.annotations.get(keys.EXPECTED_START)
            if target not in chosen or rank < chosen[target][0]:
                chosen[target] = (rank, text, have)
    return tuple(EstimateMark(*target, text) for target, (_, text, have) in sorted(chosen.items())
                 if moved(have, text, now))


EXPECTED = "; expected start "  # how a Waiting Reservation's Ready message ends with its estimate


def with_expected_starts(statuses: Sequence[ReservationStatus], estimates: Sequence[StartEstimate],
                         reservations: Mapping[str, ReservationView], now: datetime) -> list[ReservationStatus]:
    """Issue 17: each Waiting Reservation's status with its owner's estimate at the end of its Ready condition's
    message (`...; expected start <time or unknown: ...>`), the time written there kept while the new one is within
    ESTIMATE_TOLERANCE of it (moved: a status rewritten at every plan would wake every plan again)."""
    by_owner = {e.owner: e for e in estimates if e.kind is LockKind.RESERVATION}
    out = []
    for status in statuses:
        estimate = by_owner.get(reservation_owner_id(status.name)) if status.phase == "Waiting" else None
        view = reservations.get(status.name)
        if estimate is None or view is None:
            out.append(status)
            continue
        written = next((str(c.get("message") or "") for c in view.status.get("conditions") or ()
                        if isinstance(c, Mapping) and c.get("type") == "Ready"), "")
        have = written.rpartition(EXPECTED)[2] if EXPECTED in written else None
        text = have if have is not None and not moved(have, estimate.text, now) else estimate.text
        message = f"{status.message}{EXPECTED}{text}"
        conditions = tuple({**c, "message": message} if c.get("type") == "Ready" else c for c in status.conditions)
        out.append(replace(status, message=message, conditions=conditions))
    return out


# a pod remembered for estimate_errors is forgotten when no estimate has named it for this long (its owner's lock
# released without it binding): the memory stays bounded by the locks' tasks
FORGET_ESTIMATE_AFTER = timedelta(hours=1)


class Estimated(NamedTuple):
    """estimate_errors' memory of one pending task: the first estimate made for it, its lock kind, when an estimate
    last named it, and its uid (a pod deleted and made again under the name is another pod)."""

    at: datetime
    kind: LockKind
    seen: datetime
    uid: str = ""


class EstimateError(NamedTuple):
    kind: LockKind
    seconds: float  # bind - first estimate: positive when the pod started later than estimated


def estimate_errors(remembered: Mapping[str, Estimated], estimates: Sequence[StartEstimate],
                    pods: Mapping[str, PodView], now: datetime) -> tuple[dict[str, Estimated], list[EstimateError]]:
    """Issue 17's metric of the estimates' error, as a fold over plans: each pending task of a known estimate is
    remembered (by pod key, and uid) with the first estimate made for it; once it is bound, the error is its start
    (status.startTime, the kubelet's; else now) minus that estimate, and it is forgotten, as it is once gone,
    finished or deleted, or unnamed for FORGET_ESTIMATE_AFTER. The first estimate, not the last: one made as the
    lock was taken says how far ahead the agent saw; the last one, made a resync before the bind, says little.
    Memory only: an agent restarted forgets, and counts nothing for pods bound while it was down."""
    kept: dict[str, Estimated] = {}
    errors: list[EstimateError] = []
    for key, memory in remembered.items():
        pod = pods.get(key)
        if pod is None or pod.uid != memory.uid or pod.is_terminal or pod.deleting:
            continue
        if pod.node_name:
            errors.append(EstimateError(memory.kind, ((pod.started or now) - memory.at).total_seconds()))
        elif now - memory.seen <= FORGET_ESTIMATE_AFTER:
            kept[key] = memory
    for estimate in estimates:
        if estimate.at is None:
            continue
        for key in estimate.tasks:
            pod = pods.get(key)
            if pod is None or pod.node_name:
                continue
            first = kept.get(key)
            kept[key] = Estimated(first.at if first is not None else estimate.at, estimate.kind, now, pod.uid)
    return kept, errors


def waiting_task(pod: PodView) -> bool:
    """An owner's task still to place: not bound, not finished, not being deleted."""
    return not pod.node_name and not pod.is_terminal and not pod.deleting


def grant_lives(pod: PodView | None, grant: Grant, now: datetime, *, node: str, owner: str | None) -> bool:
    """Whether `node` keeps `grant` (grant_marks), `owner` being the owner of the lock this plan keeps on it (None:
    none): while its pod (by uid) exists and has not finished; bound to the node, while it runs there (deadline_cuts
    and the pod-locks check read it); not bound (on the gate, or let go and not bound yet), only until the grant's
    `until` and while the node stays locked for the grant's owner. A pod granted, narrowed and let go that never binds
    (pinned there, kept off by a filter Reservoir does not model) would otherwise keep its grant, and a place under
    MAX_NODE_GRANTS, for as long as the lock stands; should it bind after `until` all the same, deadline_cuts stops it
    at once with no grant (`ungranted`), as the grant's own cut would have (a start past `until` less its grace leaves
    a deadline of 1). Not quite the same for a pod that started before that but that the agent's cache showed bound
    only past `until` (late by more than the pod's grace): stopped at once, where the grant's cut would have let it run
    to `until`."""
    if pod is None or pod.is_terminal:
        return False
    return pod.node_name == node or (grant.owner == owner and now <= grant.until)


def grant_marks(nodes: Mapping[str, NodeView], by_uid: Mapping[str, PodView], placed: Sequence[Backfill],
                now: datetime, locks: Mapping[str, Lock]) -> dict[str, dict[str, str | None]]:
    """node -> {keys.BACKFILL_GRANTS: text or None} where the node's grants must change: a grant is kept while
    grant_lives says so (`locks`: the plan's) (the pod-locks check accepts the toleration only with an
    activeDeadlineSeconds ending by the grant's `until`: a tenant adding it to a pod let go unchanged gains no more
    than the slot); one is replaced for each pod placed anew and added for each pod `placed`."""
    new: dict[str, list[Grant]] = {}
    for b in placed:
        new.setdefault(b.node, []).append(Grant(b.pod.uid, b.pod.key, b.owner, b.ends))
    again = {b.pod.uid for b in placed}
    marks: dict[str, dict[str, str | None]] = {}
    for name in sorted(set(new) | {n for n, v in nodes.items() if v.backfill_grants}):
        node = nodes.get(name)
        have = node.backfill_grants if node is not None else {}
        lock = locks.get(name)
        owner = lock.owner if lock is not None else None
        keep = [g for uid, g in have.items()
                if uid not in again and grant_lives(by_uid.get(uid), g, now, node=name, owner=owner)]
        want = {g.uid: g for g in keep + new.get(name, [])}
        if want.keys() != have.keys() or any(have[u] != g for u, g in want.items()):
            marks[name] = {keys.BACKFILL_GRANTS: grants_text(want.values())}
    return marks


def room_marks(nodes: Mapping[str, NodeView], slots: Sequence[BackfillSlot], already: Mapping[str, Sequence[PodView]],
               *, margin: timedelta, now: datetime, enabled: bool = True) -> dict[str, dict[str, str | None]]:
    """node -> {keys.BACKFILL_ROOM: text or None} where the node's room note must change (shared.backfill, "Room"):
    on each slot whose needed-by time is known, its room (clause 7's, after the pods granted there and not bound
    yet: `already`) where some resource is left, until the needed-by time less the margin, while that is later than
    `now` and the node holds fewer than MAX_NODE_GRANTS grants (a pod gated for room no grant can give waits on the
    gate for nothing); removed from every other node that carries one (and from all when backfill is off or a dry
    run)."""
    want: dict[str, Room] = {}
    for slot in slots if enabled else ():
        if slot.needed_by is None or slot.needed_by - margin <= now or len(slot.granted) >= MAX_NODE_GRANTS:
            continue
        left = Resources({name: amount for name, amount in room(slot, already.get(slot.node, ())).items()
                          if amount > 0 and name != "pods"})
        if left:
            want[slot.node] = Room(left, slot.needed_by - margin)
    marks: dict[str, dict[str, str | None]] = {}
    for name in sorted(set(want) | {n for n, v in nodes.items() if v.backfill_room is not None}):
        node = nodes.get(name)
        if node is not None and node.backfill_room != want.get(name):
            marks[name] = {keys.BACKFILL_ROOM: want[name].text() if name in want else None}
    return marks


def deadline_cuts(nodes: Mapping[str, NodeView], by_uid: Mapping[str, PodView], locks: Mapping[str, Lock], *,
                  on_node: Mapping[str, Sequence[PodView]] | None = None,
                  spared: Callable[[PodView, str], bool] | None = None) -> tuple[DeadlineCut, ...]:
    """Backfilled pods that started too late to end by their grant, and the activeDeadlineSeconds each is lowered to.

    A grant's `until` is the plan's moment + the deadline + the margin + the pod's terminationGracePeriodSeconds: the
    margin stands for the lag from the plan to the bind. A pod kube-scheduler binds later than that (the scheduler
    was slow or down, its queue long) would, with the deadline it was given, run past `until`, into the owner's
    needed-by time. The kubelet counts activeDeadlineSeconds from status.startTime, and Kubernetes lets it be lowered
    on a running pod: each pod of a grant, bound to the grant's node, started, not finished, whose startTime +
    activeDeadlineSeconds + grace passes `until` is cut to floor(until - grace - startTime), at least 1 (the API's
    least; the kubelet then stops it at once). startTime is written by the kubelet, the grant by the agent: nothing
    the tenant writes moves the cut. A pod that bound within the margin is not touched, and a cut pod is cut once (the
    answer depends only on those three times). Only while this plan keeps the node locked for the grant's owner
    (`locks`): once the lock goes, nobody needs the node back by `until`. Sorted by pod key.

    A grant outlived (`on_node`, the pods bound to each node, and `spared`, whether a pod is one narrowing could not
    have let on: it never opted into backfill, or it may use the owner's locks by its own rights, shared.entitlement,
    are given): a pod narrowed for a grant that did not bind in its time keeps what narrowing gave it, the owner's lock
    toleration and the pin to the node (a toleration cannot be taken back, a pin cannot be changed once past the
    gate), while its grant ends at its `until` or with the lock (grant_lives). Binding there later under that owner's
    lock, it would have no `until` to be cut to and run its whole deadline into the owner's time. So a pod bound to a
    node locked for an owner under a lock backfill serves (a job's, a window's, a Reservation's; read back whole, its
    `since` known), started at or after that lock began, tolerating that owner's lock (as narrowing writes it, or as
    the tenant wrote it itself while its grant let it) and carrying an activeDeadlineSeconds (narrowing writes one),
    with no grant of the node naming it, and not `spared`, is cut to 1 (stopped at once: it took a locked node nobody
    let it onto). The writer reads the node again before such a cut and makes none if a grant there names the pod
    (the agent's cache may not show a grant it has just written)."""
    cuts = []
    for name, node in nodes.items():
        lock = locks.get(name)
        if lock is None:
            continue
        for uid, grant in node.backfill_grants.items():
            if lock.owner != grant.owner:
                continue
            pod = by_uid.get(uid)
            if pod is None or pod.node_name != name or pod.started is None or pod.is_terminal or pod.deleting:
                continue
            grace = min(pod.termination_grace, MAX_GRACE_SECONDS) * SECOND
            allowed = max(1, (grant.until - grace - pod.started) // SECOND)
            if pod.active_deadline is None or pod.active_deadline > allowed:
                cuts.append(DeadlineCut(pod=pod, node=name, owner=grant.owner, until=grant.until, deadline=allowed))
        if on_node is None or spared is None or lock.kind not in BACKFILL_KINDS or lock.unreadable:
            continue
        for pod in on_node.get(name, ()):
            if (pod.uid in node.backfill_grants or pod.started is None or pod.started < lock.since
                    or pod.is_terminal or pod.deleting or pod.active_deadline is None or pod.active_deadline <= 1
                    or not tolerates_lock(pod.tolerations, lock.owner) or spared(pod, lock.owner)):
                continue
            cuts.append(DeadlineCut(pod=pod, node=name, owner=lock.owner, until=lock.since, deadline=1,
                                    ungranted=True))
    return tuple(sorted(cuts, key=lambda c: c.key))
