"""Seed 002, the node-combination search (DESIGN 4.2): which combination of candidate nodes covers a queue's request
best. Pure arithmetic over per-node numbers; guarantee.py turns a queue and the cluster into a `Problem`.

Seed 002 "Algorithm": "Sort all nodes combination which satisfy the queue request resource in all dimensions",
by sum(nodes' resource) (0.4, lower first), queue already used (0.35), sum(nodes' number) (0.15, fewer first) and
sum(nodes' idle resource) (0.1). Score of a combination C that covers R (higher is better; each term in [0, 1]):

    score(C) = 0.4  * (1 - mean_d excess_d)    excess_d = (alloc_d(C) - R_d) / alloc_d(candidates)
             + 0.35 * mean_d used_d             used_d   = queue's requests on C / queue's requests in all (0 if none)
             + 0.15 * 1 / |C|
             + 0.1  * mean_d idle_d             idle_d   = idle_d(C) / alloc_d(C)

with d over the resources R names. (The seed's 1/(sum - target) is infinite at an exact fit; dividing the excess
by what all candidates hold keeps the term finite and comparable between queues.)

Search (bounded, deterministic): nodes are grouped by allocatable; within a group only the best few (most used by
the queue, then most idle, then name) can matter, as many as the group would need alone plus one
(`best_of_each_shape`). Nodes alike in allocatable and queue use differ only in idle, so a kind's most idle nodes (by
mean idle share) are taken first and the search runs over how many of each kind it takes: every such count when there
are at most 2 x `budget` of them (exact but for that idle order; the usual case on clusters of alike nodes), else two
beam searches (one ranking partial combinations by progress towards the request, one by the score they could reach)
that add one node per level, as wide as lets `budget` evaluations reach the depth the request may need; every
covering combination met is scored, and the best few are improved by hill climbing (add, drop, swap one for one or
one for two, while still covering) within another `budget` moves. A property test checks the result scores within
5% of brute force on clusters of up to 12 nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, islice, product
from typing import TypeVar

from shared.resources import EMPTY, Resources

WEIGHTS = (0.4, 0.35, 0.15, 0.1)  # excess, queue already used, fewer nodes, idle (seed 002)
LOCAL_STARTS = 8  # the best covering combinations of the beam that hill climbing starts from

Combo = tuple[int, ...]  # indexes into a Problem's nodes, sorted
Scored = tuple[float, Combo]
# a partial combination in a beam: counts taken of each kind, and its alloc, idle and used sums
BeamEntry = tuple[tuple[int, ...], Resources, Resources, Resources]
T = TypeVar("T")


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

    def covers(self, chosen: Iterable[int]) -> bool:
        return Resources.total(self.alloc[i] for i in chosen).covers(self.request)

    def score(self, chosen: Sequence[int]) -> float:
        """Seed 002: the module docstring's score of a covering combination."""
        return self.score_of(Resources.total(self.alloc[i] for i in chosen),
                             Resources.total(self.idle[i] for i in chosen),
                             Resources.total(self.used[i] for i in chosen), len(chosen))

    def score_of(self, alloc: Resources, idle: Resources, used: Resources, count: int,
                 progress: float | None = None) -> float:
        """Seed 002: the score from a combination's sums. With `progress` (a weight): a ranking for growing the
        combination, as if one more node fitted exactly, plus `progress` times its progress towards the request (for the
        beam)."""
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


def brute_force(problem: Problem) -> Scored | None:
    """Seed 002 "Sort all nodes combination", literally: every subset (for tests and the quality benchmark only): the
    best score and its combination."""
    best: Scored | None = None
    for size in range(1, len(problem.names) + 1):
        for chosen in combinations(range(len(problem.names)), size):
            if problem.covers(chosen):
                candidate = (problem.score(chosen), chosen)
                if best is None or candidate[0] > best[0]:
                    best = candidate
    return best


