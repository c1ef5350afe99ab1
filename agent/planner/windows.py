"""Seed 004, "node resource reservation" (DESIGN 4.3): hold nodes for reserve pods during cron windows.

A window starts at each `schedule` time (5-field cron in `timezone`) and lasts `duration`; its nodes are locked
from `start - startReserveAgo` until `start + duration` (`window_bounds`; the seed's "should start reserve 2h ago").
That whole span is the window's "reserve time range": the seed's PredicateFn keeps non-reserved tasks off the nodes
only "within the reserved time range", so the range must include the lead time.

Its reserve pods (`reserve.is_reserve_pod`: `volcano.sh/reserveable`, on the pod or its PodGroup) are those the window
lets in (shared.entitlement: its `namespaces` and `queues`; any when unset). `reserve_demand` counts them as the seed's
caches do, on the window's own nodes only:
- scheduled ("the number of reserve pods which have been scheduled"): bound on the nodes the window holds, scheduled
  (startTime, else creation) within its range, finished or not;
- "reservedTaskAllocatedResource": the requests of those still running;
- "reservedTaskPendingResource": the requests of those not bound, not finished, not being deleted, not held by
  `spec.schedulingGates`, that kube-scheduler could place on at least one node the window selects: the one predicate
  (shared.predicates.schedulable_on: nodeSelector, required node affinity, taints other than Reservoir's lock, on
  the pod's `placement`) lets them on, and their requests fit in its allocatable (`PendingFit`, decided once per task
  shape, as starvation's NodeChooser does); at most `podNumToReserve` minus those scheduled of them, the largest first.

`window_nodes` (the seed's ReserveNodesMap): nodes matching `nodeSelector` and open to the window by the displacement
table, the window's own first (those hosting its scheduled reserve pods before the others), then by future idle at
the window start (capacity.future_idle: "Node idle is consisted of node resource unused and the resource will be
released in the future before reserve start time"), then name; taken while their accumulated allocatable does not yet
cover `reserve_target` ("traverse the ordered nodes, accumulate the node allocatable resource, if the accumulated
resource is less than the resource to be reserved, add the node"). The target is the seed's PredicateFn bound,
max(reservedTaskAllocatedResource + reservedTaskPendingResource, resources): a window keeps at least `resources`, and
more while its reserve pods, placed and waiting, ask for more.

The window holds that through its range, until `podNumToReserve` of its reserve pods were scheduled on its nodes
within the range (`window_released`: "if 10 reserve tasks are scheduled during reserve time range, stop reserve"), or
until its end when `podNumToReserve` is not set (the seed's count check then never lets anyone in). No other rule
releases it early: ten reserve pods arriving over the hour find the room the first wave did.

Where this departs from the seed, and why:
- The seed counts reserve pods cluster-wide; a window counts only those bound on the nodes it holds, so a reserve pod
  bound elsewhere (on another window's nodes, or a tenant's anywhere) cannot release it. A window that holds no node
  (after its release, or while it could lock none) counts on every node its `nodeSelector` matches, so that a
  released window stays released: the pods it counted are still on those nodes. The price: before a window has locked
  anything (its first plan in range, or while the budget leaves it no node), reserve pods it lets in that were bound on
  its matching nodes within its range count too.
- The seed's comparisons run over every resource; `reserve_target` is taken in the dimensions `resources` names, so a
  reserve pod asking for something the window does not reserve (a GPU the ebook nodes lack) cannot make it take every
  matching node looking for it.
- "reserve tasks are scheduled": the count is of reserve pods present in the snapshot; one deleted (not merely
  finished) no longer counts.
- The seed adds up every pending reserve pod. A tenant let into the window could then make it lock every node its
  `nodeSelector` matches (up to maxLockedNodePercent) with pending pods that will never run there: gated ones, ones
  asking for more than any of its nodes has, ones whose affinity, nodeSelector or taints keep them off its nodes. A
  pending pod counts only if it could be placed on one of the window's nodes (`PendingFit`), so each counts for at
  most one node's allocatable; and only `podNumToReserve` minus the scheduled ones count (the largest first, in the
  dimensions of `resources`): the window is released once that many more are scheduled, so more are never placed
  under it. (No smaller cap per pod: one that fits a node may legitimately need all of it.) Without
  `podNumToReserve`, many pending pods that could run still add up: the window's `namespaces` and `queues`, and
  maxLockedNodePercent, bound what they can take.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from agent.planner.capacity import future_idle, schedulable
from agent.planner.displacement import may_take
from agent.planner.model import Lock, WindowStatus
from agent.planner.policy import PlanContext, Policy, PolicyResult, Statuses, earliest, kept_since
from agent.planner.reservations import pod_meta
from agent.planner.reserve import is_reserve_pod
from shared.config import WindowConfig
from shared.entitlement import entitlement
from shared.keys import LockKind
from shared.ownership import window_owner_id
from shared.predicates import schedulable_on, selects
from shared.resources import EMPTY, Resources
from shared.timestamps import stamp
from shared.views import NodeView, PodView


def window_bounds(window: WindowConfig, now: datetime) -> tuple[datetime, datetime, bool]:
    """Seed 004 `cron` and `startReserveAgo`: (start, end, active) of the window that is running or comes next;
    active when start - startReserveAgo <= now < end."""
    assert window.schedule is not None and window.duration is not None, "the config model fills both from `cron`"
    zone = ZoneInfo(window.timezone)
    horizon = now.astimezone(zone) + window.start_reserve_ago + timedelta(seconds=1)
    start: datetime = croniter(window.schedule, horizon).get_prev(datetime)
    end = start + window.duration
    if now < end:
        return start.astimezone(now.tzinfo), end.astimezone(now.tzinfo), True
    start = croniter(window.schedule, horizon).get_next(datetime)
    return start.astimezone(now.tzinfo), (start + window.duration).astimezone(now.tzinfo), False


@dataclass(frozen=True)
class ReservePod:
    """A reserve pod (reserve.is_reserve_pod) with the owner ids of the windows that let it in (shared.entitlement)."""

    pod: PodView
    windows: frozenset[str]


def reserve_pods(context: PlanContext) -> list[ReservePod]:
    """Every reserve pod that is bound, or pending (not finished, not being deleted), with the windows it belongs to:
    computed once per plan for all windows. Entitlement is the one rule (shared.entitlement) the webhook and repair
    apply: a reserve pod of a window only as far as the window's `namespaces` and `queues` let it in."""
    snapshot = context.snapshot
    grounds = snapshot.grounds(context.config, reservations=False)
    window_ids = {window_owner_id(window.name) for window in context.config.windows}
    out = []
    for pod in snapshot.pods:
        if not (pod.is_bound or (not pod.is_terminal and not pod.deleting)):
            continue
        if not is_reserve_pod(pod, snapshot.podgroups):
            continue
        rights = entitlement(pod_meta(pod), pod.namespace, grounds, reservations=(), best_effort=pod.best_effort)
        windows = frozenset(rights.owners.keys() & window_ids)
        if windows:
            out.append(ReservePod(pod, windows))
    return out


