"""The client edge (shared.kube): paths, status codes turned into error classes, and JSON requests over real HTTP
on loopback (an aiohttp app standing in for kube-apiserver)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from shared import kinds
from shared.kube import (
    JSON_PATCH,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    Throttled,
    api_error,
    get_json,
    get_stream,
    resource_path,
    send_json,
)
from shared.watchcache import WatchCache
from tests.builders import loopback_api


def test_resource_paths() -> None:
    assert resource_path("v1", "nodes") == "/api/v1/nodes"
    assert resource_path("v1", "nodes", "n1") == "/api/v1/nodes/n1"
    assert resource_path("v1", "pods", "p", "ns", "eviction") == "/api/v1/namespaces/ns/pods/p/eviction"
    assert resource_path("v1", "events", namespace="ns") == "/api/v1/namespaces/ns/events"
    assert (resource_path("scheduling.volcano.sh/v1beta1", "queues", "q", subresource="status")
            == "/apis/scheduling.volcano.sh/v1beta1/queues/q/status")
    assert resource_path("v1", "pods", "a/b", "ns") == "/api/v1/namespaces/ns/pods/a%2Fb", "a name is one segment"


@pytest.mark.parametrize(("status", "cls"), [(404, NotFound), (409, Conflict), (410, Gone), (422, Invalid),
                                             (429, Throttled)])
def test_each_named_status_has_its_class_and_stays_an_api_exception(status: int, cls: type[ApiException]) -> None:
    err = api_error(status, "Why", b"{}")
    assert type(err) is cls and isinstance(err, ApiException)
    assert (err.status, err.reason, err.body) == (status, "Why", b"{}")


@pytest.mark.parametrize("status", [400, 401, 403, 500, 503])
def test_other_statuses_are_plain_api_exceptions(status: int) -> None:
    err = api_error(status, "Other")
    assert type(err) is ApiException and err.status == status


class FakeApi:
    """Answers from a table path -> (status, JSON body, or lines for a stream); records every request."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, Any]] = {}
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.requests.append({"method": request.method, "path": request.path, "query": dict(request.query),
                              "content_type": request.headers.get("Content-Type"),
                              "body": json.loads(raw) if raw else None})
        status, answer = self.answers.get((request.method, request.path), (404, {"kind": "Status", "code": 404}))
        if isinstance(answer, list):  # a watch: one JSON event per line
            response = web.StreamResponse(status=status)
            await response.prepare(request)
            for event in answer:
                await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
            return response
        if answer is None:
            return web.Response(status=status)
        return web.json_response(answer, status=status)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApi, client.ApiClient]]:
    api_server = FakeApi()
    async with loopback_api(api_server.handle) as api:
        yield api_server, api


async def test_get_json_returns_the_object_and_sends_the_query(fake: tuple[FakeApi, client.ApiClient]) -> None:
    server, api = fake
    server.answers[("GET", "/api/v1/nodes")] = (200, {"items": [], "metadata": {"resourceVersion": "7"}})
    assert await get_json(api, "/api/v1/nodes", [("fieldSelector", "metadata.name=x")], timeout=5) == {
        "items": [], "metadata": {"resourceVersion": "7"}}
    assert server.requests[0]["query"] == {"fieldSelector": "metadata.name=x"}


async def test_an_answer_outside_2xx_raises_its_class(fake: tuple[FakeApi, client.ApiClient]) -> None:
    """The client does not check the status of a raw response itself: the edge does, for every request."""
    server, api = fake
    with pytest.raises(NotFound) as err:
        await get_json(api, "/apis/scheduling.volcano.sh/v1beta1/queues")
    assert err.value.status == 404 and err.value.reason == "Not Found"
    server.answers[("PATCH", "/api/v1/nodes/n1")] = (422, {"kind": "Status", "code": 422})
    with pytest.raises(Invalid):
        await send_json(api, "PATCH", "/api/v1/nodes/n1", [{"op": "test", "path": "/a", "value": 1}],
                        content_type=JSON_PATCH)
    server.answers[("POST", "/api/v1/namespaces/ns/pods/p/eviction")] = (429, {"kind": "Status", "code": 429})
    with pytest.raises(Throttled):
        await send_json(api, "POST", "/api/v1/namespaces/ns/pods/p/eviction", {"kind": "Eviction"})
    server.answers[("GET", "/api/v1/pods")] = (403, {"kind": "Status", "code": 403})
    with pytest.raises(ApiException) as plain:
        await get_json(api, "/api/v1/pods")
    assert type(plain.value) is ApiException and plain.value.status == 403


async def test_send_json_sends_the_body_with_its_content_type(fake: tuple[FakeApi, client.ApiClient]) -> None:
    server, api = fake
    ops = [{"op": "add", "path": "/spec/tolerations/-", "value": {"key": "k"}}]
    server.answers[("PATCH", "/api/v1/namespaces/ns/pods/p")] = (200, {"kind": "Pod"})
    assert await send_json(api, "PATCH", "/api/v1/namespaces/ns/pods/p", ops, content_type=JSON_PATCH) == {
        "kind": "Pod"}
    assert server.requests[-1] == {"method": "PATCH", "path": "/api/v1/namespaces/ns/pods/p", "query": {},
                                   "content_type": JSON_PATCH, "body": ops}
    server.answers[("DELETE", "/apis/reservoir.sh/v1alpha1/reservations/r")] = (200, None)
    assert await send_json(api, "DELETE", "/apis/reservoir.sh/v1alpha1/reservations/r") == {}


async def test_get_stream_hands_back_the_open_watch(fake: tuple[FakeApi, client.ApiClient]) -> None:
    server, api = fake
    events = [{"type": "ADDED", "object": {"metadata": {"name": "a"}}}, {"type": "BOOKMARK", "object": {}}]
    server.answers[("GET", "/api/v1/nodes")] = (200, events)
    response = await get_stream(api, "/api/v1/nodes", [("watch", "true")])
    try:
        assert [json.loads(await response.content.readline()) for _ in events] == events
    finally:
        response.release()
    server.answers[("GET", "/api/v1/nodes")] = (410, {"kind": "Status", "code": 410})
    with pytest.raises(Gone):
        await get_stream(api, "/api/v1/nodes", [("watch", "true")])


async def test_watch_cache_counts_an_api_not_installed_as_synced_and_empty(
        fake: tuple[FakeApi, client.ApiClient]) -> None:
    server, api = fake
    cache: WatchCache[Any] = WatchCache.of(api, kinds.QUEUES)
    await cache.list()
    assert cache.absent and cache.synced.is_set() and dict(cache.items) == {}
    server.answers[("GET", "/apis/scheduling.volcano.sh/v1beta1/queues")] = (
        200, {"items": [{"metadata": {"name": "gold"}}], "metadata": {"resourceVersion": "9"}})
    await cache.list()
    assert not cache.absent and list(cache.items) == ["gold"] and cache.resource_version == "9"


async def test_watch_cache_sees_an_expired_resource_version_as_gone(fake: tuple[FakeApi, client.ApiClient]) -> None:
    """Either way the apiserver says it: a 410 answer to the watch, or an ERROR event with code 410."""
    server, api = fake
    cache: WatchCache[Any] = WatchCache.of(api, kinds.NODES)
    server.answers[("GET", "/api/v1/nodes")] = (410, {"kind": "Status", "code": 410})
    with pytest.raises(Gone):
        await cache.watch_once()
    server.answers[("GET", "/api/v1/nodes")] = (200, [{"type": "ERROR", "object": {"code": 410, "message": "old"}}])
    with pytest.raises(Gone) as err:
        await cache.watch_once()
    assert err.value.reason == "old"
