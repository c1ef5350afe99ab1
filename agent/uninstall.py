"""`reservoir uninstall`: take Reservoir out of a cluster in the one safe order, saying what went, one line each.

1. The webhook configurations (WEBHOOK_CONFIGURATIONS). While they exist and the webhook is gone, their fail-closed
   checks refuse Queue, Reservation and ConfigMap writes and every pod carrying a lock toleration.
2. The agent stopped: its Deployment scaled to 0 and its pods waited for; then this command holds the agent's Lease
   until it is done (LeaseHold), so an agent run any other way (`make up`) stops writing too: the agent writes only
   while it holds the Lease and renewed it within LEASE_DURATION (agent/controller.py, "Fencing").
3. Every lock: on every node, the taints, labels and annotations the agent writes (NODE_TAINTS, NODE_LABELS,
   NODE_ANNOTATIONS, from shared/keys.py) and nothing else, by the writer `reservoir release --all` uses.
4. Reservoir's scheduling gates (`reservoir.sh/...`) lifted from every pod, so no pod stays gated.
5. The placeholder pods (label keys.PLACEHOLDER, in Reservoir's namespace).
6. What the install created (INSTALLED; COMPONENTS_INSTALLED, the optional components' RBAC), unless
   `leave_install`: the namespace (and everything in it), the cluster-wide RBAC and the placeholders' PriorityClass;
   the Reservation CRD (and with it every Reservation) only when `crds` is asked. Never Volcano's CRDs, never a
   Queue or a PodGroup.

Safe to run again at any time: what is already gone (or going: a deletionTimestamp) is skipped, and a run that
finds nothing says so. Helm's pre-delete hook runs it with `leave_install` (Helm deletes the rest itself, and a Job
in the namespace must not delete the namespace under its own feet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client

from agent.controller import LEASE_DURATION, LEASE_NAME, RETRY_PERIOD
from agent.writer import RELEASE_MARKS, Writer
from shared import keys
from shared.jsonpatch import Op
from shared.kube import JSON_PATCH, Conflict, Invalid, NotFound, get_json, new_api_client, resource_path, send_json
from shared.logs import fields

log = logging.getLogger("reservoir.uninstall")

# deploy/webhook-configurations.yaml's names (tests/unit/test_deploy.py holds the two to each other)
WEBHOOK_CONFIGURATIONS = (
    ("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", "reservoir"),
    ("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", "reservoir"),
)
# What the agent writes on a node (agent/writer.py node_patch and its marks), and so what uninstall removes
NODE_TAINTS = keys.LOCK_TAINT_KEYS  # with keys.LOCK_EFFECT; and keys.DRAIN, whatever its effect (a node mark)
NODE_LABELS = (keys.LOCK, keys.LOCK_KIND)
NODE_ANNOTATIONS = (keys.LOCK_INFO, keys.LOCK_EXPIRED, keys.BACKFILL_GRANTS, keys.BACKFILL_ROOM)
GATE_PREFIX = f"{keys.DOMAIN}/"
AGENT_DEPLOYMENT = "reservoir-agent"
AGENT_POD_SELECTOR = "app.kubernetes.io/name=reservoir-agent"
HOLDER = "reservoir-uninstall"
# The cluster-scoped objects of deploy/ (tests/unit/test_deploy.py: exactly the default render's, CRDs apart), in the
# order they go: the critical-priority policy first (left behind, it would go on refusing pods), bindings before what
# they bind.
INSTALLED = (
    ("admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", keys.CRITICAL_PRIORITY_POLICY),
    ("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", keys.CRITICAL_PRIORITY_POLICY),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "reservoir-agent"),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "reservoir-webhook"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-agent"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-webhook"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-tenant"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-status"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-record"),
    ("scheduling.k8s.io/v1", "priorityclasses", keys.PLACEHOLDER_PRIORITY_CLASS),
)
# what the optional components add (deploy/components/koordinator and kueue): already gone when not installed
COMPONENTS_INSTALLED = (
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "reservoir-agent-koordinator"),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "reservoir-webhook-koordinator"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-agent-koordinator"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-webhook-koordinator"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-status-koordinator"),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "reservoir-agent-kueue"),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "reservoir-webhook-kueue"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-agent-kueue"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-webhook-kueue"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "reservoir-status-kueue"),
)
RESERVATION_CRD = ("apiextensions.k8s.io/v1", "customresourcedefinitions",
                   f"{keys.RESERVATION_PLURAL}.{keys.RESERVATION_GROUP}")
NOTHING_TO_DO = "nothing to do: no Reservoir webhook configuration, lock, gate, placeholder or installed object found"
AGENT_STOP_TIMEOUT = 90.0
PAGE = 500


# --- what to remove (pure) ---

def display(api_version: str, plural: str, name: str, namespace: str | None = None) -> str:
    """An object named as kubectl names it, `<resource>[.<group>]/<name>` (`clusterrole.rbac.authorization.k8s.io/x`),
    with `<namespace>/` before the name for a namespaced object (`pod/team-a/x`)."""
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    singular = plural[:-2] if plural.endswith("sses") else plural[:-1]
    kind = f"{singular}.{group}" if group else singular
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"


def carries_lock_keys(node: Mapping[str, Any]) -> bool:
    """Does the node carry anything the agent writes (NODE_TAINTS with the lock effect, the soft-drain taint,
    NODE_LABELS, NODE_ANNOTATIONS)?"""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    taints = (node.get("spec") or {}).get("taints") or []
    return (any((t.get("key") in NODE_TAINTS and t.get("effect") == keys.LOCK_EFFECT) or t.get("key") == keys.DRAIN
                for t in taints)
            or any(k in labels for k in NODE_LABELS) or any(k in annotations for k in NODE_ANNOTATIONS))


def reservoir_gates(pod: Mapping[str, Any]) -> list[str]:
    """The names of the pod's scheduling gates that are Reservoir's (`reservoir.sh/...`)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return [g.get("name", "") for g in gates if str(g.get("name", "")).startswith(GATE_PREFIX)]


