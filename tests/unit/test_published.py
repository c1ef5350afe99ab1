"""What the agent publishes for `reservoir status` (agent.published): the document built from a plan, its bound, when
it is written, how its age is judged; and `reservoir status` reading it without listing a single pod."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from agent.commands import status
from agent.planner.plan import plan
from agent.published import (
    CUT_ORDER,
    MAX_BYTES,
    MAX_TEXT,
    PublishedError,
    Publisher,
    bounded,
    clip,
    content_key,
    freshness,
    parse_published,
    published_document,
    render,
)
from shared import keys
from shared.config import load_config
from shared.watchcache import Skipped
from tests.builders import CONFIG, NOW, loopback_api, node, pod, snap

WHERE = "reservoir-system/reservoir-status"


def starving_snapshot() -> Any:
    """Two full 4-cpu nodes; `big` (4 cpu, 10 minutes pending) must drain one; `late` (1 minute) is not starving yet;
    `huge` (16 cpu) fits nowhere. Spare nodes leave the budget room."""
    nodes = [node("n1"), node("n2")]
    pods = [pod("hog1", "4", node_name="n1"), pod("hog2", "4", node_name="n2"),
            pod("big", "4", age=timedelta(minutes=10)), pod("late", "1", age=timedelta(seconds=30)),
            pod("huge", "16", age=timedelta(minutes=10))]
    return snap(nodes, pods, spare=8)


def document(**more: Any) -> dict[str, Any]:
    result = plan(starving_snapshot(), CONFIG, NOW)
    return published_document(result, agent="agent-1", planned=NOW, config=CONFIG, **more)


def test_the_document_of_a_plan() -> None:
    skipped = Skipped(cache="queues", kind="Queue", name="broken", uid="u", resource_version="1", error="bad")
    doc = document(skipped=[skipped])
    assert list(doc) == ["format", "agent", "planned", "dryRun", "config", "jobs", "windows", "guarantees",
                         "reservations", "handovers", "estimates", "queues", "notes", "skipped", "omitted"]
    assert (doc["format"], doc["agent"], doc["planned"], doc["dryRun"]) == (1, "agent-1", "2026-11-22T12:00:00Z", False)
    assert doc["config"] == {
        "resyncPeriod": "30s",
        "starvation": {"enabled": True, "starvingJobTimeThreshold": "1m", "maxLockDuration": "2h"},
        "queueOrder": {"priorityWeight": 1.0, "drfWeight": 1.0, "proportionWeight": 1.0,
                       "ordering": CONFIG.queue_order.ordering, "queueScoreOrderEnable": True}}
    jobs = {j["subject"]: j for j in doc["jobs"]}
    # the job with a lock first, then the starving one without, then the one not starving yet
    assert [j["subject"] for j in doc["jobs"]] == ["ns/Pod/big", "ns/Pod/huge", "ns/Pod/late"]
    big, huge, late = jobs["ns/Pod/big"], jobs["ns/Pod/huge"], jobs["ns/Pod/late"]
    assert big["starving"] and len(big["nodes"]) == 1 and big["nodes"][0] in ("n1", "n2")
    assert big["starvingSince"] == "2026-11-22T11:51:00Z" and big["reason"].startswith("reserved on 1 nodes")
    assert huge["starving"] and huge["nodes"] == [] and huge["reason"].startswith("cannot reserve")
    # the planner's decision line about the job travels with it, not among the other notes
    assert huge["notes"] and all("job=ns/Pod/huge" in n for n in huge["notes"])
    assert not any("job=ns/Pod/huge" in n for n in doc["notes"])
    assert not late["starving"] and late["starvingSince"] is None and late["reason"] == "waiting 30s of 60s threshold"
    assert doc["skipped"] == [{"kind": "Queue", "name": "broken", "error": "bad"}]
    assert doc["omitted"] == {} and doc["queues"] == []  # one queue: nothing competed
    assert doc["estimates"] == []  # big's lock is planned, not on its node yet: nothing waits on it
    assert json.loads(render(doc)) == doc


def test_content_key_ignores_the_plan_time_only() -> None:
    doc = document()
    later = {**doc, "planned": "2026-11-22T12:05:00Z"}
    assert content_key(doc) == content_key(later)
    assert content_key(doc) != content_key({**doc, "agent": "agent-2"})


def big_document(jobs: int, notes: int) -> dict[str, Any]:
    doc = document()
    template = doc["jobs"][-1]
    doc["jobs"] = doc["jobs"] + [{**template, "subject": f"ns/Pod/j{i:05d}", "reason": "x" * 80} for i in range(jobs)]
    doc["notes"] = [f"policy=window window=w{i} decision=no-lock reason={'y' * 100}" for i in range(notes)]
    return doc


def test_a_document_that_fits_is_left_whole() -> None:
    doc = document()
    assert bounded(doc) == doc


def test_bounding_cuts_notes_first_then_jobs_from_their_end_and_counts_them() -> None:
    doc = big_document(jobs=3000, notes=3000)
    assert len(render(doc).encode()) > MAX_BYTES
    cut = bounded(doc)
    assert len(render(cut).encode()) <= MAX_BYTES
    assert cut["notes"] == [] and cut["omitted"]["notes"] == 3000
    kept = len(cut["jobs"])
    assert cut["jobs"] == doc["jobs"][:kept] and cut["omitted"]["jobs"] == len(doc["jobs"]) - kept > 0
    # the longest prefix that fits: one job more would not
    one_more = {**cut, "jobs": doc["jobs"][:kept + 1],
                "omitted": {**cut["omitted"], "jobs": cut["omitted"]["jobs"] - 1}}
    assert len(render(one_more).encode()) > MAX_BYTES
    # the jobs holding a lock come first, so they are the last to go
    assert cut["jobs"][0]["subject"] == "ns/Pod/big"


def test_bounding_only_the_notes_when_that_is_enough() -> None:
    doc = big_document(jobs=0, notes=200)
    limit = len(render(doc).encode()) - 1000
    cut = bounded(doc, limit)
    assert len(render(cut).encode()) <= limit and cut["jobs"] == doc["jobs"]
    assert 0 < cut["omitted"]["notes"] < 200 and cut["notes"] == doc["notes"][:200 - cut["omitted"]["notes"]]


def test_a_tenant_cannot_fill_the_document_or_push_out_what_operators_wrote() -> None:
    """Review finding M1: jobs are named by tenants (a group-name annotation the webhook may not have seen, an
    ownerReference); each string is clipped, and however many jobs there are, the sections only operators write are
    cut after them."""
    doc = document()
    huge = "ns/ReplicaSet/" + "z" * 200_000
    template = doc["jobs"][-1]
    forged = "x decision=lock job=ns/Pod/big reason=planted"
    base = starving_snapshot()
    tenant = snap(list(base.nodes.values()), [*base.pods, pod("t", "16", group=forged, age=timedelta(minutes=10)),
                                              pod("u", "16", group="z" * 5000, age=timedelta(minutes=10)),
                                              pod("v", "16", group="z" * 253, age=timedelta(minutes=10))])
    raw = published_document(plan(tenant, CONFIG, NOW), agent="a", planned=NOW, config=CONFIG)
    subjects = [j["subject"] for j in raw["jobs"]]
    # a group name no PodGroup can have names no job (shared.ownership.job_identity): those pods are their own jobs
    assert {"ns/Pod/t", "ns/Pod/u"} <= set(subjects) and not any(forged in s for s in subjects)
    assert any(s.startswith("ns/PodGroup/zzz") for s in subjects), "the longest name a PodGroup can have, clipped"
    assert all(len(s) <= MAX_TEXT for s in subjects) and all(len(n) <= MAX_TEXT for n in raw["notes"])
    # the forged words inside the name planted no note under the job ns/Pod/big (review finding M2)
    big = next(j for j in raw["jobs"] if j["subject"] == "ns/Pod/big")
    assert not any("planted" in n for n in big["notes"])
    flood = {**doc, "jobs": doc["jobs"] + [{**template, "subject": f"{huge}{i}", "reason": "r" * 100_000}
                                           for i in range(300)],
             "windows": [{"name": "nightly", "active": True, "start": None, "end": None, "reason": "open"}]}
    flood["jobs"] = [{**j, "subject": clip(j["subject"]), "reason": clip(j["reason"])} for j in flood["jobs"]]
    cut = bounded(flood, 64 * 1024)
    assert len(render(cut).encode()) <= 64 * 1024
    assert cut["windows"] == flood["windows"], "the operators' sections outlast any number of tenant jobs"
    assert cut["omitted"]["jobs"] > 0
    assert CUT_ORDER.index("jobs") < min(CUT_ORDER.index(s) for s in ("reservations", "guarantees", "windows"))


def test_a_tenant_string_is_clipped_in_the_document() -> None:
    assert clip("a" * 10) == "a" * 10 and clip(5) == 5
    long = clip("b" * 5000)
    assert len(long) == MAX_TEXT and long.endswith("\u2026")


class FakeWriter:
    """Stands in for agent.writer.Writer.put_configmap: records what it is asked to write; `answer` says whether the
    write happened (False: fenced), `error` makes it fail."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, dict[str, str]]] = []
        self.answer = True
        self.error: Exception | None = None

    async def put_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> bool:
        if self.error is not None:
            raise self.error
        self.writes.append((namespace, name, dict(data)))
        return self.answer


