"""Seed 001, QueueScoreOrder (DESIGN 4.5): which queue, and which job, comes first when locks compete for the caps.

For each queue q, with weights w_p, w_d, w_r from config `queueOrder`:

    priority score   = (P(q) - P_min) / (P_max - P_min)        0 when P_max == P_min
    DRF score        = 1 - dominant_share(q) / weight(q)
    proportion score = 1 - proportion_share(q)
    total            = w_p * priority + w_d * DRF + w_r * proportion

P(q) is the value of the PriorityClass the queue names (QueueView.class_name), else its `spec.priority`, else 0;
P_min / P_max range over the queues' priorities and every user-definable PriorityClass (value <= 1e9: the
system classes would squash every user queue to 0) but Reservoir's own placeholder class (1e9, so that placeholders
come first: it squashed every user queue just as well, team-high of 100000 scoring 0.0001).
dominant_share = max over resources (pods excluded) of
allocated / cluster allocatable; proportion_share = max over resources of allocated / deserved, where deserved is
`spec.deserved` when set, else the cluster's allocatable split by weight among the queues, capped by
`spec.capability`. allocated = requests of the queue's pods holding resources on a node. Higher total first;
ties by creation time, then uid. Scores are compared exactly (fractions of the integer quantities, weights as the
config gives them), so two totals equal in arithmetic tie and the tie-break decides, not float rounding (0.4 + 0.7 -
0.2 and 0.8 + 0.6 - 0.5 are both 0.9; as floats they differ in the 16th digit). A queue that pods name without a
Queue object counts as weight 1, no priority, created at the epoch.

`queueOrder.queueScoreOrderEnable` (the seed's `QueueScoreOrderEnable`): when false, queues are ordered as Volcano's
QueueOrderFn does without scores, each plugin's own order in its tier order, the first that tells two queues apart
deciding: priority (higher first), then DRF share (lower first), then proportion share (lower first); then creation
time and uid. A plugin whose weight is 0 is left out of either order (the seed's per-plugin `EnabledQueueScoreOrder`).

Jobs: `queue-first` orders by queue, then job priority, creation time, name; `job-first` (the seed's
"reflection") by job priority across queues, then queue, creation time, name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

from agent.planner.capacity import NodeState, schedulable
from agent.planner.jobs import NO_QUEUE, Job, usage_by_queue
from agent.planner.model import QueueScore as QueueScore  # re-exported: agent/commands.py imports it from here
from agent.planner.model import Snapshot
from shared.config import QueueOrderConfig
from shared.keys import PLACEHOLDER_PRIORITY_CLASS
from shared.resources import PODS, Resources
from shared.views import EPOCH, PriorityClassView, QueueView

HIGHEST_USER_DEFINABLE_PRIORITY = 1_000_000_000


def score(priority: int, lowest: int, highest: int, drf_share: Fraction, weight: int, proportion_share: Fraction,
          config: QueueOrderConfig) -> tuple[Fraction, Fraction, Fraction, Fraction]:
    """Seed 001 QueueScoreOrderFn: (priority score, DRF score, proportion score, total), each part already times its
    weight (module docstring); exact when the shares are Fractions."""
    p = Fraction(priority - lowest, highest - lowest) if highest > lowest else Fraction(0)
    d = 1 - drf_share / weight
    r = 1 - proportion_share
    parts = (Fraction(config.priority_weight) * p, Fraction(config.drf_weight) * d,
             Fraction(config.proportion_weight) * r)
    return (*parts, sum(parts, Fraction(0)))


def share(allocated: Resources, of: Resources) -> Fraction:
    """Seed 001 DRF and proportion shares: max over resources (pods excluded) of allocated / of, counting only
    resources `of` has; exact."""
    return max((Fraction(amount, of[name]) for name, amount in allocated.items() if name != PODS and of[name] > 0),
               default=Fraction(0))


def tiered_key(priority: int, drf_share: Fraction, proportion_share: Fraction,
               config: QueueOrderConfig) -> tuple[Fraction | int, ...]:
    """Seed 001 with `QueueScoreOrderEnable: false`: Volcano's QueueOrderFn, the plugins one after the other in
    their tier order (priority higher first, DRF share lower first, proportion share lower first), those of weight 0
    left out; lower keys first."""
    parts: list[Fraction | int] = []
    if config.priority_weight > 0:
        parts.append(-priority)
    if config.drf_weight > 0:
        parts.append(drf_share)
    if config.proportion_weight > 0:
        parts.append(proportion_share)
    return tuple(parts)


def queue_priority(queue: QueueView, classes: Mapping[str, PriorityClassView]) -> int:
    """Seed 001 "PriorityClass of queue": the value of the class the queue names, else `spec.priority`, else 0."""
    pc = classes.get(queue.class_name) if queue.class_name else None
    return pc.value if pc is not None else int(queue.priority or 0)


def deserved(queues: Sequence[QueueView], cluster: Resources) -> dict[str, Resources]:
    """Seed 001 proportion's deserved: `spec.deserved`, else the cluster split by weight, capped by capability."""
    total_weight = sum(q.weight for q in queues) or 1
    out = {}
    for q in queues:
        if q.deserved:
            out[q.name] = q.deserved
            continue
        fair = Resources({n: v * q.weight // total_weight for n, v in cluster.items()})
        if q.capability:
            fair = Resources({n: min(v, q.capability[n]) if n in q.capability else v for n, v in fair.items()})
        out[q.name] = fair
    return out


def queue_scores(queues: Mapping[str, QueueView], named: Iterable[str], classes: Mapping[str, PriorityClassView],
                 allocated: Mapping[str, Resources], cluster: Resources, config: QueueOrderConfig) -> list[QueueScore]:
    """Seed 001 QueueScoreOrder: every Queue object and every queue in `named` (queues pods name), best first.
    NO_QUEUE (the pods of a Queue that does not admit them) has no score: its jobs rank after every queue's."""
    everyone = dict(queues)
    for name in named:
        if name == NO_QUEUE:
            continue
        everyone.setdefault(name, QueueView(name=name, uid="", annotations={}, weight=1, priority=None,
                                            priority_class_name="", capability=Resources(), guarantee=None,
                                            created=EPOCH))
    ordered = list(everyone.values())
    priorities = {q.name: queue_priority(q, classes) for q in ordered}
    user_definable = [c.value for name, c in classes.items()
                      if c.value <= HIGHEST_USER_DEFINABLE_PRIORITY and name != PLACEHOLDER_PRIORITY_CLASS]
    range_of = list(priorities.values()) + user_definable
    lowest, highest = (min(range_of), max(range_of)) if range_of else (0, 0)
    fair = deserved(ordered, cluster)
    scored = []
    for q in ordered:
        used = allocated.get(q.name, Resources())
        drf_share, proportion_share = share(used, cluster), share(used, fair[q.name])
        p, d, r, total = score(priorities[q.name], lowest, highest, drf_share, q.weight, proportion_share, config)
        first: tuple[Fraction | int, ...] = ((-total,) if config.queue_score_order_enable
                                             else tiered_key(priorities[q.name], drf_share, proportion_share, config))
        scored.append((QueueScore(q.name, priorities[q.name], float(p), float(drf_share), float(d),
                                  float(proportion_share), float(r), float(total), used, fair[q.name]),
                       (first, q.created, q.uid, q.name)))
    scored.sort(key=lambda item: item[1])
    return [item[0] for item in scored]


def score_queues(snapshot: Snapshot, states: Mapping[str, NodeState], named: Iterable[str], config: QueueOrderConfig,
                 usage: Mapping[str, Mapping[str, Resources]] | None = None) -> list[QueueScore]:
    """Seed 001: queue_scores over a snapshot: allocation from `usage` (queue -> node -> requests,
    jobs.usage_by_queue; computed here when not given), the cluster from the allocatable of schedulable nodes."""
    usage = usage if usage is not None else usage_by_queue(states, snapshot.podgroups, snapshot.queues)
    cluster = Resources.total(s.node.allocatable for s in states.values() if schedulable(s.node))
    allocated = {q: Resources.total(by_node.values()) for q, by_node in usage.items()}
    return queue_scores(snapshot.queues, named, snapshot.priority_classes, allocated, cluster, config)


def order_jobs(jobs: Iterable[Job], scores: Sequence[QueueScore], ordering: str) -> list[Job]:
    """Seed 001 (queue-first, or the "reflection"'s job-first): jobs in the order they get locks (module
    docstring). Without scores every queue ranks alike."""
    rank = {s.name: i for i, s in enumerate(scores)}
    last = len(rank)
    if ordering == "job-first":
        return sorted(jobs, key=lambda j: (-j.priority, rank.get(j.queue, last), j.created, j.subject))
    return sorted(jobs, key=lambda j: (rank.get(j.queue, last), -j.priority, j.created, j.subject))
