"""The agent's writes (agent.writer): each body built by a pure function, and the Writer sending them, with the
client edge replaced by a recorder (the edge itself is tested over HTTP in test_kube.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agent import writer as writer_module
from agent.planner.guarantee import Witnesses
from agent.planner.model import Lock, Plan, Repair, Snapshot, lock_on
from agent.writer import (
    MAX_ATTEMPTS,
    Writer,
    allocated_annotation_patch,
    event_body,
    eviction_body,
    node_patch,
    queue_status_patch,
    repair_patch,
    reservation_status_patch,
)
from shared import keys
from shared.config import load_config
from shared.jsonpatch import apply
from shared.keys import LockKind
from shared.kube import JSON, JSON_PATCH, MERGE_PATCH, api_error
from shared.logs import FIELDS, LogfmtFormatter
from shared.resources import Resources
from shared.tolerations import lock_toleration
from shared.views import NodeView, PodView, QueueView, ReservationView
from tests.builders import loopback_api
from tests.logfmt import captured, parse

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
OWNER = "job-ns-train-abcdef"
LOCK = Lock(node="n1", owner=OWNER, kind=LockKind.JOB, subject="ns/PodGroup/train", reason="starving", since=NOW,
            tasks=("ns/train-0",))


def node_obj(*, lock: Lock | None = None, taints: Sequence[dict[str, str]] = (), labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "n1", "resourceVersion": "41"}
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"taints": list(taints)} if taints else {}
    if lock is not None:
        spec.setdefault("taints", []).append({"key": keys.LOCK, "value": lock.owner, "effect": keys.LOCK_EFFECT})
        meta.setdefault("labels", {}).update({keys.LOCK: lock.owner, keys.LOCK_KIND: lock.kind.value})
        meta.setdefault("annotations", {})[keys.LOCK_INFO] = lock.info_json()
    return {"metadata": meta, "spec": spec}


# --- node_patch ---

def test_lock_on_a_bare_node_adds_taint_labels_and_annotation_guarded_by_its_resource_version() -> None:
    ops = node_patch(node_obj(), LOCK)
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
        {"op": "add", "path": "/spec/taints", "value": [{"key": keys.LOCK, "value": OWNER, "effect": "NoSchedule"}]},
        {"op": "add", "path": "/metadata/labels", "value": {keys.LOCK: OWNER, keys.LOCK_KIND: "job"}},
        {"op": "add", "path": "/metadata/annotations", "value": {keys.LOCK_INFO: LOCK.info_json()}},
    ]


def test_node_already_carrying_the_lock_needs_no_patch_and_reads_back_as_it() -> None:
    node = node_obj(lock=LOCK)
    assert node_patch(node, LOCK) is None
    assert lock_on(NodeView.from_obj(node)) == LOCK


def test_lock_keeps_what_reservoir_did_not_write() -> None:
    foreign = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    ops = node_patch(node_obj(taints=[foreign], labels={"zone": "a"}, annotations={"note": "x"}), LOCK)
    assert ops is not None
    assert ops[1] == {"op": "add", "path": "/spec/taints",
                      "value": [foreign, {"key": keys.LOCK, "value": OWNER, "effect": "NoSchedule"}]}
    assert {"op": "add", "path": "/metadata/labels/reservoir.sh~1lock", "value": OWNER} in ops
    assert {"op": "add", "path": "/metadata/annotations/reservoir.sh~1lock-info", "value": LOCK.info_json()} in ops
    assert not any(op["op"] == "remove" for op in ops)


def test_release_removes_only_reservoirs_keys() -> None:
    foreign = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    node = node_obj(lock=LOCK, taints=[foreign], labels={"zone": "a"})
    assert node_patch(node, None) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
        {"op": "add", "path": "/spec/taints", "value": [foreign]},
        {"op": "remove", "path": "/metadata/labels/reservoir.sh~1lock"},
        {"op": "remove", "path": "/metadata/labels/reservoir.sh~1lock-kind"},
        {"op": "remove", "path": "/metadata/annotations/reservoir.sh~1lock-info"},
    ]
    alone = node_patch(node_obj(lock=LOCK), None)
    assert alone is not None and alone[1] == {"op": "remove", "path": "/spec/taints"}
    assert node_patch(node_obj(labels={"zone": "a"}), None) is None


def test_changing_owner_rewrites_the_taint_and_the_owner_keys() -> None:
    other = Lock(node="n1", owner="queue-gold-123456", kind=LockKind.QUEUE, subject="Queue/gold", reason="guarantee",
                 since=NOW)
    ops = node_patch(node_obj(lock=LOCK), other)
    assert ops is not None
    assert ops[1]["value"] == [{"key": keys.LOCK, "value": other.owner, "effect": "NoSchedule"}]
    assert {"op": "add", "path": "/metadata/labels/reservoir.sh~1lock-kind", "value": "queue"} in ops


# --- repair_patch ---

def repair(tolerations: Sequence[dict[str, str]], *owners: str) -> Repair:
    return Repair(namespace="ns", name="p", tolerations=tuple(tolerations),
                  add=tuple(lock_toleration(o) for o in owners))


def test_repair_creates_the_tolerations_list_when_the_pod_has_none() -> None:
    assert repair_patch(repair([], OWNER)) == [{"op": "add", "path": "/spec/tolerations",
                                                "value": [lock_toleration(OWNER)]}]


def test_repair_appends_to_existing_tolerations_and_is_idempotent() -> None:
    existing = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
    ops = repair_patch(repair([existing], OWNER, "window-ebook-654321"))
    assert ops == [{"op": "add", "path": "/spec/tolerations/-", "value": lock_toleration(OWNER)},
                   {"op": "add", "path": "/spec/tolerations/-", "value": lock_toleration("window-ebook-654321")}]
    repaired = apply({"spec": {"tolerations": [existing]}}, ops)["spec"]["tolerations"]
    assert repair_patch(repair(repaired, OWNER, "window-ebook-654321")) == []


# --- Queue status ---

@dataclass(frozen=True)
class Guarantee:
    queue: str
    nodes: tuple[str, ...] = ()
    resource: Resources = field(default_factory=lambda: Resources.parse({"cpu": "8"}))
    warning: str | None = None
    evict: tuple[str, ...] = ()


def queue(reservation: dict[str, Any] | None = None) -> QueueView:
    obj: dict[str, Any] = {"metadata": {"name": "gold"}, "spec": {}}
    if reservation is not None:
        obj["status"] = {"reservation": reservation}
    return QueueView.from_obj(obj)


def test_queue_status_is_written_when_it_changes_and_only_then() -> None:
    planned = Guarantee("gold", nodes=("n1", "n2"))
    body = {"status": {"reservation": {"nodes": ["n1", "n2"], "resource": {"cpu": "8"}}}}
    assert queue_status_patch(planned, queue()) == body
    assert queue_status_patch(planned, queue(body["status"]["reservation"])) is None
    assert queue_status_patch(planned, queue({"nodes": ["n1"], "resource": {"cpu": "4"}})) == body


def test_queue_status_is_cleared_when_the_guarantee_locks_nothing_or_goes() -> None:
    written = {"nodes": ["n1"], "resource": {"cpu": "4"}}
    assert queue_status_patch(None, queue(written)) == {"status": {"reservation": None}}
    assert queue_status_patch(Guarantee("gold"), queue(written)) == {"status": {"reservation": None}}
    assert queue_status_patch(None, queue()) is None
    assert queue_status_patch(Guarantee("gold"), queue({})) is None, "an empty reservation is no reservation"


# --- Reservation status ---

@dataclass(frozen=True)
class Planned:
    name: str = "r1"
    phase: str = "Available"
    node: str = "n1"
    message: str = "placed on n1"
    annotate: tuple[str, ...] = ()
    delete: bool = False
    final: bool = False
    conditions: tuple[dict[str, Any], ...] = ()
    object_name: str = ""  # issue 18: the object of `name` (its key), of `api_version`
    uid: str = ""
    api_version: str = keys.RESERVATION_API_VERSION
    left_alone: str = ""

    def status(self) -> dict[str, Any]:
        return {"phase": self.phase, "nodeName": self.node or None, "conditions": list(self.conditions),
                "allocatable": {"cpu": "2"}, "allocated": {}, "currentOwners": []}


def reservation(status: dict[str, Any] | None = None) -> ReservationView:
    return ReservationView.from_obj({"metadata": {"name": "r1"}, "spec": {"template": {"spec": {"containers": []}}},
                                     **({"status": status} if status is not None else {})})


def test_reservation_status_is_written_when_it_changes_and_only_then() -> None:
    planned = Planned()
    body = reservation_status_patch(planned, reservation())
    assert body == {"status": planned.status()}
    assert reservation_status_patch(planned, reservation(planned.status())) is None
    extra = {**planned.status(), "someoneElses": "kept"}
    assert reservation_status_patch(planned, reservation(extra)) is None, "fields it does not write are not compared"


def test_unplaced_reservation_clears_a_node_name_it_no_longer_has() -> None:
    planned = Planned(phase="Pending", node="")
    was = {**Planned().status(), "phase": "Pending"}
    body = reservation_status_patch(planned, reservation(was))
    assert body is not None and body["status"]["nodeName"] is None and "nodeName" in body["status"]
    without_node = {k: v for k, v in planned.status().items() if v is not None}
    assert reservation_status_patch(planned, reservation(without_node)) is None


def test_allocated_annotation_and_eviction_bodies() -> None:
    # issue 18: Koordinator's key and form beside Reservoir's own
    assert allocated_annotation_patch("r1", "r1", "u-1") == {"metadata": {"annotations": {
        keys.RESERVATION_ALLOCATED: "r1", keys.KOORDINATOR_RESERVATION_ALLOCATED: '{"name":"r1","uid":"u-1"}'}}}
    assert eviction_body("ns", "p") == {"apiVersion": "policy/v1", "kind": "Eviction",
                                        "metadata": {"name": "p", "namespace": "ns"}}


# --- Events ---

def test_event_on_a_cluster_scoped_object_names_no_namespace_for_it() -> None:
    body = event_body("n1", "NodeLocked", "locked", now=NOW, component="reservoir-agent")
    assert body == {
        "metadata": {"generateName": "n1.", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": "n1", "namespace": "", "apiVersion": "v1"},
        "reason": "NodeLocked", "message": "locked", "type": "Normal",
        "source": {"component": "reservoir-agent"}, "reportingComponent": "reservoir-agent",
        "firstTimestamp": "2026-11-22T12:00:00Z", "lastTimestamp": "2026-11-22T12:00:00Z", "count": 1,
    }
    for kind in ("Queue", "Reservation"):
        assert event_body("x", "R", "m", now=NOW, component="c", kind=kind)["involvedObject"]["namespace"] == ""


def test_event_on_a_namespaced_object_and_a_long_message() -> None:
    body = event_body("train", "NodeLocked", "x" * 1500, now=NOW, component="c", kind="PodGroup", namespace="ns",
                      event_type="Warning", api_version="scheduling.volcano.sh/v1beta1")
    assert body["metadata"]["namespace"] == "ns" and body["involvedObject"]["namespace"] == "ns"
    assert len(body["message"]) == 1000 and body["type"] == "Warning"
    assert body["involvedObject"]["apiVersion"] == "scheduling.volcano.sh/v1beta1"


# --- the Writer, sending ---

@dataclass
class Sent:
    method: str
    path: str
    body: Any
    content_type: str


class Recorder:
    """Stands in for shared.kube's send_json and get_json: records each request, answers from `nodes`, and raises
    the status queued for a path (one per call)."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.fail: dict[tuple[str, str], list[int]] = {}

    def _raise_if_queued(self, method: str, path: str) -> None:
        queued = self.fail.get((method, path))
        if queued:
            raise api_error(queued.pop(0), "Queued")

    async def send_json(self, api: Any, method: str, path: str, body: Any = None, *, content_type: str = JSON,
                        **_: Any) -> dict[str, Any]:
        self.sent.append(Sent(method, path, body, content_type))
        self._raise_if_queued(method, path)
        return {}

    async def get_json(self, api: Any, path: str, *_: Any, **__: Any) -> dict[str, Any]:
        self._raise_if_queued("GET", path)
        name = path.rsplit("/", 1)[-1]
        if name not in self.nodes:
            raise api_error(404, "Not Found")
        return self.nodes[name]

    def of(self, method: str) -> list[Sent]:
        return [s for s in self.sent if s.method == method]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    fake = Recorder()
    monkeypatch.setattr(writer_module, "send_json", fake.send_json)
    monkeypatch.setattr(writer_module, "get_json", fake.get_json)
    return fake


