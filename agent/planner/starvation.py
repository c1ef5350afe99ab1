"""Seed 000, "Reserve Action" (DESIGN 4.1): lock nodes for starving jobs.

A job is *starving* (`is_starving`, the seed's isJobStarving) when it has existed longer than
`starvingJobTimeThreshold`, is not Job Ready (bound < minMember) and not Job Condition Ready (bound + reserved <
minMember; a job whose pending tasks are already reserved on its locked nodes keeps them instead of asking again).

Node choice, per pending task (largest first) (`reserve_tasks`, `NodeChooser`; the seed's "Node selection strategy
to participate in reserve"): nodes that can ever fit it ("Node reserve logic": allocatable >= request plus what the
job already reserved there), not cordoned, whose other taints it tolerates, not taken in this plan and open to
starvation by the displacement table (not held by another live job); scored by
    (already locked for this job first, time_to_fit ascending, idle_fraction descending, name)
where time_to_fit is 0 when idle covers the task now, else the wait until pods with a maximum runtime free
enough (capacity.time_to_fit), and idle_fraction is the seed's node score ((cpu + memory) / 2 + 2 * scalar) / 3.
A job gets locks only when every pending task is reserved somewhere and the new nodes fit the
`reservedNodePercent` budget (`reserve_job`: "Reserve will succeed only if the job can reach ready or condition
ready"). No new lock is made while a higher-priority pending pod can be placed now (`higher_priority_blocker`, seed
000 "Reserve logic"). A lock older than `maxLockDuration` is released and its job goes to the back of the order
(`release_expired`, `back_of_the_order`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from agent.planner.capacity import NodeState, idle_fraction, schedulable, time_to_fit
from agent.planner.displacement import displaces
from agent.planner.jobs import Job
from agent.planner.model import JobStatus, Lock
from agent.planner.ordering import order_jobs
from agent.planner.policy import PlanContext, Policy, PolicyResult, Statuses, cap, kept_since
from shared.config import StarvationConfig
from shared.keys import LockKind
from shared.predicates import selects, tolerations_allow
from shared.resources import EMPTY, Resources
from shared.views import PodView

# (requests, nodeSelector, tolerations) of a task: tasks alike in all three rank the nodes alike
Shape = tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...], tuple[tuple[tuple[str, str], ...], ...]]
NodeKey = tuple[timedelta, float, str]  # (time_to_fit, -idle_fraction, name): lower is better
Placeable = tuple[int, str, str]  # (priority, job owner, pod "namespace/name")


def placeable_now(jobs: Iterable[Job], states: Mapping[str, NodeState]) -> list[Placeable]:
    """Seed 000 "Reserve logic": pending pods kube-scheduler could bind right now (some node's idle covers them,
    taints and selector allow), as (priority, owner, pod) highest priority first. Decided once per pod shape."""
    fits: dict[Shape, bool] = {}
    out = []
    for job in jobs:
        for pod in job.pending:
            shape = NodeChooser.shape(pod)
            if shape not in fits:
                fits[shape] = any(schedulable(s.node) and selects(pod.node_selector, s.node)
                                  and tolerations_allow(pod.tolerations, s.node) and s.idle.covers(pod.requests)
                                  for s in states.values())
            if fits[shape]:
                out.append((pod.priority, job.owner, pod.key))
    return sorted(out, key=lambda item: (-item[0], item[2]))


def higher_priority_blocker(job: Job, placeable: Sequence[Placeable]) -> str | None:
    """Seed 000 "Reserve logic": "If a job with a higher priority than the starving job can be scheduled successfully
    in this round, the starving job need to wait": a pending pod of another job, of higher priority, that can be
    placed now."""
    for priority, owner, pod in placeable:
        if priority <= job.priority:
            return None
        if owner != job.owner:
            return pod
    return None


class NodeChooser:
    """Picks the best node for a task without scanning every node per task.

    Tasks with the same shape (request, nodeSelector, tolerations) rank the free nodes the same way, by
    (time_to_fit, -idle_fraction, name) with nothing yet reserved on them; so each shape gets one heap, built once
    per plan, and a node taken by a job (or partly reserved by the job being planned) is re-checked lazily when
    it reaches the top. Exactly the order a full scan would give, at O(shapes x nodes log nodes) per plan.
    `taken` is the caller's set of nodes locked in this plan so far (it grows as jobs get locks); `blocked` the
    nodes the displacement table keeps from starvation, with the job holding each.
    """

    def __init__(self, states: Mapping[str, NodeState], taken: Set[str], blocked: Mapping[str, str],
                 now: datetime) -> None:
        self.states = states
        self.taken = taken
        self.blocked = blocked  # node -> owner holding it (other jobs' live locks)
        self.now = now
        self.heaps: dict[Shape, list[NodeKey]] = {}

    @staticmethod
    def shape(task: PodView) -> Shape:
        """Seed 000 "PredicateNodes for task" depends on no more than this: tasks of one shape rank nodes alike."""
        tolerations = tuple(sorted(tuple(sorted((k, str(v)) for k, v in t.items())) for t in task.tolerations))
        return (tuple(sorted(task.requests.items())), tuple(sorted(task.node_selector.items())), tolerations)

    def _usable(self, name: str, task: PodView, owner: str) -> bool:
        """Seed 000 "Node reserve logic" and "PredicateNodes for task": the node can ever fit the task (allocatable),
        its selector and taints allow it, it is schedulable, not taken and not another live job's."""
        state = self.states[name]
        return (name not in self.taken and self.blocked.get(name) in (None, owner) and schedulable(state.node)
                and task.requests.fits_in(state.node.allocatable) and selects(task.node_selector, state.node)
                and tolerations_allow(task.tolerations, state.node, ignore_lock=True))

    def _key(self, name: str, task: PodView, reserved: Resources) -> NodeKey:
        """Seed 000 node score: (time_to_fit, -idle_fraction, name), lower first."""
        state = self.states[name]
        return (time_to_fit(state, task.requests, reserved, self.now), -idle_fraction(state), name)

    def _heap(self, task: PodView, owner: str) -> list[NodeKey]:
        shape = self.shape(task)
        if shape not in self.heaps:
            heap = [self._key(n, task, EMPTY) for n in self.states if self._usable(n, task, owner)]
            heapq.heapify(heap)
            self.heaps[shape] = heap
        return self.heaps[shape]

    def choose(self, task: PodView, owner: str, own: Set[str], reserved: Mapping[str, Resources],
               avoid: Set[str] = frozenset()) -> str | None:
        """Seed 000 node choice: the best node for `task`: nodes already locked for this job first; then by
        (time_to_fit, -idle, name). Nodes this job reserved on in this plan are scored with what it reserved there;
        `avoid` is skipped."""
        best: tuple[tuple[bool, timedelta, float, str], str] | None = None
        for name in sorted((own | set(reserved)) - avoid):
            already = reserved.get(name, EMPTY)
            if not self._usable(name, task, owner) or not (already + task.requests).fits_in(
                    self.states[name].node.allocatable):
                continue
            key = (name not in own, *self._key(name, task, already))
            if best is None or key < best[0]:
                best = (key, name)
        heap = self._heap(task, owner)
        set_aside = []
        candidate: tuple[tuple[bool, timedelta, float, str], str] | None = None
        while heap:
            entry = heap[0]
            name = entry[2]
            if name in self.taken or self.blocked.get(name) not in (None, owner):
                heapq.heappop(heap)  # gone for good in this plan
                continue
            if name in reserved or name in own or name in avoid:
                set_aside.append(heapq.heappop(heap))  # scored above, or not for this job
                continue
            candidate = ((True, *entry), name)
            break
        for entry in set_aside:
            heapq.heappush(heap, entry)
        options = [o for o in (best, candidate) if o is not None]
        return min(options)[1] if options else None


