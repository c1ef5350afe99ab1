"""A watch cache that runs only while a config switch is on (issue 18: Koordinator's Reservations are listed and
watched only with `koordinator.reservations: true`, so the base install needs no RBAC for that group).

`switch(True)` starts the cache's list+watch task (on the running event loop; the config callbacks run there),
`switch(False)` cancels it and forgets every item: a source switched off is no longer served. While off, `items` is
empty and the cache counts as synced; while on, readers wait for `synced` like any cache's (a cache that cannot list,
e.g. for want of RBAC, keeps the agent's plans waiting and says so in /readyz and its log).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from shared.watchcache import WatchCache

log = logging.getLogger("reservoir.watchcache")
_EMPTY: Mapping[Any, Any] = MappingProxyType({})


class SwitchedCache:
    def __init__(self, cache: WatchCache[Any]) -> None:
        self.cache = cache
        self.name = cache.name
        self._task: asyncio.Task[None] | None = None

    @property
    def on(self) -> bool:
        return self._task is not None

    def switch(self, on: bool) -> None:
        """Start or stop following the cluster (idempotent)."""
        if on and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.cache.run(), name=f"watch-{self.name}")
            log.info("cache=%s switched=on", self.name)
        elif not on and self._task is not None:
            self._task.cancel()
            self._task = None
            self.cache._replace(())  # forget every item: the source is no longer served
            self.cache.synced.clear()
            self.cache.resource_version = ""
            log.info("cache=%s switched=off", self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @property
    def items(self) -> Mapping[Any, Any]:
        return self.cache.items if self.on else _EMPTY

    @property
    def synced(self) -> bool:
        """Off, or on and listed."""
        return not self.on or self.cache.synced.is_set()

    @property
    def version(self) -> int:
        return self.cache.version
