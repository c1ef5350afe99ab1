"""Node capacity over time: what is idle now, how soon a request fits, what will be idle at a future moment.

A pod holds its request on its node from binding until it finishes. A running pod with
`volcano.sh/maximum-runtime` is expected to free it at `startTime + maximum-runtime`; a pod without one is
assumed to run forever (seed 004).

A running pod's end, for every policy that reads it (release curves, needed-by times, window demand: `pod_end`), is
the earliest of three bounds (DESIGN 4.8):
- its start plus its declared maximum runtime (seed 004);
- its start plus `activeDeadlineSeconds` plus its termination grace (the kubelet ends it then);
- its backfill grant's `until` (the agent's own promise, on the node).
Only the last two are bounds a tenant cannot stretch: Kubernetes lets a deadline only go down, and the grant is
written by the agent. The annotation is the tenant's to rewrite at any time, so a runtime raised after a grant never
moves a bound later than the deadline or the grant already put it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import weakref
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.planner.podindex import PodIndex, as_index
from shared.backfill import Grant
from shared.predicates import Placement, schedulable_on
from shared.resources import EMPTY, Resources
from shared.views import NodeView, PodView

FOREVER = timedelta.max
NO_GRANTS: Mapping[str, Grant] = {}  # a node without backfill grants
# a deadline (with its grace) further out than this bounds nothing a plan looks at, and an int64 of seconds would
# overflow a datetime: such a pod's end is left to its other bounds
MAX_DEADLINE_SECONDS = 100 * 365 * 24 * 3600


@dataclass
class NodeState:
    node: NodeView
    pods: list[PodView] = field(default_factory=list)  # pods holding resources on the node
    used: Resources = EMPTY
    _idle: Resources | None = None
    _releases: Releases | None = None
    _idle_fraction: float | None = None
    # the index's tuple `pods` was made from (node_states): the same tuple at the next plan means the same pods
    source: tuple[PodView, ...] | None = field(default=None, repr=False, compare=False)
    # issue 34: per task shape, answers that depend on this state alone (starvation.fits_now, backfill.fits_idle),
    # by a shape_id with a prefix per question. A state is reused by the next plan while its node and pods are the
    # same, and these with it; at most MAX_SHAPES_KEPT
    ranks: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)
    _least: dict[str, int] | None = field(default=None, repr=False, compare=False)

    @property
    def idle(self) -> Resources:
        if self._idle is None:
            self._idle = (self.node.allocatable - self.used).clamp_negative()
        return self._idle

    @property
    def least(self) -> Mapping[str, int]:
        """Per resource, the least positive request among the node's pods (starvation.Smaller), once per state
        (node_states finds it while it sums `used`)."""
        if self._least is None:
            self._least = used_and_least(self.pods)[1]
        return self._least

    def remembered(self, key: str, compute: Callable[[], bool]) -> bool:
        """The answer kept under `key`, else `compute()`, kept while this state lives: at most MAX_SHAPES_KEPT, the
        one kept longest going to make room (shapes come and go; a tenant's many shapes cannot keep the others out
        for the state's life)."""
        answer = self.ranks.get(key)
        if answer is None:
            if len(self.ranks) >= MAX_SHAPES_KEPT:
                del self.ranks[next(iter(self.ranks))]
            answer = self.ranks[key] = compute()
        return answer

    @property
    def releases(self) -> Releases:
        """When the node's pods with a maximum runtime end, and what they free by then; computed once per plan."""
        if self._releases is None:
            self._releases = Releases.of(self.pods, self.node.backfill_grants)
        return self._releases


@dataclass(frozen=True)
class Releases:
    """Seed 000 node choice by how soon a node fits, from seed 004's maximum runtimes: the release curve of one
    node: `ends[i]` is the i-th earliest end of a pod with a maximum runtime, and `freed[name][i]` the amount of
    `name` freed by all pods ended by then (cumulative, so non-decreasing)."""

    ends: list[datetime]
    freed: dict[str, list[int]]

    @classmethod
    def of(cls, pods: Sequence[PodView], grants: Mapping[str, Grant] = NO_GRANTS) -> Releases:
        ending = sorted((end, pod.namespace, pod.name, index) for index, pod in enumerate(pods)
                        if (end := pod_end(pod, grants)) is not None)
        names = {name for *_, index in ending for name in pods[index].requests}
        freed: dict[str, list[int]] = {name: [] for name in names}
        totals = dict.fromkeys(names, 0)
        for *_, index in ending:
            requests = pods[index].requests
            for name in names:
                totals[name] += requests.get(name, 0)
                freed[name].append(totals[name])
        return cls([end for end, *_ in ending], freed)

    def first_covering(self, need: Mapping[str, int]) -> int | None:
        """The least i with freed[name][i] >= need[name] for every name, or None when even all of them fall short.
        Each dimension's curve is non-decreasing, so it is the largest per-dimension first index (bisection)."""
        index = 0
        for name, amount in need.items():
            curve = self.freed.get(name)
            if not curve or curve[-1] < amount:
                return None
            index = max(index, bisect_left(curve, amount))
        return index


class NodeStates(dict[str, NodeState]):
    """node_states' answer: node -> NodeState, and what changed since the states it was made from (issue 34), so what
    is kept per node across plans (ShapeRanking) is brought up to date from the changes alone. `generation` names
    this mapping; `base` the generation of the `previous` states it reused (None without them); `changed` the nodes
    whose state is not the very one `base` had, and the nodes `base` had that are gone."""

    __slots__ = ("generation", "base", "changed")

    def __init__(self, base: int | None = None) -> None:
        super().__init__()
        self.generation = next(_GENERATIONS)
        self.base = base
        self.changed: set[str] = set()


_GENERATIONS = itertools.count(1)


def node_states(nodes: Mapping[str, NodeView], pods: PodIndex | Iterable[PodView],
                previous: Mapping[str, NodeState] | None = None,
                replaced: Mapping[str, PodView] | None = None) -> NodeStates:
    """Each node with the pods holding resources on it (podindex.PodIndex.on_node; `pods` an index, or the pods to
    index), each replaced by its view in `replaced` (pod key -> view: reserve.with_group_runtimes). A state from
    `previous` (the last plan's) is reused when its node view and its pods are the very same objects (views are
    immutable, the watch caches keep a view until its object changes, and an index update keeps the tuple of a node it
    did not touch): only nodes touched since the last plan are summed again, and NodeStates.changed names them."""
    index = as_index(pods)
    swapped: set[str] = {view.node_name for view in replaced.values()} if replaced else set()
    states = NodeStates(previous.generation if isinstance(previous, NodeStates) else None)
    changed = states.changed
    still = 0  # nodes of `previous` still here
    for name, node in nodes.items():
        mine = index.on_node.get(name, ())
        if name in swapped:
            assert replaced is not None
            mine = tuple(replaced.get(pod.key, pod) for pod in mine)
        old = previous.get(name) if previous else None
        still += old is not None
        if old is not None and old.node is node and (old.source is mine or (
                len(old.pods) == len(mine) and all(a is b for a, b in zip(old.pods, mine, strict=True)))):
            states[name] = old
            continue
        state = states[name] = NodeState(node, list(mine), source=mine)
        changed.add(name)
        if mine:
            state.used, state._least = used_and_least(mine)
    if previous and still < len(previous):  # nodes gone
        changed.update(name for name in previous if name not in states)
    return states


def used_and_least(pods: Iterable[PodView]) -> tuple[Resources, dict[str, int]]:
    """The sum of the pods' requests, and per resource the least positive request among them, in one pass."""
    sums: dict[str, int] = {}
    least: dict[str, int] = {}
    for pod in pods:
        for name, amount in pod.requests.items():
            sums[name] = sums.get(name, 0) + amount
            if 0 < amount < least.get(name, amount + 1):
                least[name] = amount
    return Resources(sums), least


def pod_end(pod: PodView, grants: Mapping[str, Grant] = NO_GRANTS) -> datetime | None:
    """When a running pod is expected to free its resources (module docstring, "a running pod's end"): the earliest
    of start + seed 004's `volcano.sh/maximum-runtime` ("the pod will run for a maximum of 500 seconds"), start +
    activeDeadlineSeconds + termination grace, and its grant's until in `grants` (its node's, by pod uid); start is
    startTime, else creation. None when none of the three says: it may run forever."""
    start = pod.started or pod.created
    end: datetime | None = None
    if pod.maximum_runtime is not None:
        end = start + pod.maximum_runtime
    if pod.active_deadline is not None and 0 < pod.active_deadline + pod.termination_grace <= MAX_DEADLINE_SECONDS:
        deadline = start + timedelta(seconds=pod.active_deadline + pod.termination_grace)
        end = deadline if end is None else min(end, deadline)
    grant = grants.get(pod.uid) if grants else None
    if grant is not None:
        end = grant.until if end is None else min(end, grant.until)
    return end


# (requests, Placement.key) of a task: tasks alike in both rank the nodes alike
Shape = tuple[Resources, tuple[Any, ...]]


def shape(task: PodView) -> Shape:
    """Seed 000 "PredicateNodes for task" depends on no more than this: tasks of one shape rank nodes alike."""
    return (task.requests, task.placement.key)


def shape_id(task: PodView) -> str:
    """The task's shape (`shape`) as a short string, the key of NodeState.ranks and of Plan.rankings: a digest
    (BLAKE2b, 128 bits) of its requests and its placement's digest (Placement.digest, made once per view), so a pod
    with a nodeSelector or tolerations of hundreds of kilobytes costs every node state that remembers its shape 32
    characters, not a copy of them; and a string's hash is computed once, a tuple's on every lookup."""
    return hashlib.blake2b(f"{sorted(task.requests.items())!r}{task.placement.digest}".encode(),
                           digest_size=16).hexdigest()


# answers per shape a node state keeps (NodeState.ranks): a tenant can make pods of any number of shapes, and each
# kept one costs memory on every node
MAX_SHAPES_KEPT = 32
FITS_NOW = datetime.min.replace(tzinfo=UTC)  # fit_at of a request the idle covers now


# (never fits, fit_at or FITS_NOW, -idle_fraction, name): seed 000's node order for one task shape, kept across plans
RankKey = tuple[bool, datetime, float, str]
# task shapes whose ShapeRanking plans keep (the least recently used goes): at least MAX_RANKINGS, and as many more
# as keep MAX_RANKED_NODES node entries in all (250 bytes each measured, so 25 MB; 65 shapes on 1,523 nodes, 20 on
# 5,000); a ranking holds the node states it saw weakly (ShapeRanking.entries), so a kept one pins no past plan. A
# plan asks for the shape of every starving job it weighs, up to 60 in a plan of the synthetic trace's replay, and an
# LRU smaller than what one plan asks for ranks every node again for each shape at each plan (reservoir simulate's
# default run: 12,967 of 18,548 rankings made anew with 16 kept, 419 with this; 18% less CPU). Beyond these, the
# rankings the last plan used are kept too (make_room)
MAX_RANKINGS = 16
MAX_RANKED_NODES = 100_000
MOST_RANKINGS = 1024  # and never more shapes than this (on a cluster of three nodes, a ranking's own objects count)
# nor, keeping the last plan's (make_room), more node entries than this (250 MB): a tenant's starving pods of a
# thousand shapes that fit nowhere are each weighed by every plan, and would keep 1.3 GB on 5,000 nodes
MOST_RANKED_NODES = 1_000_000


@dataclass
class ShapeRanking:
    """Seed 000's node choice for one task shape, kept from plan to plan (issue 34): every node the shape may ever go
    on (schedulable, allocatable, kube-scheduler's filters with Reservoir's lock aside) in the order (when it fits
    with nothing reserved, -idle_fraction, name), `order` sorted by RankKey. `sync` brings it up to date with a
    plan's node states, ranking again only the nodes whose state is not the one it ranked (capacity.node_states
    keeps an unchanged node's state): after one event a plan re-ranks one node per shape, not every node. The order
    by (time_to_fit, -idle_fraction, name) at any `now` follows from it (starvation.NodeChooser): the nodes whose
    fit_at is past tie at 0 and go by (-idle_fraction, name), the others keep this order."""

    # node -> (the state it was ranked from, held weakly, and its key; None: never usable). Weakly: a ranking no plan
    # uses again must not keep the states it last saw, and their pods, alive (each kept ranking would hold a past
    # plan's node states); a state gone since is one that changed, ranked again in full when next synced
    entries: dict[str, tuple[weakref.ref[NodeState], RankKey | None]] = field(default_factory=dict)
    order: list[RankKey] = field(default_factory=list)
    used: datetime = FITS_NOW  # the `now` of the last plan that used it
    synced: int | None = None  # the NodeStates.generation it was last brought up to date with
    # (-idle_fraction, name) of the nodes in `order` whose fit_at is not after `fitting_upto`, sorted (`split`)
    fitting: list[tuple[float, str]] = field(default_factory=list)
    fitting_upto: datetime | None = None  # None: `fitting` not made yet

    def sync(self, states: Mapping[str, NodeState], requests: Resources, placement: Placement) -> None:
        """Up to date with `states`: from their NodeStates.changed alone when they were made from the states it last
        synced with, else by checking every node's state for identity."""
        if isinstance(states, NodeStates) and self.synced == states.generation:
            return  # already (a NodeStates is not changed once made)
        synced, self.synced = self.synced, None  # an exception below leaves it to be checked in full next time
        entries = self.entries
        fresh = not entries
        if fresh:
            self.fitting_upto = None
        changes = states.changed if (isinstance(states, NodeStates) and synced is not None
                                     and states.base == synced) else None
        for name in (states if changes is None else changes):
            state = states.get(name)
            entry = entries.get(name)
            seen = entry[0]() if entry is not None else None
            if seen is state:
                continue
            if entry is not None and entry[1] is not None:
                self._drop(entry[1])
            if state is None:  # the node is gone
                entries.pop(name, None)
                continue
            if entry is not None and seen is not None and seen.node is state.node:  # only its pods changed:
                key = None if entry[1] is None else fit_key(name, state, requests)  # usable_ever stands
            else:
                key = rank_key(name, state, requests, placement)
            entries[name] = (weakref.ref(state), key)
            if key is not None:
                if fresh:
                    self.order.append(key)
                else:
                    self._add(key)
        if fresh:
            self.order.sort()
        if changes is None and len(entries) > len(states):  # nodes gone
            for name in [n for n in entries if n not in states]:
                gone = entries.pop(name)[1]
                if gone is not None:
                    self._drop(gone)
        self.synced = states.generation if isinstance(states, NodeStates) else None

    def _fits_by(self, key: RankKey) -> bool:
        return self.fitting_upto is not None and not key[0] and key[1] <= self.fitting_upto

    def _add(self, key: RankKey) -> None:
        insort(self.order, key)
        if self._fits_by(key):
            insort(self.fitting, (key[2], key[3]))

    def _drop(self, key: RankKey) -> None:
        del self.order[bisect_left(self.order, key)]
        if self._fits_by(key):
            del self.fitting[bisect_left(self.fitting, (key[2], key[3]))]

    def split(self, now: datetime) -> tuple[list[tuple[float, str]], list[RankKey]]:
        """The ranking at `now` in two sorted lists (each a heap): the nodes whose fit_at is not after `now`
        (time_to_fit 0) by (-idle_fraction, name), and the others in `order`'s order. The first is kept and moved on
        with time (`fitting`): a plan copies it instead of building it from every such node."""
        order = self.order
        cut = bisect_right(order, (False, now, math.inf, ""))
        if self.fitting_upto is None or now < self.fitting_upto:
            self.fitting = sorted((neg_idle, name) for _, _, neg_idle, name in order[:cut])
        else:
            for _, _, neg_idle, name in order[bisect_right(order, (False, self.fitting_upto, math.inf, "")):cut]:
                insort(self.fitting, (neg_idle, name))
        self.fitting_upto = now
        return list(self.fitting), order[cut:]


def kept_ranking(rankings: dict[str, ShapeRanking], states: Mapping[str, NodeState], task: PodView,
                 now: datetime) -> ShapeRanking:
    """The task shape's ShapeRanking from `rankings` (kept from plan to plan: PlanContext.rankings, Plan.rankings),
    made when missing (the least recently used one goes past MAX_RANKINGS, or as many as MAX_RANKED_NODES allows,
    those of the last plan aside: make_room), brought up to date with `states`."""
    kept = shape_id(task)
    ranking = rankings.get(kept)
    if ranking is None:
        cap = min(MOST_RANKINGS, max(MAX_RANKINGS, MAX_RANKED_NODES // max(len(states), 1)))
        if len(rankings) >= cap:
            make_room(rankings, cap, now, len(states))
        ranking = rankings[kept] = ShapeRanking()
    ranking.used = now
    ranking.sync(states, task.requests, task.placement)
    return ranking


def plan_rankings(nodes: int) -> int:
    """How many task shapes one plan may rank the nodes for (starvation.NodeChooser): as many as MOST_RANKED_NODES
    node entries hold, at least MAX_RANKINGS and at most MOST_RANKINGS. The rankings one plan uses are in memory
    during its run (NodeChooser.ranked) and kept for the next one (make_room), so this is what bounds both. A plan
    asks for the shape of every starving job it weighs: a tenant's starving pods of thousands of shapes would
    otherwise have each plan rank every node for each of them (make bench-planner's flood: 26.9 s a
    plan for a thousand shapes on 5,000 nodes, 480 MiB; 9.8 s, then 1.9 s a plan, with this). 200 on 5,000 nodes,
    where bench-simulate's busiest plan used 107; 1,024 on the synthetic trace's 152 nodes, where a plan uses at most
    60."""
    return min(MOST_RANKINGS, max(MAX_RANKINGS, MOST_RANKED_NODES // max(nodes, 1)))


def make_room(rankings: dict[str, ShapeRanking], cap: int, now: datetime, nodes: int) -> None:
    """Rankings go, least recently used first, until one more stays within `cap`; but none the last plan or this one
    used (`used` the latest before `now`, or `now`) unless MOST_RANKINGS are kept, or MOST_RANKED_NODES node entries
    (rankings of `nodes` each). A plan asks for the shape of every starving job it weighs, and on a large cluster
    the cap (MAX_RANKED_NODES // nodes) can be below that: an LRU smaller than what each plan asks for, in the same
    order at each plan, drops every shape before the next plan asks for it again, and ranks every node again for each
    (bench-simulate, 5,000 nodes, cap 20: 3,456 of 3,968 rankings were made anew, 19.9 million node keys computed;
    with this, 512 and 2.6 million, and the starvation arm's CPU went from 346 s (d212ce5's run) to 226 s, its
    planner's from 160 s to 53 s, for 84 MiB more at the peak). What a plan uses it holds in memory for its own run
    anyway (NodeChooser.ranked): kept one plan longer, the rankings two plans used are at most twice that."""
    if len(rankings) >= MOST_RANKINGS or len(rankings) * nodes >= MOST_RANKED_NODES:
        del rankings[min(rankings, key=lambda k: (rankings[k].used, k))]
        return
    last = max((r.used for r in rankings.values() if r.used < now), default=None)
    if last is None:
        return
    stale = sorted((r.used, k) for k, r in rankings.items() if r.used < last)
    for _, k in stale[:len(rankings) - cap + 1]:
        del rankings[k]


def usable_ever(node: NodeView, requests: Resources, placement: Placement) -> bool:
    """Seed 000 "Node reserve logic" and "PredicateNodes for task", whatever runs there: the node is schedulable, its
    allocatable can ever fit `requests`, and kube-scheduler's filters let a pod of that `placement` on (Reservoir's
    lock aside)."""
    return (schedulable(node) and requests.fits_in(node.allocatable)
            and schedulable_on(placement, node, pods_on_node=0, ignore_lock=True))


def rank_key(name: str, state: NodeState, requests: Resources, placement: Placement) -> RankKey | None:
    """A node's place in a shape's ShapeRanking, None when the shape may never go there (usable_ever)."""
    if not usable_ever(state.node, requests, placement):
        return None
    return fit_key(name, state, requests)


def fit_key(name: str, state: NodeState, requests: Resources) -> RankKey:
    """rank_key of a node the shape may go on."""
    at = fit_at(state, requests)
    return (at is None, FITS_NOW if at is None else at, -idle_fraction(state), name)


def fit_at(state: NodeState, request: Resources, reserved: Resources = EMPTY) -> datetime | None:
    """When `request` fits on the node beside `reserved`, by its release curve, independent of `now`: FITS_NOW when
    idle - reserved covers it, else the end after which enough pods with a maximum runtime have ended (it may be
    past: a pod overrunning its runtime), None when pods without one stand in the way."""
    free = state.idle - reserved if reserved else state.idle
    need = {}
    for name, amount in request.items():
        short = amount - free.get(name, 0)
        if short > 0:
            need[name] = short
    if not need:
        return FITS_NOW
    index = state.releases.first_covering(need)
    return None if index is None else state.releases.ends[index]


def time_to_fit(state: NodeState, request: Resources, reserved: Resources, now: datetime) -> timedelta:
    """Seed 000 node choice, "how soon the node fits": zero when idle - reserved covers `request` now; else the
    wait until enough pods with a maximum runtime have ended (earliest end first) for it to (zero when that moment
    has passed); FOREVER when pods without one stand in the way. fit_at, counted from `now`."""
    at = fit_at(state, request, reserved)
    return FOREVER if at is None else max(at - now, timedelta(0))


def future_idle(state: NodeState, at: datetime) -> Resources:
    """Seed 004 "future idle": allocatable minus the requests of pods still running at `at`."""
    still = EMPTY
    for pod in state.pods:
        end = pod_end(pod, state.node.backfill_grants)
        if end is None or end > at:
            still = still + pod.requests
    return (state.node.allocatable - still).clamp_negative()


def idle_fraction(state: NodeState) -> float:
    """Seed 000's node score shape: ((cpu + memory) / 2 + 2 * scalar) / 3 over idle/allocatable per dimension
    (scalar = the mean over other resources, counted only when the node has any)."""
    if state._idle_fraction is not None:
        return state._idle_fraction
    allocatable = state.node.allocatable
    idle = state.idle

    def share(name: str) -> float:
        return idle[name] / allocatable[name] if allocatable[name] else 0.0

    scalars = [n for n in allocatable if n not in ("cpu", "memory", "pods", "ephemeral-storage")]
    base = (share("cpu") + share("memory")) / 2
    if scalars:
        base = (base + 2 * sum(share(n) for n in scalars) / len(scalars)) / 3
    state._idle_fraction = base
    return base


def control_plane(node: NodeView) -> bool:
    """Guard rail (issue 10): the node runs the control plane (a label of keys.CONTROL_PLANE_LABELS, any value): never
    locked, not in the caps' base. Read once per node view (NodeView.control_plane): this is on the planner's hot
    path."""
    return node.control_plane


def schedulable(node: NodeView) -> bool:
    """The nodes Reservoir may lock, and the nodes the caps' percentages are of (seed 000 reservedNodePercent, seed 002
    "Safety", maxLockedNodePercent): not cordoned, Ready (NodeView.ready), and not a control-plane node.

    Every policy chooses its nodes among these only, so a lock already on a node that becomes NotReady, cordoned or
    control-plane is not planned again and the writer releases it: a lock Reservoir made stays removable."""
    return not node.unschedulable and node.ready and not control_plane(node)
