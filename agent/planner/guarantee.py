"""Seed 002, queue guarantees (DESIGN 4.2): lock a combination of nodes whose allocatable covers a queue's request.

Opt-in (`guaranteed_queues`): only a Queue annotated `reservoir.sh/lock-guarantee: "true"` gets locks for its
`spec.guarantee` (QueueView.locks_guarantee). In a Volcano cluster `spec.guarantee.resource` already means something
(Volcano's quota floor), and Volcano's Queue schema prunes every field it does not declare, so the opt-in is an
annotation; a guarantee without it locks nothing, evicts nothing, and its status says so (`not_opted_in`). This
departs from the seed, whose guarantee locks as soon as it is written.

Request (`guarantee_request`). `guarantee.resource` R, and/or `guarantee.percentage {dimensions, value}`:
floor(schedulable nodes x value) nodes ("math.Floor(clusterNodeNumber * percentage)"), counted exactly: the value is
the decimal as written (QueueView reads it as a Fraction), so 0.29 x 100 nodes is 29, not the 28 a float product
floors to. The seed's dimension `gpu` stands for the extended resource `guarantee.gpuResource` (default
nvidia.com/gpu; `dimension_resource`). With both, each is placed and "the one with more reserved resources" wins:
the one holding more of the percentage's dimensions (as shares of the cluster, summed) (`more_reserved`). A request
above `spec.capability` or the cluster's schedulable allocatable is refused with a warning (`refuse_oversize`; "The
request cannot be more than the total resource amount of cluster", "If `capability` is set, request must be no more
than it"): reported, not locked (it would lock the whole cluster).

Candidates: schedulable nodes not taken by a policy before this one and open to a queue by the displacement table
(displacement.DISPLACES: not another queue's or a Reservation's, nor a live job's). The combination for R is found
by guarantee_search.search (its docstring gives the seed's score and the bounded search) over the queue's own nodes
and, per coarse shape (guarantee_search.shape_of), the most idle candidates (`search_pool`). A queue already holding a
covering combination keeps it unless a fresh search scores more than 5% better (no churn as idle moves).

Policy `Guaranteed` ("scheduler will reserve resource without evicting running workloads [for Best-Effort], while
"Guaranteed" is opposite"): the pods of other queues on the locked nodes are to be evicted (`guaranteed_evictions`),
never those the guard rails keep (`never_evicted`: kube-system, Reservoir's namespace and
`guarantee.protectedNamespaces`, mirror pods, DaemonSet pods, system-critical priority). Its locks are exclusive
(Lock.exclusive; shared.entitlement "Exclusive locks"): the node also carries `reservoir.sh/lock-exclusive`, which
the BestEffort exemption does not tolerate, so an evicted BestEffort pod's replacement does not land there again.
Spared are only the pods entitled to the queue's lock (shared.entitlement, the one rule: the queue's own pods as far
as its `reservoir.sh/namespaces` lets them in), and a trusted namespace's pod that tolerates the exclusive taint (the
admin lets it carry what it brings; it would only come back). A pod that merely carries a toleration of the
exclusive taint (one let in before the queue opted in, or written by hand) is evicted like any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction

from agent.planner.capacity import NodeState, schedulable
from agent.planner.displacement import may_take
from agent.planner.guarantee_search import Problem, best_of_each_shape, search, shape_of
from agent.planner.model import Lock, QueueGuaranteeStatus, Snapshot
from agent.planner.policy import PlanContext, Policy, PolicyResult, Statuses, kept_since
from agent.planner.reservations import pod_meta
from shared import keys
from shared.config import ReservoirConfig
from shared.entitlement import Grounds, entitlement
from shared.keys import LockKind
from shared.ownership import queue_owner_id
from shared.resources import EMPTY, Resources
from shared.tolerations import tolerates_exclusive
from shared.views import Guarantee, PodView, QueueView

KEEP_MARGIN = 0.05


@dataclass
class Cluster:
    """Seed 002: what every queue's placement shares within one plan: computed once, not per queue."""

    states: Mapping[str, NodeState]
    schedulable: list[str]
    total: Resources  # allocatable of the schedulable nodes
    groups: dict[Resources, list[str]]  # coarse shape (shape_of) -> schedulable nodes, most idle first, then name

    @classmethod
    def of(cls, states: Mapping[str, NodeState]) -> Cluster:
        names = sorted(n for n, s in states.items() if schedulable(s.node))
        groups: dict[Resources, list[str]] = {}
        for name in names:
            groups.setdefault(shape_of(states[name].node.allocatable), []).append(name)
        for members in groups.values():
            members.sort(key=lambda n: (-sum(states[n].idle.values()), n))
        return cls(states, names, Resources.total(states[n].node.allocatable for n in names), groups)


