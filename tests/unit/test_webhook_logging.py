"""Issue 15, the webhook's log: a routine admission logs at DEBUG only; INFO carries the decisions that change
something (a toleration of a lock held now granted, a refusal, a warning); every admission is counted by its decision
in `reservoir_webhook_admissions_total{route,decision}`. Served over plain HTTP on loopback (`make_app`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import aiohttp
import pytest
from aiohttp import web

from agent.planner.model import Lock
from localcluster.cluster import free_port
from shared import keys
from shared.keys import LockKind
from shared.ownership import queue_owner_id
from shared.views import PriorityClassView, QueueView
from tests.builders import node
from tests.logfmt import captured
from webhook.lookup import Lookup
from webhook.server import Metrics, make_app

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
QUEUE_OWNER = queue_owner_id("q")
QUIET = Lookup(queues={"q": QueueView.from_obj({"metadata": {"name": "q"}, "spec": {"priorityClassName": "hi"}})},
               priority_classes={"hi": PriorityClassView("hi", 100, False, "PreemptLowerPriority")},
               nodes={"n1": node("n1"), "n2": node("n2")})
# the same cluster with q's lock held on n2: q's pods now get a toleration that lets them onto a locked node
HELD = replace(QUIET, nodes={"n1": node("n1"), "n2": node("n2", lock=Lock(
    node="n2", owner=QUEUE_OWNER, kind=LockKind.QUEUE, subject="Queue/q", reason="guarantee", since=NOW))})


def review(obj: dict, kind: str = "Pod", namespace: str = "ns") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": kind}, "operation": "CREATE",
                        "namespace": namespace, "name": obj.get("metadata", {}).get("name", ""), "object": obj}}


def pod(name: str = "p", annotations: dict | None = None, requests: dict | None = None) -> dict:
    container: dict = {"name": "c", "image": "x"}
    if requests is not None:
        container["resources"] = {"requests": requests}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "annotations": {keys.QUEUE_NAME: "q", **(annotations or {})}},
            "spec": {"containers": [container]}}


@dataclass
class Served:
    session: aiohttp.ClientSession
    lookup: list[Lookup]

    async def post(self, path: str, body: dict) -> dict:
        async with self.session.post(path, json=body) as response:
            assert response.status == 200
            answer: dict = (await response.json())["response"]
            return answer

    async def admissions(self, path: str, decision: str) -> float:
        async with self.session.get("/metrics") as response:
            text = await response.text()
        line = f'reservoir_webhook_admissions_total{{decision="{decision}",route="{path}"}} '
        return next((float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line)), 0.0)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    lookup = [QUIET]
    runner = web.AppRunner(make_app(lambda: lookup[0], lambda: {"queues": True}, Metrics()))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as session:
        yield Served(session, lookup)
    await runner.cleanup()


def webhook_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[dict]:
    """The webhook's records at `level`, as their message and structured fields (issue 14)."""
    return captured((r for r in caplog.records if r.levelno == level), logger="reservoir.webhook")


async def test_a_routine_admission_logs_no_info_line_and_is_counted(served: Served,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Priority inherited and the pod's own queue toleration added while its queue holds no lock: routine."""
    with caplog.at_level(logging.DEBUG, logger="reservoir.webhook"):
        answer = await served.post("/mutate/pods", review(pod(requests={"cpu": "1"})))
        await served.post("/validate/pods", review(pod(requests={"cpu": "1"})))
    assert answer["allowed"] and answer["patch"]
    assert webhook_lines(caplog, logging.INFO) == [] and webhook_lines(caplog, logging.WARNING) == []
    debug = webhook_lines(caplog, logging.DEBUG)
    assert any(line.get("decision") == "mutate" and line["pod"] == "ns/p" and line["reason"] for line in debug), debug
    admission = {"msg": "admission", "operation": "CREATE", "kind": "Pod", "namespace": "ns", "name": "p"}
    assert captured(caplog.records, **admission, route="/mutate/pods", decision="mutated")
    assert captured(caplog.records, **admission, route="/validate/pods", decision="allowed")
    assert await served.admissions("/mutate/pods", "mutated") == 1
    assert await served.admissions("/validate/pods", "allowed") == 1


async def test_a_toleration_of_a_lock_held_now_is_logged_at_info_and_counted_granted(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    served.lookup[0] = HELD
    with caplog.at_level(logging.INFO, logger="reservoir.webhook"):
        await served.post("/mutate/pods", review(pod("in-q", requests={"cpu": "1"})))
        await served.post("/mutate/pods", review(pod("best-effort")))  # tolerates every lock: q's too
    info = webhook_lines(caplog, logging.INFO)
    assert len(info) == 2, info
    assert info[0]["decision"] == "mutate" and info[0]["pod"] == "ns/in-q" and info[0]["owner"] == [QUEUE_OWNER]
    assert "tolerates every lock" in info[1]["reason"] and info[1]["owner"] == [QUEUE_OWNER]
    assert await served.admissions("/mutate/pods", "granted") == 2
    assert await served.admissions("/mutate/pods", "mutated") == 0


async def test_refusals_and_warnings_are_logged_at_info_and_counted(served: Served,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    refused = {"metadata": {"name": "q1"}, "spec": {"guarantee": {"policy": "Always", "resource": {"cpu": "1"}}}}
    with caplog.at_level(logging.INFO, logger="reservoir.webhook"):
        answer = await served.post("/validate/queues", review(refused, kind="Queue", namespace=""))
        warned = await served.post("/mutate/pods", review(pod("w", {keys.RESERVATION_AFFINITY: "{"}, {"cpu": "1"})))
    assert not answer["allowed"] and warned["warnings"]
    info = webhook_lines(caplog, logging.INFO)
    assert len(info) == 2, info
    assert info[0]["decision"] == "deny" and info[0]["kind"] == "Queue" and info[0]["name"] == "q1"
    assert info[0]["reason"]
    assert info[1]["decision"] == "mutate" and info[1]["pod"] == "ns/w" and info[1]["warnings"]
    assert await served.admissions("/validate/queues", "denied") == 1
    assert await served.admissions("/mutate/pods", "warned") == 1
