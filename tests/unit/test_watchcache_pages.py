"""The watch cache's paginated list (issue 15) against a loopback stand-in API server: `limit` and `continue` across
pages, a 410 (expired continue token) in the middle of a list, a page that fails; the items of the last complete
list stay in force until a whole new list replaces them. And "changed for the planner": an event whose view is
equal to the cached one (a node heartbeat, a pod condition) neither bumps `version` nor calls `on_change`, so the
agent does not wake; one that changes what a view keeps (a label) does."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agent.controller import Agent
from shared import kinds, watchcache
from shared.watchcache import WatchCache
from tests.builders import loopback_api

NODES = "/api/v1/nodes"


def node_obj(name: str, rv: str = "1", heartbeat: str = "2026-11-22T12:00:00Z", **labels: str) -> dict[str, Any]:
    """A Node as the API server sends it: conditions with heartbeat times, managedFields, a resourceVersion."""
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv, "labels": {"zone": "a", **labels},
                     "creationTimestamp": "2026-11-01T00:00:00Z",
                     "managedFields": [{"manager": "kubelet", "time": heartbeat, "operation": "Update"}]},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"},
                   "conditions": [{"type": t, "status": s, "lastHeartbeatTime": heartbeat,
                                   "lastTransitionTime": heartbeat, "reason": "r", "message": "m"}
                                  for t, s in (("Ready", "True"), ("MemoryPressure", "False"))]},
    }


class PagedServer:
    """Serves `objects` as a paginated list (continue token "page-<index>"), records every list request's query, and
    lets a test break a page: `fail` maps a continue token (or "" for the first page) to the statuses to answer, one
    per try, before it answers normally."""

    def __init__(self, objects: list[dict[str, Any]], rv: str = "500") -> None:
        self.objects = objects
        self.rv = rv
        self.requests: list[dict[str, str]] = []
        self.fail: dict[str, list[int]] = {}
        self.on_request: Callable[[dict[str, str]], None] | None = None
        self.watch_lines: list[bytes] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        if query.get("watch") == "true":
            self.requests.append(query)
            response = web.StreamResponse(status=200)
            await response.prepare(request)
            for line in self.watch_lines:
                await response.write(line + b"\n")
            await asyncio.sleep(0.3)  # an open watch that says nothing more, for a while
            return response
        self.requests.append(query)
        if self.on_request is not None:
            self.on_request(query)
        token = query.get("continue", "")
        failures = self.fail.get(token)
        if failures:
            status = failures.pop(0)
            body = {"kind": "Status", "code": status, "reason": "Expired" if status == 410 else "InternalError"}
            return web.json_response(body, status=status)
        start = int(token.removeprefix("page-")) if token else 0
        limit = int(query.get("limit", "0")) or len(self.objects)
        page = self.objects[start:start + limit]
        meta: dict[str, Any] = {"resourceVersion": self.rv}
        if start + limit < len(self.objects):
            meta["continue"] = f"page-{start + limit}"
        return web.json_response({"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": page})


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchcache, "PAGE_BACKOFF_START", 0.01)


@pytest.fixture
async def served() -> AsyncIterator[tuple[PagedServer, client.ApiClient]]:
    server = PagedServer([node_obj(f"n-{i:04d}", rv=str(i + 1)) for i in range(1234)])
    async with loopback_api(server.handle, "GET") as api:
        yield server, api


def lists(server: PagedServer) -> list[dict[str, str]]:
    return [q for q in server.requests if q.get("watch") != "true"]


async def test_a_list_is_read_page_by_page_with_continue_tokens(served: tuple[PagedServer, client.ApiClient]) -> None:
    server, api = served
    cache: WatchCache[Any] = WatchCache.of(api, kinds.NODES)
    await cache.list()
    assert [(q.get("limit"), q.get("continue")) for q in lists(server)] == [
        ("500", None), ("500", "page-500"), ("500", "page-1000")]
    assert all("resourceVersion" not in q for q in lists(server)), "a consistent read: pagination holds on any server"
    assert len(cache.items) == 1234 and cache.items["n-1233"].labels == {"zone": "a"}
    assert cache.synced.is_set() and cache.resource_version == "500" and cache.version == 1


async def test_the_watch_starts_from_the_list_s_resource_version(served: tuple[PagedServer, client.ApiClient]) -> None:
    server, api = served
    server.watch_lines = [json.dumps({"type": "ADDED", "object": node_obj("late", rv="501")}).encode()]
    cache: WatchCache[Any] = WatchCache.of(api, kinds.NODES)
    task = asyncio.create_task(cache.run())
    try:
        for _ in range(200):
            if "late" in cache.items:
                break
            await asyncio.sleep(0.02)
        watch = next(q for q in server.requests if q.get("watch") == "true")
        assert watch["resourceVersion"] == "500" and watch["allowWatchBookmarks"] == "true"
        assert "late" in cache.items and len(cache.items) == 1235
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_410_in_the_middle_of_a_list_starts_it_over_and_the_old_items_stay_until_then(
        served: tuple[PagedServer, client.ApiClient]) -> None:
    server, api = served
    seen: list[tuple[str, Any]] = []
    cache: WatchCache[Any] = WatchCache.of(api, kinds.NODES, on_change=lambda event, value: seen.append((event, value)))
    cache._replace([node_obj("old-node")])
    cache.resource_version, version_before = "7", cache.version
    observed: list[tuple[list[str], str, int]] = []
    server.on_request = lambda query: observed.append((list(cache.items), cache.resource_version, cache.version))
    server.fail["page-1000"] = [410]  # the token of the third page expired
    seen.clear()
    await cache.list()
    assert [q.get("continue") for q in lists(server)] == [None, "page-500", "page-1000", None, "page-500",
                                                          "page-1000"], "restarted from the first page"
    assert all(state == (["old-node"], "7", version_before) for state in observed), \
        "while the list runs, the last complete list is in force, whole"
    assert len(cache.items) == 1234 and "old-node" not in cache.items and cache.resource_version == "500"
    assert ("DELETED", "old-node") in [(e, v.name) for e, v in seen] and len(seen) == 1235, \
        "one notification per change, none for the abandoned list"


async def test_a_list_whose_token_keeps_expiring_gives_up_and_leaves_the_old_items(
        served: tuple[PagedServer, client.ApiClient]) -> None:
    server, api = served
    cache: WatchCache[Any] = WatchCache.of(api, kinds.NODES)
    cache._replace([node_obj("old-node")])
    server.fail["page-500"] = [410] * (watchcache.LIST_RESTARTS + 1)
    with pytest.raises(RuntimeError, match="continue token expired"):
        await cache.list()
    assert list(cache.items) == ["old-node"] and not cache.synced.is_set()


async def test_a_page_that_fails_is_tried_again_with_the_same_token(
        served: tuple[PagedServer, client.ApiClient]) -> None:
    server, api = served
    cache: WatchCache[Any] = WatchCache.of(api, kinds.NODES)
    server.fail["page-500"] = [500, 503]
    await cache.list()
    assert [q.get("continue") for q in lists(server)] == [None, "page-500", "page-500", "page-500", "page-1000"]
    assert len(cache.items) == 1234 and cache.synced.is_set()


async def test_a_refused_page_is_not_asked_again_and_a_throttled_one_is(
        served: tuple[PagedServer, client.ApiClient]) -> None:
    """A 403 (RBAC) or 401 is not cured by asking again at once: the list fails at the first answer, so `reservoir
    status` says so at once and the cache's run() backs off as for any failed list; a 429 is tried again."""
    server, api = served
    cache: WatchCache[Any] = WatchCache.of(api, kinds.NODES)
    server.fail["page-500"] = [403]
    with pytest.raises(ApiException) as err:
        await cache.list()
    assert err.value.status == 403
    assert [q.get("continue") for q in lists(server)] == [None, "page-500"]
    server.requests.clear()
    server.fail["page-500"] = [429]
    await cache.list()
    assert [q.get("continue") for q in lists(server)] == [None, "page-500", "page-500", "page-1000"]