@dataclass(frozen=True, kw_only=True)
class Option:
    """One way to meet a guarantee: the nodes chosen for its `resource` or for its `percentage`."""

    source: str  # "resource" or "percentage"
    nodes: Sequence[str]


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """Seed 002: why a guarantee gets no lock in this plan."""

    reason: str
    warning: bool = False  # reported as a Warning Event (a request too large to ever be met)


@dataclass(frozen=True, kw_only=True)
class QueueSeat:
    """Seed 002: one queue's guarantee within one plan: the queue, its lock owner, and the nodes open to it."""

    queue: QueueView
    guarantee: Guarantee
    owner: str
    cluster: Cluster
    usage: Mapping[str, Resources]  # the queue's requests per node
    taken: frozenset[str]  # nodes locked in this plan before this queue
    current: Mapping[str, Lock]  # node -> its lock now
    available: Callable[[str], bool]  # the node is open to this queue (module docstring, "Candidates")
    held: list[str]  # schedulable nodes the queue holds now and may keep
    gpu_resource: str = "nvidia.com/gpu"  # what the seed's `gpu` dimension stands for (guarantee.gpuResource)


def guaranteed_queues(snapshot_queues: Mapping[str, QueueView], config: ReservoirConfig) -> list[QueueView]:
    """Seed 002: the queues with a `spec.guarantee` opted into locks (module docstring, "Opt-in"), when guarantees
    are enabled."""
    if not config.guarantee.enabled:
        return []
    return [q for q in snapshot_queues.values() if q.locks_guarantee]


NOT_OPTED_IN = (f"not locked: Reservoir locks nodes for a guarantee only when the Queue is annotated "
                f"{keys.QUEUE_LOCK_GUARANTEE}=\"true\"")


def not_opted_in(snapshot_queues: Mapping[str, QueueView],
                 config: ReservoirConfig) -> tuple[list[QueueGuaranteeStatus], list[str]]:
    """Seed 002 opt-in: a status and a note for each Queue whose guarantee is left alone, saying why (no lock, no
    eviction, no Warning Event); by name."""
    if not config.guarantee.enabled:
        return [], []
    waiting = sorted((q for q in snapshot_queues.values() if q.guarantee is not None and not q.locks_guarantee),
                     key=lambda q: q.name)
    statuses = [QueueGuaranteeStatus(q.name, (), EMPTY, q.guarantee.policy if q.guarantee else "", NOT_OPTED_IN)
                for q in waiting]
    return statuses, [f"queue={q.name} decision=no-lock reason={NOT_OPTED_IN}" for q in waiting]


def plan_guarantees(*, context: PlanContext) -> PolicyResult:
    """Seed 002: locks for every guaranteed queue (opted in), in QueueScoreOrder (seed 001), each within what the
    queues before it left of the budget; a status for each guarantee not opted in."""
    queues = guaranteed_queues(context.snapshot.queues, context.config)
    left_alone, left_alone_notes = not_opted_in(context.snapshot.queues, context.config)
    if not queues:
        return PolicyResult(statuses=Statuses(guarantees=tuple(left_alone)), notes=tuple(left_alone_notes))
    cluster = Cluster.of(context.states)
    rank = {s.name: i for i, s in enumerate(context.scores)}
    locks: dict[str, Lock] = {}
    statuses: list[QueueGuaranteeStatus] = list(left_alone)
    notes: list[str] = list(left_alone_notes)
    for queue in sorted(queues, key=lambda q: (rank.get(q.name, len(rank)), q.name)):
        queue_locks, status, note = guarantee_queue(queue, context=context, cluster=cluster)
        locks.update(queue_locks)
        statuses.append(status)
        notes += [note] if note else []
        context = context.after(queue_locks)
    return PolicyResult(locks=locks, statuses=Statuses(guarantees=tuple(statuses)), notes=tuple(notes))


