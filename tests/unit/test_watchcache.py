"""The watch cache (shared.watchcache) against poison: each object converted on its own, an unreadable one skipped,
logged once per version, counted and named, never stopping the list, the watch or the resourceVersion bookkeeping;
JSON nested deeper than json.loads allows; staleness for readiness. Events are driven directly (apply_event) and
over real HTTP on loopback (an aiohttp app standing in for kube-apiserver)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from shared import kinds
from shared.kube import Gone
from shared.serving import STALE_AFTER, add_probes, stale_caches
from shared.views import PodGroupView, QueueView
from shared.watchcache import WATCH_TIMEOUT_SECONDS, Skipped, WatchCache, count_skips, parse_json
from tests.builders import loopback_api

PODGROUPS = "/apis/scheduling.volcano.sh/v1beta1/podgroups"
QUEUES = "/apis/scheduling.volcano.sh/v1beta1/queues"


def podgroup(name: str, rv: str = "1", uid: str | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}", "resourceVersion": rv},
            "spec": {"minMember": 1, "queue": "q", **spec}}


def deep(depth: int) -> str:
    return '{"x":' * depth + "1" + "}" * depth


def deep_podgroup_text(name: str, depth: int = 1000) -> str:
    """A PodGroup whose spec holds JSON nested `depth` levels deep (as text: json.dumps cannot write it)."""
    head = json.dumps(podgroup(name))[:-2]  # without the closing "}}" of spec and object
    return head + ', "junk": ' + deep(depth) + "}}"


class Recorder:
    def __init__(self) -> None:
        self.skips: list[Skipped] = []
        self.changes: list[tuple[str, Any]] = []

    def on_skip(self, skipped: Skipped) -> None:
        self.skips.append(skipped)

    def on_change(self, event: str, value: Any) -> None:
        self.changes.append((event, value))


def cache_of(watched: kinds.Watched = kinds.PODGROUPS, api: Any = None) -> tuple[WatchCache[Any], Recorder]:
    seen = Recorder()
    return WatchCache.of(api, watched, on_change=seen.on_change, on_skip=seen.on_skip), seen


# --- one object at a time ---

def test_an_unreadable_object_is_skipped_named_and_counted_and_the_rest_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    cache, seen = cache_of()
    with caplog.at_level(logging.WARNING, "reservoir.watchcache"):
        cache.apply_event({"type": "ADDED", "object": podgroup("good", rv="10")})
        cache.apply_event({"type": "ADDED", "object": podgroup("bad", rv="11", minMember="x")})
        cache.apply_event({"type": "ADDED", "object": podgroup("after", rv="12")})
    assert sorted(cache.items) == [("ns", "after"), ("ns", "good")]
    assert cache.resource_version == "12", "the bookkeeping goes on past the bad object"
    assert list(cache.skipped) == ["ns/bad"] and "spec.minMember" in cache.skipped["ns/bad"]
    assert "expected an integer" in cache.skipped["ns/bad"]
    [record] = seen.skips
    assert (record.cache, record.kind, record.name, record.uid, record.resource_version) == (
        "podgroups", "PodGroup", "ns/bad", "uid-bad", "11")
    assert cache.skipped_objects == (record,)
    [line] = [r.getMessage() for r in caplog.records if "skipped=" in r.getMessage()]
    assert "PodGroup ns/bad" in line and "spec.minMember" in line


def test_a_skipped_object_that_becomes_readable_enters_the_cache_and_a_deleted_one_is_forgotten() -> None:
    cache, seen = cache_of()
    cache.apply_event({"type": "ADDED", "object": podgroup("a", rv="1", minMember="x")})
    cache.apply_event({"type": "ADDED", "object": podgroup("b", rv="2", minMember=[1])})
    cache.apply_event({"type": "MODIFIED", "object": podgroup("a", rv="3", minMember=4)})
    assert cache.items[("ns", "a")].min_member == 4 and list(cache.skipped) == ["ns/b"]
    assert ("MODIFIED", cache.items[("ns", "a")]) in seen.changes
    cache.apply_event({"type": "DELETED", "object": podgroup("b", rv="4", minMember=[1])})
    assert cache.skipped == {} and cache.resource_version == "4"
    assert len(seen.skips) == 2


def test_a_cached_object_that_turns_unreadable_leaves_the_cache() -> None:
    cache, seen = cache_of()
    cache.apply_event({"type": "ADDED", "object": podgroup("a", rv="1")})
    before = cache.items[("ns", "a")]
    cache.apply_event({"type": "MODIFIED", "object": podgroup("a", rv="2", queue=5)})
    assert ("ns", "a") not in cache.items and "spec.queue" in cache.skipped["ns/a"]
    assert seen.changes[-1] == ("DELETED", before)


def test_a_version_is_reported_once_not_on_every_relist(caplog: pytest.LogCaptureFixture) -> None:
    cache, seen = cache_of()
    bad = podgroup("bad", rv="5", minMember="x")
    with caplog.at_level(logging.WARNING, "reservoir.watchcache"):
        for _ in range(3):
            cache._replace([podgroup("good"), bad])
        assert len(seen.skips) == 1 and list(cache.skipped) == ["ns/bad"]
        cache._replace([podgroup("good"), podgroup("bad", rv="6", minMember="y")])  # a new version: reported
        assert len(seen.skips) == 2
        cache._replace([podgroup("good")])  # gone from the list: forgotten
    assert cache.skipped == {} and list(cache.items) == [("ns", "good")]
    assert sum("skipped=" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("poison", [
    podgroup("p", minMember="x"),                          # ValueError from a field of the wrong type
    podgroup("p", minMember=float("inf")),                  # OverflowError territory
    podgroup("p", queue={"a": 1}),
    {**podgroup("p"), "spec": "not an object"},
    {**podgroup("p"), "metadata": {"name": "p", "namespace": "ns", "annotations": ["a"]}},
    {**podgroup("p"), "metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "yesterday"}},
])
def test_any_error_converting_an_object_is_contained_to_it(poison: dict[str, Any]) -> None:
    cache, seen = cache_of()
    cache.apply_event({"type": "ADDED", "object": poison})
    cache.apply_event({"type": "ADDED", "object": podgroup("ok", rv="9")})
    assert list(cache.items) == [("ns", "ok")] and list(cache.skipped) == ["ns/p"] and len(seen.skips) == 1


def test_a_converter_that_raises_anything_only_skips_that_object() -> None:
    def convert(obj: Any) -> Any:
        if obj["metadata"]["name"] == "boom":
            raise RecursionError("maximum recursion depth exceeded")
        return obj["metadata"]["name"]
    cache: WatchCache[Any] = WatchCache(None, "things", "/x", convert)  # type: ignore[arg-type]
    cache._replace([{"metadata": {"name": "boom"}}, {"metadata": {"name": "fine"}}])
    assert dict(cache.items) == {"fine": "fine"} and "recursion" in cache.skipped["boom"]


def test_an_object_without_a_usable_name_is_skipped_not_fatal() -> None:
    cache, seen = cache_of()
    cache.apply_event({"type": "ADDED", "object": {"kind": "PodGroup", "metadata": {"namespace": "ns"}}})
    cache.apply_event({"type": "ADDED", "object": {"kind": "PodGroup", "metadata": "nope"}})
    cache.apply_event({"type": "ADDED", "object": podgroup("ok")})
    assert list(cache.items) == [("ns", "ok")] and len(seen.skips) == 2
    assert any("no usable name" in error for error in cache.skipped.values())


def test_malformed_events_are_ignored_and_errors_still_raise() -> None:
    cache, _ = cache_of()
    for event in (["a list"], {"type": "ADDED", "object": "text"}, {"type": "ADDED"}, {"type": "WHAT", "object": {}}):
        cache.apply_event(event)  # type: ignore[arg-type]
    cache.apply_event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "77"}}})
    assert cache.resource_version == "77" and dict(cache.items) == {}
    with pytest.raises(Gone):
        cache.apply_event({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    with pytest.raises(RuntimeError):
        cache.apply_event({"type": "ERROR", "object": "garbage"})


def test_an_on_change_that_raises_does_not_stop_the_cache() -> None:
    def broken(event: str, value: Any) -> None:
        raise KeyError("owner bug")
    cache: WatchCache[Any] = WatchCache.of(None, kinds.PODGROUPS, on_change=broken)  # type: ignore[arg-type]
    cache.apply_event({"type": "ADDED", "object": podgroup("a", rv="3")})
    assert list(cache.items) == [("ns", "a")] and cache.resource_version == "3"


def test_count_skips_counts_by_cache() -> None:
    registry = CollectorRegistry()
    hook = count_skips(registry)
    cache: WatchCache[Any] = WatchCache.of(None, kinds.PODGROUPS, on_skip=hook)  # type: ignore[arg-type]
    cache._replace([podgroup("a", minMember="x"), podgroup("b", minMember="y")])
    cache._replace([podgroup("a", minMember="x"), podgroup("b", minMember="y")])  # same versions: not again
    assert registry.get_sample_value("reservoir_watch_skipped_objects_total", {"cache": "podgroups"}) == 2


# --- JSON deeper than json.loads goes ---

def test_parse_json_reads_what_json_loads_cannot() -> None:
    with pytest.raises(RecursionError):
        json.loads(deep(1000))
    for depth in (1000, 10_000):
        value = parse_json(deep(depth).encode())
        for _ in range(depth):
            value = value["x"]
        assert value == 1
    assert parse_json("[" * 5000 + "]" * 5000) is not None


def test_parse_json_bounds_the_c_passes_on_a_deep_document(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost is counted as passes of the C parser that run out of recursion (each may read the whole document),
    never timed here (`python -m bench.unit_speed` times it): json.loads's one, then at most _C_RETRIES."""
    from shared import watchcache

    passes = {"tried": 0, "failed": 0}
    real = watchcache._DECODER

    class Counting:
        def raw_decode(self, text: str, pos: int = 0) -> tuple[Any, int]:
            passes["tried"] += 1
            try:
                return real.raw_decode(text, pos)
            except RecursionError:
                passes["failed"] += 1
                raise

    monkeypatch.setattr(watchcache, "_DECODER", Counting())
    value = parse_json(deep(10_000))
    for _ in range(10_000):
        value = value["x"]
    assert value == 1
    assert 0 < passes["failed"] <= watchcache._C_RETRIES and passes["tried"] <= watchcache._C_RETRIES + 1, passes


