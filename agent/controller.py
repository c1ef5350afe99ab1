"""`reservoir agent`: the level-triggered controller (DESIGN section 4).

watch caches -> snapshot -> plan (pure) -> applier (diff, patch) -> repair, events, metrics. Only the holder of
the `reservoir-agent` Lease writes; a standby keeps its caches warm and takes over within the lease duration.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from datetime import datetime, timezone
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent.writer import Applier, evict, patch_status
from agent.gcpause import collector_paused
from agent.planner.model import Plan, Snapshot
from agent.planner.plan import current_locks, plan
from agent.planner.reservations import is_owner
from shared import keys, kinds
from shared.config import ReservoirConfig
from shared.ownership import reservation_owner_id, window_owner_id
from shared.keys import LockKind
from shared.kube import new_api_client
from shared.tolerations import lock_toleration, missing, toleration_ops
from shared.watchcache import WatchCache

QUEUE_API_VERSION = f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"
log = logging.getLogger("reservoir.agent")
LEASE_NAME = "reservoir-agent"
# Whole seconds: kubernetes_asyncio's LeaseLock converts the duration with int(str(value)).
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 15, 10, 2


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.locks = Gauge("reservoir_locks", "Nodes locked, by lock kind", ["kind"], registry=self.registry)
        self.starving = Gauge("reservoir_starving_jobs", "Jobs the planner judges starving", registry=self.registry)
        self.reconcile = Histogram("reservoir_reconcile_duration_seconds", "One reconcile: snapshot, plan, apply",
                                   registry=self.registry)
        self.patch_errors = Counter("reservoir_patch_errors_total", "Node or pod patches that failed",
                                    registry=self.registry)
        self.leader = Gauge("reservoir_leader", "1 while this replica holds the Lease", registry=self.registry)
        self.config_errors = Counter("reservoir_config_rejected_total", "Invalid config edits kept out",
                                     registry=self.registry)


class Agent:
    def __init__(self, api: client.ApiClient, namespace: str = keys.NAMESPACE, identity: str | None = None) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}"
        self.applier = Applier(api)
        self.metrics = AgentMetrics()
        self.config = ReservoirConfig()
        self.changed = asyncio.Event()
        self.leading = False
        self.last_plan: Plan | None = None
        poke = self._poke
        self.nodes = WatchCache.of(api, kinds.NODES, on_change=poke)
        self.pods = WatchCache.of(api, kinds.PODS, on_change=poke)
        self.podgroups = WatchCache.of(api, kinds.PODGROUPS, on_change=poke)
        self.queues = WatchCache.of(api, kinds.QUEUES, on_change=poke)
        self.priority_classes = WatchCache.of(api, kinds.PRIORITY_CLASSES, on_change=poke)
        self.reservations = WatchCache.of(api, kinds.RESERVATIONS, on_change=poke)
        self.configmaps = WatchCache.of(api, kinds.config_map(namespace), on_change=self._config_changed)
        self.caches = [self.nodes, self.pods, self.podgroups, self.queues, self.priority_classes, self.reservations,
                       self.configmaps]
        self._pending_events: list[tuple[str, str, str]] = []
        self._queue_warnings: dict[str, str | None] = {}
        self._blocked_evictions: set[str] = set()

    # --- inputs ---

    def _poke(self, kind: str, obj: Any) -> None:
        self.changed.set()

    def _config_changed(self, event: str, configmap: dict | None) -> None:
        self.config, error = kinds.config_from(event, configmap, self.config)
        if error is not None:
            self.metrics.config_errors.inc()
            log.warning("config=rejected kept=last-good error=%s", error)
            assert configmap is not None
            self._pending_events.append(("InvalidConfig", f"config.yaml rejected, last good config kept: {error}",
                                         configmap["metadata"]["name"]))
        elif configmap is None or event == "DELETED":
            log.info("config=defaults reason=ConfigMap %s deleted", keys.CONFIGMAP_NAME)
        else:
            log.info("config=loaded resourceVersion=%s dryRun=%s windows=%d",
                     configmap["metadata"].get("resourceVersion"), self.config.dry_run, len(self.config.windows))
        self.changed.set()

    def snapshot(self) -> Snapshot:
        return Snapshot(
            nodes={n.name: n for n in self.nodes.items.values()},
            pods=list(self.pods.items.values()),
            podgroups=dict(self.podgroups.items),
            queues=dict(self.queues.items),
            priority_classes=dict(self.priority_classes.items),
            reservations=dict(self.reservations.items),
        )

    # --- one reconcile ---

    async def reconcile(self) -> Plan:
        began = time.perf_counter()
        snapshot = self.snapshot()
        current = current_locks(snapshot)
        now = datetime.now(timezone.utc)
        with collector_paused():
            result = plan(snapshot, self.config, now, current, previous=self.last_plan)
        logged = set(self.last_plan.notes) if self.last_plan is not None else set()
        self.last_plan = result
        for note in result.notes:
            if note not in logged:  # a decision is logged when it is new, not again on every resync
                log.info("%s", note)
        for kind in LockKind:
            self.metrics.locks.labels(kind.value).set(sum(1 for l in result.locks.values() if l.kind is kind))
        self.metrics.starving.set(sum(1 for j in result.jobs if j.starving))
        for reason, message, name in self._drain_events():
            await self.applier.event(name, reason, message, kind="ConfigMap", namespace=self.namespace,
                                     event_type="Warning")
        if self.config.dry_run:
            for node, lock in sorted(result.locks.items()):
                if not lock.same_hold(current.get(node)):
                    log.info("node=%s decision=would-lock dryRun=true owner=%s subject=%s", node, lock.owner, lock.subject)
            for node in sorted(set(current) - set(result.locks)):
                log.info("node=%s decision=would-release dryRun=true owner=%s", node, current[node].owner)
        else:
            applied = await self.applier.apply(result.locks, current)
            for error in applied.errors:
                self.metrics.patch_errors.inc()
            await self.repair(result, snapshot)
            await self.queue_outputs(result, snapshot)
            await self.reservation_outputs(result, snapshot)
        self.metrics.reconcile.observe(time.perf_counter() - began)
        return result

    async def queue_outputs(self, result: Plan, snapshot: Snapshot) -> None:
        """Seed 002 outputs: each Queue's `status.reservation` (written when it changes, cleared when its guarantee
        goes), a Warning Event for a refused guarantee (once per change of its text), and, for `Guaranteed`,
        evictions of other pods on the locked nodes through the Eviction API (blocked ones are retried on the next
        reconcile and reported)."""
        statuses = {s.queue: s for s in result.guarantees}
        for name, queue in sorted(snapshot.queues.items()):
            status = statuses.get(name)
            want = ({"nodes": list(status.nodes), "resource": status.resource.to_quantities()}
                    if status is not None and status.nodes else None)
            if want != (queue.reservation or None):
                try:
                    await patch_status(self.api, keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, "queues", name,
                                       {"reservation": want})
                    log.info("queue=%s decision=status reservation=%s", name, want)
                except ApiException as err:
                    self.metrics.patch_errors.inc()
                    log.warning("queue=%s decision=status-failed status=%s reason=%s", name, err.status, err.reason)
            warning = status.warning if status is not None else None
            if warning and self._queue_warnings.get(name) != warning:
                log.warning("queue=%s decision=refused reason=%s", name, warning)
                await self.applier.event(name, "GuaranteeRefused", f"guarantee ignored: {warning}", kind="Queue",
                                         event_type="Warning", api_version=QUEUE_API_VERSION)
            self._queue_warnings[name] = warning
            for key in status.evict if status is not None else ():
                namespace, pod = key.split("/", 1)
                try:
                    outcome = await evict(self.api, namespace, pod)
                except ApiException as err:
                    self.metrics.patch_errors.inc()
                    log.warning("pod=%s decision=evict-failed queue=%s status=%s", key, name, err.status)
                    continue
                log.info("pod=%s decision=evict outcome=%s queue=%s reason=Guaranteed guarantee holds its node",
                         key, outcome, name)
                if outcome == "blocked" and key not in self._blocked_evictions:  # reported once, retried always
                    self._blocked_evictions.add(key)
                    await self.applier.event(name, "EvictionBlocked", f"evicting {key} is blocked by a "
                                             "PodDisruptionBudget; retrying", kind="Queue", event_type="Warning",
                                             api_version=QUEUE_API_VERSION)
                elif outcome != "blocked":
                    self._blocked_evictions.discard(key)

    async def reservation_outputs(self, result: Plan, snapshot: Snapshot) -> None:
        """Seed 003 outputs: each Reservation's status (written when it changes, with an Event on a phase change),
        the `reservoir.sh/reservation-allocated` annotation on its current owners, and the deletion of one that
        ended longer than `gcGracePeriod` ago."""
        group, version, plural = keys.RESERVATION_GROUP, keys.RESERVATION_VERSION, keys.RESERVATION_PLURAL
        custom = client.CustomObjectsApi(self.api)
        core = client.CoreV1Api(self.api)
        for status in result.reservations:
            reservation = snapshot.reservations.get(status.name)
            if reservation is None:
                continue
            if status.delete:
                try:
                    await custom.delete_cluster_custom_object(group, version, plural, status.name)
                    log.info("reservation=%s decision=delete reason=%s for longer than gcGracePeriod", status.name,
                             status.phase)
                except ApiException as err:
                    if err.status != 404:
                        log.warning("reservation=%s decision=delete-failed status=%s", status.name, err.status)
                continue
            if status.final:
                continue
            want = {k: v for k, v in status.status().items() if v is not None}
            have = {k: v for k, v in reservation.status.items() if k in want or k == "nodeName"}
            if want != have:
                body = {**want, "nodeName": want.get("nodeName")}
                try:
                    await patch_status(self.api, group, version, plural, status.name, body)
                except ApiException as err:
                    self.metrics.patch_errors.inc()
                    log.warning("reservation=%s decision=status-failed status=%s reason=%s", status.name, err.status,
                                err.reason)
                    continue
                if reservation.phase != status.phase or not reservation.status:
                    await self.applier.event(status.name, status.phase, status.message, kind="Reservation",
                                             event_type="Warning" if status.phase == "Failed" else "Normal",
                                             api_version=f"{group}/{version}")
            for key in status.annotate:
                namespace, name = key.split("/", 1)
                try:
                    await core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {
                        keys.RESERVATION_ALLOCATED: status.name}}}, _content_type="application/merge-patch+json")
                    log.info("pod=%s decision=allocated reservation=%s node=%s", key, status.name, status.node)
                except ApiException as err:
                    if err.status != 404:
                        self.metrics.patch_errors.inc()
                        log.warning("pod=%s decision=annotate-failed status=%s", key, err.status)

    def _drain_events(self) -> list[tuple[str, str, str]]:
        events, self._pending_events = self._pending_events, []
        return events

    async def repair(self, result: Plan, snapshot: Snapshot) -> None:
        """Pending pods a lock is held for, lacking its toleration (created while the webhook was down, or
        before Reservoir was installed), get it added (a pod update may add tolerations)."""
        wanted: dict[tuple[str, str], set[str]] = {}
        pods = {(p.namespace, p.name): p for p in snapshot.pods}
        window_owners = [window_owner_id(w.name) for w in self.config.windows]
        locked_windows = {l.owner for l in result.locks.values() if l.kind is LockKind.WINDOW}
        for lock in result.locks.values():
            if lock.kind is LockKind.JOB:
                for task in lock.tasks:
                    namespace, name = task.split("/", 1)
                    wanted.setdefault((namespace, name), set()).add(lock.owner)
        for status in result.reservations:
            reservation = snapshot.reservations.get(status.name)
            if status.phase in ("Available", "Waiting") and reservation is not None and not reservation.unschedulable:
                for pod in snapshot.pods:
                    if not pod.is_bound and not pod.is_terminal and is_owner(reservation, pod):
                        wanted.setdefault((pod.namespace, pod.name), set()).add(reservation_owner_id(status.name))
        if locked_windows:
            for pod in snapshot.pods:
                if pod.reserveable and not pod.is_bound and not pod.is_terminal:
                    wanted.setdefault((pod.namespace, pod.name), set()).update(
                        o for o in window_owners if o in locked_windows)
        core = client.CoreV1Api(self.api)
        for (namespace, name), owners in sorted(wanted.items()):
            pod = pods.get((namespace, name))
            if pod is None or pod.is_bound:
                continue
            lacking = missing(pod.tolerations, [lock_toleration(o) for o in sorted(owners)])
            if not lacking:
                continue
            ops = toleration_ops(list(pod.tolerations) or None, lacking)
            try:
                await core.patch_namespaced_pod(name, namespace, ops, _content_type="application/json-patch+json")
                log.info("pod=%s/%s decision=repair added=%s reason=lock held for its owner but not tolerated",
                         namespace, name, [t["value"] for t in lacking])
            except ApiException as err:
                self.metrics.patch_errors.inc()
                log.warning("pod=%s/%s decision=repair-failed status=%s reason=%s", namespace, name, err.status, err.reason)

    # --- running ---

    async def reconcile_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=self.config.resync_period.total_seconds())
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(self.config.debounce.total_seconds())
            self.changed.clear()
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconcile failed; retrying on the next event or resync")

    async def _lead(self) -> None:
        self.leading = True
        self.metrics.leader.set(1)
        log.info("leader=acquired identity=%s", self.identity)
        self.changed.set()
        try:
            await self.reconcile_loop()
        finally:
            self.leading = False
            self.metrics.leader.set(0)

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(c.run(), name=f"watch-{c.name}") for c in self.caches]
        try:
            await asyncio.gather(*(c.synced.wait() for c in self.caches))
            log.info("caches=synced identity=%s", self.identity)
            lead_task = asyncio.create_task(self._elect(), name="leader-election")
            tasks.append(lead_task)
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _elect(self) -> None:
        """Run for the Lease for ever: while held, the reconcile loop runs (the library cancels it on loss)."""
        async def stopped() -> None:
            log.warning("leader=lost identity=%s: stopped writing", self.identity)

        while True:
            lock = LeaseLock(LEASE_NAME, self.namespace, self.identity, self.api)
            config = electionconfig.Config(lock, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, self._lead, stopped)
            try:
                await leaderelection.LeaderElection(config).run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leader election failed; trying again in %ss", RETRY_PERIOD)
            await asyncio.sleep(RETRY_PERIOD)


def metrics_app(agent: Agent) -> web.Application:
    app = web.Application()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(agent.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        waiting = [c.name for c in agent.caches if not c.synced.is_set()]
        return web.Response(text="ok" if not waiting else f"waiting for {waiting}", status=503 if waiting else 200)

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def run(kubeconfig: str | None, namespace: str, metrics_port: int, impersonate: str | None = None,
              identity: str | None = None) -> None:
    api = await new_api_client(kubeconfig, impersonate=impersonate)
    agent = Agent(api, namespace, identity)
    runner = web.AppRunner(metrics_app(agent), access_log=None)
    await runner.setup()
    if metrics_port:
        await web.TCPSite(runner, "127.0.0.1" if kubeconfig else "0.0.0.0", metrics_port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.run(stop)
    finally:
        await runner.cleanup()
        await api.close()
