"""The contract every policy of the planner follows, as kube-scheduler's plugins and descheduler's registered plugins
follow theirs: a named unit that reads one frozen `PlanContext` and returns one `PolicyResult`.

`plan.POLICIES` lists the policies in DESIGN's precedence (reservation > queue guarantee > window > starvation);
`plan.plan()` runs them in that order and, between two of them, marks the nodes the first locked as taken and takes
their count off the budget (`PlanContext.after`). What a policy may take over of the locks already on the nodes is
decided by one table, `displacement.DISPLACES`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from agent.planner.capacity import NodeState, ShapeRanking
from agent.planner.jobs import Job
from agent.planner.model import (
    Handover,
    JobStatus,
    Lock,
    Placeholder,
    QueueGuaranteeStatus,
    QueueScore,
    ReservationStatus,
    Snapshot,
    WindowStatus,
)
from agent.planner.reserve import RuntimeMemo
from shared.config import ReservoirConfig
from shared.keys import LockKind
from shared.resources import Resources
from shared.views import PodView

NodeMarks = Mapping[str, Mapping[str, str | None]]  # node -> annotation -> text to write (None: remove)


@dataclass(frozen=True, kw_only=True)
class Cooldowns:
    """Seed 000 maxLockDuration's cool-down (starvation.lock_cooldowns, computed once per plan by plan.plan_context):
    the jobs that may not lock yet, and the `reservoir.sh/lock-expired` annotations the nodes must be given where
    they differ from what they carry."""

    # job owner, or a pod of the job not bound when its lock expired (starvation.task_record) -> when it may lock
    # again (> now)
    until: Mapping[str, datetime] = field(default_factory=dict)
    expired: frozenset[str] = frozenset()  # owners whose locks outlived maxLockDuration in this plan
    marks: NodeMarks = field(default_factory=dict)  # node -> {keys.LOCK_EXPIRED: text, or None to remove}


def cap(percent: int, nodes: int) -> int:
    """Seed 000 / seed 002 "Safety": floor(percent/100 * schedulable nodes)."""
    return percent * nodes // 100


@dataclass(frozen=True, kw_only=True)
class PlanContext:
    """What every policy reads: the plan's inputs, what the policies before it took, and what is computed once per
    plan for all of them."""

    snapshot: Snapshot
    config: ReservoirConfig
    now: datetime
    states: Mapping[str, NodeState]  # node -> its pods and idle (capacity.node_states)
    current: Mapping[str, Lock]  # node -> the lock on it now, read back from the node
    taken: frozenset[str] = frozenset()  # nodes locked in this plan by the policies before this one
    budget: int = 0  # nodes still lockable within maxLockedNodePercent
    schedulable_nodes: int = 0  # what the percentages of the caps are of
    jobs: Sequence[Job] = ()  # jobs with a pending pod (jobs.build_jobs), when starvation or guarantees are enabled
    scores: Sequence[QueueScore] = ()  # QueueScoreOrder, best first, when queues compete
    usage: Mapping[str, Mapping[str, Resources]] = field(default_factory=dict)  # queue -> node -> its requests
    live_jobs: frozenset[str] = frozenset()  # owner ids of the jobs in `jobs` that are not ready
    cooldowns: Cooldowns = Cooldowns()  # seed 000 lock cool-downs (starvation.lock_cooldowns), read once per plan
    runtimes: RuntimeMemo = field(default_factory=dict)  # reserve.with_group_runtimes' memo, for the next plan
    # issue 34: seed 000's node order per task shape, kept from plan to plan (capacity.ShapeRanking; starvation
    # updates it in place, re-ranking only changed nodes); shared by every copy of this context, handed to the next plan
    rankings: dict[str, ShapeRanking] = field(default_factory=dict)

    def after(self, locks: Mapping[str, Lock], uncounted: frozenset[str] = frozenset()) -> PlanContext:
        """The context of whatever plans next: `locks`' nodes taken, their count (but `uncounted`'s) off the budget."""
        if not locks:
            return self
        return replace(self, taken=self.taken | locks.keys(),
                       budget=self.budget - len(locks.keys() - uncounted))


@dataclass(frozen=True, kw_only=True)
class Statuses:
    """What the policies report beside their locks, one field per kind of status (Plan has the same fields)."""

    reservations: tuple[ReservationStatus, ...] = ()
    guarantees: tuple[QueueGuaranteeStatus, ...] = ()
    windows: tuple[WindowStatus, ...] = ()
    jobs: tuple[JobStatus, ...] = ()
    placeholders: tuple[Placeholder, ...] = ()  # seed 003
    handovers: tuple[Handover, ...] = ()  # seed 003

    def __add__(self, other: Statuses) -> Statuses:
        return Statuses(reservations=self.reservations + other.reservations,
                        guarantees=self.guarantees + other.guarantees, windows=self.windows + other.windows,
                        jobs=self.jobs + other.jobs, placeholders=self.placeholders + other.placeholders,
                        handovers=self.handovers + other.handovers)


@dataclass(frozen=True, kw_only=True)
class PolicyResult:
    """What one policy returns: the locks it wants (node -> lock), its statuses, and one note per decision (without
    the `policy=<name>` tag: plan() adds it)."""

    locks: Mapping[str, Lock] = field(default_factory=dict)
    statuses: Statuses = Statuses()
    notes: tuple[str, ...] = ()
    # the next moment, after `now`, at which the passing of time alone may change this policy's answer (a job
    # crossing the starvation threshold, a lock reaching maxLockDuration, a cool-down ending, a window's range
    # starting or ending); None when none is due. Nothing in the cluster changes then, so the agent wakes for it.
    wake_at: datetime | None = None
    # nodes among `locks` whose lock does not count in maxLockedNodePercent (a Reservation's brief handover lock)
    uncounted: frozenset[str] = frozenset()
    # node -> owner id: the soft-drain taint (keys.DRAIN) the policy wants there (starvation `softDrain`); not locks:
    # they take nothing from the budget of the policies after it and keep no pod off a node
    drains: Mapping[str, str] = field(default_factory=dict)


def earliest(*moments: datetime | None) -> datetime | None:
    """The earliest of the moments given (None ignored), or None."""
    present = [m for m in moments if m is not None]
    return min(present) if present else None


class PolicyRun(Protocol):
    def __call__(self, *, context: PlanContext) -> PolicyResult: ...


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One named policy of the planner."""

    name: str  # tags its notes: `policy=<name> ...`
    kind: LockKind  # the kind of lock it writes: its row in displacement.DISPLACES
    seed: str  # the seed it implements
    run: PolicyRun


