"""Every cluster write the agent makes, and nothing else: the planner decides, this module writes what it decided.

Each write is a small pure function that builds its body (or None when the cluster already says so), unit-tested,
and an async method of `Writer` that sends it through the client edge (`shared.kube`):

- node locks: `node_patch`, `Writer.set_lock` / `Writer.apply`
- lock tolerations a pending pod lacks (the plan's repairs): `repair_patch`, `Writer.repair`
- a Reservation's placeholder pods (seed 003): `placeholder_pod`, `Writer.write_placeholders`
- an owner's handover (seed 003): `narrow_patch` (node affinity and toleration), `ungate_patch`, `Writer.handover`
- backfill (issue 17): a gated pod narrowed to a locked node with its toleration and `deadline_patch`, or let go
  unchanged, `Writer.backfills`; the node's grants ride on the lock's patch (Plan.node_marks); a backfilled pod
  that started late has its deadline lowered, `Writer.cut_deadlines`
- a Queue's `status.reservation` (seed 002): `queue_status_patch`, `Writer.write_queues`
- `Guaranteed` evictions through the Eviction API: `eviction_body`, `Writer.evict`
- a Reservation's status (seed 003): `reservation_status_patch`, the owner annotation `allocated_annotation_patch`,
  the deletion of an ended one: `Writer.write_reservations`
- Events: `event_body`, `Writer.event`

A node's taints are one list, so a patch replaces the whole list: each node patch starts with a JSON Patch `test` of
`metadata.resourceVersion`, so a concurrent writer makes it fail, and the node is read again and the patch rebuilt
(up to MAX_ATTEMPTS). Taints, labels and annotations Reservoir did not write are kept as they are.

Fencing (issue 10): the Writer is given a `fence`, a function saying why this replica may not write now (None: it may;
the agent's says so while it holds the Lease and renewed it within the lease duration). It is asked before the whole
plan, before each sub-batch (node locks, repairs, Queue outputs, Reservation outputs), and again before every single
write, so a Lease lost in the middle of a batch stops the batch at the next write: a fenced writer writes nothing
(Events included) and logs why (`decision=fenced`).

Evictions (issue 10): each is checked again against the planner's guard rails (`guarantee.never_evicted`), and at
most `guarantee.maxEvictionsPerMinute` are made in any sliding minute (`EvictionBudget`); the rest are deferred to a
later reconcile (`decision=evict-deferred`, counted by `on_deferred`), which the agent schedules for when the window
has room again (`Writer.retry_after`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agent.planner.backfill import moved
from agent.planner.guarantee import (
    ALWAYS_PROTECTED_NAMESPACES,
    Witnesses,
    eviction_grace,
    never_evicted,
    protected_namespaces,
)
from agent.planner.model import (
    Backfill,
    BackfillPlan,
    DeadlineCut,
    EstimateMark,
    Handover,
    Lock,
    Placeholder,
    Plan,
    QueueGuaranteeStatus,
    Release,
    Repair,
    ReservationStatus,
    Snapshot,
    koordinator_allocated,
    lock_on,
)
from agent.planner.reservations import placeholder_of, ungate
from shared import keys
from shared.backfill import keep_unseen_grants
from shared.config import ReservoirConfig
from shared.jsonpatch import Op, add, pointer
from shared.keys import LockKind
from shared.kube import (
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    Conflict,
    Invalid,
    NotFound,
    Throttled,
    get_json,
    resource_path,
    send_json,
)
from shared.logs import decision, fields
from shared.predicates import NODE_NAME_FIELD
from shared.timestamps import parse_time, stamp
from shared.tolerations import lock_toleration, toleration_ops
from shared.views import NodeView, PodView, QueueView, ReservationView

log = logging.getLogger("reservoir.agent")
CLUSTER_SCOPED = frozenset(("Node", "Queue", "Reservation", "PriorityClass"))
# What `reservoir release` removes with a node's lock (set_lock's marks): the starvation cool-down record and the
# soft-drain taint, so nothing that keeps pods off the node or a job from locking is left. The backfill notes stay:
# they keep no pod off and only the agent reads them; a grant (keys.BACKFILL_GRANTS) states its backfilled pod's end
# and is kept while that pod runs, the room note (keys.BACKFILL_ROOM) is dropped by the agent's next plan from a node
# no longer locked. `reservoir uninstall` removes them too (agent/uninstall.py).
RELEASE_MARKS = (keys.LOCK_EXPIRED, keys.DRAIN)
VOLCANO_API_VERSION = keys.VOLCANO_API_VERSION
RESERVATION_API_VERSION = keys.RESERVATION_API_VERSION
MAX_ATTEMPTS = 5
# Node patches of one reconcile in flight at once (`Writer.apply`). Each is a GET and a PATCH of one node, so 16 keep a
# release of several locks within one or two round trips while staying far below the client's connection pool (100)
# and the API server's default max-mutating-requests-inflight (200), whatever the cluster size.
NODE_PATCHES_IN_FLIGHT = 16
POD_WRITES_IN_FLIGHT = 16  # pods let on or off the backfill gate written at once (Writer.backfills)
# issue 17: how long the backfill patches of one batch refused by the entitlement check (403) are tried again, all
# together: the webhook's node cache may not have the grants the same reconcile wrote to the nodes a moment before
GRANT_SEEN = 3.0
# issue 17: an object that refused an estimate annotation is not sent one again for this long unless the estimate
# moved (backfill.moved) from the refused one: a tenant's pod or PodGroup at its annotation size limit would otherwise
# cost a failing write at every plan. At most MAX_REFUSED_ESTIMATES objects remembered.
ESTIMATE_RETRY_SECONDS = 600.0
MAX_REFUSED_ESTIMATES = 10_000
# estimate annotations sent in one plan, at most (those refused before not counted): what a burst of owners, or a
# tenant moving many estimates at once, costs one plan's writes; the others go at the next plan, which these wake
MAX_ESTIMATE_WRITES = 100


# --- bodies (pure) ---

def _is_ours(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") in keys.LOCK_TAINT_KEYS and taint.get("effect") == keys.LOCK_EFFECT


def node_patch(node: Mapping[str, Any], desired: Lock | None,
               marks: Mapping[str, str | None] | None = None) -> list[Op] | None:
    """The JSON Patch that makes `node` carry `desired` (None: no lock) and Reservoir's other node marks as `marks`
    says (those not named are left as they are: Plan.node_marks): annotation -> text, or None to remove; and
    keys.DRAIN -> the soft-drain taint's owner id (every taint with that key replaced by the one `PreferNoSchedule`
    taint), or None to remove it. None when the node already carries them."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    taints = list(spec.get("taints") or [])
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    ops: list[Op] = []
    marks = dict(marks or {})
    drain_named = keys.DRAIN in marks
    drain = marks.pop(keys.DRAIN, None)

    wanted = [t for t in taints if not _is_ours(t) and not (drain_named and t.get("key") == keys.DRAIN)]
    if desired is not None:
        wanted.append({"key": keys.LOCK, "value": desired.owner, "effect": keys.LOCK_EFFECT})
        if desired.exclusive:  # seed 002 `Guaranteed`: the BestEffort exemption does not reach it
            wanted.append({"key": keys.LOCK_EXCLUSIVE, "value": desired.owner, "effect": keys.LOCK_EFFECT})
    if drain is not None:
        wanted.append({"key": keys.DRAIN, "value": drain, "effect": keys.DRAIN_EFFECT})
    if wanted != taints:
        if wanted:
            ops.append(add("/spec/taints", wanted))
        else:
            ops.append({"op": "remove", "path": "/spec/taints"})

    want_labels = {keys.LOCK: desired.owner, keys.LOCK_KIND: desired.kind.value} if desired else {}
    want_annotations = {keys.LOCK_INFO: desired.info_json()} if desired else {}
    want_annotations.update({key: text for key, text in marks.items() if text is not None})
    for current, wanted_items, field_name in ((labels, want_labels, "labels"),
                                              (annotations, want_annotations, "annotations")):
        ours = (keys.LOCK, keys.LOCK_KIND) if field_name == "labels" else (keys.LOCK_INFO, *marks)
        if current is None:
            if wanted_items:
                ops.append(add(pointer("metadata", field_name), dict(wanted_items)))
            continue
        for key in ours:
            if key in wanted_items and current.get(key) != wanted_items[key]:
                ops.append(add(pointer("metadata", field_name, key), wanted_items[key]))
            elif key not in wanted_items and key in current:
                ops.append({"op": "remove", "path": pointer("metadata", field_name, key)})
    if not ops:
        return None
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion", "")}] + ops


