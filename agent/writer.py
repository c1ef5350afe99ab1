"""Every cluster write the agent makes, and nothing else: the planner decides, this module writes what it decided.

Each write is a small pure function that builds its body (or None when the cluster already says so), unit-tested,
and an async method of `Writer` that sends it through the client edge (`shared.kube`):

- node locks: `node_patch`, `Writer.set_lock` / `Writer.apply`
- lock tolerations a pending pod lacks (the plan's repairs): `repair_patch`, `Writer.repair`
- a Queue's `status.reservation` (seed 002): `queue_status_patch`, `Writer.write_queues`
- `Guaranteed` evictions through the Eviction API: `eviction_body`, `Writer.evict`
- a Reservation's status (seed 003): `reservation_status_patch`, the owner annotation `allocated_annotation_patch`,
  the deletion of an ended one: `Writer.write_reservations`
- Events: `event_body`, `Writer.event`

A node's taints are one list, so a patch replaces the whole list: each node patch starts with a JSON Patch `test` of
`metadata.resourceVersion`, so a concurrent writer makes it fail, and the node is read again and the patch rebuilt
(up to MAX_ATTEMPTS). Taints, labels and annotations Reservoir did not write are kept as they are.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agent.planner.model import Lock, Plan, QueueGuaranteeStatus, Repair, ReservationStatus, Snapshot, lock_on
from shared import keys
from shared.jsonpatch import Op, add, pointer
from shared.keys import LockKind
from shared.kube import (
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
from shared.timestamps import stamp
from shared.tolerations import toleration_ops
from shared.views import NodeView, QueueView, ReservationView

log = logging.getLogger("reservoir.agent")
CLUSTER_SCOPED = frozenset(("Node", "Queue", "Reservation"))
VOLCANO_API_VERSION = f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"
RESERVATION_API_VERSION = f"{keys.RESERVATION_GROUP}/{keys.RESERVATION_VERSION}"
MAX_ATTEMPTS = 5


# --- bodies (pure) ---

def _is_ours(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") == keys.LOCK and taint.get("effect") == keys.LOCK_EFFECT


def node_patch(node: Mapping[str, Any], desired: Lock | None) -> list[Op] | None:
    """The JSON Patch that makes `node` carry `desired` (None: no lock); None when it already does."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    taints = list(spec.get("taints") or [])
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    ops: list[Op] = []

    wanted = [t for t in taints if not _is_ours(t)]
    if desired is not None:
        wanted.append({"key": keys.LOCK, "value": desired.owner, "effect": keys.LOCK_EFFECT})
    if wanted != taints:
        if wanted:
            ops.append(add("/spec/taints", wanted))
        else:
            ops.append({"op": "remove", "path": "/spec/taints"})

    want_labels = {keys.LOCK: desired.owner, keys.LOCK_KIND: desired.kind.value} if desired else {}
    want_annotations = {keys.LOCK_INFO: desired.info_json()} if desired else {}
    for current, wanted_items, field_name in ((labels, want_labels, "labels"),
                                              (annotations, want_annotations, "annotations")):
        ours = (keys.LOCK, keys.LOCK_KIND) if field_name == "labels" else (keys.LOCK_INFO,)
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


def allocated_annotation_patch(reservation: str) -> dict[str, Any]:
    """The merge patch marking an owner pod as bound through `reservation` (`reservoir.sh/reservation-allocated`)."""
    return {"metadata": {"annotations": {keys.RESERVATION_ALLOCATED: reservation}}}


def eviction_body(namespace: str, name: str) -> dict[str, Any]:
    """A policy/v1 Eviction of one pod (its PodDisruptionBudgets apply)."""
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}


def event_body(name: str, reason: str, message: str, *, now: datetime, component: str, kind: str = "Node",
               namespace: str = "default", event_type: str = "Normal", api_version: str = "v1") -> dict[str, Any]:
    """A core/v1 Event on object `name` of `kind`, recorded in `namespace` (a cluster-scoped object's Event names
    no namespace for the object); the message is cut at 1,000 characters."""
    return {
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"kind": kind, "name": name, "namespace": "" if kind in CLUSTER_SCOPED else namespace,
                           "apiVersion": api_version},
        "reason": reason, "message": message[:1000], "type": event_type,
        "source": {"component": component}, "reportingComponent": component,
        "firstTimestamp": stamp(now), "lastTimestamp": stamp(now),
        "count": 1,
    }


