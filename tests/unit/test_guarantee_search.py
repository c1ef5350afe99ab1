"""Seed 002, the guarantee search on heterogeneous clusters (issue 11): nodes grouped by coarse shape, a capped pool,
moves made lazily, and the quality check against brute force on nodes that are all different.

The brute-force check on alike nodes is test_guarantee.py's test_bounded_search_scores_within_5_percent_of_brute_force;
the one here is the same on clusters where no two nodes have the same allocatable."""

from __future__ import annotations

import random
import tracemalloc
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.planner.guarantee_search import (
    POOL_CAP,
    SHAPE_BITS,
    Problem,
    Space,
    brute_force,
    coarse,
    improve,
    pool,
    search,
    shape_of,
)
from agent.planner.plan import plan
from shared import keys
from shared.config import load_config
from shared.ownership import queue_owner_id
from shared.resources import Resources
from shared.timestamps import stamp
from shared.views import NodeView, QueueView
from tests.builders import NOW, pod, snap

GI, MI = 2**30, 2**20

# (cpu, memory GiB, idle %, queue use, cpu cut m, memory cut MiB): the cuts make every node's allocatable its own
different_nodes = st.lists(st.tuples(st.sampled_from([2, 4, 8, 16]), st.sampled_from([4, 8, 16, 32, 64]),
                                     st.integers(0, 100), st.integers(0, 3), st.integers(1, 300),
                                     st.integers(1, 700)),
                           min_size=1, max_size=12, unique_by=lambda node: (node[0], node[1], node[4], node[5]))


