"""`plan(snapshot, config, now) -> Plan`: every policy in precedence order under one global cap."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from agent.planner.capacity import node_states, schedulable
from agent.planner.guarantee import Cluster, plan_guarantee
from agent.planner.jobs import build_jobs, usage_by_queue
from agent.planner.model import Lock, Plan, Snapshot, lock_on
from agent.planner.ordering import QueueScore, order_jobs, score_queues
from agent.planner.reservations import plan_reservations
from agent.planner.starvation import plan_starvation
from agent.planner.windows import plan_window
from shared.config import ReservoirConfig


def cap(percent: int, nodes: int) -> int:
    """Seed 000 / seed 002 "Safety": floor(percent/100 * schedulable nodes)."""
    return percent * nodes // 100


def current_locks(snapshot: Snapshot) -> dict[str, Lock]:
    return {name: lock for name, node in snapshot.nodes.items() if (lock := lock_on(node)) is not None}


def plan(snapshot: Snapshot, config: ReservoirConfig, now: datetime,
         current: Mapping[str, Lock] | None = None, previous: Plan | None = None) -> Plan:
    """Desired locks. Precedence: reservation > queue guarantee (queues in QueueScoreOrder) > window > starvation;
    all kinds together hold at most `maxLockedNodePercent` of schedulable nodes, starvation locks at most
    `reservedNodePercent`. Jobs are ordered by QueueScoreOrder (queues.order_jobs). `previous`, the last
    plan, only saves work: the result is the same without it."""
    current = dict(current) if current is not None else current_locks(snapshot)
    states = node_states(snapshot.nodes, snapshot.pods, previous.states if previous is not None else None)
    schedulable_nodes = sum(1 for s in states.values() if schedulable(s.node))
    remaining = cap(config.max_locked_node_percent, schedulable_nodes)
    taken: set[str] = set()
    locks: dict[str, Lock] = {}
    notes: list[str] = []
    window_statuses = []
    waiting = build_jobs(snapshot) if config.starvation.enabled or config.guarantee.enabled else []
    named = {j.queue for j in waiting}
    guaranteed = [q for q in snapshot.queues.values() if q.guarantee is not None] if config.guarantee.enabled else []
    usage = usage_by_queue(states, snapshot.podgroups) if len(named) > 1 or guaranteed else {}
    scores: list[QueueScore] = []
    if len(named) > 1 or guaranteed:  # with one queue among the contenders, the queue order decides nothing
        scores = score_queues(snapshot, states, named, config.queue_order, usage)
    rank = {s.name: i for i, s in enumerate(scores)}

    reservation_statuses = []
    if config.reservations.enabled and snapshot.reservations:
        reservation_locks, reservation_statuses, reservation_notes = plan_reservations(
            list(snapshot.reservations.values()), states, snapshot.pods, current, taken, remaining,
            config.reservations.gc_grace_period, now)
        locks.update(reservation_locks)
        remaining -= len(reservation_locks)
        notes += reservation_notes

    guarantee_statuses = []
    if guaranteed:
        cluster = Cluster.of(states)
        live_jobs = {j.owner for j in waiting if not j.ready}
        for queue in sorted(guaranteed, key=lambda q: (rank.get(q.name, len(rank)), q.name)):
            queue_locks, status, queue_notes = plan_guarantee(
                queue, cluster, usage.get(queue.name, {}), snapshot.podgroups, current, taken, remaining, live_jobs,
                config.guarantee.search_budget, now)
            locks.update(queue_locks)
            remaining -= len(queue_locks)
            guarantee_statuses.append(status)
            notes += queue_notes

    for window in config.windows:
        window_locks, status, window_notes = plan_window(window, states, snapshot.pods, current, taken, remaining, now)
        locks.update(window_locks)
        remaining -= len(window_locks)
        window_statuses.append(status)
        notes += window_notes

    job_statuses = []
    if config.starvation.enabled:
        jobs = order_jobs(waiting, scores, config.queue_order.ordering)
        budget = min(remaining, cap(config.starvation.reserved_node_percent, schedulable_nodes))
        starvation_locks, job_statuses, starvation_notes = plan_starvation(
            jobs, states, current, taken, budget, config.starvation, now)
        locks.update(starvation_locks)
        notes += starvation_notes
    return Plan(locks=locks, jobs=job_statuses, windows=window_statuses, notes=notes, queues=scores,
                guarantees=guarantee_statuses, reservations=reservation_statuses, states=states)