def reserve_tasks(job: Job, tasks: Sequence[PodView], chooser: NodeChooser, own: Set[str],
                  avoid: Set[str] = frozenset()) -> dict[str, list[PodView]] | None:
    """Seed 000 "Reserved": every task reserved on some node (node -> its tasks there), each on the best node left
    by the chooser counting what the job reserved so far; None when one cannot be reserved anywhere."""
    reserved: dict[str, Resources] = {}
    placed: dict[str, list[PodView]] = {}
    for task in tasks:
        name = chooser.choose(task, job.owner, own, reserved, avoid)
        if name is None:
            return None
        reserved[name] = reserved.get(name, EMPTY) + task.requests
        placed.setdefault(name, []).append(task)
    return placed


@dataclass(frozen=True, kw_only=True)
class Starvation:
    """Seed 000: what every job's turn reads in one plan."""

    config: StarvationConfig
    now: datetime
    states: Mapping[str, NodeState]
    current: Mapping[str, Lock]
    held_by: Mapping[str, Sequence[Lock]]  # job owner -> its job locks now
    expired: frozenset[str]  # job owners whose locks outlived maxLockDuration (release_expired)
    placeable: Sequence[Placeable]  # placeable_now
    chooser: NodeChooser


@dataclass(frozen=True, kw_only=True)
class JobTurn:
    """Seed 000: one job's outcome in this plan."""

    status: JobStatus
    locks: Mapping[str, Lock] = field(default_factory=dict)
    note: str | None = None