def mixed_problem(spec: list[tuple[int, int, int, int, int, int]], want_cpu: int, want_mem: int) -> Problem:
    alloc = [Resources({"cpu": c * 1000 - dc, "memory": m * GI - dm * MI}) for c, m, _, _, dc, dm in spec]
    idle = [Resources({"cpu": a["cpu"] * pct // 100, "memory": a["memory"] * pct // 100})
            for a, (_, _, pct, _, _, _) in zip(alloc, spec, strict=True)]
    used = [Resources({"cpu": u * 1000, "memory": u * GI}) for _, _, _, u, _, _ in spec]
    return Problem(names=[f"n{i:02d}" for i in range(len(spec))], alloc=alloc, idle=idle, used=used,
                   request=Resources({"cpu": want_cpu * 1000, "memory": want_mem * GI}),
                   total_alloc=Resources.total(alloc), total_used=Resources.total(used))


Spec = list[tuple[int, int, int, int, int, int]]


@st.composite
def covered_mostly(draw: st.DrawFn) -> tuple[Spec, int, int]:
    """(nodes, cpu wanted, GiB wanted): three times in four a request the nodes together cover (so some node set
    covers it), else one of up to 64 cpu and 200 GiB, which they may not."""
    spec = draw(different_nodes)
    if draw(st.integers(0, 3)) == 3:  # not 0: hypothesis draws its simplest value more often than the others
        return spec, draw(st.integers(1, 64)), draw(st.integers(1, 200))
    alloc = mixed_problem(spec, 0, 0).total_alloc
    return spec, draw(st.integers(1, alloc["cpu"] // 1000)), draw(st.integers(1, alloc["memory"] // GI))


COVERED: list[bool] = []  # one entry per example of the property running: some node set covers the request


@pytest.mark.parametrize("exact_when_small", [True, False], ids=["as-run", "beams-alone"])
def test_search_scores_within_5_percent_of_brute_force_on_all_different_nodes(exact_when_small: bool) -> None:
    """No two nodes have the same allocatable (the heterogeneous case): as the agent runs it, and without the exact
    enumeration over kinds; in at least half the examples some node set covers the request (`covered_mostly`), else
    the property would test nothing."""
    COVERED.clear()
    within_5_percent_on_all_different_nodes(exact_when_small)
    assert sum(COVERED) >= len(COVERED) / 2 > 0, f"{sum(COVERED)} of {len(COVERED)} examples covered"


@settings(max_examples=150, deadline=None)
@given(case=covered_mostly())
def within_5_percent_on_all_different_nodes(exact_when_small: bool, case: tuple[Spec, int, int]) -> None:
    spec, want_cpu, want_mem = case
    problem = mixed_problem(spec, want_cpu, want_mem)
    assert len(set(problem.alloc)) == len(spec)
    optimum = brute_force(problem)
    found = search(problem, 2000, exact_when_small)
    COVERED.append(optimum is not None)
    if optimum is None:
        assert found is None
        return
    assert found is not None and problem.covers(found[1])
    assert found[0] == pytest.approx(problem.score(found[1])), "the score reported is the combination's score"
    assert found[0] >= 0.95 * optimum[0], (found, optimum)


@given(st.integers(1, 2**62))
def test_a_coarse_amount_is_never_more_and_more_than_seven_eighths_of_one_less(amount) -> None:
    assert (amount - 1) * 7 / 8 <= coarse(amount) <= amount
    assert coarse(amount).bit_count() <= SHAPE_BITS


def test_nodes_a_little_different_are_one_shape_and_other_sizes_are_not() -> None:
    big = Resources({"cpu": 32000, "memory": 128 * GI, "pods": 110})
    kube_reserved = Resources({"cpu": 31650, "memory": 128 * GI - 300 * MI, "pods": 110})
    assert shape_of(big) == shape_of(kube_reserved)
    assert shape_of(big) != shape_of(Resources({"cpu": 16000, "memory": 128 * GI, "pods": 110}))
    assert shape_of(big, ["cpu"]) == Resources({"cpu": coarse(32000)}), "only the dimensions asked for"


def jittered(count: int, cpu: int, mem_gi: int, rng: random.Random) -> list[Resources]:
    return [Resources({"cpu": cpu * 1000 - rng.randint(50, 400), "memory": mem_gi * GI - rng.randint(1, 512) * MI})
            for _ in range(count)]


def problem_of(alloc: list[Resources], request: Resources, rng: random.Random, used_every: int = 0) -> Problem:
    idle = [Resources({d: v * rng.randint(0, 100) // 100 for d, v in a.items()}) for a in alloc]
    used = [Resources({"cpu": 1000, "memory": GI}) if used_every and i % used_every == 0 else Resources()
            for i in range(len(alloc))]
    return Problem(names=[f"node-{i:04d}" for i in range(len(alloc))], alloc=alloc, idle=idle, used=used,
                   request=request, total_alloc=Resources.total(alloc), total_used=Resources.total(used))


def test_the_pool_takes_per_coarse_shape_what_it_needs_plus_one_the_most_idle() -> None:
    """100 nodes of one instance type, each with its own allocatable: one shape, so 2 + 1 nodes for a request two of
    them cover (grouped by exact allocatable, all 100 would be searched)."""
    rng = random.Random(1)
    problem = problem_of(jittered(100, 32, 128, rng), Resources({"cpu": 60000, "memory": 200 * GI}), rng)
    chosen = pool(problem)
    idle_share = [sum(problem.idle[i][d] / problem.alloc[i][d] for d in ("cpu", "memory")) for i in range(100)]
    assert sorted(chosen) == sorted(sorted(range(100), key=lambda i: -idle_share[i])[:3])


@pytest.mark.parametrize("cpu, nodes_at_most", [(16, POOL_CAP), (1500, None)])
def test_the_pool_is_capped_and_covers_on_a_cluster_of_24_shapes(cpu, nodes_at_most) -> None:
    """400 nodes of 24 instance types, a tenth used by the queue: at most POOL_CAP nodes are searched; a request that
    needs many nodes gets more, and they cover it."""
    rng = random.Random(2)
    alloc = [a for c in (4, 8, 16, 32, 48, 64, 96, 128) for per in (2, 4, 8)
             for a in jittered(rng.randint(10, 24), c, c * per, rng)]
    problem = problem_of(alloc, Resources({"cpu": cpu * 1000, "memory": cpu * 4 * GI}), rng, used_every=10)
    chosen = pool(problem)
    assert len(chosen) == len(set(chosen)) and problem.covers(chosen)
    assert len(chosen) <= (nodes_at_most or len(alloc) // 2)
    found = search(problem, 2000)
    assert found is not None and problem.covers(found[1]) and set(found[1]) <= set(chosen)


def test_the_search_over_400_different_nodes_stays_small_and_moves_are_made_lazily() -> None:
    """The case that took 97 s and 19.6 GiB (every node its own kind, every move listed before the budget was
    looked at): a request of about 25 nodes over 400 all different nodes. Memory is what is checked, not time."""
    rng = random.Random(3)
    alloc = [a for c in (8, 16, 32, 48, 64) for a in jittered(80, c, c * 4, rng)]
    problem = problem_of(alloc, Resources({"cpu": 1024_000, "memory": 4096 * GI}), rng, used_every=10)
    tracemalloc.start()
    try:
        found = search(problem, 2000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found is not None and problem.covers(found[1]) and len(found[1]) >= 16
    assert peak < 16 * MI, f"peak {peak / MI:.1f} MiB"
    candidates = pool(problem)
    space = Space.of(problem, candidates)
    (score, combo), spent = improve(space, candidates, found[1], found[0], 50, wide=True)
    assert spent <= 50 and score >= found[0]


def mixed_node(name: str, cpu_m: int, mem_mi: int) -> NodeView:
    return NodeView.from_obj({"metadata": {"name": name, "creationTimestamp": stamp(NOW)},
                              "status": {"allocatable": {"cpu": f"{cpu_m}m", "memory": f"{mem_mi}Mi", "pods": "110"}}})


def test_a_guarantee_on_a_cluster_of_all_different_nodes_locks_the_two_most_idle_that_cover() -> None:
    """Through plan(): 20 nodes of 32 cpu and 20 of 8 cpu, each a little less than its type and busy to its own
    degree; a guarantee two of the large cover takes the two most idle large ones."""
    rng = random.Random(4)
    nodes, pods, idle = [], [], {}
    for i in range(40):
        cpu = 32 if i % 2 else 8
        name = f"n{i:02d}"
        nodes.append(mixed_node(name, cpu * 1000 - rng.randint(50, 400), cpu * 4096 - rng.randint(1, 512)))
        busy = rng.randint(0, cpu - 1)
        pods += [pod(f"{name}-{k}", "1", node_name=name) for k in range(busy)]
        idle[name] = cpu - busy
    config = load_config("maxLockedNodePercent: 90\nstarvation: {enabled: false}")
    q = QueueView.from_obj({"metadata": {"name": "q1", "uid": "uid-q1", "creationTimestamp": stamp(NOW),
                                         "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                            "spec": {"weight": 1, "guarantee": {"resource": {"cpu": "60", "memory": "100Gi"}}}})
    result = plan(replace(snap(nodes, pods), queues={"q1": q}), config, NOW)
    locked = sorted(n for n, lock in result.locks.items() if lock.owner == queue_owner_id("q1"))
    large = sorted((n for n in idle if int(n[1:]) % 2), key=lambda n: (-idle[n], n))
    assert len(locked) == 2 and set(locked) <= set(large)
    assert sorted(idle[n] for n in locked) == sorted(idle[n] for n in large[:2]), (locked, large[:4])