async def test_publisher_writes_on_change_and_on_the_heartbeat_only() -> None:
    writer, now = FakeWriter(), [100.0]
    publisher = Publisher(writer, "reservoir-system", clock=lambda: now[0])  # type: ignore[arg-type]
    result = plan(starving_snapshot(), CONFIG, NOW)

    async def publish(at: Any = NOW, agent: str = "agent-1") -> bool:
        return await publisher.publish(result, agent=agent, planned=at, config=CONFIG)

    assert await publish()
    namespace, name, data = writer.writes[-1]
    assert (namespace, name, list(data)) == ("reservoir-system", keys.STATUS_CONFIGMAP, [keys.STATUS_KEY])
    assert parse_published(data[keys.STATUS_KEY], WHERE) == json.loads(data[keys.STATUS_KEY])
    now[0] += 5
    assert not await publish(NOW + timedelta(seconds=5))  # same content, within half a resync period (15s)
    now[0] += 10
    assert await publish(NOW + timedelta(seconds=15))  # the heartbeat: the plan time stays fresh
    assert json.loads(writer.writes[-1][2][keys.STATUS_KEY])["planned"] == "2026-11-22T12:00:15Z"
    assert await publish(NOW + timedelta(seconds=16), agent="agent-2")  # content changed: written at once
    assert len(writer.writes) == 3

    writer.answer = False  # fenced: nothing written, so it is tried again at the next plan
    assert not await publish(NOW, agent="agent-3") and not await publish(NOW, agent="agent-3")
    writer.answer, writer.error = True, RuntimeError("API down")
    assert not await publish(NOW, agent="agent-3")  # a failure is logged, never raised into the reconcile
    writer.error = None
    assert await publish(NOW, agent="agent-3")