def ungate_patch(pod: Mapping[str, Any]) -> list[Op] | None:
    """The JSON Patch lifting Reservoir's gates from the pod and keeping every other gate, guarded by a `test` of
    the gates as read (a gate lifted meanwhile by someone else makes it fail, and it is read again); None when the
    pod has none of Reservoir's."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    kept = [g for g in gates if not str(g.get("name", "")).startswith(GATE_PREFIX)]
    if len(kept) == len(gates):
        return None
    ops: list[Op] = [{"op": "test", "path": "/spec/schedulingGates", "value": gates}]
    if kept:
        ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": kept})
    else:
        ops.append({"op": "remove", "path": "/spec/schedulingGates"})
    return ops


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _micro_time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_takeover(lease: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The Lease as this command holds it: HOLDER, renewed `now`, a transition counted when it changes hands."""
    spec = dict(lease.get("spec") or {})
    if spec.get("holderIdentity") != HOLDER:
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["acquireTime"] = _micro_time(now)
    spec.update(holderIdentity=HOLDER, leaseDurationSeconds=LEASE_DURATION, renewTime=_micro_time(now))
    return {**lease, "spec": spec}


def held_by_another(lease: Mapping[str, Any], now: datetime) -> str | None:
    """The holder still within its lease (renewTime + leaseDurationSeconds after `now`), other than this command."""
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    renewed = spec.get("renewTime")
    if not holder or holder == HOLDER or not renewed:
        return None
    try:
        renewed_at = datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
    except ValueError:
        return str(holder)  # unreadable: assume the worst, it is live
    duration = int(spec.get("leaseDurationSeconds") or LEASE_DURATION)
    return str(holder) if (now - renewed_at).total_seconds() < duration else None


# --- the I/O ---

