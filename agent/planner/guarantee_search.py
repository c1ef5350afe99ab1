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

Search (bounded and deterministic; its work and memory are set by `budget` and POOL_CAP, not by the cluster: beyond
one pass over the problem's nodes to choose the pool, at most `budget` combinations in the beams and `budget`
hill-climbing moves, each made from a combination's sums when it is tried, never listed):

- Shapes. Nodes are grouped by coarse shape (`shape_of`: each requested amount, less one, floored to its SHAPE_BITS
  leading binary digits, so nodes within 1/16-1/8 of each other are mostly one shape however their exact
  allocatable differs, as it does node by node on real clusters). A shape is never more than any of its nodes, so
  what it needs alone (`nodes_needed`) is never less than what each of them needs.
- Pool (`pool`). Per shape only the best few can matter (most used by the queue, then most idle, then name), as many
  as the shape would need alone plus one (the rule of `best_of_each_shape`, which guarantee.py applies first); all of
  them together cover the request whenever all the nodes do. The queue's own nodes can matter past that (each one
  adds to the "queue already used" term). At most POOL_CAP nodes are searched (twice as many as the request needs of
  the largest nodes, when that is more): the queue's own first, most used first, up to half; then round-robin over
  the shapes' best few (the best of every shape, the queue's most used and then the shapes needing fewest nodes first;
  then the second best of each; ...); when those do not cover the request, more in that order until they do, and
  POOL_CAP / 2 more.
- Kinds. Pool nodes alike in allocatable and queue use differ only in idle, so a kind's most idle nodes (by mean
  idle share) are taken first and the search runs over how many of each kind it takes: every such count when there
  are at most 2 x `budget` of them (exact but for that idle order; the usual case on clusters of alike nodes).
- Else, starts and beams. Three greedy covers (largest nodes first; the queue's most used first; all the queue's
  nodes, then the largest) are scored; then beam searches add one node per level, as wide as lets `budget` / 2
  evaluations reach as many levels as the smallest pool node would need alone, and drop a partial combination when
  no larger one could beat the best found (`Space.bound`). On a pool of at most SMALL_POOL nodes, two beams run
  their budget out (one ranking partial combinations by progress towards the request, one by the score they could
  reach); on a larger pool, one beam ranking by progress, which stops, once a quarter of its evaluations are spent,
  when STALL_LEVELS level(s) past its first cover find nothing better.
- Hill climbing from the best found, the greedy covers and the next best (LOCAL_STARTS in all): the best move that
  still covers among drop one and add one, else swap one for one, within `budget` / 4 moves in all, a climb stopping
  where an earlier one passed; then from the best reached, the same and, when none of those improves, swap one for
  two or two for one (among the WIDE_SPAN least worth inside and the WIDE_SPAN best outside), within the rest.

Quality: property tests check the result scores within 5% of brute force on clusters of up to 12 nodes, alike
(tests/unit/test_guarantee.py) and all different (tests/unit/test_guarantee_search.py), as run and with the exact
enumeration off; `make bench-planner` reports the same ratios on 300 random clusters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations, islice
from math import inf
from operator import add, ge, sub, truediv
from typing import TypeVar

from shared.resources import Resources

WEIGHTS = (0.4, 0.35, 0.15, 0.1)  # excess, queue already used, fewer nodes, idle (seed 002)
SHAPE_BITS = 4  # leading binary digits an amount keeps in a coarse shape
POOL_CAP = 32  # pool nodes searched, unless more are needed to cover the request
LOCAL_STARTS = 8  # the combinations hill climbing starts from
STALL_LEVELS = 1  # past a quarter of its budget, a beam stops after this many levels that find nothing better
SMALL_POOL = 16  # on a pool of at most this many nodes, two beams instead, each running its budget out
WIDE_SPAN = 8  # the wide moves drop nodes among this many inside (least worth first), add among as many outside
EPSILON = 1e-12  # a score must beat another by more than this to count as better

