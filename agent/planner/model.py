"""Plain data the planner works on: the snapshot it reads and the locks it returns."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared import keys
from shared.keys import LockKind
from shared.resources import EMPTY, Resources
from shared.timestamps import parse_time, stamp
from shared.views import NodeView, PodGroupView, PodView, PriorityClassView, QueueView, ReservationView


@dataclass(frozen=True)
class Snapshot:
    """What the cluster looked like at one moment, from the watch caches."""

    nodes: Mapping[str, NodeView] = field(default_factory=dict)
    pods: Sequence[PodView] = ()
    podgroups: Mapping[tuple[str, str], PodGroupView] = field(default_factory=dict)
    queues: Mapping[str, QueueView] = field(default_factory=dict)
    priority_classes: Mapping[str, PriorityClassView] = field(default_factory=dict)
    reservations: Mapping[str, ReservationView] = field(default_factory=dict)


@dataclass(frozen=True)
class Lock:
    """One node held for one owner (DESIGN section 2). `subject` is the owner's readable name."""

    node: str
    owner: str
    kind: LockKind
    subject: str
    reason: str
    since: datetime
    expires: datetime | None = None
    reserved: Resources = EMPTY
    tasks: tuple[str, ...] = ()

    def info(self) -> dict[str, Any]:
        """The `reservoir.sh/lock-info` annotation's JSON."""
        return {
            "owner": self.owner, "kind": self.kind.value, "subject": self.subject, "reason": self.reason,
            "since": stamp(self.since), "expires": stamp(self.expires) if self.expires else None,
            "reserved": self.reserved.to_quantities(), "tasks": list(self.tasks),
        }

    def info_json(self) -> str:
        return json.dumps(self.info(), sort_keys=True, separators=(",", ":"))

    def same_hold(self, other: Lock | None) -> bool:
        """True when `other` holds the node for the same owner with the same annotation (nothing to patch)."""
        return other is not None and self.owner == other.owner and self.info_json() == other.info_json()


def lock_on(node: NodeView) -> Lock | None:
    """Read back the lock Reservoir wrote on a node (taint + labels + info annotation), or None.

    A taint whose info annotation is missing or unreadable still counts as a lock of its owner, so the agent
    can always find and remove what it wrote."""
    owner = node.lock_owner
    if owner is None:
        return None
    try:
        info = json.loads(node.annotations.get(keys.LOCK_INFO, "") or "{}")
        if not isinstance(info, dict):
            info = {}
    except ValueError:
        info = {}
    label_kind = node.labels.get(keys.LOCK_KIND, "")
    kind = keys.owner_kind(owner) or (LockKind(label_kind) if label_kind in LockKind.__members__.values() else LockKind.JOB)
    try:
        reserved = Resources.parse(info.get("reserved") or {})
    except ValueError:
        reserved = EMPTY
    return Lock(
        node=node.name, owner=owner, kind=kind, subject=str(info.get("subject") or owner),
        reason=str(info.get("reason") or ""), since=parse_time(info.get("since")) or node.created,
        expires=parse_time(info.get("expires")), reserved=reserved, tasks=tuple(info.get("tasks") or ()),
    )


@dataclass(frozen=True)
class JobStatus:
    subject: str
    owner: str
    queue: str
    priority: int
    min_member: int
    bound: int
    pending: int
    starving: bool
    reason: str


@dataclass(frozen=True)
class WindowStatus:
    name: str
    active: bool
    start: datetime
    end: datetime
    reason: str


@dataclass(frozen=True)
class Repair:
    """DESIGN section 4 "Repair": a pending pod that a lock is held for but that lacks its toleration (created while
    the webhook was down, or before Reservoir was installed). The writer adds `add` to the pod's tolerations."""

    namespace: str
    name: str
    tolerations: tuple[Mapping[str, Any], ...]  # what the pod carries now
    add: tuple[dict[str, str], ...]  # lock tolerations it lacks, owners sorted

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Plan:
    locks: Mapping[str, Lock]  # node -> desired lock
    jobs: Sequence[JobStatus] = ()
    windows: Sequence[WindowStatus] = ()
    notes: Sequence[str] = ()  # one line per decision not to lock, with the reason
    queues: Sequence[Any] = ()  # QueueScore, best first, when queues competed in this plan
    guarantees: Sequence[Any] = ()  # QueueGuaranteeStatus per queue with a guarantee
    reservations: Sequence[Any] = ()  # ReservationStatus per Reservation
    repairs: Sequence[Repair] = ()  # pods to give the lock tolerations they lack (filled by the planner)
    # the node states this plan computed, handed to the next plan to reuse what did not change
    states: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