def repair_patch(repair: Repair) -> list[Op]:
    """The JSON Patch adding to the pod's tolerations those of `repair.add` it lacks ([] when it lacks none)."""
    return toleration_ops(list(repair.tolerations) or None, list(repair.add))


def placeholder_pod(placeholder: Placeholder, image: str) -> dict[str, Any]:
    """Seed 003: the placeholder pod holding what a Reservation has left on its node (model.Placeholder): bound with
    `spec.nodeName` (kube-scheduler is not asked: the planner found the room), in Reservoir's namespace (tenants cannot
    create or delete pods there), owned by the Reservation (deleted with it), at the `reservoir-placeholder`
    PriorityClass, tolerating every taint (it holds resources, it is no workload), limits equal to requests; hardened
    for the `restricted` Pod Security level."""
    quantities = placeholder.requests.to_quantities()
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": placeholder.name, "namespace": keys.NAMESPACE,
            "labels": {keys.PLACEHOLDER: placeholder.owner},
            "annotations": {keys.PLACEHOLDER_RESERVATION: placeholder.reservation},
            "ownerReferences": [{"apiVersion": placeholder.api_version, "kind": "Reservation",
                                 "name": placeholder.object_name or placeholder.reservation,
                                 "uid": placeholder.reservation_uid,
                                 "controller": True, "blockOwnerDeletion": False}],
        },
        "spec": {
            "nodeName": placeholder.node, "priorityClassName": keys.PLACEHOLDER_PRIORITY_CLASS,
            "tolerations": [{"operator": "Exists"}], "automountServiceAccountToken": False,
            "enableServiceLinks": False, "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65535, "runAsGroup": 65535,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "hold", "image": image,
                "resources": {"requests": quantities, "limits": quantities},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


def narrow_patch(pod: Mapping[str, Any], node: str, tolerate: Sequence[Mapping[str, str]]) -> list[Op]:
    """Seed 003 handover: the JSON Patch narrowing a gated pod's required node affinity to `node` (a matchFields
    `metadata.name In [node]` added to each term, or the one term when it has none: the additions Kubernetes allows
    while a pod is gated) and adding the lock tolerations of `tolerate` it lacks; [] when it says so already. Starts
    with a `test` of resourceVersion, so a concurrent edit makes it fail."""
    spec = pod.get("spec") or {}
    requirement = {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}
    required = {"nodeSelectorTerms": [{"matchFields": [requirement]}]}
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    needed = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(
        node_affinity, Mapping) else None
    terms = needed.get("nodeSelectorTerms") if isinstance(needed, Mapping) else None
    ops: list[Op] = []
    whole = {"requiredDuringSchedulingIgnoredDuringExecution": required}
    if not isinstance(affinity, Mapping):
        ops.append(add("/spec/affinity", {"nodeAffinity": whole}))
    elif not isinstance(node_affinity, Mapping):
        ops.append(add("/spec/affinity/nodeAffinity", whole))
    elif not terms:
        ops.append(add("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", required))
    else:
        base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
        for i, term in enumerate(terms):
            fields_ = term.get("matchFields") if isinstance(term, Mapping) else None
            if isinstance(fields_, list) and requirement in fields_:
                continue
            ops.append(add(f"{base}/{i}/matchFields/-", requirement) if isinstance(fields_, list)
                       else add(f"{base}/{i}/matchFields", [requirement]))
    ops += toleration_ops(spec.get("tolerations"), tolerate)
    if not ops:
        return []
    return [{"op": "test", "path": "/metadata/resourceVersion",
             "value": (pod.get("metadata") or {}).get("resourceVersion", "")}] + ops


def ungate_patch(pod: Mapping[str, Any], name: str = keys.HANDOVER_GATE) -> list[Op]:
    """Seed 003 (and issue 17's keys.BACKFILL_GATE): the JSON Patch removing Reservoir's gate `name` from a pod's
    schedulingGates, tested in place; [] when the pod lacks it."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    for i, gate in enumerate(gates):
        if isinstance(gate, Mapping) and gate.get("name") == name:
            path = f"/spec/schedulingGates/{i}"
            return [{"op": "test", "path": path, "value": dict(gate)}, {"op": "remove", "path": path}]
    return []


def since_created(pod: Mapping[str, Any]) -> float | None:
    """Seconds since the pod's creationTimestamp (set by the API server, not by the tenant), None without one: what a
    gate held it, once lifted (the handover and backfill histograms)."""
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return None if created is None else max(0.0, (datetime.now(UTC) - created).total_seconds())


def deadline_patch(pod: Mapping[str, Any], deadline: int) -> list[Op]:
    """Issue 17: the JSON Patch giving a backfilled pod `spec.activeDeadlineSeconds` = `deadline` (Kubernetes lets it
    be set, or lowered, on a running pod too); [] when the pod's own is as small already."""
    have = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if isinstance(have, int) and not isinstance(have, bool) and 0 < have <= deadline:
        return []
    return [add("/spec/activeDeadlineSeconds", deadline)]


def queue_reservation(outcome: QueueGuaranteeStatus | None) -> dict[str, Any] | None:
    """A Queue's `status.reservation` as planned: the locked nodes and the idle total on them, None without any."""
    if outcome is None or not outcome.nodes:
        return None
    return {"nodes": list(outcome.nodes), "resource": outcome.resource.to_quantities()}


def queue_status_patch(outcome: QueueGuaranteeStatus | None, queue: QueueView) -> dict[str, Any] | None:
    """The merge patch of a Queue's status that writes its planned `status.reservation` (null clears it once the
    guarantee is gone); None when the Queue already carries it."""
    want = queue_reservation(outcome)
    if want == (queue.reservation or None):
        return None
    return {"status": {"reservation": want}}


def reservation_status_patch(outcome: ReservationStatus, reservation: ReservationView) -> dict[str, Any] | None:
    """The merge patch of a Reservation's status that writes the planned one (its unset fields left as they are,
    `nodeName` always written, null when unplaced); None when the Reservation already carries it."""
    want = {k: v for k, v in outcome.status().items() if v is not None}
    have = {k: v for k, v in reservation.status.items() if k in want or k == "nodeName"}
    if want == have:
        return None
    return {"status": {**want, "nodeName": want.get("nodeName")}}


def allocated_annotation_patch(reservation: str, name: str = "", uid: str = "") -> dict[str, Any]:
    """The merge patch marking an owner pod as bound through `reservation` (its key):
    `reservoir.sh/reservation-allocated` and, issue 18, Koordinator's `scheduling.koordinator.sh/reservation-allocated`
    (JSON name and uid of the object)."""
    return {"metadata": {"annotations": {keys.RESERVATION_ALLOCATED: reservation,
                                         keys.KOORDINATOR_RESERVATION_ALLOCATED: koordinator_allocated(
                                             name or reservation, uid)}}}


def eviction_body(namespace: str, name: str, grace: int | None = None) -> dict[str, Any]:
    """A policy/v1 Eviction of one pod (its PodDisruptionBudgets apply), with `grace` seconds to stop when given
    (guarantee.eviction_grace; a pod being deleted with a longer grace period has it shortened)."""
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": name, "namespace": namespace}}
    if grace is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace}
    return body


