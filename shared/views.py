"""Read-only views of the Kubernetes objects Reservoir reads: only the fields it uses, parsed once.

Each view is built from the object's JSON (a dict, as the API returns it) by `from_obj`. Quantities become
exact integers, timestamps become aware datetimes, annotations stay strings.

`from_obj` is total in one sense: for any JSON at all it either returns a view or raises `ViewError`, whose message
names the object and the field (`PodGroup ns/pg: spec.minMember: expected an integer, got 'x'`); a field of the wrong
type is never let through to fail later in the planner or the webhook. The watch caches skip (and name) an object
that raises it. Raw subtrees a view keeps (a Reservation's template, owners and status) are refused when nested more
than `MAX_DEPTH` levels, so that nothing recursive (==, copy, json.dumps) can meet Python's recursion limit later.
A few fields are tolerated instead of refused where a fallback is the better answer: an unreadable
`volcano.sh/maximum-runtime` reads as none (the webhook refuses bad ones; the pod still counts), and a Reservation
owner that is not an object is dropped (it could match nothing anyway; shared.matching is total over the rest).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Any, TypeVar

from shared import keys
from shared.backfill import Grant, Room, read_grants, read_room, runtime_of
from shared.duration import parse_duration
from shared.ownership import KUEUE_POD_GROUP, daemonset_node, is_daemonset_pod, job_identity
from shared.predicates import DEFAULT_SCHEDULER, NodeAffinity, Placement, required_node_affinity
from shared.resources import EMPTY, Resources, is_best_effort, pod_requests
from shared.timestamps import FIRST_YEAR, LAST_YEAR, in_range, parse_time

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TERMINAL = frozenset(("Succeeded", "Failed"))  # pod phases that hold nothing
RESERVOIR_GATES = (keys.BACKFILL_GATE, keys.HANDOVER_GATE)  # the scheduling gates Reservoir's webhook adds
_NO_GRANTS: Mapping[str, Grant] = MappingProxyType({})  # shared by every node without backfill grants


MAX_WORKLOAD_PODS = 100_000  # pods of one Kueue pod set Reservoir reads (Kueue's own are int32)
MAX_DEPTH = 64  # nesting of a kept raw subtree; Kubernetes objects nest about 20 deep at most (managedFields)
MAX_EXPONENT = 100  # decimal exponent of a number read exactly (`_fraction`): a percentage is in [0, 1]
_V = TypeVar("_V")


class ViewError(ValueError):
    """An object Reservoir cannot read: the message names the object, the field and what is wrong with it; `detail`
    is the same without the object (for a report that names the object already), `kind` the object's kind."""

    def __init__(self, message: str, detail: str | None = None, kind: str = "") -> None:
        super().__init__(message)
        self.detail = detail if detail is not None else message
        self.kind = kind


def _described(value: Any) -> str:
    """A value as an error message shows it: short scalars quoted, anything else by its JSON type."""
    if isinstance(value, bool) or value is None:
        return "true" if value is True else "false" if value is False else "null"
    if isinstance(value, (int, float)):
        return f"the number {value}" if abs(value) < 1e15 else "a large number"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    """A JSON object; {} when absent (null)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ViewError(f"{path}: expected an object, got {_described(value)}")
    return value


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(obj.get("metadata"), "metadata")


def _array(value: Any, path: str) -> Sequence[Any]:
    """A JSON array; () when absent."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ViewError(f"{path}: expected a list, got {_described(value)}")
    return value


def _objects(value: Any, path: str) -> tuple[Mapping[str, Any], ...]:
    """A JSON array of objects."""
    items = _array(value, path)
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ViewError(f"{path}[{i}]: expected an object, got {_described(item)}")
    return tuple(items)


def _text(value: Any, path: str, default: str = "") -> str:
    """A JSON string; `default` when absent or empty."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise ViewError(f"{path}: expected a string, got {_described(value)}")
    return value or default


def _strings(value: Any, path: str) -> dict[str, str]:
    """A map of strings to strings (labels, annotations, nodeSelector)."""
    out = dict(_mapping(value, path))
    for key, item in out.items():
        if not isinstance(item, str):
            raise ViewError(f"{path}[{key!r}]: expected a string, got {_described(item)}")
    return out


def _integer(value: Any, path: str, default: int) -> int:
    """A JSON integer within int64 (or an integral number, or a string of one, as before); `default` when absent."""
    if value is None:
        return default
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and 0 < len(value.strip()) <= 20:
        try:
            number = int(value)
        except ValueError:
            pass
    if number is None or not -(2**63) <= number < 2**63:
        raise ViewError(f"{path}: expected an integer (64 bits), got {_described(value)}")
    return number


def _flag(value: Any, path: str, default: bool = False) -> bool:
    """A JSON boolean; `default` when absent."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ViewError(f"{path}: expected true or false, got {_described(value)}")
    return value


def _time(value: Any, path: str) -> datetime | None:
    """An RFC 3339 timestamp with a zone; None when absent."""
    if value is None or value == "":
        return None
    try:
        moment = parse_time(_text(value, path))
    except ValueError:
        moment = None
    if not in_range(moment):
        raise ViewError(f"{path}: expected an RFC 3339 time (2026-11-22T10:17:00Z) between the years {FIRST_YEAR} and "
                        f"{LAST_YEAR}, got {_described(value)}")
    return moment


