"""DESIGN section 4 "Repair": the pending pods a lock of this plan is held for but that lack its toleration (created
while the webhook was down, or before Reservoir was installed), and the lock tolerations to add to each.

A pod is owed the toleration of an owner's lock when, in this plan:
- it is a task a starvation lock (seed 000) names (`Lock.tasks`, pending pods of the lock's job);
- it is an unbound, unfinished owner pod (reservations.is_owner) of a Reservation (seed 003) whose planned phase is
  Available or Waiting and that is not `unschedulable`;
- it is an unbound, unfinished reserve pod (`volcano.sh/reserveable`, seed 004) and a configured window holds a lock:
  the owner ids of the windows holding locks.
Bound pods are past help (a pod update may add tolerations, but the pod is placed already). The tolerations added are
those of `lock_toleration(owner)`, owners sorted, that the pod's own tolerations do not already cover (an `Exists`
toleration of the lock key covers every owner), as the webhook would have added them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from agent.planner.jobs import Job
from agent.planner.model import Lock, Repair, ReservationStatus
from agent.planner.reservations import is_owner
from shared.config import WindowConfig
from shared.keys import LockKind
from shared.ownership import reservation_owner_id, window_owner_id
from shared.tolerations import lock_toleration, missing
from shared.views import PodView, ReservationView

PodKey = tuple[str, str]  # (namespace, name)


def plan_repairs(*, jobs: Sequence[Job], pods: Sequence[PodView], locks: Mapping[str, Lock],
                 statuses: Sequence[ReservationStatus], reservations: Mapping[str, ReservationView],
                 windows: Sequence[WindowConfig]) -> list[Repair]:
    """Seeds 000, 003, 004 (DESIGN 4 "Repair"): the repairs of one plan, by (namespace, name). `locks` and `statuses`
    are the plan's; `jobs` (jobs.build_jobs), `pods`, `reservations` and `windows` what it was planned from. A pod is
    one per (namespace, name), as the agent's pod cache keys them."""
    owed: dict[PodKey, tuple[PodView, set[str]]] = {}
    for pod, owner in owed_by_job_locks(locks.values(), jobs=jobs):
        owed.setdefault((pod.namespace, pod.name), (pod, set()))[1].add(owner)
    holding = holding_reservations(statuses, reservations=reservations)
    window_owners = holding_windows(locks, windows=windows)
    if holding or window_owners:  # only then are the waiting pods looked at one by one
        waiting = [p for p in pods if not p.is_bound and not p.is_terminal]
        for owner, reservation in holding:
            for pod in waiting:
                if is_owner(reservation, pod):
                    owed.setdefault((pod.namespace, pod.name), (pod, set()))[1].add(owner)
        for pod in waiting:
            if window_owners and pod.reserveable:
                owed.setdefault((pod.namespace, pod.name), (pod, set()))[1].update(window_owners)
    repairs = (repair_of(pod, owners=owners) for _, (pod, owners) in sorted(owed.items(), key=lambda item: item[0]))
    return [repair for repair in repairs if repair is not None]


def owed_by_job_locks(locks: Iterable[Lock], *, jobs: Sequence[Job]) -> Iterator[tuple[PodView, str]]:
    """Seed 000: each task a starvation lock is held for (one of its job's pending pods, by `Lock.tasks`), with the
    lock's owner."""
    job_locks = [lock for lock in locks if lock.kind is LockKind.JOB]
    if not job_locks:
        return
    locked = {lock.owner for lock in job_locks}
    pending = {job.owner: {p.key: p for p in job.pending} for job in jobs if job.owner in locked}
    for lock in job_locks:
        tasks = pending.get(lock.owner, {})
        for task in lock.tasks:
            if task in tasks:
                yield tasks[task], lock.owner


def holding_reservations(statuses: Sequence[ReservationStatus], *,
                         reservations: Mapping[str, ReservationView]) -> list[tuple[str, ReservationView]]:
    """Seed 003: the Reservations planned Available or Waiting and not `unschedulable`, with their owner ids: their
    owner pods are owed their lock's toleration."""
    holding = []
    for status in statuses:
        reservation = reservations.get(status.name)
        if status.phase in ("Available", "Waiting") and reservation is not None and not reservation.unschedulable:
            holding.append((reservation_owner_id(status.name), reservation))
    return holding


def holding_windows(locks: Mapping[str, Lock], *, windows: Sequence[WindowConfig]) -> set[str]:
    """Seed 004: the owner ids of the configured windows holding a lock in this plan: every reserve pod is owed
    their tolerations."""
    locked = {lock.owner for lock in locks.values() if lock.kind is LockKind.WINDOW}
    return {owner for owner in (window_owner_id(w.name) for w in windows) if owner in locked}


def repair_of(pod: PodView, *, owners: Iterable[str]) -> Repair | None:
    """DESIGN 4 "Repair" for seeds 000, 003, 004: the repair of one pod owed the locks of `owners`: the lock tolerations
    it lacks, owners sorted; None when it is bound or lacks none."""
    if pod.is_bound:
        return None
    lacking = missing(pod.tolerations, [lock_toleration(owner) for owner in sorted(owners)])
    if not lacking:
        return None
    return Repair(namespace=pod.namespace, name=pod.name, tolerations=tuple(pod.tolerations), add=tuple(lacking))
