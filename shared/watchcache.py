"""A list+watch cache of one resource, like client-go's reflector: list, then watch from the list's
resourceVersion with bookmarks; resume from the last resourceVersion after a dropped stream; re-list on
410 Gone; back off on errors. A resource whose API is not installed (404, e.g. no Volcano CRDs) counts as
synced and empty, and is listed again every `absent_retry` seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from shared.kinds import Watched
from shared.kube import Gone, NotFound, Query, get_json, get_stream

V = TypeVar("V")
log = logging.getLogger("reservoir.watchcache")
WATCH_TIMEOUT_SECONDS = 290
BACKOFF_START, BACKOFF_MAX = 0.5, 30.0


class WatchCache(Generic[V]):
    def __init__(
        self,
        api: client.ApiClient,
        name: str,
        path: str,
        convert: Callable[[Mapping[str, Any]], V],
        key: Callable[[Mapping[str, Any]], Any] = lambda obj: obj["metadata"]["name"],
        field_selector: str | None = None,
        on_change: Callable[[str, V | None], None] | None = None,
        absent_retry: float = 30.0,
    ) -> None:
        self.api = api
        self.name = name
        self.path = path
        self.convert = convert
        self.key = key
        self.field_selector = field_selector
        self.on_change = on_change
        self.absent_retry = absent_retry
        self._items: dict[Any, V] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.absent = False
        self.version = 0  # bumped on every change, so readers can cache what they derive from the items

    @classmethod
    def of(cls, api: client.ApiClient, watched: Watched,
           on_change: Callable[[str, Any], None] | None = None) -> WatchCache[Any]:
        """A cache of one `shared.kinds.Watched` kind."""
        return cls(api, watched.name, watched.path, watched.convert, key=watched.key,
                   field_selector=watched.field_selector, on_change=on_change)

    @property
    def items(self) -> Mapping[Any, V]:
        return MappingProxyType(self._items)

    def _query(self, **extra: Any) -> Query:
        query = [(k, v) for k, v in extra.items() if v is not None]
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        return query

    async def list(self) -> None:
        try:
            data = await get_json(self.api, self.path, self._query(), timeout=60)
        except NotFound:
            if not self.absent:
                log.warning("cache=%s path=%s api not installed: treated as empty, retrying every %ss",
                            self.name, self.path, self.absent_retry)
            self.absent = True
            self._replace({})
            self.resource_version = ""
            self.synced.set()
            return
        if "items" not in data or "metadata" not in data:
            raise RuntimeError(f"list {self.path} answered without items: {str(data)[:300]}")
        self.absent = False
        self._replace({self.key(obj): obj for obj in data.get("items", [])})
        self.resource_version = data["metadata"].get("resourceVersion", "")
        self.synced.set()

    def _replace(self, objects: Mapping[Any, Mapping[str, Any]]) -> None:
        old = self._items
        self._items = {k: self.convert(obj) for k, obj in objects.items()}
        self.version += 1
        if self.on_change:
            for k in set(old) - set(self._items):
                self.on_change("DELETED", old[k])
            for k, value in self._items.items():
                if old.get(k) != value:
                    self.on_change("MODIFIED" if k in old else "ADDED", value)

    def apply_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(status=410, reason=obj.get("message", "resourceVersion too old"))
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return
        self.version += 1
        key = self.key(obj)
        if kind == "DELETED":
            gone = self._items.pop(key, None)
            if self.on_change and gone is not None:
                self.on_change("DELETED", gone)
        elif kind in ("ADDED", "MODIFIED"):
            value = self.convert(obj)
            self._items[key] = value
            if self.on_change:
                self.on_change(kind, value)

    async def watch_once(self) -> None:
        query = self._query(watch="true", allowWatchBookmarks="true", resourceVersion=self.resource_version,
                            timeoutSeconds=WATCH_TIMEOUT_SECONDS)
        response = await get_stream(self.api, self.path, query, timeout=WATCH_TIMEOUT_SECONDS + 30)
        try:
            while True:
                line = await response.content.readline()
                if not line:
                    return
                try:
                    self.apply_event(json.loads(line))
                except (KeyError, TypeError, ValueError) as err:
                    raise RuntimeError(f"malformed watch event ({err!r}): {line[:300]!r}") from None
        finally:
            response.release()

    async def run(self) -> None:
        """List and watch until cancelled."""
        backoff = BACKOFF_START
        need_list = True
        while True:
            try:
                if need_list:
                    await self.list()
                    need_list = False
                if self.absent:
                    await asyncio.sleep(self.absent_retry)
                    need_list = True
                    continue
                await self.watch_once()
                backoff = BACKOFF_START
            except asyncio.CancelledError:
                raise
            except Gone as err:  # a watch event with code 410, or a 410 answer to the request
                log.info("cache=%s resourceVersion expired (%s): listing again", self.name, err.reason)
                need_list = True
            except ApiException as err:
                log.warning("cache=%s error=%s status=%s retry_in=%.1fs", self.name, err.reason, err.status, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
            except Exception as err:  # network drops, decode errors: resume from the last resourceVersion
                log.warning("cache=%s error=%r retry_in=%.1fs", self.name, err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
