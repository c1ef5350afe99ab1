"""Seed 001, QueueScoreOrder: the seed's own table and its A1/A2/B1/B2 example, through the planner."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from agent.planner.jobs import build_jobs
from agent.planner.plan import plan
from agent.planner.ordering import queue_scores, score
from shared import keys
from shared.config import QueueOrderConfig, load_config
from shared.resources import Resources
from shared.views import PodGroupView, PriorityClassView, PodView, QueueView
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


def test_reservoirs_own_placeholder_class_is_no_queue_priority_of_the_range() -> None:
    """make up's cluster holds reservoir-placeholder (1e9, deploy/priorityclass.yaml) beside seed 001's classes: the
    placeholders' class must not squash the queues' priority scores to nothing (team-high of 100000 scored 0.0001,
    and two queues equally used looked tied); any other class of that value still counts."""
    queues = {q.name: q for q in (queue("team-high", "example-high"), queue("team-low", "example-low"))}
    classes = {c.name: c for c in (klass("example-high", 100_000), klass("example-low", 1000),
                                   klass(keys.PLACEHOLDER_PRIORITY_CLASS, 1_000_000_000))}
    scores = queue_scores(queues, (), classes, {}, Resources.parse({"cpu": "24"}), ONES)
    assert [(s.name, s.priority_score, s.total) for s in scores] == [("team-high", 1.0, 3.0), ("team-low", 0.0, 2.0)]
    classes["someone-elses"] = klass("someone-elses", 1_000_000_000)
    assert queue_scores(queues, (), classes, {}, Resources.parse({"cpu": "24"}), ONES)[0].priority_score < 0.001


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


# --- issue 11: the tie-break, the enable switch, a PodGroup's own class ---

SEED_CLASSES = {c.name: c for c in (klass("zero", 0), klass("p40", 40), klass("p80", 80), klass("p100", 100))}


def tied_queues(x_uid: str, y_uid: str, y_age: timedelta = timedelta(days=1)) -> dict[str, QueueView]:
    """Two queues whose totals are equal in exact arithmetic: X is the seed's QueueA (priority 40, DRF share 0.3,
    proportion share 1.2: 0.4 + 0.7 - 0.2 = 0.9), Y has QueueB's priority and DRF share (80, 0.4) and a proportion
    share of 1.5 (0.8 + 0.6 - 0.5 = 0.9). As floats the two sums differ in the 16th digit."""
    x = replace(queue("X", "p40", {"cpu": "750"}), uid=x_uid)
    y = replace(queue("Y", "p80", {"cpu": "800"}, age=y_age), uid=y_uid)
    return {"X": x, "Y": y}


TIED_ALLOCATED = {"X": Resources.parse({"cpu": "900"}), "Y": Resources.parse({"cpu": "1200"})}


def test_equal_scores_fall_to_creation_time_then_to_uid() -> None:
    """Seed 001 QueueScoreOrderFn: "If no queue order funcs, order queue by CreationTimestamp first, then by UID":
    equal totals (compared exactly, not as floats) go to the older queue, and at the same creation time to the
    lower uid, whichever way round the uids are."""
    cluster = Resources.parse({"cpu": "3000"})
    for x_uid, y_uid, first in (("uid-b", "uid-a", "Y"), ("uid-a", "uid-b", "X")):
        ranked = queue_scores(tied_queues(x_uid, y_uid), (), SEED_CLASSES, TIED_ALLOCATED, cluster, ONES)
        assert [s.total for s in ranked] == pytest.approx([0.9, 0.9])
        assert ranked[0].name == first, f"uids X={x_uid} Y={y_uid}: the lower uid first, got {ranked[0].name}"
    older_y = tied_queues("uid-a", "uid-b", y_age=timedelta(days=2))
    assert [s.name for s in queue_scores(older_y, (), SEED_CLASSES, TIED_ALLOCATED, cluster, ONES)] == ["Y", "X"]


def seed_table() -> tuple[dict[str, QueueView], dict[str, Resources]]:
    """The seed's three queues (test_seed_table_from_allocations_orders_b_c_a), all created at the same time."""
    queues = {q.name: q for q in (queue("QueueA", "p40", {"cpu": "750"}), queue("QueueB", "p80", {"cpu": "2400"}),
                                  queue("QueueC", "zero", {"cpu": "5000"}))}
    allocated = {"QueueA": Resources.parse({"cpu": "900"}), "QueueB": Resources.parse({"cpu": "1200"}),
                 "QueueC": Resources.parse({"cpu": "1500"})}
    return queues, allocated


