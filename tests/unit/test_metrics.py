"""Issue 14, "Metrics and alerts": the metrics each program's registry holds, their names by Prometheus's conventions,
and the new ones moving as what they measure happens (reconcile errors, evictions, handovers, lock expiries, cache
freshness, the serving certificate's expiry, the build)."""

from __future__ import annotations

import asyncio
import platform
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.controller import Agent
from agent.planner.model import Handover, Lock
from certs.rotation import Subject, ensure
from reservoir import cli, reference
from shared import metrics as shared_metrics
from shared import version
from shared.keys import LockKind
from tests.unit.test_writer import Guarantee, Recorder, new_writer, node_obj, queue, recorder  # noqa: F401
from webhook.server import Metrics, ReloadingTLS

# Every metric README's table lists, by program (the e2e test checks the alert rules and dashboard against a scrape).
COMMON = {"reservoir_build_info", "reservoir_cache_last_heard_timestamp_seconds",
          "reservoir_watch_skipped_objects_total", "process_cpu_seconds_total", "process_resident_memory_bytes",
          "process_start_time_seconds", "process_open_fds", "python_info", "python_gc_collections_total"}
AGENT = COMMON | {"reservoir_leader", "reservoir_locks", "reservoir_starving_jobs", "reservoir_soft_drained_nodes",
                  "reservoir_reconcile_duration_seconds", "reservoir_reconcile_errors_total",
                  "reservoir_reconcile_wakeups_total", "reservoir_patch_errors_total",
                  "reservoir_config_rejected_total", "reservoir_writes_fenced_total", "reservoir_evictions_total",
                  "reservoir_evictions_deferred_total", "reservoir_handover_wait_seconds",
                  "reservoir_lock_expiry_timestamp_seconds"}
WEBHOOK = COMMON | {"reservoir_webhook_requests_total", "reservoir_webhook_request_duration_seconds",
                    "reservoir_webhook_admissions_total", "reservoir_webhook_cache_synced",
                    "reservoir_webhook_certificate_reloads_total",
                    "reservoir_webhook_certificate_expiry_timestamp_seconds"}


def families(registry: CollectorRegistry) -> dict[str, str]:
    """The registry as a scrape reads it: each family it declares (`# TYPE`, with or without samples yet) -> its
    type; prometheus_client's `_created` series (each counter's and histogram's creation time) left out."""
    text = generate_latest(registry).decode()
    return {name: kind for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)
            if not name.endswith("_created")}


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(registry).decode()
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


webhook_registry = reference.webhook_registry  # the webhook's registry as webhook.main completes it


def test_each_program_serves_its_metrics_named_by_the_conventions() -> None:
    for registry, expected in ((Agent(None).metrics.registry, AGENT),  # type: ignore[arg-type]
                               (webhook_registry(), WEBHOOK)):
        found = families(registry)
        assert expected <= set(found), sorted(expected - set(found))
        for name, kind in found.items():
            assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
            assert (kind == "counter") == name.endswith("_total"), f"{name}: only a counter ends _total"
            if kind == "histogram" or "duration" in name or "timestamp" in name or "wait" in name:
                assert name.endswith("_seconds"), f"{name}: a time is in seconds, and says so"
            assert not re.search(r"_(milliseconds|ms|minutes|hours|kilobytes|megabytes)(_|$)", name), name
            assert not name.endswith("_total_total"), name


def test_build_info_is_the_one_version_the_cli_prints() -> None:
    assert cli.version is version.version, "one place defines the version"
    for registry in (Agent(None).metrics.registry, webhook_registry()):  # type: ignore[arg-type]
        assert samples(registry, "reservoir_build_info") == {
            (("python", platform.python_version()), ("revision", version.revision()),
             ("version", version.version())): 1.0}


def test_the_revision_comes_from_the_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(version.REVISION_ENV, "abc1234")
    assert version.revision() == "abc1234"
    monkeypatch.delenv(version.REVISION_ENV)
    assert version.revision() == "unknown"