@pytest.mark.parametrize("text", ['{"a": }', "[1,]", '{"a" 1}', "nul", "[1] x", '{"a": [' * 2000, "[" * 3000])
def test_parse_json_still_refuses_what_is_not_json(text: str) -> None:
    with pytest.raises(ValueError):
        parse_json(text)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30)


@settings(max_examples=200)
@given(_json, st.integers(min_value=900, max_value=1300))
def test_parse_json_agrees_with_json_loads_wherever_both_can_read(value: Any, depth: int) -> None:
    """The iterative parser (forced by wrapping the value deep enough) reads exactly what json.loads reads."""
    text = json.dumps(value)
    assert parse_json(text) == json.loads(text)
    wrapped = parse_json("[" * depth + text + "]" * depth)
    for _ in range(depth):
        [wrapped] = wrapped
    assert wrapped == json.loads(text)


# --- over HTTP: the list and the watch ---

class FakeApiServer:
    """Answers GET path -> (status, raw body) for a list, or a list of raw lines for a watch."""

    def __init__(self) -> None:
        self.lists: dict[str, tuple[int, bytes]] = {}
        self.watches: dict[str, list[bytes]] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            response = web.StreamResponse(status=200)
            await response.prepare(request)
            for line in self.watches.get(request.path, []):
                await response.write(line + b"\n")
            await response.write_eof()
            return response
        status, body = self.lists.get(request.path, (404, b'{"kind": "Status", "code": 404}'))
        return web.Response(status=status, body=body, content_type="application/json")


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApiServer, client.ApiClient]]:
    server = FakeApiServer()
    async with loopback_api(server.handle, "GET") as api:
        yield server, api


