"""Seed 002, queue guarantees (DESIGN 4.2): lock a combination of nodes whose allocatable covers a queue's request.

Request. `guarantee.resource` R, and/or `guarantee.percentage {dimensions, value}`: floor(schedulable nodes x value)
nodes. With both, each is placed and the one holding more of the percentage's dimensions (as shares of the
cluster, summed) wins. A request the candidate nodes cannot cover even all together, or above `spec.capability`,
is refused: reported, not locked (it would lock the whole cluster).

Candidates: schedulable nodes not taken by a policy before this one and not held by another queue or a live job.

Score of a combination C that covers R (higher is better; each term in [0, 1], weights from the seed):

    score(C) = 0.4  * (1 - mean_d excess_d)        excess_d = (alloc_d(C) - R_d) / alloc_d(candidates)
             + 0.35 * mean_d used_d                 used_d   = queue's requests on C / queue's requests in all, 0 if none
             + 0.15 * 1 / |C|
             + 0.1  * mean_d idle_d                 idle_d   = idle_d(C) / alloc_d(C)

with d over the resources R names. (The seed's 1/(sum - target) is infinite at an exact fit; dividing the excess
by what all candidates hold keeps the term finite and comparable between queues.)

Search (bounded, deterministic): nodes are grouped by allocatable; within a group only the best few (most used by
the queue, then most idle, then name) can matter, as many as the group would need alone plus one. Nodes alike in
allocatable and queue use differ only in idle, so a kind's most idle nodes (by mean idle share) are taken first and
the search runs over how many of each kind it takes: every such count when there are at most 2 x `budget` of them
(exact but for that idle order; the usual case on clusters of alike nodes), else two beam searches (one ranking
partial combinations by progress towards the request, one by the score they could reach) that add one node per
level, as wide as lets `budget` evaluations reach the depth the request may need; every covering combination met
is scored, and the best few are improved by hill climbing (add, drop, swap one for one or one for two, while still
covering) within another `budget` moves. A property test checks the result scores within
5% of brute force on clusters of up to 12 nodes. A queue already holding a covering combination keeps it unless a
fresh search scores more than 5% better (no churn as idle moves).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations, product

from agent.planner.capacity import NodeState, schedulable
from shared.ownership import pod_queue
from agent.planner.model import Lock
from shared.ownership import queue_owner_id
from shared.keys import LockKind
from shared.resources import EMPTY, Resources
from shared.views import PodGroupView, QueueView

WEIGHTS = (0.4, 0.35, 0.15, 0.1)  # excess, queue already used, fewer nodes, idle (seed 002)
KEEP_MARGIN = 0.05
LOCAL_STARTS = 8  # the best covering combinations of the beam that hill climbing starts from


@dataclass(frozen=True)
class QueueGuaranteeStatus:
    queue: str
    nodes: tuple[str, ...]
    resource: Resources  # total idle on the locked nodes (seed 002 status.reservation.resource)
    policy: str
    reason: str
    warning: str | None = None  # set when the guarantee is refused (too large): reported as a Warning Event
    evict: tuple[str, ...] = ()  # `Guaranteed`: other queues' pods on the locked nodes, "namespace/name"


@dataclass
class Problem:
    """One queue's placement problem over a candidate list, with the per-node numbers the score needs."""

    names: list[str]
    alloc: list[Resources]
    idle: list[Resources]
    used: list[Resources]  # the queue's requests on each node
    request: Resources
    total_alloc: Resources  # over all candidates
    total_used: Resources  # the queue's requests anywhere

    def covers(self, chosen: Sequence[int]) -> bool:
        return Resources.total(self.alloc[i] for i in chosen).covers(self.request)

    def score(self, chosen: Sequence[int]) -> float:
        """The module docstring's score of a covering combination."""
        return self.score_of(Resources.total(self.alloc[i] for i in chosen),
                             Resources.total(self.idle[i] for i in chosen),
                             Resources.total(self.used[i] for i in chosen), len(chosen))

    def score_of(self, alloc: Resources, idle: Resources, used: Resources, count: int,
                 progress: float | None = None) -> float:
        """The score from a combination's sums. With `progress` (a weight): a ranking for growing the combination,
        as if one more node fitted exactly, plus `progress` times its progress towards the request (for the beam)."""
        dims = list(self.request) or ["cpu"]
        used_share = sum(used[d] / self.total_used[d] if self.total_used[d] else 0.0 for d in dims) / len(dims)
        idle_share = sum(idle[d] / alloc[d] if alloc[d] else 0.0 for d in dims) / len(dims)
        w_excess, w_used, w_nodes, w_idle = WEIGHTS
        if progress is not None:
            towards = sum(min(1.0, alloc[d] / self.request[d]) if self.request[d] else 1.0 for d in dims) / len(dims)
            return w_excess + w_used * used_share + w_nodes / (count + 1) + w_idle * idle_share + progress * towards
        excess = sum((alloc[d] - self.request[d]) / self.total_alloc[d] if self.total_alloc[d] else 0.0
                     for d in dims) / len(dims)
        return w_excess * (1 - excess) + w_used * used_share + w_nodes / count + w_idle * idle_share


