"""`reservoir agent`: the level-triggered controller (DESIGN section 4).

watch caches -> snapshot -> plan (pure: decides) -> writer (diffs and writes what the plan says) -> metrics. Only
the holder of the `reservoir-agent` Lease writes; a standby keeps its caches warm and takes over within the lease
duration.

Fencing (issue 10). kubernetes_asyncio's leader election cancels the reconcile loop only after it has failed to renew
for RENEW_DEADLINE, and a rival may hold the Lease by then; a reconcile in flight would go on writing. So the writer
asks a `LeaseFence` before each batch and each write: it holds while this replica holds the Lease and renewed it less
than LEASE_DURATION ago. The fence is fed by `FencedLeaseLock`, the library's LeaseLock with every call under a
timeout: a successful create or replace of the Lease (the library writes only this replica's own record, guarded by
the resourceVersion it read) renews the fence, timed when the request was sent, the safe side; a read that shows
another holder, or none, ends it at once; the loss of leadership ends it too. The Lease lives in `--lease-namespace`
(the agent's own namespace), not in `--namespace` (where the ConfigMap is read) unless they are the same.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agent.gcpause import collector_paused
from agent.planner.backfill import Estimated, EstimateError, estimate_errors
from agent.planner.model import BackfillPlan, Plan, Snapshot, lock_on
from agent.planner.plan import current_locks, plan, plan_gate
from agent.planner.podindex import PodIndex
from agent.published import Publisher
from agent.writer import EVICTION_OUTCOMES, EventTarget, Writer
from shared import keys, kinds
from shared.config import ReservoirConfig
from shared.keys import LockKind
from shared.kube import NotFound, get_json, new_api_client
from shared.logs import fields, note_fields
from shared.metrics import ScrapeGauge, cache_freshness, new_registry
from shared.ownership import JobRef
from shared.serving import probes_app, stop_on_signals
from shared.switchedcache import SwitchedCache
from shared.views import NodeView, PodView, workloads_by_owner
from shared.watchcache import Skipped, WatchCache, count_skips

log = logging.getLogger("reservoir.agent")


def log_note(note: str) -> None:
    """A planner note (`window=w decision=release reason=free text`) as one structured decision line, its `policy`
    the note's first key (window, job, queue, reservation) unless it names one."""
    parsed = note_fields(note)
    if parsed is None or "decision" not in parsed:
        log.info("%s", note)
        return
    what = str(parsed.pop("decision"))
    policy = parsed.pop("policy", next(iter(parsed), ""))
    log.info("decision", extra=fields(decision=what, policy=policy, **parsed))


LEASE_NAME = "reservoir-agent"
SETTLE = 0.1  # seconds a change waits for the rest of its burst before it is planned for (Agent.settle)
GATE_GAP = 0.1  # seconds at least between the starts of two gate passes (Agent.gate_loop): at most 10 a second
OWN_WRITES_SEEN = 1.0  # seconds a pass waits at most for the caches to show the last pass's gate writes (caught_up)
# caches whose changes a gate pass judges on fresh views (the pods through the index, the nodes' states and locks);
# a change in any other (a Reservation, a PodGroup, a Queue, the config...) leaves the pods to the next plan
GATE_SAFE_CACHES = frozenset((kinds.PODS.name, kinds.NODES.name))
MAX_PENDING_EVENTS = 1000  # Warning Events about unreadable objects waiting for the next reconcile; more are dropped
_WATCHED = {w.name: w for w in (kinds.NODES, kinds.PODS, kinds.PODGROUPS, kinds.QUEUES, kinds.PRIORITY_CLASSES,
                                kinds.RESERVATIONS, kinds.KOORDINATOR_RESERVATIONS, kinds.WORKLOADS)} | {
    "config": kinds.config_map("")}


@dataclass(frozen=True)
class OwnWrites:
    """What a pass wrote on the backfill gate, for the next pass to wait until the caches show it (Agent.caught_up):
    the pods whose gate it lifted ((namespace, name) -> uid) and the grants it wrote (node -> pod uids)."""

    lifted: Mapping[tuple[str, str], str] = field(default_factory=dict)
    granted: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, backfill: BackfillPlan, dry_run: bool) -> OwnWrites:
        lifted = {(r.namespace, r.name): r.uid for r in backfill.released}
        granted: dict[str, set[str]] = {}
        if not dry_run:
            for chosen in backfill.placed:
                lifted[(chosen.pod.namespace, chosen.pod.name)] = chosen.pod.uid
                granted.setdefault(chosen.node, set()).add(chosen.pod.uid)
        return cls(lifted, {node: frozenset(uids) for node, uids in granted.items()})

    def seen(self, pods: Mapping[Any, PodView], nodes: Mapping[Any, NodeView]) -> bool:
        """The pod cache shows every lifted gate (or the pod gone, or another pod by that name), the node cache every
        grant (or the node gone)."""
        for key, uid in self.lifted.items():
            pod = pods.get(key)
            if pod is not None and pod.uid == uid and pod.backfill_gated:
                return False
        for name, uids in self.granted.items():
            node = nodes.get(name)
            if node is not None and not uids <= node.backfill_grants.keys():
                return False
        return True