def list_body(*items: str, rv: str = "100") -> bytes:
    return (f'{{"kind": "List", "metadata": {{"resourceVersion": "{rv}"}}, "items": [{", ".join(items)}]}}').encode()


async def test_a_list_with_poison_still_syncs_with_everything_else(
        fake: tuple[FakeApiServer, client.ApiClient]) -> None:
    """The issue's PodGroups: 1000-deep JSON under spec (json.loads of the whole list used to raise RecursionError),
    `minResources.cpu` banana and 1e1.5 (not read by the view: they stay), and one the view cannot read."""
    server, api = fake
    server.lists[PODGROUPS] = (200, list_body(
        json.dumps(podgroup("first")), deep_podgroup_text("deep"),
        json.dumps(podgroup("banana", minResources={"cpu": "banana"})),
        json.dumps(podgroup("fraction", minResources={"cpu": "1e1.5"})),
        json.dumps(podgroup("unreadable", minMember="x")), json.dumps(podgroup("last"))))
    cache, seen = cache_of(kinds.PODGROUPS, api)
    await cache.list()
    assert cache.synced.is_set() and cache.resource_version == "100"
    assert sorted(name for _, name in cache.items) == ["banana", "deep", "first", "fraction", "last"]
    assert list(cache.skipped) == ["ns/unreadable"] and len(seen.skips) == 1
    assert cache.heard_within(5)