@dataclass(frozen=True, kw_only=True)
class ReserveDemand:
    """Seed 004: one window's reserve pods, as its caches count them (module docstring)."""

    scheduled: Sequence[PodView]  # bound on its nodes, scheduled within its range: podNumToReserve counts these
    allocated: Resources  # "reservedTaskAllocatedResource": requests of those of `scheduled` still running
    pending: Sequence[PodView]  # not bound, not finished, not being deleted, not gated, able to go to one of its nodes
    pending_requests: Resources  # "reservedTaskPendingResource", of at most podNumToReserve - scheduled of `pending`


def scheduled_at(pod: PodView) -> datetime:
    """When a bound pod was scheduled, as near as its view says: its startTime, else its creation."""
    return pod.started or pod.created


@dataclass
class PendingFit:
    """Seed 004 "reservedTaskPendingResource", hardened (module docstring): could kube-scheduler place a pending pod
    on one of `selected` (the window's nodes)? Not while it is gated; else the one predicate
    (shared.predicates.schedulable_on, Reservoir's lock aside, as starvation's NodeChooser asks it) must let it onto
    a node whose allocatable its requests fit in. Decided once per placement (the distinct allocatables of the nodes
    it may go to) and once per task shape (requests, placement): pending pods x selected nodes would be too much at
    5,000 nodes."""

    selected: Sequence[NodeView]
    _sizes: dict[tuple[Any, ...], tuple[Resources, ...]] = field(default_factory=dict)
    _fits: dict[tuple[Resources, tuple[Any, ...]], bool] = field(default_factory=dict)

    def admits(self, pod: PodView) -> bool:
        if pod.gated:
            return False
        placement = pod.placement
        where = placement.key
        shape = (pod.requests, where)
        answer = self._fits.get(shape)
        if answer is None:
            sizes = self._sizes.get(where)
            if sizes is None:
                sizes = self._sizes[where] = tuple({node.allocatable for node in self.selected if schedulable_on(
                    placement, node, pods_on_node=0, ignore_lock=True)})
            answer = self._fits[shape] = any(pod.requests.fits_in(size) for size in sizes)
        return answer