def test_freshness_says_how_old_and_warns_when_absent_or_stale() -> None:
    assert freshness(None, NOW, WHERE) == {
        "agent": None, "planned": None, "age": None,
        "warning": f"the agent has published nothing in ConfigMap {WHERE}; is it running?"}
    fresh = document()
    assert freshness(fresh, NOW + timedelta(seconds=45), WHERE) == {
        "agent": "agent-1", "planned": "2026-11-22T12:00:00Z", "age": "45s", "warning": None}
    stale = freshness(fresh, NOW + timedelta(seconds=91), WHERE)
    assert stale["age"] == "1m31s" and stale["warning"] == (
        "the published plan is 1m31s old, more than 3 resync periods (1m30s): is the agent running and leading?")
    slow = published_document(plan(starving_snapshot(), CONFIG, NOW), agent="a", planned=NOW,
                              config=load_config("resyncPeriod: 5m"))
    assert freshness(slow, NOW + timedelta(minutes=10), WHERE)["warning"] is None


@pytest.mark.parametrize(("text", "found"), [("{", "is not JSON"), ("[1]", "found 'list'"),
                                              ('{"format": 2}', "found 2")])
def test_an_unreadable_document_is_named(text: str, found: str) -> None:
    with pytest.raises(PublishedError, match=f"{WHERE} key status.json .*{found}"):
        parse_published(text, WHERE)
    assert parse_published(None, WHERE) is None