def tagged(policy: Policy, note: str) -> str:
    """A note as the agent logs it: `policy=<name> <note>`."""
    return f"policy={policy.name} {note}"


def kept_since(current: Mapping[str, Lock], *, node: str, owner: str, now: datetime) -> datetime:
    """A kept lock keeps its `since`: the time the node's current lock was taken when `owner` holds it already, else
    `now` (a node changing hands starts afresh)."""
    kept = current.get(node)
    return kept.since if kept is not None and kept.owner == owner else now


def merged_marks(*marks: NodeMarks) -> dict[str, dict[str, str | None]]:
    """Plan.node_marks: node -> every annotation to write there, of each source (they write distinct keys)."""
    out: dict[str, dict[str, str | None]] = {}
    for source in marks:
        for node, wanted in source.items():
            out.setdefault(node, {}).update(wanted)
    return out


def fair_share(gated: Sequence[PodView], count: int) -> list[PodView]:
    """The `count` gated pods one plan decides when more wait: in turns across namespaces, each namespace's oldest
    first (the k-th oldest of every namespace before any namespace's (k+1)-th; ties by creation, then key), so one
    tenant's flood of older pods does not keep every other tenant's on the gate. Returned oldest first."""
    rank: dict[str, int] = {}
    turns = []
    for pod in sorted(gated, key=lambda p: (p.created, p.key)):
        turn = rank.get(pod.namespace, 0)
        rank[pod.namespace] = turn + 1
        turns.append((turn, pod.created, pod.key, pod))
    chosen = [pod for *_, pod in sorted(turns, key=lambda t: t[:3])[:count]]
    return sorted(chosen, key=lambda p: (p.created, p.key))
