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

from collections.abc import Iterable, Mapping
from datetime import datetime

from agent.planner.capacity import NodeState, idle_fraction, schedulable, selects, time_to_fit, tolerates
from agent.planner.jobs import Job
from agent.planner.model import JobStatus, Lock
from shared.config import StarvationConfig
from shared.keys import LockKind
from shared.resources import EMPTY, Resources
from shared.views import PodView


def _placeable_now(pod: PodView, states: Mapping[str, NodeState]) -> bool:
    for name, state in states.items():
        if not schedulable(state.node) or not selects(pod.node_selector, state.node):
            continue
        if not tolerates(pod, state.node):
            continue
        if state.idle.covers(pod.requests):
            return True
    return False


def assign_tasks(job: Job, tasks: list[PodView], states: Mapping[str, NodeState], free: Iterable[str],
                 own: set[str], now: datetime) -> dict[str, list[PodView]] | None:
    """Reserve every task on some node; None when one cannot be reserved anywhere."""
    candidates = [n for n in free if schedulable(states[n].node)]
    reserved: dict[str, Resources] = {}
    placed: dict[str, list[PodView]] = {}
    for task in tasks:
        best = None
        for name in candidates:
            state = states[name]
            already = reserved.get(name, EMPTY)
            if not (already + task.requests).fits_in(state.node.allocatable):
                continue
            if not selects(task.node_selector, state.node) or not tolerates(task, state.node, ignore_lock=True):
                continue
            score = (name not in own, time_to_fit(state, task.requests, already, now), -idle_fraction(state), name)
            if best is None or score < best[0]:
                best = (score, name)
        if best is None:
            return None
        name = best[1]
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

    for job in ordered:
        pending = job.pending
        status = dict(subject=job.subject, owner=job.owner, queue=job.queue, priority=job.priority,
                      min_member=job.min_member, bound=job.bound, pending=len(pending))
        if job.ready or not pending:
            statuses.append(JobStatus(**status, starving=False, reason="ready" if job.ready else "nothing pending"))
            continue
        expired = job.owner in expired_owners
        existing = [] if expired else [lock for lock in by_owner.get(job.owner, ()) if lock.node in states
                                       and lock.node not in taken]
        age = now - job.created
        starving = age > config.starving_job_time_threshold
        if not existing and not starving:
            statuses.append(JobStatus(**status, starving=False, reason=f"waiting {int(age.total_seconds())}s of "
                                      f"{int(config.starving_job_time_threshold.total_seconds())}s threshold"))
            continue
        if not existing:
            blocker = next((p for other in jobs if other.priority > job.priority and other.owner != job.owner
                            for p in other.pending if _placeable_now(p, states)), None)
            if blocker is not None:
                notes.append(f"job={job.subject} decision=wait reason=higher-priority pod {blocker.key} can be placed now")
                statuses.append(JobStatus(**status, starving=True, reason="waiting for a higher-priority job"))
                continue
        own = {lock.node for lock in existing}
        free = [n for n in sorted(states) if n not in taken and (held.get(n) in (None, job.owner))
                and not (expired and by_owner.get(job.owner) and any(l.node == n for l in by_owner[job.owner]))]
        placed = assign_tasks(job, pending, states, free, own, now)
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
