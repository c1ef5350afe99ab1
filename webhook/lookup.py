"""The webhook's read model: what an admission request may read, as snapshots of the watch caches (DESIGN section
3: no API call on the request path), with the indexes derived from them computed once per cache state."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from shared.backfill import Grant, Room
from shared.config import ReservoirConfig
from shared.entitlement import Grounds
from shared.resources import Resources
from shared.views import NodeView, PodGroupView, PriorityClassView, QueueView, ReservationView, WorkloadView


@dataclass(frozen=True)
class Lookup:
    """What the request path may read: snapshots of the watch caches."""

    podgroups: Mapping[tuple[str, str], PodGroupView] = field(default_factory=dict)
    queues: Mapping[str, QueueView] = field(default_factory=dict)
    priority_classes: Mapping[str, PriorityClassView] = field(default_factory=dict)
    reservations: Mapping[str, ReservationView] = field(default_factory=dict)
    config: ReservoirConfig = field(default_factory=ReservoirConfig)
    nodes: Mapping[str, NodeView] = field(default_factory=dict)
    daemonsets: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (namespace, name) -> uid
    # issue 32, while kueue.workloads is on: by the (namespace, kind, name) of their job (views.workloads_by_owner)
    workloads: Mapping[tuple[str, str, str], WorkloadView] = field(default_factory=dict)

    @cached_property
    def grounds(self) -> Grounds:
        """What entitlement reads besides the pod (shared.entitlement)."""
        return Grounds(podgroups=self.podgroups, queues=self.queues, reservations=self.reservations,
                       daemonsets=self.daemonsets, config=self.config, backfill_grants=self.backfill_grants,
                       workloads=self.workloads)

    @cached_property
    def backfill_grants(self) -> dict[str, tuple[str, Grant]]:
        """Issue 17: the agent's backfill grants on every node, by pod uid, with their node (shared.backfill)."""
        return {uid: (name, grant) for name, node in self.nodes.items() for uid, grant in node.backfill_grants.items()}

    @cached_property
    def lock_of_node(self) -> dict[str, str]:
        """node -> owner id of the Reservoir lock it carries, for the nodeName check."""
        return {name: owner for name, node in self.nodes.items() if (owner := node.lock_owner) is not None}

    @cached_property
    def backfill_rooms(self) -> list[Room]:
        """Issue 30: the backfill room the agent noted on each node that carries a lock (shared.backfill "Room")."""
        return [node.backfill_room for node in self.nodes.values()
                if node.backfill_room is not None and node.lock_owner is not None]

    def backfill_room_for(self, requests: Resources, runtime: timedelta, now: datetime) -> bool:
        """Some locked node's room takes a pod of `requests` running `runtime` from `now`."""
        return any(room.takes(requests, runtime, now) for room in self.backfill_rooms)

    @cached_property
    def held_owners(self) -> frozenset[str]:
        """The owner ids holding a lock on some node now (a toleration of one of them is logged at INFO)."""
        return frozenset(self.lock_of_node.values())

    @cached_property
    def schedulable_allocatable(self) -> Resources:
        """Seed 002: what the schedulable nodes hold together (a Queue guarantee above it can never be met)."""
        return Resources.total(n.allocatable for n in self.nodes.values() if not n.unschedulable)

    @cached_property
    def global_default_class(self) -> str:
        """Seed 001: the cluster's globalDefault PriorityClass, which counts as "no class chosen"."""
        return next((pc.name for pc in self.priority_classes.values() if pc.global_default), "")

    @cached_property
    def _reservation_index(self) -> tuple[dict[tuple[str, str], list[ReservationView]],
                                          dict[str, list[ReservationView]], list[ReservationView]]:
        """Seed 003: usable reservations (Available, schedulable) bucketed so a pod is checked against few of them: an
        owner that needs a label value goes under one (key, value) it needs, an owner naming a pod under that
        name, any other owner in `always`."""
        by_label: dict[tuple[str, str], list[ReservationView]] = defaultdict(list)
        by_name: dict[str, list[ReservationView]] = defaultdict(list)
        always: list[ReservationView] = []
        for reservation in self.reservations.values():
            if reservation.phase != "Available" or reservation.unschedulable or reservation.second_writer:
                continue
            for owner in reservation.owners:
                selector = owner.get("labelSelector") if isinstance(owner, Mapping) else None
                obj = owner.get("object") if isinstance(owner, Mapping) else None
                match_labels = (selector or {}).get("matchLabels") if isinstance(selector, Mapping) else None
                # an owner of a shape no pod can match (a name that is not a string, ...) is still a candidate
                # (`always`): the matcher itself decides, and it matches nothing it cannot read
                if isinstance(obj, Mapping) and isinstance(obj.get("name"), str) and obj["name"]:
                    by_name[obj["name"]].append(reservation)
                elif (isinstance(match_labels, Mapping) and match_labels
                      and all(isinstance(k, str) and isinstance(v, str) for k, v in match_labels.items())):
                    key = min(match_labels)
                    by_label[(key, match_labels[key])].append(reservation)
                else:
                    always.append(reservation)
        return by_label, by_name, always

    def reservation_candidates(self, labels: Mapping[str, str], name: str) -> list[ReservationView]:
        """Seed 003: Reservations that may match a pod with these labels and name (a superset; check each)."""
        by_label, by_name, always = self._reservation_index
        seen: dict[str, ReservationView] = {r.key: r for r in always}  # key: names may repeat across sources
        for item in labels.items():
            for reservation in by_label.get(item, ()):
                seen[reservation.key] = reservation
        for reservation in by_name.get(name, ()):
            seen[reservation.key] = reservation
        return list(seen.values())