async def test_a_page_that_keeps_failing_leaves_the_cache_as_it_was(
        served: tuple[PagedServer, client.ApiClient]) -> None:
    server, api = served
    seen: list[str] = []
    cache: WatchCache[Any] = WatchCache.of(api, kinds.NODES, on_change=lambda event, value: seen.append(event))
    cache._replace([node_obj("old-node"), {"metadata": {"name": "bad", "uid": "u", "resourceVersion": "3"},
                                           "status": {"allocatable": {"cpu": "banana"}}}])
    cache.resource_version, version, skipped = "7", cache.version, dict(cache.skipped)
    seen.clear()
    server.fail["page-1000"] = [500] * (watchcache.PAGE_RETRIES + 1)
    with pytest.raises(ApiException) as err:
        await cache.list()
    assert err.value.status == 500
    assert list(cache.items) == ["old-node"] and list(cache.skipped) == ["bad"] and cache.skipped == skipped
    assert (cache.resource_version, cache.version, seen) == ("7", version, [])
    assert [q.get("continue") for q in lists(server)].count("page-1000") == watchcache.PAGE_RETRIES + 1


async def test_run_backs_off_and_lists_again_after_a_failed_list(served: tuple[PagedServer, client.ApiClient],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    server, api = served
    monkeypatch.setattr(watchcache, "BACKOFF_START", 0.01)
    server.fail["page-500"] = [500] * (watchcache.PAGE_RETRIES + 1)
    cache: WatchCache[Any] = WatchCache.of(api, kinds.NODES)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.synced.wait(), 5)
        assert len(cache.items) == 1234
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- changed for the planner ---