@dataclass(frozen=True)
class PendingEvent:
    """A Warning Event to record on an object once the agent leads."""

    target: EventTarget
    reason: str
    message: str
# Whole seconds: kubernetes_asyncio's LeaseLock converts the duration with int(str(value)).
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 15, 10, 2
LEASE_CALL_TIMEOUT = 5  # each read or write of the Lease; a renewal may be tried again within RENEW_DEADLINE


class LeaseFence:
    """May this replica write now? Only while it holds the Lease and renewed it less than `duration` seconds ago
    (module docstring, "Fencing"). `clock` is monotonic: a wall-clock jump changes nothing."""

    def __init__(self, identity: str, duration: float = LEASE_DURATION,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.identity = identity
        self.duration = duration
        self.clock = clock
        self.renewed_at: float | None = None  # when the last successful renewal was sent; None: not held
        self.holder: str | None = None  # the holder last seen on the Lease

    def renewed(self, sent_at: float) -> None:
        """A create or replace of the Lease with this replica's record succeeded; it was sent at `sent_at`."""
        self.renewed_at = sent_at if self.renewed_at is None else max(self.renewed_at, sent_at)
        self.holder = self.identity

    def observed(self, holder: str | None) -> None:
        """A read of the Lease showed `holder`: anyone else (or nobody) means this replica holds it no more."""
        self.holder = holder
        if holder != self.identity:
            self.renewed_at = None

    def lost(self) -> None:
        """Leadership ended (the election gave up renewing)."""
        self.renewed_at = None

    def stale(self) -> str | None:
        """Why this replica may not write now; None when it may."""
        if self.renewed_at is None:
            if self.holder and self.holder != self.identity:
                return f"the Lease is held by {self.holder}, not {self.identity}"
            return f"{self.identity} does not hold the Lease"
        age = self.clock() - self.renewed_at
        if age >= self.duration:
            return f"the Lease was last renewed {age:.1f}s ago, not within the lease duration ({self.duration:g}s)"
        return None


def _no_answer(err: Exception) -> ApiException:
    """A Lease call that got no answer (timeout, connection error), as the library expects a failed read: an
    ApiException with a JSON Status body whose code is not 404 (it then retries, without creating the Lease)."""
    error = ApiException(status=0, reason=f"no answer: {err!r}")
    error.body = json.dumps({"code": 0, "message": str(error.reason)}).encode()
    return error


class FencedLeaseLock(LeaseLock):
    """kubernetes_asyncio's LeaseLock with a timeout on every call, no exception escaping to the election loop (which
    would leave the reconcile loop running), and the `LeaseFence` fed from what the calls show."""

    def __init__(self, name: str, namespace: str, identity: str, api: client.ApiClient, fence: LeaseFence,
                 timeout: float = LEASE_CALL_TIMEOUT) -> None:
        super().__init__(name, namespace, identity, api)
        self.fence = fence
        self.timeout = timeout

    async def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        try:
            lease = await self.api_instance.read_namespaced_lease(name, namespace, _request_timeout=self.timeout)
        except ApiException as err:
            if err.status == 404:
                self.fence.observed(None)
            return False, err
        except (TimeoutError, aiohttp.ClientError) as err:
            log.warning("lease read got no answer", extra=fields(lease=f"{namespace}/{name}", error=repr(err)))
            return False, _no_answer(err)
        self.lease_reference = lease
        record: LeaderElectionRecord = self.election_record(lease)
        self.fence.observed(record.holder_identity)
        return True, record

    async def create(self, name: str, namespace: str, election_record: LeaderElectionRecord) -> bool:
        spec = self.update_lease(election_record)
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=name), spec=spec)
        sent = self.fence.clock()
        try:
            await self.api_instance.create_namespaced_lease(namespace, body, _request_timeout=self.timeout)
        except (ApiException, TimeoutError, aiohttp.ClientError) as err:
            log.warning("lease not created", extra=fields(lease=f"{namespace}/{name}", error=repr(err)))
            return False
        self.fence.renewed(sent)
        return True

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        if self.lease_reference is None:
            return False
        self.lease_reference.spec = self.update_lease(updated_record, self.lease_reference.spec)
        sent = self.fence.clock()
        try:  # a replace guarded by the resourceVersion read last: a rival's write in between makes it fail (409)
            await self.api_instance.replace_namespaced_lease(name=name, namespace=namespace,
                                                             body=self.lease_reference, _request_timeout=self.timeout)
        except (ApiException, TimeoutError, aiohttp.ClientError) as err:
            log.warning("lease not renewed", extra=fields(
                lease=f"{namespace}/{name}",
                error=f"{err.status} {err.reason}" if isinstance(err, ApiException) else repr(err)))
            return False
        self.fence.renewed(sent)
        return True


