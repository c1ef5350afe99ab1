"""The webhook's watch caches and the `Lookup` it builds from them for each request."""

from __future__ import annotations

import asyncio
import logging

from kubernetes_asyncio import client

from shared import keys
from shared.config import ConfigError, ReservoirConfig, load_config
from shared.views import PodGroupView, PriorityClassView, QueueView, ReservationView
from shared.watchcache import WatchCache
from webhook.mutate import Lookup

log = logging.getLogger("reservoir.webhook")


class WebhookCaches:
    def __init__(self, api: client.ApiClient, namespace: str = keys.NAMESPACE) -> None:
        volcano = f"/apis/{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"
        self.podgroups = WatchCache(api, "podgroups", f"{volcano}/{keys.PODGROUP_PLURAL}", PodGroupView.from_obj,
                                    key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        self.queues = WatchCache(api, "queues", f"{volcano}/{keys.QUEUE_PLURAL}", QueueView.from_obj)
        self.priority_classes = WatchCache(api, "priorityclasses", "/apis/scheduling.k8s.io/v1/priorityclasses",
                                           PriorityClassView.from_obj)
        self.reservations = WatchCache(
            api, "reservations", f"/apis/{keys.RESERVATION_GROUP}/{keys.RESERVATION_VERSION}/{keys.RESERVATION_PLURAL}",
            ReservationView.from_obj)
        self.configmaps = WatchCache(api, "config", f"/api/v1/namespaces/{namespace}/configmaps", lambda o: o,
                                     field_selector=f"metadata.name={keys.CONFIGMAP_NAME}",
                                     on_change=lambda kind, obj: self._config_changed(kind, obj))
        self.all = [self.podgroups, self.queues, self.priority_classes, self.reservations, self.configmaps]
        self.config = ReservoirConfig()
        self._tasks: list[asyncio.Task[None]] = []
        self._lookup: tuple[tuple[int, ...], Lookup] | None = None

    def _config_changed(self, kind: str, configmap: dict | None) -> None:
        if kind == "DELETED" or configmap is None:
            self.config = ReservoirConfig()
            log.info("config=defaults reason=ConfigMap %s deleted", keys.CONFIGMAP_NAME)
            return
        try:
            self.config = load_config((configmap.get("data") or {}).get(keys.CONFIG_KEY))
            log.info("config=reloaded resourceVersion=%s", configmap["metadata"].get("resourceVersion"))
        except ConfigError as err:
            log.warning("config=kept-last-good error=%s", err)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(cache.run(), name=f"watch-{cache.name}") for cache in self.all]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def synced(self) -> dict[str, bool]:
        return {cache.name: cache.synced.is_set() for cache in self.all}

    def ready(self) -> bool:
        return all(self.synced().values())

    def lookup(self) -> Lookup:
        """One Lookup per cache state: what it derives (indexes) is computed once, not per request."""
        versions = tuple(cache.version for cache in self.all)
        if self._lookup is None or self._lookup[0] != versions:
            self._lookup = (versions, Lookup(
                podgroups=dict(self.podgroups.items),
                queues=dict(self.queues.items),
                priority_classes=dict(self.priority_classes.items),
                reservations=dict(self.reservations.items),
                config=self.config,
            ))
        return self._lookup[1]
