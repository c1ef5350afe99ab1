"""Seed 001, QueueScoreOrder: the seed's own table and its A1/A2/B1/B2 example, through the planner."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from agent.planner.plan import plan
from agent.planner.ordering import queue_scores, score
from shared import keys
from shared.config import QueueOrderConfig, load_config
from shared.resources import Resources
from shared.views import PriorityClassView, PodView, QueueView
from shared.timestamps import stamp
from tests.builders import NOW, node, pod, snap

ONES = QueueOrderConfig()


def klass(name: str, value: int) -> PriorityClassView:
    return PriorityClassView.from_obj({"metadata": {"name": name}, "value": value})


def queue(name: str, priority_class: str = "", deserved: dict | None = None, age: timedelta = timedelta(days=1),
          weight: int = 1) -> QueueView:
    spec: dict = {"weight": weight, "priorityClassName": priority_class}
    if deserved:
        spec["deserved"] = deserved
    return QueueView.from_obj({"metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": stamp(NOW - age)},
                               "spec": spec})


@pytest.mark.parametrize("name, priority, drf, proportion, parts, total", [
    ("QueueA", 40, 0.3, 1.2, (0.4, 0.7, -0.2), 0.9),
    ("QueueB", 80, 0.4, 0.5, (0.8, 0.6, 0.5), 1.9),
    ("QueueC", 0, 0.5, 0.3, (0.0, 0.5, 0.7), 1.2),
])
def test_seed_table_row(name, priority, drf, proportion, parts, total) -> None:
    """Seed 001's table, row by row: max PriorityClass 100, min 0, every weight 1."""
    got = score(priority, 0, 100, drf, 1, proportion, ONES)
    assert got[:3] == pytest.approx(parts) and got[3] == pytest.approx(total)


def test_seed_table_from_allocations_orders_b_c_a() -> None:
    """The same three queues, their shares produced from allocations: cluster 3000 cpu; A holds 900 of a deserved
    750 (DRF 0.3, proportion 1.2), B 1200 of 2400 (0.4, 0.5), C 1500 of 5000 (0.5, 0.3)."""
    classes = {c.name: c for c in (klass("p40", 40), klass("p80", 80), klass("p100", 100),
                                   klass("system-cluster-critical", 2_000_000_000))}
    queues = {q.name: q for q in (queue("QueueA", "p40", {"cpu": "750"}), queue("QueueB", "p80", {"cpu": "2400"}),
                                  queue("QueueC", "", {"cpu": "5000"}))}
    allocated = {"QueueA": Resources.parse({"cpu": "900"}), "QueueB": Resources.parse({"cpu": "1200"}),
                 "QueueC": Resources.parse({"cpu": "1500"})}
    scores = queue_scores(queues, (), classes, allocated, Resources.parse({"cpu": "3000"}), ONES)
    assert [s.name for s in scores] == ["QueueB", "QueueC", "QueueA"]
    assert [round(s.total, 6) for s in scores] == [1.9, 1.2, 0.9]
    assert [p for s in scores for p in (s.priority_score, s.drf_score, s.proportion_score)] == pytest.approx(
        [0.8, 0.6, 0.5, 0.0, 0.5, 0.7, 0.4, 0.7, -0.2])


def test_weights_and_ties() -> None:
    """A zero priority weight leaves DRF and proportion; equal scores fall back to creation time, then uid."""
    classes = {"hi": klass("hi", 100), "lo": klass("lo", 0)}
    old, young = queue("young", "hi", age=timedelta(hours=1)), queue("old", "lo", age=timedelta(days=2))
    ranked = queue_scores({q.name: q for q in (old, young)}, (), classes, {}, Resources.parse({"cpu": "10"}), ONES)
    assert [s.name for s in ranked] == ["young", "old"]
    flat = QueueOrderConfig(priorityWeight=0)
    ranked = queue_scores({q.name: q for q in (old, young)}, (), classes, {}, Resources.parse({"cpu": "10"}), flat)
    assert [s.name for s in ranked] == ["old", "young"]


def queued(name: str, queue_name: str, priority: int, cpu: str = "4") -> PodView:
    base = pod(name, cpu, priority=priority, age=timedelta(minutes=10))
    return replace(base, annotations={**base.annotations, keys.QUEUE_NAME: queue_name})


@pytest.mark.parametrize("ordering, expected", [
    ("queue-first", ["A2", "A1", "B2", "B1"]),
    ("job-first", ["B2", "A2", "A1", "B1"]),
])
def test_seed_a1_a2_b1_b2(ordering: str, expected: list[str]) -> None:
    """Seed 001's reflection: queue A (priority 10) holds A1 (10) and A2 (12); queue B (8) holds B1 (8), B2 (13).
    queue-first serves A's jobs, then B's; job-first orders the jobs by their own priority across queues. The
    planner considers jobs in this order (its job statuses keep it)."""
    classes = {c.name: c for c in (klass("ten", 10), klass("eight", 8))}
    queues = {q.name: q for q in (queue("A", "ten"), queue("B", "eight"))}
    pods = [queued("A1", "A", 10), queued("A2", "A", 12), queued("B1", "B", 8), queued("B2", "B", 13)]
    config = load_config(f"starvation: {{starvingJobTimeThreshold: 60s, reservedNodePercent: 100}}\n"
                         f"maxLockedNodePercent: 90\nqueueOrder: {{ordering: {ordering}}}")
    snapshot = snap([node("n1")], pods + [pod("filler", "4", node_name="n1")], spare=1)
    snapshot = replace(snapshot, queues=queues, priority_classes=classes)
    result = plan(snapshot, config, NOW)
    assert [j.subject.rsplit("/", 1)[-1] for j in result.jobs] == expected
    # one full node, four starving jobs that each need all of it: the first in the order gets the lock
    assert [l.subject.rsplit("/", 1)[-1] for l in result.locks.values()] == expected[:1]
    assert [q.name for q in result.queues] == ["A", "B"]