# seconds: a gated owner waits from its creation until its Reservation holds a node for it, up to the queue's wait
HANDOVER_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
ESTIMATE_BUCKETS = (1, 2, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600)


def register_lock_expiries(registry: CollectorRegistry,
                           read: Callable[[], Iterable[tuple[Sequence[str], float]]]) -> None:
    """`reservoir_lock_expiry_timestamp_seconds{node,kind}`, read at each scrape (Agent.lock_expiries)."""
    registry.register(ScrapeGauge(
        "reservoir_lock_expiry_timestamp_seconds", "Unix time the lock on a node expires (its maxLockDuration), "
        "as the node says (its lock-info annotation, read from this replica's node cache): one series per locked "
        "node whose lock expires", ["node", "kind"], read))


class AgentMetrics:
    """The agent's metrics (docs/tasks/metrics.md); the process, platform and build-info ones come with the
    registry (shared.metrics), the caches' freshness and the locks' expiries are read at scrape time (Agent)."""

    def __init__(self) -> None:
        self.registry = new_registry()
        self.locks = Gauge("reservoir_locks", "Nodes locked, by lock kind", ["kind"], registry=self.registry)
        self.starving = Gauge("reservoir_starving_jobs", "Jobs the planner judges starving", registry=self.registry)
        self.soft_drained = Gauge("reservoir_soft_drained_nodes", "Nodes the last plan wants to carry the soft-drain "
                                  "taint (starvation softDrain: PreferNoSchedule, for jobs that fit nowhere yet); "
                                  "in dryRun, the ones it would mark", registry=self.registry)
        self.reconcile = Histogram("reservoir_reconcile_duration_seconds", "One reconcile: snapshot, plan, apply",
                                   registry=self.registry)
        self.patch_errors = Counter("reservoir_patch_errors_total", "Node or pod patches that failed",
                                    registry=self.registry)
        self.leader = Gauge("reservoir_leader", "1 while this replica holds the Lease", registry=self.registry)
        self.config_errors = Counter("reservoir_config_rejected_total", "Invalid config edits kept out",
                                     registry=self.registry)
        self.fenced = Counter("reservoir_writes_fenced_total",
                              "Batches of writes not made (or stopped) because the Lease was not fresh",
                              registry=self.registry)
        self.evictions_deferred = Counter("reservoir_evictions_deferred_total",
                                          "Evictions put off to a later reconcile by guarantee.maxEvictionsPerMinute",
                                          registry=self.registry)
        self.wakeups = Counter("reservoir_reconcile_wakeups_total",
                               "Reconciles started, by cause: change (a view the planner reads changed, or the "
                               "config), time (a moment the last plan named: a threshold, an expiry, a window) or "
                               "resync (the resync period passed); and gate: passes deciding the pods on the backfill "
                               "gate between reconciles", ["cause"],
                               registry=self.registry)
        self.view_changes = Counter("reservoir_cache_view_changes_total",
                                    "Watch events that changed what the planner reads (a view), by cache: the ones "
                                    "that wake the reconcile loop (a node heartbeat changes none)", ["cache"],
                                    registry=self.registry)
        self.reconcile_errors = Counter("reservoir_reconcile_errors_total", "Reconciles that raised an error (logged "
                                        "with its traceback; the next event or resync tries again)",
                                        registry=self.registry)
        self.evictions = Counter("reservoir_evictions_total", "Evictions a Guaranteed queue asked of the Eviction API, "
                                 "by outcome: evicted, gone (the pod was gone), blocked (a PodDisruptionBudget; "
                                 "retried), failed (another API error)", ["outcome"], registry=self.registry)
        self.handover_wait = Histogram("reservoir_handover_wait_seconds", "From a Reservation owner's creation (when "
                                       "the webhook gave it the handover gate) to the agent lifting the gate, by how: "
                                       "handover (narrowed to the reserved node) or ungate (let go without a node)",
                                       ["how"], buckets=HANDOVER_BUCKETS, registry=self.registry)
        for outcome in EVICTION_OUTCOMES:  # every series from the start: rate() and alerts see a 0, not nothing
            self.evictions.labels(outcome)
        for how in ("handover", "ungate"):
            self.handover_wait.labels(how)
        self.backfill_gate = Histogram("reservoir_backfill_gate_seconds", "From a pod's creation (when the "
                                       "webhook gave it the backfill gate) to the agent lifting the gate, by outcome: "
                                       "backfilled (narrowed to a locked node) or released (let go unchanged): the "
                                       "delay the gate adds", ["outcome"], buckets=HANDOVER_BUCKETS,
                                       registry=self.registry)
        for outcome in ("backfilled", "released"):
            self.backfill_gate.labels(outcome)
        self.estimate_error = Histogram(
            "reservoir_start_estimate_error_seconds", "For each pod of a waiting owner (a starving job's "
            "task, a window's reserve pod) once bound, how far its start was from the first start the agent estimated "
            "for it (agent/planner/backfill.estimate_errors), by the owner's lock kind and side: late (it started "
            "after the estimate) or early", ["kind", "side"], buckets=ESTIMATE_BUCKETS, registry=self.registry)
        for kind in (LockKind.JOB, LockKind.WINDOW):
            for side in ("late", "early"):
                self.estimate_error.labels(kind.value, side)