async def test_status_reads_the_nodes_and_the_published_configmap_and_never_the_pods(tmp_path: Path) -> None:
    """`reservoir status` against a stand-in API server: it asks for the nodes and the one ConfigMap, nothing else."""
    requests: list[str] = []
    doc = document()
    locked = {"metadata": {"name": "n1", "creationTimestamp": "2026-11-21T12:00:00Z",
                           "labels": {keys.LOCK: doc["jobs"][0]["owner"], keys.LOCK_KIND: "job"},
                           "annotations": {keys.LOCK_INFO: json.dumps({
                               "owner": doc["jobs"][0]["owner"], "kind": "job", "subject": "ns/Pod/big",
                               "reason": "reserved", "since": "2026-11-22T11:55:00Z"})}},
              "spec": {"taints": [{"key": keys.LOCK, "value": doc["jobs"][0]["owner"], "effect": "NoSchedule"}]},
              "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}}
    publish = [True]

    async def handle(request: web.Request) -> web.Response:
        requests.append(request.path)
        if request.path == "/api/v1/nodes":
            return web.json_response({"kind": "NodeList", "metadata": {"resourceVersion": "1"}, "items": [locked]})
        if request.path == f"/api/v1/namespaces/reservoir-system/configmaps/{keys.STATUS_CONFIGMAP}" and publish[0]:
            return web.json_response({"data": {keys.STATUS_KEY: render(doc)}})
        return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)

    async with loopback_api(handle) as api:
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "c", "cluster": {"server": api.configuration.host}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "t"}}]}))
        shown = await status(str(path), "reservoir-system", "json")
        publish[0] = False
        absent = await status(str(path), "reservoir-system", "json")
    assert set(requests) == {"/api/v1/nodes", f"/api/v1/namespaces/reservoir-system/configmaps/{keys.STATUS_CONFIGMAP}"}
    out = json.loads(shown.text)
    assert [(lock["node"], lock["subject"]) for lock in out["locks"]] == [("n1", "ns/Pod/big")]
    assert [j["subject"] for j in out["starvingJobs"]] == ["ns/Pod/big", "ns/Pod/huge"]
    assert out["plan"]["agent"] == "agent-1" and shown.warning is not None  # NOW is in the past: stale
    assert json.loads(absent.text)["plan"]["planned"] is None
    assert absent.warning == f"the agent has published nothing in ConfigMap {WHERE}; is it running?"


async def test_the_writer_patches_the_configmap_creates_it_when_missing_and_is_fenced() -> None:
    from agent.writer import Writer

    sent: list[tuple[str, str, Any]] = []
    exists = [False]

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        sent.append((request.method, request.path, body))
        if request.method == "PATCH" and not exists[0]:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        exists[0] = True
        return web.json_response(body)

    fence: list[str | None] = [None]
    async with loopback_api(handle) as api:
        writer = Writer(api, fence=lambda: fence[0])
        assert await writer.put_configmap("reservoir-system", keys.STATUS_CONFIGMAP, {keys.STATUS_KEY: "{}"})
        assert await writer.put_configmap("reservoir-system", keys.STATUS_CONFIGMAP, {keys.STATUS_KEY: "{ }"})
        fence[0] = "the Lease is held by another"
        assert not await writer.put_configmap("reservoir-system", keys.STATUS_CONFIGMAP, {keys.STATUS_KEY: "x"})
    path = f"/api/v1/namespaces/reservoir-system/configmaps/{keys.STATUS_CONFIGMAP}"
    assert [(method, p) for method, p, _ in sent] == [
        ("PATCH", path), ("POST", "/api/v1/namespaces/reservoir-system/configmaps"), ("PATCH", path)]
    assert sent[1][2]["metadata"]["name"] == keys.STATUS_CONFIGMAP and sent[1][2]["data"] == {keys.STATUS_KEY: "{}"}
    assert sent[2][2] == {"data": {keys.STATUS_KEY: "{ }"}}