def _resources(value: Any, path: str) -> Resources:
    """A ResourceList; the error names the resource and quotes the quantity."""
    quantities = _mapping(value, path)
    try:
        return Resources.parse(quantities)
    except ValueError:
        for name, amount in quantities.items():
            try:
                Resources.parse({name: amount})
            except ValueError as err:
                raise ViewError(f"{path}.{name}: {err}") from None
        raise


def _computed(path: str, compute: Callable[[], _V]) -> _V:
    """`compute()` reading the subtree at `path` through code that knows nothing of views: any error names `path`."""
    try:
        return compute()
    except ViewError:
        raise
    except Exception as err:
        raise ViewError(f"{path}: {err}") from None


def _shallow(value: Any, path: str) -> Any:
    """`value`, refused when it nests deeper than MAX_DEPTH (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, Mapping) else item if isinstance(item, (list, tuple)) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            raise ViewError(f"{path}: nested more than {MAX_DEPTH} levels deep")
        stack.extend((child, depth + 1) for child in children)
    return value


def _identity(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "(no metadata)"
    name, namespace = meta.get("name"), meta.get("namespace")
    shown = name if isinstance(name, str) and name else "(no name)"
    return f"{namespace}/{shown}" if isinstance(namespace, str) and namespace else shown


def _readable(kind: str) -> Callable[[Callable[[Any, Mapping[str, Any]], _V]], Callable[[Any, Mapping[str, Any]], _V]]:
    """Make a `from_obj` total: any error reading the object becomes a ViewError naming `kind`, the object and,
    where the reader knows it, the field."""
    def wrap(build: Callable[[Any, Mapping[str, Any]], _V]) -> Callable[[Any, Mapping[str, Any]], _V]:
        @functools.wraps(build)
        def from_obj(cls: Any, obj: Mapping[str, Any]) -> _V:
            if not isinstance(obj, Mapping):
                raise ViewError(f"{kind}: expected an object, got {_described(obj)}", kind=kind)
            try:
                return build(cls, obj)
            except ViewError as err:
                raise ViewError(f"{kind} {_identity(obj)}: {err.detail}", err.detail, kind) from None
            except Exception as err:  # a bug here, or RecursionError: still this one object only
                why = f"unreadable: {type(err).__name__}: {str(err)[:200]}"
                raise ViewError(f"{kind} {_identity(obj)}: {why}", why, kind) from None
        return from_obj
    return wrap


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
    # The kubelet says the node is up: no Ready condition other than "True" and no not-ready / unreachable taint
    # (the node lifecycle controller's). A node reporting no Ready condition at all yet counts as ready, as
    # kube-scheduler, which reads taints and not conditions, would place pods on it.
    ready: bool = True
    control_plane: bool = False  # labelled as a control-plane node (keys.CONTROL_PLANE_LABELS, any value)
    # issue 17: the agent's backfill grants on this node, by pod uid (shared.backfill; keys.BACKFILL_GRANTS)
    backfill_grants: Mapping[str, Grant] = field(default_factory=dict)
    # metadata.uid: what a kubelet's mirror pod names in its ownerReference to this node (guarantee.Witnesses)
    uid: str = ""
    # issue 30: the agent's note of this locked node's backfill room (shared.backfill.Room; keys.BACKFILL_ROOM)
    backfill_room: Room | None = None

    @classmethod
    @_readable("Node")
    def from_obj(cls, obj: Mapping[str, Any]) -> NodeView:
        meta = _meta(obj)
        spec = _mapping(obj.get("spec"), "spec")
        status = _mapping(obj.get("status"), "status")
        taints = tuple(
            Taint(_text(t.get("key"), f"spec.taints[{i}].key"), _text(t.get("value"), f"spec.taints[{i}].value"),
                  _text(t.get("effect"), f"spec.taints[{i}].effect"))
            for i, t in enumerate(_objects(spec.get("taints"), "spec.taints"))
        )
        ready = not any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") != "True"
                        for c in _array(status.get("conditions"), "status.conditions"))
        ready = ready and not any(t.key in keys.NOT_READY_TAINTS for t in taints)
        labels = _strings(meta.get("labels"), "metadata.labels")
        annotations = _strings(meta.get("annotations"), "metadata.annotations")
        return cls(
            name=_text(meta.get("name"), "metadata.name"),
            labels=labels,
            annotations=annotations,
            taints=taints,
            allocatable=_resources(status.get("allocatable"), "status.allocatable"),
            unschedulable=_flag(spec.get("unschedulable"), "spec.unschedulable"),
            created=_time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or EPOCH,
            ready=ready,
            control_plane=any(label in labels for label in keys.CONTROL_PLANE_LABELS),
            backfill_grants=(read_grants(annotations[keys.BACKFILL_GRANTS]) if keys.BACKFILL_GRANTS in annotations
                             else _NO_GRANTS),
            uid=_text(meta.get("uid"), "metadata.uid"),
            backfill_room=read_room(annotations.get(keys.BACKFILL_ROOM)),
        )

    @property
    def lock_owner(self) -> str | None:
        """The owner id of Reservoir's lock on this node, if any: the value of its lock taint (`reservoir.sh/lock`),
        else of any other taint Reservoir writes (keys.LOCK_TAINT_KEYS: a lone `reservoir.sh/lock-exclusive`, its
        lock taint removed by hand or never written after a crash, is a lock too, so it is found and reconciled)."""
        other: str | None = None
        for taint in self.taints:
            if taint.effect != keys.LOCK_EFFECT:
                continue
            if taint.key == keys.LOCK:
                return taint.value
            if other is None and taint.key in keys.LOCK_TAINT_KEYS:
                other = taint.value
        return other

    @property
    def drain_owner(self) -> str | None:
        """The owner id of Reservoir's soft-drain taint on this node (keys.DRAIN), None when it has none. Any taint with
        that key counts as Reservoir's, whatever its effect: "" (no owner id is empty) when they are not exactly one
        with keys.DRAIN_EFFECT, so the plan rewrites them."""
        found = [t for t in self.taints if t.key == keys.DRAIN]
        if not found:
            return None
        if len(found) == 1 and found[0].effect == keys.DRAIN_EFFECT and found[0].value:
            return found[0].value
        return ""


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool


def _owner_refs(refs: Sequence[Mapping[str, Any]]) -> tuple[OwnerRef, ...]:
    """`metadata.ownerReferences` (already read as objects), each field checked and named in an error."""
    return tuple(OwnerRef(_text(o.get("apiVersion"), f"metadata.ownerReferences[{i}].apiVersion"),
                          _text(o.get("kind"), f"metadata.ownerReferences[{i}].kind"),
                          _text(o.get("name"), f"metadata.ownerReferences[{i}].name"),
                          _text(o.get("uid"), f"metadata.ownerReferences[{i}].uid"),
                          _flag(o.get("controller"), f"metadata.ownerReferences[{i}].controller"))
                 for i, o in enumerate(refs))


def _unschedulable_since(status: Mapping[str, Any]) -> datetime | None:
    """When kube-scheduler last found no node for the pod (PodScheduled False, Unschedulable), or None; a condition
    that is not an object, or a time that is not one, reads as none."""
    for condition in _array(status.get("conditions"), "status.conditions"):
        if (isinstance(condition, Mapping) and condition.get("type") == "PodScheduled"
                and condition.get("status") == "False" and condition.get("reason") == "Unschedulable"):
            raw = condition.get("lastTransitionTime")
            try:
                return parse_time(raw) if isinstance(raw, str) else None
            except ValueError:
                return None
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
    scheduler_name: str = DEFAULT_SCHEDULER
    node_selector: Mapping[str, str] = field(default_factory=dict)
    maximum_runtime: timedelta | None = None  # `volcano.sh/maximum-runtime`; None when absent or unreadable
    job: tuple[str, str, str] = ("", "Pod", "")  # (namespace, kind, name) of its job, see ownership.job_identity
    daemon: bool = False  # controlled by a DaemonSet (ownership.is_daemonset_pod)
    daemon_node: str = ""  # a DaemonSet pod's one node (ownership.daemonset_node), for repair; "" otherwise
    # required node affinity, parsed once (shared.predicates.required_node_affinity); None without one
    required_affinity: NodeAffinity | None = None
    gated: bool = False  # `spec.schedulingGates` non-empty: kube-scheduler does not try to place it (not starving)
    # among its gates is Reservoir's handover gate (keys.HANDOVER_GATE): an owner of a Reservation waiting for the
    # agent to hand it over (seed 003, reservations.handovers)
    handover_gated: bool = False
    # issue 17: among its gates is Reservoir's backfill gate (keys.BACKFILL_GATE): held for the agent's backfill choice
    backfill_gated: bool = False
    other_gates: bool = False  # a gate that is not Reservoir's backfill gate (backfill lets only such a pod go)
    # a gate that is neither of Reservoir's (someone else holds it back: a Reservation's handover does not claim it)
    foreign_gates: bool = False
    # spec.terminationGracePeriodSeconds (Kubernetes' default 30): how long the kubelet may take to stop it
    termination_grace: int = 30
    # spec.activeDeadlineSeconds, None without one
    active_deadline: int | None = None
    # kube-scheduler found no node for it since then (condition PodScheduled False, reason Unschedulable); None else
    unschedulable_since: datetime | None = None
    # metadata.deletionTimestamp: when a graceful deletion under way ends (its grace period counted in); None else
    deletion_deadline: datetime | None = None
    # "namespace/name", set once (__post_init__): the planner reads it hundreds of thousands of times per plan
    key: str = field(init=False, repr=False, compare=False)
    # its Placement, built at the first ask (`placement`) and kept: a pending pod's is asked by every plan
    _placement: Placement | None = field(init=False, default=None, repr=False, compare=False)

    @classmethod
    @_readable("Pod")
    def from_obj(cls, obj: Mapping[str, Any]) -> PodView:
        meta = _meta(obj)
        spec = _mapping(obj.get("spec"), "spec")
        status = _mapping(obj.get("status"), "status")
        name = _text(meta.get("name"), "metadata.name")
        namespace = _text(meta.get("namespace"), "metadata.namespace")
        annotations = _strings(meta.get("annotations"), "metadata.annotations")
        owner_refs = _objects(meta.get("ownerReferences"), "metadata.ownerReferences")
        daemon = _computed("metadata.ownerReferences", lambda: is_daemonset_pod(meta))
        return cls(
            namespace=namespace,
            name=name,
            uid=_text(meta.get("uid"), "metadata.uid"),
            labels=_strings(meta.get("labels"), "metadata.labels"),
            annotations=annotations,
            node_name=_text(spec.get("nodeName"), "spec.nodeName"),
            phase=_text(status.get("phase"), "status.phase", "Pending"),
            requests=_computed("spec (resources)", lambda: pod_requests(spec)),
            best_effort=_computed("spec (resources)", lambda: is_best_effort(spec)),
            priority=_integer(spec.get("priority"), "spec.priority", 0),
            priority_class_name=_text(spec.get("priorityClassName"), "spec.priorityClassName"),
            tolerations=_objects(spec.get("tolerations"), "spec.tolerations"),
            owners=_owner_refs(owner_refs),
            created=_time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or EPOCH,
            started=_time(status.get("startTime"), "status.startTime"),
            deleting=bool(meta.get("deletionTimestamp")),
            scheduler_name=_text(spec.get("schedulerName"), "spec.schedulerName", DEFAULT_SCHEDULER),
            node_selector=_strings(spec.get("nodeSelector"), "spec.nodeSelector"),
            maximum_runtime=runtime_of(annotations),
            job=(namespace, *(_computed("metadata", lambda: job_identity(meta, spec)) or ("Pod", name))),
            daemon=daemon,
            daemon_node=daemonset_node(spec) if daemon and not spec.get("nodeName") else "",
            required_affinity=required_node_affinity(spec),
            gated=bool(gates := _array(spec.get("schedulingGates"), "spec.schedulingGates")),
            handover_gated=any(isinstance(g, Mapping) and g.get("name") == keys.HANDOVER_GATE for g in gates),
            backfill_gated=any(isinstance(g, Mapping) and g.get("name") == keys.BACKFILL_GATE for g in gates),
            other_gates=any(not isinstance(g, Mapping) or g.get("name") != keys.BACKFILL_GATE for g in gates),
            foreign_gates=any(not isinstance(g, Mapping) or g.get("name") not in RESERVOIR_GATES for g in gates),
            termination_grace=max(0, _integer(spec.get("terminationGracePeriodSeconds"),
                                              "spec.terminationGracePeriodSeconds", 30)),
            active_deadline=_integer(spec.get("activeDeadlineSeconds"), "spec.activeDeadlineSeconds", 0) or None,
            unschedulable_since=_unschedulable_since(status),
            deletion_deadline=_time(meta.get("deletionTimestamp"), "metadata.deletionTimestamp"),
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.namespace}/{self.name}")

    @property
    def placement(self) -> Placement:
        """Where kube-scheduler may place the pod (shared.predicates.schedulable_on), from its nodeSelector, required
        node affinity and tolerations; built at the first ask and kept with the view (views are immutable)."""
        placement = self._placement
        if placement is None:
            placement = Placement.of(node_selector=self.node_selector, affinity=self.required_affinity,
                                     tolerations=self.tolerations)
            object.__setattr__(self, "_placement", placement)
        return placement

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
    # seed 004, "set annotation ... in podgroup": `volcano.sh/reserveable` is "true", and `volcano.sh/maximum-runtime`
    # parsed once (None when absent or unreadable: ignored, never an error, as on a pod)
    reserveable: bool = False
    maximum_runtime: timedelta | None = None

    @classmethod
    @_readable("PodGroup")
    def from_obj(cls, obj: Mapping[str, Any]) -> PodGroupView:
        meta = _meta(obj)
        spec = _mapping(obj.get("spec"), "spec")
        annotations = _strings(meta.get("annotations"), "metadata.annotations")
        return cls(
            namespace=_text(meta.get("namespace"), "metadata.namespace"),
            name=_text(meta.get("name"), "metadata.name"),
            uid=_text(meta.get("uid"), "metadata.uid"),
            annotations=annotations,
            min_member=_integer(spec.get("minMember"), "spec.minMember", 1) or 1,
            queue=_text(spec.get("queue"), "spec.queue", keys.DEFAULT_QUEUE),
            priority_class_name=_text(spec.get("priorityClassName"), "spec.priorityClassName"),
            created=_time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or EPOCH,
            reserveable=annotations.get(keys.RESERVEABLE) == "true",
            maximum_runtime=runtime_of(annotations),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _fraction(value: Any, path: str) -> Fraction | None:
    """A finite JSON number (or a string of one, as before), exactly as written: 0.29 is 29/100, not the binary float
    nearest to it (seed 002's floor(nodes x percentage) must not lose a node to rounding). A JSON float is read back
    through its shortest repr, which is the text the API server stored (it keeps float64's shortest form); the
    exponent is bounded, so no number can make an enormous integer. None when absent."""
    if value is None:
        return None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool) and len(str(value)) <= 40:
        try:
            number = Decimal(repr(value) if isinstance(value, float) else str(value).strip())
        except ArithmeticError:  # decimal.InvalidOperation: not a number
            number = Decimal("NaN")
        if number.is_finite() and abs(number.adjusted()) <= MAX_EXPONENT:
            return Fraction(number)
    raise ViewError(f"{path}: expected a number, got {_described(value)}")


MAX_ANNOTATION_JSON = 4096  # characters of a JSON annotation read; a percentage naming every dimension fits in 1 KiB
PERCENTAGE_EXAMPLE = '{"dimensions": ["cpu", "memory"], "value": 0.5}'


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def parse_percentage_annotation(text: str) -> Mapping[str, Any]:
    """Seed 002 `spec.guarantee.percentage` in its annotation form, `reservoir.sh/guarantee-percentage` (Volcano's Queue
    schema prunes the field): the same object written as JSON, `{"dimensions": ["cpu", "memory"], "value": 0.5}`.
    Returns the object with its fields unchecked (the caller reads or validates them as it does the field's); raises
    ValueError, quoting the value and giving the form, when the text is not a JSON object (NaN and Infinity are not
    JSON; more than MAX_ANNOTATION_JSON characters, or nesting too deep to parse, is refused, never a crash)."""
    if len(text) > MAX_ANNOTATION_JSON:
        problem = f"longer than {MAX_ANNOTATION_JSON} characters"
    else:
        try:
            parsed = json.loads(text, parse_constant=_not_json)
        except RecursionError:
            problem = "nested too deep"
        except ValueError as err:  # json.JSONDecodeError is one
            problem = f"not JSON ({err})"
        else:
            if isinstance(parsed, Mapping):
                return parsed
            problem = "not a JSON object"
    raise ValueError(f"{_described(text)} is {problem}: expected a JSON object such as {PERCENTAGE_EXAMPLE}")


def _annotation_path(key: str) -> str:
    return f'metadata.annotations["{key}"]'


MAX_POD_SETS = 8  # Kueue's own limit on a Workload's podSets (its CRD's maxItems)


def _true_condition(conditions: Sequence[Mapping[str, Any]], kind: str, path: str) -> datetime | None:
    """When the condition of type `kind` last became True (EPOCH when it is True with no time), or None when it is not
    True."""
    for i, condition in enumerate(conditions):
        if condition.get("type") == kind and condition.get("status") == "True":
            return _time(condition.get("lastTransitionTime"), f"{path}[{i}].lastTransitionTime") or EPOCH
    return None


def _workload_owner(meta: Mapping[str, Any]) -> tuple[str, str]:
    """The job a Workload stands for, as shared.ownership names jobs: its controller ownerReference's (kind, name) (a
    `batch/v1` Job, or the one pod of Kueue's pod integration); else, for the Workload of a pod group (Kueue's
    annotation `kueue.x-k8s.io/is-group-workload: "true"`, owned by every pod of the group, none its controller),
    the group of its name; else ("", "")."""
    controller = next((o for o in _owner_refs(_objects(meta.get("ownerReferences"), "metadata.ownerReferences"))
                       if o.controller), None)
    if controller is not None:
        return (controller.kind, controller.name)
    if _strings(meta.get("annotations"), "metadata.annotations").get(keys.KUEUE_IS_GROUP_WORKLOAD) == "true":
        return (KUEUE_POD_GROUP, _text(meta.get("name"), "metadata.name"))
    return ("", "")


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """Issue 32: a Kueue Workload (`kueue.x-k8s.io/v1beta2`) as the planner reads it, the Workload of the job its
    controller ownerReference names (workloads_by_owner). Kueue writes its status: the
    ClusterQueue that admitted it and the pods it admitted per pod set (`status.admission`), and its conditions
    (`Admitted`, `Evicted`, `Finished`, `PodsReady`). `count`: the pods admitted (the sum of the pod set
    assignments' counts; before admission the pod sets' own counts). `priority`: `spec.priority`, the value Kueue
    resolved from the WorkloadPriorityClass or PriorityClass (None when unset). `admitted_at`: when `Admitted` last
    became True (None while not admitted)."""

    namespace: str
    name: str
    uid: str
    created: datetime
    queue_name: str  # spec.queueName: the LocalQueue
    cluster_queue: str  # status.admission.clusterQueue ("" when not admitted)
    count: int
    priority: int | None = None
    admitted_at: datetime | None = None
    evicted: bool = False
    finished: bool = False
    # the job it stands for (_workload_owner): its controller ownerReference's (kind, name), or a pod group's, ("", "")
    owner: tuple[str, str] = ("", "")
    # of its annotations, only Reservoir's estimate (keys.EXPECTED_START): a cache holds no more of what others wrote
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    @_readable("Workload")
    def from_obj(cls, obj: Mapping[str, Any]) -> WorkloadView:
        meta = _meta(obj)
        spec = _mapping(obj.get("spec"), "spec")
        status = _mapping(obj.get("status"), "status")
        admission = _mapping(status.get("admission"), "status.admission")
        pod_sets = _objects(spec.get("podSets"), "spec.podSets")
        assigned = _objects(admission.get("podSetAssignments"), "status.admission.podSetAssignments")
        if len(pod_sets) > MAX_POD_SETS or len(assigned) > MAX_POD_SETS:
            raise ViewError(f"spec.podSets: at most {MAX_POD_SETS} pod sets, as Kueue allows")
        wanted = [_integer(p.get("count"), f"spec.podSets[{i}].count", 1) for i, p in enumerate(pod_sets)]
        given = [_integer(a.get("count"), f"status.admission.podSetAssignments[{i}].count", 0)
                 for i, a in enumerate(assigned)]
        for path, counts in (("spec.podSets", wanted), ("status.admission.podSetAssignments", given)):
            if any(c < 0 or c > MAX_WORKLOAD_PODS for c in counts):
                raise ViewError(f"{path}: expected a count between 0 and {MAX_WORKLOAD_PODS} pods per pod set")
        conditions = _objects(status.get("conditions"), "status.conditions")
        priority = spec.get("priority")
        return cls(
            namespace=_text(meta.get("namespace"), "metadata.namespace"),
            name=_text(meta.get("name"), "metadata.name"),
            uid=_text(meta.get("uid"), "metadata.uid"),
            created=_time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or EPOCH,
            queue_name=_text(spec.get("queueName"), "spec.queueName"),
            cluster_queue=_text(admission.get("clusterQueue"), "status.admission.clusterQueue"),
            count=max(1, sum(given if assigned else wanted)),
            priority=None if priority is None else _integer(priority, "spec.priority", 0),
            admitted_at=_true_condition(conditions, "Admitted", "status.conditions"),
            evicted=_true_condition(conditions, "Evicted", "status.conditions") is not None,
            finished=_true_condition(conditions, "Finished", "status.conditions") is not None,
            owner=_workload_owner(meta),
            annotations={k: v for k, v in _strings(meta.get("annotations"), "metadata.annotations").items()
                         if k == keys.EXPECTED_START},
        )

    @property
    def admitted(self) -> bool:
        """Admitted by Kueue to a ClusterQueue, and neither evicted since nor finished: its pods may run."""
        return self.admitted_at is not None and bool(self.cluster_queue) and not self.evicted and not self.finished


def workloads_by_owner(views: Iterable[WorkloadView]) -> dict[tuple[str, str, str], WorkloadView]:
    """Issue 32: each job's Kueue Workload, by the job's (namespace, kind, name) as shared.ownership names jobs: the
    Workload whose controller ownerReference is that job's controller (a `batch/v1` Job) or the pod itself (Kueue's
    pod integration), in the same namespace. Two for one job (a Workload replaced, the old one not yet gone): the
    admitted one, else the newest."""
    out: dict[tuple[str, str, str], WorkloadView] = {}
    for view in views:
        if not view.owner[0] or not view.owner[1]:
            continue
        key = (view.namespace, *view.owner)
        held = out.get(key)
        if held is None or (view.admitted, view.created, view.name) > (held.admitted, held.created, held.name):
            out[key] = view
    return out


@dataclass(frozen=True, slots=True)
class NativePodGroupView:
    """Issue 32: a Kubernetes PodGroup (`scheduling.k8s.io/v1alpha2`, Kubernetes 1.36 with the GenericWorkload feature
    gate), the group a pod's `spec.schedulingGroup.podGroupName` names. `min_count`: its gang policy's `minCount` (1
    under the basic policy: each pod on its own); `priority`: `spec.priority` (the value of its PriorityClass, as the
    API server resolved it), None when unset."""

    namespace: str
    name: str
    uid: str
    created: datetime
    min_count: int
    priority: int | None = None

    @classmethod
    @_readable("PodGroup")
    def from_obj(cls, obj: Mapping[str, Any]) -> NativePodGroupView:
        meta = _meta(obj)
        spec = _mapping(obj.get("spec"), "spec")
        policy = _mapping(spec.get("schedulingPolicy"), "spec.schedulingPolicy")
        gang = _mapping(policy.get("gang"), "spec.schedulingPolicy.gang")
        min_count = _integer(gang.get("minCount"), "spec.schedulingPolicy.gang.minCount", 1)
        if not 1 <= min_count <= MAX_WORKLOAD_PODS:
            raise ViewError(f"spec.schedulingPolicy.gang.minCount: expected 1 to {MAX_WORKLOAD_PODS}, got {min_count}")
        priority = spec.get("priority")
        return cls(
            namespace=_text(meta.get("namespace"), "metadata.namespace"),
            name=_text(meta.get("name"), "metadata.name"),
            uid=_text(meta.get("uid"), "metadata.uid"),
            created=_time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or EPOCH,
            min_count=min_count,
            priority=None if priority is None else _integer(priority, "spec.priority", 0),
        )


@dataclass(frozen=True, slots=True)
class Guarantee:
    """Queue `spec.guarantee` (seed 002), each field from the spec or, where Volcano's schema prunes it, from its
    annotation (QueueView.from_obj)."""

    policy: str = "Best-Effort"
    resource: Resources = EMPTY
    percentage_dimensions: tuple[str, ...] = ()
    percentage_value: Fraction | None = None  # exact (`_fraction`)


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

    @property
    def locks_guarantee(self) -> bool:
        """Seed 002: the Queue has a `spec.guarantee` and the admin opted it into node locks (annotation
        `reservoir.sh/lock-guarantee: "true"`, an annotation since Volcano's schema prunes unknown spec fields).
        Without it Reservoir locks nothing for the guarantee: in a Volcano cluster it is Volcano's quota floor."""
        return self.guarantee is not None and self.annotations.get(keys.QUEUE_LOCK_GUARANTEE) == "true"

    @property
    def locks_exclusively(self) -> bool:
        """Seed 002 policy `Guaranteed`, opted in: its locks carry `reservoir.sh/lock-exclusive` besides the lock
        taint, so the BestEffort exemption does not reach them (pods it would let in would only be evicted again)."""
        return self.locks_guarantee and self.guarantee is not None and self.guarantee.policy == "Guaranteed"

    @classmethod
    @_readable("Queue")
    def from_obj(cls, obj: Mapping[str, Any]) -> QueueView:
        """The Queue's fields; those Volcano's Queue schema does not declare (kube-apiserver prunes them) are read from
        their annotation when the spec lacks them, the spec field winning when both are set (it is what Reservoir's
        own CRD declares; the webhook warns that the annotation is ignored):

            spec.priorityClassName         reservoir.sh/priority-class         (QueueView.class_name)
            spec.guarantee.policy          reservoir.sh/guarantee-policy       Best-Effort | Guaranteed
            spec.guarantee.percentage      reservoir.sh/guarantee-percentage   the same object as JSON

        An annotation is read as strictly as its field: an unreadable percentage makes the Queue unreadable (ViewError
        naming the annotation), an empty annotation counts as absent."""
        meta = _meta(obj)
        spec = _mapping(obj.get("spec"), "spec")
        annotations = _strings(meta.get("annotations"), "metadata.annotations")
        raw = _mapping(spec.get("guarantee"), "spec.guarantee")
        policy = _text(raw.get("policy"), "spec.guarantee.policy") or annotations.get(keys.QUEUE_GUARANTEE_POLICY, "")
        where, written = "spec.guarantee.percentage", raw.get("percentage")
        if written is None and annotations.get(keys.QUEUE_GUARANTEE_PERCENTAGE):
            where = _annotation_path(keys.QUEUE_GUARANTEE_PERCENTAGE)
            try:
                written = parse_percentage_annotation(annotations[keys.QUEUE_GUARANTEE_PERCENTAGE])
            except ValueError as err:
                raise ViewError(f"{where}: {err}") from None
        guarantee = None
        if raw.get("resource") or written or policy:
            percentage = _mapping(written, where)
            dimensions = _array(percentage.get("dimensions"), f"{where}.dimensions")
            if not all(isinstance(d, str) for d in dimensions):
                raise ViewError(f"{where}.dimensions: expected a list of strings")
            guarantee = Guarantee(
                policy=policy or "Best-Effort",
                resource=_resources(raw.get("resource"), "spec.guarantee.resource"),
                percentage_dimensions=tuple(dimensions),
                percentage_value=_fraction(percentage.get("value"), f"{where}.value"),
            )
        status = _mapping(obj.get("status"), "status")
        reservation = status.get("reservation")
        return cls(
            name=_text(meta.get("name"), "metadata.name"),
            uid=_text(meta.get("uid"), "metadata.uid"),
            annotations=annotations,
            weight=_integer(spec.get("weight"), "spec.weight", 1) or 1,
            priority=None if spec.get("priority") is None else _integer(spec.get("priority"), "spec.priority", 0),
            priority_class_name=_text(spec.get("priorityClassName"), "spec.priorityClassName"),
            capability=_resources(spec.get("capability"), "spec.capability"),
            guarantee=guarantee,
            created=_time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or EPOCH,
            deserved=_resources(spec.get("deserved"), "spec.deserved"),
            reservation=None if reservation is None else _shallow(_mapping(reservation, "status.reservation"),
                                                                  "status.reservation"),
        )


@dataclass(frozen=True, slots=True)
class PriorityClassView:
    name: str
    value: int
    global_default: bool
    preemption_policy: str

    @classmethod
    @_readable("PriorityClass")
    def from_obj(cls, obj: Mapping[str, Any]) -> PriorityClassView:
        return cls(
            name=_text(_meta(obj).get("name"), "metadata.name"),
            value=_integer(obj.get("value"), "value", 0),
            global_default=_flag(obj.get("globalDefault"), "globalDefault"),
            preemption_policy=_text(obj.get("preemptionPolicy"), "preemptionPolicy", "PreemptLowerPriority"),
        )


def _template_spec(template: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Reservation's `spec.template.spec`, with the fields the planner reads to place it checked for shape: nodeName,
    nodeSelector, required node affinity terms and tolerations."""
    spec = _mapping(template.get("spec"), "spec.template.spec")
    _text(spec.get("nodeName"), "spec.template.spec.nodeName")
    _strings(spec.get("nodeSelector"), "spec.template.spec.nodeSelector")
    _objects(spec.get("tolerations"), "spec.template.spec.tolerations")
    affinity = _mapping(spec.get("affinity"), "spec.template.spec.affinity")
    node_affinity = _mapping(affinity.get("nodeAffinity"), "spec.template.spec.affinity.nodeAffinity")
    where = "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = _mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"), where)
    for i, term in enumerate(_objects(required.get("nodeSelectorTerms"), f"{where}.nodeSelectorTerms")):
        _objects(term.get("matchExpressions"), f"{where}.nodeSelectorTerms[{i}].matchExpressions")
    return spec


def _order(labels: Mapping[str, str]) -> int:
    """Koordinator's `reservation-order` label (issue 18): an integer, lower preferred; 0 (or unreadable, or absent)
    means no preference."""
    text = labels.get(keys.KOORDINATOR_RESERVATION_ORDER, "")
    if len(text) > 20:
        return 0
    try:
        return int(text)
    except ValueError:
        return 0


def _status_writer(meta: Mapping[str, Any]) -> str:
    """The field manager of the latest write to the object's status subresource (metadata.managedFields; "" when
    none): how a second writer of a Koordinator Reservation shows (issue 18, docs/tasks/koordinator.md).
    managedFields times have whole seconds: of writes in the same second, another manager's wins over Reservoir's."""
    latest: tuple[str, bool, str] = ("", False, "")
    for entry in _array(meta.get("managedFields"), "metadata.managedFields"):
        if not isinstance(entry, Mapping) or entry.get("subresource") != "status":
            continue
        when, manager = entry.get("time"), entry.get("manager")
        if isinstance(when, str) and isinstance(manager, str):
            latest = max(latest, (when, manager != keys.KOORDINATOR_FIELD_MANAGER, manager))
    return latest[2]


RESERVOIR_SOURCE = keys.RESERVATION_GROUP  # ReservationView.source: which API group the object is of
KOORDINATOR_SOURCE = keys.KOORDINATOR_GROUP


@dataclass(frozen=True, slots=True)
class ReservationView:
    """A `reservations.reservoir.sh` object (seed 003), or, when the config serves them, a
    `reservations.scheduling.koordinator.sh` one (issue 18: one model, two sources). `key` tells them apart (a name may
    be used in both groups): it is the name for Reservoir's own, `scheduling.koordinator.sh/<name>` for Koordinator's,
    and is what the planner keys holdings, owner ids and statuses by."""

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
    # where the template lets it be placed (nodeName, nodeSelector, required node affinity, tolerations), parsed once
    placement: Placement = field(default_factory=Placement)
    source: str = RESERVOIR_SOURCE
    taints: tuple[Taint, ...] = ()  # spec.taints (Koordinator's field): tolerated through the affinity's tolerations
    order: int = 0  # Koordinator's reservation-order label: among several that fit, the lowest non-zero first
    status_writer: str = ""  # the field manager of the last status write (Koordinator's source only)

    @property
    def key(self) -> str:
        return self.name if self.source == RESERVOIR_SOURCE else f"{self.source}/{self.name}"

    @property
    def api_version(self) -> str:
        return keys.RESERVATION_API_VERSION if self.source == RESERVOIR_SOURCE else keys.KOORDINATOR_API_VERSION

    @property
    def second_writer(self) -> str:
        """Issue 18: the field manager, not Reservoir's, that last wrote a Koordinator Reservation's status ("" when
        none did, or for Reservoir's own Reservations): while there is one, Reservoir leaves the object alone."""
        if self.source == RESERVOIR_SOURCE or self.status_writer in ("", keys.KOORDINATOR_FIELD_MANAGER):
            return ""
        return self.status_writer

    @classmethod
    @_readable("Reservation")
    def from_obj(cls, obj: Mapping[str, Any]) -> ReservationView:
        return cls._read(obj, RESERVOIR_SOURCE)

    @classmethod
    @_readable("Reservation")
    def from_koordinator(cls, obj: Mapping[str, Any]) -> ReservationView:
        """A `scheduling.koordinator.sh/v1alpha1` Reservation (issue 18)."""
        return cls._read(obj, KOORDINATOR_SOURCE)

    @classmethod
    def _read(cls, obj: Mapping[str, Any], source: str) -> ReservationView:
        meta = _meta(obj)
        spec = _mapping(obj.get("spec"), "spec")
        status = _shallow(_mapping(obj.get("status"), "status"), "status")
        template = _shallow(_mapping(spec.get("template"), "spec.template"), "spec.template")
        template_spec = _template_spec(template)
        ttl_text = _text(spec.get("ttl"), "spec.ttl")
        expires = _time(spec.get("expires"), "spec.expires")
        try:
            ttl = parse_duration(ttl_text) if ttl_text else (None if expires else timedelta(hours=24))
        except ValueError as err:
            raise ViewError(f"spec.ttl: {err}") from None
        labels = _strings(meta.get("labels"), "metadata.labels")
        taints = tuple(
            Taint(_text(t.get("key"), f"spec.taints[{i}].key"), _text(t.get("value"), f"spec.taints[{i}].value"),
                  _text(t.get("effect"), f"spec.taints[{i}].effect"))
            for i, t in enumerate(_objects(spec.get("taints"), "spec.taints")))
        return cls(
            name=_text(meta.get("name"), "metadata.name"),
            uid=_text(meta.get("uid"), "metadata.uid"),
            labels=labels,
            source=source,
            taints=taints,
            order=_order(labels),
            status_writer=_status_writer(meta) if source != RESERVOIR_SOURCE else "",
            template=template,
            requests=_computed("spec.template.spec (resources)", lambda: pod_requests(template_spec)),
            # an owner that is not an object could match nothing: dropped (module docstring)
            owners=tuple(o for o in _shallow(_array(spec.get("owners"), "spec.owners"), "spec.owners")
                         if isinstance(o, Mapping)),
            ttl=ttl if ttl else None,
            expires=expires,
            pre_allocation=_flag(spec.get("preAllocation"), "spec.preAllocation"),
            allocate_once=_flag(spec.get("allocateOnce"), "spec.allocateOnce", default=True),
            allocate_policy=_text(spec.get("allocatePolicy"), "spec.allocatePolicy"),
            unschedulable=_flag(spec.get("unschedulable"), "spec.unschedulable"),
            phase=_text(status.get("phase"), "status.phase", "Pending"),
            node_name=_text(status.get("nodeName"), "status.nodeName"),
            created=_time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or EPOCH,
            status=dict(status),
            placement=Placement.of(node_name=_text(template_spec.get("nodeName"), "spec.template.spec.nodeName"),
                                   node_selector=_strings(template_spec.get("nodeSelector"),
                                                          "spec.template.spec.nodeSelector"),
                                   affinity=required_node_affinity(template_spec),
                                   tolerations=_objects(template_spec.get("tolerations"),
                                                        "spec.template.spec.tolerations")),
        )
