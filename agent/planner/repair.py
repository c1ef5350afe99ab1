"""DESIGN section 4 "Repair": the pending pods a lock of this plan is held for but that lack its toleration (created
while the webhook was down, or before Reservoir was installed), and the lock tolerations to add to each.

A pod is owed the toleration of an owner's lock when, in this plan, the lock is held and the pod is entitled to it
(shared.entitlement.entitlement, the one function the webhook and the validating check call too):
- it is a task a starvation lock (seed 000) names (`Lock.tasks`, pending pods of the lock's job);
- it is an unbound, unfinished owner pod (reservations.is_owner) of a Reservation (seed 003) whose planned phase is
  Available or Waiting and that is not `unschedulable`; entitlement then admits only Reservations Available, read
  with the phase this plan gives them (the writer writes it in the same reconcile), so the owners of a Waiting one get
  nothing yet;
- it is an unbound, unfinished reserve pod (`volcano.sh/reserveable`, seed 004) and a configured window holds a lock:
  the owner ids of the windows holding locks, as far as the windows' `namespaces` and `queues` let the pod in;
- it is an unbound, unfinished pod of a queue (shared.ownership: its PodGroup's `spec.queue`, else its
  `scheduling.volcano.sh/queue-name`, else `default`) whose guarantee holds a lock (seed 002), as far as the Queue's
  `reservoir.sh/namespaces` lets the pod in.
Entitlement is read from the grounds of `grounds_of` (the snapshot's PodGroups, Queues, Reservations and DaemonSets,
the config), as the webhook reads them: a DaemonSet's pod is exempt when its DaemonSet exists with that uid.

Besides: a pending pod of a DaemonSet in a namespace the webhook skips (kube-system, Reservoir's own) whose required
node affinity names a node (matchFields metadata.name In [node], as the DaemonSet controller writes it) that this plan
locks is owed that lock's toleration: the webhook never saw it, and the node is the only one it may run on.
(PodView.daemon_node: that node, read once from the pod spec by shared.ownership.daemonset_node.)

Bound pods are past help (a pod update may add tolerations, but the pod is placed already). The tolerations added are
those of `owner_tolerations(owner, exclusive)`, owners sorted, that the pod's own tolerations do not already cover (an
`Exists` toleration of the lock key covers every owner's lock taint), as the webhook would have added them: the lock
toleration, and for an owner whose lock in this plan is exclusive (a `Guaranteed` queue's, Lock.exclusive) the
exclusive one too (which a BestEffort pod's every-lock toleration does not cover).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

from agent.planner.jobs import Job
from agent.planner.model import Lock, Repair, ReservationStatus, Snapshot
from agent.planner.reservations import is_owner, pod_meta
from agent.planner.reserve import is_reserve_pod
from shared import keys
from shared.config import ReservoirConfig, WindowConfig
from shared.entitlement import Entitlement, Grounds, entitlement
from shared.keys import LockKind
from shared.ownership import pod_queue, queue_owner_id, reservation_owner_id, window_owner_id
from shared.tolerations import missing, owner_tolerations
from shared.views import PodGroupView, PodView, ReservationView

PodKey = tuple[str, str]  # (namespace, name)

SKIPPED_NAMESPACES = keys.SYSTEM_NAMESPACES  # the webhook configurations' namespaceSelector


def grounds_of(snapshot: Snapshot | None, config: ReservoirConfig | None, *,
               reservations: Mapping[str, ReservationView] | None = None,
               windows: Sequence[WindowConfig] | None = None) -> Grounds:
    """Entitlement's grounds in the planner: the snapshot's PodGroups, Queues, Reservations and DaemonSets and the
    config. Without a snapshot or config, what is given instead (`reservations`, `windows` on the default config)."""
    if config is None:
        config = ReservoirConfig().model_copy(update={"windows": list(windows or ())})
    if snapshot is None:
        return Grounds(reservations=reservations or {}, config=config)
    return snapshot.grounds(config)


def plan_repairs(*, jobs: Sequence[Job], pods: Sequence[PodView], locks: Mapping[str, Lock],
                 statuses: Sequence[ReservationStatus], reservations: Mapping[str, ReservationView],
                 windows: Sequence[WindowConfig], snapshot: Snapshot | None = None,
                 config: ReservoirConfig | None = None) -> list[Repair]:
    """Seeds 000, 003, 004 (DESIGN 4 "Repair"): the repairs of one plan, by (namespace, name). `locks` and `statuses`
    are the plan's; `jobs` (jobs.build_jobs), `pods`, `reservations` and `windows` what it was planned from;
    `snapshot` and `config`, when given, the grounds of entitlement (grounds_of) and the DaemonSet pods' target
    nodes. A pod is one per (namespace, name), as the agent's pod cache keys them."""
    grounds = grounds_of(snapshot, config, reservations=reservations, windows=windows)
    grounds = replace(grounds, reservations=planned_phases(grounds.reservations, statuses))
    owed: dict[PodKey, tuple[PodView, set[str]]] = {}
    for pod, owner in owed_by_job_locks(locks.values(), jobs=jobs):
        owed.setdefault((pod.namespace, pod.name), (pod, set()))[1].add(owner)
    holding = holding_reservations(statuses, reservations=reservations)
    window_owners = holding_windows(locks, windows=windows)
    queue_owners = holding_queues(locks)
    if holding or window_owners or queue_owners:  # only then are the waiting pods looked at one by one
        waiting = [p for p in pods if not p.is_bound and not p.is_terminal]
        for pod, owner in owed_by_queue_locks(waiting, queue_owners=queue_owners, podgroups=grounds.podgroups):
            owed.setdefault((pod.namespace, pod.name), (pod, set()))[1].add(owner)
        for owner, reservation in holding:
            for pod in waiting:
                if is_owner(reservation, pod):
                    owed.setdefault((pod.namespace, pod.name), (pod, set()))[1].add(owner)
        for pod in waiting:
            if window_owners and is_reserve_pod(pod, grounds.podgroups):  # on the pod or its PodGroup
                owed.setdefault((pod.namespace, pod.name), (pod, set()))[1].update(window_owners)
    entitled = {key: (pod, allowed(rights_of(pod, grounds), owners)) for key, (pod, owners) in owed.items()}
    for pod, owner in owed_by_daemon_targets(pods, locks=locks):
        entitled.setdefault((pod.namespace, pod.name), (pod, set()))[1].add(owner)
    exclusive = frozenset(lock.owner for lock in locks.values() if lock.exclusive)
    repairs = (repair_of(pod, owners=owners, exclusive=exclusive)
               for _, (pod, owners) in sorted(entitled.items(), key=lambda item: item[0]))
    return [repair for repair in repairs if repair is not None]