def guarantee_queue(queue: QueueView, *, context: PlanContext,
                    cluster: Cluster) -> tuple[dict[str, Lock], QueueGuaranteeStatus, str | None]:
    """Seed 002: one queue's locks, status and note, at most `context.budget` nodes, never on `context.taken`."""
    guarantee = queue.guarantee
    assert guarantee is not None, "guaranteed_queues hands over queues with a guarantee only"
    oversize = refuse_oversize(queue, guarantee=guarantee, cluster=cluster)
    if oversize is not None:
        return refused(queue, guarantee=guarantee, refusal=oversize)
    seat = queue_seat(queue, guarantee=guarantee, context=context, cluster=cluster)
    options = guarantee_request(seat, search_budget=context.config.guarantee.search_budget)
    if isinstance(options, Refusal):
        return refused(queue, guarantee=guarantee, refusal=options)
    chosen = more_reserved(options, guarantee=guarantee, cluster=cluster, gpu=seat.gpu_resource)
    if len(chosen.nodes) > context.budget:
        why = f"needs {len(chosen.nodes)} nodes, {context.budget} left within maxLockedNodePercent"
        return refused(queue, guarantee=guarantee, refusal=Refusal(reason=why))
    locks = queue_locks(seat, chosen=chosen, current=context.current, now=context.now)
    nodes = tuple(sorted(chosen.nodes))
    evict = guaranteed_evictions(seat, nodes=nodes, context=context)
    idle = Resources.total(cluster.states[n].idle for n in chosen.nodes)
    return locks, QueueGuaranteeStatus(queue.name, nodes, idle, guarantee.policy,
                                       f"holding {len(nodes)} nodes ({chosen.source})", evict=evict), None


def refused(queue: QueueView, *, guarantee: Guarantee,
            refusal: Refusal) -> tuple[dict[str, Lock], QueueGuaranteeStatus, str]:
    """Seed 002, a guarantee not placed: no lock; the status says why (as a warning when the request can never be met),
    and so does the note."""
    why = refusal.reason
    status = QueueGuaranteeStatus(queue.name, (), EMPTY, guarantee.policy, why, why if refusal.warning else None)
    return {}, status, f"queue={queue.name} decision=no-lock reason={why}"


def refuse_oversize(queue: QueueView, *, guarantee: Guarantee, cluster: Cluster) -> Refusal | None:
    """Seed 002 "Resource Request": "If `capability` is set, request must be no more than it at all dimensions";
    "The request cannot be more than the total resource amount of cluster at all dimensions"."""
    if guarantee.resource and queue.capability:
        over = [d for d, v in guarantee.resource.items() if d in queue.capability and v > queue.capability[d]]
        if over:
            return Refusal(reason=f"guarantee.resource exceeds spec.capability in {', '.join(over)}", warning=True)
    if guarantee.resource and not cluster.total.covers(guarantee.resource):
        return Refusal(reason=f"guarantee.resource {guarantee.resource.to_quantities()} is more than the cluster's "
                              f"schedulable allocatable {cluster.total.to_quantities()}", warning=True)
    return None


def queue_seat(queue: QueueView, *, guarantee: Guarantee, context: PlanContext, cluster: Cluster) -> QueueSeat:
    """Seed 002 "Nodes locked by another queue cannot be chosen": the queue's owner id, the nodes open to it
    (displacement.may_take, not taken) and those it holds now."""
    owner = queue_owner_id(queue.name)
    taken, current, live_jobs = context.taken, context.current, context.live_jobs

    def available(n: str) -> bool:
        return n not in taken and may_take(LockKind.QUEUE, current.get(n), owner=owner, live_jobs=live_jobs)

    states = cluster.states
    held = [n for n, lock in current.items() if lock.owner == owner and n in states and schedulable(states[n].node)
            and available(n)]
    return QueueSeat(queue=queue, guarantee=guarantee, owner=owner, cluster=cluster,
                     usage=context.usage.get(queue.name, {}), taken=taken, current=current, available=available,
                     held=held, gpu_resource=context.config.guarantee.gpu_resource)


