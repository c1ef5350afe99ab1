"""Entitlement (DESIGN section 1): the lock owners a pod may use, decided once, here, from what the pod IS, never from
what it says about itself. The mutating webhook grants tolerations from it, the agent's repair adds them from it, and
the validating check refuses a pod whose lock tolerations or `spec.nodeName` reach further.

A pod may use the lock of:
- its job (its PodGroup, controller, or itself: shared.ownership.job_identity; all in its own namespace);
- its queue, when the Queue lets its namespace in: any namespace by default, as Volcano does; the admin may bind a
  Queue to namespaces with the annotation `reservoir.sh/namespaces: "a,b"`;
- every window it is a reserve pod of (`volcano.sh/reserveable: "true"` on the pod or its PodGroup), limited by the
  window's `namespaces` and `queues` in the config when given;
- every Reservation whose owners match it, while the Reservation is Available (seed 003: "Only owners may use the
  reserved resources"); naming a Reservation (the affinity annotations) never adds one.
Issue 17: the one lock the agent let a pod backfill, on the node it pinned the pod to, while the agent's grant on that
node names the pod's uid and the pod's activeDeadlineSeconds, counted from now, ends it by the grant's `until`
(shared.backfill; `backfill_grant`).
And every lock when it is exempt: a BestEffort pod (no request or limit of any resource, shared.resources), or a pod
of a DaemonSet that exists with the uid its ownerReference gives. A pod of a namespace the admin trusts
(`webhook.trustedNamespaces`) may carry any lock toleration it brings, but is given nothing beyond the rules above.

Exclusive locks (seed 002 policy `Guaranteed`, QueueView.locks_exclusively): "Guaranteed" evicts every other queue's
pod from the queue's nodes, so the BestEffort exemption does not reach them (a BestEffort pod let in would be evicted
again on every reconcile). Their nodes carry a second taint, `reservoir.sh/lock-exclusive` (value: the owner id),
that the BestEffort exemption's toleration (`reservoir.sh/lock` Exists) does not tolerate; the queue's own pods get
its Equal toleration, DaemonSet pods an Exists one. So a BestEffort pod may use an exclusive lock only when it is its
own queue's; a pod that may use an owner's exclusive locks is given both tolerations of that owner.
Who may tolerate an exclusive taint (`Entitlement.entitled_exclusive`): the owner's entitled pods and DaemonSet
pods, and a trusted namespace's whatever it brings. The validating check judges every toleration of that key (Exists
or Equal) by that rule always, whether or not any queue's locks are exclusive now: a toleration let in before a queue
opts in would otherwise be carried onto its nodes once it does. `Guaranteed` spares from eviction only the pods
entitled to the queue's lock (agent.planner.guarantee.guaranteed_evictions), never one merely carrying a toleration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from shared import keys
from shared.backfill import Grant, pinned_to
from shared.config import ReservoirConfig
from shared.ownership import (
    job_of,
    pod_queue,
    podgroup_of,
    queue_of,
    queue_owner_id,
    reservation_owner_id,
    window_owner_id,
)
from shared.reservation_affinity import may_use
from shared.resources import is_best_effort
from shared.timestamps import stamp
from shared.tolerations import (
    BYPASS_TOLERATION,
    EXCLUSIVE_BYPASS_TOLERATION,
    exclusive_toleration,
    owner_tolerations,
    tolerates_taint,
)
from shared.views import PodGroupView, PodView, QueueView, ReservationView, WorkloadView

USABLE_PHASES = ("Available",)
MAX_GRANT_SECONDS = 10**9  # an activeDeadlineSeconds beyond any grant (31 years): refused before any arithmetic


@dataclass(frozen=True)
class Grounds:
    """What entitlement reads besides the pod: snapshots of the watch caches and the config."""

    podgroups: Mapping[tuple[str, str], PodGroupView] = field(default_factory=dict)
    queues: Mapping[str, QueueView] = field(default_factory=dict)
    reservations: Mapping[str, ReservationView] = field(default_factory=dict)
    daemonsets: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (namespace, name) -> uid
    config: ReservoirConfig = field(default_factory=ReservoirConfig)
    # issue 17: the agent's backfill grants by pod uid, with the node each is on (shared.backfill); the webhook's
    # Lookup gives them from its node cache, the planner none (it plans backfill itself)
    backfill_grants: Mapping[str, tuple[str, Grant]] = field(default_factory=dict)
    # issue 32: Kueue's Workloads by their job's (namespace, kind, name) (views.workloads_by_owner), while
    # `kueue.workloads` is on (kueue_queue)
    workloads: Mapping[tuple[str, str, str], WorkloadView] = field(default_factory=dict)

    @cached_property
    def exclusive_owners(self) -> frozenset[str]:
        """Owner ids whose locks are exclusive (module docstring): the `Guaranteed` queues opted into locks, while
        guarantees are enabled. Computed once per grounds (the webhook's Lookup keeps them per cache state)."""
        if not self.config.guarantee.enabled:
            return frozenset()
        return frozenset(queue_owner_id(q.name) for q in self.queues.values() if q.locks_exclusively)


@dataclass(frozen=True)
class Entitlement:
    """The owners a pod may use, each with why; `every_lock` says why it may use every lock (None: it may not).
    `exclusive`: the owners whose locks are exclusive now; `every_lock` reaches them only with `every_exclusive`
    (a DaemonSet's pod, not a BestEffort one)."""

    owners: Mapping[str, str]
    every_lock: str | None = None  # exempt (BestEffort, DaemonSet): the webhook gives it the every-lock toleration
    trusted: str | None = None  # a namespace the admin trusts: whatever it carries is let in, nothing is added
    exclusive: frozenset[str] = frozenset()
    every_exclusive: bool = False

    def allows(self, owner: str) -> bool:
        if self.trusted is not None or owner in self.owners:
            return True
        return self.every_lock is not None and (self.every_exclusive or owner not in self.exclusive)

    @property
    def every_exclusive_lock(self) -> bool:
        """The pod is entitled to every owner's exclusive locks: it is exempt as a DaemonSet's (not as a BestEffort
        pod). Trust is not entitlement: a trusted namespace's pod is let in with what it brings, nothing more."""
        return self.every_lock is not None and self.every_exclusive

    def entitled_exclusive(self, owner: str) -> bool:
        """The pod is entitled to `owner`'s locks when they are exclusive (module docstring, "Exclusive locks"), now or
        later: one of its own owners, or every owner's as a DaemonSet's pod. Never by being BestEffort, never by
        trust, and whether or not `owner`'s locks are exclusive now."""
        return owner in self.owners or self.every_exclusive_lock

    @property
    def barred(self) -> frozenset[str]:
        """The exclusive owners the pod's exemption does not reach (a BestEffort pod's: every other queue's)."""
        if self.trusted is not None or self.every_exclusive:
            return frozenset()
        return self.exclusive - self.owners.keys()

    def tolerations(self) -> list[dict[str, str]]:
        """The lock tolerations the webhook gives the pod (and repair adds): the every-lock ones for an exempt pod
        (with the every-exclusive one for a DaemonSet's), then both tolerations of each owner it may use whose locks
        are exclusive; for any other pod the tolerations of each owner it may use. Owners sorted."""
        if self.every_lock is not None:
            bypass = [BYPASS_TOLERATION] + ([EXCLUSIVE_BYPASS_TOLERATION] if self.every_exclusive else [])
            return bypass + [exclusive_toleration(o) for o in sorted(self.owners) if o in self.exclusive]
        return [t for o in sorted(self.owners) for t in owner_tolerations(o, o in self.exclusive)]


def queue_admits(queue: QueueView | None, namespace: str) -> bool:
    """A Queue lets every namespace use its lock unless its `reservoir.sh/namespaces` annotation lists them."""
    listed = (queue.annotations.get(keys.QUEUE_NAMESPACES, "") if queue is not None else "").strip()
    return not listed or namespace in {n.strip() for n in listed.split(",")}


def admitted_queue(queue: str, queues: Mapping[str, QueueView], namespace: str) -> str | None:
    """The one rule for every use of a queue's name: a pod of `namespace` naming `queue` (its PodGroup's spec.queue
    or its own annotation) is of that queue only when the Queue admits the namespace (`queue_admits`); else None,
    and the name opens nothing: not the queue's lock or guarantee, not a window's `queues`, not backfill's `queues`."""
    return queue if queue_admits(queues.get(queue), namespace) else None


def honoured_queue(named: str, queues: Mapping[str, QueueView], namespace: str) -> str | None:
    """The queue a pod of `namespace` naming `named` is of for the planner's queue order and usage and for backfill's
    `queues` (the webhook's gate and the agent's decision alike): `admitted_queue`, when a Queue of that name exists
    or it is the default queue (Volcano's, assumed when absent); None when the Queue does not admit the namespace,
    or no Queue has that name (issue 29: such a name would otherwise be a queue of its own with no usage, ranked
    ahead of every real one, and a tenant-sized entry in the published status). The pod then counts for no queue."""
    if named not in queues and named != keys.DEFAULT_QUEUE:
        return None
    return admitted_queue(named, queues, namespace)


def kueue_queue(job: tuple[str, str, str] | None,
                workloads: Mapping[tuple[str, str, str], WorkloadView]) -> str | None:
    """Issue 32: the ClusterQueue that admitted the Kueue Workload of `job` (namespace, kind, name; the Workload found
    by its controller ownerReference, views.workloads_by_owner), while Kueue admits it; None for any other job, or a
    Workload not admitted (or unknown: `kueue.workloads` off). Read from the Workload's status, which Kueue writes,
    never from a pod's labels. A ClusterQueue is matched by its name where windows' and backfill's `queues` name
    queues; queue usage, guarantees and order stay the pod's Volcano queue's."""
    workload = workloads.get(job) if job is not None else None
    return workload.cluster_queue if workload is not None and workload.admitted else None


def pods_queue(pod: PodView, podgroups: Mapping[tuple[str, str], PodGroupView],
               queues: Mapping[str, QueueView]) -> str | None:
    """`honoured_queue` of the queue a pod view names (shared.ownership.pod_queue)."""
    return honoured_queue(pod_queue(pod, podgroups), queues, pod.namespace)


def backfill_queue(pod: PodView, grounds: Grounds) -> str | None:
    """The queue backfill's `queues` is matched against (the webhook's gate and the agent's decision alike): the
    ClusterQueue of the pod's Kueue Workload (kueue_queue, issue 32), else `pods_queue`."""
    return kueue_queue(pod.job, grounds.workloads) or pods_queue(pod, grounds.podgroups, grounds.queues)


def daemonset_exemption(meta: Mapping[str, Any], namespace: str,
                        daemonsets: Mapping[tuple[str, str], str]) -> str | None:
    """Why a pod is a real DaemonSet's (its controller reference names a DaemonSet that exists with that uid), or
    None: an ownerReference is something any tenant can write."""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") == "DaemonSet":
            name, uid = str(ref.get("name") or ""), str(ref.get("uid") or "")
            if uid and daemonsets.get((namespace, name)) == uid:
                return f"a pod of DaemonSet {namespace}/{name}"
    return None


def exemption(pod: Mapping[str, Any], namespace: str, grounds: Grounds,
              best_effort: bool | None = None) -> tuple[str, bool] | None:
    """Why the pod may use every lock, and whether exclusive ones too (a DaemonSet's pod: yes; a BestEffort pod: no),
    or None. `best_effort`, when known (a pod view), saves reading the spec."""
    meta = pod.get("metadata") or {}
    config = grounds.config.webhook
    if best_effort is None:
        best_effort = is_best_effort(pod.get("spec") or {})
    if config.tolerate_daemonsets:
        daemon = daemonset_exemption(meta, namespace, grounds.daemonsets)
        if daemon is not None:
            return daemon, True
    if config.tolerate_best_effort and best_effort:
        return "a BestEffort pod (no request or limit of any resource)", False
    return None


def is_reserve_pod(annotations: Mapping[str, Any], podgroup: PodGroupView | None) -> bool:
    """Seed 004, the one rule (the webhook's entitlement and the planner's reserve.is_reserve_pod): the pod's own
    `volcano.sh/reserveable` when it has one ("true": a reserve pod; anything else: not), else its PodGroup's
    (PodGroupView.reserveable). `annotations`: the pod's."""
    value = annotations.get(keys.RESERVEABLE)
    if value is not None:
        return bool(value == "true")
    return podgroup is not None and podgroup.reserveable


def entitlement(pod: Mapping[str, Any], namespace: str, grounds: Grounds,
                reservations: Iterable[ReservationView] | None = None, best_effort: bool | None = None) -> Entitlement:
    """The lock owners `pod` in `namespace` may use (module docstring). `pod` is API JSON; only `metadata` is read
    when `best_effort` is given (the planner passes its pod view's). `reservations`, when given, are the candidates
    to match (the webhook's index narrows them); by default every Reservation."""
    exempt = exemption(pod, namespace, grounds, best_effort)
    trusted = (f"namespace {namespace} is trusted (webhook.trustedNamespaces)"
               if namespace in grounds.config.webhook.trusted_namespaces else None)
    owners: dict[str, str] = {}
    job = job_of(pod, namespace)
    if job is not None:
        owners[job.owner_id] = f"its job {job.full_name}"
    podgroup = podgroup_of(pod, namespace, grounds.podgroups)
    queue = admitted_queue(queue_of(pod, podgroup), grounds.queues, namespace)
    if queue is not None:
        owners[queue_owner_id(queue)] = f"its queue {queue}"
    # issue 32: a Kueue Workload's pod is of its ClusterQueue too, for windows' `queues`
    named = {q for q in (queue, kueue_queue((namespace, job.kind, job.name) if job else None, grounds.workloads))
             if q is not None}
    if is_reserve_pod((pod.get("metadata") or {}).get("annotations") or {}, podgroup):
        for window in grounds.config.windows:
            if (not window.namespaces or namespace in window.namespaces) and (
                    not window.queues or bool(named & set(window.queues))):
                owners[window_owner_id(window.name)] = f"a reserve pod of window {window.name}"
    for reservation in grounds.reservations.values() if reservations is None else reservations:
        # issue 18: owners by Koordinator's rules, reservation-ignored and spec.taints (shared.reservation_affinity);
        # a Koordinator Reservation another writer serves is not Reservoir's to hand over
        if (reservation.phase in USABLE_PHASES and not reservation.unschedulable and not reservation.second_writer
                and may_use(reservation, pod, namespace)):
            owners[reservation_owner_id(reservation.key)] = f"an owner of Reservation {reservation.key}"
    granted = backfill_grant(pod, namespace, grounds)
    if granted is not None:
        node, grant = granted
        owners.setdefault(grant.owner, f"it backfills node {node} until {stamp(grant.until)} (the agent's grant)")
    every, every_exclusive = exempt if exempt is not None else (None, False)
    return Entitlement(owners, every, trusted, grounds.exclusive_owners, every_exclusive)


def backfill_grant(pod: Mapping[str, Any], namespace: str, grounds: Grounds) -> tuple[str, Grant] | None:
    """Issue 17: the agent's grant for this pod (by its uid, which only the API server sets, and its name), with the
    node it is on, when the pod is pinned to that node (shared.backfill.pinned_to); None else. What the pod says of
    itself plays no part: the grant is on the node, which tenants cannot write."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    found = grounds.backfill_grants.get(uid) if isinstance(uid, str) and uid else None
    if found is None:
        return None
    node, grant = found
    spec = pod.get("spec")
    if grant.pod != f"{namespace}/{meta.get('name')}" or not isinstance(spec, Mapping) or not pinned_to(spec, node):
        return None
    deadline = spec.get("activeDeadlineSeconds")
    if not isinstance(deadline, int) or isinstance(deadline, bool) or not 0 < deadline <= MAX_GRANT_SECONDS:
        return None  # the agent gives the toleration and the deadline in one patch: never one without the other
    # the pod, bound at the earliest now, is ended by the kubelet by the grant's `until` (the clock is read only when a
    # grant names the pod: the planner's grounds have none)
    if datetime.now(UTC) + timedelta(seconds=deadline) > grant.until:
        return None
    return found


@dataclass(frozen=True)
class Claim:
    """A toleration that lets a pod onto locked nodes: of one owner, or (owner None) of every owner; `exclusive`: it
    tolerates the exclusive taint (keys.LOCK_EXCLUSIVE), not the lock taint."""

    index: int
    owner: str | None
    toleration: Mapping[str, Any]
    exclusive: bool = False


def lock_claims(tolerations: Sequence[Any]) -> list[Claim]:
    """The pod's tolerations that tolerate some `reservoir.sh/lock` or `reservoir.sh/lock-exclusive` taint (the one
    rule, shared.tolerations), one claim per taint key: an `Equal` one tolerates its value's owner; an `Exists` one
    with that key or no key tolerates every owner."""
    claims = []
    for index, toleration in enumerate(tolerations):
        if not isinstance(toleration, Mapping):
            continue
        for key, exclusive in ((keys.LOCK, False), (keys.LOCK_EXCLUSIVE, True)):
            if (toleration.get("operator") or "Equal") == "Exists":
                if tolerates_taint(toleration, key, "", keys.LOCK_EFFECT):
                    claims.append(Claim(index, None, toleration, exclusive))
            elif tolerates_taint(toleration, key, str(toleration.get("value") or ""), keys.LOCK_EFFECT):
                claims.append(Claim(index, str(toleration.get("value") or ""), toleration, exclusive))
    return claims


def unentitled(pod: Mapping[str, Any], namespace: str, rights: Entitlement,
               lock_of_node: Mapping[str, str]) -> list[str]:
    """Why the pod reaches locked capacity it is not entitled to: each lock toleration beyond its rights, and a
    `spec.nodeName` on a node locked for an owner it may not use (`lock_of_node`: node -> owner id). Empty: fine.
    An exempt pod's claims of the lock key are judged only where its exemption stops (a BestEffort pod's: the
    exclusive locks of other queues, `Entitlement.barred`); every claim of the exclusive key is judged by
    `Entitlement.entitled_exclusive` always, whether or not any lock is exclusive now (module docstring)."""
    if rights.trusted is not None or rights.every_exclusive_lock:
        return []
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or ()
    problems = []
    judged: set[tuple[int, str | None]] = set()  # a toleration of no key claims both keys: judged once
    for claim in lock_claims(tolerations if isinstance(tolerations, Sequence) else ()):
        where = f"spec.tolerations[{claim.index}]"
        if (claim.index, claim.owner) in judged:
            continue
        if claim.exclusive and claim.owner is None:
            if rights.every_lock is not None:
                now = f", among them those of {', '.join(sorted(rights.barred))}" if rights.barred else ""
                problems.append(f"{where} {dict(claim.toleration)} tolerates every exclusive Reservoir lock (a "
                                f"Guaranteed queue's{now}), which {rights.every_lock} may not use; remove it or name "
                                f"the key {keys.LOCK}")
            else:
                problems.append(f"{where} {dict(claim.toleration)} tolerates every exclusive Reservoir lock: only "
                                "DaemonSet pods and trusted namespaces may; remove it")
            judged.add((claim.index, claim.owner))
        elif claim.exclusive and claim.owner is not None:
            if not rights.entitled_exclusive(claim.owner):
                problems.append(f"{where} tolerates the exclusive lock of {claim.owner}, which this pod may not use "
                                f"({_may_use(rights)}); remove it")
                judged.add((claim.index, claim.owner))
        elif claim.owner is None:
            if rights.every_lock is None:
                problems.append(f"{where} {dict(claim.toleration)} tolerates every Reservoir lock: only BestEffort "
                                "pods, DaemonSet pods and trusted namespaces may; remove it")
                judged.add((claim.index, claim.owner))
        elif not rights.allows(claim.owner):
            problems.append(f"{where} tolerates the lock of {claim.owner}, which this pod may not use ("
                            f"{_may_use(rights)}); remove it")
            judged.add((claim.index, claim.owner))
    node = spec.get("nodeName")
    if isinstance(node, str) and node in lock_of_node and not rights.allows(lock_of_node[node]):
        problems.append(f"spec.nodeName {node!r} is locked for {lock_of_node[node]}, which this pod may not use "
                        f"({_may_use(rights)}); leave spec.nodeName empty and let the scheduler place it")
    return problems


def _may_use(rights: Entitlement) -> str:
    if not rights.owners:
        return "it may use no lock"
    return "it may use: " + ", ".join(f"{owner} ({why})" for owner, why in sorted(rights.owners.items()))
