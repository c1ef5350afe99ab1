"""`reservoir agent`: the level-triggered controller (DESIGN section 4).

watch caches -> snapshot -> plan (pure: decides) -> writer (diffs and writes what the plan says) -> metrics. Only
the holder of the `reservoir-agent` Lease writes; a standby keeps its caches warm and takes over within the lease
duration.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agent.gcpause import collector_paused
from agent.planner.model import Plan, Snapshot
from agent.planner.plan import current_locks, plan
from agent.writer import Writer
from shared import keys, kinds
from shared.config import ReservoirConfig
from shared.keys import LockKind
from shared.kube import new_api_client
from shared.serving import probes_app, stop_on_signals
from shared.watchcache import WatchCache

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
        self.metrics = AgentMetrics()
        self.writer = Writer(api, on_failure=self.metrics.patch_errors.inc)
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
        self._pending_events: list[tuple[str, str, str]] = []  # (reason, message, ConfigMap name) to report

    # --- inputs ---

    def _poke(self, kind: str, obj: Any) -> None:
        self.changed.set()

    def _config_changed(self, event: str, configmap: Mapping[str, Any] | None) -> None:
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

    def waiting(self) -> list[str]:
        """The caches not synced yet (readiness waits for every one)."""
        return [c.name for c in self.caches if not c.synced.is_set()]

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
        now = datetime.now(UTC)
        with collector_paused():
            result = plan(snapshot, self.config, now, current, previous=self.last_plan)
        logged = set(self.last_plan.notes) if self.last_plan is not None else set()
        self.last_plan = result
        for note in result.notes:
            if note not in logged:  # a decision is logged when it is new, not again on every resync
                log.info("%s", note)
        for kind in LockKind:
            self.metrics.locks.labels(kind.value).set(sum(1 for lock in result.locks.values() if lock.kind is kind))
        self.metrics.starving.set(sum(1 for j in result.jobs if j.starving))
        for reason, message, name in self._drain_events():
            await self.writer.event(name, reason, message, kind="ConfigMap", namespace=self.namespace,
                                    event_type="Warning")
        await self.writer.write(result, snapshot, current, dry_run=self.config.dry_run)
        self.metrics.reconcile.observe(time.perf_counter() - began)
        return result

    def _drain_events(self) -> list[tuple[str, str, str]]:
        events, self._pending_events = self._pending_events, []
        return events

    # --- running ---

    async def reconcile_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=self.config.resync_period.total_seconds())
            except TimeoutError:
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
    """/healthz, /readyz (waits for every watch cache), /metrics."""
    return probes_app(agent.metrics.registry, agent.waiting, describe=lambda names: f"waiting for {names}")


async def run(kubeconfig: str | None, namespace: str, metrics_port: int, impersonate: str | None = None,
              identity: str | None = None) -> None:
    api = await new_api_client(kubeconfig, impersonate=impersonate)
    agent = Agent(api, namespace, identity)
    runner = web.AppRunner(metrics_app(agent), access_log=None)
    await runner.setup()
    if metrics_port:
        await web.TCPSite(runner, "127.0.0.1" if kubeconfig else "0.0.0.0", metrics_port).start()
    stop = stop_on_signals()
    try:
        await agent.run(stop)
    finally:
        await runner.cleanup()
        await api.close()