def guarantee_request(seat: QueueSeat, *, search_budget: int) -> list[Option] | Refusal:
    """Seed 002 `guarantee.resource` and `guarantee.percentage`: the nodes for each one the queue sets, or why
    the guarantee cannot be placed."""
    options: list[Option] = []
    if seat.guarantee.resource:
        by_resource = resource_option(seat, search_budget=search_budget)
        if isinstance(by_resource, Refusal):
            return by_resource
        options.append(by_resource)
    if seat.guarantee.percentage_value is not None:
        by_percentage = percentage_option(seat, value=seat.guarantee.percentage_value, gpu=seat.gpu_resource)
        if isinstance(by_percentage, Refusal):
            return by_percentage
        if by_percentage is not None:
            options.append(by_percentage)
    if not options:
        return Refusal(reason="guarantee asks for nothing (percentage rounds down to 0 nodes)")
    return options


def resource_option(seat: QueueSeat, *, search_budget: int) -> Option | Refusal:
    """Seed 002 `guarantee.resource`: the combination the search finds over search_pool, or the nodes the queue
    holds when they still cover and score within KEEP_MARGIN of it."""
    cluster, request, states = seat.cluster, seat.guarantee.resource, seat.cluster.states
    taken, current = seat.taken, seat.current
    unavailable = [n for n in cluster.schedulable if n in taken or (n in current and not seat.available(n))]
    total_alloc = cluster.total - Resources.total(states[n].node.allocatable for n in unavailable)
    ordered = search_pool(seat)
    problem = Problem(names=ordered, alloc=[states[n].node.allocatable for n in ordered],
                      idle=[states[n].idle for n in ordered], used=[seat.usage.get(n, EMPTY) for n in ordered],
                      request=request, total_alloc=total_alloc, total_used=Resources.total(seat.usage.values()))
    index = {n: i for i, n in enumerate(ordered)}
    found = search(problem, search_budget)
    held = [index[n] for n in seat.held]
    if seat.held and problem.covers(held) and (found is None or problem.score(held) >= found[0] * (1 - KEEP_MARGIN)):
        return Option(source="resource", nodes=seat.held)
    if found is not None:
        return Option(source="resource", nodes=[ordered[i] for i in found[1]])
    return Refusal(reason=f"guarantee.resource {request.to_quantities()} cannot be covered by the nodes not held "
                          "by other queues or jobs")


def search_pool(seat: QueueSeat) -> list[str]:
    """Seed 002: the nodes handed to the search, by name: the queue's own (those its pods use, those it holds) and, per
    coarse shape, the most idle open nodes, as many as the shape needs alone plus one
    (guarantee_search.best_of_each_shape, the rule the search applies again within)."""
    states, available = seat.cluster.states, seat.available
    names = {n for n in seat.usage if n in states and schedulable(states[n].node) and available(n)} | set(seat.held)
    names.update(best_of_each_shape(seat.guarantee.resource, seat.cluster.groups, usable=available))
    return sorted(names)


def dimension_resource(dimension: str, gpu: str) -> str:
    """Seed 002 percentage dimensions: the seed's `gpu` is the extended resource `guarantee.gpuResource`; any other
    dimension is a resource name already."""
    return gpu if dimension == keys.GPU_DIMENSION else dimension


def percentage_option(seat: QueueSeat, *, value: Fraction, gpu: str) -> Option | Refusal | None:
    """Seed 002 `guarantee.percentage`: floor(schedulable nodes x value) open nodes, counted exactly (module
    docstring), those held first, then most used by the queue, then most idle, in the percentage's dimensions (`gpu`
    the resource the seed's `gpu` stands for); None when that rounds down to 0."""
    cluster, states = seat.cluster, seat.cluster.states
    count = max(0, math.floor(len(cluster.schedulable) * value))  # a negative value (the webhook refuses one) is 0
    dims = [dimension_resource(d, gpu) for d in seat.guarantee.percentage_dimensions]
    candidates = [n for n in cluster.schedulable if seat.available(n)]
    held = seat.held
    ranked = sorted(candidates, key=lambda n: (n not in held, tuple(-seat.usage.get(n, EMPTY)[d] for d in dims),
                                               tuple(-states[n].idle[d] for d in dims), n))
    if count > len(candidates):
        return Refusal(reason=f"guarantee.percentage asks {count} nodes, {len(candidates)} are free to lock")
    return Option(source="percentage", nodes=ranked[:count]) if count else None