async def _list(api: client.ApiClient, path: str, query: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """Every item of a collection, page by page; an API that is not installed lists as empty."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        page_query = [*query, ("limit", str(PAGE))] + ([("continue", token)] if token else [])
        try:
            page = await get_json(api, path, page_query)
        except NotFound:
            return items
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


async def _get(api: client.ApiClient, path: str) -> dict[str, Any] | None:
    try:
        return await get_json(api, path)
    except NotFound:
        return None


async def _delete(api: client.ApiClient, api_version: str, plural: str, name: str,
                  namespace: str | None = None) -> str | None:
    """Delete one object; its line, or None when it is gone or already going."""
    path = resource_path(api_version, plural, name, namespace)
    found = await _get(api, path)
    if found is None or deleting(found):
        return None
    try:
        await send_json(api, "DELETE", path, {"propagationPolicy": "Background"})
    except NotFound:
        return None
    return f"{display(api_version, plural, name, namespace)} deleted"


class LeaseHold:
    """The agent's Lease held by this command (HOLDER), renewed every RETRY_PERIOD while it runs, so no agent
    acquires it (an agent takes a Lease only after seeing it unchanged for LEASE_DURATION) and the one that held it
    stops writing (its fence closes on reading another holder, and at the latest LEASE_DURATION after its last
    renewal)."""

    def __init__(self, api: client.ApiClient, namespace: str, sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.api = api
        self.path = resource_path("coordination.k8s.io/v1", "leases", LEASE_NAME, namespace)
        self.collection = resource_path("coordination.k8s.io/v1", "leases", namespace=namespace)
        self.sleep = sleep
        self.previous: str | None = None  # the agent that held it, live, when it was taken

    async def take(self) -> None:
        for _ in range(5):
            now = datetime.now(UTC)
            lease = await _get(self.api, self.path)
            try:
                if lease is None:
                    body = lease_takeover({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                           "metadata": {"name": LEASE_NAME}}, now)
                    await send_json(self.api, "POST", self.collection, body)
                else:
                    self.previous = self.previous or held_by_another(lease, now)
                    await send_json(self.api, "PUT", self.path, lease_takeover(lease, now))
                return
            except Conflict:  # an agent renewed (or created) it in between: read it again
                continue
        raise RuntimeError(f"could not take the Lease {self.path}: it kept changing")

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Take the Lease, wait out the fence of an agent that held it, keep renewing it until the block ends."""
        await self.take()
        if self.previous:
            log.info("waiting for the agent holding the Lease to stop writing",
                     extra=fields(holder=self.previous, wait=f"{LEASE_DURATION}s"))
            await self.sleep(LEASE_DURATION)
        renewing = asyncio.create_task(self._renew(), name="uninstall-lease")
        try:
            yield
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)

    async def _renew(self) -> None:
        while True:
            await self.sleep(RETRY_PERIOD)
            try:
                await self.take()
            except (NotFound, RuntimeError) as err:  # the namespace went: no agent can hold a Lease there either
                log.info("lease not renewed", extra=fields(error=str(err)))
                return


@dataclass(frozen=True)
class Uninstall:
    """What to remove: `crds` also the Reservation CRD (every Reservation with it); `leave_install` stops after the
    placeholder pods (Helm's pre-delete hook)."""

    namespace: str = keys.NAMESPACE
    crds: bool = False
    leave_install: bool = False


async def _remove_webhook_configurations(api: client.ApiClient) -> list[str]:
    return [line for api_version, plural, name in WEBHOOK_CONFIGURATIONS
            if (line := await _delete(api, api_version, plural, name))]


async def _stop_agent_deployment(api: client.ApiClient, namespace: str) -> list[str]:
    """Scale the agent's Deployment to 0 and wait until its pods are gone."""
    path = resource_path("apps/v1", "deployments", AGENT_DEPLOYMENT, namespace)
    deployment = await _get(api, path)
    lines = []
    if deployment is not None and not deleting(deployment) and (deployment.get("spec") or {}).get("replicas") != 0:
        await send_json(api, "PATCH", path, [{"op": "replace", "path": "/spec/replicas", "value": 0}],
                        content_type=JSON_PATCH)
        lines.append(f"{display('apps/v1', 'deployments', AGENT_DEPLOYMENT, namespace)} scaled to 0")
    pods_path = resource_path("v1", "pods", namespace=namespace)
    deadline = time.monotonic() + AGENT_STOP_TIMEOUT
    while await _list(api, pods_path, [("labelSelector", AGENT_POD_SELECTOR)]):
        if time.monotonic() > deadline:
            log.warning("agent pods still running; the Lease keeps them from writing",
                        extra=fields(namespace=namespace, waited=f"{AGENT_STOP_TIMEOUT:g}s"))
            break
        await asyncio.sleep(1)
    return lines


