"""Seed 000, "Reserve Action" (DESIGN 4.1): lock nodes for starving jobs.

A job is *starving* (`is_starving`, the seed's isJobStarving) when it has existed longer than
`starvingJobTimeThreshold`, is not Job Ready (bound < minMember) and not Job Condition Ready (bound + reserved <
minMember; a job whose tasks are already reserved on its locked nodes keeps them instead of asking again). Its pending
tasks are its unbound pods not held by `spec.schedulingGates` (jobs.Job.pending): a gated pod is not starving, and
kube-scheduler would not place it on a drained node anyway.

How many tasks (`reserve_job`, the seed's "Reserve will succeed only if the job can reach ready or condition ready",
ConditionReady = ReadyTaskNum + ReservedNum >= MinAvailable): `minMember - bound`, no more: a gang of minMember 3 with
8 pending pods reserves 3 tasks' worth of nodes. They are taken in the job's task order (jobs.Job.pending: largest
request first, then name); a task that fits on no candidate is skipped for the next one, and if fewer than
`minMember - bound` can be reserved the job gets no lock at all.

Node choice, per task (`reserve_tasks`, `NodeChooser`; the seed's "Node selection strategy to participate in
reserve"): nodes where kube-scheduler could ever place it: the one predicate of shared.predicates (`schedulable_on`:
nodeSelector, required node affinity with matchFields, taints other than Reservoir's lock, `pods`) and allocatable >=
request plus what the job already reserved there ("Node reserve logic"); schedulable (not cordoned, Ready, not
control-plane), not taken in this plan and open to starvation by the displacement table (not held by another live
job); scored by
    (fits now first, already locked for this job first, time_to_fit ascending, idle_fraction descending, name)
where time_to_fit is 0 when idle covers the task now, else the wait until pods with a maximum runtime free enough
(capacity.time_to_fit), and idle_fraction is the seed's node score ((cpu + memory) / 2 + 2 * scalar) / 3.
"If the idle resource of the current node has met the scheduling condition of the task, resources will be
`allocated` to this task": a node whose idle covers every task reserved on it now is not locked (nothing to drain;
kube-scheduler places them), so a job whose tasks all fit somewhere unlocked now gets no lock, and a node still
draining for it is released when its task fits on another node now. A node already locked for the job that has
drained (the task fits there now) stays locked while the job needs it: releasing it would let the small pods back
in before the job's tasks are bound. (Nodes where an earlier job's tasks fit now are not held back from later jobs in
the same plan: kube-scheduler, not Reservoir, decides where a pod that fits goes.) Nor is a node locked for tasks
that lack there only what no pod of the cluster asks less of: no smaller pod takes their room, a lock would only
reorder pods as large as them (`Smaller`, a departure from the seed measured on bench-trace).

Budget ("The proportion of nodes participating in reserve action", `starvation_cap`): at most
max(1, floor(reservedNodePercent x schedulable nodes / 100)) nodes (when the percent is above 0), within what
maxLockedNodePercent (floor, at most 90) and the policies before starvation left. The floor alone made the shipped
20% lock nothing below 5 nodes; the minimum of one node keeps seed 000 working on small clusters, and the global cap
still keeps a one-node cluster unlocked. A job left without nodes is told which of these numbers stopped it
(`Budget.reason`).

Shapes weighed per plan (NodeChooser, namespace_shapes, Blockers): one plan ranks the nodes for at most
capacity.plan_rankings task shapes (200 on 5,000 nodes), each namespace with pending pods promised its own up to an
equal share (in turns when namespaces outnumber them), and decides higher-priority pods node by node for as many
shapes: a departure from the seed, which weighs every starving job, so that a tenant's pods of thousands of shapes
cannot make each plan walk every node thousands of times (docs/design/decisions.md). A job past it is weighed again
in a later plan; one holding locks keeps them unchanged.

No new lock is made while a higher-priority pending pod can be placed now (`higher_priority_blocker`, seed 000
"Reserve logic"; the planner asks `Blockers`, which decides only the pods of higher priority than the job), unless
kube-scheduler has reported that pod Unschedulable for longer than the job's threshold: a filter Reservoir does not
model keeps it off (a departure, `Blockers`).

maxLockDuration and the cool-down (`lock_cooldowns`): a job lock older than `maxLockDuration` is released; the job
then waits `lockCooldown` before it may lock any node again (in the plan its lock expires it also goes to the back
of the order and may not take the nodes it held, which is all that is left with a cool-down of 0). The planner is a
pure function of a snapshot, so the fact "job X's lock expired at T" is kept where tenants cannot write and where it
survives plans and agent restarts: on the released nodes themselves, in the `reservoir.sh/lock-expired` annotation
(keys.LOCK_EXPIRED; JSON {owner id: RFC 3339 time}), with an entry for each pod of the job not bound (`task_record`,
"pod:" and a hash of its "namespace/name", at most MAX_POD_RECORDS): a job with such a pod pending cools down too, so
renaming a job, or moving some of its pods to another (their group annotation), does not start it afresh (the pods'
entries on the first of its nodes only). The plan asks for it (`Plan.node_marks`) on every node the expired lock
held, and the writer writes it in the same node patch that releases the lock; every plan reads it back from all
nodes (nodes are admin-only objects) and asks for an entry to be removed once its cool-down has passed, so nothing
lingers. A hand-edited, unreadable annotation is read as no entry and rewritten.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, cast

from agent.planner.capacity import (
    FITS_NOW,
    FOREVER,
    NodeState,
    RankKey,
    Shape,
    ShapeRanking,
    idle_fraction,
    kept_ranking,
    plan_rankings,
    schedulable,
    shape,
    shape_id,
    time_to_fit,
    usable_ever,
)
from agent.planner.displacement import displaces
from agent.planner.jobs import Job
from agent.planner.model import MAX_LOCK_TASKS, JobStatus, Lock
from agent.planner.ordering import order_jobs
from agent.planner.policy import (
    Cooldowns,
    PlanContext,
    Policy,
    PolicyResult,
    Statuses,
    cap,
    earliest,
    kept_since,
)
from shared import keys
from shared.config import StarvationConfig
from shared.keys import LockKind
from shared.logs import quote
from shared.predicates import Placement, schedulable_on
from shared.resources import EMPTY, Resources
from shared.timestamps import in_range, parse_time, stamp
from shared.views import NodeView, PodView

NodeKey = tuple[timedelta, float, str]  # (time_to_fit, -idle_fraction, name): lower is better
Placeable = tuple[int, str, str]  # (priority, job owner, pod "namespace/name")
ZERO = timedelta(0)
NOW_FRONT: RankKey = (False, FITS_NOW, math.inf, "")  # a ShapeRanking's order up to this: the nodes that fit now
# softDrain (soft_drains): at most this many jobs are asked for their drain nodes in one plan (the largest first when
# more wait), so a flood of unschedulable pods costs a plan no more than this many node choices, and their shapes'
# rankings stay within what plans keep (capacity.MAX_RANKINGS)
DRAIN_JOBS_ASKED = 8
# softDrain: a job is marked once kube-scheduler has found it fitting nowhere for this long (soft_drain_window), so a
# pod created and deleted at once costs no node write
SOFT_DRAIN_AFTER = timedelta(seconds=5)


def placeable_now(jobs: Iterable[Job], states: Mapping[str, NodeState],
                  rankings: Mapping[str, ShapeRanking] | None = None) -> list[Placeable]:
    """Seed 000 "Reserve logic": pending pods kube-scheduler could bind right now (some schedulable node's idle
    covers them and the one predicate, shared.predicates.schedulable_on, lets them on, Reservoir's locks included),
    as (priority, owner, pod) highest priority first. Decided once per pod shape (shape_fits_now). The planner asks
    Blockers, which decides only the pods a job's question needs; this whole list is its oracle in the tests."""
    fits: dict[Shape, bool] = {}
    out = []
    for job in jobs:
        for pod in job.pending:
            if shape_fits_now(pod, states, rankings, fits):
                out.append((pod.priority, job.owner, pod.key))
    return sorted(out, key=lambda item: (-item[0], item[2]))


def shape_fits_now(pod: PodView, states: Mapping[str, NodeState], rankings: Mapping[str, ShapeRanking] | None,
                   fits: dict[Shape, bool]) -> bool:
    """Whether some node could take a pod of this one's shape now, kept in `fits` by shape: through the shape's
    ShapeRanking when `rankings` keeps one (issue 34), else node by node. Such a node is one of the ranking's nodes
    that fit now (its front: idle covers the pod, and usable_ever, which the one predicate with the lock and the pods
    counted implies), so only those are asked; when none fits, no node is."""
    key = shape(pod)
    answer = fits.get(key)
    if answer is None:
        named = shape_id(pod)
        kept = "now" + named
        ranking = rankings.get(named) if rankings else None
        if ranking is None:
            answer = any(fits_now(state, pod, kept) for state in states.values())
        else:
            ranking.sync(states, pod.requests, pod.placement)
            order = ranking.order
            answer = any(fits_now(states[order[i][3]], pod, kept) for i in range(bisect_right(order, NOW_FRONT)))
        fits[key] = answer
    return answer


def fits_now(state: NodeState, pod: PodView, kept: str) -> bool:
    """kube-scheduler could bind a pod of this shape on the node now: its idle covers it, the node is schedulable and
    the one predicate lets it on, Reservoir's locks included. Remembered by the node state under `kept` ("now" and
    the shape_id): it depends on nothing else."""
    return state.remembered(kept, lambda: state.idle.covers(pod.requests) and schedulable(state.node)
                            and schedulable_on(pod.placement, state.node, pods_on_node=len(state.pods)))


def higher_priority_blocker(job: Job, placeable: Sequence[Placeable]) -> str | None:
    """Seed 000 "Reserve logic": "If a job with a higher priority than the starving job can be scheduled successfully
    in this round, the starving job need to wait": a pending pod of another job, of higher priority, that can be
    placed now."""
    for priority, owner, pod in placeable:
        if priority <= job.priority:
            return None
        if owner != job.owner:
            return pod
    return None


class Blockers:
    """higher_priority_blocker(job, placeable_now(jobs, ...)) for each job that asks, deciding only the pods the
    answer needs: the pending pods of higher priority than the job, best first, until one of another job fits now.
    The whole placeable_now decided every pending pod's shape on every node each plan: on a cluster whose pending
    pods are all of one priority (the production trace: every pod's requests its own shape) that was most of a
    plan's time, to find pods no job's question could use. Same answers (tests/unit/test_ranking.py), the two
    bounds below aside.

    A shape no kept ranking answers is decided node by node: at most capacity.plan_rankings of them in one plan (as
    many as a plan ranks, NodeChooser), past which a pod is taken as not placeable now, so it blocks no job (a
    departure from seed 000: a tenant's flood of higher-priority pods of thousands of shapes would have each plan
    walk every node for each).

    Given `config` and `now`, a pod kube-scheduler has found no node for (PodScheduled False, Unschedulable) for
    longer than the asking job's starvation threshold blocks nothing, though Reservoir's predicate finds it a node
    now: what keeps it off is a filter Reservoir does not model (a PersistentVolumeClaim that does not exist, pod
    anti-affinity, a volume's zone), and the seed's rule ("can be scheduled successfully in this round") does not
    hold for it. Without this, one such pod of a tenant's, at a priority above the others', kept every lower-priority
    starving job of the cluster waiting at every plan (a departure from seed 000, said in docs/design/decisions.md).
    A pod that fits now is placed within kube-scheduler's backoff (10 s at most by default) once room frees; one
    Unschedulable that long while room is there is not waiting for room. What it costs (hostile review, not closed):
    a legitimate higher-priority pod Unschedulable that long because the cluster was full, whose room frees on the one
    node it fits, no longer holds back a lower-priority starving job in the plan that comes before kube-scheduler's
    retry, and that job may lock the very node (its NoSchedule taint then keeps the pod off it until the lock goes,
    while the pod's own job, starving too, locks a node of its own). The time is the condition's lastTransitionTime,
    which kube-scheduler keeps while the condition stays False: a pod held by a scheduling gate and then found
    Unschedulable counts from when it was gated. Counting from when the predicate first found it a node, carried
    from plan to plan, would close both; not done."""

    def __init__(self, jobs: Iterable[Job], states: Mapping[str, NodeState],
                 rankings: Mapping[str, ShapeRanking] | None = None, config: StarvationConfig | None = None,
                 now: datetime | None = None) -> None:
        self._jobs = jobs
        self._states = states
        self._rankings = rankings
        self._config = config
        self._now = now
        self._order: list[tuple[int, str, str, PodView]] | None = None
        self._fits: dict[Shape, bool] = {}
        self._scans_left = plan_rankings(len(states))  # shapes still to be decided node by node in this plan

    def blocker(self, job: Job) -> str | None:
        if self._order is None:
            self._order = sorted(((pod.priority, j.owner, pod.key, pod) for j in self._jobs for pod in j.pending),
                                 key=lambda item: (-item[0], item[2]))
        stale = (self._now - job_threshold(job, self._config)
                 if self._config is not None and self._now is not None else None)
        for priority, owner, key, pod in self._order:
            if priority <= job.priority:
                return None
            if stale is not None and pod.unschedulable_since is not None and pod.unschedulable_since < stale:
                continue  # kube-scheduler finds it no node, though the predicate does (class docstring)
            if owner != job.owner and self._fits_now(pod):
                return key
        return None

    def _fits_now(self, pod: PodView) -> bool:
        key = shape(pod)
        if key not in self._fits and not (self._rankings and shape_id(pod) in self._rankings):
            if self._scans_left <= 0:
                self._fits[key] = False  # past what one plan decides node by node (class docstring)
            self._scans_left -= 1
        return shape_fits_now(pod, self._states, self._rankings, self._fits)


class NodeChooser:
    """Picks the best node for a task without scanning every node per task.

    Tasks with the same shape (request and placement) rank the free nodes the same way, by
    (time_to_fit, -idle_fraction, name) with nothing yet reserved on them; so each shape gets its heaps once per plan
    (`_heaps`, from its ShapeRanking, kept across plans), and a node taken by a job (or partly reserved by the job
    being planned) is re-checked lazily when it reaches the top. Exactly the order a full scan would give; a plan
    re-ranks only the nodes whose state changed since the ranking last saw them (issue 34).
    `taken` is the caller's set of nodes locked in this plan so far (it grows as jobs get locks); `blocked` the
    nodes the displacement table keeps from starvation, with the job holding each.

    One plan ranks the nodes for at most capacity.plan_rankings task shapes (`limit`; a departure from seed 000,
    which weighs every starving job: anyone may create pods of thousands of shapes). Each namespace with pending
    tasks is promised as many as its tasks have shapes, up to an equal share of `limit` (`promised`, from
    namespace_shapes); a namespace goes past its promise only while the others' promises still fit, so a tenant's
    flood of shapes in its namespace leaves every other namespace its share, and a namespace of many shapes takes
    what the others do not need. A task of a shape past these is weighed on its job's own nodes only (those it holds
    locked or reserved in this plan, scored directly), so a job keeps its locks; no other node is chosen for it, its
    shape is named in `unranked`, and its job is told (reserve_job), keeps the locks it holds unchanged when that is
    what stops it, and is weighed again in a later plan, in its order.
    """

    def __init__(self, states: Mapping[str, NodeState], taken: Set[str], blocked: Mapping[str, str],
                 now: datetime, rankings: dict[str, ShapeRanking] | None = None, jobs: Iterable[Job] = ()) -> None:
        self.states = states
        self.taken = taken
        self.blocked = blocked  # node -> owner holding it (other jobs' live locks)
        self.now = now
        # shape_id -> its ShapeRanking, kept from plan to plan (PlanContext.rankings, Plan.rankings): updated in place
        self.rankings = rankings if rankings is not None else {}
        # per shape, this plan's two heaps: the nodes it fits on by now, by (-idle_fraction, name); the others, by
        # RankKey (a sorted list is a heap)
        self.heaps: dict[Shape, tuple[list[tuple[float, str]], list[RankKey]]] = {}
        self.ranked: dict[Shape, ShapeRanking] = {}  # per shape, the ranking its heaps came from
        self.limit = plan_rankings(len(states))  # task shapes this plan ranks the nodes for, at most
        # namespace -> the shapes the tasks of `jobs` are promised in this plan (class docstring)
        self.promised: Mapping[str, int] = namespace_shapes(jobs, self.limit, now)
        self.outstanding = sum(self.promised.values())  # promised shapes not ranked yet
        self.asked: dict[str, set[Shape]] = {}  # per namespace, the ranked shapes its tasks asked for in this plan
        self.unranked: set[Shape] = set()  # shapes asked for past `limit` or the promises

    @staticmethod
    def shape(task: PodView) -> Shape:
        return shape(task)

    def _usable(self, name: str, task: PodView, owner: str, placement: Placement) -> bool:
        """Seed 000 "Node reserve logic" and "PredicateNodes for task": the node can ever fit the task (allocatable),
        kube-scheduler's filters let it on (shared.predicates.schedulable_on on the task's `placement`, Reservoir's
        lock aside), it is schedulable, not taken and not another live job's."""
        return (name not in self.taken and self.blocked.get(name) in (None, owner)
                and usable_ever(self.states[name].node, task.requests, placement))

    def _key(self, name: str, task: PodView, reserved: Resources) -> NodeKey:
        """Seed 000 node score: (time_to_fit, -idle_fraction, name), lower first."""
        state = self.states[name]
        return (time_to_fit(state, task.requests, reserved, self.now), -idle_fraction(state), name)

    def ranks(self, task: PodView) -> bool:
        """Whether this plan ranks the nodes for the task's shape: already, or within `limit` and its namespace's
        promise, or past its promise while the other namespaces' still fit (class docstring; counted here, ranked by
        the caller)."""
        key = shape(task)
        namespace = task.namespace
        asked = self.asked.setdefault(namespace, set())
        if key in asked:
            return True
        promise = self.promised.get(namespace, 0)
        promised = len(asked) < promise
        if key not in self.heaps:
            others = self.outstanding - (promise - len(asked) if promised else 0)
            if len(self.heaps) >= self.limit or not (promised or len(self.heaps) + others < self.limit):
                self.unranked.add(key)
                return False
        asked.add(key)  # ranked for it, or by another namespace before: its promise is kept either way
        self.outstanding -= promised
        return True

    def unweighed(self, task: PodView) -> bool:
        """The task's shape was refused a ranking in this plan (`ranks`) and no other task got one for it."""
        key = shape(task)
        return key in self.unranked and key not in self.heaps

    def refusal(self, namespace: str) -> str:
        """Why a job of `namespace` was not weighed, in words (reserve_job)."""
        return (f"not weighed in this plan: a plan ranks the nodes for at most {self.limit} task shapes on "
                f"{len(self.states)} nodes (capacity.plan_rankings); it ranked {len(self.heaps)}, "
                f"{len(self.asked.get(namespace, ()))} of them for namespace {namespace}, which was promised "
                f"{self.promised.get(namespace, 0)} (the {len(self.promised)} namespaces with pods pending share them, "
                f"in turns when they outnumber them); weighed again in a later plan")

    def _heaps(self, task: PodView) -> tuple[list[tuple[float, str]], list[RankKey]]:
        """The shape's nodes in `_key` order with nothing reserved, as two heaps made at its first task in this plan
        from its ShapeRanking (issue 34: kept across plans, re-ranking only the nodes whose state changed): the
        nodes whose fit_at is not after `now` (time_to_fit 0), by (-idle_fraction, name), then the others in the
        ranking's order (time_to_fit is fit_at - now: the same order). Taken nodes and nodes another job holds are
        dropped when they reach the top (`choose`), as they would have been left out."""
        key = shape(task)
        heaps = self.heaps.get(key)
        if heaps is None:
            ranking = self.ranked[key] = kept_ranking(self.rankings, self.states, task, self.now)
            heaps = self.heaps[key] = ranking.split(self.now)
        return heaps

    def choose(self, task: PodView, owner: str, own: Set[str], reserved: Mapping[str, Resources],
               avoid: Set[str] = frozenset()) -> str | None:
        """Seed 000 node choice: the best node for `task` by (must drain, not locked for this job, time_to_fit,
        -idle, name): a node where it fits now first (one already locked for the job before another), then nodes
        already locked for this job, then the rest. Nodes this job reserved on in this plan are scored with what it
        reserved there; `avoid` is skipped."""
        best: tuple[tuple[bool, bool, timedelta, float, str], str] | None = None
        placement = task.placement
        ranking = self.ranks(task)
        now_heap, later = self._heaps(task) if ranking else ([], [])
        ranked = self.ranked[shape(task)].entries if ranking else {}
        for name in sorted((own | set(reserved)) - avoid):
            already = reserved.get(name)
            fit: NodeKey
            if already is None and ranking:  # nothing reserved there: the ranking has the answer (usable_ever, fit_at)
                rank = ranked[name][1]
                if rank is None or name in self.taken or self.blocked.get(name) not in (None, owner):
                    continue
                never, at, neg_idle, _ = rank
                fit = (FOREVER if never else max(at - self.now, ZERO), neg_idle, name)
            else:
                here = EMPTY if already is None else already
                if not self._usable(name, task, owner, placement) or not (here + task.requests).fits_in(
                        self.states[name].node.allocatable):
                    continue
                fit = self._key(name, task, here)
            key = (fit[0] > ZERO, name not in own, *fit)
            if best is None or key < best[0]:
                best = (key, name)
        candidate: tuple[tuple[bool, bool, timedelta, float, str], str] | None = None
        for heap, fits_by_now in ((cast(list[Any], now_heap), True), (cast(list[Any], later), False)):
            set_aside = []
            while heap:
                entry = heap[0]
                name = entry[-1]
                if name in self.taken or self.blocked.get(name) not in (None, owner):
                    heapq.heappop(heap)  # gone for good in this plan
                    continue
                if name in reserved or name in own or name in avoid:
                    set_aside.append(heapq.heappop(heap))  # scored above, or not for this job
                    continue
                if fits_by_now:
                    top: NodeKey = (ZERO, entry[0], name)
                else:
                    never, at, neg_idle, _ = entry
                    top = (FOREVER if never else at - self.now, neg_idle, name)
                candidate = ((top[0] > ZERO, True, *top), name)
                break
            for entry in set_aside:
                heapq.heappush(heap, entry)
            if candidate is not None:
                break
        options = [o for o in (best, candidate) if o is not None]
        return min(options)[1] if options else None


@dataclass(frozen=True)
class Reserved:
    """Seed 000 "Reserved" and "Allocated" for one job: node -> the tasks chosen there. `drain`: nodes that must
    drain for them (or are locked for the job already): the job's locks. `fit_now`: nodes whose idle covers every task
    chosen there now: kube-scheduler can place them, nothing is locked. `among_equals`: nodes where no pod is smaller
    than a task chosen there in what the task lacks (Smaller): nothing to lock against."""

    drain: dict[str, list[PodView]] = field(default_factory=dict)
    fit_now: dict[str, list[PodView]] = field(default_factory=dict)
    among_equals: dict[str, list[PodView]] = field(default_factory=dict)

    @property
    def tasks(self) -> int:
        return sum(len(t) for part in (self.drain, self.fit_now, self.among_equals) for t in part.values())


class Smaller:
    """Seed 000's starvation is a large task kept waiting by smaller pods: "some of the node resources are occupied
    by lower priority pods with relatively small resource requirements ... the task that apply for large resources
    can not be scheduled", each release taken by a small pod before enough is free for it. A lock keeps those smaller
    pods off the node. A task that lacks on its node only what no pod in the cluster asks less of (in each resource
    it lacks, every pod holding or waiting for resources asks at least as much) has no smaller pod to be kept from:
    the room freed for it goes to it or to a pod at least as large, as kube-scheduler's queue orders them, and a lock
    would only reorder equals while costing the node's other room to everyone (bench-trace measured it: one-GPU pods
    locking whole eight-GPU nodes raised the small classes' p95 wait by 17-20 s). Departure from the seed's letter
    (it locks for every starving job), said in the README.

    The pods counted are every pod holding resources (the node states) and every pod not bound (gated ones, other
    schedulers' and the task's own job's included: a job whose own pods are smaller than its task is locked for, as
    before): streams of small pods are placed as soon as room frees, so the running ones are the evidence that they
    come. A tenant's tiny pod brings the seed's locks back, no more. Only for a job that needs one task (`needed_tasks`
    1): the tasks of a gang wait for each other, and pods as large as one of them take the room one at a time, so a
    gang is locked for as before. `least` is computed at the first question in a plan (per node, once per node state:
    NodeState.least)."""

    def __init__(self, states: Mapping[str, NodeState], unbound: Iterable[PodView]) -> None:
        self.states = states
        self.unbound = unbound
        self._least: dict[str, int] | None = None

    @property
    def least(self) -> Mapping[str, int]:
        """Per resource, the least positive request of any pod counted (class docstring)."""
        if self._least is None:
            least: dict[str, int] = {}
            for state in self.states.values():
                for name, amount in state.least.items():
                    if amount < least.get(name, amount + 1):
                        least[name] = amount
            for pod in self.unbound:
                if pod.deleting:
                    continue
                for name, amount in pod.requests.items():
                    if 0 < amount < least.get(name, amount + 1):
                        least[name] = amount
            self._least = least
        return self._least

    def threatens(self, wanted: Resources, idle: Resources) -> bool:
        """Some pod asks for less than `wanted` (what is reserved on a node) of a resource it lacks on a node with
        `idle`: a lock protects it."""
        least = self.least
        return any(least.get(name, amount) < amount for name, amount in wanted.items()
                   if idle.get(name, 0) < amount)


def namespace_shapes(jobs: Iterable[Job], limit: int, now: datetime) -> dict[str, int]:
    """NodeChooser's promises: for each namespace with pending tasks, how many task shapes they have (`shape`), at
    most an equal share of `limit` (at least one). When more namespaces than `limit` have pending tasks, `limit` of
    them are promised one each, in turns: taken by a digest of their name and the minute of `now`, so each gets a
    turn within minutes whatever the job order (the others rank a shape only where the promises leave room)."""
    seen: dict[str, set[Shape]] = {}
    pending = [(job.ref.namespace, job.pending) for job in jobs]
    for namespace, tasks in pending:
        if tasks:
            seen.setdefault(namespace, set())
    if len(seen) > limit:
        minute = int(now.timestamp() // 60)
        turns = sorted(seen, key=lambda name: hashlib.blake2b(f"{minute}/{name}".encode(), digest_size=8).digest())
        return {namespace: int(k < limit) for k, namespace in enumerate(turns)}
    share = max(1, limit // max(len(seen), 1))
    for namespace, tasks in pending:
        shapes = seen.get(namespace)
        for task in tasks:
            if shapes is None or len(shapes) >= share:
                break
            shapes.add(shape(task))
    return {namespace: len(shapes) for namespace, shapes in seen.items()}


def reserve_tasks(job: Job, tasks: Sequence[PodView], chooser: NodeChooser, own: Set[str],
                  avoid: Set[str] = frozenset(), needed: int | None = None,
                  smaller: Smaller | None = None) -> Reserved | None:
    """Seed 000 "Reserved": `needed` tasks (all of `tasks` when None), in their order, each on the best node left by
    the chooser counting what the job reserved so far; a task that fits nowhere is skipped for the next. None when
    fewer than `needed` can be reserved. At most MAX_LOCK_TASKS tasks on one node: a lock names the tasks it reserved
    for in its node's lock-info annotation, which must stay well within the 256 KiB the API server allows a node's
    annotations (a job of a thousand tiny pods of the longest names on a node allowing that many pods would pass it,
    and a lock that can never be written is planned again at every plan, holding starvation's budget; departure
    from seed 000, which reserves as many as fit, said in docs/design/decisions.md). A node whose idle covers all its
    tasks now, and not locked for the job already, needs no lock (module docstring); nor, given `smaller`, a node
    where no pod asks for less of what the tasks reserved there lack (Smaller)."""
    wanted = len(tasks) if needed is None else needed
    reserved: dict[str, Resources] = {}
    placed: dict[str, list[PodView]] = {}
    count = 0
    skip = avoid
    for task in tasks:
        if count >= wanted:
            break
        name = chooser.choose(task, job.owner, own, reserved, skip)
        if name is None:
            continue
        reserved[name] = reserved.get(name, EMPTY) + task.requests
        here = placed.setdefault(name, [])
        here.append(task)
        count += 1
        if len(here) >= MAX_LOCK_TASKS:
            skip = skip | {name}  # the lock names its tasks: no more on this node (MAX_LOCK_TASKS)
    if count < wanted:
        return None
    out = Reserved()
    for name, chosen in placed.items():
        idle = chooser.states[name].idle
        if name in own:
            out.drain[name] = chosen
        elif idle.covers(reserved[name]):
            out.fit_now[name] = chosen
        elif smaller is not None and not smaller.threatens(reserved[name], idle):
            out.among_equals[name] = chosen
        else:
            out.drain[name] = chosen
    return out


def starvation_cap(percent: int, nodes: int) -> int:
    """Seed 000 `reservedNodePercent`: floor(percent x nodes / 100), but at least one node when the percent is above
    0 and there is a node (module docstring: the floor alone locks nothing below 5 nodes at the shipped 20%)."""
    if percent <= 0 or nodes <= 0:
        return 0
    return max(1, cap(percent, nodes))


@dataclass(frozen=True, kw_only=True)
class Budget:
    """Seed 000: how many nodes starvation may hold in this plan (`start`), and why that many, in words."""

    start: int
    reason: str  # why `start` is what it is (the numbers of the caps that set it)

    @classmethod
    def of(cls, context: PlanContext) -> Budget:
        """min(starvation_cap of reservedNodePercent, what maxLockedNodePercent and the earlier policies left)."""
        nodes = context.schedulable_nodes
        percent = context.config.starvation.reserved_node_percent
        overall_percent = context.config.max_locked_node_percent
        share, overall = starvation_cap(percent, nodes), cap(overall_percent, nodes)
        start = max(0, min(share, context.budget))
        of_nodes = f"of {nodes} schedulable node{'s' if nodes != 1 else ''}"
        if nodes == 0:
            return cls(start=0, reason="no schedulable node")
        if percent <= 0:
            return cls(start=0, reason="reservedNodePercent is 0")
        if overall == 0:
            return cls(start=0, reason=f"maxLockedNodePercent {overall_percent}% {of_nodes} rounds down to 0 nodes")
        floor = cap(percent, nodes)
        own = (f"reservedNodePercent {percent}% {of_nodes} is {share} node{'s' if share != 1 else ''}"
               + (" (rounds down to 0, at least 1)" if floor == 0 else ""))
        if start < share:
            left = (f"{context.budget} left" if context.budget > 0 else "none left")
            return cls(start=start, reason=f"{own}; maxLockedNodePercent {overall_percent}% {of_nodes} is {overall}, "
                                           f"{left} after reservations, queue guarantees and windows")
        return cls(start=start, reason=own)

    def spent(self) -> str:
        """Why a job gets no node: the budget was empty from the start, or jobs ahead of it took it."""
        if self.start <= 0:
            return f"no node for starvation: {self.reason}"
        return f"the {self.start} node{'s' if self.start != 1 else ''} starvation may lock are held by jobs ahead of " \
               f"it ({self.reason})"


def read_expiries(text: str) -> dict[str, datetime]:
    """A `reservoir.sh/lock-expired` annotation: job owner -> when its lock expired. Total: text that is not a JSON
    object, and entries whose time is not RFC 3339 with a zone between the years 1970 and 9000, are dropped."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    out: dict[str, datetime] = {}
    for owner, value in data.items() if isinstance(data, dict) else ():
        try:
            moment = parse_time(value) if isinstance(value, str) and len(value) <= 64 else None
        except ValueError:
            moment = None
        if in_range(moment):
            out[owner] = moment
    return out


def render_expiries(records: Mapping[str, datetime]) -> str | None:
    """The annotation's text for `records` (owners sorted, times to the second); None when there is none."""
    if not records:
        return None
    return json.dumps({owner: stamp(records[owner]) for owner in sorted(records)}, separators=(",", ":"))


# the cool-down record of a pod of a job whose lock expired: "pod:" and 16 hex digits of BLAKE2b of its
# "namespace/name". A job id a tenant can change (its pods' group annotation, labels, a new controller) names a new job
# with no record of its own, and as old as its pods, so starving at once; a record of the pods themselves keeps it
# cooling. No owner id starts so (keys.owner_id: "<kind>-..."), and an agent that knows no such record reads it as an
# owner no job has. Hashed, so an entry is 40 bytes however long the names; at most MAX_POD_RECORDS per expiry
TASK_RECORD = "pod:"
MAX_POD_RECORDS = 256


def task_record(task: str) -> str:
    return TASK_RECORD + hashlib.blake2b(task.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def pod_records(job: Job | None) -> list[str]:
    """The records of the job's pods not bound, not finished (pending, or gated: a tenant's own gate lifted later
    would let the pod starve at once under a new job), by key, at most MAX_POD_RECORDS."""
    if job is None:
        return []
    keys_ = sorted(p.key for p in job.pods if not p.node_name and not p.is_terminal)
    return [task_record(key) for key in keys_[:MAX_POD_RECORDS]]


def cooling_until(job: Job, cooling: Mapping[str, datetime]) -> datetime | None:
    """When the job's cool-down ends: the latest of its own record's and its pending pods' (task_record), None when
    it has none."""
    ends = [until for key in (job.owner, *(task_record(p.key) for p in job.pending))
            if (until := cooling.get(key)) is not None]
    return max(ends) if ends else None


def job_locks_by_owner(current: Mapping[str, Lock]) -> dict[str, list[Lock]]:
    """Seed 000: job owner -> its job locks now."""
    held_by: dict[str, list[Lock]] = {}
    for lock in current.values():
        if lock.kind is LockKind.JOB:
            held_by.setdefault(lock.owner, []).append(lock)
    return held_by


def lock_cooldowns(*, nodes: Mapping[str, NodeView], current: Mapping[str, Lock], config: StarvationConfig,
                   now: datetime, jobs: Sequence[Job] = ()) -> Cooldowns:
    """Seed 000 maxLockDuration and its cool-down, read from and written to the nodes (module docstring): every
    node's `reservoir.sh/lock-expired` entries, plus one (`now`) on each node of a job lock that expires in this plan
    (release_expired); entries whose `lockCooldown` has passed are dropped; a job with an entry left may not lock
    until the latest one's cool-down ends. `marks` asks for each node whose annotation must change."""
    cooldown = config.lock_cooldown
    records: dict[str, dict[str, datetime]] = {}
    for name, node in nodes.items():
        text = node.annotations.get(keys.LOCK_EXPIRED)
        if text is not None:
            records[name] = read_expiries(text)
    held_by = job_locks_by_owner(current)
    expired = release_expired(held_by, now=now, max_lock_duration=config.max_lock_duration)
    moment = now.replace(microsecond=0)
    by_owner = {job.owner: job for job in jobs if job.owner in expired}
    for owner in sorted(expired):
        # the pods' records on the first of its nodes (every node's records are read), the owner's on each
        pods = pod_records(by_owner.get(owner))
        for lock in sorted(held_by[owner], key=lambda lock: lock.node):
            if lock.node not in nodes:
                continue
            on_node = records.setdefault(lock.node, {})
            for key in (owner, *pods):
                if key not in on_node or now >= on_node[key] + cooldown:
                    on_node[key] = moment
            pods = []
    until: dict[str, datetime] = {}
    marks: dict[str, Mapping[str, str | None]] = {}
    for name, on_node in records.items():
        cooling = {owner: at for owner, at in on_node.items() if now < at + cooldown}
        for owner, at in cooling.items():
            until[owner] = max(until.get(owner, at + cooldown), at + cooldown)
        text = render_expiries(cooling)
        if text != nodes[name].annotations.get(keys.LOCK_EXPIRED):
            marks[name] = {keys.LOCK_EXPIRED: text}
    return Cooldowns(until=until, expired=expired, marks=marks)


@dataclass(frozen=True, kw_only=True)
class Starvation:
    """Seed 000: what every job's turn reads in one plan."""

    config: StarvationConfig
    now: datetime
    states: Mapping[str, NodeState]
    current: Mapping[str, Lock]
    held_by: Mapping[str, Sequence[Lock]]  # job owner -> its job locks now
    expired: frozenset[str]  # job owners whose locks outlived maxLockDuration (release_expired)
    cooling: Mapping[str, datetime]  # job owner -> when its cool-down ends (lock_cooldowns)
    blockers: Blockers  # seed 000's higher-priority pods placeable now, asked per job
    chooser: NodeChooser
    budget: Budget
    smaller: Smaller  # the least requests of the cluster's pods: who a lock would protect a task from


@dataclass(frozen=True, kw_only=True)
class JobTurn:
    """Seed 000: one job's outcome in this plan."""

    status: JobStatus
    locks: Mapping[str, Lock] = field(default_factory=dict)
    note: str | None = None
    # nodes the job waits on unlocked (Reserved.among_equals): taken from later jobs in this plan like a lock, so a
    # lower-priority job cannot lock the node a higher one waits for; no lock, nothing off the budget, but no more
    # such nodes in a plan than the budget's start (many equal pods keep from later jobs what their locks would have)
    spared: frozenset[str] = frozenset()


def plan_starvation(*, context: PlanContext) -> PolicyResult:
    """Seed 000: starvation locks for the jobs in QueueScoreOrder (seed 001, ordering.order_jobs), expired ones at
    the back, on nodes not taken, at most min(what the other policies left, starvation_cap of `reservedNodePercent`)
    new-or-kept nodes (Budget)."""
    config = context.config.starvation
    if not config.enabled:
        return PolicyResult()
    jobs = order_jobs(context.jobs, context.scores, context.config.queue_order.ordering)
    taken = set(context.taken)  # grows as jobs get locks; the chooser reads it
    starvation = starvation_round(jobs, context=context, taken=taken)
    budget = starvation.budget.start
    locks: dict[str, Lock] = {}
    statuses: list[JobStatus] = []
    notes: list[str] = []
    spare = starvation.budget.start  # nodes kept from later jobs unlocked (JobTurn.spared): no more than locks could
    for job in back_of_the_order(jobs, expired=starvation.expired):
        turn = job_turn(job, starvation=starvation, taken=taken, budget=budget)
        locks.update(turn.locks)
        taken.update(turn.locks)
        if spare > 0 and turn.spared:
            taken.update(turn.spared)
            spare -= len(turn.spared)
        budget -= len(turn.locks)
        statuses.append(turn.status)
        notes += [turn.note] if turn.note else []
    drains, drain_notes = soft_drains(back_of_the_order(jobs, expired=starvation.expired), starvation=starvation,
                                      taken=taken, locked=locks, budget=starvation.budget.start - len(locks))
    if drains:
        steered: dict[str, list[str]] = {}
        for node, owner in sorted(drains.items()):
            steered.setdefault(owner, []).append(node)
        statuses = [replace(s, reason=f"{s.reason}; other pods steered off {', '.join(steered[s.owner])} (softDrain)")
                    if s.owner in steered else s for s in statuses]
    return PolicyResult(locks=locks, statuses=Statuses(jobs=tuple(statuses)), notes=tuple(notes + drain_notes),
                        wake_at=starvation_wake_at(jobs, context=context), drains=drains)


def soft_drain_since(job: Job) -> datetime | None:
    """When kube-scheduler first found one of the job's pending tasks fitting nowhere (PodView.unschedulable_since,
    the earliest), None when it has not."""
    return min((p.unschedulable_since for p in job.pending if p.unschedulable_since is not None), default=None)


def soft_drain_window(job: Job, config: StarvationConfig) -> tuple[datetime, datetime] | None:
    """softDrain's window for a job kube-scheduler found fitting nowhere: from SOFT_DRAIN_AFTER after that (a pod
    created and deleted at once marks nothing) until its threshold plus maxLockDuration after its creation (a job
    waiting that long gets no mark, as its lock would have expired); None before kube-scheduler said so."""
    since = soft_drain_since(job)
    if since is None:
        return None
    return since + SOFT_DRAIN_AFTER, job.created + job_threshold(job, config) + config.max_lock_duration


def largest_first(jobs: Sequence[Job], states: Mapping[str, NodeState],
                  marked: Set[str]) -> list[tuple[Job, float]]:
    """softDrain's order: jobs whose tasks all fit within the largest node's allocatable of each resource (a task asking
    more can never fit: left out), each with the largest share one of its pending tasks asks of a resource against
    that; those already marked (`marked` owners) first, then by priority, then the largest share first (seed 000's
    starvation is a large task kept waiting by smaller ones), then in their order."""
    most: dict[str, int] = {}
    for state in states.values():
        if schedulable(state.node):
            for name, amount in state.node.allocatable.items():
                if amount > most.get(name, 0):
                    most[name] = amount

    def share(job: Job) -> float:
        return max((amount / most[name] if most.get(name) else math.inf for task in job.pending
                    for name, amount in task.requests.items() if amount > 0), default=0.0)
    shared = [(job, share(job)) for job in jobs]
    return sorted([(job, size) for job, size in shared if size <= 1.0],
                  key=lambda pair: (pair[0].owner not in marked, -pair[0].priority, -pair[1]))


def soft_drains(jobs: Sequence[Job], *, starvation: Starvation, taken: set[str], locked: Mapping[str, Lock],
                budget: int) -> tuple[dict[str, str], list[str]]:
    """`softDrain` (a departure from seed 000, which only locks, once the threshold has passed): for each job without a
    lock in this plan, not ready, not cooling down, in its soft_drain_window (kube-scheduler found one of its pending
    tasks fitting nowhere at least SOFT_DRAIN_AFTER ago), the nodes its tasks would drain on (reserve_tasks, the lock's
    own node choice and Smaller rule: only nodes that must drain and where smaller pods could take the room; the nodes
    it marked before kept first, as its locks would be), marked with the `PreferNoSchedule` taint keys.DRAIN. Other
    pods that fit elsewhere then go elsewhere (kube-scheduler's TaintToleration score) and the node drains before the
    job starves; no pod is kept off it. At most `budget` nodes (what the starvation budget leaves after this plan's
    locks), none taken by a lock; the jobs in largest_first's order (those marked already first: no churn; a soft
    mark refuses no pod, so the queue order does not decide who gets one), at most DRAIN_JOBS_ASKED of them asked per
    plan (a job whose gang needs more nodes than are left is not asked). node -> owner, and a note per job marked."""
    drains: dict[str, str] = {}
    notes: list[str] = []
    if not starvation.config.soft_drain or budget <= 0:
        return drains, notes
    now = starvation.now
    locking = {lock.owner for lock in locked.values()}
    candidates = []
    for job in jobs:
        if job.ready or needed_tasks(job) <= 0 or job.owner in locking or job.owner in starvation.expired \
                or cooling_until(job, starvation.cooling) is not None:
            continue
        window = soft_drain_window(job, starvation.config)
        if window is not None and window[0] <= now < window[1]:
            candidates.append(job)
    if not candidates:
        return drains, notes
    marked: dict[str, set[str]] = {}
    for name, state in starvation.states.items():
        if state.node.taints and (owner := state.node.drain_owner):
            marked.setdefault(owner, set()).add(name)
    asked = 0
    for job, _ in largest_first(candidates, starvation.states, marked.keys()):
        if budget <= 0 or asked >= DRAIN_JOBS_ASKED:
            break
        needed = needed_tasks(job)
        if needed > budget:
            continue
        asked += 1
        own = {n for n in marked.get(job.owner, ()) if n not in taken}
        placed = reserve_tasks(job, job.pending, starvation.chooser, own, frozenset(), needed,
                               starvation.smaller if needed == 1 else None)
        if placed is None or not placed.drain or len(placed.drain) > budget:
            continue
        for name in placed.drain:
            drains[name] = job.owner
        taken.update(placed.drain)
        budget -= len(placed.drain)
        notes.append(f"job={quote(job.subject)} decision=soft-drain nodes={','.join(sorted(placed.drain))} "
                     f"reason=fits on no node now; pods that fit elsewhere are steered off where it fits soonest "
                     f"(taint {keys.DRAIN}:{keys.DRAIN_EFFECT})")
    return drains, notes


def starvation_wake_at(jobs: Sequence[Job], *, context: PlanContext) -> datetime | None:
    """The next moment time alone changes seed 000's answer: a job with pending tasks crossing
    `starvingJobTimeThreshold` (is_starving), a job lock reaching `maxLockDuration` (release_expired), a cool-down
    ending (lock_cooldowns), a job's soft_drain_window opening or closing. Without it a job would wait for the next
    resync after its threshold."""
    config = context.config.starvation
    now = context.now
    crossings = (job.created + job_threshold(job, config) for job in jobs if job.pending)
    expiries = (lock.since + config.max_lock_duration for lock in context.current.values() if lock.kind is LockKind.JOB)
    windows = (edge for job in jobs if config.soft_drain and job.pending
               and (window := soft_drain_window(job, config)) is not None for edge in window)
    return earliest(*(moment for moment in (*crossings, *expiries, *context.cooldowns.until.values(), *windows)
                      if moment > now))


def starvation_round(jobs: Sequence[Job], *, context: PlanContext, taken: Set[str]) -> Starvation:
    """Seed 000: what the jobs' turns share: the job locks now, which of them expired and which jobs are cooling down
    (lock_cooldowns, computed once per plan: PlanContext.cooldowns), which nodes the displacement table keeps from
    starvation (another live job's lock, not expired, not cooling down), the pods placeable now and the budget."""
    config = context.config.starvation
    held_by = job_locks_by_owner(context.current)
    cooldowns = context.cooldowns  # lock_cooldowns, once per plan (plan.plan_context)
    # a job lock still claims its node while its job is live: not ready, with a task pending, not expired, not cooling
    claiming = frozenset(job.owner for job in jobs if not job.ready and job.pending
                         and cooling_until(job, cooldowns.until) is None) - cooldowns.expired
    blocked = {node: lock.owner for node, lock in context.current.items()
               if not displaces(LockKind.JOB, lock, live_jobs=claiming)}
    return Starvation(config=config, now=context.now, states=context.states, current=context.current,
                      held_by=held_by, expired=cooldowns.expired, cooling=cooldowns.until,
                      blockers=Blockers(jobs, context.states, context.rankings, config, context.now),
                      chooser=NodeChooser(context.states, taken, blocked, context.now, context.rankings, jobs),
                      budget=Budget.of(context),
                      smaller=Smaller(context.states, context.snapshot.index.unbound.values()))


def release_expired(held_by: Mapping[str, Sequence[Lock]], *, now: datetime,
                    max_lock_duration: timedelta) -> frozenset[str]:
    """Seed 000 (DESIGN 4.1 "Release when ... the lock is older than `maxLockDuration`"): the job owners one of whose
    locks is that old. Their locks are released, and they wait `lockCooldown` before locking again
    (lock_cooldowns); in this plan the job also goes to the back of the order and not onto the nodes it held."""
    return frozenset(owner for owner, locks in held_by.items()
                     if any(now - lock.since >= max_lock_duration for lock in locks))


def back_of_the_order(jobs: Sequence[Job], *, expired: Set[str]) -> list[Job]:
    """Seed 000 (DESIGN 4.1): the jobs in their order, those whose locks expired moved to the back (in their
    order)."""
    return [j for j in jobs if j.owner not in expired] + [j for j in jobs if j.owner in expired]


def job_threshold(job: Job, config: StarvationConfig) -> timedelta:
    """The job's starvation threshold: starvingJobTimeThreshold, or the job's own when lower (a Kueue Workload's under
    waitForPodsReady, issue 32)."""
    threshold = config.starving_job_time_threshold
    return threshold if job.threshold is None else min(threshold, job.threshold)


def is_starving(job: Job, *, now: datetime, threshold: timedelta) -> bool:
    """Seed 000 isJobStarving's time test: "The creation time of job is greater than the set starving job threshold
    time", now - created > `starvingJobTimeThreshold`. (Its other tests: not Job Ready is `job.ready`, checked first
    by job_turn; not Job Condition Ready is having no kept lock, checked beside this one.)"""
    return now - job.created > threshold


def job_status(job: Job, *, starving: bool, reason: str) -> JobStatus:
    """Seed 000: the job as judged, for `reservoir status` and the starving-jobs metric."""
    return JobStatus(subject=job.subject, owner=job.owner, queue=job.queue, priority=job.priority,
                     min_member=job.min_member, bound=job.bound, pending=len(job.pending), starving=starving,
                     reason=reason, created=job.created, threshold=job.threshold)


def needed_tasks(job: Job) -> int:
    """Seed 000 ConditionReady (ReadyTaskNum + ReservedNum >= MinAvailable): the tasks to reserve, minMember - bound."""
    return max(job.min_member - job.bound, 0)


def job_turn(job: Job, *, starvation: Starvation, taken: Set[str], budget: int) -> JobTurn:
    """Seed 000 for one job: nothing for a ready job or one with nothing pending (gated pods are not pending), nor
    while it cools down after its lock expired, nor past the budget (unless it holds locks); a job with kept locks
    (Job Condition Ready) re-reserves on them; a starving one reserves unless a higher-priority pod can be placed
    now; any other waits for the threshold."""
    if job.ready or not job.pending:
        return JobTurn(status=job_status(job, starving=False, reason="ready" if job.ready else "nothing pending"))
    threshold = job_threshold(job, starvation.config)
    starving = is_starving(job, now=starvation.now, threshold=threshold)
    until = cooling_until(job, starvation.cooling)
    if until is not None:
        why = (f"its lock outlived maxLockDuration {int(starvation.config.max_lock_duration.total_seconds())}s; "
               f"cooling down until {stamp(until)} (lockCooldown "
               f"{int(starvation.config.lock_cooldown.total_seconds())}s)")
        return JobTurn(status=job_status(job, starving=starving, reason=why),
                       note=f"job={quote(job.subject)} decision=cool-down reason={why}")
    if budget <= 0 and job.owner not in starvation.held_by:
        why = starvation.budget.spent()
        # logged when the caps leave starvation nothing at all (a small cluster), not for every job a full budget skips
        note = (f"job={quote(job.subject)} decision=no-lock reason={why}" if starving and starvation.budget.start <= 0
                else None)
        return JobTurn(status=job_status(job, starving=starving, reason=why), note=note)
    expired = job.owner in starvation.expired
    kept = [] if expired else [lock for lock in starvation.held_by.get(job.owner, ())
                               if lock.node in starvation.states and lock.node not in taken]
    if not kept and not starving:
        age = int((starvation.now - job.created).total_seconds())
        return JobTurn(status=job_status(job, starving=False, reason=f"waiting {age}s of "
                                         f"{int(threshold.total_seconds())}s threshold"))
    if not kept:
        blocker = starvation.blockers.blocker(job)
        if blocker is not None:
            why = f"higher-priority pod {blocker} can be placed now"
            return JobTurn(status=job_status(job, starving=True, reason="waiting for a higher-priority job"),
                           note=f"job={quote(job.subject)} decision=wait reason={why}")
    return reserve_job(job, kept=kept, starvation=starvation, budget=budget)


def reserve_job(job: Job, *, kept: Sequence[Lock], starvation: Starvation, budget: int) -> JobTurn:
    """Seed 000 "Reserve will succeed only if the job can reach ready or condition ready": minMember - bound tasks
    reserved (reserve_tasks), locking only the nodes that must drain for them, at most `budget` nodes counting the
    kept ones; else no lock at all."""
    own = {lock.node for lock in kept}
    # a job whose lock expired goes to the back, and not onto the nodes it held too long
    avoid = {lock.node for lock in starvation.held_by.get(job.owner, ())} if job.owner in starvation.expired else set()
    needed = needed_tasks(job)
    placed = reserve_tasks(job, job.pending, starvation.chooser, own, avoid, needed,
                           starvation.smaller if needed == 1 else None)
    chooser = starvation.chooser
    unweighed = chooser.unranked and any(chooser.unweighed(t) for t in job.pending)
    if placed is None and unweighed and kept and len(kept) <= budget:
        # past the plan's shapes (NodeChooser): the job keeps what it holds, weighed again in a later plan
        why = f"kept its {len(kept)} locks unchanged: {chooser.refusal(job.ref.namespace)}"
        return JobTurn(status=job_status(job, starving=True, reason=why), locks={lock.node: lock for lock in kept},
                       note=f"job={quote(job.subject)} decision=keep reason={why}")
    if placed is None or len(placed.drain) > budget:
        if placed is not None:
            start = starvation.budget.start
            why = (f"needs {len(placed.drain)} nodes, {max(budget, 0)} of the {start} starvation may lock are left, "
                   f"the rest held by jobs ahead of it ({starvation.budget.reason})" if budget < start else
                   f"needs {len(placed.drain)} nodes, starvation may lock {budget}: {starvation.budget.reason}")
        elif unweighed:
            why = chooser.refusal(job.ref.namespace)
        elif len(job.pending) < needed:
            why = (f"needs {needed} more tasks bound to reach minMember {job.min_member}, only {len(job.pending)} "
                   f"pending (pods held by schedulingGates do not count)")
        else:
            why = (f"fewer than the {needed} tasks it needs fit on any node (allocatable too small, kube-scheduler's "
                   f"filters refuse the rest, or every candidate held)")
        return JobTurn(status=job_status(job, starving=True, reason=f"cannot reserve: {why}"),
                       note=f"job={quote(job.subject)} decision=no-lock reason={why}")
    fitting = sum(len(t) for t in placed.fit_now.values())
    equals = sum(len(t) for t in placed.among_equals.values())
    if not placed.drain:
        if not equals:
            why = (f"the {fitting} tasks it needs fit now on unlocked nodes: kube-scheduler can place them, nothing to "
                   "lock")
        else:
            why = (f"{equals} of the tasks it needs wait for room no smaller pod asks for: a lock would only "
                   f"reorder pods as large as them, kube-scheduler's queue decides"
                   + (f"; {fitting} more fit now" if fitting else ""))
        return JobTurn(status=job_status(job, starving=True, reason=why),
                       note=f"job={quote(job.subject)} decision=no-lock reason={why}",
                       spared=frozenset(placed.among_equals))
    new = sum(1 for n in placed.drain if n not in own)
    also = (f"; {fitting} more fit now elsewhere" if fitting else "") + (
        f"; {equals} more wait among pods as large as them, unlocked" if equals else "")
    return JobTurn(status=job_status(job, starving=True, reason=f"reserved on {len(placed.drain)} nodes ({new} new, "
                                                                f"{len(placed.drain) - new} kept){also}"),
                   locks=job_locks(job, placed=placed.drain, needed=needed, starvation=starvation))


def job_locks(job: Job, *, placed: Mapping[str, Sequence[PodView]], needed: int,
              starvation: Starvation) -> dict[str, Lock]:
    """Seed 000 "Data Model": a node's `Reserved` is "the sum of the resource requirement of all the tasks reserved
    on the node"; the lock names those tasks and expires `maxLockDuration` after it was first taken."""
    config, now = starvation.config, starvation.now
    locks = {}
    for node, tasks in placed.items():
        # no ages or clocks in the reason: it is written to the node, and must not change while nothing does
        reason = (f"starving job: {job.bound}/{job.min_member} bound, older than "
                  f"{int(job_threshold(job, config).total_seconds())}s; reserves {len(tasks)} of the "
                  f"{needed} tasks it needs ({len(job.pending)} pending)")
        since = kept_since(starvation.current, node=node, owner=job.owner, now=now)
        locks[node] = Lock(node=node, owner=job.owner, kind=LockKind.JOB, subject=job.subject, reason=reason,
                           since=since, expires=since + config.max_lock_duration,
                           reserved=Resources.total(t.requests for t in tasks),
                           tasks=tuple(sorted(t.key for t in tasks)))
    return locks


STARVATION = Policy(name="starvation", kind=LockKind.JOB, seed="000", run=plan_starvation)