async def test_a_queue_with_a_bad_quantity_is_skipped_by_name(fake: tuple[FakeApiServer, client.ApiClient]) -> None:
    server, api = fake
    queue = {"kind": "Queue", "metadata": {"name": "bad", "uid": "u", "resourceVersion": "3"},
             "spec": {"capability": {"cpu": "banana"}}}
    huge = {"kind": "Queue", "metadata": {"name": "huge", "uid": "v", "resourceVersion": "4"},
            "spec": {"deserved": {"cpu": "1e10000000"}}}
    good = {"kind": "Queue", "metadata": {"name": "good", "uid": "w", "resourceVersion": "5"}, "spec": {"weight": 2}}
    server.lists[QUEUES] = (200, list_body(json.dumps(queue), json.dumps(huge), json.dumps(good)))
    cache, _ = cache_of(kinds.QUEUES, api)
    await cache.list()
    assert list(cache.items) == ["good"] and isinstance(cache.items["good"], QueueView)
    assert "spec.capability.cpu" in cache.skipped["bad"] and "banana" in cache.skipped["bad"]
    assert "spec.deserved.cpu" in cache.skipped["huge"] and "exponent" in cache.skipped["huge"]


async def test_a_watch_goes_on_past_poison_lines(fake: tuple[FakeApiServer, client.ApiClient]) -> None:
    server, api = fake
    server.watches[PODGROUPS] = [
        json.dumps({"type": "ADDED", "object": podgroup("a", rv="201")}).encode(),
        b'{"type": "ADDED", "object": ' + deep_podgroup_text("deep").encode() + b"}",
        b"this is not JSON",
        ("[" * 3000).encode(),
        b'["a list"]',
        json.dumps({"type": "ADDED", "object": podgroup("bad", rv="203", minMember="x")}).encode(),
        json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "204"}}}).encode(),
        json.dumps({"type": "ADDED", "object": podgroup("z", rv="205")}).encode(),
    ]
    cache, seen = cache_of(kinds.PODGROUPS, api)
    await cache.watch_once()
    assert sorted(name for _, name in cache.items) == ["a", "deep", "z"]
    assert isinstance(cache.items[("ns", "deep")], PodGroupView)
    assert list(cache.skipped) == ["ns/bad"] and cache.resource_version == "205"


async def test_run_syncs_and_follows_despite_poison(fake: tuple[FakeApiServer, client.ApiClient]) -> None:
    server, api = fake
    server.lists[PODGROUPS] = (200, list_body(deep_podgroup_text("deep", 5000),
                                              json.dumps(podgroup("bad", minMember="x"))))
    server.watches[PODGROUPS] = [json.dumps({"type": "ADDED", "object": podgroup("new", rv="300")}).encode()]
    cache, _ = cache_of(kinds.PODGROUPS, api)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.synced.wait(), 5)
        for _ in range(100):
            if ("ns", "new") in cache.items:
                break
            await asyncio.sleep(0.02)
        assert {("ns", "deep"), ("ns", "new")} <= set(cache.items) and list(cache.skipped) == ["ns/bad"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- staleness ---

def test_stale_for_counts_from_the_last_answer() -> None:
    cache, _ = cache_of()
    start = time.monotonic()
    assert not cache.heard_within(1000), "never heard is not heard"
    cache.heard(now=start)
    assert cache.stale_for(start + 30) == 30 and cache.heard_within(60, now=start + 30)
    assert not cache.heard_within(60, now=start + 61)
    cache.heard(now=start - 100)
    before = time.monotonic()
    cache.apply_event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "1"}}})
    assert cache.heard_at is not None and cache.heard_at >= before, "a bookmark is word from the API server"