def heartbeat(obj: dict[str, Any], rv: str, at: str) -> dict[str, Any]:
    beat = copy.deepcopy(obj)
    beat["metadata"]["resourceVersion"] = rv
    beat["metadata"]["managedFields"][0]["time"] = at
    for condition in beat["status"]["conditions"]:
        condition["lastHeartbeatTime"] = at
    return beat


def test_a_heartbeat_does_not_change_the_view_and_a_label_does() -> None:
    seen: list[tuple[str, Any]] = []
    cache: WatchCache[Any] = WatchCache.of(None, kinds.NODES,  # type: ignore[arg-type]
                                           on_change=lambda event, value: seen.append((event, value)))
    original = node_obj("n1", rv="10")
    assert cache.apply_event({"type": "ADDED", "object": original}) is True
    view, version = cache.items["n1"], cache.version
    for i in range(50):
        beat = heartbeat(original, rv=str(11 + i), at=f"2026-11-22T12:{i:02d}:30Z")
        assert cache.apply_event({"type": "MODIFIED", "object": beat}) is False
    assert len(seen) == 1 and cache.version == version and cache.items["n1"] is view
    assert cache.resource_version == "60", "the bookkeeping follows every event all the same"
    relabelled = heartbeat(original, rv="61", at="2026-11-22T13:00:00Z")
    relabelled["metadata"]["labels"]["reservoir.sh/lock"] = "team-a"
    assert cache.apply_event({"type": "MODIFIED", "object": relabelled}) is True
    assert seen[-1][0] == "MODIFIED" and seen[-1][1].labels["reservoir.sh/lock"] == "team-a"
    assert cache.version == version + 1
    not_ready = copy.deepcopy(relabelled)
    not_ready["status"]["conditions"][0]["status"] = "Unknown"
    assert cache.apply_event({"type": "MODIFIED", "object": not_ready}) is True, "readiness is read by the planner"


def test_a_pod_status_the_view_does_not_keep_changes_nothing_and_its_phase_does() -> None:
    seen: list[str] = []
    cache: WatchCache[Any] = WatchCache.of(None, kinds.PODS,  # type: ignore[arg-type]
                                           on_change=lambda event, value: seen.append(event))
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
           "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
           "status": {"phase": "Running", "startTime": "2026-11-22T12:00:00Z", "conditions": []}}
    cache.apply_event({"type": "ADDED", "object": pod})
    probed = copy.deepcopy(pod)
    probed["metadata"]["resourceVersion"] = "2"
    probed["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastProbeTime": "2026-11-22T12:01:00Z"}]
    probed["status"]["containerStatuses"] = [{"name": "c", "ready": True, "restartCount": 3}]
    assert cache.apply_event({"type": "MODIFIED", "object": probed}) is False
    done = copy.deepcopy(probed)
    done["status"]["phase"] = "Succeeded"
    assert cache.apply_event({"type": "MODIFIED", "object": done}) is True and seen == ["ADDED", "MODIFIED"]


def test_a_relist_reports_only_what_changed_and_keeps_unchanged_views() -> None:
    seen: list[tuple[str, str]] = []
    cache: WatchCache[Any] = WatchCache.of(None, kinds.NODES,  # type: ignore[arg-type]
                                           on_change=lambda event, value: seen.append((event, value.name)))
    nodes = [node_obj(f"n{i}", rv=str(i)) for i in range(3)]
    cache._replace(nodes)
    views, version = dict(cache.items), cache.version
    seen.clear()
    again = [heartbeat(n, rv=str(100 + i), at="2026-11-22T14:00:00Z") for i, n in enumerate(nodes)]
    assert cache._replace(again) is False
    assert seen == [] and cache.version == version and all(cache.items[k] is v for k, v in views.items())
    again[1]["metadata"]["labels"]["team"] = "b"
    assert cache._replace(again[:2]) is True
    assert sorted(seen) == [("DELETED", "n2"), ("MODIFIED", "n1")] and cache.version == version + 1


def test_the_agent_does_not_wake_for_heartbeats_and_wakes_for_a_label() -> None:
    agent = Agent(None)  # type: ignore[arg-type]
    original = node_obj("n1", rv="10")
    agent.nodes.apply_event({"type": "ADDED", "object": original})
    assert agent.changed.is_set()
    agent.changed.clear()
    for i in range(100):
        agent.nodes.apply_event({"type": "MODIFIED",
                                 "object": heartbeat(original, rv=str(11 + i), at=f"2026-11-22T12:00:{i % 60:02d}Z")})
    assert not agent.changed.is_set(), "100 heartbeats, no wake-up"
    relabelled = heartbeat(original, rv="200", at="2026-11-22T13:00:00Z")
    relabelled["metadata"]["labels"]["team"] = "b"
    agent.nodes.apply_event({"type": "MODIFIED", "object": relabelled})
    assert agent.changed.is_set()