def reserve_demand(reserve: Sequence[ReservePod], *, owner: str, nodes: Collection[str], fit: PendingFit,
                   lock_from: datetime, count: int | None = None, dims: Sequence[str] = ()) -> ReserveDemand:
    """Seed 004 "reservedTaskAllocatedResource" and "reservedTaskPendingResource", and the reserve pods scheduled, of
    the window `owner` counted on `nodes` (those it holds; module docstring) from `lock_from`. `fit`: whether a
    pending reserve pod could go to a node the window selects (PendingFit). `count`: the window's podNumToReserve;
    at most `count` minus those scheduled of the pending pods have their requests counted, the largest in `dims`
    (the window's `resources`) first."""
    scheduled: list[PodView] = []
    pending: list[PodView] = []
    for item in reserve:
        if owner not in item.windows:
            continue
        pod = item.pod
        if pod.is_bound:
            if pod.node_name in nodes and scheduled_at(pod) >= lock_from:
                scheduled.append(pod)
        elif fit.admits(pod):
            pending.append(pod)
    counted: Sequence[PodView] = pending
    if count is not None and len(pending) > max(count - len(scheduled), 0):
        counted = sorted(pending, key=lambda p: (tuple(-p.requests.get(d, 0) for d in dims), p.key))[
            :max(count - len(scheduled), 0)]
    return ReserveDemand(scheduled=scheduled,
                         allocated=Resources.total(p.requests for p in scheduled if p.holds_resources),
                         pending=pending, pending_requests=Resources.total(p.requests for p in counted))


def reserve_target(window: WindowConfig, demand: ReserveDemand) -> Resources:
    """Seed 004 PredicateFn: max(reservedTaskAllocatedResource + reservedTaskPendingResource, reserveResourcesConfig),
    per dimension, in the dimensions `resources` names (module docstring)."""
    need = demand.allocated + demand.pending_requests
    return Resources({name: max(need.get(name, 0), amount) for name, amount in window.resources.items()})


def plan_windows(*, context: PlanContext) -> PolicyResult:
    """Seed 004: every configured window in config order, each within what the windows before it left."""
    locks: dict[str, Lock] = {}
    statuses: list[WindowStatus] = []
    notes: list[str] = []
    reserve: list[ReservePod] | None = None
    for window in context.config.windows:
        if reserve is None and window_bounds(window, context.now)[2]:
            reserve = reserve_pods(context)  # only when some window is in its range
        window_locks, status, window_notes = plan_window(window, context=context, reserve=reserve or [])
        locks.update(window_locks)
        statuses.append(status)
        notes += window_notes
        context = context.after(window_locks)
    return PolicyResult(locks=locks, statuses=Statuses(windows=tuple(statuses)), notes=tuple(notes),
                        wake_at=earliest(*(window_wake_at(w, context.now) for w in context.config.windows)))


def window_wake_at(window: WindowConfig, now: datetime) -> datetime | None:
    """The next moment time alone changes the window: its range starting (`start - startReserveAgo`), else its end."""
    start, end, _ = window_bounds(window, now)
    lock_from = start - window.start_reserve_ago
    return lock_from if now < lock_from else end if now < end else None


def counted_nodes(window: WindowConfig, *, owner: str, context: PlanContext) -> set[str]:
    """The nodes a window counts its reserve pods on: those it holds now; when it holds none (released, or not locked
    yet), every node its nodeSelector matches (module docstring)."""
    held = {node for node, lock in context.current.items() if lock.owner == owner}
    if held:
        return held
    return {name for name, node in context.snapshot.nodes.items() if selects(window.node_selector, node)}