Combo = tuple[int, ...]  # indexes into a Problem's nodes, sorted
Scored = tuple[float, Combo]
Vector = tuple[int, ...]  # amounts over the request's dimensions
# a combination's sums: alloc and idle over the request's dimensions, used and excess shares, node count
Sums = tuple[Vector, Vector, float, float, int]
Moves = Iterator[tuple[Combo, Combo, Sums]]  # (nodes removed, nodes added, the sums after)
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

    def score_of(self, alloc: Resources, idle: Resources, used: Resources, count: int) -> float:
        """Seed 002: the score from a combination's sums (the reference the search's `Space.score` computes
        incrementally)."""
        dims = self.dims()
        used_share = sum(used[d] / self.total_used[d] if self.total_used[d] else 0.0 for d in dims) / len(dims)
        idle_share = sum(idle[d] / alloc[d] if alloc[d] else 0.0 for d in dims) / len(dims)
        excess = sum((alloc[d] - self.request[d]) / self.total_alloc[d] if self.total_alloc[d] else 0.0
                     for d in dims) / len(dims)
        w_excess, w_used, w_nodes, w_idle = WEIGHTS
        return w_excess * (1 - excess) + w_used * used_share + w_nodes / count + w_idle * idle_share

    def dims(self) -> list[str]:
        """The dimensions the score and the cover are taken over: the request's."""
        return list(self.request) or ["cpu"]


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


def coarse(amount: int) -> int:
    """Seed 002 search: a coarse `amount`: one less than it, floored to its SHAPE_BITS leading binary digits (so
    never more than the amount, and more than 7/8 of one less). One less, so that a round amount (128Gi, a capacity
    nothing was reserved from) falls with those a little under it (the same capacity, less what was reserved)."""
    less = amount - 1
    drop = less.bit_length() - SHAPE_BITS
    return amount if amount <= 0 else less if drop <= 0 else (less >> drop) << drop


def shape_of(alloc: Mapping[str, int], dims: Iterable[str] | None = None) -> Resources:
    """Seed 002 search: a node's coarse shape, its allocatable in `dims` (else in every resource it has) with each
    amount `coarse`. Nodes whose allocatable differs a little (kube-reserved, the memory the kernel reports) share one
    shape; a shape never holds more than any of its nodes."""
    return Resources({d: coarse(alloc.get(d, 0)) for d in (alloc if dims is None else dims)})


def best_of_each_shape(request: Resources, shapes: Mapping[Resources, Sequence[T]],
                       usable: Callable[[T], bool] | None = None) -> Iterator[T]:
    """Seed 002 search pool, the rule for the nodes handed to the search and within it: per shape (`shapes`: a coarse
    shape (`shape_of`) or an exact allocatable -> its nodes, best first), the first `usable` nodes, as many as the
    shape would need alone to cover `request` (nodes_needed) plus one. Nodes past them can only repeat what those
    offer."""
    for alloc, members in shapes.items():
        need = nodes_needed(request, alloc, len(members))
        picked = members if usable is None else (m for m in members if usable(m))
        yield from islice(picked, need + 1)