def plan_starvation(*, context: PlanContext) -> PolicyResult:
    """Seed 000: starvation locks for the jobs in QueueScoreOrder (seed 001, ordering.order_jobs), expired ones at
    the back, on nodes not taken, at most min(what the other policies left, `reservedNodePercent` of the schedulable
    nodes) new-or-kept nodes."""
    config = context.config.starvation
    if not config.enabled:
        return PolicyResult()
    jobs = order_jobs(context.jobs, context.scores, context.config.queue_order.ordering)
    budget = min(context.budget, cap(config.reserved_node_percent, context.schedulable_nodes))
    taken = set(context.taken)  # grows as jobs get locks; the chooser reads it
    starvation = starvation_round(jobs, context=context, taken=taken)
    locks: dict[str, Lock] = {}
    statuses: list[JobStatus] = []
    notes: list[str] = []
    for job in back_of_the_order(jobs, expired=starvation.expired):
        turn = job_turn(job, starvation=starvation, taken=taken, budget=budget)
        locks.update(turn.locks)
        taken.update(turn.locks)
        budget -= len(turn.locks)
        statuses.append(turn.status)
        notes += [turn.note] if turn.note else []
    return PolicyResult(locks=locks, statuses=Statuses(jobs=tuple(statuses)), notes=tuple(notes))


def starvation_round(jobs: Sequence[Job], *, context: PlanContext, taken: Set[str]) -> Starvation:
    """Seed 000: what the jobs' turns share: the job locks now, which of them expired, which nodes the displacement
    table keeps from starvation (another live job's unexpired lock), and the pods placeable now."""
    config = context.config.starvation
    held_by: dict[str, list[Lock]] = {}
    for lock in context.current.values():
        if lock.kind is LockKind.JOB:
            held_by.setdefault(lock.owner, []).append(lock)
    expired = release_expired(held_by, now=context.now, max_lock_duration=config.max_lock_duration)
    # a job lock still claims its node while its job is live: not ready, with a task pending, and not expired
    claiming = frozenset(job.owner for job in jobs if not job.ready and job.pending) - expired
    blocked = {node: lock.owner for node, lock in context.current.items()
               if not displaces(LockKind.JOB, lock, live_jobs=claiming)}
    return Starvation(config=config, now=context.now, states=context.states, current=context.current,
                      held_by=held_by, expired=expired, placeable=placeable_now(jobs, context.states),
                      chooser=NodeChooser(context.states, taken, blocked, context.now))


def release_expired(held_by: Mapping[str, Sequence[Lock]], *, now: datetime,
                    max_lock_duration: timedelta) -> frozenset[str]:
    """Seed 000 (DESIGN 4.1 "Release when ... the lock is older than `maxLockDuration`"): the job owners one of whose
    locks is that old. Their locks are released; the job goes to the back of the order and not onto the nodes it held (a
    cool-down, so one giant job cannot hold nodes forever)."""
    return frozenset(owner for owner, locks in held_by.items()
                     if any(now - lock.since >= max_lock_duration for lock in locks))


def back_of_the_order(jobs: Sequence[Job], *, expired: Set[str]) -> list[Job]:
    """Seed 000 (DESIGN 4.1): the jobs in their order, those whose locks expired moved to the back (in their
    order)."""
    return [j for j in jobs if j.owner not in expired] + [j for j in jobs if j.owner in expired]


def is_starving(job: Job, *, now: datetime, threshold: timedelta) -> bool:
    """Seed 000 isJobStarving's time test: "The creation time of job is greater than the set starving job threshold
    time", now - created > `starvingJobTimeThreshold`. (Its other tests: not Job Ready is `job.ready`, checked first
    by job_turn; not Job Condition Ready is having no kept lock, checked beside this one.)"""
    return now - job.created > threshold


