"""Seed 000, "Reserve Action" (DESIGN 4.1): lock nodes for starving jobs.

A job is *starving* when it has existed longer than `starvingJobTimeThreshold`, is not Job Ready
(bound < minMember) and not Job Condition Ready (bound + reserved < minMember; a job whose pending tasks are
already reserved on its locked nodes keeps them instead of asking again).

Node choice, per pending task (largest first): nodes that can ever fit it (allocatable >= request plus what the
job already reserved there), not cordoned, whose other taints it tolerates, not held by another owner; scored by
    (already locked for this job first, time_to_fit ascending, idle_fraction descending, name)
where time_to_fit is 0 when idle covers the task now, else the wait until pods with a maximum runtime free
enough (capacity.time_to_fit). A job gets locks only when every pending task is reserved somewhere and the new
nodes fit the `reservedNodePercent` budget ("Reserve will succeed only if the job can reach ready or condition
ready"). No new lock is made while a higher-priority pending pod can be placed now (seed 000 "Reserve logic").
A lock older than `maxLockDuration` is released and its job goes to the back of the order.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from datetime import datetime

from agent.planner.capacity import NodeState, idle_fraction, schedulable, time_to_fit
from agent.planner.jobs import Job
from agent.planner.model import JobStatus, Lock
from shared.config import StarvationConfig
from shared.keys import LockKind
from shared.predicates import selects, tolerations_allow
from shared.resources import EMPTY, Resources
from shared.views import PodView


def placeable_now(jobs: list[Job], states: Mapping[str, NodeState]) -> list[tuple[int, str, str]]:
    """Pending pods kube-scheduler could bind right now (some node's idle covers them, taints and selector
    allow), as (priority, owner, pod) highest priority first. Decided once per pod shape, not per pod."""
    fits: dict[tuple, bool] = {}
    out = []
    for job in jobs:
        for pod in job.pending:
            shape = NodeChooser.shape(pod)
            if shape not in fits:
                fits[shape] = any(schedulable(s.node) and selects(pod.node_selector, s.node) and tolerations_allow(pod.tolerations, s.node)
                                  and s.idle.covers(pod.requests) for s in states.values())
            if fits[shape]:
                out.append((pod.priority, job.owner, pod.key))
    return sorted(out, key=lambda item: (-item[0], item[2]))


def higher_priority_blocker(job: Job, placeable: list[tuple[int, str, str]]) -> str | None:
    """Seed 000 "Reserve logic": a pending pod of another job, of higher priority, that can be placed now."""
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
    """

    def __init__(self, states: Mapping[str, NodeState], taken: set[str], blocked: Mapping[str, str], now: datetime) -> None:
        self.states = states
        self.taken = taken
        self.blocked = blocked  # node -> owner holding it (other jobs' live locks)
        self.now = now
        self.heaps: dict[tuple, list[tuple]] = {}

    @staticmethod
    def shape(task: PodView) -> tuple:
        tolerations = tuple(sorted(tuple(sorted((k, str(v)) for k, v in t.items())) for t in task.tolerations))
        return (tuple(sorted(task.requests.items())), tuple(sorted(task.node_selector.items())), tolerations)

    def _usable(self, name: str, task: PodView, owner: str) -> bool:
        state = self.states[name]
        return (name not in self.taken and self.blocked.get(name) in (None, owner) and schedulable(state.node)
                and task.requests.fits_in(state.node.allocatable) and selects(task.node_selector, state.node)
                and tolerations_allow(task.tolerations, state.node, ignore_lock=True))

    def _key(self, name: str, task: PodView, reserved: Resources) -> tuple:
        state = self.states[name]
        return (time_to_fit(state, task.requests, reserved, self.now), -idle_fraction(state), name)

    def _heap(self, task: PodView, owner: str) -> list[tuple]:
        shape = self.shape(task)
        if shape not in self.heaps:
            heap = [self._key(n, task, EMPTY) for n in self.states if self._usable(n, task, owner)]
            heapq.heapify(heap)
            self.heaps[shape] = heap
        return self.heaps[shape]

    def choose(self, task: PodView, owner: str, own: set[str], reserved: Mapping[str, Resources],
               avoid: set[str] = frozenset()) -> str | None:  # type: ignore[assignment]
        """Best node for `task`: nodes already locked for this job first; then by (time_to_fit, -idle, name).
        Nodes this job reserved on in this plan are scored with what it reserved there; `avoid` is skipped."""
        best = None
        for name in sorted((own | set(reserved)) - avoid):
            already = reserved.get(name, EMPTY)
            if not self._usable(name, task, owner) or not (already + task.requests).fits_in(self.states[name].node.allocatable):
                continue
            key = (name not in own, *self._key(name, task, already))
            if best is None or key < best[0]:
                best = (key, name)
        heap = self._heap(task, owner)
        set_aside = []
        candidate = None
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


