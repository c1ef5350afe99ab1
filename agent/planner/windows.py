"""Seed 004, "node resource reservation" (DESIGN 4.3): hold nodes for reserve pods during cron windows.

A window starts at each `schedule` time (5-field cron in `timezone`) and lasts `duration`; its nodes are locked
from `start - startReserveAgo` until `start + duration` (`window_bounds`; the seed's "should start reserve 2h ago").
Nodes matching `nodeSelector` and open to a window by the displacement table are ordered by future idle at the
window start (capacity.future_idle: "Node idle is consisted of node resource unused and the resource will be
released in the future before reserve start time"), nodes already held for the window first, and taken while the
accumulated allocatable does not yet cover `resources` (`window_nodes`: "traverse the ordered nodes, accumulate the
node allocatable resource, if the accumulated resource is less than the resource to be reserved, add the node").
The window's nodes are released at its end, and (`window_released`) once `podNumToReserve` reserve pods have started
during it ("if 10 reserve tasks are scheduled during reserve time range, stop reserve"), or once reserve demand is
covered (no reserve pod pending and at least one started during the window).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

from agent.planner.capacity import future_idle, schedulable
from agent.planner.displacement import may_take
from agent.planner.model import Lock, WindowStatus
from agent.planner.policy import PlanContext, Policy, PolicyResult, Statuses, kept_since
from shared.config import WindowConfig
from shared.keys import LockKind
from shared.ownership import window_owner_id
from shared.predicates import selects
from shared.resources import EMPTY, Resources
from shared.timestamps import stamp
from shared.views import PodView


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


@dataclass(frozen=True, kw_only=True)
class ReserveDemand:
    """Seed 004: reserve pods (`volcano.sh/reserveable`) as the window counts them."""

    started: Sequence[PodView]  # bound, started (or created) since the window's nodes were locked
    pending: Sequence[PodView]  # not bound, not finished, not being deleted


def reserve_demand(pods: Sequence[PodView], *, lock_from: datetime) -> ReserveDemand:
    """Seed 004 "reservedTaskAllocatedResource" and "reservedTaskPendingResource", counted in pods: the reserve pods
    started within the window's range and those pending."""
    reserve = [p for p in pods if p.reserveable]
    return ReserveDemand(started=[p for p in reserve if p.is_bound and (p.started or p.created) >= lock_from],
                         pending=[p for p in reserve if not p.is_bound and not p.is_terminal and not p.deleting])


def plan_windows(*, context: PlanContext) -> PolicyResult:
    """Seed 004: every configured window in config order, each within what the windows before it left."""
    locks: dict[str, Lock] = {}
    statuses: list[WindowStatus] = []
    notes: list[str] = []
    for window in context.config.windows:
        window_locks, status, window_notes = plan_window(window, context=context)
        locks.update(window_locks)
        statuses.append(status)
        notes += window_notes
        context = context.after(window_locks)
    return PolicyResult(locks=locks, statuses=Statuses(windows=tuple(statuses)), notes=tuple(notes))


def plan_window(window: WindowConfig, *,
                context: PlanContext) -> tuple[dict[str, Lock], WindowStatus, list[str]]:
    """Seed 004: one window's locks, status and notes (module docstring)."""
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
    demand = reserve_demand(context.snapshot.pods, lock_from=lock_from)
    released = window_released(window, demand=demand)
    if released is not None:
        return release(released)
    chosen, accumulated = window_nodes(window, context=context, owner=owner, start=start)
    notes = []
    if not accumulated.covers(window.resources):
        notes.append(f"window={window.name} decision=partial reason=matching nodes cover "
                     f"{accumulated.to_quantities()} of {window.resources.to_quantities()} (budget {context.budget})")
    reason = f"window {window.name} {start:%H:%M}-{end:%H:%M} UTC: {len(demand.pending)} reserve pods pending"
    locks = {name: Lock(node=name, owner=owner, kind=LockKind.WINDOW, subject=f"window/{window.name}", reason=reason,
                        since=kept_since(context.current, node=name, owner=owner, now=context.now), expires=end,
                        reserved=window.resources)
             for name in chosen}
    return locks, WindowStatus(window.name, active, start, end, f"holding {len(chosen)} nodes for reserve pods"), notes


def window_released(window: WindowConfig, *, demand: ReserveDemand) -> str | None:
    """Seed 004: why a window within its range holds no node any more ("if 10 reserve tasks are scheduled during
    reserve time range, stop reserve"; or reserve demand covered: some started, none pending), or None."""
    started = len(demand.started)
    if window.pod_num_to_reserve and started >= window.pod_num_to_reserve:
        return f"{started} reserve pods started (podNumToReserve {window.pod_num_to_reserve})"
    if demand.started and not demand.pending:
        return f"reserve demand covered ({started} started, none pending)"
    return None


def window_nodes(window: WindowConfig, *, context: PlanContext, owner: str,
                 start: datetime) -> tuple[list[str], Resources]:
    """Seed 004 ReserveNodesMap: nodes matching `nodeSelector`, not taken and open to the window
    (displacement.may_take), the window's own first, then by future idle at `start` (desc, in the dimensions of
    `resources`), then name; taken while their accumulated allocatable does not cover `resources`, at most
    `context.budget` of them. Returns the nodes and what they accumulate."""
    states, current, taken = context.states, context.current, context.taken
    own = {node for node, lock in current.items() if lock.owner == owner}
    dims = sorted(window.resources)
    candidates = [n for n, s in states.items() if n not in taken and schedulable(s.node)
                  and selects(window.node_selector, s.node)
                  and may_take(LockKind.WINDOW, current.get(n), owner=owner, live_jobs=context.live_jobs)]

    def order(name: str) -> tuple[bool, tuple[int, ...], str]:
        idle = future_idle(states[name], start)
        return (name not in own, tuple(-idle[d] for d in dims), name)

    chosen: list[str] = []
    accumulated = EMPTY
    for name in sorted(candidates, key=order):
        if accumulated.covers(window.resources) or len(chosen) >= context.budget:
            break
        chosen.append(name)
        accumulated = accumulated + states[name].node.allocatable
    return chosen, accumulated


WINDOWS = Policy(name="window", kind=LockKind.WINDOW, seed="004", run=plan_windows)
