"""Issue 10, lease fencing: the agent writes only while it holds the Lease and renewed it within the lease duration.

LeaseFence (when this replica may write), FencedLeaseLock (what feeds it: kubernetes_asyncio's LeaseLock with
timeouts, against a fake Lease API with resourceVersion checks), the library's election loop with a rival taking
the Lease, and the Writer with a stale fence (its client edge replaced by a recorder, as in test_writer.py)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.leaderelectionrecord import LeaderElectionRecord

from agent import writer as writer_module
from agent.controller import LEASE_DURATION, FencedLeaseLock, LeaseFence
from agent.planner.model import Lock, Plan, QueueGuaranteeStatus, Repair, Snapshot
from agent.writer import Fenced, Writer
from reservoir.cli import build_parser
from shared.keys import LockKind
from shared.kube import JSON, api_error, own_namespace
from shared.resources import Resources
from shared.tolerations import lock_toleration
from shared.views import QueueView
from tests.logfmt import captured

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
OWNER = "job-ns-train-abcdef"


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


# --- LeaseFence ---

def test_the_fence_holds_only_between_a_renewal_and_the_lease_duration() -> None:
    clock = Clock()
    fence = LeaseFence("agent-a", duration=15, clock=clock)
    assert fence.stale() == "agent-a does not hold the Lease", "nothing written before the Lease is won"
    fence.renewed(clock.now)
    assert fence.stale() is None
    clock.now += 14.9
    assert fence.stale() is None
    clock.now += 0.1
    assert "last renewed 15.0s ago, not within the lease duration (15s)" in (fence.stale() or "")
    fence.renewed(clock.now - 1)  # the renewal is timed when it was sent, not when its answer came
    clock.now += 13.5
    assert fence.stale() is None
    clock.now += 0.5
    assert fence.stale() is not None


def test_a_read_showing_another_holder_or_none_ends_the_fence_at_once() -> None:
    clock = Clock()
    fence = LeaseFence("agent-a", clock=clock)
    fence.renewed(clock.now)
    fence.observed("agent-a")
    assert fence.stale() is None, "reading itself as holder is no renewal, and no loss"
    fence.observed("rival")
    assert fence.stale() == "the Lease is held by rival, not agent-a"
    fence.renewed(clock.now)
    fence.observed(None)
    assert fence.stale() == "agent-a does not hold the Lease"
    fence.renewed(clock.now)
    fence.lost()
    assert fence.stale() is not None
    assert LeaseFence("x").duration == LEASE_DURATION


# --- FencedLeaseLock against a fake Lease API ---

def _time(value: datetime | str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else value


class LeaseApi:
    """One Lease, with resourceVersion checks on replace, as kube-apiserver keeps it; `hang` makes calls time out."""

    def __init__(self) -> None:
        self.lease: client.V1Lease | None = None
        self.version = 0
        self.hang = False
        self.timeouts: list[Any] = []

    def _stored(self, body: client.V1Lease) -> client.V1Lease:
        """Store the Lease as the server would: a new resourceVersion, times read back as datetimes."""
        self.version += 1
        spec = body.spec
        self.lease = client.V1Lease(metadata=client.V1ObjectMeta(name=body.metadata.name,
                                                                 resource_version=str(self.version)),
                                    spec=client.V1LeaseSpec(holder_identity=spec.holder_identity,
                                                            lease_duration_seconds=spec.lease_duration_seconds,
                                                            acquire_time=_time(spec.acquire_time),
                                                            renew_time=_time(spec.renew_time)))
        return self.lease

    async def _maybe_hang(self, timeout: Any) -> None:
        self.timeouts.append(timeout)
        if self.hang:
            raise TimeoutError("no answer")

    async def read_namespaced_lease(self, name: str, namespace: str, _request_timeout: Any = None) -> client.V1Lease:
        await self._maybe_hang(_request_timeout)
        if self.lease is None:
            raise api_error(404, "Not Found", b'{"code": 404}')  # the library reads the Status code of a failed read
        return self._copy()

    async def create_namespaced_lease(self, namespace: str, body: client.V1Lease,
                                      _request_timeout: Any = None) -> client.V1Lease:
        await self._maybe_hang(_request_timeout)
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._stored(body)

    async def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease,
                                       _request_timeout: Any = None) -> client.V1Lease:
        await self._maybe_hang(_request_timeout)
        if self.lease is None or body.metadata.resource_version != self.lease.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        return self._stored(body)

    def _copy(self) -> client.V1Lease:
        assert self.lease is not None
        spec = self.lease.spec
        return client.V1Lease(metadata=client.V1ObjectMeta(name=self.lease.metadata.name,
                                                           resource_version=self.lease.metadata.resource_version),
                              spec=client.V1LeaseSpec(holder_identity=spec.holder_identity,
                                                      lease_duration_seconds=spec.lease_duration_seconds,
                                                      acquire_time=spec.acquire_time, renew_time=spec.renew_time))

    def take(self, holder: str) -> None:
        """A rival writes itself into the Lease, as another replica would."""
        assert self.lease is not None
        now = datetime.now(UTC)
        self._stored(client.V1Lease(metadata=self.lease.metadata, spec=client.V1LeaseSpec(
            holder_identity=holder, lease_duration_seconds=self.lease.spec.lease_duration_seconds,
            acquire_time=now, renew_time=now)))


def fenced_lock(api: LeaseApi, fence: LeaseFence, identity: str = "agent-a") -> FencedLeaseLock:
    lock = FencedLeaseLock("reservoir-agent", "reservoir-system", identity, cast(client.ApiClient, object()), fence,
                           timeout=3)
    lock.api_instance = api
    return lock


def record(identity: str) -> LeaderElectionRecord:
    now = str(datetime.now())
    return LeaderElectionRecord(identity, "15", now, now)


async def test_the_lock_renews_the_fence_on_each_successful_write_and_ends_it_on_a_rival() -> None:
    api, clock = LeaseApi(), Clock()
    fence = LeaseFence("agent-a", clock=clock)
    lock = fenced_lock(api, fence)
    found, error = await lock.get("reservoir-agent", "reservoir-system")
    assert not found and isinstance(error, ApiException) and error.status == 404
    assert await lock.create("reservoir-agent", "reservoir-system", record("agent-a"))
    assert fence.stale() is None and fence.renewed_at == clock.now
    found, held = await lock.get("reservoir-agent", "reservoir-system")
    assert found and held.holder_identity == "agent-a"
    clock.now += 2
    assert await lock.update("reservoir-agent", "reservoir-system", record("agent-a"))
    assert fence.renewed_at == clock.now

    api.take("rival")  # between our read and our write: the replace is refused (resourceVersion), no renewal
    clock.now += 2
    assert not await lock.update("reservoir-agent", "reservoir-system", record("agent-a"))
    assert fence.renewed_at == clock.now - 2
    found, seen = await lock.get("reservoir-agent", "reservoir-system")
    assert found and seen.holder_identity == "rival"
    assert fence.stale() == "the Lease is held by rival, not agent-a"
    assert set(api.timeouts) == {3}, "every Lease call has a timeout"


async def test_a_lease_call_without_answer_fails_the_attempt_and_raises_nothing() -> None:
    api, clock = LeaseApi(), Clock()
    fence = LeaseFence("agent-a", clock=clock)
    lock = fenced_lock(api, fence)
    assert await lock.create("reservoir-agent", "reservoir-system", record("agent-a"))
    await lock.get("reservoir-agent", "reservoir-system")
    api.hang = True
    found, error = await lock.get("reservoir-agent", "reservoir-system")
    assert not found and isinstance(error, ApiException) and b'"code": 0' in error.body, \
        "a failed read the library retries (its code is not 404, so it does not try to create the Lease)"
    assert not await lock.update("reservoir-agent", "reservoir-system", record("agent-a"))
    assert not await lock.create("reservoir-agent", "reservoir-system", record("agent-a"))
    clock.now += LEASE_DURATION
    assert fence.stale() is not None, "no renewal for the lease duration: stale, whatever the election loop does"


async def test_a_rival_taking_the_lease_fences_the_writer_before_the_election_gives_up() -> None:
    """The library cancels the leader's work only after renew_deadline of failed renewals; the fence shuts at the
    first read that shows the rival."""
    api = LeaseApi()
    fence = LeaseFence("agent-a", duration=3)
    leading = asyncio.Event()

    async def lead() -> None:
        leading.set()
        await asyncio.Event().wait()

    async def stopped() -> None:
        fence.lost()

    config = electionconfig.Config(fenced_lock(api, fence), 3, 2, 1, lead, stopped)
    election = asyncio.create_task(leaderelection.LeaderElection(config).run())
    try:
        await asyncio.wait_for(leading.wait(), 2)
        assert fence.stale() is None
        api.take("rival")
        for _ in range(30):  # the next renewal attempt, within retry_period (1 s)
            if fence.stale():
                break
            await asyncio.sleep(0.05)
        assert fence.stale() == "the Lease is held by rival, not agent-a"
        assert not election.done(), "the library still counts itself leader: only the fence stops the writes"
    finally:
        election.cancel()
        await asyncio.gather(election, return_exceptions=True)


# --- the Writer behind a fence ---

@dataclass
class Sent:
    method: str
    path: str
    body: Any


class Recorder:
    """Stands in for shared.kube's send_json and get_json (every node exists, unlocked)."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    async def send_json(self, api: Any, method: str, path: str, body: Any = None, *, content_type: str = JSON,
                        **_: Any) -> dict[str, Any]:
        self.sent.append(Sent(method, path, body))
        return {}

    async def get_json(self, api: Any, path: str, *_: Any, **__: Any) -> dict[str, Any]:
        if "/nodes/" not in path:
            raise api_error(404, "Not Found")
        return {"metadata": {"name": path.rsplit("/", 1)[-1], "resourceVersion": "7"}, "spec": {}}


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    fake = Recorder()
    monkeypatch.setattr(writer_module, "send_json", fake.send_json)
    monkeypatch.setattr(writer_module, "get_json", fake.get_json)
    return fake


