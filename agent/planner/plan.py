"""`plan(snapshot, config, now) -> Plan`: every policy of the registry, in precedence order, under one global cap.

The registry, POLICIES, is DESIGN 4's precedence: reservation (seed 003) > queue guarantee (seed 002) > window
(seed 004) > starvation (seed 000). Each policy reads one PlanContext and returns one PolicyResult (policy.py);
between two policies the nodes the first locked become taken and leave the budget. What a policy may take of the
locks already on the nodes is displacement.DISPLACES.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from agent.planner.backfill import BACKFILL_KINDS, backfill_slots, plan_backfill, waiting_task, with_expected_starts
from agent.planner.capacity import NodeState, control_plane, node_states, schedulable
from agent.planner.guarantee import GUARANTEES, guaranteed_queues
from agent.planner.jobs import build_jobs, usage_by_queue
from agent.planner.model import NO_BACKFILL, BackfillPlan, Lock, Plan, Snapshot, lock_on
from agent.planner.ordering import score_queues
from agent.planner.policy import PlanContext, Policy, Statuses, cap, earliest, merged_marks, tagged
from agent.planner.repair import plan_repairs
from agent.planner.reservations import RESERVATIONS
from agent.planner.reserve import RuntimeMemo, with_group_runtimes
from agent.planner.starvation import STARVATION, lock_cooldowns
from agent.planner.windows import WINDOWS, reserve_pods
from shared import keys
from shared.config import ReservoirConfig
from shared.keys import LockKind
from shared.ownership import reservation_owner_id, window_owner_id
from shared.views import NodeView, PodView

POLICIES: tuple[Policy, ...] = (RESERVATIONS, GUARANTEES, WINDOWS, STARVATION)


def current_locks(snapshot: Snapshot) -> dict[str, Lock]:
    """node -> the lock Reservoir wrote on it, read back (model.lock_on)."""
    return {name: lock for name, node in snapshot.nodes.items() if (lock := lock_on(node)) is not None}


def plan(snapshot: Snapshot, config: ReservoirConfig, now: datetime,
         current: Mapping[str, Lock] | None = None, previous: Plan | None = None) -> Plan:
    """Desired locks. Precedence: POLICIES, in order; all kinds together hold at most `maxLockedNodePercent` of
    schedulable nodes (capacity.schedulable: not cordoned, Ready, not control-plane), starvation locks at most
    `reservedNodePercent`; never a lock on a NotReady or control-plane node (guard_locks). Jobs and guaranteed queues
    are ordered by QueueScoreOrder (seed 001). `previous`, the last plan, only saves work: the result is the same
    without it. Every note is tagged `policy=<name>`; the repairs (repair.plan_repairs) follow from the locks and
    statuses."""
    context = plan_context(snapshot=snapshot, config=config, now=now,
                           current=dict(current) if current is not None else current_locks(snapshot),
                           previous=previous)
    locks: dict[str, Lock] = {}
    statuses = Statuses()
    notes: list[str] = []
    wake_at: datetime | None = None
    drains: dict[str, str] = {}
    for policy in POLICIES:
        result = policy.run(context=context)
        wake_at = earliest(wake_at, result.wake_at)
        locks.update(result.locks)
        drains.update(result.drains)
        statuses += result.statuses
        notes += [tagged(policy, note) for note in result.notes]
        context = context.after(result.locks, result.uncounted)
    locks, refused = guard_locks(locks, context.states)
    notes += refused
    # a repair is owed only to a pod not bound: the pending ones (podindex) are all it needs to look at
    repairs = plan_repairs(jobs=context.jobs, pods=list(snapshot.index.unbound.values()), locks=locks,
                           statuses=statuses.reservations, reservations=snapshot.reservations,
                           windows=config.windows, snapshot=snapshot, config=config)
    drains = {node: owner for node, owner in drains.items() if node not in locks}  # a lock replaces the mark
    drains_marked, drain_notes = drain_marks(snapshot.nodes, drains, locks)
    notes += drain_notes
    backfill = plan_backfill_of(context, locks, statuses)
    notes += [f"policy=backfill {note}" for note in backfill.notes]
    reservations = with_expected_starts(statuses.reservations, backfill.estimates, snapshot.reservations,
                                        context.now)
    return Plan(locks=locks, jobs=list(statuses.jobs), windows=list(statuses.windows), notes=notes,
                queues=list(context.scores), guarantees=list(statuses.guarantees),
                reservations=reservations, repairs=repairs, states=context.states,
                placeholders=list(statuses.placeholders), handovers=list(statuses.handovers),
                node_marks=merged_marks(context.cooldowns.marks, backfill.marks, drains_marked),
                drains=drains,
                runtimes=context.runtimes,
                wake_at=wake_at, backfill=backfill, rankings=context.rankings)


def drain_marks(nodes: Mapping[str, NodeView], drains: Mapping[str, str],
                locks: Mapping[str, Lock]) -> tuple[dict[str, dict[str, str | None]], list[str]]:
    """Plan.node_marks for the soft-drain taints (keys.DRAIN, starvation.soft_drains): on each node whose taint is not
    the one `drains` wants (none on a node not in it: this plan locks it, or no policy wants one), the owner to write,
    or None to remove it; and a note for each removal, saying why (`locks`: this plan's; the writes are noted by the
    policy)."""
    marks: dict[str, dict[str, str | None]] = {}
    notes: list[str] = []
    for name, node in nodes.items():
        if not node.taints and name not in drains:
            continue  # most nodes: nothing there, nothing wanted
        want = drains.get(name)
        have = node.drain_owner
        if have != want:
            marks[name] = {keys.DRAIN: want}
            if want is None:
                why = ("the node is locked" if name in locks else "no longer planned: its job is bound, gone, locked "
                       "for, past its window, or another job's turn came first" if have
                       else "not a soft-drain taint Reservoir writes (several, or another effect)")
                notes.append(f"policy=starvation node={name} decision=soft-drain-removed owner={have or '-'} "
                             f"reason={why}")
    return marks, notes


def plan_backfill_of(context: PlanContext, locks: Mapping[str, Lock], statuses: Statuses) -> BackfillPlan:
    """Issue 17: the slots under this plan's locks that wait for capacity (backfill.backfill_slots: the windows'
    starts and their pending reserve pods, the Waiting Reservations, the starvation jobs' pending tasks), the start
    estimates from them, and backfill under them (backfill.plan_backfill)."""
    snapshot = context.snapshot
    waits = [lock for lock in locks.values() if lock.kind in BACKFILL_KINDS]
    index = snapshot.index
    if not waits and not any(p.backfill_gated for p in index.unbound.values()) and not any(
            n.backfill_grants or n.backfill_room for n in snapshot.nodes.values()):
        return NO_BACKFILL
    window_starts = {window_owner_id(w.name): w.start for w in statuses.windows if w.active}
    window_tasks: dict[str, list[PodView]] = {}
    if any(lock.kind is LockKind.WINDOW for lock in waits):
        for reserve in reserve_pods(context):
            if waiting_task(reserve.pod) and not reserve.pod.gated:
                for owner in reserve.windows:
                    window_tasks.setdefault(owner, []).append(reserve.pod)
    waiting = {reservation_owner_id(r.name) for r in statuses.reservations if r.phase == "Waiting"}
    slots, already = backfill_slots(pods=index, states=context.states, locks=locks, current=context.current,
                                    now=context.now, window_starts=window_starts,
                                    window_tasks=window_tasks, waiting_reservations=waiting)
    grounds = snapshot.grounds(context.config)
    return plan_backfill(pods=index, nodes=snapshot.nodes, states=context.states, locks=locks,
                         config=context.config, now=context.now, podgroups=snapshot.podgroups, grounds=grounds,
                         slots=slots, already=already, workloads=snapshot.workloads)


def plan_gate(snapshot: Snapshot, config: ReservoirConfig, now: datetime, last: Plan,
              current: Mapping[str, Lock] | None = None) -> BackfillPlan:
    """Issue 34: the backfill gate decided between two plans, without a full plan. The last plan's locks and
    statuses (windows, Reservations) stand; the node states are brought up to date from `snapshot` (node_states,
    reusing the last plan's for every node that did not change); backfill (plan_backfill_of) runs on them. When only
    gated pods arrived since the last plan and no moment it named passed (Plan.wake_at), this is the backfill the
    next full plan would give (tests/unit/test_gate_pass.py); else the next full plan corrects it, as it corrects
    any plan made on a snapshot that moved on."""
    states, _ = states_of(snapshot, last)
    context = PlanContext(snapshot=snapshot, config=config, now=now, states=states,
                          current=dict(current) if current is not None else current_locks(snapshot))
    return plan_backfill_of(context, last.locks, Statuses(windows=tuple(last.windows),
                                                          reservations=tuple(last.reservations)))


def guard_locks(locks: Mapping[str, Lock], states: Mapping[str, NodeState]) -> tuple[dict[str, Lock], list[str]]:
    """Guard rail (issue 10), the last word on every planned lock: none on a node that is NotReady or a control-plane
    node (capacity.schedulable keeps the policies off them already; this also catches a lock a policy keeps on the
    node it holds, such as a placed Reservation's). A lock already there is thus released by the writer."""
    kept: dict[str, Lock] = {}
    notes: list[str] = []
    for name, lock in locks.items():
        state = states.get(name)
        why = ("node gone" if state is None else "control-plane node" if control_plane(state.node)
               else "node NotReady" if not state.node.ready else None)
        if why is None:
            kept[name] = lock
        else:
            notes.append(f"policy=guard node={name} decision=no-lock owner={lock.owner} reason={why}")
    return kept, notes


def states_of(snapshot: Snapshot, previous: Plan | None) -> tuple[dict[str, NodeState], RuntimeMemo]:
    """The node states of `snapshot` (capacity.node_states), and the runtime memo for the next plan. Seed 004: a pod's
    maximum runtime is its PodGroup's when it has none of its own (reserve.with_group_runtimes); the previous plan's
    memo gives a pod view the same replaced view as then, and its states are reused where nothing changed. The pods
    are read through the snapshot's index (podindex): no pass over every pod."""
    replaced, runtimes = with_group_runtimes(snapshot.index, snapshot.podgroups,
                                             previous.runtimes if previous is not None else None)
    return node_states(snapshot.nodes, snapshot.index, previous.states if previous is not None else None,
                       replaced), runtimes


def plan_context(*, snapshot: Snapshot, config: ReservoirConfig, now: datetime, current: Mapping[str, Lock],
                 previous: Plan | None) -> PlanContext:
    """Seeds 000-004: what every policy reads, computed once: node states (reusing the previous plan's where nothing
    changed), the global cap, the jobs with a pending pod, the queues' usage and QueueScoreOrder when queues
    compete, and seed 000's lock cool-downs (starvation.lock_cooldowns: the starvation policy and Plan.node_marks
    read the one answer)."""
    states, runtimes = states_of(snapshot, previous)
    schedulable_nodes = sum(1 for s in states.values() if schedulable(s.node))
    jobs = (build_jobs(snapshot, config.kueue, config.starvation.starving_job_time_threshold)
            if config.starvation.enabled or config.guarantee.enabled else [])
    named = {j.queue for j in jobs}
    compete = len(named) > 1 or bool(guaranteed_queues(snapshot.queues, config))
    usage = usage_by_queue(states, snapshot.podgroups, snapshot.queues) if compete else {}
    # with one queue among the contenders, the queue order decides nothing
    scores = score_queues(snapshot, states, named, config.queue_order, usage) if compete else []
    return PlanContext(snapshot=snapshot, config=config, now=now, states=states, current=current,
                       budget=cap(config.max_locked_node_percent, schedulable_nodes),
                       schedulable_nodes=schedulable_nodes, jobs=jobs, scores=scores, usage=usage,
                       live_jobs=frozenset(j.owner for j in jobs if not j.ready),
                       cooldowns=lock_cooldowns(nodes=snapshot.nodes, current=current, config=config.starvation,
                                                now=now, jobs=jobs),
                       runtimes=runtimes, rankings=dict(previous.rankings) if previous is not None else {})
