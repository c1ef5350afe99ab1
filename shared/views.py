"""Read-only views of the Kubernetes objects Reservoir reads: only the fields it uses, parsed once.

Each view is built from the object's JSON (a dict, as the API returns it) by `from_obj`. Quantities become
exact integers, timestamps become aware datetimes, annotations stay strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from shared import keys
from shared.duration import parse_duration
from shared.ownership import is_daemonset_pod, job_identity
from shared.resources import EMPTY, Resources, is_best_effort, pod_requests
from shared.timestamps import parse_time

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TERMINAL = frozenset(("Succeeded", "Failed"))  # pod phases that hold nothing


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    taints: tuple[Taint, ...]
    allocatable: Resources
    unschedulable: bool
    created: datetime

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> NodeView:
        meta = _meta(obj)
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        return cls(
            name=meta.get("name", ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            taints=tuple(
                Taint(t.get("key", ""), t.get("value", ""), t.get("effect", "")) for t in spec.get("taints") or ()
            ),
            allocatable=Resources.parse(status.get("allocatable")),
            unschedulable=bool(spec.get("unschedulable")),
            created=parse_time(meta.get("creationTimestamp")) or EPOCH,
        )

    @property
    def lock_owner(self) -> str | None:
        """The owner id of Reservoir's lock taint on this node, if any."""
        for taint in self.taints:
            if taint.key == keys.LOCK and taint.effect == keys.LOCK_EFFECT:
                return taint.value
        return None


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool


def _runtime(annotations: Mapping[str, str]) -> timedelta | None:
    """`volcano.sh/maximum-runtime`, parsed once; None when absent or unreadable (the webhook rejects bad ones)."""
    text = annotations.get(keys.MAXIMUM_RUNTIME)
    if not text:
        return None
    try:
        return parse_duration(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class PodView:
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node_name: str
    phase: str
    requests: Resources
    best_effort: bool
    priority: int
    priority_class_name: str
    tolerations: tuple[Mapping[str, Any], ...]
    owners: tuple[OwnerRef, ...]
    created: datetime
    started: datetime | None
    deleting: bool
    scheduler_name: str = "default-scheduler"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    maximum_runtime: timedelta | None = None  # `volcano.sh/maximum-runtime`; None when absent or unreadable
    job: tuple[str, str, str] = ("", "Pod", "")  # (namespace, kind, name) of its job, see ownership.job_identity
    daemon: bool = False  # controlled by a DaemonSet (ownership.is_daemonset_pod)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> PodView:
        meta = _meta(obj)
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            node_name=spec.get("nodeName") or "",
            phase=status.get("phase") or "Pending",
            requests=pod_requests(spec),
            best_effort=is_best_effort(spec),
            priority=int(spec.get("priority") or 0),
            priority_class_name=spec.get("priorityClassName") or "",
            tolerations=tuple(spec.get("tolerations") or ()),
            owners=tuple(
                OwnerRef(o.get("apiVersion", ""), o.get("kind", ""), o.get("name", ""), o.get("uid", ""),
                         bool(o.get("controller")))
                for o in meta.get("ownerReferences") or ()
            ),
            created=parse_time(meta.get("creationTimestamp")) or EPOCH,
            started=parse_time(status.get("startTime")),
            deleting=bool(meta.get("deletionTimestamp")),
            scheduler_name=spec.get("schedulerName") or "default-scheduler",
            node_selector=dict(spec.get("nodeSelector") or {}),
            maximum_runtime=_runtime(meta.get("annotations") or {}),
            job=(meta.get("namespace", ""), *(job_identity(meta) or ("Pod", meta.get("name", "")))),
            daemon=is_daemonset_pod(meta),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_bound(self) -> bool:
        return bool(self.node_name)

    @property
    def is_terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def holds_resources(self) -> bool:
        """Bound and not finished: counted against its node's allocatable, as kube-scheduler counts it."""
        return self.is_bound and not self.is_terminal

    @property
    def controller(self) -> OwnerRef | None:
        return next((o for o in self.owners if o.controller), None)

    @property
    def group_name(self) -> str:
        return self.annotations.get(keys.GROUP_NAME, "")

    @property
    def reserveable(self) -> bool:
        return self.annotations.get(keys.RESERVEABLE) == "true"


@dataclass(frozen=True, slots=True)
class PodGroupView:
    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    min_member: int
    queue: str
    priority_class_name: str
    created: datetime

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> PodGroupView:
        meta = _meta(obj)
        spec = obj.get("spec") or {}
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            annotations=dict(meta.get("annotations") or {}),
            min_member=int(spec.get("minMember") or 1),
            queue=spec.get("queue") or keys.DEFAULT_QUEUE,
            priority_class_name=spec.get("priorityClassName") or "",
            created=parse_time(meta.get("creationTimestamp")) or EPOCH,
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Guarantee:
    """Queue `spec.guarantee` (seed 002)."""

    policy: str = "Best-Effort"
    resource: Resources = EMPTY
    percentage_dimensions: tuple[str, ...] = ()
    percentage_value: float | None = None


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    uid: str
    annotations: Mapping[str, str]
    weight: int
    priority: int | None
    priority_class_name: str
    capability: Resources
    guarantee: Guarantee | None
    created: datetime
    deserved: Resources = EMPTY  # Volcano `spec.deserved`; empty when unset
    reservation: Mapping[str, Any] | None = None  # `status.reservation` as last written (seed 002)

    @property
    def class_name(self) -> str:
        """Seed 001: the queue's PriorityClass is `spec.priorityClassName`, else the `reservoir.sh/priority-class`
        annotation (for Queue CRDs without the field); "" when neither is set."""
        return self.priority_class_name or self.annotations.get(keys.QUEUE_PRIORITY_CLASS, "")

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> QueueView:
        meta = _meta(obj)
        spec = obj.get("spec") or {}
        raw = spec.get("guarantee") or {}
        guarantee = None
        if raw.get("resource") or raw.get("percentage") or raw.get("policy"):
            percentage = raw.get("percentage") or {}
            guarantee = Guarantee(
                policy=raw.get("policy") or "Best-Effort",
                resource=Resources.parse(raw.get("resource")),
                percentage_dimensions=tuple(percentage.get("dimensions") or ()),
                percentage_value=float(percentage["value"]) if "value" in percentage else None,
            )
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            annotations=dict(meta.get("annotations") or {}),
            weight=int(spec.get("weight") or 1),
            priority=spec.get("priority"),
            priority_class_name=spec.get("priorityClassName") or "",
            capability=Resources.parse(spec.get("capability")),
            guarantee=guarantee,
            created=parse_time(meta.get("creationTimestamp")) or EPOCH,
            deserved=Resources.parse(spec.get("deserved")),
            reservation=(obj.get("status") or {}).get("reservation"),
        )


