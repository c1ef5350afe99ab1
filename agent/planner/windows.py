"""Seed 004, "node resource reservation" (DESIGN 4.3): hold nodes for reserve pods during cron windows.

A window starts at each `schedule` time (5-field cron in `timezone`) and lasts `duration`; its nodes are locked
from `start - startReserveAgo` until `start + duration`. Nodes matching `nodeSelector` are ordered by future idle
at the window start (capacity.future_idle: allocatable minus the requests of pods still running then), nodes
already held for the window first, and taken while the accumulated allocatable does not yet cover `resources`.
The window's nodes are released at its end, once `podNumToReserve` reserve pods have started during it, or once
reserve demand is covered (no reserve pod pending and at least one started during the window).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

from agent.planner.capacity import NodeState, future_idle, schedulable
from agent.planner.model import Lock, WindowStatus
from shared.config import WindowConfig
from shared.ownership import window_owner_id
from shared.keys import LockKind
from shared.predicates import selects
from shared.resources import EMPTY
from shared.timestamps import stamp
from shared.views import PodView


def window_bounds(window: WindowConfig, now: datetime) -> tuple[datetime, datetime, bool]:
    """(start, end, active) of the window that is running or comes next; active when
    start - startReserveAgo <= now < end."""
    assert window.schedule is not None and window.duration is not None
    zone = ZoneInfo(window.timezone)
    horizon = now.astimezone(zone) + window.start_reserve_ago + timedelta(seconds=1)
    start = croniter(window.schedule, horizon).get_prev(datetime)
    end = start + window.duration
    if now < end:
        return start.astimezone(now.tzinfo), end.astimezone(now.tzinfo), True
    start = croniter(window.schedule, horizon).get_next(datetime)
    return start.astimezone(now.tzinfo), (start + window.duration).astimezone(now.tzinfo), False


def plan_window(
    window: WindowConfig,
    states: Mapping[str, NodeState],
    pods: Sequence[PodView],
    current: Mapping[str, Lock],
    taken: set[str],
    budget: int,
    now: datetime,
) -> tuple[dict[str, Lock], WindowStatus, list[str]]:
    start, end, active = window_bounds(window, now)
    lock_from = start - window.start_reserve_ago
    owner = window_owner_id(window.name)

    def status(reason: str, is_active: bool = active) -> WindowStatus:
        return WindowStatus(window.name, is_active, start, end, reason)

    holding = any(lock.owner == owner for lock in current.values())

    def release(reason: str, is_active: bool = active) -> tuple[dict[str, Lock], WindowStatus, list[str]]:
        # logged once: only while the window still holds nodes
        notes = [f"window={window.name} decision=release reason={reason}"] if holding else []
        return {}, status(reason, is_active), notes

    if not active:
        return release(f"inactive: next lock at {stamp(lock_from)}")
    reserve = [p for p in pods if p.reserveable]
    started = [p for p in reserve if p.is_bound and (p.started or p.created) >= lock_from]
    pending = [p for p in reserve if not p.is_bound and not p.is_terminal and not p.deleting]
    if window.pod_num_to_reserve and len(started) >= window.pod_num_to_reserve:
        return release(f"{len(started)} reserve pods started (podNumToReserve {window.pod_num_to_reserve})")
    if started and not pending:
        return release(f"reserve demand covered ({len(started)} started, none pending)")

    own = {node for node, lock in current.items() if lock.owner == owner}
    dims = sorted(window.resources)
    candidates = [n for n, s in states.items() if n not in taken and schedulable(s.node)
                  and selects(window.node_selector, s.node)
                  and (current.get(n) is None or current[n].owner == owner or current[n].kind is LockKind.JOB)]

    def order(name: str) -> tuple:
        idle = future_idle(states[name], start)
        return (name not in own, tuple(-idle[d] for d in dims), name)

    chosen: list[str] = []
    accumulated = EMPTY
    for name in sorted(candidates, key=order):
        if accumulated.covers(window.resources) or len(chosen) >= budget:
            break
        chosen.append(name)
        accumulated = accumulated + states[name].node.allocatable
    notes = []
    if not accumulated.covers(window.resources):
        notes.append(f"window={window.name} decision=partial reason=matching nodes cover "
                     f"{accumulated.to_quantities()} of {window.resources.to_quantities()} (budget {budget})")
    locks = {}
    for name in chosen:
        since = current[name].since if name in current and current[name].owner == owner else now
        locks[name] = Lock(node=name, owner=owner, kind=LockKind.WINDOW, subject=f"window/{window.name}",
                           reason=f"window {window.name} {start:%H:%M}-{end:%H:%M} UTC: {len(pending)} reserve pods pending",
                           since=since, expires=end, reserved=window.resources)
        taken.add(name)
    return locks, status(f"holding {len(chosen)} nodes for reserve pods"), notes