def test_queue_score_order_enable_false_orders_by_each_plugin_in_turn() -> None:
    """Seed 001's `QueueScoreOrderEnable`: with the seed's table, QueueScoreOrder is B > C > A (totals 1.9, 1.2,
    0.9); switched off, Volcano's QueueOrderFn orders by priority first (80 > 40 > 0): B > A > C. A plugin of weight
    0 is left out: without priority, the DRF shares decide (0.3 < 0.4 < 0.5): A > B > C."""
    queues, allocated = seed_table()
    cluster = Resources.parse({"cpu": "3000"})

    def order(config_text: str) -> list[str]:
        config = load_config(config_text).queue_order
        return [s.name for s in queue_scores(queues, (), SEED_CLASSES, allocated, cluster, config)]

    assert order("queueOrder: {queueScoreOrderEnable: true}") == ["QueueB", "QueueC", "QueueA"]
    assert order("{}") == ["QueueB", "QueueC", "QueueA"], "on by default"
    assert order("queueOrder: {queueScoreOrderEnable: false}") == ["QueueB", "QueueA", "QueueC"]
    assert order("queueOrder: {queueScoreOrderEnable: false, priorityWeight: 0}") == ["QueueA", "QueueB", "QueueC"]


def test_queue_score_order_enable_is_honoured_by_the_planner() -> None:
    """Through plan(): the guaranteed queues are served in the order the switch says. Two opted-in guarantees of one
    node each, one node lockable: the older queue (bronze) has the better score (less allocated), gold the higher
    PriorityClass; with the switch off, priority decides."""
    nodes = [node("n1"), node("n2")]
    gold = QueueView.from_obj({"metadata": {"name": "gold", "uid": "u-gold", "creationTimestamp": stamp(NOW),
                                            "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                               "spec": {"priorityClassName": "p40", "guarantee": {"resource": {"cpu": "4"}}}})
    bronze = QueueView.from_obj({"metadata": {"name": "bronze", "uid": "u-bronze", "creationTimestamp": stamp(NOW),
                                              "annotations": {keys.QUEUE_LOCK_GUARANTEE: "true"}},
                                 "spec": {"priorityClassName": "zero", "guarantee": {"resource": {"cpu": "4"}}}})
    busy = [replace(pod(f"g{i}", "1", node_name="n1"), annotations={keys.QUEUE_NAME: "gold"}) for i in range(3)]
    snapshot = replace(snap(nodes, busy), queues={"gold": gold, "bronze": bronze}, priority_classes=SEED_CLASSES)
    half = "maxLockedNodePercent: 50\nstarvation: {enabled: false}\nqueueOrder: {priorityWeight: 0.1, "
    by_score = plan(snapshot, load_config(half + "queueScoreOrderEnable: true}"), NOW)
    by_plugins = plan(snapshot, load_config(half + "queueScoreOrderEnable: false}"), NOW)
    assert [q.name for q in by_score.queues] == ["bronze", "gold"]
    assert {lock.subject for lock in by_score.locks.values()} == {"queue/bronze"}
    assert [q.name for q in by_plugins.queues] == ["gold", "bronze"]
    assert {lock.subject for lock in by_plugins.locks.values()} == {"queue/gold"}


def podgroup(name: str, queue_name: str, priority_class: str = "") -> PodGroupView:
    return PodGroupView.from_obj({"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                                               "creationTimestamp": stamp(NOW - timedelta(hours=1))},
                                  "spec": {"minMember": 1, "queue": queue_name, "priorityClassName": priority_class}})


def grouped(name: str, group: str, priority: int) -> PodView:
    return pod(name, "1", group=group, priority=priority, age=timedelta(minutes=10))


def test_a_podgroups_own_class_is_its_jobs_priority_never_above_what_its_pods_were_admitted_with() -> None:
    """Seed 001 `cache.go`: a job's priority is its PodGroup's PriorityClass when that class exists, else its
    queue's. Issue 11: a PodGroup of class `low` in a queue of class `high` is a `low` job, whatever its pods carry;
    a PodGroup naming a class its pods were not admitted with (the webhook skipped, a ResourceQuota in the way) ranks
    no higher than its pods: a PodGroup is not judged by ResourceQuota, a pod is (shared.priority)."""
    classes = {c.name: c for c in (klass("low", 10), klass("high", 1000),
                                   klass("system-cluster-critical", 2_000_000_000))}
    queues = {"hq": queue("hq", "high"), "lq": queue("lq", "low")}
    groups = [podgroup("own-low", "hq", "low"), podgroup("own-high", "lq", "high"), podgroup("none", "hq"),
              podgroup("missing", "hq", "no-such-class"), podgroup("forged", "lq", "system-cluster-critical")]
    pods = [grouped("a", "own-low", 1000), grouped("b", "own-high", 1000), grouped("c", "none", 1000),
            grouped("d", "missing", 1000), grouped("e", "forged", 0), pod("lone", "1", priority=1000)]
    snapshot = replace(snap([], pods, groups), queues=queues, priority_classes=classes)
    priorities = {job.subject.rsplit("/", 1)[-1]: job.priority for job in build_jobs(snapshot)}
    assert priorities == {"own-low": 10, "own-high": 1000, "none": 1000, "missing": 1000, "forged": 0, "lone": 1000}
