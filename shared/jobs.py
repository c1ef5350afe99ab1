"""Who a pod belongs to (DESIGN section 1): its job, its queue, and whether it is a reserve pod.

Job: the Volcano PodGroup named by `scheduling.k8s.io/group-name`; else the pod's controlling ownerReference;
else the pod alone. Queue: PodGroup `spec.queue`, else `scheduling.volcano.sh/queue-name`, else `default`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared import keys
from shared.keys import LockKind, owner_id
from shared.views import PodGroupView, job_identity


@dataclass(frozen=True, slots=True)
class JobRef:
    namespace: str
    kind: str  # PodGroup, Job, ReplicaSet, ..., or Pod
    name: str

    @property
    def full_name(self) -> str:
        return keys.job_full_name(self.namespace, self.kind, self.name)

    @property
    def owner_id(self) -> str:
        return owner_id(LockKind.JOB, self.full_name)


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def job_of(pod: Mapping[str, Any], namespace: str) -> JobRef | None:
    """The pod's job; None for a standalone pod whose name is not known yet (generateName at admission)."""
    identity = job_identity(_meta(pod))
    return JobRef(namespace, *identity) if identity else None


def podgroup_of(pod: Mapping[str, Any], namespace: str,
                podgroups: Mapping[tuple[str, str], PodGroupView]) -> PodGroupView | None:
    group = (_meta(pod).get("annotations") or {}).get(keys.GROUP_NAME)
    return podgroups.get((namespace, group)) if group else None


def queue_of(pod: Mapping[str, Any], podgroup: PodGroupView | None) -> str:
    if podgroup is not None and podgroup.queue:
        return podgroup.queue
    return (_meta(pod).get("annotations") or {}).get(keys.QUEUE_NAME) or keys.DEFAULT_QUEUE


def queue_owner_id(queue: str) -> str:
    return owner_id(LockKind.QUEUE, queue)


def window_owner_id(window: str) -> str:
    return owner_id(LockKind.WINDOW, window)


def reservation_owner_id(reservation: str) -> str:
    return owner_id(LockKind.RESERVATION, reservation)
