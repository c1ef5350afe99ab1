"""The only code that writes to nodes: diff desired locks against what the nodes carry, patch what differs.

A node's taints are one list, so a patch replaces the whole list: each patch starts with a JSON Patch `test` of
`metadata.resourceVersion`, so a concurrent writer makes it fail, and the node is read again and the patch
rebuilt (up to MAX_ATTEMPTS). Taints, labels and annotations Reservoir did not write are kept as they are.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agent.planner.model import Lock, lock_on
from shared import keys
from shared.keys import LockKind
from shared.timestamps import stamp
from shared.views import NodeView
from shared.jsonpatch import Op, add, pointer

log = logging.getLogger("reservoir.agent")
CLUSTER_SCOPED = frozenset(("Node", "Queue", "Reservation"))
MAX_ATTEMPTS = 5


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
    for current, wanted_items, field_name in ((labels, want_labels, "labels"), (annotations, want_annotations, "annotations")):
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


@dataclass
class ApplyResult:
    errors: list[str] = field(default_factory=list)


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


class Applier:
    def __init__(self, api: client.ApiClient, component: str = "reservoir-agent") -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.component = component
        self.node_patches = 0
        self.exit_after = _exit_after_from_env()

    def _patched(self, name: str) -> None:
        self.node_patches += 1
        if self.exit_after is not None and self.node_patches >= self.exit_after:
            log.warning("node=%s failpoint=%s%d: exiting now, mid-reconcile", name, _EXIT_AFTER, self.exit_after)
            logging.shutdown()
            os._exit(137)

    async def _read_node(self, name: str) -> dict[str, Any] | None:
        try:
            response = await self.core.read_node(name, _preload_content=False)
            return json.loads(await response.read())
        except ApiException as err:
            if err.status == 404:
                return None
            raise

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
                await self.core.patch_node(name, ops, _content_type="application/json-patch+json")
                self._patched(name)
                return before, True
            except ApiException as err:
                if err.status in (409, 422) and attempt < MAX_ATTEMPTS:
                    log.info("node=%s conflict on patch (attempt %d): reading it again", name, attempt)
                    continue
                raise
        return None, False

    async def apply(self, desired: Mapping[str, Lock], current: Mapping[str, Lock]) -> ApplyResult:
        result = ApplyResult()
        for name in sorted(set(desired) | set(current)):
            want = desired.get(name)
            have = current.get(name)
            if (want is None and have is None) or (want is not None and want.same_hold(have)):
                continue
            try:
                before, patched = await self.set_lock(name, want)
            except ApiException as err:
                result.errors.append(f"node={name} status={err.status} reason={err.reason}")
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
        return result

    async def owner_event(self, lock: Lock, reason: str, message: str) -> None:
        """The same news on the lock's owner, when it is an object: a job's PodGroup."""
        parts = lock.subject.split("/")
        if lock.kind is LockKind.JOB and len(parts) == 3 and parts[1] == "PodGroup":
            await self.event(parts[2], reason, message, kind="PodGroup", namespace=parts[0],
                             api_version=f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}")

    async def event(self, name: str, reason: str, message: str, kind: str = "Node", namespace: str = "default",
                    event_type: str = "Normal", api_version: str = "v1") -> None:
        """A core/v1 Event on object `name` of `kind` (best effort: a failed event is logged, never fatal)."""
        now = datetime.now(timezone.utc)
        body = {
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"kind": kind, "name": name, "namespace": namespace, "apiVersion": api_version},
            "reason": reason, "message": message[:1000], "type": event_type,
            "source": {"component": self.component}, "reportingComponent": self.component,
            "firstTimestamp": stamp(now), "lastTimestamp": stamp(now),
            "count": 1,
        }
        if kind in CLUSTER_SCOPED:
            body["involvedObject"]["namespace"] = ""
        try:
            await self.core.create_namespaced_event(namespace, body)
        except ApiException as err:
            log.warning("event=%s object=%s/%s not recorded: %s", reason, kind, name, err.reason)


async def patch_status(api: client.ApiClient, group: str, version: str, plural: str, name: str,
                       status: Mapping[str, Any]) -> None:
    """Merge `status` into a cluster-scoped custom object's status subresource."""
    await client.CustomObjectsApi(api).patch_cluster_custom_object_status(
        group, version, plural, name, {"status": status}, _content_type="application/merge-patch+json")


async def evict(api: client.ApiClient, namespace: str, name: str) -> str:
    """Ask the Eviction API to evict a pod (PodDisruptionBudgets apply). Returns "evicted", "gone", or "blocked"
    (429: a budget forbids it now; the caller tries again on a later reconcile)."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    try:
        await client.CoreV1Api(api).create_namespaced_pod_eviction(name, namespace, body)
        return "evicted"
    except ApiException as err:
        if err.status == 404:
            return "gone"
        if err.status == 429:
            return "blocked"
        raise