def test_cache_freshness_is_when_each_cache_last_heard(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    agent = Agent(None)  # type: ignore[arg-type]
    before = samples(agent.metrics.registry, "reservoir_cache_last_heard_timestamp_seconds")
    assert {dict(k)["cache"] for k in before} == {c.name for c in agent.caches}
    mono, wall = time.monotonic(), 1_800_000_000.0
    # the scrape's clocks, stopped: wall time `wall` when time.monotonic() is `mono`
    monkeypatch.setattr(shared_metrics, "time", SimpleNamespace(time=lambda: wall, monotonic=lambda: mono))
    agent.nodes._created_at = mono - 1000  # never heard: its creation, 1000 s ago
    agent.pods.heard(mono - 30)
    after = {dict(k)["cache"]: v for k, v in samples(agent.metrics.registry,
                                                     "reservoir_cache_last_heard_timestamp_seconds").items()}
    assert after["nodes"] == wall - 1000 and after["pods"] == wall - 30


def test_a_reconcile_that_raises_is_counted() -> None:
    agent = Agent(None)  # type: ignore[arg-type]
    calls: list[int] = []

    async def failing() -> Any:
        calls.append(1)
        raise RuntimeError("boom")

    async def run() -> None:
        agent.reconcile = failing  # type: ignore[method-assign]
        task = asyncio.create_task(agent.reconcile_loop())
        agent.changed.set()
        for _ in range(200):
            await asyncio.sleep(0.02)
            if calls:
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    assert samples(agent.metrics.registry, "reservoir_reconcile_errors_total") == {(): 0.0}
    asyncio.run(run())
    assert calls and samples(agent.metrics.registry, "reservoir_reconcile_errors_total") == {(): float(len(calls))}


def test_lock_expiry_is_one_series_per_locked_node_that_expires() -> None:
    agent = Agent(None)  # type: ignore[arg-type]
    since = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    expiring = Lock(node="n1", owner="job-ns-a-123456", kind=LockKind.JOB, subject="ns/PodGroup/a",
                    reason="starving", since=since, expires=since + timedelta(hours=2))
    endless = Lock(node="n2", owner="queue-gold-123456", kind=LockKind.QUEUE, subject="Queue/gold",
                   reason="guarantee", since=since)
    for lock in (expiring, endless):
        obj = node_obj(lock=lock)
        obj["metadata"]["name"] = lock.node
        agent.nodes.apply_event({"type": "ADDED", "object": obj})
    agent.nodes.apply_event({"type": "ADDED", "object": {"metadata": {"name": "n3", "resourceVersion": "1"}}})
    assert samples(agent.metrics.registry, "reservoir_lock_expiry_timestamp_seconds") == {
        (("kind", "job"), ("node", "n1")): (since + timedelta(hours=2)).timestamp()}
    agent.nodes.apply_event({"type": "DELETED", "object": {"metadata": {"name": "n1", "resourceVersion": "2"}}})
    assert samples(agent.metrics.registry, "reservoir_lock_expiry_timestamp_seconds") == {}


async def test_evictions_are_counted_by_outcome(recorder: Recorder) -> None:  # noqa: F811
    agent = Agent(None)  # type: ignore[arg-type]
    writer, _ = new_writer()
    writer.on_evicted = lambda outcome: agent.metrics.evictions.labels(outcome).inc()
    eviction = "/api/v1/namespaces/ns/pods/busy/eviction"
    recorder.fail[("POST", eviction)] = [429, 404, 500]
    planned = [Guarantee("gold", nodes=("n1",), evict=("ns/busy",))]
    for _ in range(4):
        await writer.write_queues(planned, {"gold": queue()})
    assert {dict(k)["outcome"]: v for k, v in samples(agent.metrics.registry, "reservoir_evictions_total").items()} \
        == {"blocked": 1.0, "gone": 1.0, "failed": 1.0, "evicted": 1.0}


async def test_a_lifted_gate_observes_the_owners_wait_since_its_creation(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from agent import writer as writer_module

    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

    class Stopped(datetime):  # the writer's wall clock, stopped at `now`
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return now if tz is None else now.astimezone(tz)

    monkeypatch.setattr(writer_module, "datetime", Stopped)
    waits: list[tuple[str, float]] = []
    writer, _ = new_writer()
    writer.on_handover = lambda how, waited: waits.append((how, waited))
    created = (now - timedelta(seconds=90)).strftime("%Y-%m-%dT%H:%M:%SZ")
    recorder.nodes["owner"] = {"metadata": {"name": "owner", "uid": "u1", "creationTimestamp": created},
                               "spec": {"schedulingGates": [{"name": "reservoir.sh/reservation-handover"}]}}
    await writer.handover(Handover(namespace="ns", name="owner", uid="u1", reservation="r1"))
    [(how, waited)] = waits
    assert how == "ungate" and waited == 90
    recorder.nodes["plain"] = {"metadata": {"name": "plain", "uid": "u2", "creationTimestamp": created}, "spec": {}}
    await writer.handover(Handover(namespace="ns", name="plain", uid="u2", reservation="r1"))
    assert len(waits) == 1, "no gate lifted, nothing observed"


def test_the_webhook_reports_the_expiry_of_the_certificate_it_serves(tmp_path: Path) -> None:
    ensure(tmp_path, Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",)))
    metrics = Metrics()
    ReloadingTLS(tmp_path / "tls.crt", tmp_path / "tls.key", metrics)
    leaf = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    expiry = "reservoir_webhook_certificate_expiry_timestamp_seconds"
    assert samples(metrics.registry, expiry) == {(): leaf.not_valid_after_utc.timestamp()}
    metrics.serving(b"not a certificate")
    assert samples(metrics.registry, expiry) == {(): leaf.not_valid_after_utc.timestamp()}, "kept"
    assert leaf.not_valid_after_utc > datetime.now(UTC) + timedelta(days=7)


def test_the_metrics_page_lists_what_each_program_serves_and_nothing_else() -> None:
    """The docs' metrics reference (reservoir.reference, generated from registries built as the programs build
    them) names exactly the families the running programs' registries declare."""
    page = reference.metrics_page()
    agent_part, webhook_part = page.split("## The webhook")
    for part, registry in ((agent_part, Agent(None).metrics.registry), (webhook_part, webhook_registry())):  # type: ignore[arg-type]
        listed = set(re.findall(r"^\| `([a-z_]+)` \|", part, re.M))
        served = set(families(registry))
        assert listed == served, (sorted(served - listed), sorted(listed - served))