def event_body(name: str, reason: str, message: str, *, now: datetime, component: str, kind: str = "Node",
               namespace: str = "default", event_type: str = "Normal", api_version: str = "v1",
               uid: str = "") -> dict[str, Any]:
    """A core/v1 Event on object `name` of `kind` (and `uid`, when known), recorded in `namespace` (a cluster-scoped
    object's Event names no namespace for the object); the message is cut at 1,000 characters."""
    involved = {"kind": kind, "name": name, "namespace": "" if kind in CLUSTER_SCOPED else namespace,
                "apiVersion": api_version}
    if uid:
        involved["uid"] = uid
    return {
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason, "message": message[:1000], "type": event_type,
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": stamp(now), "lastTimestamp": stamp(now),
        "count": 1,
    }


@dataclass(frozen=True)
class EventTarget:
    """The object an Event is about (its involvedObject)."""

    kind: str
    name: str
    namespace: str  # where the Event is recorded: the object's own, "default" for a cluster-scoped one
    api_version: str
    uid: str = ""


def owner_object(lock: Lock, snapshot: Snapshot | None = None) -> EventTarget | None:
    """DESIGN section 4 "Visibility": the object that owns a lock, for its NodeLocked / NodeReleased Events: a job's
    PodGroup, a guarantee's Queue, a Reservation (read from the lock's subject: `ns/PodGroup/name`, `queue/<name>`,
    `reservation/<name>`, as the planner writes them); None for any other job and for a window (an entry of the
    config, no object). With `snapshot`, the uid of the object when it is known (`kubectl describe` matches Events
    by it)."""
    parts = lock.subject.split("/")
    if lock.kind is LockKind.JOB and len(parts) == 3 and parts[1] == "PodGroup":
        group = snapshot.podgroups.get((parts[0], parts[2])) if snapshot is not None else None
        return EventTarget("PodGroup", parts[2], parts[0], VOLCANO_API_VERSION, group.uid if group else "")
    if lock.kind is LockKind.QUEUE and len(parts) == 2 and parts[0] == "queue" and parts[1]:
        queue = snapshot.queues.get(parts[1]) if snapshot is not None else None
        return EventTarget("Queue", parts[1], "default", VOLCANO_API_VERSION, queue.uid if queue else "")
    if lock.kind is LockKind.RESERVATION and len(parts) >= 2 and parts[0] == "reservation" and parts[-1]:
        key = "/".join(parts[1:])  # issue 18: a Koordinator Reservation's key is `scheduling.koordinator.sh/<name>`
        reservation = snapshot.reservations.get(key) if snapshot is not None else None
        if reservation is not None:
            return EventTarget("Reservation", reservation.name, "default", reservation.api_version, reservation.uid)
        if len(parts) == 2:
            return EventTarget("Reservation", parts[1], "default", RESERVATION_API_VERSION, "")
    return None


NO_WITNESSES = Witnesses({}, {})  # no mirror or DaemonSet claim is believed


def evict_refused(key: str, pods: Mapping[str, PodView] | None, protected: Collection[str],
                  witnesses: Witnesses = NO_WITNESSES) -> str | None:
    """The writer's last check of a planned eviction (`key` "namespace/name"): why the guard rails refuse it
    (guarantee.never_evicted, the pod's mirror or DaemonSet claim checked against `witnesses`), or None. With `pods`
    (the snapshot's, by key) the whole rule, and a pod not among them is refused; without, its namespace only."""
    namespace, _ = _split(key)
    if pods is None:
        return f"namespace {namespace} is protected" if namespace in protected else None
    pod = pods.get(key)
    if pod is None:
        return "not in the snapshot the plan was made from"
    return never_evicted(pod, protected, witnesses, datetime.now(UTC))


def _split(key: str) -> tuple[str, str]:
    namespace, name = key.split("/", 1)
    return namespace, name


# Failpoints for fault tests, right after the N-th successful node patch, in the middle of a reconcile:
# `RESERVOIR_FAILPOINT=exit-after-node-patches:N` makes the process die (exit 137, as SIGKILL would);
# `RESERVOIR_FAILPOINT=pause-after-node-patches:N:S` makes the reconcile wait S seconds there (once), the rest of the
# agent (Lease renewal, watches) running on, so a test can take the Lease away between two writes of one batch.
# Until it acts, `Writer.apply` writes nodes one at a time in name order, so "the N-th" is the N-th node and nothing
# else is in flight when it acts.
FAILPOINT = "RESERVOIR_FAILPOINT"
_EXIT_AFTER = "exit-after-node-patches:"
_PAUSE_AFTER = "pause-after-node-patches:"


@dataclass(frozen=True)
class Failpoint:
    action: str  # "exit" or "pause"
    after: int  # node patches
    seconds: float = 0.0  # how long a pause lasts


def _failpoint_from_env() -> Failpoint | None:
    value = os.environ.get(FAILPOINT, "")
    if not value:
        return None
    if value.startswith(_EXIT_AFTER) and value[len(_EXIT_AFTER):].isdigit():
        return Failpoint("exit", int(value[len(_EXIT_AFTER):]))
    count, _, seconds = value.removeprefix(_PAUSE_AFTER).partition(":")
    if value.startswith(_PAUSE_AFTER) and count.isdigit() and seconds.replace(".", "", 1).isdigit():
        return Failpoint("pause", int(count), float(seconds))
    raise ValueError(f"{FAILPOINT}={value!r}: expected {_EXIT_AFTER}N or {_PAUSE_AFTER}N:SECONDS with N a whole "
                     "number")


Fence = Callable[[], str | None]  # why this replica may not write now; None when it may


class Fenced(Exception):
    """A write refused because this replica's Lease is not fresh; the message says why."""