def lock(node: str) -> Lock:
    return Lock(node=node, owner=OWNER, kind=LockKind.JOB, subject="ns/PodGroup/train", reason="starving", since=NOW)


def whole_plan() -> tuple[Plan, Snapshot]:
    """A plan asking for every kind of write: two node locks, a repair, a Queue status and an eviction."""
    queue = QueueView.from_obj({"metadata": {"name": "gold"}, "spec": {}})
    guarantee = QueueGuaranteeStatus("gold", ("n1",), Resources.parse({"cpu": "4"}), "Guaranteed", "holding",
                                     evict=("ns/busy",))
    repair = Repair(namespace="ns", name="p", tolerations=(), add=(lock_toleration(OWNER),))
    return (Plan(locks={"n1": lock("n1"), "n2": lock("n2")}, guarantees=[guarantee], repairs=[repair]),
            Snapshot(queues={"gold": queue}))


def writer(fence: Any, fenced: list[int]) -> Writer:
    return Writer(cast(client.ApiClient, object()), fence=fence, on_fenced=lambda: fenced.append(1))


async def test_a_writer_whose_fence_says_stale_writes_nothing(recorder: Recorder,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    fenced: list[int] = []
    result, snapshot = whole_plan()
    stale = writer(lambda: "the Lease is held by rival, not agent-a", fenced)
    with caplog.at_level(logging.INFO, logger="reservoir.agent"):
        await stale.write(result, snapshot, {}, dry_run=False)
        await stale.apply(result.locks, {})
        await stale.repair(result.repairs)
        await stale.write_queues(result.guarantees, snapshot.queues)
        await stale.event("n1", "NodeLocked", "locked")
        with pytest.raises(Fenced):
            await stale.evict("ns", "busy")
    assert recorder.sent == [], "no node, pod, Queue, eviction or Event write"
    assert captured(caplog.records, batch="plan", decision="fenced", reason="the Lease is held by rival, not agent-a",
                    done="writing nothing")
    assert captured(caplog.records, event="NodeLocked", object="Node/n1", decision="fenced")
    assert len(fenced) == 4, "each batch refused is counted"


async def test_a_lease_lost_in_the_middle_of_a_batch_stops_it_at_the_next_write(
        recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    fenced: list[int] = []
    result, snapshot = whole_plan()

    def fence() -> str | None:  # fresh until the first node patch has gone out
        return "lost" if any(s.method == "PATCH" for s in recorder.sent) else None

    with caplog.at_level(logging.INFO, logger="reservoir.agent"):
        await writer(fence, fenced).write(result, snapshot, {}, dry_run=False)
    assert [(s.method, s.path) for s in recorder.sent] == [("PATCH", "/api/v1/nodes/n1")], \
        "n1 patched; its Events, n2, the repair, the Queue and the eviction not"
    assert captured(caplog.records, batch="plan", decision="fenced", reason="lost",
                    done="stopped mid-batch, the rest left unwritten")
    assert fenced == [1]


async def test_a_fresh_fence_lets_everything_through(recorder: Recorder) -> None:
    result, snapshot = whole_plan()
    fresh = Writer(cast(client.ApiClient, object()), fence=lambda: None)
    await fresh.write(result, snapshot, {}, dry_run=False)
    writes = {(s.method, s.path) for s in recorder.sent}
    assert {("PATCH", "/api/v1/nodes/n1"), ("PATCH", "/api/v1/nodes/n2"), ("PATCH", "/api/v1/namespaces/ns/pods/p"),
            ("PATCH", "/apis/scheduling.volcano.sh/v1beta1/queues/gold/status")} <= writes
    assert ("POST", "/api/v1/namespaces/ns/pods/busy/eviction") not in writes, \
        "the last check refuses an eviction of a pod not in the snapshot the plan was made from"


# --- where the Lease lives ---

def test_the_lease_namespace_is_the_agents_own_never_its_config_namespace(tmp_path: Path) -> None:
    service_account = tmp_path / "namespace"
    assert own_namespace("reservoir-system", service_account) == "reservoir-system", "outside a cluster"
    service_account.write_text("ops-reservoir\n")
    assert own_namespace("reservoir-system", service_account) == "ops-reservoir"
    service_account.write_text("")
    assert own_namespace("reservoir-system", service_account) == "reservoir-system"
    args = build_parser().parse_args(["agent", "--namespace", "elsewhere"])
    assert args.namespace == "elsewhere" and args.lease_namespace is None, "resolved by own_namespace, not --namespace"
    assert build_parser().parse_args(["agent", "--lease-namespace", "x"]).lease_namespace == "x"


def test_the_loop_waits_for_the_plans_next_moment_and_a_change_does_not_push_the_resync_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """agent.controller.Agent.next_wait: the resync period counts from the last resync, not from the last
    change; a plan's wake_at (a threshold crossed, a window opening) comes first when it is sooner (plus 0.05 s, so
    the plan is made past it). It reads the wall clock for wake_at (`datetime.now(UTC)`): the test stops that clock at
    NOW, so the waits are exact."""
    from datetime import timedelta
    from types import SimpleNamespace

    from agent import controller
    from agent.controller import Agent
    from agent.planner.model import Plan
    from shared.config import load_config

    class Stopped(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return NOW if tz is None else NOW.astimezone(tz)

    monkeypatch.setattr(controller, "datetime", Stopped)
    config = load_config("resyncPeriod: 30s")
    me = SimpleNamespace(config=config, last_plan=None, writer=SimpleNamespace(retry_after=None))
    assert Agent.next_wait(me, last_resync=100.0, now=120.0) == (10.0, "resync")
    assert Agent.next_wait(me, last_resync=100.0, now=140.0) == (0.0, "resync")
    me.last_plan = Plan(locks={}, wake_at=NOW + timedelta(seconds=3))
    assert Agent.next_wait(me, last_resync=100.0, now=101.0) == (pytest.approx(3.05), "time"), "sooner than 29 s"
    me.last_plan = Plan(locks={}, wake_at=NOW + timedelta(seconds=40))
    assert Agent.next_wait(me, last_resync=100.0, now=101.0) == (29.0, "resync"), "the resync is sooner"
    me.last_plan = Plan(locks={}, wake_at=NOW - timedelta(seconds=3))
    assert Agent.next_wait(me, last_resync=100.0, now=101.0) == (0.0, "time"), "already past: at once"


def test_a_change_after_a_quiet_spell_is_planned_within_the_settle_and_a_stream_at_most_once_per_debounce() -> None:
    """agent.controller.Agent.settle: a lone change (four locks to release, say) waits only SETTLE for the rest of its
    burst, not the whole debounce; changes that keep coming start a plan at most once per debounce."""
    from types import SimpleNamespace

    from agent.controller import SETTLE, Agent
    from shared.config import load_config

    me = SimpleNamespace(config=load_config("debounce: 1s"))
    assert Agent.settle(me, last_started=float("-inf"), now=50.0) == SETTLE
    assert Agent.settle(me, last_started=40.0, now=50.0) == SETTLE
    assert Agent.settle(me, last_started=49.7, now=50.0) == pytest.approx(0.7)
    assert Agent.settle(me, last_started=50.0, now=50.0) == 1.0