def brute_force(problem: Problem) -> tuple[float, tuple[int, ...]] | None:
    """Every subset (for tests and the quality benchmark only): the best score and its combination."""
    best = None
    for size in range(1, len(problem.names) + 1):
        for chosen in combinations(range(len(problem.names)), size):
            if problem.covers(chosen):
                candidate = (problem.score(chosen), chosen)
                if best is None or candidate[0] > best[0]:
                    best = candidate
    return best


def nodes_needed(request: Resources, alloc: Resources, otherwise: int) -> int:
    """How many nodes of allocatable `alloc` cover `request` alone (per resource rounded up, the largest);
    `otherwise` when `alloc` lacks a requested resource, as no count of such nodes covers it."""
    return max((-(-request[d] // alloc[d]) if alloc[d] else otherwise for d in request), default=1)


def pool(problem: Problem) -> list[int]:
    """Indexes worth searching: per allocatable shape, the nodes the group would need alone plus one, best first."""
    groups: dict[Resources, list[int]] = {}
    for i, alloc in enumerate(problem.alloc):
        groups.setdefault(alloc, []).append(i)
    dims = list(problem.request)
    chosen: list[int] = []
    for alloc, members in groups.items():
        need = nodes_needed(problem.request, alloc, len(members))
        members.sort(key=lambda i: (tuple(-problem.used[i][d] for d in dims), tuple(-problem.idle[i][d] for d in dims),
                                    problem.names[i]))
        chosen += members[:need + 1]
    return sorted(chosen, key=lambda i: problem.names[i])


def search(problem: Problem, budget: int, exact_when_small: bool = True) -> tuple[float, tuple[int, ...]] | None:
    """The bounded search of the module docstring: (score, chosen indexes) or None when nothing covers.
    `exact_when_small=False` skips the exact enumeration, so tests and the benchmark can judge the beams alone."""
    candidates = pool(problem)
    if not problem.covers(range(len(problem.names))):
        return None
    # nodes alike in allocatable and queue use differ only in idle: the search runs over how many of each kind
    groups: dict[tuple, list[int]] = {}
    for i in candidates:
        groups.setdefault((problem.alloc[i], problem.used[i]), []).append(i)
    for members in groups.values():  # for a count taken from one kind, its most idle nodes score best
        members.sort(key=lambda i: (-sum(problem.idle[i][d] / problem.alloc[i][d] for d in problem.request
                                         if problem.alloc[i][d]), problem.names[i]))
    kinds = list(groups.values())
    # up to `depth` levels may be needed (the nodes the smallest kind would need alone), so the beams are as wide as
    # lets the budget reach that depth
    depth = min(len(candidates), max(nodes_needed(problem.request, problem.alloc[i], len(candidates))
                                     for i in candidates))
    width = max(2, budget // (2 * len(kinds) * max(1, depth)))
    found: dict[tuple[int, ...], float] = {}  # covering combinations (sorted indexes) -> score
    multisets = 1
    for members in kinds:
        multisets *= len(members) + 1
    if exact_when_small and multisets <= 2 * budget:  # few kinds (a homogeneous cluster): every count of every kind, exactly
        for counts in product(*(range(len(members) + 1) for members in kinds)):
            combo = tuple(sorted(j for n, members in zip(counts, kinds) for j in members[:n]))
            if combo and problem.covers(combo):
                found[combo] = problem.score(combo)
        return max(((score, combo) for combo, score in found.items()), key=lambda item: (item[0], [-i for i in item[1]]))
    for progress in (1.0, 0.0):  # two beams: one ranks progress towards the request first, one the score alone
        _beam(problem, kinds, width, budget // 2, progress, found)
    if not found:  # the budget ran out before any combination covered: fill greedily, most used then largest first
        combo: tuple[int, ...] = ()
        for i in sorted(range(len(problem.names)), key=lambda i: (-sum(problem.used[i].values()),
                                                                   -sum(problem.alloc[i].values()), problem.names[i])):
            combo = (*combo, i)
            if problem.covers(combo):
                found[tuple(sorted(combo))] = problem.score(combo)
                break
    starts = sorted(found.items(), key=lambda item: (-item[1], item[0]))[:LOCAL_STARTS]
    best = max(((score, combo) for combo, score in found.items()), key=lambda item: (item[0], [-i for i in item[1]]))
    spent = 0
    for combo, score in starts:
        improved, used_up = improve(problem, candidates, combo, score, budget - spent)
        spent += used_up
        if improved[0] > best[0]:
            best = improved
        if spent >= budget:
            break
    return best


def _beam(problem: Problem, kinds: list[list[int]], width: int, budget: int, progress: float,
          found: dict[tuple[int, ...], float]) -> None:
    """One beam search, a node more per level, over counts of each kind; every covering combination it meets goes
    into `found`."""
    Entry = tuple[tuple[int, ...], Resources, Resources, Resources]  # counts per kind, alloc, idle, used sums
    beam: list[Entry] = [((0,) * len(kinds), EMPTY, EMPTY, EMPTY)]
    evaluated = 0
    while beam and evaluated < budget:
        grown: dict[tuple[int, ...], tuple[float, Entry]] = {}
        for counts, alloc, idle, used in beam:
            for k, members in enumerate(kinds):
                if counts[k] == len(members) or evaluated >= budget:
                    continue
                more = (*counts[:k], counts[k] + 1, *counts[k + 1:])
                if more in grown:
                    continue
                i = members[counts[k]]  # the next most idle of its kind
                entry = (more, alloc + problem.alloc[i], idle + problem.idle[i], used + problem.used[i])
                evaluated += 1
                size = sum(more)
                if entry[1].covers(problem.request):
                    combo = tuple(sorted(j for n, group in zip(more, kinds) for j in group[:n]))
                    found[combo] = problem.score_of(entry[1], entry[2], entry[3], size)
                # covering or not, it stays a candidate for growing: one more node the queue already uses can
                # raise the score more than the extra node costs
                grown[more] = (problem.score_of(entry[1], entry[2], entry[3], size, progress=progress), entry)
        ranked = sorted(grown.items(), key=lambda item: (-item[1][0], item[0]))
        beam = [entry for _, (_, entry) in ranked[:width]]


def improve(problem: Problem, candidates: list[int], combo: tuple[int, ...], score: float,
            budget: int) -> tuple[tuple[float, tuple[int, ...]], int]:
    """Hill climbing from a covering combination: the best move (add one pool node, drop one, swap one for one, or
    swap one for two) that still covers, until none scores higher or `budget` moves are spent. Returns
    ((score, combo), moves spent)."""
    current, value, spent = set(combo), score, 0
    while spent < budget:
        outside = [i for i in candidates if i not in current]
        moves = [current | {i} for i in outside] + [current - {i} for i in current if len(current) > 1]
        moves += [(current - {i}) | {j} for i in current for j in outside]
        moves += [(current - {i}) | {j, k} for i in current for j, k in combinations(outside, 2)]
        best_move = None
        for move in moves:
            spent += 1
            if problem.covers(tuple(move)):
                candidate = problem.score(tuple(move))
                if candidate > value + 1e-12 and (best_move is None or candidate > best_move[0]):
                    best_move = (candidate, move)
            if spent >= budget:
                break
        if best_move is None:
            break
        value, current = best_move
    return (value, tuple(sorted(current))), spent


@dataclass
class Cluster:
    """What every queue's placement shares within one plan: computed once, not per queue."""

    states: Mapping[str, NodeState]
    schedulable: list[str]
    total: Resources  # allocatable of the schedulable nodes
    groups: dict[Resources, list[str]]  # allocatable -> schedulable nodes, most idle first, then name

    @classmethod
    def of(cls, states: Mapping[str, NodeState]) -> Cluster:
        names = sorted(n for n, s in states.items() if schedulable(s.node))
        groups: dict[Resources, list[str]] = {}
        for name in names:
            groups.setdefault(states[name].node.allocatable, []).append(name)
        for members in groups.values():
            members.sort(key=lambda n: (-sum(states[n].idle.values()), n))
        return cls(states, names, Resources.total(states[n].node.allocatable for n in names), groups)


def plan_guarantee(
    queue: QueueView,
    cluster: Cluster,
    usage: Mapping[str, Resources],
    podgroups: Mapping[tuple[str, str], PodGroupView],
    current: Mapping[str, Lock],
    taken: set[str],
    budget: int,
    live_jobs: set[str],
    search_budget: int,
    now: datetime,
) -> tuple[dict[str, Lock], QueueGuaranteeStatus, list[str]]:
    """Locks for one queue's guarantee (`usage`: its requests per node), at most `budget` nodes, never on `taken`
    nodes; with policy `Guaranteed`, the other pods on them to evict (DaemonSet pods stay: they would return)."""
    guarantee = queue.guarantee
    assert guarantee is not None
    states = cluster.states
    owner = queue_owner_id(queue.name)

    def available(n: str) -> bool:
        lock = current.get(n)
        return n not in taken and (lock is None or lock.owner == owner or lock.kind is LockKind.WINDOW
                                   or (lock.kind is LockKind.JOB and lock.owner not in live_jobs))

    def refuse(why: str, warning: bool) -> tuple[dict[str, Lock], QueueGuaranteeStatus, list[str]]:
        return {}, QueueGuaranteeStatus(queue.name, (), EMPTY, guarantee.policy, why, why if warning else None), [
            f"queue={queue.name} decision=no-lock reason={why}"]

    if guarantee.resource and queue.capability:
        over = [d for d, v in guarantee.resource.items() if d in queue.capability and v > queue.capability[d]]
        if over:
            return refuse(f"guarantee.resource exceeds spec.capability in {', '.join(over)}", True)
    if guarantee.resource and not cluster.total.covers(guarantee.resource):
        return refuse(f"guarantee.resource {guarantee.resource.to_quantities()} is more than the cluster's "
                      f"schedulable allocatable {cluster.total.to_quantities()}", True)

    held = [n for n, lock in current.items() if lock.owner == owner and n in states and schedulable(states[n].node)
            and available(n)]
    options: list[tuple[str, list[str]]] = []
    if guarantee.resource:
        request = guarantee.resource
        unavailable = [n for n in cluster.schedulable if n in taken or n in current and not available(n)]
        total_alloc = cluster.total - Resources.total(states[n].node.allocatable for n in unavailable)
        # the search pool (see pool()): the queue's own nodes, then per allocatable group the most idle free nodes
        names = {n for n in usage if n in states and schedulable(states[n].node) and available(n)} | set(held)
        for alloc, members in cluster.groups.items():
            need = nodes_needed(request, alloc, len(members))
            picked = 0
            for n in members:
                if picked > need:
                    break
                if available(n):
                    names.add(n)
                    picked += 1
        ordered = sorted(names)
        problem = Problem(names=ordered, alloc=[states[n].node.allocatable for n in ordered],
                          idle=[states[n].idle for n in ordered], used=[usage.get(n, EMPTY) for n in ordered],
                          request=request, total_alloc=total_alloc, total_used=Resources.total(usage.values()))
        index = {n: i for i, n in enumerate(ordered)}
        found = search(problem, search_budget)
        if held and problem.covers([index[n] for n in held]) and (
                found is None or problem.score([index[n] for n in held]) >= found[0] * (1 - KEEP_MARGIN)):
            options.append(("resource", held))
        elif found is not None:
            options.append(("resource", [ordered[i] for i in found[1]]))
        else:
            return refuse(f"guarantee.resource {request.to_quantities()} cannot be covered by the nodes not held "
                          f"by other queues or jobs", False)
    if guarantee.percentage_value is not None:
        count = int(len(cluster.schedulable) * guarantee.percentage_value)
        dims = list(guarantee.percentage_dimensions)
        candidates = [n for n in cluster.schedulable if available(n)]
        ranked = sorted(candidates, key=lambda n: (n not in held, tuple(-usage.get(n, EMPTY)[d] for d in dims),
                                                   tuple(-states[n].idle[d] for d in dims), n))
        if count > len(candidates):
            return refuse(f"guarantee.percentage asks {count} nodes, {len(candidates)} are free to lock", False)
        if count:
            options.append(("percentage", ranked[:count]))
    if not options:
        return refuse("guarantee asks for nothing (percentage rounds down to 0 nodes)", False)

    def size(nodes: list[str]) -> float:
        dims = list(guarantee.percentage_dimensions) or list(guarantee.resource)
        holds = Resources.total(states[n].node.allocatable for n in nodes)
        return sum(holds[d] / cluster.total[d] if cluster.total[d] else 0.0 for d in dims)

    source, chosen = max(options, key=lambda option: size(option[1]))
    if len(chosen) > budget:
        return refuse(f"needs {len(chosen)} nodes, {budget} left within maxLockedNodePercent", False)
    reserved = guarantee.resource if source == "resource" else Resources.total(
        states[n].node.allocatable for n in chosen)
    locks = {}
    for name in sorted(chosen):
        kept = current.get(name)
        since = kept.since if kept is not None and kept.owner == owner else now
        locks[name] = Lock(node=name, owner=owner, kind=LockKind.QUEUE, subject=f"queue/{queue.name}",
                           reason=f"guarantee of queue {queue.name} ({source}, {guarantee.policy})",
                           since=since, reserved=reserved)
        taken.add(name)
    idle = Resources.total(states[n].idle for n in chosen)
    evict: list[str] = []
    if guarantee.policy == "Guaranteed":
        for name in sorted(chosen):
            evict += sorted(p.key for p in states[name].pods if not p.deleting and not p.daemon
                            and pod_queue(p, podgroups) != queue.name)
    return locks, QueueGuaranteeStatus(queue.name, tuple(sorted(chosen)), idle, guarantee.policy,
                                       f"holding {len(chosen)} nodes ({source})", evict=tuple(evict)), []