class EvictionBudget:
    """At most `per_minute` evictions in any sliding window of `window` seconds (guarantee.maxEvictionsPerMinute)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic, window: float = 60.0) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self.window = window
        self._made: deque[float] = deque()  # when each eviction in the window was made, oldest first

    def _expire(self) -> float:
        now = self.clock()
        while self._made and self._made[0] <= now - self.window:
            self._made.popleft()
        return now

    def allows(self) -> bool:
        """One more eviction fits in the window now."""
        self._expire()
        return len(self._made) < self.per_minute

    def spend(self) -> None:
        self._made.append(self._expire())

    def retry_after(self) -> float:
        """Seconds until the window has room for one more (0 when it has now; the full window when the limit is 0)."""
        now = self._expire()
        if len(self._made) < self.per_minute:
            return 0.0
        if not self._made or self.per_minute == 0:
            return self.window
        return max(self._made[len(self._made) - self.per_minute] + self.window - now, 0.0)


# --- sending ---

EVICTION_OUTCOMES = ("evicted", "gone", "blocked", "failed")  # Writer.evict's answers, and an API error

class Writer:
    """Sends the writes. `on_failure` is called once per failed node, pod, Queue or Reservation write (not for
    Events, which are best effort, nor for deletions); `on_fenced` once per batch a stale Lease kept from writing;
    `on_deferred` with the number of evictions put off by the per-minute limit; the agent counts them in metrics.
    `fence` (module docstring) says why this replica may not write now; without one it always may."""

    def __init__(self, api: client.ApiClient, component: str = "reservoir-agent",
                 on_failure: Callable[[], None] | None = None, *, fence: Fence | None = None,
                 on_fenced: Callable[[], None] | None = None, on_deferred: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, on_evicted: Callable[[str], None] | None = None,
                 on_handover: Callable[[str, float], None] | None = None,
                 on_backfill_gate: Callable[[str, float], None] | None = None) -> None:
        self.api = api
        self.component = component
        self.on_failure = on_failure
        self.fence = fence
        self.on_fenced = on_fenced
        self.on_deferred = on_deferred
        self.on_evicted = on_evicted  # each eviction's outcome, one of EVICTION_OUTCOMES
        self.on_handover = on_handover  # each gate lifted: how (handover, ungate), seconds since the pod's creation
        self.on_backfill_gate = on_backfill_gate  # each backfill gate lifted: outcome, seconds since the pod's creation
        self._grant_seen_by = 0.0  # until when this batch's backfill patches refused with 403 are tried again
        self.node_patches = 0
        self.failpoint = _failpoint_from_env()
        self._failpoint_armed = self.failpoint is not None  # until it acts, `apply` writes one node at a time
        self.protected: frozenset[str] = ALWAYS_PROTECTED_NAMESPACES  # namespaces never evicted from
        self.evictions = EvictionBudget(ReservoirConfig().guarantee.max_evictions_per_minute, clock=clock)
        self.retry_after: float | None = None  # evictions deferred: seconds until the window has room again
        self._queue_warnings: dict[str, str | None] = {}  # the refusal last reported per queue
        self._blocked_evictions: set[str] = set()  # evictions a budget blocks, reported once each
        self.placeholder_image = ReservoirConfig().reservations.placeholder_image
        self._left_alone: set[str] = set()  # uids of the Koordinator Reservations told LeftAlone (issue 18)
        self._clock = clock
        # objects that refused an estimate annotation (at their size limit, say): (kind, namespace, name) -> (the text
        # refused, when); not sent one again within ESTIMATE_RETRY_SECONDS unless the estimate moved
        self._estimates_refused: dict[tuple[str, str, str], tuple[str, float]] = {}

    def configure(self, config: ReservoirConfig) -> None:
        """The guard rails of evictions, from the config in force: protected namespaces, evictions per minute."""
        self.protected = protected_namespaces(config)
        self.evictions.per_minute = config.guarantee.max_evictions_per_minute
        self.placeholder_image = config.reservations.placeholder_image

    def _failed(self) -> None:
        if self.on_failure is not None:
            self.on_failure()

    # fencing

    def stale(self) -> str | None:
        """Why this replica may not write now (the fence's answer); None when it may."""
        return self.fence() if self.fence is not None else None

    def may_write(self, batch: str) -> bool:
        """Before a batch of writes: True when the fence allows writing; else log why, count it, and say False."""
        why = self.stale()
        if why is None:
            return True
        decision(log, "fenced", level=logging.WARNING, batch=batch, reason=why, done="writing nothing")
        if self.on_fenced is not None:
            self.on_fenced()
        return False

    async def _send(self, method: str, path: str, body: Any = None, *, content_type: str = JSON,
                    query: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        """Every write goes through here: refused (Fenced) when the fence says this replica may not write now."""
        why = self.stale()
        if why is not None:
            raise Fenced(why)
        return await send_json(self.api, method, path, body, content_type=content_type, query=query)

    # the whole plan

    async def write(self, result: Plan, snapshot: Snapshot, current: Mapping[str, Lock], dry_run: bool) -> None:
        """Make the cluster say what `result` says: Reservation outputs, node locks, repairs, placeholders, handovers,
        Queue outputs, in that order;
        with `dry_run`, only log the locks it would write. Nothing at all without a fresh Lease (the fence); a Lease
        lost in the middle stops the writes there."""
        if dry_run:
            self.report_dry_run(result.locks, current, result.node_marks)
            if self.may_write("plan"):  # a dry run holds no pod back: every handover and backfill gate is lifted
                gated = [p for p in snapshot.pods if p.handover_gated and not p.node_name]
                await self.handovers([ungate(p, "dryRun") for p in gated])
                await self.backfills(BackfillPlan(released=result.backfill.released))
            return
        if not self.may_write("plan"):
            return
        try:
            # Reservation statuses first: a handover's claim (status.currentOwners) is then read back no later than
            # the lock written for it, so the next plan cannot claim the pod again
            await self.write_reservations(result.reservations, snapshot.reservations)
            await self.apply(result.locks, current, result.node_marks, snapshot=snapshot)
            # before any pod write a tenant's pods can multiply (repairs, handovers, backfills): they keep owners'
            # promises, the rest can wait
            await self.cut_deadlines(result.backfill.cuts)
            await self.repair(result.repairs)
            await self.write_placeholders(result.placeholders,
                                          [p for p in snapshot.pods if placeholder_of(p) is not None])
            await self.handovers(result.handovers)
            await self.backfills(result.backfill)
            await self.estimates(result.backfill.estimate_marks)
            pods = {p.key: p for p in snapshot.pods} if any(g.evict for g in result.guarantees) else {}
            await self.write_queues(result.guarantees, snapshot.queues, pods=pods, witnesses=Witnesses.of(snapshot))
        except Fenced as err:
            self._stopped_mid_batch("plan", err)

    def _stopped_mid_batch(self, batch: str, err: Fenced) -> None:
        """A batch of writes (a plan's, a gate pass's) stopped by the fence: logged and counted."""
        decision(log, "fenced", level=logging.WARNING, batch=batch, reason=str(err),
                 done="stopped mid-batch, the rest left unwritten")
        if self.on_fenced is not None:
            self.on_fenced()

    async def write_gate(self, backfill: BackfillPlan, snapshot: Snapshot, current: Mapping[str, Lock],
                         dry_run: bool) -> None:
        """Issue 34, a gate pass (plan.plan_gate): the marks of the nodes pods are let onto (their grants, so the
        webhook's entitlement check accepts the lock's toleration), the locks on them left as they are; then each pod
        let on or let go (`backfills`). With `dry_run`, only the pods let go (all of them: plan_backfill lets every
        pod go). Nothing without a fresh Lease."""
        onto = {b.node for b in backfill.placed}
        held = {name: lock for name, lock in current.items() if name in onto}
        try:
            if dry_run:
                await self.backfills(BackfillPlan(released=backfill.released))
                return
            if not self.may_write("gate"):
                return
            await self.apply(held, held, {name: m for name, m in backfill.marks.items() if name in onto},
                             snapshot=snapshot)
            await self.backfills(backfill)
        except Fenced as err:
            self._stopped_mid_batch("gate", err)

    # node locks

    async def _patched(self, name: str) -> None:
        self.node_patches += 1
        point = self.failpoint
        if point is None or self.node_patches != point.after:
            return
        if point.action == "exit":
            log.warning("failpoint: exiting now, mid-reconcile",
                        extra=fields(node=name, failpoint=f"{_EXIT_AFTER}{point.after}"))
            logging.shutdown()
            os._exit(137)
        failpoint = f"{_PAUSE_AFTER}{point.after}:{point.seconds:g}"
        log.warning("failpoint: pausing mid-reconcile", extra=fields(node=name, failpoint=failpoint))
        await asyncio.sleep(point.seconds)
        log.warning("failpoint: resuming", extra=fields(node=name, failpoint=failpoint))
        self._failpoint_armed = False  # acted (once): later reconciles write nodes concurrently again

    async def _read_node(self, name: str) -> dict[str, Any] | None:
        try:
            return await get_json(self.api, resource_path("v1", "nodes", name))
        except NotFound:
            return None

    async def set_lock(self, name: str, desired: Lock | None, marks: Mapping[str, str | None] | None = None,
                       seen_grants: Set[str] | None = None) -> tuple[Lock | None, bool]:
        """Make node `name` carry `desired` (and `marks`, node_patch); returns (the lock it carried before, whether it
        was patched). `seen_grants`: the backfill grants' uids the plan saw on the node; a grant the node carries now
        that the plan did not see is kept (shared.backfill.keep_unseen_grants)."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            node = await self._read_node(name)
            if node is None:
                return None, False
            before = lock_on(NodeView.from_obj(node))
            if marks and keys.BACKFILL_GRANTS in marks and seen_grants is not None:
                current = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.BACKFILL_GRANTS)
                marks = {**marks, keys.BACKFILL_GRANTS: keep_unseen_grants(
                    marks[keys.BACKFILL_GRANTS], current if isinstance(current, str) else None, seen_grants)}
            ops = node_patch(node, desired, marks)
            if ops is None:
                return before, False
            try:
                await self._send("PATCH", resource_path("v1", "nodes", name), ops, content_type=JSON_PATCH)
                await self._patched(name)
                return before, True
            except (Conflict, Invalid):  # Invalid: the resourceVersion `test` failed, a concurrent write
                if attempt < MAX_ATTEMPTS:
                    log.info("conflict on patch: reading the node again", extra=fields(node=name, attempt=attempt))
                    continue
                raise
        return None, False

    def report_dry_run(self, desired: Mapping[str, Lock], current: Mapping[str, Lock],
                       marks: Mapping[str, Mapping[str, str | None]] | None = None) -> None:
        """`dryRun: true`: the lock writes `apply` would make, and the soft-drain taints (keys.DRAIN in `marks`),
        logged and not made."""
        for node, node_marks in sorted((marks or {}).items()):
            if keys.DRAIN in node_marks:
                owner = node_marks[keys.DRAIN]
                decision(log, "would-soft-drain" if owner else "would-remove-soft-drain", policy="starvation",
                         node=node, owner=owner or "", dryRun=True)
        for node, lock in sorted(desired.items()):
            if not lock.same_hold(current.get(node)):
                decision(log, "would-lock", policy=lock.kind.value, node=node, owner=lock.owner, reason=lock.reason,
                         subject=lock.subject, dryRun=True)
        for node in sorted(set(current) - set(desired)):
            decision(log, "would-release", policy=current[node].kind.value, node=node, owner=current[node].owner,
                     reason="no longer planned", dryRun=True)

    async def apply(self, desired: Mapping[str, Lock], current: Mapping[str, Lock],
                    marks: Mapping[str, Mapping[str, str | None]] | None = None, *,
                    snapshot: Snapshot | None = None) -> None:
        """Patch every node whose lock differs from `desired`, or whose marks (Plan.node_marks) must change, in one
        patch per node, with an Event on the node and on the owner when the lock changes hands.

        The nodes are written concurrently, at most NODE_PATCHES_IN_FLIGHT at a time (one at a time while a failpoint
        is armed), each on its own (`_apply_one`: its read-modify-write guarded by resourceVersion, its conflict
        retries, its Events after its patch); a node that fails is logged and counted and never stops the others. A
        fenced write (a Lease lost mid-batch) stops the nodes not yet sent, and `Fenced` is raised once every node is
        done; any other error escapes the same way, after the others finished."""
        if not self.may_write("node-locks"):
            return
        marks = marks or {}
        changed = []
        for name in sorted(set(desired) | set(current) | set(marks)):
            want = desired.get(name)
            have = current.get(name)
            unreadable = have.unreadable if have is not None else ""
            same = (want is None and have is None) or (want is not None and want.same_hold(have) and not unreadable)
            if not same or name in marks:
                changed.append(name)
        if not changed:
            return
        # with a failpoint armed, one node at a time in name order, as the fault tests expect: when it acts, exactly
        # the first N nodes are patched and no other patch is in flight
        limit = asyncio.Semaphore(1 if self._failpoint_armed else NODE_PATCHES_IN_FLIGHT)

        async def one(name: str) -> None:
            async with limit:
                await self._apply_one(name, desired.get(name), current.get(name), marks.get(name), snapshot)

        outcomes = await asyncio.gather(*(one(name) for name in changed), return_exceptions=True)
        errors = [(name, err) for name, err in zip(changed, outcomes, strict=True) if isinstance(err, BaseException)]
        if not errors:
            return
        fenced = [err for _, err in errors if isinstance(err, Fenced)]
        raised = fenced[0] if fenced else errors[0][1]
        for name, err in errors:  # the one raised is reported by the caller; the others here
            if err is not raised and not isinstance(err, Fenced):
                decision(log, "patch-failed", level=logging.WARNING, node=name, error=repr(err))
        raise raised

    async def _apply_one(self, name: str, want: Lock | None, have: Lock | None,
                         marks: Mapping[str, str | None] | None, snapshot: Snapshot | None) -> None:
        """One node of `apply`: its patch, then its log lines and Events. An API error is logged and counted here;
        `Fenced` (and anything unexpected) is left to `apply`."""
        why = self.stale()  # a Lease lost while this node waited for its turn: not even read
        if why is not None:
            raise Fenced(why)
        unreadable = have.unreadable if have is not None else ""
        seen = snapshot.nodes.get(name) if snapshot is not None else None
        try:
            before, patched = await self.set_lock(name, want, marks,
                                                  set(seen.backfill_grants) if seen is not None else None)
        except ApiException as err:
            self._failed()
            decision(log, "patch-failed", level=logging.WARNING, node=name, status=err.status, reason=err.reason)
            return
        if not patched:
            return
        if unreadable:  # hand-edited: this node alone was read with defaults; its annotation is now rewritten
            done = "rewritten" if want is not None else "removed with the lock"
            decision(log, "lock-info-unreadable", level=logging.WARNING, node=name, owner=have.owner if have else "",
                     reason=unreadable, done=done)
            await self.event(name, "LockInfoUnreadable", f"{unreadable}: the lock was read with defaults for "
                             f"those fields; the annotation was {done}", event_type="Warning")
        if before is not None and (want is None or before.owner != want.owner):
            decision(log, "release", policy=before.kind.value, node=name, owner=before.owner,
                     reason=f"handed to {want.owner}" if want is not None else "no longer planned",
                     subject=before.subject)
            await self.event(name, "NodeReleased", f"released from {before.kind.value} {before.subject}")
            await self.owner_event(before, "NodeReleased", f"node {name} released", snapshot)
        if want is not None and (before is None or before.owner != want.owner):
            decision(log, "lock", policy=want.kind.value, node=name, owner=want.owner, reason=want.reason,
                     subject=want.subject)
            await self.event(name, "NodeLocked", f"locked for {want.kind.value} {want.subject}: {want.reason}")
            await self.owner_event(want, "NodeLocked", f"node {name} locked for it: {want.reason}", snapshot)

    # pods

    async def repair(self, repairs: Sequence[Repair]) -> None:
        """DESIGN section 4 "Repair": add to each pending pod the lock tolerations the plan found it lacking."""
        if repairs and not self.may_write("repairs"):
            return
        for repair in repairs:
            ops = repair_patch(repair)
            if not ops:
                continue
            try:
                await self._send("PATCH", resource_path("v1", "pods", repair.name, repair.namespace), ops,
                                 content_type=JSON_PATCH)
                decision(log, "repair", pod=f"{repair.namespace}/{repair.name}",
                         owner=[t["value"] for t in repair.add], reason="lock held for its owner but not tolerated")
            except ApiException as err:
                self._failed()
                decision(log, "repair-failed", level=logging.WARNING, pod=f"{repair.namespace}/{repair.name}",
                         status=err.status, reason=err.reason)

    async def write_placeholders(self, desired: Sequence[Placeholder], standing: Sequence[PodView]) -> None:
        """Seed 003: make the placeholder pods those of `desired`: the others (a resized one's old size, a
        Reservation's that ended, one that failed) deleted first, then the missing ones created."""
        want = {p.name: p for p in desired}
        doomed = [p for p in standing if not p.deleting and (p.name not in want or p.is_terminal)]
        have = {p.name for p in standing if not p.is_terminal}
        missing = [p for name, p in sorted(want.items()) if name not in have]
        if (doomed or missing) and not self.may_write("placeholders"):
            return
        for pod in doomed:
            try:
                await self._send("DELETE", resource_path("v1", "pods", pod.name, pod.namespace),
                                 query=(("gracePeriodSeconds", "0"),))
                decision(log, "placeholder-deleted", policy="reservation", pod=pod.key, node=pod.node_name,
                         reservation=pod.annotations.get(keys.PLACEHOLDER_RESERVATION, ""))
            except NotFound:
                pass
            except ApiException as err:
                self._failed()
                decision(log, "placeholder-delete-failed", level=logging.WARNING, pod=pod.key, status=err.status,
                         reason=err.reason)
        for placeholder in missing:
            try:
                await self._send("POST", resource_path("v1", "pods", namespace=keys.NAMESPACE),
                                 placeholder_pod(placeholder, self.placeholder_image))
                decision(log, "placeholder-created", policy="reservation", reservation=placeholder.reservation,
                         node=placeholder.node, pod=f"{keys.NAMESPACE}/{placeholder.name}",
                         requests=placeholder.requests.to_quantities())
            except Conflict:
                pass  # already there (the cache was behind): the next plan sees it
            except ApiException as err:
                self._failed()
                decision(log, "placeholder-create-failed", level=logging.WARNING, reservation=placeholder.reservation,
                         node=placeholder.node, status=err.status, reason=err.reason)

    async def handovers(self, handovers: Sequence[Handover]) -> None:
        """Seed 003: each gated owner either narrowed to its Reservation's node and let go, or only let go."""
        if handovers and not self.may_write("handovers"):
            return
        for handover in handovers:
            await self._pod_step("handover-failed", handover.key, self.handover(handover))

    async def _pod_step(self, failed: str, key: str, step: Awaitable[Any]) -> None:
        """One object's write of a batch (a pod's, a PodGroup's): one gone meanwhile is skipped; any other API error
        is logged as `failed` and counted, and never stops the batch."""
        try:
            await step
        except NotFound:
            pass
        except ApiException as err:
            self._failed()
            decision(log, failed, level=logging.WARNING, pod=key, status=err.status, reason=err.reason)

    async def handover(self, handover: Handover) -> None:
        """One pod: read it (it must still be the pod planned for, by uid), narrow it when `handover.node` is set,
        then lift the gate."""
        path = resource_path("v1", "pods", handover.name, handover.namespace)
        pod = await get_json(self.api, path)
        if handover.uid and (pod.get("metadata") or {}).get("uid") != handover.uid:
            return
        if handover.node:
            ops = narrow_patch(pod, handover.node, handover.tolerate)
            if ops:
                pod = await self._send("PATCH", path, ops, content_type=JSON_PATCH)
        ops = ungate_patch(pod)
        if ops:
            await self._send("PATCH", path, ops, content_type=JSON_PATCH)
            waited = since_created(pod)
            if self.on_handover is not None and waited is not None:
                self.on_handover("handover" if handover.node else "ungate", waited)
        decision(log, "handover" if handover.node else "ungate", policy="reservation", pod=handover.key,
                 reservation=handover.reservation or None, node=handover.node or None, reason=handover.reason)

    async def backfills(self, plan: BackfillPlan) -> None:
        """Issue 17: each pod the plan lets onto a locked node (`backfill`) and each it lets go unchanged (`release`),
        POD_WRITES_IN_FLIGHT at a time; a pod that fails is logged and counted, never stops the others."""
        if not (plan.placed or plan.released) or not self.may_write("backfill"):
            return
        items: list[Backfill | Release] = [*plan.placed, *plan.released]
        self._grant_seen_by = time.monotonic() + GRANT_SEEN  # one budget for the batch: refusals cannot stall it
        limit = asyncio.Semaphore(POD_WRITES_IN_FLIGHT)  # issue 34: a burst on the gate is not written one by one

        async def one(item: Backfill | Release) -> None:
            async with limit:
                await self._pod_step("backfill-failed", item.key,
                                     self.release(item) if isinstance(item, Release) else self.backfill(item))

        outcomes = await asyncio.gather(*(one(item) for item in items), return_exceptions=True)
        errors = [err for err in outcomes if isinstance(err, BaseException)]
        if errors:  # Fenced first (the others stopped at their next write too), else the first unexpected error
            raised = next((err for err in errors if isinstance(err, Fenced)), errors[0])
            if isinstance(raised, asyncio.CancelledError):  # one write cancelled, not this batch: an error like others
                raise RuntimeError("a backfill write was cancelled") from raised
            raise raised

    async def backfill(self, chosen: Backfill) -> None:
        """One pod let onto a locked node: read it (the very pod planned for, by uid, still gated), narrow its node
        affinity to the node, add the lock's toleration and its deadline in one patch (tested against its
        resourceVersion), lift the gate, and tell it in a `Backfilled` Event. The node's grant was written before
        (Plan.node_marks); the entitlement check accepts the toleration because of it, once the webhook's node
        cache has it: a refusal (403) meanwhile is tried again for up to GRANT_SEEN seconds."""
        pod_view = chosen.pod
        path = resource_path("v1", "pods", pod_view.name, pod_view.namespace)
        pod = await get_json(self.api, path)
        if (pod.get("metadata") or {}).get("uid") != pod_view.uid or not ungate_patch(pod, keys.BACKFILL_GATE):
            return
        ops = narrow_patch(pod, chosen.node, (lock_toleration(chosen.owner),))
        more = deadline_patch(pod, chosen.deadline)
        if more:
            ops = (ops or [{"op": "test", "path": "/metadata/resourceVersion",
                            "value": (pod.get("metadata") or {}).get("resourceVersion", "")}]) + more
        if ops:
            while True:
                try:
                    pod = await self._send("PATCH", path, ops, content_type=JSON_PATCH)
                    break
                except ApiException as err:
                    if err.status != 403 or time.monotonic() >= self._grant_seen_by:
                        raise
                    await asyncio.sleep(0.2)
        await self._send("PATCH", path, ungate_patch(pod, keys.BACKFILL_GATE), content_type=JSON_PATCH)
        self._gate_lifted("backfilled", pod)
        message = (f"backfills node {chosen.node} locked for {chosen.owner}: activeDeadlineSeconds {chosen.deadline}, "
                   f"to end by {stamp(chosen.ends)} (the node is needed at {stamp(chosen.needed_by)})")
        await self.event(pod_view.name, "Backfilled", message, kind="Pod", namespace=pod_view.namespace,
                         uid=pod_view.uid)
        decision(log, "backfill", policy="backfill", pod=pod_view.key, node=chosen.node, owner=chosen.owner,
                 deadline=chosen.deadline, until=stamp(chosen.ends), reason=chosen.reason)

    async def cut_deadlines(self, cuts: Sequence[DeadlineCut]) -> None:
        """Issue 17: each backfilled pod that started late given the lower activeDeadlineSeconds the plan says
        (backfill.deadline_cuts), read first (the very pod, by uid; `deadline_patch` writes nothing when its own is as
        small already), with a `BackfillDeadlineCut` Event; a pod that fails is logged and counted, never stops the
        others."""
        for cut in cuts:
            if not self.may_write("backfill"):
                return
            await self._pod_step("backfill-failed", cut.key, self.cut_deadline(cut))

    async def cut_deadline(self, cut: DeadlineCut) -> None:
        pod_view = cut.pod
        if cut.ungranted:
            # the plan saw no grant naming the pod: the node read again first, since the agent's cache may not show a
            # grant it has just written there (backfill.deadline_cuts); no cut if one names it or the lock changed
            node = NodeView.from_obj(await get_json(self.api, resource_path("v1", "nodes", cut.node)))
            if pod_view.uid in node.backfill_grants or node.lock_owner != cut.owner:
                return
        path = resource_path("v1", "pods", pod_view.name, pod_view.namespace)
        pod = await get_json(self.api, path)
        ops = deadline_patch(pod, cut.deadline)
        if (pod.get("metadata") or {}).get("uid") != pod_view.uid or not ops:
            return
        # the very pod: one made again under the name between the read and the patch is not touched
        guard = [{"op": "test", "path": "/metadata/uid", "value": pod_view.uid}]
        await self._send("PATCH", path, guard + ops, content_type=JSON_PATCH)
        started = stamp(pod_view.started) if pod_view.started is not None else "?"
        if cut.ungranted:
            message = (f"started at {started} on {cut.node}, locked for {cut.owner} since {stamp(cut.until)}, with no "
                       f"backfill grant (the one it was narrowed for ended before it bound): activeDeadlineSeconds "
                       f"lowered from {pod_view.active_deadline} to {cut.deadline}")
        else:
            message = (f"started at {started}, later than its backfill slot on {cut.node} allowed: "
                       f"activeDeadlineSeconds lowered from {pod_view.active_deadline} to {cut.deadline}, to end by "
                       f"{stamp(cut.until)} (the node is locked for {cut.owner})")
        await self.event(pod_view.name, "BackfillDeadlineCut", message, kind="Pod", namespace=pod_view.namespace,
                         uid=pod_view.uid)
        decision(log, "backfill-deadline-cut", policy="backfill", pod=pod_view.key, node=cut.node, owner=cut.owner,
                 started=started, deadline=cut.deadline, was=pod_view.active_deadline, until=stamp(cut.until),
                 ungranted=cut.ungranted)

    async def estimates(self, marks: Sequence[EstimateMark]) -> None:
        """Issue 17: each owner's expected start written where backfill.estimate_marks says (a merge patch of the one
        annotation keys.EXPECTED_START on a PodGroup, a Kueue Workload or a pod); an object gone is skipped; a refusal
        is logged, counted and the object not sent one again for ESTIMATE_RETRY_SECONDS unless the estimate moves (the
        plan says the same at every plan until the annotation is there); at most MAX_ESTIMATE_WRITES sent."""
        now, moment = self._clock(), datetime.now(UTC)
        refused = self._estimates_refused
        for key in [k for k, (_, at) in refused.items() if now - at >= ESTIMATE_RETRY_SECONDS]:
            del refused[key]
        sent = 0
        for mark in marks:
            key = (mark.kind, mark.namespace, mark.name)
            if key in refused and not moved(refused[key][0], mark.text, moment):
                continue
            if sent >= MAX_ESTIMATE_WRITES:
                break
            sent += 1
            path = (resource_path(VOLCANO_API_VERSION, keys.PODGROUP_PLURAL, mark.name, mark.namespace)
                    if mark.kind == "PodGroup" else
                    resource_path(keys.KUEUE_API_VERSION, keys.WORKLOAD_PLURAL, mark.name, mark.namespace)
                    if mark.kind == "Workload" else resource_path("v1", "pods", mark.name, mark.namespace))
            body = {"metadata": {"annotations": {keys.EXPECTED_START: mark.text}}}
            try:
                await self._send("PATCH", path, body, content_type=MERGE_PATCH)
            except NotFound:
                continue
            except ApiException as err:
                self._failed()
                if key in refused or len(refused) < MAX_REFUSED_ESTIMATES:
                    refused[key] = (mark.text, now)
                decision(log, "estimate-failed", level=logging.WARNING, object=f"{mark.kind} {mark.namespace}/"
                         f"{mark.name}", status=err.status, reason=err.reason,
                         retry=f"not before {ESTIMATE_RETRY_SECONDS:.0f}s unless the estimate moves")
                continue
            decision(log, "estimate", level=logging.DEBUG, object=f"{mark.kind} {mark.namespace}/{mark.name}",
                     start=mark.text)

    async def release(self, release: Release) -> None:
        """One gated pod let go unchanged: its backfill gate lifted (the very pod planned for, by uid)."""
        path = resource_path("v1", "pods", release.name, release.namespace)
        pod = await get_json(self.api, path)
        if (pod.get("metadata") or {}).get("uid") != release.uid:
            return
        ops = ungate_patch(pod, keys.BACKFILL_GATE)
        if not ops:
            return
        await self._send("PATCH", path, ops, content_type=JSON_PATCH)
        self._gate_lifted("released", pod)
        decision(log, "backfill-release", policy="backfill", pod=release.key, reason=release.reason)

    def _gate_lifted(self, outcome: str, pod: Mapping[str, Any]) -> None:
        waited = since_created(pod)
        if self.on_backfill_gate is not None and waited is not None:
            self.on_backfill_gate(outcome, waited)

    async def evict(self, namespace: str, name: str, grace: int | None = None) -> str:
        """Ask the Eviction API to evict a pod (PodDisruptionBudgets apply), with `grace` seconds to stop when given.
        Returns "evicted", "gone", or "blocked" (429: a budget forbids it now; the caller tries again on a later
        reconcile)."""
        try:
            await self._send("POST", resource_path("v1", "pods", name, namespace, "eviction"),
                             eviction_body(namespace, name, grace))
            return "evicted"
        except NotFound:
            return "gone"
        except Throttled:
            return "blocked"

    # Queues (seed 002)

    async def write_queues(self, outcomes: Sequence[QueueGuaranteeStatus], queues: Mapping[str, QueueView],
                           pods: Mapping[str, PodView] | None = None,
                           witnesses: Witnesses = NO_WITNESSES) -> None:
        """Seed 002 outputs: each Queue's `status.reservation` (written when it changes, cleared when its guarantee
        goes), a Warning Event for a refused guarantee (once per change of its text), and, for `Guaranteed`,
        evictions of other pods on the locked nodes through the Eviction API (blocked ones are retried on the next
        reconcile and reported once). Each eviction passes the guard rails again (`evict_refused`, with `pods` the
        snapshot's pods by "namespace/name" and `witnesses` its nodes' and DaemonSets' uids) and the per-minute
        limit; those over the limit wait for a later reconcile (`retry_after`)."""
        if not self.may_write("queues"):
            return
        self.retry_after = None
        deferred: list[str] = []
        by_queue = {o.queue: o for o in outcomes}
        for name, queue in sorted(queues.items()):
            outcome = by_queue.get(name)
            body = queue_status_patch(outcome, queue)
            if body is not None:
                try:
                    await self._send("PATCH",
                                     resource_path(VOLCANO_API_VERSION, keys.QUEUE_PLURAL, name, subresource="status"),
                                     body, content_type=MERGE_PATCH)
                    decision(log, "status", policy="queue", queue=name, reservation=body["status"]["reservation"])
                except ApiException as err:
                    self._failed()
                    decision(log, "status-failed", level=logging.WARNING, policy="queue", queue=name,
                             status=err.status, reason=err.reason)
            warning = outcome.warning if outcome is not None else None
            if warning and self._queue_warnings.get(name) != warning:
                decision(log, "refused", level=logging.WARNING, policy="queue", queue=name, reason=warning)
                await self.event(name, "GuaranteeRefused", f"guarantee ignored: {warning}", kind="Queue",
                                 event_type="Warning", api_version=VOLCANO_API_VERSION)
            self._queue_warnings[name] = warning
            for key in outcome.evict if outcome is not None else ():
                refused = evict_refused(key, pods, self.protected, witnesses)
                if refused is not None:
                    decision(log, "evict-refused", level=logging.WARNING, policy="queue", pod=key, queue=name,
                             reason=refused, by="guard rail")
                    continue
                if self.evictions.per_minute == 0:  # guarantee.maxEvictionsPerMinute 0: evictions are off
                    continue
                if not self.evictions.allows():
                    deferred.append(key)
                    continue
                pod = pods.get(key) if pods is not None else None
                await self._evict_one(key, name, eviction_grace(pod) if pod is not None else None)
        if deferred:
            self.retry_after = self.evictions.retry_after()
            decision(log, "evict-deferred", level=logging.WARNING, policy="queue", pods=deferred,
                     count=len(deferred), reason=f"guarantee.maxEvictionsPerMinute ({self.evictions.per_minute}) "
                     f"reached; next in {self.retry_after:.0f}s")
            if self.on_deferred is not None:
                self.on_deferred(len(deferred))

    async def _evict_one(self, key: str, queue: str, grace: int | None = None) -> None:
        """One `Guaranteed` eviction, counted in the per-minute window when the Eviction API accepts it."""
        namespace, pod = _split(key)
        try:
            evicted = await self.evict(namespace, pod, grace)
        except ApiException as err:
            self._failed()
            if self.on_evicted is not None:
                self.on_evicted("failed")
            decision(log, "evict-failed", level=logging.WARNING, policy="queue", pod=key, queue=queue,
                     status=err.status)
            return
        if self.on_evicted is not None:
            self.on_evicted(evicted)
        if evicted == "evicted":
            self.evictions.spend()
        decision(log, "evict", policy="queue", pod=key, outcome=evicted, queue=queue,
                 reason="Guaranteed guarantee holds its node")
        if evicted == "blocked" and key not in self._blocked_evictions:  # reported once, retried always
            self._blocked_evictions.add(key)
            await self.event(queue, "EvictionBlocked", f"evicting {key} is blocked by a "
                             "PodDisruptionBudget; retrying", kind="Queue", event_type="Warning",
                             api_version=VOLCANO_API_VERSION)
        elif evicted != "blocked":
            self._blocked_evictions.discard(key)

    # Reservations (seed 003)

    async def write_reservations(self, outcomes: Sequence[ReservationStatus],
                                 reservations: Mapping[str, ReservationView]) -> None:
        """Seed 003 outputs: each Reservation's status (written when it changes, with an Event on a phase change),
        the `reservoir.sh/reservation-allocated` annotation on its current owners, and the deletion of one that
        ended longer than `gcGracePeriod` ago."""
        plural = keys.RESERVATION_PLURAL
        if outcomes and not self.may_write("reservations"):
            return
        for outcome in outcomes:
            reservation = reservations.get(outcome.name)
            if reservation is None:
                continue
            if outcome.left_alone:  # issue 18: another writer serves it: nothing is written to it
                await self.left_alone(outcome, reservation)
                continue
            self._left_alone.discard(reservation.uid)
            api_version, obj_name = outcome.api_version, outcome.object_name or outcome.name
            # Koordinator's objects are written as keys.KOORDINATOR_FIELD_MANAGER: a status write by any other
            # manager is a second writer (shared.views ReservationView.second_writer)
            manager = (("fieldManager", keys.KOORDINATOR_FIELD_MANAGER),) if (
                api_version != RESERVATION_API_VERSION) else ()
            if outcome.delete:
                try:
                    await self._send("DELETE", resource_path(api_version, plural, obj_name))
                    decision(log, "delete", policy="reservation", reservation=outcome.name,
                             reason=f"{outcome.phase} for longer than gcGracePeriod")
                except NotFound:
                    pass
                except ApiException as err:
                    decision(log, "delete-failed", level=logging.WARNING, policy="reservation",
                             reservation=outcome.name, status=err.status)
                continue
            if outcome.final:
                continue
            body = reservation_status_patch(outcome, reservation)
            if body is not None:
                try:
                    await self._send("PATCH", resource_path(api_version, plural, obj_name, subresource="status"),
                                     body, content_type=MERGE_PATCH, query=manager)
                except ApiException as err:
                    self._failed()
                    decision(log, "status-failed", level=logging.WARNING, policy="reservation",
                             reservation=outcome.name, status=err.status, reason=err.reason)
                    continue
                if reservation.phase != outcome.phase or not reservation.status:
                    await self.event(obj_name, outcome.phase, outcome.message, kind="Reservation",
                                     event_type="Warning" if outcome.phase == "Failed" else "Normal",
                                     api_version=api_version, uid=reservation.uid)
            for key in outcome.annotate:
                namespace, name = _split(key)
                try:
                    await self._send("PATCH", resource_path("v1", "pods", name, namespace),
                                     allocated_annotation_patch(outcome.name, obj_name, reservation.uid),
                                     content_type=MERGE_PATCH)
                    decision(log, "allocated", policy="reservation", pod=key, reservation=outcome.name,
                             node=outcome.node)
                except NotFound:
                    pass
                except ApiException as err:
                    self._failed()
                    decision(log, "annotate-failed", level=logging.WARNING, policy="reservation", pod=key,
                             status=err.status)

    # the published status (agent.published)

    async def put_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> bool:
        """Set `data` in ConfigMap `name` (a merge patch of its `data`; the ConfigMap is created when missing). True
        when written; False, and logged, when the Lease is not fresh (fenced). Other errors are raised."""
        path = resource_path("v1", "configmaps", name=name, namespace=namespace)
        try:
            try:
                await self._send("PATCH", path, {"data": dict(data)}, content_type=MERGE_PATCH)
            except NotFound:
                body = {"apiVersion": "v1", "kind": "ConfigMap", "data": dict(data),
                        "metadata": {"name": name, "namespace": namespace,
                                     "labels": {"app.kubernetes.io/part-of": "reservoir"}}}
                await self._send("POST", resource_path("v1", "configmaps", namespace=namespace), body)
        except Fenced as err:
            decision(log, "fenced", level=logging.WARNING, object=f"ConfigMap/{namespace}/{name}", reason=str(err),
                     done="status not published")
            return False
        return True

    async def left_alone(self, outcome: ReservationStatus, reservation: ReservationView) -> None:
        """Issue 18, never two writers: a Koordinator Reservation another field manager writes gets nothing from
        Reservoir but, once per object (while it stays so), a log line and a Normal Event `LeftAlone` saying why."""
        if reservation.uid in self._left_alone:
            return
        self._left_alone.add(reservation.uid)
        why = (f"its status was last written by {outcome.left_alone!r}, not by Reservoir "
               f"({keys.KOORDINATOR_FIELD_MANAGER}): another scheduler serves it, so Reservoir writes nothing to it")
        decision(log, "left-alone", policy="reservation", reservation=outcome.name, writer=outcome.left_alone,
                 reason=why)
        await self.event(reservation.name, "LeftAlone", f"Reservoir leaves this Reservation alone: {why}",
                         kind="Reservation", api_version=reservation.api_version, uid=reservation.uid)

    # Events

    async def owner_event(self, lock: Lock, reason: str, message: str, snapshot: Snapshot | None = None) -> None:
        """The same news on the lock's owner, when it is an object (`owner_object`): a job's PodGroup, a Queue, a
        Reservation."""
        target = owner_object(lock, snapshot)
        if target is not None:
            await self.event(target.name, reason, message, kind=target.kind, namespace=target.namespace,
                             api_version=target.api_version, uid=target.uid)

    async def event(self, name: str, reason: str, message: str, kind: str = "Node", namespace: str = "default",
                    event_type: str = "Normal", api_version: str = "v1", uid: str = "") -> None:
        """A core/v1 Event on object `name` of `kind` (best effort: a failed event is logged, never fatal; none without
        a fresh Lease)."""
        body = event_body(name, reason, message, now=datetime.now(UTC), component=self.component, kind=kind,
                          namespace=namespace, event_type=event_type, api_version=api_version, uid=uid)
        try:
            await self._send("POST", resource_path("v1", "events", namespace=namespace), body)
        except ApiException as err:
            log.warning("event not recorded", extra=fields(event=reason, object=f"{kind}/{name}", error=err.reason))
        except Fenced as err:
            decision(log, "fenced", level=logging.WARNING, event=reason, object=f"{kind}/{name}", reason=str(err),
                     done="event not recorded")