class Agent:
    def __init__(self, api: client.ApiClient, namespace: str = keys.NAMESPACE, identity: str | None = None,
                 lease_namespace: str = keys.NAMESPACE) -> None:
        self.api = api
        self.namespace = namespace  # where the ConfigMap is read (and Warning Events about it recorded)
        self.lease_namespace = lease_namespace  # where the Lease is, the agent's own namespace
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}"
        self.metrics = AgentMetrics()
        self.fence = LeaseFence(self.identity)
        self.writer = Writer(api, on_failure=self.metrics.patch_errors.inc, fence=self.fence.stale,
                             on_fenced=self.metrics.fenced.inc, on_deferred=self.metrics.evictions_deferred.inc,
                             on_evicted=lambda outcome: self.metrics.evictions.labels(outcome).inc(),
                             on_handover=lambda how, waited: self.metrics.handover_wait.labels(how).observe(waited),
                             on_backfill_gate=lambda outcome, waited: self.metrics.backfill_gate.labels(
                                 outcome).observe(waited))
        self.publisher = Publisher(self.writer, namespace)  # the last plan, for `reservoir status` (issue 14)
        self.config = self._protecting(ReservoirConfig())
        self._lead_task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()
        self.leading = False
        self.last_plan: Plan | None = None
        # issue 34: the pods indexed for the planner (podindex), kept up to date from the pod cache's changes since
        # the last snapshot (pod key -> its new view, None when deleted)
        self._pod_index = PodIndex()
        self._pod_changes: dict[str, PodView | None] = {}
        self.gate = asyncio.Event()  # a pod arrived on the backfill gate (gate_loop)
        self._writing = asyncio.Lock()  # a reconcile and a gate pass never write at once
        # since the last plan's snapshot, something changed a gate pass must not judge on the last plan's locks and
        # statuses (gate_pass): it leaves the pods to the next plan
        self._gate_unsafe = False
        self._locked_owners: frozenset[str] = frozenset()  # the owners of the last plan's locks
        self._own_writes = OwnWrites()  # the gates the last pass lifted and the grants it wrote, until seen
        self._estimated: dict[str, Estimated] = {}  # issue 17: the estimates' error metric (backfill.estimate_errors)
        count = count_skips(self.metrics.registry)

        def poke(cache: str) -> Callable[[str, Any], None]:
            changes = self.metrics.view_changes.labels(cache)
            pods = cache == kinds.PODS.name

            def changed(kind: str, obj: Any) -> None:
                changes.inc()
                if pods:
                    self._pod_changed(kind, obj)
                elif cache not in GATE_SAFE_CACHES:
                    self._gate_unsafe = True  # a Reservation, PodGroup, Queue...: the next plan decides (gate_pass)
                self._poke(kind, obj)
            return changed

        def skip(record: Skipped) -> None:  # an unreadable object: skipped, counted, and told on the object itself
            count(record)
            self._skipped_event(record)

        def watched(kind: kinds.Watched) -> WatchCache[Any]:
            return WatchCache.of(api, kind, on_change=poke(kind.name), on_skip=skip)

        self.nodes = watched(kinds.NODES)
        self.pods = watched(kinds.PODS)
        self.podgroups = watched(kinds.PODGROUPS)
        self.queues = watched(kinds.QUEUES)
        self.priority_classes = watched(kinds.PRIORITY_CLASSES)
        self.reservations = watched(kinds.RESERVATIONS)
        # issue 29: a pod's DaemonSet reference is believed only when it names a DaemonSet that exists with that uid
        self.daemonsets = watched(kinds.DAEMONSETS)
        # issue 18: Koordinator's Reservations, followed only while `koordinator.reservations` is on
        self.koordinator = SwitchedCache(watched(kinds.KOORDINATOR_RESERVATIONS))
        # issue 32: Kueue's Workloads, followed only while `kueue.workloads` is on
        self.workloads = SwitchedCache(watched(kinds.WORKLOADS))
        # issue 32: Kubernetes' own PodGroups, followed only where the API server serves them (native_podgroups_served)
        self.native_podgroups = SwitchedCache(watched(kinds.NATIVE_PODGROUPS))
        self.switched = (self.koordinator, self.workloads, self.native_podgroups)
        self.configmaps = WatchCache.of(api, kinds.config_map(namespace), on_change=self._config_changed,
                                        on_skip=skip)
        self.caches = [self.nodes, self.pods, self.podgroups, self.queues, self.priority_classes, self.reservations,
                       self.daemonsets, self.configmaps]
        self._pending_events: list[PendingEvent] = []  # Warning Events the next reconcile records (leading)
        cache_freshness(self.metrics.registry, lambda: self.caches)
        self._expiries: tuple[int, list[tuple[tuple[str, str], float]]] = (-1, [])
        register_lock_expiries(self.metrics.registry, self.lock_expiries)

    # --- inputs ---

    def _poke(self, kind: str, obj: Any) -> None:
        """A cache's on_change: called only when the view of an object changed (shared.watchcache), not for an event
        that leaves it equal (a node heartbeat, a pod condition): the agent stays idle while nothing it plans from
        changes, and re-plans on the resync period regardless."""
        self.changed.set()

    def _pod_changed(self, event: str, pod: PodView) -> None:
        """A pod's view changed: recorded for the next snapshot's index. A pod deleted that the index never held is
        forgotten at once, so a standby (which takes no snapshot) keeps at most one entry per pod that exists."""
        if event != "DELETED":
            self._pod_changes[pod.key] = pod
            if pod.backfill_gated and not pod.node_name:
                self.gate.set()  # decided by the next gate pass, not after the debounce (gate_loop)
            elif (event == "ADDED" and not pod.node_name and not pod.is_terminal
                  and JobRef(*pod.job).owner_id in self._locked_owners):
                self._gate_unsafe = True  # a new task of a job the last plan locked for: its needed-by may move
        elif pod.key in self._pod_index.pods:
            self._pod_changes[pod.key] = None
        else:
            self._pod_changes.pop(pod.key, None)

    def pod_index(self) -> PodIndex:
        """The index of the pod cache's views now: the last one updated with the changes since (podindex). Should it
        ever disagree with the cache in size (a change not reported), it is built again from the cache, and said."""
        changes, self._pod_changes = self._pod_changes, {}
        index = self._pod_index.updated([pod for pod in changes.values() if pod is not None],
                                        [key for key, pod in changes.items() if pod is None])
        if len(index.pods) != len(self.pods.items):
            log.warning("pod index rebuilt", extra=fields(index=len(index.pods), cache=len(self.pods.items)))
            index = PodIndex.of(self.pods.items.values())
        self._pod_index = index
        return index

    def _protecting(self, config: ReservoirConfig) -> ReservoirConfig:
        """The config the agent plans with: the agent's namespaces (`--namespace`, `--lease-namespace`) among those
        whose pods are never evicted (guarantee.protected_namespaces)."""
        return config.protecting(self.namespace).protecting(self.lease_namespace)

    def _config_changed(self, event: str, configmap: Mapping[str, Any] | None) -> None:
        self._gate_unsafe = True  # the next plan decides under the new config
        config, error = kinds.config_from(event, configmap, self.config)
        self.config = self._protecting(config)
        self.koordinator.switch(self.config.koordinator.reservations)
        self.workloads.switch(self.config.kueue.workloads)
        if error is not None:
            self.metrics.config_errors.inc()
            log.warning("config rejected, last good kept", extra=fields(config="rejected", kept="last-good",
                                                                        error=str(error)))
            assert configmap is not None
            self._pending_events.append(PendingEvent(
                EventTarget("ConfigMap", configmap["metadata"]["name"], self.namespace, "v1"), "InvalidConfig",
                f"config.yaml rejected, last good config kept: {error}"))
        elif configmap is None or event == "DELETED":
            log.info("config defaults", extra=fields(config="defaults",
                                                     reason=f"ConfigMap {keys.CONFIGMAP_NAME} deleted"))
        else:
            log.info("config loaded", extra=fields(config="loaded", resourceVersion=configmap["metadata"].get(
                "resourceVersion"), dryRun=self.config.dry_run, windows=len(self.config.windows)))
        self.changed.set()

    def lock_expiries(self) -> list[tuple[tuple[str, str], float]]:
        """((node, lock kind), Unix expiry) of every lock with an expiry on the nodes the cache holds, read again only
        when the node cache changed: `reservoir_lock_expiry_timestamp_seconds`. Every replica reports it, leader or
        not, from what the nodes say, so a lock left past its expiry shows even when no agent leads."""
        if self._expiries[0] != self.nodes.version:
            self._expiries = (self.nodes.version, [
                ((name, lock.kind.value), lock.expires.timestamp()) for name, node in sorted(self.nodes.items.items())
                if (lock := lock_on(node)) is not None and lock.expires is not None])
        return self._expiries[1]

    def waiting(self) -> list[str]:
        """The caches not synced yet (readiness waits for every one)."""
        return [c.name for c in self.caches if not c.synced.is_set()] + [
            switched.name for switched in self.switched if not switched.synced]

    def snapshot(self) -> Snapshot:
        index = self.pod_index()
        return Snapshot(
            nodes={n.name: n for n in self.nodes.items.values()},
            pods=list(self.pods.items.values()),
            podgroups=dict(self.podgroups.items),
            queues=dict(self.queues.items),
            priority_classes=dict(self.priority_classes.items),
            reservations={**self.reservations.items, **self.koordinator.items},  # keys never collide (kinds)
            daemonsets=dict(self.daemonsets.items),
            workloads=workloads_by_owner(self.workloads.items.values()),
            native_podgroups=dict(self.native_podgroups.items),
        ).with_index(index)

    # --- one reconcile ---

    async def reconcile(self) -> Plan:
        async with self._writing:
            return await self._reconcile()

    async def _reconcile(self) -> Plan:
        began = time.perf_counter()
        await self.caught_up()
        self._gate_unsafe = False  # this plan reads every change until its snapshot
        try:
            snapshot = self.snapshot()
            current = current_locks(snapshot)
            now = datetime.now(UTC)
            with collector_paused():
                result = plan(snapshot, self.config, now, current, previous=self.last_plan)
        except BaseException:
            self._gate_unsafe = True  # no plan read those changes: gate passes wait for one that does
            raise
        logged = set(self.last_plan.notes) if self.last_plan is not None else set()
        self.last_plan = result
        for note in result.notes:
            if note not in logged:  # a decision is logged when it is new, not again on every resync
                log_note(note)
        for kind in LockKind:
            self.metrics.locks.labels(kind.value).set(sum(1 for lock in result.locks.values() if lock.kind is kind))
        self.metrics.starving.set(sum(1 for j in result.jobs if j.starving))
        self.metrics.soft_drained.set(len(result.drains))
        for pending in self._drain_events():
            target = pending.target
            await self.writer.event(target.name, pending.reason, pending.message, kind=target.kind,
                                    namespace=target.namespace, event_type="Warning", api_version=target.api_version,
                                    uid=target.uid)
        errors: list[EstimateError] = []
        if self._estimated or result.backfill.estimates:
            self._estimated, errors = estimate_errors(self._estimated, result.backfill.estimates,
                                                      {p.key: p for p in snapshot.pods}, now)
        for error in errors:
            self.metrics.estimate_error.labels(error.kind.value, "late" if error.seconds > 0 else "early").observe(
                abs(error.seconds))
        self._locked_owners = frozenset(lock.owner for lock in result.locks.values())
        self.writer.configure(self.config)
        await self.writer.write(result, snapshot, current, dry_run=self.config.dry_run)
        self._own_writes = OwnWrites.of(result.backfill, dry_run=self.config.dry_run)
        await self.publisher.publish(result, agent=self.identity, planned=now, config=self.config,
                                     skipped=[s for cache in self.caches for s in cache.skipped_objects])
        self.metrics.reconcile.observe(time.perf_counter() - began)
        return result

    async def gate_pass(self) -> BackfillPlan | None:
        """Issue 34: the pods on the backfill gate decided now, between two plans (plan.plan_gate: the last plan's
        locks, the node states of now), and only that written: the grants on the nodes pods are let onto, then each
        pod let on or let go (Writer.write_gate). None when there is no last plan yet (the first plan decides) or no
        pod on the gate."""
        last = self.last_plan
        if last is None or self._gate_unsafe:
            return None  # the reconcile loop, woken by the same change, decides
        await self.caught_up()
        snapshot = self.snapshot()
        now = datetime.now(UTC)
        if (last.wake_at is not None and now >= last.wake_at) or not any(
                p.backfill_gated for p in snapshot.index.unbound.values()):
            return None  # a moment the last plan named has passed (the reconcile loop plans for it), or none gated
        current = current_locks(snapshot)
        with collector_paused():
            result = plan_gate(snapshot, self.config, now, last, current)
        self.metrics.wakeups.labels("gate").inc()
        for note in result.notes:
            log_note(f"policy=backfill {note}")
        self.writer.configure(self.config)
        await self.writer.write_gate(result, snapshot, current, dry_run=self.config.dry_run)
        self._own_writes = OwnWrites.of(result, dry_run=self.config.dry_run)
        return result

    async def caught_up(self, timeout: float = OWN_WRITES_SEEN) -> bool:
        """Before a pass plans (a reconcile or a gate pass): wait, at most `timeout` seconds, until the caches show
        what the last pass wrote on the backfill gate (each pod's gate lifted, each grant on its node), so the pass
        does not decide those pods again, nor count a node's room without the pods just granted it. Whether they did
        (a write that failed is never seen: the pass goes on after the timeout, as it did before)."""
        writes, self._own_writes = self._own_writes, OwnWrites()
        deadline = time.monotonic() + timeout
        while not writes.seen(self.pods.items, self.nodes.items):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def gate_loop(self) -> None:
        """Issue 34: a pod that arrives on the backfill gate is decided within SETTLE (the rest of its burst with it)
        by a gate pass, not after the reconcile loop's debounce; passes start at least GATE_GAP apart, so a stream of
        arrivals costs at most 1 / GATE_GAP passes a second. A pass that fails is logged and counted, and the next
        pod, or the next plan, decides again."""
        started = float("-inf")
        while True:
            await self.gate.wait()
            await asyncio.sleep(max(SETTLE, started + GATE_GAP - time.monotonic()))
            started = time.monotonic()
            self.gate.clear()
            try:
                async with self._writing:
                    await self.gate_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.metrics.reconcile_errors.inc()
                log.exception("gate pass failed; the next pod on the gate or the next plan decides again")

    def _skipped_event(self, record: Skipped) -> None:
        """Issue 10: an object no cache can read is reported on itself (a Warning Event `Unreadable` with the error),
        once per version (the cache calls this once per version), besides the log line, the metric and `reservoir
        status`. At most MAX_PENDING_EVENTS wait for the next reconcile: a flood of bad objects cannot grow memory."""
        watched = _WATCHED.get(record.cache)
        if watched is None or len(self._pending_events) >= MAX_PENDING_EVENTS:
            return
        namespace, _, name = record.name.rpartition("/")
        self._pending_events.append(PendingEvent(
            EventTarget(watched.kind, name, namespace or "default", watched.api_version, record.uid), "Unreadable",
            f"Reservoir cannot read this {watched.kind} and acts as if it did not exist: {record.error}"))

    def _drain_events(self) -> list[PendingEvent]:
        events, self._pending_events = self._pending_events, []
        return events

    # --- running ---

    def next_wait(self, last_resync: float, now: float) -> tuple[float, str]:
        """Seconds until the loop must plan though no watched object changed, and why: the resync period counted from
        the last resync (a change does not push it back), the moment time alone changes the last plan's answer
        (Plan.wake_at: a starvation threshold crossed, a lock's maxLockDuration, a window's range), or deferred
        evictions' room in the minute."""
        waits = [(last_resync + self.config.resync_period.total_seconds() - now, "resync")]
        wake_at = self.last_plan.wake_at if self.last_plan is not None else None
        if wake_at is not None:
            waits.append(((wake_at - datetime.now(UTC)).total_seconds() + 0.05, "time"))
        if self.writer.retry_after is not None:  # evictions deferred: come back when the minute has room
            waits.append((self.writer.retry_after + 0.1, "resync"))
        wait, cause = min(waits)
        return max(wait, 0.0), cause

    def settle(self, last_started: float, now: float) -> float:
        """Seconds to wait before planning for a change: SETTLE, so the rest of a burst (four pods deleted at once, a
        Job's pods created together) is in the same plan, and at least `debounce` between the starts of two
        change-driven plans, so a stream of changes costs at most one plan per `debounce`. A change after a quiet
        spell is planned for within SETTLE (a lock released well within a second); with the old trailing debounce it
        always waited the whole `debounce`."""
        return max(SETTLE, last_started + self.config.debounce.total_seconds() - now)

    async def reconcile_loop(self) -> None:
        last_resync = time.monotonic()
        last_started = float("-inf")  # when the last change-driven reconcile started
        while True:
            wait, due = self.next_wait(last_resync, time.monotonic())
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=wait)
                cause = "change"
            except TimeoutError:
                cause = due
            if cause == "resync":
                last_resync = time.monotonic()
            if cause == "change":  # a moment in time is planned for at once
                await asyncio.sleep(self.settle(last_started, time.monotonic()))
                last_started = time.monotonic()
            self.changed.clear()
            unsynced = [switched.name for switched in self.switched if not switched.synced]
            if unsynced:  # issues 18, 32: no plan without the Koordinator Reservations or Kueue Workloads it serves
                log.info("plan deferred", extra=fields(plan="deferred", waiting=",".join(unsynced)))
                await asyncio.sleep(RETRY_PERIOD)
                self.changed.set()
                continue
            self.metrics.wakeups.labels(cause).inc()
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.metrics.reconcile_errors.inc()
                log.exception("reconcile failed; retrying on the next event or resync")

    async def _lead(self) -> None:
        self._lead_task = asyncio.current_task()
        self.last_plan = None  # a plan of an earlier term is no ground for a gate pass (gate_pass waits for one)
        self.leading = True
        self.metrics.leader.set(1)
        log.info("leader acquired", extra=fields(leader="acquired", identity=self.identity,
                                                 lease=f"{self.lease_namespace}/{LEASE_NAME}"))
        self.changed.set()
        gates = asyncio.create_task(self.gate_loop(), name="backfill-gate")
        try:
            await self.reconcile_loop()
        finally:
            gates.cancel()
            await asyncio.gather(gates, return_exceptions=True)
            self.leading = False
            self.metrics.leader.set(0)

    async def native_podgroups_served(self) -> bool:
        """Issue 32: whether the API server serves Kubernetes' own PodGroups (`scheduling.k8s.io/v1alpha2`, 1.36 with
        the GenericWorkload feature gate), asked of its discovery once at start; said in the log either way. A gate
        turned on later needs an agent restart to be followed."""
        try:
            listing = await get_json(self.api, f"/apis/{keys.NATIVE_SCHEDULING_API_VERSION}")
        except NotFound:
            served, why = False, "not served"
        except Exception as err:  # any failure leaves them off (said), never the agent down
            served, why = False, f"discovery failed: {type(err).__name__}: {str(err)[:200]}"
        else:
            resources = listing.get("resources") if isinstance(listing, Mapping) else None
            served = any(isinstance(r, Mapping) and r.get("name") == keys.NATIVE_PODGROUP_PLURAL
                         for r in (resources if isinstance(resources, list) else ()))
            why = "served" if served else "the group is served without podgroups"
        log.info("native podgroups", extra=fields(nativePodGroups="followed" if served else "off", reason=why,
                                                  api=keys.NATIVE_SCHEDULING_API_VERSION))
        return served

    async def run(self, stop: asyncio.Event) -> None:
        self.native_podgroups.switch(await self.native_podgroups_served())
        tasks = [asyncio.create_task(c.run(), name=f"watch-{c.name}") for c in self.caches]
        try:
            await asyncio.gather(*(c.synced.wait() for c in self.caches))
            log.info("caches synced", extra=fields(caches="synced", identity=self.identity))
            lead_task = asyncio.create_task(self._elect(), name="leader-election")
            tasks.append(lead_task)
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for switched in self.switched:
                await switched.stop()

    async def _elect(self) -> None:
        """Run for the Lease for ever: while held, the reconcile loop runs (the library cancels it on loss; so does
        this loop if the library fails), and the fence lets the writer write (module docstring, "Fencing")."""
        async def stopped() -> None:
            self.fence.lost()
            log.warning("leader lost: stopped writing", extra=fields(leader="lost", identity=self.identity))

        while True:
            lock = FencedLeaseLock(LEASE_NAME, self.lease_namespace, self.identity, self.api, self.fence)
            config = electionconfig.Config(lock, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, self._lead, stopped)
            try:
                await leaderelection.LeaderElection(config).run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leader election failed; trying again", extra=fields(retry_in=f"{RETRY_PERIOD}s"))
            finally:
                self.fence.lost()
                await self._stop_leading()
            await asyncio.sleep(RETRY_PERIOD)

    async def _stop_leading(self) -> None:
        """The reconcile loop ends with the election that started it, whatever way that ended."""
        task, self._lead_task = self._lead_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def metrics_app(agent: Agent) -> web.Application:
    """/healthz, /readyz (waits for every watch cache), /metrics."""
    return probes_app(agent.metrics.registry, agent.waiting, describe=lambda names: f"waiting for {names}",
                      caches=lambda: agent.caches)


async def run(kubeconfig: str | None, namespace: str, metrics_port: int, impersonate: str | None = None,
              identity: str | None = None, lease_namespace: str = keys.NAMESPACE) -> None:
    api = await new_api_client(kubeconfig, impersonate=impersonate)
    agent = Agent(api, namespace, identity, lease_namespace=lease_namespace)
    # msg=agent identity=...: bench/scale times the first line by "agent identity="
    log.info("agent", extra=fields(identity=agent.identity, config=f"{namespace}/{keys.CONFIGMAP_NAME}",
                                   lease=f"{lease_namespace}/{LEASE_NAME}"))
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
