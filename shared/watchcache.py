"""A list+watch cache of one resource, like client-go's reflector: list, then watch from the list's
resourceVersion with bookmarks; resume from the last resourceVersion after a dropped stream; re-list on
410 Gone; back off on errors. A resource whose API is not installed (404, e.g. no Volcano CRDs) counts as
synced and empty, and is listed again every `absent_retry` seconds.

Lists are paginated (issue 15): `limit=PAGE_SIZE` and the `continue` token of each answer, so a list never holds
more than one page of JSON; each page is turned into views and dropped. The first page is a consistent read
(resourceVersion unset), not resourceVersion="0": an API server before the snapshottable watch cache (KEP-4988,
ListFromCacheSnapshot, beta and on by default from 1.34) serves RV=0 from its watch cache and ignores `limit`,
answering the whole collection in one body, the very thing pagination is here to avoid; a consistent paginated list
is paginated on every version (from etcd on old ones, from the cache's snapshots on recent ones) and cannot travel
back in time on a lagging API server. A page that fails is tried again with backoff (PAGE_RETRIES); a 410 Gone on a
page (its continue token expired) starts the list over (LIST_RESTARTS). Until the last page is in, the items of the
previous list stay in force, whole: a list replaces them all at once or not at all. The watch starts from the
list's resourceVersion. (The streaming list, a watch with sendInitialEvents=true, is not used: see `list`.)

Readers are told only what they can see. A view is compared with the one cached for its key: an event whose view is
equal (a node heartbeat, a pod condition, managedFields, a status field no view keeps) changes neither the items,
nor `version`, nor calls `on_change`; `apply_event` returns whether it changed the view. A relist keeps the cached
view object of an unchanged item and reports only the items that differ.

No object can stop a cache. Each object is converted on its own: one that cannot be (any exception from its key or
its view: a bad quantity or duration, a field of the wrong type, RecursionError, OverflowError) is skipped, logged
once per version (uid + resourceVersion, not again on every relist) with its kind, name and the error, reported to
`on_skip` (a metric: `count_skips`), and listed in `skipped` until it is readable again (a later MODIFIED) or
deleted; the list, the watch and the resourceVersion bookkeeping go on. JSON nested deeper than Python's C parser
allows (about 1000 levels) is parsed without recursion (`parse_json`), so one such object neither fails the list nor
the watch; a watch line that is not JSON at all is skipped and logged.

The cache also records when it last heard from the API server (a successful list, any watch line, bookmarks
included): `stale_for(now)` and `heard_within(seconds)` let readiness notice a cache that stopped following the
cluster (shared.serving.STALE_AFTER).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from json.scanner import NUMBER_RE
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter

from shared.kinds import Watched
from shared.kube import Gone, NotFound, Query, get_stream
from shared.views import ViewError

V = TypeVar("V")
log = logging.getLogger("reservoir.watchcache")
WATCH_TIMEOUT_SECONDS = 290
LIST_TIMEOUT_SECONDS = 60  # one page of a list
BACKOFF_START, BACKOFF_MAX = 0.5, 30.0
PAGE_SIZE = 500  # objects per page of a list (client-go's reflector pages by 500 too)
PAGE_RETRIES = 3  # a page that fails is tried again this many times, with backoff from PAGE_BACKOFF_START
PAGE_BACKOFF_START = 0.5
LIST_RESTARTS = 3  # a list whose continue token expires (410) starts over at most this many times in a row


# --- JSON that may nest deeper than json.loads allows ---

_DECODER = json.JSONDecoder()
# the C string scanner json.loads itself uses (typeshed does not declare it)
_scan_string: Callable[[str, int], tuple[str, int]] = vars(json.decoder)["scanstring"]
_SPACE = re.compile(r"[ \t\n\r]*")
_LITERALS = {"true": True, "false": False, "null": None}
# Containers the C parser may still try after it ran out of recursion this many times in one document; deeper ones
# are parsed by the loop below. Each failed try costs at most one C pass over the document, so this bounds the waste.
_C_RETRIES = 16


def parse_json(data: bytes | str) -> Any:
    """`json.loads`, except that a document nested deeper than the C parser's recursion limit is parsed too, by an
    explicit stack instead of recursion (the shallow parts of it still by the C parser). Raises ValueError for text
    that is not JSON. Measured: a 1000-deep object in a list of 1000 PodGroups costs about twice json.loads."""
    try:
        return json.loads(data)
    except RecursionError:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        value, end = _parse_iteratively(text, _space(text, 0))
        if _space(text, end) != len(text):
            raise ValueError(f"extra data after the JSON value at character {end}") from None
        return value


def _space(text: str, pos: int) -> int:
    """Where the whitespace at `pos` ends."""
    match = _SPACE.match(text, pos)
    return match.end() if match else pos


def _scalar(text: str, pos: int) -> tuple[Any, int]:
    if text.startswith('"', pos):
        return _scan_string(text, pos + 1)
    number = NUMBER_RE.match(text, pos)
    if number is not None:
        integer, fraction, exponent = number.groups()
        value: Any = float(integer + (fraction or "") + (exponent or "")) if fraction or exponent else int(integer)
        return value, number.end()
    for word, value in _LITERALS.items():
        if text.startswith(word, pos):
            return value, pos + len(word)
    raise ValueError(f"expected a JSON value at character {pos}")


def _key(text: str, pos: int) -> tuple[str, int]:
    pos = _space(text, pos)
    if not text.startswith('"', pos):
        raise ValueError(f"expected an object key at character {pos}")
    key, pos = _scan_string(text, pos + 1)
    pos = _space(text, pos)
    if not text.startswith(":", pos):
        raise ValueError(f"expected ':' at character {pos}")
    return key, pos + 1


def _parse_iteratively(text: str, pos: int) -> tuple[Any, int]:
    """One JSON value starting at `pos` (no leading space), and where it ends; no recursion."""
    stack: list[tuple[dict[str, Any] | list[Any], str]] = []  # open containers, each with its pending key
    retries = _C_RETRIES
    while True:
        pos = _space(text, pos)
        opening = text[pos:pos + 1]
        value: Any
        if opening in ("{", "["):
            parsed = False
            if retries > 0:
                try:
                    value, pos = _DECODER.raw_decode(text, pos)
                    parsed = True
                except RecursionError:
                    retries -= 1
            if not parsed:
                after = _space(text, pos + 1)
                closing = "}" if opening == "{" else "]"
                if text.startswith(closing, after):
                    value, pos = ({} if opening == "{" else []), after + 1
                elif opening == "{":
                    key, pos = _key(text, after)
                    stack.append(({}, key))
                    continue
                else:
                    stack.append(([], ""))
                    pos = after
                    continue
        else:
            value, pos = _scalar(text, pos)
        while True:  # attach the value to the innermost open container; close the containers that end here
            if not stack:
                return value, pos
            container, key = stack[-1]
            if isinstance(container, dict):
                container[key] = value
            else:
                container.append(value)
            pos = _space(text, pos)
            if text.startswith(",", pos):
                if isinstance(container, dict):
                    key, pos = _key(text, pos + 1)
                    stack[-1] = (container, key)
                else:
                    pos += 1
                break
            if text.startswith("}" if isinstance(container, dict) else "]", pos):
                stack.pop()
                value, pos = container, pos + 1
                continue
            raise ValueError(f"expected ',' or the end of the container at character {pos}")


# --- objects a cache could not read ---

@dataclass(frozen=True)
class Skipped:
    """One object version a cache could not read."""

    cache: str  # the cache's name (nodes, pods, podgroups, ...)
    kind: str  # the object's kind (as it says, else as its view says), else the cache's name
    name: str  # "namespace/name", or "name" for a cluster-scoped object
    uid: str
    resource_version: str
    error: str


def count_skips(registry: CollectorRegistry,
                name: str = "reservoir_watch_skipped_objects_total") -> Callable[[Skipped], None]:
    """Register a Counter of skipped object versions, by cache, in `registry`, and return the `on_skip` hook that
    counts into it (one hook for all the caches of one program)."""
    counter = Counter(name, "Object versions a watch cache could not read and skipped, by cache", ["cache"],
                      registry=registry)
    return lambda skipped: counter.labels(skipped.cache).inc()


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _name_of(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return "(no metadata)"
    name, namespace = _text(meta.get("name")) or "(no name)", _text(meta.get("namespace"))
    return f"{namespace}/{name}" if namespace else name


def _error_text(err: BaseException) -> str:
    """The error as a skip reports it (beside the object's kind and name: a ViewError's detail, without them)."""
    text = (err.detail if isinstance(err, ViewError) else str(err)) or type(err).__name__
    return text if len(text) <= 500 else text[:500] + "..."


_UNREADABLE = object()  # what _convert returns for an object it skipped


def _same(old: Any, new: Any) -> bool:
    """Does a reader see any difference between two views of one object? Any error comparing them: they differ."""
    if old is new:
        return True
    try:
        return bool(old == new)
    except Exception:
        return False


class _Expired(Exception):
    """The continue token of a list expired (410 Gone on a page after the first): the list starts over."""


@dataclass
class _Listing:
    """A list in progress: what it has read so far, not yet in force."""

    items: dict[Any, Any]
    skipped: dict[Any, Skipped]
    resource_version: str = ""
    pages: int = 0


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
        on_skip: Callable[[Skipped], None] | None = None,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self.api = api
        self.name = name
        self.path = path
        self.convert = convert
        self.key = key
        self.field_selector = field_selector
        self.on_change = on_change  # called for each change of the view of an object, not for an event that keeps it
        self.on_skip = on_skip
        self.absent_retry = absent_retry
        self.page_size = page_size
        self._items: dict[Any, V] = {}
        self._skipped: dict[Any, Skipped] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.absent = False
        self.version = 0  # bumped on every change of the views, so readers can cache what they derive from the items
        self.heard_at: float | None = None  # time.monotonic() of the last answer from the API server
        # True while a list is put in force: the DELETED then reported is an object the new list lacks (deleted at
        # some moment since the watch last spoke), not one a watch event saw go
        self.relisting = False
        self._created_at = time.monotonic()

    @classmethod
    def of(cls, api: client.ApiClient, watched: Watched, on_change: Callable[[str, Any], None] | None = None,
           on_skip: Callable[[Skipped], None] | None = None) -> WatchCache[Any]:
        """A cache of one `shared.kinds.Watched` kind."""
        return cls(api, watched.name, watched.path, watched.convert, key=watched.key,
                   field_selector=watched.field_selector, on_change=on_change, on_skip=on_skip)

    @property
    def items(self) -> Mapping[Any, V]:
        return MappingProxyType(self._items)

    @property
    def skipped(self) -> Mapping[str, str]:
        """The objects skipped now because they cannot be read: "namespace/name" (or "name") -> the error."""
        return {record.name: record.error for record in self._skipped.values()}

    @property
    def skipped_objects(self) -> tuple[Skipped, ...]:
        """The same, as records (kind, uid, resourceVersion too), by name."""
        return tuple(sorted(self._skipped.values(), key=lambda record: record.name))

    # --- when the cache last heard from the API server ---

    def heard(self, now: float | None = None) -> None:
        self.heard_at = time.monotonic() if now is None else now

    def stale_for(self, now: float | None = None) -> float:
        """Seconds (time.monotonic) since the cache last heard from the API server: a successful list (or a 404 for
        an API not installed) or any watch line, bookmarks included; since its creation when it never has."""
        now = time.monotonic() if now is None else now
        return max(0.0, now - (self._created_at if self.heard_at is None else self.heard_at))

    def heard_within(self, seconds: float, now: float | None = None) -> bool:
        return self.heard_at is not None and self.stale_for(now) <= seconds

    # --- converting objects one by one ---

    def _query(self, **extra: Any) -> Query:
        query = [(k, v) for k, v in extra.items() if v is not None]
        if self.field_selector:
            query.append(("fieldSelector", self.field_selector))
        return query

    def _key_of(self, obj: Any, skipped: dict[Any, Skipped] | None = None) -> Any:
        """The object's cache key; a stand-in key (and the object recorded as skipped, in `skipped` when given, else
        in the cache's own record) when it has none."""
        try:
            key = self.key(obj)
            hash(key)
            return key
        except Exception as err:
            stand_in = ("(unreadable key)", _name_of(obj), self._version_of(obj))
            self._skip(stand_in, obj, f"no usable name: {_error_text(err)}", skipped=skipped)
            return None

    @staticmethod
    def _version_of(obj: Any) -> tuple[str, str]:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping):
            return ("", "")
        return (_text(meta.get("uid")), _text(meta.get("resourceVersion")))

    def _skip(self, key: Any, obj: Any, error: str, kind: str = "", skipped: dict[Any, Skipped] | None = None) -> None:
        """Record the object as skipped (in `skipped`, a list in progress, when given); report it unless the cache
        already reported this very version (uid and resourceVersion) as skipped."""
        uid, rv = self._version_of(obj)
        before = self._skipped.get(key)  # during a list: what the lists and watch events before it skipped
        kind = (_text(obj.get("kind")) if isinstance(obj, Mapping) else "") or kind  # list items often carry none
        record = Skipped(self.name, kind or self.name, _name_of(obj), uid, rv, error)
        (self._skipped if skipped is None else skipped)[key] = record
        if before is not None and (before.uid, before.resource_version) == (uid, rv) and uid and rv:
            return  # this version was reported already (a relist): once is enough
        log.warning("cache=%s skipped=%s %s uid=%s resourceVersion=%s error=%s: the object is left out until it is "
                    "readable", self.name, record.kind, record.name, uid or "-", rv or "-", error)
        if self.on_skip is not None:
            try:
                self.on_skip(record)
            except Exception:
                log.exception("cache=%s on_skip failed", self.name)

    def _convert(self, key: Any, obj: Any, skipped: dict[Any, Skipped] | None = None) -> Any:
        """The object's view, or _UNREADABLE (recorded as skipped: in `skipped`, a list in progress, when given)."""
        try:
            if not isinstance(obj, Mapping):
                raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
            value = self.convert(obj)
        except Exception as err:  # RecursionError, OverflowError, ValueError, TypeError, KeyError, ...
            self._skip(key, obj, _error_text(err), err.kind if isinstance(err, ViewError) else "", skipped=skipped)
            return _UNREADABLE
        if key in self._skipped:
            if skipped is None:
                del self._skipped[key]
            log.info("cache=%s readable=%s: back in the cache", self.name, _name_of(obj))
        return value

    def _notify(self, event: str, value: V | None) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(event, value)
        except Exception:
            log.exception("cache=%s on_change(%s) failed", self.name, event)

    # --- a list: pages read into a _Listing, then put in force at once ---

    def _listing(self) -> _Listing:
        return _Listing(items={}, skipped={})

    def _read_into(self, listing: _Listing, objects: Iterable[Any]) -> None:
        """Convert the objects of one page into `listing`; a view equal to the one cached is kept as the cached
        object (no second copy of an unchanged object, and the commit sees it unchanged by identity)."""
        for obj in objects:
            key = self._key_of(obj, listing.skipped)
            if key is None:
                continue
            value = self._convert(key, obj, listing.skipped)
            if value is _UNREADABLE:
                continue
            cached = self._items.get(key)
            listing.items[key] = cached if cached is not None and _same(cached, value) else value

    def _commit(self, listing: _Listing) -> bool:
        """Put a complete list in force: the items and the skipped records at once; `on_change` for each item that
        was added, changed or deleted; `version` bumped when any was. Whether any was."""
        old = self._items
        self._items, self._skipped = listing.items, listing.skipped
        deleted = [value for key, value in old.items() if key not in self._items]
        changed = [("MODIFIED" if key in old else "ADDED", value) for key, value in self._items.items()
                   if old.get(key) is not value]
        if deleted or changed:
            self.version += 1
        self.relisting = True  # on_change may tell a list's DELETED (gone while unwatched) from a watch's
        try:
            for value in deleted:
                self._notify("DELETED", value)
            for event, value in changed:
                self._notify(event, value)
        finally:
            self.relisting = False
        return bool(deleted or changed)

    def _replace(self, objects: Iterable[Any]) -> bool:
        """The items of a fresh list given whole (one page): each object converted on its own; the skipped ones
        recorded anew (a version reported before is not reported again). Whether any view changed."""
        listing = self._listing()
        self._read_into(listing, objects)
        return self._commit(listing)

    # --- list and watch ---

    async def list(self) -> None:
        """List every object, page by page (module docstring), and put the result in force at once; then the cache
        is synced, at the list's resourceVersion. A 404 (the API is not installed) counts as synced and empty.

        Not the streaming list (a watch with sendInitialEvents=true and resourceVersionMatch=NotOlderThan): it
        would bound memory no better than one page at a time, and it needs a second path for servers that refuse it
        (the WatchList gate off, before 1.32) with its fallback; the paginated list works on every server."""
        restarts = 0
        while True:
            try:
                listing = await self._list_pages()
                break
            except _Expired as err:
                restarts += 1
                if restarts > LIST_RESTARTS:
                    raise RuntimeError(f"list {self.path}: its continue token expired {restarts} times in a row; "
                                       f"the items of the last complete list stay in force") from err
                log.info("cache=%s list continue token expired (%s): listing again from the start", self.name, err)
        if listing is None:
            if not self.absent:
                log.warning("cache=%s path=%s api not installed: treated as empty, retrying every %ss",
                            self.name, self.path, self.absent_retry)
            self.absent = True
            self._replace(())
            self.resource_version = ""
            self.synced.set()
            return
        self.absent = False
        self._commit(listing)
        self.resource_version = listing.resource_version
        self.synced.set()

    async def _list_pages(self) -> _Listing | None:
        """Every page of one list, read into a _Listing; None when the API is not installed (404). Raises _Expired
        when a continue token expired (410 on a page after the first)."""
        listing = self._listing()
        token: str | None = None
        while True:
            try:
                data = await self._page(token)
            except NotFound:
                self.heard()
                return None
            except Gone as err:
                if token is None:
                    raise
                raise _Expired(err.reason or "410 Gone") from None
            self.heard()
            items, meta = data.get("items"), data["metadata"]
            del data
            listing.pages += 1
            self._read_into(listing, items or ())
            del items  # the page's JSON goes now: only views are kept
            listing.resource_version = _text(meta.get("resourceVersion"))
            token = _text(meta.get("continue")) or None
            if token is None:
                return listing

    async def _page(self, token: str | None) -> dict[str, Any]:
        """One page of the list (the first when `token` is None), as JSON with items and metadata. A page that fails
        (no answer, a 5xx, a body that is not a list) is tried again PAGE_RETRIES times with backoff, with the same
        continue token; NotFound, Gone and every other 4xx but 429 are not retried (the caller decides: a refusal is
        not cured by asking again at once)."""
        query = self._query(limit=self.page_size or None, **{"continue": token})
        backoff = PAGE_BACKOFF_START
        for attempt in range(PAGE_RETRIES + 1):
            try:
                response = await get_stream(self.api, self.path, query, timeout=LIST_TIMEOUT_SECONDS)
                try:
                    body = await response.read()
                finally:
                    response.release()
                data = parse_json(body)
                items = data.get("items") if isinstance(data, dict) else None
                meta = data.get("metadata") if isinstance(data, dict) else None
                if not isinstance(meta, dict) or not isinstance(items, (list, type(None))):
                    raise RuntimeError(f"list {self.path} answered without items and metadata: {body[:300]!r}")
                del body
                assert isinstance(data, dict)
                return data
            except (NotFound, Gone, asyncio.CancelledError):
                raise
            except Exception as err:
                refused = isinstance(err, ApiException) and isinstance(err.status, int) and \
                    400 <= err.status < 500 and err.status != 429
                if attempt == PAGE_RETRIES or refused:  # a refusal (401, 403, 422...) is not cured by asking again
                    raise
                status = f" status={err.status}" if isinstance(err, ApiException) else ""
                log.warning("cache=%s list page %s failed (%s%s): trying it again in %.1fs", self.name,
                            "after a continue token" if token else "1", _error_text(err), status, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
        raise AssertionError("unreachable")

    def apply_event(self, event: Mapping[str, Any]) -> bool:
        """One watch event; whether it changed the view of an object (what readers see: `items`, `version`,
        `on_change`). An event that says nothing usable is logged and ignored; an object that cannot be read is
        skipped (module docstring); an event whose view equals the cached one changes nothing; ERROR raises (Gone
        for 410: list again). Any event counts as word from the API server (`stale_for`), a bookmark too."""
        self.heard()
        if not isinstance(event, Mapping):
            log.warning("cache=%s watch event ignored: not a JSON object", self.name)
            return False
        kind = event.get("type")
        obj = event.get("object")
        if kind == "ERROR":
            status = obj if isinstance(obj, Mapping) else {}
            if status.get("code") == 410:
                raise Gone(status=410, reason=_text(status.get("message")) or "resourceVersion too old")
            raise RuntimeError(f"watch error: {_error_text(Exception(status.get('message', status)))}")
        if not isinstance(obj, Mapping):
            log.warning("cache=%s watch event %r ignored: its object is not a JSON object", self.name, kind)
            return False
        _, rv = self._version_of(obj)
        if rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return False
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.warning("cache=%s watch event of unknown type %r ignored", self.name, kind)
            return False
        key = self._key_of(obj)
        if key is None:
            return False
        if kind == "DELETED":
            self._skipped.pop(key, None)  # a skipped object that is deleted is forgotten
            return self._drop(key)
        value = self._convert(key, obj)
        if value is _UNREADABLE:  # what was cached is no longer what the object says: out, until readable again
            return self._drop(key)
        cached = self._items.get(key)
        if cached is not None and _same(cached, value):
            return False  # nothing a reader sees changed: a heartbeat, a condition, a status no view keeps
        self._items[key] = value
        self.version += 1
        self._notify(kind, value)
        return True

    def _drop(self, key: Any) -> bool:
        gone = self._items.pop(key, None)
        if gone is None:
            return False
        self.version += 1
        self._notify("DELETED", gone)
        return True

    async def watch_once(self) -> None:
        query = self._query(watch="true", allowWatchBookmarks="true", resourceVersion=self.resource_version,
                            timeoutSeconds=WATCH_TIMEOUT_SECONDS)
        response = await get_stream(self.api, self.path, query, timeout=WATCH_TIMEOUT_SECONDS + 30)
        self.heard()
        try:
            while True:
                line = await response.content.readline()
                if not line:
                    return
                self.heard()
                if not line.strip():
                    continue
                try:
                    event = parse_json(line)
                except ValueError as err:  # not JSON: nothing in it can be trusted, not even a resourceVersion
                    log.warning("cache=%s watch line skipped, not JSON (%s): %r", self.name, err, line[:200])
                    continue
                self.apply_event(event)
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
                if need_list:  # the list itself was refused with 410: not by listing again at once
                    log.warning("cache=%s list answered 410 (%s) retry_in=%.1fs", self.name, err.reason, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                log.info("cache=%s resourceVersion expired (%s): listing again", self.name, err.reason)
                need_list = True
            except ApiException as err:
                log.warning("cache=%s error=%s status=%s retry_in=%.1fs", self.name, err.reason, err.status, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
            except Exception as err:  # network drops, a list that is not JSON: resume from the last resourceVersion
                log.warning("cache=%s error=%s retry_in=%.1fs", self.name, _error_text(err), backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