def more_reserved(options: list[Option], *, guarantee: Guarantee, cluster: Cluster, gpu: str) -> Option:
    """Seed 002: with both `resource` and `percentage`, "choose the one with more reserved resources": the larger
    sum over the percentage's dimensions (else the resource's) of allocatable held / the cluster's."""
    dims = [dimension_resource(d, gpu) for d in guarantee.percentage_dimensions] or list(guarantee.resource)

    def size(option: Option) -> float:
        holds = Resources.total(cluster.states[n].node.allocatable for n in option.nodes)
        return sum(holds[d] / cluster.total[d] if cluster.total[d] else 0.0 for d in dims)

    return max(options, key=size)


def queue_locks(seat: QueueSeat, *, chosen: Option, current: Mapping[str, Lock], now: datetime) -> dict[str, Lock]:
    """Seed 002: one lock per chosen node, reserving the guarantee's resource (or, for a percentage, the nodes'
    allocatable)."""
    queue, guarantee, states = seat.queue, seat.guarantee, seat.cluster.states
    reserved = guarantee.resource if chosen.source == "resource" else Resources.total(
        states[n].node.allocatable for n in chosen.nodes)
    reason = f"guarantee of queue {queue.name} ({chosen.source}, {guarantee.policy})"
    return {name: Lock(node=name, owner=seat.owner, kind=LockKind.QUEUE, subject=f"queue/{queue.name}",
                       reason=reason, since=kept_since(current, node=name, owner=seat.owner, now=now),
                       reserved=reserved, exclusive=queue.locks_exclusively)
            for name in sorted(chosen.nodes)}


# Guard rails of `Guaranteed` evictions (issue 10): pods Reservoir never evicts, whatever the queue.
ALWAYS_PROTECTED_NAMESPACES = keys.SYSTEM_NAMESPACES
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000  # system-cluster-critical; system-node-critical is 2000001000
SYSTEM_CRITICAL_CLASSES = frozenset(("system-cluster-critical", "system-node-critical"))
# issue 29: an eviction gives a pod at most this long to stop (its own terminationGracePeriodSeconds when shorter),
# and a pod being deleted is spared only while its deletion ends within it: a pod whose grace period is years long
# (a container that ignores SIGTERM) would otherwise hold a `Guaranteed` queue's node, spared as "being deleted"
MAX_EVICTION_GRACE = timedelta(minutes=5)


def protected_namespaces(config: ReservoirConfig) -> frozenset[str]:
    """Guard rail: the namespaces whose pods are never evicted: kube-system, Reservoir's own (`reservoir-system`, and
    the agent's `--namespace`, which the agent adds to the config it plans with) and `guarantee.protectedNamespaces`."""
    return ALWAYS_PROTECTED_NAMESPACES | frozenset(config.guarantee.protected_namespaces)


@dataclass(frozen=True)
class Witnesses:
    """What the guard rails check a pod's claims against (issue 29): anyone who may create a pod may write the
    mirror annotation or a DaemonSet ownerReference on it. Node uids by name; DaemonSet uids by (namespace, name)."""

    nodes: Mapping[str, str]
    daemonsets: Mapping[tuple[str, str], str]

    @classmethod
    def of(cls, snapshot: Snapshot) -> Witnesses:
        return cls({name: node.uid for name, node in snapshot.nodes.items()}, snapshot.daemonsets)

    def kubelets_mirror(self, pod: PodView) -> bool:
        """A static pod's mirror: the annotation `kubernetes.io/config.mirror` and an ownerReference to the Node it
        runs on, with that Node's uid, as the kubelet writes it (and NodeRestriction requires of a node's own mirror
        pods). A kubelet old enough to write no such reference has its mirror pods outside the protected namespaces
        judged as any pod's; evicting one deletes the mirror, not the static pod, which the kubelet mirrors again."""
        if keys.MIRROR_POD not in pod.annotations or not pod.node_name:
            return False
        uid = self.nodes.get(pod.node_name)
        return bool(uid) and any(o.kind == "Node" and o.name == pod.node_name and o.uid == uid for o in pod.owners)

    def daemonset_pod(self, pod: PodView) -> bool:
        """Controlled by a DaemonSet that exists with the uid its controller reference gives (the rule of
        shared.entitlement.daemonset_exemption, read from the pod's view)."""
        return any(o.controller and o.kind == "DaemonSet" and o.uid
                   and self.daemonsets.get((pod.namespace, o.name)) == o.uid for o in pod.owners)