def pool(problem: Problem, cap: int = POOL_CAP) -> list[int]:
    """Seed 002: the indexes worth searching, best first (module docstring, "Pool"): `cap` of them, or as many more
    as it takes to cover the request and cap / 2 more."""
    dims = problem.dims()
    request = tuple(problem.request[d] for d in dims)
    vectors = [tuple(map(alloc.__getitem__, dims)) for alloc in problem.alloc]
    used = [used_share(u, problem.total_used, dims) for u in problem.used]
    idle = [sum(i / a for i, a in zip(map(problem.idle[n].__getitem__, dims), vector, strict=True) if a) / len(dims)
            for n, vector in enumerate(vectors)]
    rank = [(-u, -i, name) for u, i, name in zip(used, idle, problem.names, strict=True)]
    shapes: dict[Vector, list[int]] = {}
    for i, vector in enumerate(vectors):
        shapes.setdefault(tuple(map(coarse, vector)), []).append(i)
    ranked: list[tuple[int, float, int, float, str, int]] = []  # (turn, -used, need, -idle, name, index)
    for shape, members in shapes.items():
        need = nodes_needed(problem.request, Resources(zip(dims, shape, strict=True)), len(members))
        best = sorted(members, key=rank.__getitem__)[:need + 1]
        ranked += [(turn, -used[i], need, -idle[i], problem.names[i], i) for turn, i in enumerate(best)]
    ranked.sort()
    # the queue's own nodes first, most used first, up to half the pool (past a shape's need + 1 too: each one adds to
    # the "queue already used" term), then every shape's best, second best, ...
    favourites = sorted((i for i in range(len(used)) if used[i] > 0), key=rank.__getitem__)[:cap // 2]
    order = list(dict.fromkeys([*favourites, *(entry[-1] for entry in ranked)]))
    # a request that needs many nodes gets room to choose: twice as many as the largest of them would need
    fewest, sums = 0, tuple(0 for _ in dims)
    for _, i in sorted((-sum(a / r for a, r in zip(vectors[i], request, strict=True) if r), i) for i in order):
        if all(map(ge, sums, request)):
            break
        fewest, sums = fewest + 1, tuple(map(add, sums, vectors[i]))
    end = min(max(cap, 2 * fewest), len(order))
    sums = tuple(map(sum, zip(*(vectors[i] for i in order[:end]), strict=True))) if end else tuple(0 for _ in dims)
    if not all(map(ge, sums, request)):  # more, in the same order, until the pool covers (they do, all of them)
        while end < len(order) and not all(map(ge, sums, request)):
            sums = tuple(map(add, sums, vectors[order[end]]))
            end += 1
        end = min(len(order), end + cap // 2)
    return order[:end]


def used_share(used: Resources, total_used: Resources, dims: Sequence[str]) -> float:
    """Seed 002: a node's share of the queue's use (mean over `dims`), the score's "queue already used" term."""
    return sum(used[d] / total_used[d] for d in dims if total_used[d]) / len(dims) if used else 0.0


def idle_share(idle: Resources, alloc: Resources, dims: Sequence[str]) -> float:
    """Seed 002: a node's idle share (mean over `dims`), the score's idle term."""
    return sum(idle[d] / alloc[d] for d in dims if alloc[d]) / len(dims)


@dataclass(frozen=True)
class Space:
    """The search's view of a problem over its pool: per node, plain vectors over the request's dimensions and the
    shares the score adds up, so a combination's sums grow or shrink by one node in a few operations."""

    need: Vector
    alloc: dict[int, Vector]
    idle: dict[int, Vector]
    used: dict[int, float]  # share of the queue's use, mean over the dimensions
    excess: dict[int, float]  # share of the candidates' allocatable, mean over the dimensions
    idle_share: dict[int, float]
    request_excess: float  # the request's share of the candidates' allocatable, mean over the dimensions
    inverse_total: tuple[float, ...]  # 1 / the candidates' allocatable, per dimension (0 where none)
    idle_bound: float  # no combination of the pool has a larger idle share (each dimension's largest, averaged)
    top_used: list[float]  # by k: the sum of the k largest used shares
    positive: bool  # the request holds some of every dimension
    growth: dict[int, float] = field(default_factory=dict)  # growth_bound's, by node count

    @classmethod
    def of(cls, problem: Problem, candidates: Sequence[int]) -> Space:
        dims = problem.dims()
        width = len(dims)
        inverse_total = tuple(1 / problem.total_alloc[d] if problem.total_alloc[d] else 0.0 for d in dims)
        alloc = {i: tuple(problem.alloc[i][d] for d in dims) for i in candidates}
        idle = {i: tuple(problem.idle[i][d] for d in dims) for i in candidates}
        used = {i: used_share(problem.used[i], problem.total_used, dims) for i in candidates}
        excess = {i: sum(a * t for a, t in zip(alloc[i], inverse_total, strict=True)) / width for i in candidates}
        need = tuple(problem.request[d] for d in dims)
        ratios = [[i / a if a else 0.0 for i, a in zip(idle[j], alloc[j], strict=True)] for j in candidates]
        idle_bound = sum(max(column, default=0.0) for column in zip(*ratios, strict=True)) / width if ratios else 0.0
        top = [0.0]  # the sums of the largest used shares
        for share in sorted(used.values(), reverse=True):
            top.append(top[-1] + share)
        return cls(need=need, alloc=alloc, idle=idle, used=used, excess=excess,
                   idle_share={i: idle_share(problem.idle[i], problem.alloc[i], dims) for i in candidates},
                   request_excess=sum(r * t for r, t in zip(need, inverse_total, strict=True)) / width,
                   inverse_total=inverse_total, idle_bound=idle_bound, top_used=top, positive=all(need))

    @property
    def empty(self) -> Sums:
        zero = tuple(0 for _ in self.need)
        return zero, zero, 0.0, 0.0, 0

    def sums(self, chosen: Iterable[int]) -> Sums:
        total = self.empty
        for i in chosen:
            total = self.plus(total, i)
        return total

    def plus(self, sums: Sums, i: int) -> Sums:
        alloc, idle, used, excess, count = sums
        return (tuple(map(add, alloc, self.alloc[i])), tuple(map(add, idle, self.idle[i])), used + self.used[i],
                excess + self.excess[i], count + 1)

    def minus(self, sums: Sums, i: int) -> Sums:
        alloc, idle, used, excess, count = sums
        return (tuple(map(sub, alloc, self.alloc[i])), tuple(map(sub, idle, self.idle[i])), used - self.used[i],
                excess - self.excess[i], count - 1)

    def covers(self, sums: Sums) -> bool:
        return all(map(ge, sums[0], self.need))

    def score(self, sums: Sums) -> float:
        """Seed 002: the module docstring's score, from a covering combination's sums (Problem.score_of's)."""
        alloc, idle, used, excess, count = sums
        w_excess, w_used, w_nodes, w_idle = WEIGHTS
        if self.positive:  # the request holds some of every dimension, so a covering combination does too
            idle_part: float = sum(map(truediv, idle, alloc)) / len(alloc)
        else:
            idle_part = sum(i / a for i, a in zip(idle, alloc, strict=True) if a) / len(alloc)
        return w_excess * (1 - (excess - self.request_excess)) + w_used * used + w_nodes / count + w_idle * idle_part

    def rank(self, sums: Sums, progress: float) -> float:
        """Seed 002 beam: a partial combination's ranking for growing it: its score as if one more node fitted exactly,
        plus `progress` times its progress towards the request (mean over the dimensions of the share covered)."""
        alloc, idle, used, _, count = sums
        w_excess, w_used, w_nodes, w_idle = WEIGHTS
        idle_part = sum(i / a for i, a in zip(idle, alloc, strict=True) if a) / len(alloc)
        value = w_excess + w_used * used + w_nodes / (count + 1) + w_idle * idle_part
        if progress:
            value += progress * sum(min(1.0, a / r) if r else 1.0
                                    for a, r in zip(alloc, self.need, strict=True)) / len(alloc)
        return value

    def bound(self, sums: Sums) -> float:
        """Seed 002 beam: no covering combination of the pool that holds these nodes and more scores above this: its
        excess is at least what these nodes hold over the request already, its use at most theirs and the largest
        shares of the rest, its idle share at most the pool's largest."""
        alloc, _, used, _, count = sums
        over = sum(max(0, a - r) * t for a, r, t in zip(alloc, self.need, self.inverse_total, strict=True)) / len(alloc)
        return WEIGHTS[0] * (1 - over) + WEIGHTS[1] * used + self.growth_bound(count) + WEIGHTS[3] * self.idle_bound

    def growth_bound(self, count: int) -> float:
        """Seed 002 beam: the most a combination of `count` pool nodes grown to m > count nodes can have in its used
        and node-count terms besides its own use: the m - count largest used shares, and 1/m nodes."""
        if count not in self.growth:
            top, size = self.top_used, len(self.top_used) - 1
            self.growth[count] = max((WEIGHTS[1] * top[m - count] + WEIGHTS[2] / m for m in range(count + 1, size + 1)),
                                     default=-inf)
        return self.growth[count]

    def worth(self, i: int) -> tuple[float, float, int]:
        """Seed 002 hill climbing: the order pool nodes are tried for dropping, least used and least idle first."""
        return self.used[i], self.idle_share[i], i


@dataclass
class Found:
    """Seed 002 search: the best covering combinations met (the LOCAL_STARTS best at least), scored, and the best
    score."""

    scores: dict[Combo, float] = field(default_factory=dict)
    best: float = -inf
    floor: float = -inf  # a combination scoring below this is not among the LOCAL_STARTS best

    def wants(self, score: float) -> bool:
        return score >= self.floor

    def add(self, combo: Combo, score: float) -> None:
        self.scores[combo] = score
        self.best = max(self.best, score)
        if len(self.scores) > 4 * LOCAL_STARTS:
            kept = sorted(self.scores.items(), key=lambda item: (-item[1], item[0]))[:LOCAL_STARTS]
            self.scores = dict(kept)
            self.floor = kept[-1][1]


def search(problem: Problem, budget: int, exact_when_small: bool = True) -> Scored | None:
    """Seed 002: the bounded search of the module docstring: (score, chosen indexes) or None when nothing covers.
    `exact_when_small=False` skips the exact enumeration, so tests and the benchmark can judge the beam alone."""
    candidates = pool(problem)
    space = Space.of(problem, candidates)
    if not candidates or not space.covers(space.sums(candidates)):  # the pool covers when all the nodes do
        return None
    kinds = node_kinds(problem, candidates, space)
    multisets = 1
    for members in kinds:
        multisets = min(multisets * (len(members) + 1), 2 * budget + 1)
    if exact_when_small and multisets <= 2 * budget:  # few kinds (a homogeneous cluster): every count, exactly
        best = every_count(space, kinds)
    else:
        found = Found()
        largest = sorted(candidates, key=lambda i: (-space.excess[i], i))
        most_used = sorted(candidates, key=lambda i: (-space.used[i], -space.excess[i], i))
        own = [i for i in most_used if space.used[i] > 0]
        seeds = list(dict.fromkeys([greedy_cover(space, largest), greedy_cover(space, most_used),
                                    greedy_cover(space, own + largest, at_least=len(own))]))
        for seed in seeds:
            found.add(seed, space.score(space.sums(seed)))
        # the beam is as wide as lets budget / 2 evaluations reach `depth` levels: as many as the smallest pool node
        # would need alone (a combination of the most nodes that can matter; the bound and STALL_LEVELS stop it early)
        depth = min(len(candidates), max(nodes_needed(problem.request, problem.alloc[i], len(candidates))
                                         for i in candidates))
        width = max(2, budget // (2 * len(kinds) * depth))
        if len(candidates) > SMALL_POOL:  # one beam, ranking progress towards the request first
            _beam(space, kinds, width, budget // 2, 1.0, STALL_LEVELS, found)
        else:  # two, thorough: one ranks progress towards the request first, one the score alone
            for progress in (1.0, 0.0):
                _beam(space, kinds, width, budget // 2, progress, budget, found)
        best = climb(space, candidates, found, seeds, budget)
    return problem.score(best[1]), best[1]


def node_kinds(problem: Problem, candidates: Iterable[int], space: Space) -> list[list[int]]:
    """Seed 002 search: the candidates grouped by (allocatable, queue use), each kind most idle first (mean idle share),
    then name: for a count taken from one kind, its most idle nodes score best."""
    groups: dict[tuple[Resources, Resources], list[int]] = {}
    for i in candidates:
        groups.setdefault((problem.alloc[i], problem.used[i]), []).append(i)
    for members in groups.values():
        members.sort(key=lambda i: (-space.idle_share[i], problem.names[i]))
    return list(groups.values())


def every_count(space: Space, kinds: list[list[int]]) -> Scored:
    """Seed 002 search, exact over kinds: the best covering combination of every count of every kind (on a tie, the
    one of lowest indexes). The caller has checked that something covers."""
    prefixes = []
    for members in kinds:
        sums = [space.empty]
        for i in members:
            sums.append(space.plus(sums[-1], i))
        prefixes.append(sums)
    best: tuple[float, list[int], Combo] | None = None

    def visit(k: int, sums: Sums, counts: tuple[int, ...]) -> None:
        nonlocal best
        if k == len(kinds):
            if sums[4] and space.covers(sums):
                score = space.score(sums)
                if best is None or score >= best[0] - EPSILON:
                    combo = tuple(sorted(j for n, members in zip(counts, kinds, strict=True) for j in members[:n]))
                    key = [-i for i in combo]
                    if best is None or score > best[0] + EPSILON or key > best[1]:
                        best = (score, key, combo)
            return
        for n, part in enumerate(prefixes[k]):
            visit(k + 1, joined(sums, part), (*counts, n))

    visit(0, space.empty, ())
    assert best is not None, "search checks that the pool covers"
    return best[0], best[2]


def joined(a: Sums, b: Sums) -> Sums:
    """The sums of two disjoint combinations together."""
    return tuple(map(add, a[0], b[0])), tuple(map(add, a[1], b[1])), a[2] + b[2], a[3] + b[3], a[4] + b[4]


def best_of(found: Mapping[Combo, float]) -> Scored:
    """Seed 002: the best scored combination; on a tie, the one of lowest indexes."""
    return max(((score, combo) for combo, score in found.items()), key=lambda item: (item[0], [-i for i in item[1]]))


def greedy_cover(space: Space, order: Sequence[int], at_least: int = 0) -> Combo:
    """Seed 002 search: the first covering combination of at least `at_least` nodes when taking nodes in `order` (the
    pool covers, so with all the pool in `order` there is one)."""
    sums, combo = space.empty, list[int]()
    for i in dict.fromkeys(order):
        sums, combo = space.plus(sums, i), [*combo, i]
        if len(combo) >= at_least and space.covers(sums):
            break
    return tuple(sorted(combo))


def climb(space: Space, candidates: list[int], found: Found, seeds: Sequence[Combo], budget: int) -> Scored:
    """Seed 002 search: hill climbing (improve) with the narrow moves from the best combination found, the greedy
    `seeds` and the next best found, LOCAL_STARTS in all, within budget / 4 moves (a climb stops where an earlier one
    passed); then with the wide moves too from the best reached, within the rest of `budget`."""
    ranked = [combo for combo, _ in sorted(found.scores.items(), key=lambda item: (-item[1], item[0]))]
    best = best_of(found.scores)
    spent, passed = 0, set[Combo]()
    for combo in list(dict.fromkeys([*ranked[:1], *seeds, *ranked]))[:LOCAL_STARTS]:
        if combo in passed:
            continue
        improved, used_up = improve(space, candidates, combo, space.score(space.sums(combo)), budget // 4 - spent,
                                    wide=False, passed=passed)
        spent += used_up
        if improved[0] > best[0] + EPSILON:
            best = improved
        if spent >= budget // 4:
            break
    improved, _ = improve(space, candidates, best[1], best[0], budget - spent, wide=True)
    return improved if improved[0] > best[0] + EPSILON else best


def _beam(space: Space, kinds: list[list[int]], width: int, budget: int, progress: float, stall: int,
          found: Found) -> None:
    """Seed 002 search: a beam search, a node more per level, over counts of each kind, ranking partial combinations
    by the score they could reach plus `progress` times their progress towards the request (Space.rank); every
    covering combination it meets goes into `found`; a partial combination whose bound cannot beat the best found is
    not grown; it stops after `budget` evaluations, or, past a quarter of them, after `stall` levels past its first
    cover that find nothing better."""
    # (counts taken of each kind, the nodes taken, their sums)
    beam: list[tuple[tuple[int, ...], Combo, Sums]] = [((0,) * len(kinds), (), space.empty)]
    evaluated, stalled, best, covered = 0, 0, found.best, False
    while beam and evaluated < budget and stalled < stall:
        grown: dict[tuple[int, ...], tuple[float, Combo, Sums]] = {}
        covering = False
        for counts, taken, sums in beam:
            for k, members in enumerate(kinds):
                if evaluated >= budget:
                    break
                if counts[k] == len(members):
                    continue
                more = (*counts[:k], counts[k] + 1, *counts[k + 1:])
                if more in grown:
                    continue
                i = members[counts[k]]  # the next most idle of its kind
                child = space.plus(sums, i)
                evaluated += 1
                if space.covers(child):
                    covering = True
                    if found.wants(score := space.score(child)):
                        found.add(tuple(sorted((*taken, i))), score)
                # covering or not, it stays a candidate for growing (one more node the queue already uses can raise
                # the score more than the extra node costs), unless nothing grown from it can beat the best found
                if space.bound(child) > found.best + EPSILON:
                    grown[more] = (space.rank(child, progress), (*taken, i), child)
        ranked = sorted(grown.items(), key=lambda item: (-item[1][0], item[0]))
        beam = [(counts, taken, sums) for counts, (_, taken, sums) in ranked[:width]]
        stalled = stalled + 1 if covered and evaluated >= budget // 4 and found.best <= best + EPSILON else 0
        best, covered = found.best, covered or covering


def improve(space: Space, candidates: list[int], combo: Combo, score: float, budget: int, *, wide: bool,
            passed: set[Combo] | None = None) -> tuple[Scored, int]:
    """Seed 002 search: hill climbing from a covering combination: the best move that still covers, the narrow ones
    (drop one, add one; then swap one for one) and, when `wide` and none of those scores higher, the wide ones (swap
    one for two, two for one), until no move scores higher, `budget` moves are spent, or the climb reaches a
    combination in `passed` (where an earlier climb went on from; each one it passes is added). Moves are made one at
    a time from the combination's sums. Returns ((score, combo), moves spent)."""
    current, value, spent = list(combo), score, 0
    covers, score_of = space.covers, space.score
    while spent < budget:
        if passed is not None:
            here = tuple(sorted(current))
            if here in passed and here != combo:
                break
            passed.add(here)
        sums = space.sums(current)
        inside = sorted(current, key=space.worth)
        members = set(current)
        outside = [i for i in candidates if i not in members]
        best_move: tuple[float, Combo, Combo] | None = None
        tiers = [single_moves(space, sums, inside, outside), swaps(space, sums, inside, outside)]
        if wide:
            tiers.append(wide_moves(space, sums, inside[:WIDE_SPAN], outside[:WIDE_SPAN]))
        for moves in tiers:
            for removed, added, after in moves:
                spent += 1
                if covers(after):
                    candidate = score_of(after)
                    if candidate > value + EPSILON and (best_move is None or candidate > best_move[0]):
                        best_move = (candidate, removed, added)
                if spent >= budget:
                    break
            if best_move is not None or spent >= budget:
                break
        if best_move is None:
            break
        value, removed, added = best_move
        current = [i for i in current if i not in removed] + list(added)
    return (value, tuple(sorted(current))), spent


def single_moves(space: Space, sums: Sums, inside: list[int], outside: list[int]) -> Moves:
    """Seed 002 hill climbing, made lazily: drop one (while more than one), add one."""
    for i in inside:
        if len(inside) > 1:
            yield (i,), (), space.minus(sums, i)
    for j in outside:
        yield (), (j,), space.plus(sums, j)


def swaps(space: Space, sums: Sums, inside: list[int], outside: list[int]) -> Moves:
    """Seed 002 hill climbing, made lazily: swap one for one."""
    for i in inside:
        without = space.minus(sums, i)
        for j in outside:
            yield (i,), (j,), space.plus(without, j)


def wide_moves(space: Space, sums: Sums, inside: list[int], outside: list[int]) -> Moves:
    """Seed 002 hill climbing, made lazily: per node `inside` (least worth first), swap it for two `outside`, then it
    and another inside for one outside."""
    for x, i in enumerate(inside):
        without = space.minus(sums, i)
        for y, j in enumerate(outside):
            with_j = space.plus(without, j)
            for k in outside[y + 1:]:
                yield (i,), (j, k), space.plus(with_j, k)
        for i2 in inside[x + 1:]:
            without_two = space.minus(without, i2)
            for j in outside:
                yield (i, i2), (j,), space.plus(without_two, j)