def assign_tasks(job: Job, tasks: list[PodView], chooser: NodeChooser, own: set[str],
                 avoid: set[str] = frozenset()) -> dict[str, list[PodView]] | None:  # type: ignore[assignment]
    """Reserve every task on some node; None when one cannot be reserved anywhere."""
    reserved: dict[str, Resources] = {}
    placed: dict[str, list[PodView]] = {}
    for task in tasks:
        name = chooser.choose(task, job.owner, own, reserved, avoid)
        if name is None:
            return None
        reserved[name] = reserved.get(name, EMPTY) + task.requests
        placed.setdefault(name, []).append(task)
    return placed


def plan_starvation(
    jobs: list[Job],
    states: Mapping[str, NodeState],
    current: Mapping[str, Lock],
    taken: set[str],
    budget: int,
    config: StarvationConfig,
    now: datetime,
) -> tuple[dict[str, Lock], list[JobStatus], list[str]]:
    """Desired starvation locks for `jobs` (already in priority order), on nodes not in `taken`, at most `budget`
    new-or-kept nodes."""
    locks: dict[str, Lock] = {}
    statuses: list[JobStatus] = []
    notes: list[str] = []
    by_owner: dict[str, list[Lock]] = {}
    for lock in current.values():
        if lock.kind is LockKind.JOB:
            by_owner.setdefault(lock.owner, []).append(lock)
    live_owners = {job.owner for job in jobs if not job.ready and job.pending}
    expired_owners = {owner for owner, held_locks in by_owner.items()
                      if any(now - lock.since >= config.max_lock_duration for lock in held_locks)}
    # nodes held by another live job whose locks have not expired are not candidates for this one
    held = {node: lock.owner for node, lock in current.items()
            if lock.kind is LockKind.JOB and lock.owner in live_owners and lock.owner not in expired_owners}
    ordered = [j for j in jobs if j.owner not in expired_owners] + [j for j in jobs if j.owner in expired_owners]
    chooser = NodeChooser(states, taken, held, now)
    placeable = placeable_now(jobs, states)

    for job in ordered:
        pending = job.pending
        status = dict(subject=job.subject, owner=job.owner, queue=job.queue, priority=job.priority,
                      min_member=job.min_member, bound=job.bound, pending=len(pending))
        if job.ready or not pending:
            statuses.append(JobStatus(**status, starving=False, reason="ready" if job.ready else "nothing pending"))
            continue
        expired = job.owner in expired_owners
        if budget <= 0 and job.owner not in by_owner:
            statuses.append(JobStatus(**status, starving=now - job.created > config.starving_job_time_threshold,
                                      reason="reservedNodePercent budget spent by jobs ahead of it"))
            continue
        existing = [] if expired else [lock for lock in by_owner.get(job.owner, ()) if lock.node in states
                                       and lock.node not in taken]
        age = now - job.created
        starving = age > config.starving_job_time_threshold
        if not existing and not starving:
            statuses.append(JobStatus(**status, starving=False, reason=f"waiting {int(age.total_seconds())}s of "
                                      f"{int(config.starving_job_time_threshold.total_seconds())}s threshold"))
            continue
        if not existing:
            blocker = higher_priority_blocker(job, placeable)
            if blocker is not None:
                notes.append(f"job={job.subject} decision=wait reason=higher-priority pod {blocker} can be placed now")
                statuses.append(JobStatus(**status, starving=True, reason="waiting for a higher-priority job"))
                continue
        own = {lock.node for lock in existing}
        # a job whose lock expired goes to the back, and not onto the nodes it held too long
        avoid = {lock.node for lock in by_owner.get(job.owner, ())} if expired else set()
        placed = assign_tasks(job, pending, chooser, own, avoid)
        new_nodes = [n for n in (placed or {}) if n not in own]
        if placed is None or len(placed) > budget:
            why = ("a pending task fits on no node (allocatable too small or every candidate held)" if placed is None
                   else f"needs {len(placed)} nodes, {budget} left within reservedNodePercent")
            notes.append(f"job={job.subject} decision=no-lock reason={why}")
            statuses.append(JobStatus(**status, starving=True, reason=f"cannot reserve: {why}"))
            continue
        since_by_node = {lock.node: lock.since for lock in existing}
        for node, tasks in placed.items():
            reserved = EMPTY
            for task in tasks:
                reserved = reserved + task.requests
            # no ages or clocks in the reason: it is written to the node, and must not change while nothing does
            reason = (f"starving job: {job.bound}/{job.min_member} bound, older than "
                      f"{int(config.starving_job_time_threshold.total_seconds())}s; reserves {len(tasks)} of "
                      f"{len(pending)} pending tasks")
            locks[node] = Lock(node=node, owner=job.owner, kind=LockKind.JOB, subject=job.subject, reason=reason,
                               since=since_by_node.get(node, now), expires=since_by_node.get(node, now) + config.max_lock_duration,
                               reserved=reserved, tasks=tuple(sorted(t.key for t in tasks)))
            taken.add(node)
        budget -= len(placed)
        kept = len(placed) - len(new_nodes)
        statuses.append(JobStatus(**status, starving=True,
                                  reason=f"reserved on {len(placed)} nodes ({len(new_nodes)} new, {kept} kept)"))
    return locks, statuses, notes