def never_evicted(pod: PodView, protected: Collection[str], witnesses: Witnesses, now: datetime) -> str | None:
    """Guard rail (issue 10): why `pod` must not be evicted, or None when it may be: in a protected namespace, a
    kubelet's mirror pod, a DaemonSet's pod (it would come back), at system-critical priority (>= 2000000000 or a
    system-*-critical class), or being deleted already and gone within MAX_EVICTION_GRACE of `now`. The planner
    leaves such pods out; the writer checks again before each eviction. A mirror annotation or a DaemonSet reference
    is believed only as `witnesses` confirm it (issue 29: a tenant's pod claiming either is judged as any pod; its
    priority is kept to its own by the critical-priority policy)."""
    if pod.namespace in protected:
        return f"namespace {pod.namespace} is protected"
    if witnesses.kubelets_mirror(pod):
        return "mirror pod"
    if witnesses.daemonset_pod(pod):
        return "DaemonSet pod"
    if pod.priority >= SYSTEM_CRITICAL_PRIORITY or pod.priority_class_name in SYSTEM_CRITICAL_CLASSES:
        return "system-critical priority"
    if pod.deleting and (pod.deletion_deadline is None or pod.deletion_deadline <= now + MAX_EVICTION_GRACE):
        return "being deleted already"
    return None


def eviction_grace(pod: PodView) -> int:
    """The grace period, in seconds, an eviction gives `pod`: its own, at most MAX_EVICTION_GRACE."""
    return min(pod.termination_grace, int(MAX_EVICTION_GRACE.total_seconds()))


def guaranteed_evictions(seat: QueueSeat, *, nodes: Sequence[str], context: PlanContext) -> tuple[str, ...]:
    """Seed 002 policy `Guaranteed`: the pods on the locked nodes not entitled to the queue's lock, "namespace/name",
    except those the guard rails keep (`never_evicted`) and a trusted namespace's that tolerate the lock's exclusive
    taint (module docstring). Entitlement is the one rule (shared.entitlement.entitlement), so a pod that carries a
    toleration of the exclusive taint without being entitled to it is evicted. How many go per minute is the
    writer's to limit (`guarantee.maxEvictionsPerMinute`)."""
    if seat.guarantee.policy != "Guaranteed":
        return ()
    snapshot, states = context.snapshot, seat.cluster.states
    grounds = snapshot.grounds(context.config, reservations=False)
    protected = protected_namespaces(context.config)
    witnesses = Witnesses.of(snapshot)
    evict: list[str] = []
    for name in nodes:
        evict += sorted(p.key for p in states[name].pods if never_evicted(p, protected, witnesses, context.now) is None
                        and not spared(p, seat.owner, grounds))
    return tuple(evict)


def spared(pod: PodView, owner: str, grounds: Grounds) -> bool:
    """Seed 002 `Guaranteed`: `pod` stays on a node locked for `owner`: it is entitled to the lock
    (Entitlement.entitled_exclusive: one of the queue's own, or a DaemonSet's), or it is a trusted namespace's and
    tolerates the exclusive taint. Reservations are not read: none entitles a pod to a queue's lock."""
    rights = entitlement(pod_meta(pod), pod.namespace, grounds, reservations=(), best_effort=pod.best_effort)
    if rights.entitled_exclusive(owner):
        return True
    return rights.trusted is not None and tolerates_exclusive(pod.tolerations, owner)


GUARANTEES = Policy(name="guarantee", kind=LockKind.QUEUE, seed="002", run=plan_guarantees)