def test_the_stated_bound_allows_two_watch_cycles() -> None:
    assert STALE_AFTER == 2 * WATCH_TIMEOUT_SECONDS + 60 == 640


def test_stale_caches_names_the_cache_and_how_long() -> None:
    fresh, _ = cache_of()
    silent, _ = cache_of(kinds.QUEUES)
    now = time.monotonic()
    fresh.heard(now=now - 10)
    silent.heard(now=now - 700)
    assert stale_caches([fresh, silent], now=now) == ["queues: no word from the API server for 700s (more than 640s)"]


async def test_readyz_is_false_while_a_cache_is_stale_and_true_again_when_it_hears(
        aiohttp_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from shared import serving

    cache, _ = cache_of()
    cache.synced.set()
    now = time.monotonic()
    monkeypatch.setattr(serving, "time", SimpleNamespace(monotonic=lambda: now))  # /readyz's clock, stopped
    cache.heard(now=now - STALE_AFTER - 5)
    app = add_probes(web.Application(), CollectorRegistry(), waiting=lambda: [], describe=str, caches=lambda: [cache])
    http = await aiohttp_client(app)
    answer = await http.get("/readyz")
    assert answer.status == 503 and "podgroups: no word from the API server for 645s" in await answer.text()
    cache.apply_event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "2"}}})
    answer = await http.get("/readyz")
    assert answer.status == 200 and await answer.text() == "ok"


def test_the_webhook_counts_a_stale_cache_as_not_synced_and_names_what_it_skipped() -> None:
    from webhook.caches import WebhookCaches

    seen = Recorder()
    caches = WebhookCaches(None, on_skip=seen.on_skip)  # type: ignore[arg-type]
    now = time.monotonic()
    for cache in caches.all:
        cache.synced.set()
        cache.heard(now=now)
    assert all(caches.synced(now=now + 10).values())
    caches.queues.heard(now=now - STALE_AFTER)
    state = caches.synced(now=now + 10)
    assert state["queues"] is False and sum(state.values()) == len(caches.all) - 1
    assert caches.stale(now=now + 10) == [f"queues: no word from the API server for {STALE_AFTER + 10}s "
                                          f"(more than {STALE_AFTER}s)"]
    caches.podgroups._replace([podgroup("bad", minMember="x"), podgroup("good")])
    assert list(caches.skipped()) == ["podgroups"] and list(caches.skipped()["podgroups"]) == ["ns/bad"]
    assert [s.name for s in seen.skips] == ["ns/bad"]


def test_a_skipped_list_item_without_a_kind_is_named_by_its_view_s_kind() -> None:
    """Items of a core list carry no `kind`: the view's error says it."""
    cache, seen = cache_of(kinds.PODS)
    cache._replace([{"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
                     "spec": {"priority": "abc", "containers": []}}])
    [record] = seen.skips
    assert (record.kind, record.name) == ("Pod", "ns/p") and record.error.startswith("spec.priority:")


def test_a_relists_deletions_are_told_apart_from_a_watchs() -> None:
    """`relisting` is true while a list put in force reports what it lacks (deleted at some moment the watch did not
    see: `reservoir record` writes such a pod as vanished, with bounds), false for a watch's own DELETED."""
    flags: list[tuple[str, bool]] = []
    cache: WatchCache[Any] = WatchCache.of(None, kinds.PODGROUPS,
                                           on_change=lambda event, value: flags.append((event, cache.relisting)))
    cache._replace([podgroup("a"), podgroup("b")])
    cache.apply_event({"type": "DELETED", "object": podgroup("a", rv="2")})
    cache._replace([])
    assert flags == [("ADDED", True), ("ADDED", True), ("DELETED", False), ("DELETED", True)]
    assert cache.relisting is False
