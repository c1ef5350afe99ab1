"""The webhook's watch caches and the `Lookup` it builds from them for each request.

An object a cache cannot read is left out of it and listed in `skipped()` (shared.watchcache); `on_skip` (for example
`shared.watchcache.count_skips(metrics.registry)`) counts each. A cache that has not heard from the API server for
longer than `shared.serving.STALE_AFTER` counts as not synced, so `/readyz` turns false until it hears again.

`lookup()` is rebuilt when a cache's `version` moves, and a cache moves it only when a view changed (issue 15): a
node heartbeat or a DaemonSet's status leaves the Lookup (and its indexes) as it was.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from shared import keys, kinds
from shared.config import ReservoirConfig
from shared.serving import STALE_AFTER, stale_caches
from shared.switchedcache import SwitchedCache
from shared.views import workloads_by_owner
from shared.watchcache import Skipped, WatchCache
from webhook.lookup import Lookup

log = logging.getLogger("reservoir.webhook")


class WebhookCaches:
    def __init__(self, api: client.ApiClient, namespace: str = keys.NAMESPACE,
                 on_skip: Callable[[Skipped], None] | None = None) -> None:
        self.podgroups = WatchCache.of(api, kinds.PODGROUPS, on_skip=on_skip)
        self.queues = WatchCache.of(api, kinds.QUEUES, on_skip=on_skip)
        self.priority_classes = WatchCache.of(api, kinds.PRIORITY_CLASSES, on_skip=on_skip)
        self.reservations = WatchCache.of(api, kinds.RESERVATIONS, on_skip=on_skip)
        # issue 18: Koordinator's Reservations, followed only while `koordinator.reservations` is on
        self.koordinator = SwitchedCache(WatchCache.of(api, kinds.KOORDINATOR_RESERVATIONS, on_skip=on_skip))
        # issue 32: Kueue's Workloads (a Kueue pod's ClusterQueue, for windows' and backfill's `queues`), followed
        # only while `kueue.workloads` is on
        self.workloads = SwitchedCache(WatchCache.of(api, kinds.WORKLOADS, on_skip=on_skip))
        self.switched = (self.koordinator, self.workloads)
        self.configmaps = WatchCache.of(api, kinds.config_map(namespace), on_change=self._config_changed,
                                        on_skip=on_skip)
        # to refuse a Queue guarantee larger than the cluster, and a pod's nodeName on a node locked for others
        self.nodes = WatchCache.of(api, kinds.NODES, on_skip=on_skip)
        self.daemonsets = WatchCache.of(api, kinds.DAEMONSETS, on_skip=on_skip)  # the DaemonSet exemption
        self.all = [self.podgroups, self.queues, self.priority_classes, self.reservations, self.configmaps, self.nodes,
                    self.daemonsets]
        self.config = ReservoirConfig()
        self._tasks: list[asyncio.Task[None]] = []
        self._lookup: tuple[tuple[int, ...], Lookup] | None = None

    def _config_changed(self, event: str, configmap: Mapping[str, Any] | None) -> None:
        self.config, error = kinds.config_from(event, configmap, self.config)
        self.koordinator.switch(self.config.koordinator.reservations)
        self.workloads.switch(self.config.kueue.workloads)
        if error is not None:
            log.warning("config=kept-last-good error=%s", error)
        elif configmap is None or event == "DELETED":
            log.info("config=defaults reason=ConfigMap %s deleted", keys.CONFIGMAP_NAME)
        else:
            log.info("config=reloaded resourceVersion=%s", configmap["metadata"].get("resourceVersion"))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(cache.run(), name=f"watch-{cache.name}") for cache in self.all]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for switched in self.switched:
            await switched.stop()

    def synced(self, now: float | None = None) -> dict[str, bool]:
        """Cache name -> synced and still following the cluster (heard from the API server within STALE_AFTER)."""
        synced = {cache.name: cache.synced.is_set() and cache.stale_for(now) <= STALE_AFTER for cache in self.all}
        for switched in self.switched:
            if switched.on:
                synced[switched.name] = switched.synced and switched.cache.stale_for(now) <= STALE_AFTER
        return synced

    def stale(self, now: float | None = None) -> list[str]:
        """One line per cache that has not heard from the API server for longer than STALE_AFTER (how long)."""
        return stale_caches(self.all, now)

    def skipped(self) -> dict[str, dict[str, str]]:
        """Cache name -> the objects it skips now because they cannot be read (name -> error); only non-empty ones."""
        return {cache.name: dict(cache.skipped) for cache in self.all if cache.skipped}

    def lookup(self) -> Lookup:
        """One Lookup per cache state: what it derives (indexes) is computed once, not per request."""
        versions = (*(cache.version for cache in self.all),
                    *(part for switched in self.switched for part in (switched.version, switched.on)))
        if self._lookup is None or self._lookup[0] != versions:
            self._lookup = (versions, Lookup(
                podgroups=dict(self.podgroups.items),
                queues=dict(self.queues.items),
                priority_classes=dict(self.priority_classes.items),
                reservations={**self.reservations.items, **self.koordinator.items},  # keys never collide (kinds)
                config=self.config,
                nodes=dict(self.nodes.items),
                daemonsets=dict(self.daemonsets.items),
                workloads=workloads_by_owner(self.workloads.items.values()),
            ))
        return self._lookup[1]