def nodes_needed(request: Resources, alloc: Resources, otherwise: int) -> int:
    """Seed 002 search bound: how many nodes of allocatable `alloc` cover `request` alone (per resource rounded up, the
    largest); `otherwise` when `alloc` lacks a requested resource, as no count of such nodes covers it."""
    return max((-(-request[d] // alloc[d]) if alloc[d] else otherwise for d in request), default=1)


def best_of_each_shape(request: Resources, shapes: Mapping[Resources, Sequence[T]],
                       usable: Callable[[T], bool] | None = None) -> Iterator[T]:
    """Seed 002 search pool, the rule for the nodes handed to the search and within it: per allocatable shape (`shapes`:
    allocatable -> its nodes, best first), the first `usable` nodes, as many as the shape would need alone to cover
    `request` (nodes_needed) plus one. Nodes past them can only repeat what those offer."""
    for alloc, members in shapes.items():
        need = nodes_needed(request, alloc, len(members))
        picked = members if usable is None else (m for m in members if usable(m))
        yield from islice(picked, need + 1)


def pool(problem: Problem) -> list[int]:
    """Seed 002: indexes worth searching: best_of_each_shape, best first being most used by the queue, then most idle.
    """
    groups: dict[Resources, list[int]] = {}
    for i, alloc in enumerate(problem.alloc):
        groups.setdefault(alloc, []).append(i)
    dims = list(problem.request)
    for members in groups.values():
        members.sort(key=lambda i: (tuple(-problem.used[i][d] for d in dims), tuple(-problem.idle[i][d] for d in dims),
                                    problem.names[i]))
    return sorted(best_of_each_shape(problem.request, groups), key=lambda i: problem.names[i])


def search(problem: Problem, budget: int, exact_when_small: bool = True) -> Scored | None:
    """Seed 002: the bounded search of the module docstring: (score, chosen indexes) or None when nothing covers.
    `exact_when_small=False` skips the exact enumeration, so tests and the benchmark can judge the beams alone."""
    candidates = pool(problem)
    if not problem.covers(range(len(problem.names))):
        return None
    kinds = node_kinds(problem, candidates)
    multisets = 1
    for members in kinds:
        multisets *= len(members) + 1
    if exact_when_small and multisets <= 2 * budget:  # few kinds (a homogeneous cluster): every count, exactly
        return best_of(every_count(problem, kinds))
    # up to `depth` levels may be needed (the nodes the smallest kind would need alone), so the beams are as wide as
    # lets the budget reach that depth
    depth = min(len(candidates), max(nodes_needed(problem.request, problem.alloc[i], len(candidates))
                                     for i in candidates))
    width = max(2, budget // (2 * len(kinds) * max(1, depth)))
    found: dict[Combo, float] = {}  # covering combinations (sorted indexes) -> score
    for progress in (1.0, 0.0):  # two beams: one ranks progress towards the request first, one the score alone
        _beam(problem, kinds, width, budget // 2, progress, found)
    if not found:  # the budget ran out before any combination covered
        found = greedy_cover(problem)
    return climb(problem, candidates, found, budget)


def node_kinds(problem: Problem, candidates: Iterable[int]) -> list[list[int]]:
    """Seed 002 search: the candidates grouped by (allocatable, queue use), each kind most idle first (mean idle share),
    then name: for a count taken from one kind, its most idle nodes score best."""
    groups: dict[tuple[Resources, Resources], list[int]] = {}
    for i in candidates:
        groups.setdefault((problem.alloc[i], problem.used[i]), []).append(i)
    for members in groups.values():
        members.sort(key=lambda i: (-sum(problem.idle[i][d] / problem.alloc[i][d] for d in problem.request
                                         if problem.alloc[i][d]), problem.names[i]))
    return list(groups.values())


def every_count(problem: Problem, kinds: list[list[int]]) -> dict[Combo, float]:
    """Seed 002 search, exact over kinds: every covering combination of every count of every kind, scored."""
    found: dict[Combo, float] = {}
    for counts in product(*(range(len(members) + 1) for members in kinds)):
        combo = tuple(sorted(j for n, members in zip(counts, kinds, strict=True) for j in members[:n]))
        if combo and problem.covers(combo):
            found[combo] = problem.score(combo)
    return found


def best_of(found: Mapping[Combo, float]) -> Scored:
    """Seed 002: the best scored combination; on a tie, the one of lowest indexes."""
    return max(((score, combo) for combo, score in found.items()), key=lambda item: (item[0], [-i for i in item[1]]))


def greedy_cover(problem: Problem) -> dict[Combo, float]:
    """Seed 002 search, when the beams found none: the first covering combination when filling greedily, most used then
    largest first (never empty when all the nodes together cover)."""
    combo: Combo = ()
    for i in sorted(range(len(problem.names)), key=lambda i: (-sum(problem.used[i].values()),
                                                               -sum(problem.alloc[i].values()), problem.names[i])):
        combo = (*combo, i)
        if problem.covers(combo):
            return {tuple(sorted(combo)): problem.score(combo)}
    return {}


def climb(problem: Problem, candidates: list[int], found: Mapping[Combo, float], budget: int) -> Scored:
    """Seed 002 search: hill climbing (improve) from the best LOCAL_STARTS combinations found, within `budget` moves in
    all."""
    starts = sorted(found.items(), key=lambda item: (-item[1], item[0]))[:LOCAL_STARTS]
    best = best_of(found)
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
          found: dict[Combo, float]) -> None:
    """Seed 002 search: one beam search, a node more per level, over counts of each kind; every covering combination it
    meets goes into `found`."""
    beam: list[BeamEntry] = [((0,) * len(kinds), EMPTY, EMPTY, EMPTY)]
    evaluated = 0
    while beam and evaluated < budget:
        grown: dict[tuple[int, ...], tuple[float, BeamEntry]] = {}
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
                    combo = tuple(sorted(j for n, group in zip(more, kinds, strict=True) for j in group[:n]))
                    found[combo] = problem.score_of(entry[1], entry[2], entry[3], size)
                # covering or not, it stays a candidate for growing: one more node the queue already uses can
                # raise the score more than the extra node costs
                grown[more] = (problem.score_of(entry[1], entry[2], entry[3], size, progress=progress), entry)
        ranked = sorted(grown.items(), key=lambda item: (-item[1][0], item[0]))
        beam = [entry for _, (_, entry) in ranked[:width]]


def improve(problem: Problem, candidates: list[int], combo: Combo, score: float,
            budget: int) -> tuple[Scored, int]:
    """Seed 002 search: hill climbing from a covering combination: the best move (add one pool node, drop one, swap one
    for one, or swap one for two) that still covers, until none scores higher or `budget` moves are spent. Returns
    ((score, combo), moves spent)."""
    current, value, spent = set(combo), score, 0
    while spent < budget:
        outside = [i for i in candidates if i not in current]
        moves = [current | {i} for i in outside] + [current - {i} for i in current if len(current) > 1]
        moves += [(current - {i}) | {j} for i in current for j in outside]
        moves += [(current - {i}) | {j, k} for i in current for j, k in combinations(outside, 2)]
        best_move: tuple[float, set[int]] | None = None
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