def planned_phases(reservations: Mapping[str, ReservationView],
                   statuses: Sequence[ReservationStatus]) -> dict[str, ReservationView]:
    """The Reservations with the phase this plan gives each (entitlement reads `phase`): a Reservation placed in this
    plan is Available for its owners now, not one reconcile later."""
    phases = {status.name: status.phase for status in statuses}
    return {name: r if phases.get(name, r.phase) == r.phase else replace(r, phase=phases[name])
            for name, r in reservations.items()}


def allowed(rights: Entitlement, owners: Iterable[str]) -> set[str]:
    """Those of `owners` the pod's entitlement (computed once per pod, not per owner) lets it use."""
    return {owner for owner in owners if rights.allows(owner)}


def rights_of(pod: PodView, grounds: Grounds) -> Entitlement:
    """The lock owners the pod may use (shared.entitlement), from its view's metadata and BestEffort-ness."""
    return entitlement(pod_meta(pod), pod.namespace, grounds, best_effort=pod.best_effort)


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
    owner pods may be owed their lock's toleration (as far as entitlement allows)."""
    holding = []
    for status in statuses:
        reservation = reservations.get(status.name)
        if status.phase in ("Available", "Waiting") and reservation is not None and not reservation.unschedulable:
            holding.append((reservation_owner_id(status.name), reservation))
    return holding


def holding_windows(locks: Mapping[str, Lock], *, windows: Sequence[WindowConfig]) -> set[str]:
    """Seed 004: the owner ids of the configured windows holding a lock in this plan: reserve pods may be owed their
    tolerations (as far as entitlement allows)."""
    locked = {lock.owner for lock in locks.values() if lock.kind is LockKind.WINDOW}
    return {owner for owner in (window_owner_id(w.name) for w in windows) if owner in locked}


def holding_queues(locks: Mapping[str, Lock]) -> frozenset[str]:
    """Seed 002: the owner ids of the queues whose guarantee holds a lock in this plan."""
    return frozenset(lock.owner for lock in locks.values() if lock.kind is LockKind.QUEUE)


def owed_by_queue_locks(waiting: Iterable[PodView], *, queue_owners: frozenset[str],
                        podgroups: Mapping[tuple[str, str], PodGroupView]) -> Iterator[tuple[PodView, str]]:
    """Seed 002: each waiting pod of a queue holding a lock (`queue_owners`), with that queue's owner id."""
    if not queue_owners:
        return
    for pod in waiting:
        owner = queue_owner_id(pod_queue(pod, podgroups))
        if owner in queue_owners:
            yield pod, owner


def owed_by_daemon_targets(pods: Sequence[PodView], *, locks: Mapping[str, Lock]) -> Iterator[tuple[PodView, str]]:
    """The pending pods of a DaemonSet in a namespace the webhook skips whose target node (PodView.daemon_node) this
    plan locks, with that lock's owner."""
    if not locks:
        return
    for pod in pods:
        if (pod.namespace in SKIPPED_NAMESPACES and pod.daemon and pod.phase == "Pending" and not pod.is_bound
                and not pod.deleting):
            node = pod.daemon_node
            lock = locks.get(node) if node else None
            if lock is not None:
                yield pod, lock.owner


def repair_of(pod: PodView, *, owners: Iterable[str], exclusive: Collection[str] = ()) -> Repair | None:
    """DESIGN 4 "Repair" for seeds 000, 002, 003, 004: the repair of one pod owed the locks of `owners`: the lock
    tolerations it lacks (both of an owner in `exclusive`), owners sorted; None when it is bound or lacks none."""
    if pod.is_bound:
        return None
    lacking = missing(pod.tolerations, [t for owner in sorted(owners)
                                        for t in owner_tolerations(owner, owner in exclusive)])
    if not lacking:
        return None
    return Repair(namespace=pod.namespace, name=pod.name, tolerations=tuple(pod.tolerations), add=tuple(lacking))