@dataclass(frozen=True, slots=True)
class PriorityClassView:
    name: str
    value: int
    global_default: bool
    preemption_policy: str

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> PriorityClassView:
        return cls(
            name=_meta(obj).get("name", ""),
            value=int(obj.get("value") or 0),
            global_default=bool(obj.get("globalDefault")),
            preemption_policy=obj.get("preemptionPolicy") or "PreemptLowerPriority",
        )


@dataclass(frozen=True, slots=True)
class ReservationView:
    """A `reservations.reservoir.sh` object (seed 003)."""

    name: str
    uid: str
    labels: Mapping[str, str]
    template: Mapping[str, Any]
    requests: Resources
    owners: tuple[Mapping[str, Any], ...]
    ttl: timedelta | None
    expires: datetime | None
    pre_allocation: bool
    allocate_once: bool
    allocate_policy: str
    unschedulable: bool
    phase: str
    node_name: str
    created: datetime
    status: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> ReservationView:
        meta = _meta(obj)
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        template = spec.get("template") or {}
        ttl_text = spec.get("ttl")
        ttl = parse_duration(ttl_text) if ttl_text else (None if spec.get("expires") else timedelta(hours=24))
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            labels=dict(meta.get("labels") or {}),
            template=template,
            requests=pod_requests(template.get("spec") or {}),
            owners=tuple(spec.get("owners") or ()),
            ttl=ttl if ttl else None,
            expires=parse_time(spec.get("expires")),
            pre_allocation=bool(spec.get("preAllocation")),
            allocate_once=spec.get("allocateOnce", True) is not False,
            allocate_policy=spec.get("allocatePolicy") or "",
            unschedulable=bool(spec.get("unschedulable")),
            phase=status.get("phase") or "Pending",
            node_name=status.get("nodeName") or "",
            created=parse_time(meta.get("creationTimestamp")) or EPOCH,
            status=dict(status),
        )