def new_writer() -> tuple[Writer, list[int]]:
    failures: list[int] = []
    on_failure: Callable[[], None] = lambda: failures.append(1)  # noqa: E731
    unused = cast(client.ApiClient, object())  # the recorder stands in for the edge: the client is never used
    return Writer(unused, on_failure=on_failure), failures


async def test_set_lock_reads_the_node_again_after_a_conflict(recorder: Recorder) -> None:
    recorder.nodes["n1"] = node_obj()
    recorder.fail[("PATCH", "/api/v1/nodes/n1")] = [409, 422]
    writer, _ = new_writer()
    assert await writer.set_lock("n1", LOCK) == (None, True)
    patches = recorder.of("PATCH")
    assert len(patches) == 3 and all(p.content_type == JSON_PATCH for p in patches)
    assert patches[-1].body == node_patch(node_obj(), LOCK)


async def test_set_lock_gives_up_after_max_attempts_and_on_other_errors(recorder: Recorder) -> None:
    recorder.nodes["n1"] = node_obj()
    recorder.fail[("PATCH", "/api/v1/nodes/n1")] = [409] * MAX_ATTEMPTS
    writer, _ = new_writer()
    with pytest.raises(ApiException) as err:
        await writer.set_lock("n1", LOCK)
    assert err.value.status == 409 and len(recorder.of("PATCH")) == MAX_ATTEMPTS
    recorder.fail[("PATCH", "/api/v1/nodes/n1")] = [403]
    with pytest.raises(ApiException):
        await writer.set_lock("n1", LOCK)
    assert len(recorder.of("PATCH")) == MAX_ATTEMPTS + 1, "a 403 is not retried"