def plan_window(window: WindowConfig, *, context: PlanContext,
                reserve: Sequence[ReservePod] = ()) -> tuple[dict[str, Lock], WindowStatus, list[str]]:
    """Seed 004: one window's locks, status and notes (module docstring). `reserve`: reserve_pods(context)."""
    start, end, active = window_bounds(window, context.now)
    lock_from = start - window.start_reserve_ago
    owner = window_owner_id(window.name)

    def release(reason: str) -> tuple[dict[str, Lock], WindowStatus, list[str]]:
        holding = any(lock.owner == owner for lock in context.current.values())
        # logged once: only while the window still holds nodes
        notes = [f"window={window.name} decision=release reason={reason}"] if holding else []
        return {}, WindowStatus(window.name, active, start, end, reason), notes

    if not active:
        return release(f"inactive: next lock at {stamp(lock_from)}")
    selected = [s.node for s in context.states.values()
                if schedulable(s.node) and selects(window.node_selector, s.node)]
    demand = reserve_demand(reserve, owner=owner, nodes=counted_nodes(window, owner=owner, context=context),
                            fit=PendingFit(selected), lock_from=lock_from, count=window.pod_num_to_reserve,
                            dims=sorted(window.resources))
    released = window_released(window, demand=demand)
    if released is not None:
        return release(released)
    target = reserve_target(window, demand)
    hosting = {p.node_name for p in demand.scheduled}
    chosen, accumulated = window_nodes(window, context=context, owner=owner, start=start, target=target,
                                       hosting=hosting)
    notes = []
    if not accumulated.covers(target):
        notes.append(f"window={window.name} decision=partial reason=matching nodes cover "
                     f"{accumulated.to_quantities()} of {target.to_quantities()} (budget {context.budget})")
    count = window.pod_num_to_reserve
    until = f"{count} reserve pods are scheduled on its nodes" if count else "its end"
    reason = f"window {window.name} {start:%H:%M}-{end:%H:%M} UTC: reserves {quantities(target)} until {until}"
    locks = {name: Lock(node=name, owner=owner, kind=LockKind.WINDOW, subject=f"window/{window.name}", reason=reason,
                        since=kept_since(context.current, node=name, owner=owner, now=context.now), expires=end,
                        reserved=target)
             for name in chosen}
    cap = f" of podNumToReserve {count}" if count else ""
    status = (f"holding {len(chosen)} nodes for reserve pods: {len(demand.scheduled)}{cap} scheduled on them, "
              f"{len(demand.pending)} pending, reserving {quantities(target)}")
    return locks, WindowStatus(window.name, active, start, end, status), notes


def quantities(resources: Resources) -> str:
    """`cpu=32,memory=64Gi`: a resource vector in one token."""
    return ",".join(f"{name}={amount}" for name, amount in resources.to_quantities().items())


def window_released(window: WindowConfig, *, demand: ReserveDemand) -> str | None:
    """Seed 004: why a window within its range holds no node any more, or None: `podNumToReserve` of its reserve pods
    were scheduled on its nodes within the range ("if 10 reserve tasks are scheduled during reserve time range, stop
    reserve"). Without `podNumToReserve` nothing releases it before its end."""
    scheduled = len(demand.scheduled)
    if window.pod_num_to_reserve is not None and scheduled >= window.pod_num_to_reserve:
        return f"{scheduled} reserve pods scheduled on its nodes (podNumToReserve {window.pod_num_to_reserve})"
    return None


def window_nodes(window: WindowConfig, *, context: PlanContext, owner: str, start: datetime,
                 target: Resources | None = None, hosting: Collection[str] = ()) -> tuple[list[str], Resources]:
    """Seed 004 ReserveNodesMap: nodes matching `nodeSelector`, not taken and open to the window
    (displacement.may_take), the window's own first (among them those in `hosting`, where its scheduled reserve pods
    are, first: a window that shrinks keeps the nodes its count is on), then by future idle at `start` (desc, in the
    dimensions of `resources`), then name; taken while their accumulated allocatable does not cover `target`
    (reserve_target; `resources` by default), at most `context.budget` of them. Returns the nodes and what they
    accumulate."""
    states, current, taken = context.states, context.current, context.taken
    want = window.resources if target is None else target
    own = {node for node, lock in current.items() if lock.owner == owner}
    dims = sorted(window.resources)
    candidates = [n for n, s in states.items() if n not in taken and schedulable(s.node)
                  and selects(window.node_selector, s.node)
                  and may_take(LockKind.WINDOW, current.get(n), owner=owner, live_jobs=context.live_jobs)]

    def order(name: str) -> tuple[bool, bool, tuple[int, ...], str]:
        idle = future_idle(states[name], start)
        mine = name in own
        return (not mine, not (mine and name in hosting), tuple(-idle[d] for d in dims), name)

    chosen: list[str] = []
    accumulated = EMPTY
    for name in sorted(candidates, key=order):
        if accumulated.covers(want) or len(chosen) >= context.budget:
            break
        chosen.append(name)
        accumulated = accumulated + states[name].node.allocatable
    return chosen, accumulated


WINDOWS = Policy(name="window", kind=LockKind.WINDOW, seed="004", run=plan_windows)