async def _release_locks(api: client.ApiClient) -> list[str]:
    writer = Writer(api, component=HOLDER)
    lines = []
    for node in await _list(api, resource_path("v1", "nodes")):
        if not carries_lock_keys(node):
            continue
        name = node["metadata"]["name"]
        # what `reservoir release --all` writes (RELEASE_MARKS), and every other NODE_ANNOTATIONS (the backfill notes;
        # set_lock removes keys.LOCK_INFO with the lock): nothing is left
        marks = dict.fromkeys((*RELEASE_MARKS, *NODE_ANNOTATIONS[1:]))
        before, patched = await writer.set_lock(name, None, marks)
        if patched:
            what = f"{before.kind.value} lock of {before.subject}" if before else "leftover keys (lock or soft-drain)"
            lines.append(f"{display('v1', 'nodes', name)} released ({what})")
    return lines


async def _lift_gates(api: client.ApiClient) -> list[str]:
    lines = []
    for pod in await _list(api, resource_path("v1", "pods"), [("fieldSelector", "spec.nodeName=")]):
        meta = pod["metadata"]
        for _ in range(5):
            ops = ungate_patch(pod)
            if ops is None:
                break
            path = resource_path("v1", "pods", meta["name"], meta["namespace"])
            try:
                await send_json(api, "PATCH", path, ops, content_type=JSON_PATCH)
            except NotFound:
                break
            except (Conflict, Invalid):  # the gates changed since they were read
                found = await _get(api, path)
                if found is None:
                    break
                pod = found
                continue
            gates = ", ".join(reservoir_gates(pod))
            lines.append(f"{display('v1', 'pods', meta['name'], meta['namespace'])} scheduling gate removed ({gates})")
            break
    return lines


async def _delete_placeholders(api: client.ApiClient, namespace: str) -> list[str]:
    pods = await _list(api, resource_path("v1", "pods", namespace=namespace), [("labelSelector", keys.PLACEHOLDER)])
    return [line for pod in pods if not deleting(pod)
            if (line := await _delete(api, "v1", "pods", pod["metadata"]["name"], namespace))]


async def _delete_installed(api: client.ApiClient, plan: Uninstall) -> list[str]:
    objects = [("v1", "namespaces", plan.namespace), *INSTALLED, *COMPONENTS_INSTALLED,
               *([RESERVATION_CRD] if plan.crds else [])]
    return [line for api_version, plural, name in objects if (line := await _delete(api, api_version, plural, name))]


async def uninstall(api: client.ApiClient, plan: Uninstall, *, sleep: Callable[[float], Any] = asyncio.sleep,
                    out: Callable[[str], None] = print) -> list[str]:
    """Every step of the module docstring, in order; each removal is passed to `out` as it happens and returned.
    The Lease is held from step 2 to the end of step 5 (only while the namespace is there and not going)."""
    done: list[str] = []

    def report(lines: list[str]) -> None:
        for line in lines:
            out(line)
        done.extend(lines)

    report(await _remove_webhook_configurations(api))
    namespace = await _get(api, resource_path("v1", "namespaces", plan.namespace))
    live = namespace is not None and not deleting(namespace)
    async with contextlib.AsyncExitStack() as stack:
        if live:
            report(await _stop_agent_deployment(api, plan.namespace))
            await stack.enter_async_context(LeaseHold(api, plan.namespace, sleep).held())
        report(await _release_locks(api))
        report(await _lift_gates(api))
        if live:
            report(await _delete_placeholders(api, plan.namespace))
    if not plan.leave_install:
        report(await _delete_installed(api, plan))
    return done


async def run(kubeconfig: str | None, plan: Uninstall, context: str | None = None,
              out: Callable[[str], None] = print) -> list[str]:
    """`reservoir uninstall`: `uninstall` with a client of its own; NOTHING_TO_DO when nothing was there."""
    api = await new_api_client(kubeconfig, context=context)
    try:
        done = await uninstall(api, plan, out=out)
    finally:
        await api.close()
    if not done:
        out(NOTHING_TO_DO)
    return done