async def test_set_lock_on_a_deleted_node_writes_nothing(recorder: Recorder) -> None:
    writer, _ = new_writer()
    assert await writer.set_lock("gone", LOCK) == (None, False)
    assert recorder.sent == []


async def test_apply_locks_releases_and_reports_with_events(recorder: Recorder,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    recorder.nodes["n1"] = node_obj()
    recorder.nodes["n2"] = node_obj(lock=LOCK)
    recorder.nodes["n3"] = node_obj()
    recorder.fail[("PATCH", "/api/v1/nodes/n3")] = [500]
    writer, failures = new_writer()
    held = Lock(node="n2", owner=OWNER, kind=LockKind.JOB, subject=LOCK.subject, reason=LOCK.reason, since=NOW,
                tasks=LOCK.tasks)
    with caplog.at_level(logging.INFO, logger="reservoir.agent"):
        await writer.apply({"n1": LOCK, "n3": LOCK}, {"n2": held})
    assert [p.path for p in recorder.of("PATCH")] == ["/api/v1/nodes/n1", "/api/v1/nodes/n2", "/api/v1/nodes/n3"]
    events = [(s.body["involvedObject"]["kind"], s.body["involvedObject"]["name"], s.body["reason"])
              for s in recorder.of("POST")]
    assert events == [("Node", "n1", "NodeLocked"), ("PodGroup", "train", "NodeLocked"),
                      ("Node", "n2", "NodeReleased"), ("PodGroup", "train", "NodeReleased")]
    assert recorder.of("POST")[1].path == "/api/v1/namespaces/ns/events"
    assert failures == [1]
    assert captured(caplog.records, node="n3", decision="patch-failed", status=500, reason="Queued")
    # issue 14: a lock decision is one line with policy, node, owner and reason
    [locked] = captured(caplog.records, decision="lock")
    assert locked == {"msg": "decision", "level": "info", "logger": "reservoir.agent", "decision": "lock",
                      "policy": "job", "node": "n1", "owner": OWNER, "reason": "starving",
                      "subject": "ns/PodGroup/train"}
    [record] = [r for r in caplog.records if getattr(r, FIELDS, {}).get("decision") == "lock"]
    line = parse(LogfmtFormatter().format(record))
    assert {k: line[k] for k in ("policy", "node", "owner", "reason")} == {
        "policy": "job", "node": "n1", "owner": OWNER, "reason": "starving"}


def test_dry_run_logs_what_it_would_write(caplog: pytest.LogCaptureFixture) -> None:
    writer, _ = new_writer()
    with caplog.at_level(logging.INFO, logger="reservoir.agent"):
        writer.report_dry_run({"n1": LOCK}, {"n2": LOCK})
    assert captured(caplog.records, node="n1", decision="would-lock", dryRun=True, owner=OWNER,
                    subject="ns/PodGroup/train", policy="job")
    assert captured(caplog.records, node="n2", decision="would-release", dryRun=True, owner=OWNER)


async def test_repair_patches_the_pod_and_logs_the_owners(recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    writer, failures = new_writer()
    done = Repair(namespace="ns", name="q", tolerations=(lock_toleration(OWNER),), add=(lock_toleration(OWNER),))
    broken = Repair(namespace="ns", name="p2", tolerations=(), add=(lock_toleration(OWNER),))
    recorder.fail[("PATCH", "/api/v1/namespaces/ns/pods/p2")] = [404]
    with caplog.at_level(logging.INFO, logger="reservoir.agent"):
        await writer.repair([repair([], OWNER), done, broken])
    patches = recorder.of("PATCH")
    assert [(p.path, p.content_type) for p in patches] == [("/api/v1/namespaces/ns/pods/p", JSON_PATCH),
                                                           ("/api/v1/namespaces/ns/pods/p2", JSON_PATCH)]
    assert patches[0].body == repair_patch(repair([], OWNER))
    assert captured(caplog.records, pod="ns/p", decision="repair", owner=[OWNER],
                    reason="lock held for its owner but not tolerated")
    assert captured(caplog.records, pod="ns/p2", decision="repair-failed", status=404, reason="Queued")
    assert failures == [1]


async def test_evict_outcomes(recorder: Recorder) -> None:
    writer, _ = new_writer()
    path = "/api/v1/namespaces/ns/pods/p/eviction"
    recorder.fail[("POST", path)] = [404, 429, 500]
    assert await writer.evict("ns", "p") == "gone"
    assert await writer.evict("ns", "p") == "blocked"
    with pytest.raises(ApiException):
        await writer.evict("ns", "p")
    assert await writer.evict("ns", "p") == "evicted"
    assert recorder.of("POST")[-1].body == eviction_body("ns", "p")


async def test_queue_outputs(recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    writer, failures = new_writer()
    eviction = "/api/v1/namespaces/ns/pods/busy/eviction"
    recorder.fail[("POST", eviction)] = [429, 429]
    planned = [Guarantee("gold", nodes=("n1",), warning="too large", evict=("ns/busy",))]
    with caplog.at_level(logging.INFO, logger="reservoir.agent"):
        await writer.write_queues(planned, {"gold": queue()})
        await writer.write_queues(planned, {"gold": queue()})
        await writer.write_queues(planned, {"gold": queue()})
    statuses = [s for s in recorder.of("PATCH") if s.path == "/apis/scheduling.volcano.sh/v1beta1/queues/gold/status"]
    assert len(statuses) == 3 and all(s.content_type == MERGE_PATCH for s in statuses)
    assert statuses[0].body == {"status": {"reservation": {"nodes": ["n1"], "resource": {"cpu": "8"}}}}
    events = [s.body["reason"] for s in recorder.of("POST") if s.path.endswith("/events")]
    assert events == ["GuaranteeRefused", "EvictionBlocked"], "each reported once"
    assert len([s for s in recorder.of("POST") if s.path == eviction]) == 3, "a blocked eviction is retried"
    assert captured(caplog.records, pod="ns/busy", decision="evict", outcome="blocked", queue="gold")
    assert captured(caplog.records, pod="ns/busy", decision="evict", outcome="evicted", queue="gold")
    assert failures == []


async def test_reservation_outputs(recorder: Recorder) -> None:
    writer, failures = new_writer()
    base = "/apis/reservoir.sh/v1alpha1/reservations"
    recorder.fail[("DELETE", f"{base}/old")] = [404]
    recorder.fail[("PATCH", "/api/v1/namespaces/ns/pods/gone")] = [404]
    planned = [Planned(name="old", phase="Failed", delete=True), Planned(name="done", final=True),
               Planned(name="r1", annotate=("ns/owner", "ns/gone")), Planned(name="missing")]
    reservations = {"old": reservation(), "done": reservation(), "r1": reservation()}
    await writer.write_reservations(planned, reservations)
    assert [(s.method, s.path, s.content_type) for s in recorder.sent if not s.path.endswith("/events")] == [
        ("DELETE", f"{base}/old", JSON),
        ("PATCH", f"{base}/r1/status", MERGE_PATCH),
        ("PATCH", "/api/v1/namespaces/ns/pods/owner", MERGE_PATCH),
        ("PATCH", "/api/v1/namespaces/ns/pods/gone", MERGE_PATCH),
    ]
    assert recorder.sent[1].body == {"status": Planned(name="r1").status()}
    assert recorder.sent[3].body == allocated_annotation_patch("r1")
    event = recorder.of("POST")[0].body
    assert (event["reason"], event["type"], event["involvedObject"]["apiVersion"]) == (
        "Available", "Normal", "reservoir.sh/v1alpha1")
    assert failures == [], "a deleted pod or an already deleted Reservation is no failure"


# --- guard rails of evictions (issue 10): the writer's last check and the per-minute limit ---

def running_pod(namespace: str, name: str, **meta: Any) -> PodView:
    return PodView.from_obj({"metadata": {"namespace": namespace, "name": name, **meta},
                             "spec": {"nodeName": "n1", "containers": []}, "status": {"phase": "Running"}})


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_evictions_beyond_the_per_minute_limit_wait_for_a_later_reconcile(
        recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    deferred: list[int] = []
    writer = Writer(cast(client.ApiClient, object()), on_deferred=deferred.append, clock=clock)
    writer.configure(load_config("guarantee: {maxEvictionsPerMinute: 2}"))
    keys_ = ("ns/a", "ns/b", "ns/c")
    pods = {key: running_pod(*key.split("/")) for key in keys_}
    planned = [Guarantee("gold", nodes=("n1",), evict=keys_)]

    def evicted() -> list[str]:
        return [s.path for s in recorder.of("POST") if s.path.endswith("/eviction")]

    with caplog.at_level(logging.INFO, logger="reservoir.agent"):
        await writer.write_queues(planned, {"gold": queue()}, pods=pods)
    assert evicted() == ["/api/v1/namespaces/ns/pods/a/eviction", "/api/v1/namespaces/ns/pods/b/eviction"]
    assert deferred == [1] and writer.retry_after == pytest.approx(60)
    [line] = captured(caplog.records, pods=["ns/c"], decision="evict-deferred", count=1)
    assert line["reason"].startswith("guarantee.maxEvictionsPerMinute (2) reached")
    clock.now += 30
    await writer.write_queues(planned, {"gold": queue()}, pods=pods)
    assert len(evicted()) == 2 and deferred == [1, 3] and writer.retry_after == pytest.approx(30)
    clock.now += 30  # a minute after the first two: room for two more
    await writer.write_queues(planned, {"gold": queue()}, pods=pods)
    assert len(evicted()) == 4 and writer.retry_after == pytest.approx(60)


async def test_blocked_and_gone_evictions_do_not_spend_the_minute(recorder: Recorder) -> None:
    writer = Writer(cast(client.ApiClient, object()), clock=FakeClock())
    writer.configure(load_config("guarantee: {maxEvictionsPerMinute: 1}"))
    recorder.fail[("POST", "/api/v1/namespaces/ns/pods/a/eviction")] = [429]
    recorder.fail[("POST", "/api/v1/namespaces/ns/pods/b/eviction")] = [404]
    pods = {key: running_pod(*key.split("/")) for key in ("ns/a", "ns/b", "ns/c", "ns/d")}
    await writer.write_queues([Guarantee("gold", evict=("ns/a", "ns/b", "ns/c", "ns/d"))], {"gold": queue()},
                              pods=pods)
    posted = [s.path.split("/")[-2] for s in recorder.of("POST") if s.path.endswith("/eviction")]
    assert posted == ["a", "b", "c"], "a blocked and a gone pod cost nothing; c spends the minute; d waits"
    assert writer.retry_after == pytest.approx(60)


async def test_the_writer_refuses_evictions_the_guard_rails_forbid(recorder: Recorder,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    writer = Writer(cast(client.ApiClient, object()))
    writer.configure(load_config("guarantee: {protectedNamespaces: [vault]}").protecting("ops"))
    daemonset = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u", "controller": True}]
    pods = {
        "kube-system/dns": running_pod("kube-system", "dns"),
        "ops/agent": running_pod("ops", "agent"),
        "vault/v": running_pod("vault", "v"),
        "ns/ds": running_pod("ns", "ds", ownerReferences=daemonset),
        "ns/mirror": running_pod("ns", "mirror", annotations={"kubernetes.io/config.mirror": "x"},
                                 ownerReferences=[{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1-uid"}]),
        "ns/ok": running_pod("ns", "ok"),
        # issue 29: the same claims, unbacked by the node's or the DaemonSet's uid, are any pod's
        "ns/forged-ds": running_pod("ns", "forged-ds", ownerReferences=[{**daemonset[0], "uid": "v"}]),
        "ns/forged-mirror": running_pod("ns", "forged-mirror", annotations={"kubernetes.io/config.mirror": "x"}),
    }
    planned = [Guarantee("gold", evict=(*pods, "ns/unknown"))]
    witnesses = Witnesses({"n1": "n1-uid"}, {("ns", "ds"): "u"})
    with caplog.at_level(logging.INFO, logger="reservoir.agent"):
        await writer.write_queues(planned, {"gold": queue()}, pods=pods, witnesses=witnesses)
    assert [s.path for s in recorder.of("POST") if s.path.endswith("/eviction")] == [
        f"/api/v1/namespaces/ns/pods/{name}/eviction" for name in ("ok", "forged-ds", "forged-mirror")]
    for key, why in [("kube-system/dns", "namespace kube-system is protected"), ("ops/agent", "namespace ops"),
                     ("vault/v", "namespace vault"), ("ns/ds", "DaemonSet pod"), ("ns/mirror", "mirror pod"),
                     ("ns/unknown", "not in the snapshot")]:
        assert any(line["reason"].startswith(why)
                   for line in captured(caplog.records, pod=key, decision="evict-refused", queue="gold")), key
    # without the snapshot's pods (a direct call), the namespace alone is checked
    await writer.write_queues([Guarantee("gold", evict=("kube-system/x", "ns/y"))], {"gold": queue()})
    assert [s.path for s in recorder.of("POST") if s.path.endswith("/eviction")][-1:] == [
        "/api/v1/namespaces/ns/pods/y/eviction"]


async def test_an_eviction_limit_of_zero_turns_evictions_off_without_deferring(recorder: Recorder) -> None:
    deferred: list[int] = []
    writer = Writer(cast(client.ApiClient, object()), on_deferred=deferred.append)
    writer.configure(load_config("guarantee: {maxEvictionsPerMinute: 0}"))
    await writer.write_queues([Guarantee("gold", evict=("ns/a",))], {"gold": queue()},
                              pods={"ns/a": running_pod("ns", "a")})
    assert not [s for s in recorder.of("POST") if s.path.endswith("/eviction")]
    assert deferred == [] and writer.retry_after is None, "nothing to come back for"


async def test_a_queues_and_a_reservations_locks_are_reported_on_them_too(recorder: Recorder) -> None:
    """Issue 11, DESIGN section 4 "Visibility": NodeLocked / NodeReleased Events go on the Queue and the Reservation
    that own a lock, as they go on a job's PodGroup, with the owner's uid when the snapshot knows it (`kubectl
    describe` matches Events by it). A Queue and a Reservation are cluster-scoped: their Events are recorded in
    `default`. A window is no object: the node's Event is all."""
    queue_lock = Lock(node="n1", owner="queue-gold-abcdef", kind=LockKind.QUEUE, subject="queue/gold",
                      reason="guarantee of queue gold (resource, Best-Effort)", since=NOW)
    held = Lock(node="n2", owner="reservation-r1-abcdef", kind=LockKind.RESERVATION, subject="reservation/r1",
                reason="Reservation r1", since=NOW)
    window = Lock(node="n3", owner="window-w-abcdef", kind=LockKind.WINDOW, subject="window/w", reason="w", since=NOW)
    recorder.nodes["n1"] = node_obj()
    recorder.nodes["n2"] = {**node_obj(lock=held), "metadata": {**node_obj(lock=held)["metadata"], "name": "n2"}}
    recorder.nodes["n3"] = node_obj()
    writer, _ = new_writer()
    await writer.apply({"n1": queue_lock, "n3": window}, {"n2": held})
    events = [(s.path, s.body["involvedObject"], s.body["reason"]) for s in recorder.of("POST")]
    owners = [(path, obj, reason) for path, obj, reason in events if obj["kind"] != "Node"]
    assert owners == [
        ("/api/v1/namespaces/default/events", {"kind": "Queue", "name": "gold", "namespace": "",
                                               "apiVersion": keys.VOLCANO_API_VERSION}, "NodeLocked"),
        ("/api/v1/namespaces/default/events", {"kind": "Reservation", "name": "r1", "namespace": "",
                                               "apiVersion": keys.RESERVATION_API_VERSION}, "NodeReleased"),
    ]
    assert [(obj["name"], reason) for _, obj, reason in events if obj["kind"] == "Node"] == [
        ("n1", "NodeLocked"), ("n2", "NodeReleased"), ("n3", "NodeLocked")]
    # with the snapshot the plan was made from, the owner's uid
    recorder.sent.clear()
    recorder.nodes["n1"] = node_obj()
    gold = QueueView.from_obj({"metadata": {"name": "gold", "uid": "uid-gold"}, "spec": {}})
    await writer.apply({"n1": queue_lock}, {}, snapshot=Snapshot(queues={"gold": gold}))
    assert [s.body["involvedObject"].get("uid") for s in recorder.of("POST")] == [None, "uid-gold"]


def test_an_exclusive_lock_carries_the_exclusive_taint_too_and_a_release_removes_both() -> None:
    """Issue 11: a `Guaranteed` queue's lock (Lock.exclusive) is two taints, `reservoir.sh/lock` and
    `reservoir.sh/lock-exclusive`, both valued with the owner id; read back as exclusive; turning the lock
    non-exclusive, or releasing it, removes the second; other taints stay."""
    exclusive = Lock(node="n1", owner="queue-gold-abcdef", kind=LockKind.QUEUE, subject="queue/gold", reason="g",
                     since=NOW, exclusive=True)
    theirs = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    locked = apply(node_obj(taints=[theirs]), [op for op in node_patch(node_obj(taints=[theirs]), exclusive) or []
                                               if op["op"] != "test"])
    assert locked["spec"]["taints"] == [theirs, {"key": keys.LOCK, "value": exclusive.owner, "effect": "NoSchedule"},
                                        {"key": keys.LOCK_EXCLUSIVE, "value": exclusive.owner, "effect": "NoSchedule"}]
    assert lock_on(NodeView.from_obj(locked)) == exclusive and node_patch(locked, exclusive) is None
    plain = Lock(**{**exclusive.__dict__, "exclusive": False})
    assert not exclusive.same_hold(plain)
    for desired in (plain, None):
        ops = node_patch(locked, desired) or []
        taints = next(op["value"] for op in ops if op["path"] == "/spec/taints")
        assert keys.LOCK_EXCLUSIVE not in {t["key"] for t in taints} and theirs in taints


# --- node patches of one reconcile go out concurrently, bounded (issue 15) ---

class StandIn:
    """A stand-in API server for `loopback_api`: nodes by name, each GET answering the node as it is, each PATCH
    checked against the resourceVersion its `test` names (422 when it changed), held `delay` seconds, then taking the
    node to `after` (a release: Reservoir's keys gone). Records the PATCHes in flight at once and when each arrived."""

    def __init__(self, names: Sequence[str], *, delay: float = 0.05) -> None:
        self.nodes = {name: named(node_obj(lock=held_lock(name)), name) for name in names}
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0
        self.patched: list[str] = []  # names, in the order their PATCH was answered
        self.arrived: list[float] = []  # loop time of each PATCH's arrival
        self.answered: list[float] = []  # loop time of each successful PATCH's answer
        self.fail: dict[str, int] = {}  # a node's PATCH answered with this status
        self.garbled: set[str] = set()  # a node's GET answered with a JSON list (the client edge raises ValueError)
        self.moved: set[str] = set()  # a node changed by someone else right after its first read (a conflict)
        self.events: list[tuple[str, str]] = []
        self.on_patch: Callable[[str], None] = lambda _: None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        name = request.path.rsplit("/", 1)[-1]
        if request.method == "POST":
            body = await request.json()
            self.events.append((body["involvedObject"]["name"], body["reason"]))
            return web.json_response({"kind": "Event"})
        if request.method == "GET":
            if name in self.garbled:
                return web.json_response([])
            answer = self.nodes[name]
            if name in self.moved:
                self.moved.discard(name)
                self.nodes[name] = named(node_obj(lock=held_lock(name)), name, "42")
            return web.json_response(answer)
        ops = await request.json()
        self.arrived.append(asyncio.get_running_loop().time())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if name in self.fail:
            return web.json_response({"kind": "Status"}, status=self.fail[name])
        if ops[0] != {"op": "test", "path": "/metadata/resourceVersion",
                      "value": self.nodes[name]["metadata"]["resourceVersion"]}:
            return web.json_response({"kind": "Status", "reason": "Invalid"}, status=422)
        self.nodes[name] = named(node_obj(), name, "99")
        self.patched.append(name)
        self.answered.append(asyncio.get_running_loop().time())
        self.on_patch(name)
        return web.json_response(self.nodes[name])


def named(node: dict[str, Any], name: str, version: str = "41") -> dict[str, Any]:
    node["metadata"].update(name=name, resourceVersion=version)
    return node


def held_lock(name: str) -> Lock:
    return Lock(node=name, owner=OWNER, kind=LockKind.JOB, subject=LOCK.subject, reason=LOCK.reason, since=NOW)


def held(names: Sequence[str]) -> dict[str, Lock]:
    return {name: held_lock(name) for name in names}


async def test_node_patches_of_one_reconcile_overlap_within_the_bound() -> None:
    names = [f"n{i:02d}" for i in range(40)]
    server = StandIn(names)
    server.moved.add("n03")  # a concurrent write: its patch's resourceVersion test fails, read again, patched
    failures: list[int] = []
    async with loopback_api(server.handle) as api:
        await Writer(api, on_failure=lambda: failures.append(1)).apply({}, held(names))
    assert sorted(server.patched) == names and failures == []
    assert 1 < server.max_in_flight <= writer_module.NODE_PATCHES_IN_FLIGHT
    assert sorted(server.events) == sorted([(n, "NodeReleased") for n in names] + [("train", "NodeReleased")] * 40), \
        "each node's Events after its own patch, and its owner's"


async def test_one_node_failing_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    names = [f"n{i}" for i in range(6)]
    server = StandIn(names)
    server.fail["n1"] = 500
    server.garbled.add("n4")  # not an ApiException: raised from apply once the others are done
    failures: list[int] = []
    async with loopback_api(server.handle) as api:
        writer = Writer(api, on_failure=lambda: failures.append(1))
        with caplog.at_level(logging.INFO, logger="reservoir.agent"), pytest.raises(ValueError, match="JSON list"):
            await writer.apply({}, held(names))
    assert sorted(server.patched) == ["n0", "n2", "n3", "n5"]
    assert failures == [1] and captured(caplog.records, node="n1", decision="patch-failed", status=500)
    assert {n for n, reason in server.events if reason == "NodeReleased"} >= {"n0", "n2", "n3", "n5"}
    assert all(captured(caplog.records, node=n, decision="release", owner=OWNER) for n in ("n0", "n2", "n3", "n5"))


async def test_a_fenced_writer_writes_nothing_and_a_lease_lost_mid_batch_stops_the_nodes_not_yet_sent(
        caplog: pytest.LogCaptureFixture) -> None:
    names = [f"n{i:02d}" for i in range(40)]
    server = StandIn(names)
    fenced: list[int] = []
    async with loopback_api(server.handle) as api:
        stale = Writer(api, fence=lambda: "the Lease is held by rival", on_fenced=lambda: fenced.append(1))
        await stale.apply({}, held(names))
        assert server.patched == [] and server.arrived == [] and server.events == [] and fenced == [1]

        lost: list[str] = []
        server.on_patch = lost.append  # the Lease is lost as soon as the first patch is answered
        writer = Writer(api, fence=lambda: "lost" if lost else None, on_fenced=lambda: fenced.append(1))
        with caplog.at_level(logging.INFO, logger="reservoir.agent"):
            await writer.write(Plan(locks={}), Snapshot(), held(names), dry_run=False)
    assert 1 <= len(server.arrived) <= writer_module.NODE_PATCHES_IN_FLIGHT, \
        "only the patches already in flight when the Lease was lost landed"
    assert server.events == [], "no Event after the Lease was lost"
    assert captured(caplog.records, batch="plan", decision="fenced", reason="lost",
                    done="stopped mid-batch, the rest left unwritten") and fenced == [1, 1]


async def test_an_armed_failpoint_writes_nodes_one_at_a_time_in_name_order_until_it_acts(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """`pause-after-node-patches:N:S` still means "after the N-th successful patch", the N-th node by name: until it
    acts no other patch is in flight, and none is sent during the pause; later reconciles overlap again."""
    monkeypatch.setenv(writer_module.FAILPOINT, "pause-after-node-patches:2:0.3")
    names = [f"n{i:02d}" for i in range(6)]
    server = StandIn(names, delay=0.02)
    async with loopback_api(server.handle) as api:
        writer = Writer(api)
        with caplog.at_level(logging.WARNING, logger="reservoir.agent"):
            await writer.apply({}, held(names))
        assert server.patched == names and server.max_in_flight == 1
        assert server.arrived[2] - server.answered[1] >= 0.29, "nothing sent during the pause after the second"
        assert captured(caplog.records, node="n01", failpoint="pause-after-node-patches:2:0.3",
                        msg="failpoint: pausing mid-reconcile")

        later = [f"m{i:02d}" for i in range(6)]
        server.nodes.update(StandIn(later).nodes)
        server.max_in_flight = 0
        await writer.apply({}, held(later))
    assert sorted(server.patched[len(names):]) == later and server.max_in_flight > 1


async def test_an_estimate_annotation_refused_is_not_sent_again_at_every_plan(recorder: Recorder) -> None:
    """A tenant's pod at its annotation size limit refuses the merge patch (422): it is not sent one again for
    ESTIMATE_RETRY_SECONDS unless the estimate moved (an estimate that says "now", rewritten as the current second at
    every plan, has not), each refusal counted; the refused do not take the places of the plan's others; a pod gone
    is no failure."""
    from agent.planner.model import EstimateMark
    from agent.writer import ESTIMATE_RETRY_SECONDS, MAX_ESTIMATE_WRITES

    now = [0.0]
    failures: list[int] = []
    writer = Writer(cast(client.ApiClient, object()), on_failure=lambda: failures.append(1), clock=lambda: now[0])
    path = "/api/v1/namespaces/ns/pods/big"
    mark = EstimateMark("Pod", "ns", "big", "2026-01-01T00:00:40Z")  # long past: the estimate says "now"
    recorder.fail[("PATCH", path)] = [422, 422, 422]
    await writer.estimates([mark])
    await writer.estimates([EstimateMark("Pod", "ns", "big", "2026-01-01T00:00:41Z")])  # "now", a second later
    assert len(recorder.of("PATCH")) == 1 and failures == [1]
    moved_on = EstimateMark("Pod", "ns", "big", "2099-01-01T00:00:00Z")
    await writer.estimates([moved_on])
    assert len(recorder.of("PATCH")) == 2 and failures == [1, 1]
    # many refused ones do not crowd out the others: they are skipped before the cap counts
    others = [EstimateMark("Pod", "ns", f"p{i:03d}", "2099-01-01T00:00:00Z") for i in range(MAX_ESTIMATE_WRITES + 5)]
    await writer.estimates([moved_on, *others])
    assert len(recorder.of("PATCH")) == 2 + MAX_ESTIMATE_WRITES
    assert recorder.of("PATCH")[2].path == "/api/v1/namespaces/ns/pods/p000"
    now[0] = ESTIMATE_RETRY_SECONDS
    await writer.estimates([mark])
    assert recorder.of("PATCH")[-1].path == path and recorder.of("PATCH")[-1].body == {
        "metadata": {"annotations": {keys.EXPECTED_START: mark.text}}}
    recorder.fail[("PATCH", "/api/v1/namespaces/ns/pods/gone")] = [404]
    before = len(failures)
    await writer.estimates([EstimateMark("Pod", "ns", "gone", mark.text)])
    assert len(failures) == before


async def test_a_deadline_cut_is_tested_against_the_pods_uid(recorder: Recorder) -> None:
    """The cut goes to the very pod the plan saw: the patch starts with a test of its uid (one made again under the
    name between the read and the patch makes it fail); a pod whose own deadline is as small is not patched."""
    from agent.planner.model import DeadlineCut

    pod = {"metadata": {"name": "late", "namespace": "ns", "uid": "u1"},
           "spec": {"nodeName": "n1", "activeDeadlineSeconds": 10, "containers": [{"name": "c"}]},
           "status": {"phase": "Running", "startTime": "2026-11-22T12:00:10Z"}}
    recorder.nodes["late"] = pod
    writer, _ = new_writer()
    cut = DeadlineCut(pod=PodView.from_obj(pod), node="n1", owner="job-x",
                      until=datetime(2026, 11, 22, 12, 0, 15, tzinfo=UTC), deadline=5)
    await writer.cut_deadlines([cut])
    (sent,) = recorder.of("PATCH")
    assert sent.body[0] == {"op": "test", "path": "/metadata/uid", "value": "u1"}
    assert apply(pod, sent.body)["spec"]["activeDeadlineSeconds"] == 5
    recorder.nodes["late"] = {**pod, "spec": {**pod["spec"], "activeDeadlineSeconds": 5}}
    await writer.cut_deadlines([cut])
    assert len(recorder.of("PATCH")) == 1


async def test_a_cut_for_a_pod_with_no_grant_reads_the_node_again_first(recorder: Recorder) -> None:
    """The plan saw no grant naming the pod (backfill.deadline_cuts, `ungranted`): the writer reads the node again and
    cuts only if no grant there names it (the agent's cache may lag a grant it has just written) and the node is
    still locked for the owner."""
    from agent.planner.model import DeadlineCut
    from shared.backfill import Grant, grants_text

    pod = {"metadata": {"name": "late", "namespace": "ns", "uid": "u1"},
           "spec": {"nodeName": "n1", "activeDeadlineSeconds": 10, "containers": [{"name": "c"}]},
           "status": {"phase": "Running", "startTime": "2026-11-22T12:00:10Z"}}
    recorder.nodes["late"] = pod
    taint = {"key": keys.LOCK, "value": "job-x", "effect": keys.LOCK_EFFECT}
    cut = DeadlineCut(pod=PodView.from_obj(pod), node="n1", owner="job-x",
                      until=datetime(2026, 11, 22, 12, 0, 5, tzinfo=UTC), deadline=1, ungranted=True)
    grant = Grant("u1", "ns/late", "job-x", datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC))
    writer, _ = new_writer()
    recorder.nodes["n1"] = node_obj(taints=[taint], annotations={keys.BACKFILL_GRANTS: grants_text([grant]) or ""})
    await writer.cut_deadlines([cut])
    recorder.nodes["n1"] = node_obj(taints=[{**taint, "value": "job-y"}])
    await writer.cut_deadlines([cut])
    assert recorder.of("PATCH") == []
    recorder.nodes["n1"] = node_obj(taints=[taint])
    await writer.cut_deadlines([cut])
    (sent,) = recorder.of("PATCH")
    assert apply(pod, sent.body)["spec"]["activeDeadlineSeconds"] == 1


async def test_a_grant_written_after_the_plans_snapshot_is_kept_when_the_plan_rewrites_the_grants(
        recorder: Recorder) -> None:
    """The plan saw grant `a` on n1 and drops it (its pod ended); grant `b` was written by the reconcile before, after
    this plan's snapshot: the patch keeps `b`, which the plan cannot have meant to drop, and adds the plan's `c`."""
    from shared.backfill import Grant, grants_text, keep_unseen_grants, read_grants

    until = datetime(2026, 11, 22, 12, 0, 15, tzinfo=UTC)
    a, b, c = (Grant(u, f"ns/{u}", "job-x", until) for u in ("a", "b", "c"))
    recorder.nodes["n1"] = node_obj(annotations={keys.BACKFILL_GRANTS: grants_text([a, b]) or ""})
    writer, _ = new_writer()
    planned = grants_text([c])
    assert await writer.set_lock("n1", None, {keys.BACKFILL_GRANTS: planned}, {"a"}) == (None, True)
    (sent,) = recorder.of("PATCH")
    annotations = apply(recorder.nodes["n1"], sent.body)["metadata"]["annotations"]
    assert read_grants(annotations[keys.BACKFILL_GRANTS]) == {"b": b, "c": c}
    # pure: nothing unseen leaves the plan's text as it is (None: the annotation removed)
    assert keep_unseen_grants(planned, grants_text([a]), {"a"}) == planned
    assert keep_unseen_grants(None, grants_text([a]), {"a"}) is None
    assert keep_unseen_grants(None, grants_text([b]), {"a"}) == grants_text([b])
    assert keep_unseen_grants(planned, "not json", set()) == planned
