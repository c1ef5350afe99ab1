"""One writer among the webhook's replicas: a coordination.k8s.io Lease, held by whoever renews it in time.

The agent's election (agent/controller.py) runs kubernetes_asyncio's LeaderElection with a fence around every
write; it lives in the agent and `certs` may not import it (the layers). The certificate writer needs less: its
writes are guarded anyway (the Secret by its resourceVersion, so two writers cannot overwrite each other's pair), and
the Lease only keeps the replicas from racing to make two CAs. So here a Lease is read, judged by `lease_step` (pure)
and written with its resourceVersion: a lost race is a 409, and this replica waits for the next round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from kubernetes_asyncio import client

from shared.kube import Conflict, NotFound, get_json, resource_path, send_json
from shared.logs import fields
from shared.timestamps import parse_time

log = logging.getLogger("reservoir.certs")
COORDINATION = "coordination.k8s.io/v1"
MICRO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # a Lease's MicroTime


class Step(Enum):
    CREATE = "create"  # no Lease yet
    RENEW = "renew"  # this replica holds it
    TAKE_OVER = "take-over"  # its holder let it expire, or gave it up
    WAIT = "wait"  # another replica holds it


def lease_step(lease: dict[str, Any] | None, identity: str, now: datetime) -> Step:
    """What this replica does with the Lease as read: CREATE when there is none; RENEW when it is the holder;
    TAKE_OVER when the holder is empty or `renewTime + leaseDurationSeconds` has passed; else WAIT."""
    if lease is None:
        return Step.CREATE
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if holder == identity:
        return Step.RENEW
    renewed = parse_time(spec.get("renewTime") or spec.get("acquireTime"))
    duration = timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))
    if not holder or renewed is None or now >= renewed + duration:
        return Step.TAKE_OVER
    return Step.WAIT


def lease_body(lease: dict[str, Any] | None, step: Step, identity: str, now: datetime, duration: int,
               name: str, namespace: str) -> dict[str, Any]:
    """The Lease to write for `step` (not WAIT): this replica's record, the resourceVersion it was read at."""
    moment = now.astimezone(UTC).strftime(MICRO_FORMAT)
    spec = dict((lease or {}).get("spec") or {})
    if step is not Step.RENEW:
        spec["acquireTime"] = moment
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (step is Step.TAKE_OVER)
    spec.update(holderIdentity=identity, leaseDurationSeconds=duration, renewTime=moment)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if lease is not None:
        metadata["resourceVersion"] = lease["metadata"]["resourceVersion"]
    return {"apiVersion": COORDINATION, "kind": "Lease", "metadata": metadata, "spec": spec}


@dataclass
class LeaseHolder:
    """Holds the Lease `namespace/name` for `identity`; `hold()` once per round says whether this replica writes."""

    api: client.ApiClient
    namespace: str
    name: str
    identity: str
    duration: int = 30  # seconds; rounds come at least three times as often

    async def hold(self, now: datetime | None = None) -> bool:
        now = now or datetime.now(UTC)
        path = resource_path(COORDINATION, "leases", self.name, self.namespace)
        try:
            lease: dict[str, Any] | None = await get_json(self.api, path)
        except NotFound:
            lease = None
        step = lease_step(lease, self.identity, now)
        if step is Step.WAIT:
            return False
        body = lease_body(lease, step, self.identity, now, self.duration, self.name, self.namespace)
        try:
            if lease is None:
                await send_json(self.api, "POST", resource_path(COORDINATION, "leases", namespace=self.namespace),
                                body)
            else:
                await send_json(self.api, "PUT", path, body)
        except Conflict:  # another replica wrote it first (a 409 on create too): it holds the Lease this round
            return False
        if step is not Step.RENEW:
            log.info("certificate writer elected", extra=fields(
                certs="elected", identity=self.identity, lease=f"{self.namespace}/{self.name}", step=step.value))
        return True