def job_status(job: Job, *, starving: bool, reason: str) -> JobStatus:
    """Seed 000: the job as judged, for `reservoir status` and the starving-jobs metric."""
    return JobStatus(subject=job.subject, owner=job.owner, queue=job.queue, priority=job.priority,
                     min_member=job.min_member, bound=job.bound, pending=len(job.pending), starving=starving,
                     reason=reason)


def job_turn(job: Job, *, starvation: Starvation, taken: Set[str], budget: int) -> JobTurn:
    """Seed 000 for one job: nothing for a ready job or one with nothing pending, nor past the budget (unless it
    holds locks); a job with kept locks (Job Condition Ready) re-reserves on them; a starving one reserves unless a
    higher-priority pod can be placed now; any other waits for the threshold."""
    if job.ready or not job.pending:
        return JobTurn(status=job_status(job, starving=False, reason="ready" if job.ready else "nothing pending"))
    threshold = starvation.config.starving_job_time_threshold
    starving = is_starving(job, now=starvation.now, threshold=threshold)
    if budget <= 0 and job.owner not in starvation.held_by:
        return JobTurn(status=job_status(job, starving=starving,
                                         reason="reservedNodePercent budget spent by jobs ahead of it"))
    expired = job.owner in starvation.expired
    kept = [] if expired else [lock for lock in starvation.held_by.get(job.owner, ())
                               if lock.node in starvation.states and lock.node not in taken]
    if not kept and not starving:
        age = int((starvation.now - job.created).total_seconds())
        return JobTurn(status=job_status(job, starving=False, reason=f"waiting {age}s of "
                                         f"{int(threshold.total_seconds())}s threshold"))
    if not kept:
        blocker = higher_priority_blocker(job, starvation.placeable)
        if blocker is not None:
            why = f"higher-priority pod {blocker} can be placed now"
            return JobTurn(status=job_status(job, starving=True, reason="waiting for a higher-priority job"),
                           note=f"job={job.subject} decision=wait reason={why}")
    return reserve_job(job, kept=kept, starvation=starvation, budget=budget)


def reserve_job(job: Job, *, kept: Sequence[Lock], starvation: Starvation, budget: int) -> JobTurn:
    """Seed 000 "Reserve will succeed only if the job can reach ready or condition ready": every pending task
    reserved on some node (reserve_tasks), on at most `budget` nodes counting the kept ones, else no lock at all."""
    own = {lock.node for lock in kept}
    # a job whose lock expired goes to the back, and not onto the nodes it held too long
    avoid = {lock.node for lock in starvation.held_by.get(job.owner, ())} if job.owner in starvation.expired else set()
    placed = reserve_tasks(job, job.pending, starvation.chooser, own, avoid)
    if placed is None or len(placed) > budget:
        why = ("a pending task fits on no node (allocatable too small or every candidate held)" if placed is None
               else f"needs {len(placed)} nodes, {budget} left within reservedNodePercent")
        return JobTurn(status=job_status(job, starving=True, reason=f"cannot reserve: {why}"),
                       note=f"job={job.subject} decision=no-lock reason={why}")
    new = sum(1 for n in placed if n not in own)
    return JobTurn(status=job_status(job, starving=True,
                                     reason=f"reserved on {len(placed)} nodes ({new} new, {len(placed) - new} kept)"),
                   locks=job_locks(job, placed=placed, starvation=starvation))


def job_locks(job: Job, *, placed: Mapping[str, Sequence[PodView]], starvation: Starvation) -> dict[str, Lock]:
    """Seed 000 "Data Model": a node's `Reserved` is "the sum of the resource requirement of all the tasks reserved
    on the node"; the lock names those tasks and expires `maxLockDuration` after it was first taken."""
    config, now = starvation.config, starvation.now
    locks = {}
    for node, tasks in placed.items():
        # no ages or clocks in the reason: it is written to the node, and must not change while nothing does
        reason = (f"starving job: {job.bound}/{job.min_member} bound, older than "
                  f"{int(config.starving_job_time_threshold.total_seconds())}s; reserves {len(tasks)} of "
                  f"{len(job.pending)} pending tasks")
        since = kept_since(starvation.current, node=node, owner=job.owner, now=now)
        locks[node] = Lock(node=node, owner=job.owner, kind=LockKind.JOB, subject=job.subject, reason=reason,
                           since=since, expires=since + config.max_lock_duration,
                           reserved=Resources.total(t.requests for t in tasks),
                           tasks=tuple(sorted(t.key for t in tasks)))
    return locks


STARVATION = Policy(name="starvation", kind=LockKind.JOB, seed="000", run=plan_starvation)
