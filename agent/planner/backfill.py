"""Backfill (DESIGN 4.6, beyond the seeds; issue 17): let a pod with a declared runtime use a locked node's idle room
until the lock's owner needs it.

A lock costs capacity. A starvation lock (seed 000) keeps a node's freed resources idle until enough running pods
end for the big task to fit; a window (seed 004) locks its nodes `startReserveAgo` before it opens; a Waiting
Reservation with preAllocation (seed 003) drains its node the same way. A pod whose runtime is known (seed 004
`volcano.sh/maximum-runtime`, its own or its PodGroup's: reserve.maximum_runtime) can use that idle room meanwhile,
as Slurm's backfill scheduler lets short jobs run ahead of a waiting big one.

Needed-by time (`needed_by`), per locked node: the moment from which the lock's owner needs the node:
- a window: its `start` (not `start - startReserveAgo`: the lead time exists only to drain the nodes);
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

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from typing import NamedTuple

from agent.planner.capacity import FOREVER, NodeState, schedulable, time_to_fit
from agent.planner.model import Lock
from shared.keys import LockKind
from shared.predicates import schedulable_on
from shared.resources import EMPTY, PODS, Resources
from shared.timestamps import stamp
from shared.views import PodView

SECOND = timedelta(seconds=1)
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

    - WINDOW: `start`, the window's start (None when not given);
    - JOB (seed 000) and RESERVATION (seed 003, a Waiting one): now + min over `waiting` (the owner's tasks on the
      node that do not fit now, `fits_now`) of time_to_fit(state, task, taken_now, now), `taken_now` being what the
      owner's tasks that fit now take; `now` when nothing waits (the owner takes its room now); None when every
      waiting task needs a pod without a maximum runtime to end first;
    - QUEUE (seed 002): None (its pods may come at any moment)."""
    if kind is LockKind.WINDOW:
        return start
    if kind not in (LockKind.JOB, LockKind.RESERVATION):
        return None
    if not waiting:
        return now
    soonest = min(time_to_fit(state, task, taken_now, now) for task in waiting)
    return None if soonest == FOREVER else now + soonest


@dataclass(frozen=True)
class BackfillSlot:
    """One locked node as backfill sees it: the node's state, the lock's owner id and kind, what the owner's tasks
    that fit now take there (kept from backfill, clause 7) and the node's needed-by time (None: unknown)."""

    state: NodeState
    owner: str
    kind: LockKind
    needed_by: datetime | None
    taken_now: Resources = EMPTY

    @property
    def node(self) -> str:
        return self.state.node.name


def backfill_slot(lock: Lock, state: NodeState, *, now: datetime, tasks: Sequence[Resources] = (),
                  start: datetime | None = None) -> BackfillSlot:
    """The slot of one locked node: `tasks` are the requests of the owner's pending tasks on the node (a starvation
    lock: the tasks it reserved there, Lock.tasks; a Waiting Reservation: its requests; a window: its pending reserve
    pods the node would take now), `start` a window's start. Splits them (`fits_now`) and computes `needed_by`."""
    taken, waiting = fits_now(state, tasks)
    return BackfillSlot(state=state, owner=lock.owner, kind=lock.kind, taken_now=taken,
                        needed_by=needed_by(lock.kind, state, now=now, waiting=waiting, taken_now=taken, start=start))


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
    why = pending_for_backfill(pod)
    if why is not None:
        return Verdict(False, why)
    if fits_unlocked:
        return Verdict(False, "it fits on an unlocked node now: kube-scheduler places it without backfill")
    if runtime is None:
        return Verdict(False, "it declares no volcano.sh/maximum-runtime (pod or PodGroup): when it ends is unknown")
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


@dataclass(frozen=True)
class Backfill:
    """One pod let onto one locked node: it must end by `ends` (its deadline, with the margin), by `needed_by`."""

    pod: PodView
    node: str
    owner: str
    ends: datetime
    needed_by: datetime
    reason: str


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
                     margin: timedelta) -> Backfills:
    """The backfills of one plan: the candidates oldest first (creation, then namespace/name), each onto the slot
    the rule allows (backfill_verdict) where it leaves the least slack (best fit: `slack`, then the least time
    between its end and the node's needed-by time, then the node's name), counting the room earlier candidates took
    in this call. Deterministic: the same inputs give the same answer whatever their order."""
    ordered = sorted(candidates, key=lambda c: (c.pod.created, c.pod.key))
    by_node = sorted(slots, key=lambda s: s.node)
    taken: dict[str, list[PodView]] = {s.node: [] for s in by_node}
    placed: list[Backfill] = []
    refused: dict[str, str] = {}
    for candidate in ordered:
        pod = candidate.pod
        best: tuple[tuple[Fraction, timedelta, str], BackfillSlot, Verdict] | None = None
        reasons: dict[str, str] = {}  # node -> why not there
        for slot in by_node:
            verdict = backfill_verdict(pod, runtime=candidate.runtime, fits_unlocked=candidate.fits_unlocked,
                                       is_owner=slot.owner in candidate.owns, slot=slot, backfilled=taken[slot.node],
                                       now=now, margin=margin)
            if not verdict.allowed:
                reasons[slot.node] = verdict.reason
                continue
            assert candidate.runtime is not None and slot.needed_by is not None  # clauses 4 and 5
            ends = now + held_for(candidate.runtime) + margin
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
                               ends=now + held_for(candidate.runtime) + margin, needed_by=slot.needed_by,
                               reason=verdict.reason))
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