def _split(key: str) -> tuple[str, str]:
    namespace, name = key.split("/", 1)
    return namespace, name


# Failpoint for crash tests: `RESERVOIR_FAILPOINT=exit-after-node-patches:N` makes the process die (exit 137, as
# SIGKILL would) right after its N-th successful node patch, in the middle of a reconcile.
FAILPOINT = "RESERVOIR_FAILPOINT"
_EXIT_AFTER = "exit-after-node-patches:"


def _exit_after_from_env() -> int | None:
    value = os.environ.get(FAILPOINT, "")
    if not value:
        return None
    if not value.startswith(_EXIT_AFTER) or not value[len(_EXIT_AFTER):].isdigit():
        raise ValueError(f"{FAILPOINT}={value!r}: expected {_EXIT_AFTER}N with N a whole number")
    return int(value[len(_EXIT_AFTER):])


# --- sending ---

class Writer:
    """Sends the writes. `on_failure` is called once per failed node, pod, Queue or Reservation write (not for
    Events, which are best effort, nor for deletions); the agent counts them in a metric."""

    def __init__(self, api: client.ApiClient, component: str = "reservoir-agent",
                 on_failure: Callable[[], None] | None = None) -> None:
        self.api = api
        self.component = component
        self.on_failure = on_failure
        self.node_patches = 0
        self.exit_after = _exit_after_from_env()
        self._queue_warnings: dict[str, str | None] = {}  # the refusal last reported per queue
        self._blocked_evictions: set[str] = set()  # evictions a budget blocks, reported once each

    def _failed(self) -> None:
        if self.on_failure is not None:
            self.on_failure()

    # the whole plan

    async def write(self, result: Plan, snapshot: Snapshot, current: Mapping[str, Lock], dry_run: bool) -> None:
        """Make the cluster say what `result` says: node locks, repairs, Queue and Reservation outputs, in that order;
        with `dry_run`, only log the locks it would write."""
        if dry_run:
            self.report_dry_run(result.locks, current)
            return
        await self.apply(result.locks, current)
        await self.repair(result.repairs)
        await self.write_queues(result.guarantees, snapshot.queues)
        await self.write_reservations(result.reservations, snapshot.reservations)

    # node locks

    def _patched(self, name: str) -> None:
        self.node_patches += 1
        if self.exit_after is not None and self.node_patches >= self.exit_after:
            log.warning("node=%s failpoint=%s%d: exiting now, mid-reconcile", name, _EXIT_AFTER, self.exit_after)
            logging.shutdown()
            os._exit(137)

    async def _read_node(self, name: str) -> dict[str, Any] | None:
        try:
            return await get_json(self.api, resource_path("v1", "nodes", name))
        except NotFound:
            return None

    async def set_lock(self, name: str, desired: Lock | None) -> tuple[Lock | None, bool]:
        """Make node `name` carry `desired`; returns (the lock it carried before, whether it was patched)."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            node = await self._read_node(name)
            if node is None:
                return None, False
            before = lock_on(NodeView.from_obj(node))
            ops = node_patch(node, desired)
            if ops is None:
                return before, False
            try:
                await send_json(self.api, "PATCH", resource_path("v1", "nodes", name), ops, content_type=JSON_PATCH)
                self._patched(name)
                return before, True
            except (Conflict, Invalid):  # Invalid: the resourceVersion `test` failed, a concurrent write
                if attempt < MAX_ATTEMPTS:
                    log.info("node=%s conflict on patch (attempt %d): reading it again", name, attempt)
                    continue
                raise
        return None, False

    def report_dry_run(self, desired: Mapping[str, Lock], current: Mapping[str, Lock]) -> None:
        """`dryRun: true`: the lock writes `apply` would make, logged and not made."""
        for node, lock in sorted(desired.items()):
            if not lock.same_hold(current.get(node)):
                log.info("node=%s decision=would-lock dryRun=true owner=%s subject=%s", node, lock.owner, lock.subject)
        for node in sorted(set(current) - set(desired)):
            log.info("node=%s decision=would-release dryRun=true owner=%s", node, current[node].owner)

    async def apply(self, desired: Mapping[str, Lock], current: Mapping[str, Lock]) -> None:
        """Patch every node whose lock differs from `desired`, with an Event on the node and on the owner."""
        for name in sorted(set(desired) | set(current)):
            want = desired.get(name)
            have = current.get(name)
            if (want is None and have is None) or (want is not None and want.same_hold(have)):
                continue
            try:
                before, patched = await self.set_lock(name, want)
            except ApiException as err:
                self._failed()
                log.warning("node=%s decision=patch-failed status=%s reason=%s", name, err.status, err.reason)
                continue
            if not patched:
                continue
            if before is not None and (want is None or before.owner != want.owner):
                log.info("node=%s decision=release owner=%s subject=%s", name, before.owner, before.subject)
                await self.event(name, "NodeReleased", f"released from {before.kind.value} {before.subject}")
                await self.owner_event(before, "NodeReleased", f"node {name} released")
            if want is not None and (before is None or before.owner != want.owner):
                log.info("node=%s decision=lock owner=%s kind=%s subject=%s reason=%r", name, want.owner,
                         want.kind.value, want.subject, want.reason)
                await self.event(name, "NodeLocked", f"locked for {want.kind.value} {want.subject}: {want.reason}")
                await self.owner_event(want, "NodeLocked", f"node {name} locked for it: {want.reason}")

    # pods

    async def repair(self, repairs: Sequence[Repair]) -> None:
        """DESIGN section 4 "Repair": add to each pending pod the lock tolerations the plan found it lacking."""
        for repair in repairs:
            ops = repair_patch(repair)
            if not ops:
                continue
            try:
                await send_json(self.api, "PATCH", resource_path("v1", "pods", repair.name, repair.namespace), ops,
                                content_type=JSON_PATCH)
                log.info("pod=%s/%s decision=repair added=%s reason=lock held for its owner but not tolerated",
                         repair.namespace, repair.name, [t["value"] for t in repair.add])
            except ApiException as err:
                self._failed()
                log.warning("pod=%s/%s decision=repair-failed status=%s reason=%s", repair.namespace, repair.name,
                            err.status, err.reason)

    async def evict(self, namespace: str, name: str) -> str:
        """Ask the Eviction API to evict a pod (PodDisruptionBudgets apply). Returns "evicted", "gone", or "blocked"
        (429: a budget forbids it now; the caller tries again on a later reconcile)."""
        try:
            await send_json(self.api, "POST", resource_path("v1", "pods", name, namespace, "eviction"),
                            eviction_body(namespace, name))
            return "evicted"
        except NotFound:
            return "gone"
        except Throttled:
            return "blocked"

    # Queues (seed 002)

    async def write_queues(self, outcomes: Sequence[QueueGuaranteeStatus], queues: Mapping[str, QueueView]) -> None:
        """Seed 002 outputs: each Queue's `status.reservation` (written when it changes, cleared when its guarantee
        goes), a Warning Event for a refused guarantee (once per change of its text), and, for `Guaranteed`,
        evictions of other pods on the locked nodes through the Eviction API (blocked ones are retried on the next
        reconcile and reported once)."""
        by_queue = {o.queue: o for o in outcomes}
        for name, queue in sorted(queues.items()):
            outcome = by_queue.get(name)
            body = queue_status_patch(outcome, queue)
            if body is not None:
                try:
                    await send_json(self.api, "PATCH",
                                    resource_path(VOLCANO_API_VERSION, keys.QUEUE_PLURAL, name, subresource="status"),
                                    body, content_type=MERGE_PATCH)
                    log.info("queue=%s decision=status reservation=%s", name, body["status"]["reservation"])
                except ApiException as err:
                    self._failed()
                    log.warning("queue=%s decision=status-failed status=%s reason=%s", name, err.status, err.reason)
            warning = outcome.warning if outcome is not None else None
            if warning and self._queue_warnings.get(name) != warning:
                log.warning("queue=%s decision=refused reason=%s", name, warning)
                await self.event(name, "GuaranteeRefused", f"guarantee ignored: {warning}", kind="Queue",
                                 event_type="Warning", api_version=VOLCANO_API_VERSION)
            self._queue_warnings[name] = warning
            for key in outcome.evict if outcome is not None else ():
                namespace, pod = _split(key)
                try:
                    evicted = await self.evict(namespace, pod)
                except ApiException as err:
                    self._failed()
                    log.warning("pod=%s decision=evict-failed queue=%s status=%s", key, name, err.status)
                    continue
                log.info("pod=%s decision=evict outcome=%s queue=%s reason=Guaranteed guarantee holds its node",
                         key, evicted, name)
                if evicted == "blocked" and key not in self._blocked_evictions:  # reported once, retried always
                    self._blocked_evictions.add(key)
                    await self.event(name, "EvictionBlocked", f"evicting {key} is blocked by a "
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
        for outcome in outcomes:
            reservation = reservations.get(outcome.name)
            if reservation is None:
                continue
            if outcome.delete:
                try:
                    await send_json(self.api, "DELETE", resource_path(RESERVATION_API_VERSION, plural, outcome.name))
                    log.info("reservation=%s decision=delete reason=%s for longer than gcGracePeriod", outcome.name,
                             outcome.phase)
                except NotFound:
                    pass
                except ApiException as err:
                    log.warning("reservation=%s decision=delete-failed status=%s", outcome.name, err.status)
                continue
            if outcome.final:
                continue
            body = reservation_status_patch(outcome, reservation)
            if body is not None:
                try:
                    await send_json(self.api, "PATCH", resource_path(RESERVATION_API_VERSION, plural, outcome.name,
                                                                     subresource="status"),
                                    body, content_type=MERGE_PATCH)
                except ApiException as err:
                    self._failed()
                    log.warning("reservation=%s decision=status-failed status=%s reason=%s", outcome.name, err.status,
                                err.reason)
                    continue
                if reservation.phase != outcome.phase or not reservation.status:
                    await self.event(outcome.name, outcome.phase, outcome.message, kind="Reservation",
                                     event_type="Warning" if outcome.phase == "Failed" else "Normal",
                                     api_version=RESERVATION_API_VERSION)
            for key in outcome.annotate:
                namespace, name = _split(key)
                try:
                    await send_json(self.api, "PATCH", resource_path("v1", "pods", name, namespace),
                                    allocated_annotation_patch(outcome.name), content_type=MERGE_PATCH)
                    log.info("pod=%s decision=allocated reservation=%s node=%s", key, outcome.name, outcome.node)
                except NotFound:
                    pass
                except ApiException as err:
                    self._failed()
                    log.warning("pod=%s decision=annotate-failed status=%s", key, err.status)

    # Events

    async def owner_event(self, lock: Lock, reason: str, message: str) -> None:
        """The same news on the lock's owner, when it is an object: a job's PodGroup."""
        parts = lock.subject.split("/")
        if lock.kind is LockKind.JOB and len(parts) == 3 and parts[1] == "PodGroup":
            await self.event(parts[2], reason, message, kind="PodGroup", namespace=parts[0],
                             api_version=VOLCANO_API_VERSION)

    async def event(self, name: str, reason: str, message: str, kind: str = "Node", namespace: str = "default",
                    event_type: str = "Normal", api_version: str = "v1") -> None:
        """A core/v1 Event on object `name` of `kind` (best effort: a failed event is logged, never fatal)."""
        body = event_body(name, reason, message, now=datetime.now(UTC), component=self.component, kind=kind,
                          namespace=namespace, event_type=event_type, api_version=api_version)
        try:
            await send_json(self.api, "POST", resource_path("v1", "events", namespace=namespace), body)
        except ApiException as err:
            log.warning("event=%s object=%s/%s not recorded: %s", reason, kind, name, err.reason)
