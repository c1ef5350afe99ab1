"""Backfill on the real control plane (issue 17): seed 000's draining node, locked for a starving big pod, lends its
idle cpu to a short pod that declares its runtime and opts in; the webhook holds it on the gate, the agent narrows it
to the node with the lock's toleration and activeDeadlineSeconds (accepted by the pod-locks check because of the
agent's grant on the node), lifts the gate, and the big pod still binds once the node has drained. A pod whose
runtime would cross the moment the node is needed is let go unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from agent.planner.model import MAX_NAMESPACE_UNBOUND_GRANTS
from localcluster import binaries
from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER, PARKED_RETRY_SECONDS, free_port, parks_pods
from shared import keys
from shared.backfill import pinned_to, read_grants, read_room
from shared.ownership import JobRef, window_owner_id
from shared.timestamps import parse_time, stamp
from tests.e2e.kit import Kit
from tests.e2e.scenarios import STARVATION_CONFIG, configure, running_agent, scheduled_at

BACKFILL_CONFIG = STARVATION_CONFIG + "backfill: {namespaces: ['*'], margin: 5s}\n"
NODE = "bf-node"
RESYNC_SECONDS = 2  # scenarios.STARVATION_CONFIG's resyncPeriod
RUNNING = 40  # seconds the node's two running pods declare (and run): the big pod fits when they end


@pytest.fixture
async def running(kit: Kit) -> AsyncIterator[AgentProcess]:
    async with running_agent(kit, BACKFILL_CONFIG, webhook=True, metrics_port=free_port()) as agent:
        yield agent


def opting_in(runtime: str, runs: str | None) -> dict[str, str]:
    """A pod's annotations that opt into backfill with a declared runtime; it runs `runs` on kwok, or, without, until
    its activeDeadlineSeconds ends it (localcluster's pod-deadline stage, as the kubelet) or forever."""
    return {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: runtime, **({COMPLETE_AFTER: runs} if runs else {})}


async def webhook_gating(kit: Kit, gating: bool) -> None:
    """Wait until the webhook's caches have the config and the locks' backfill room (issue 30: a pod is held only
    where a locked node's room takes it in time): a dry-run pod of 1 cpu and 10 s that opts in comes back gated, or
    not."""
    async def probe() -> bool:
        body = kit.pod_body("probe", {"cpu": "1"}, annotations=opting_in("10s", "5s"))
        made = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods?dryRun=All", body=body)
        return gating == any(g["name"] == keys.BACKFILL_GATE for g in made["spec"].get("schedulingGates") or [])
    await kit.wait_for(probe, what=f"the webhook {'' if gating else 'no longer '}holding pods that opt into "
                                   "backfill", timeout=20)


async def bound_pod(kit: Kit, name: str, *, what: str, timeout: float = 20,
                    agent: AgentProcess | None = None) -> dict:
    """The pod `name` once bound (spec.nodeName set); on a timeout, the failure carries the agent's log."""
    async def bound() -> dict | None:
        pod = await kit.read_pod(name)
        return pod if pod["spec"].get("nodeName") else None
    try:
        return await kit.wait_for(bound, what=what, timeout=timeout)
    except AssertionError as err:
        if agent is None:
            raise
        raise AssertionError(f"{err}\n{agent.log_text()[-4000:]}") from None


async def seed_000_locked(kit: Kit, running: int = RUNNING) -> str:
    """Seed 000 at Time2 on NODE (pod-1 done, pod-2 and pod-3 running `running` s with their runtimes declared), beside
    a tiny spare node (one node alone locks nothing: 90%), the webhook gating, and pod-4 of 3 cpu starving until the
    node is locked for it, its backfill room noted and seen by the webhook: pod-4's owner id."""
    await kit.create_node(NODE, {"cpu": "3", "memory": "16Gi"})
    await kit.create_node("spare", {"cpu": "100m", "memory": "1Gi"})
    for i in (2, 3):
        await kit.create_pod(f"pod-{i}", {"cpu": "1"}, extra_spec={"nodeName": NODE},
                             annotations={keys.MAXIMUM_RUNTIME: f"{running}s", COMPLETE_AFTER: f"{running}s"})
    await webhook_gating(kit, False)  # nothing locked yet: a pod that opts in goes to kube-scheduler at once
    await kit.create_pod("pod-4", {"cpu": "3"})
    owner = JobRef(kit.namespace, "Pod", "pod-4").owner_id

    async def locked() -> bool:
        node = await kit.read_node(NODE)
        return any(t["key"] == keys.LOCK and t.get("value") == owner for t in node["spec"].get("taints") or [])
    await kit.wait_for(locked, what="the node locked for the starving pod-4", timeout=30)
    await webhook_gating(kit, True)
    return owner


async def test_a_runtime_raised_after_the_grant_does_not_open_the_node_to_a_second_backfill(
        kit: Kit, running: AgentProcess) -> None:
    """A hostile tenant's pod, backfilled with 10s declared, raises its `volcano.sh/maximum-runtime` to 3h by a plain
    metadata update. Its end is still its deadline and its grant (agent.planner.capacity pod_end), so pod-4 is still
    needed when pod-2 and pod-3 end, and a 60s pod is let go unchanged, not granted the node on the strength of the
    lie (which would make pod-4 wait for the 3h)."""
    owner = await seed_000_locked(kit)
    await kit.create_pod("liar", {"cpu": "500m"}, annotations=opting_in("10s", None))  # its deadline ends it

    liar = await bound_pod(kit, "liar", what="the liar backfilled onto the locked node")
    assert liar["spec"]["nodeName"] == NODE and liar["spec"]["activeDeadlineSeconds"] == 10, liar["spec"]
    await asyncio.sleep(RESYNC_SECONDS)  # a plan has seen it bound
    before = read_room((await kit.read_node(NODE))["metadata"]["annotations"].get(keys.BACKFILL_ROOM))
    await kit.raw("PATCH", f"/api/v1/namespaces/{kit.namespace}/pods/liar",
                  content_type="application/merge-patch+json",
                  body={"metadata": {"annotations": {keys.MAXIMUM_RUNTIME: "3h"}}})
    await asyncio.sleep(RESYNC_SECONDS)  # a plan has read the lie
    after = read_room((await kit.read_node(NODE))["metadata"]["annotations"].get(keys.BACKFILL_ROOM))
    assert before is not None and after == before, f"the room the webhook reads moved with the lie: {before} {after}"
    await kit.create_pod("second", {"cpu": "500m"}, annotations=opting_in("60s", None))

    async def let_go() -> dict | None:
        pod = await kit.read_pod("second")
        return pod if not pod["spec"].get("schedulingGates") else None
    second = await kit.wait_for(let_go, what="the second pod decided", timeout=20)
    assert not any(t.get("value") == owner for t in second["spec"].get("tolerations") or []), second["spec"]
    assert not pinned_to(second["spec"], NODE) and "activeDeadlineSeconds" not in second["spec"], second["spec"]


async def test_seed_000_a_short_pod_backfills_the_draining_node_and_the_big_pod_still_binds(
        kit: Kit, running: AgentProcess) -> None:
    owner = await seed_000_locked(kit)

    short = await kit.create_pod("short", {"cpu": "1"}, annotations=opting_in("10s", "8s"))
    assert any(g["name"] == keys.BACKFILL_GATE for g in short["spec"].get("schedulingGates") or []), short["spec"]
    # issue 30: a pod no locked node's room takes in time is not held at all: its wait is kube-scheduler's alone
    long = await kit.create_pod("long", {"cpu": "1"}, annotations=opting_in("10m", "8s"))
    assert not long["spec"].get("schedulingGates"), long["spec"]

    pod = await bound_pod(kit, "short", what="the short pod bound on the locked node", agent=running)
    spec = pod["spec"]
    assert spec["nodeName"] == NODE and spec["activeDeadlineSeconds"] == 10
    assert {"key": keys.LOCK, "operator": "Equal", "value": owner, "effect": "NoSchedule"} in spec["tolerations"]
    assert pinned_to(spec, NODE) and not spec.get("schedulingGates")
    grants = read_grants((await kit.read_node(NODE))["metadata"]["annotations"].get(keys.BACKFILL_GRANTS))
    assert grants[pod["metadata"]["uid"]].owner == owner, grants
    events = await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/events?fieldSelector=involvedObject.name=short")
    assert any(e["reason"] == "Backfilled" and NODE in e["message"] for e in events["items"]), json.dumps(events)

    async def released_long() -> dict | None:
        pod = await kit.read_pod("long")
        return pod if not pod["spec"].get("schedulingGates") else None
    long = await kit.wait_for(released_long, what="the long pod let go unchanged", timeout=20)
    assert not long["spec"].get("nodeName") and "activeDeadlineSeconds" not in long["spec"]
    # (the webhook gave it its own job's and queue's lock tolerations, as every pod; never pod-4's)
    assert not any(t.get("value") == owner for t in long["spec"].get("tolerations") or []), long["spec"]

    big = await bound_pod(kit, "pod-4", what="pod-4 bound once the node drained", timeout=RUNNING + 30)
    assert big["spec"]["nodeName"] == NODE
    assert (scheduled_at(big) or 0) > (scheduled_at(pod) or 0)
    # the start the agent estimated for pod-4 (when pod-2 and pod-3 end) and wrote on it: within a resync of its bind;
    # kube-scheduler before 1.32 binds it only at its next retry of parked pods (localcluster.cluster.parks_pods)
    expected = parse_time(big["metadata"]["annotations"][keys.EXPECTED_START])
    slack = RESYNC_SECONDS + (PARKED_RETRY_SECONDS if parks_pods(binaries.versions()["KUBERNETES_VERSION"]) else 0)
    assert expected is not None and abs(expected.timestamp() - (scheduled_at(big) or 0)) <= slack, (
        big["metadata"]["annotations"][keys.EXPECTED_START], big["status"])

    async def error_counted() -> str | None:  # the estimate's error, once pod-4 is bound (one observation)
        text = await asyncio.to_thread(scrape, running.metrics_port)
        counts = [line for line in text.splitlines()
                  if line.startswith('reservoir_start_estimate_error_seconds_count{kind="job"')]
        return text if sum(float(line.rpartition(" ")[2]) for line in counts) == 1 else None
    await kit.wait_for(error_counted, what="the estimate's error observed once", timeout=10)


def wakeups(text: str) -> dict[str, float]:
    """reservoir_reconcile_wakeups_total by cause, from a scrape."""
    prefix = 'reservoir_reconcile_wakeups_total{cause="'
    return {line[len(prefix):].partition('"')[0]: float(line.rpartition(" ")[2])
            for line in text.splitlines() if line.startswith(prefix)}


# a debounce far longer than a gate pass takes: a pod decided before it passes was decided by a gate pass
SLOW_PLANS_CONFIG = BACKFILL_CONFIG.replace("resyncPeriod: 2s", "resyncPeriod: 10m").replace("debounce: 200ms",
                                                                                             "debounce: 30s")
SLOW_RUNNING = 90  # seconds the node drains for: past the debounce the config change may wait for, and the short pod


async def test_a_pod_on_the_gate_is_decided_by_a_gate_pass_without_waiting_for_a_plan(
        kit: Kit, running: AgentProcess) -> None:
    """Issue 34: with plans at most every 30 s (debounce) and a resync of 10 minutes, a short pod arriving on the
    gate under seed 000's lock is let onto the node by a gate pass (reservoir_reconcile_wakeups_total{cause="gate"}),
    while no change-driven plan runs."""
    assert "debounce: 30s" in SLOW_PLANS_CONFIG and "resyncPeriod: 10m" in SLOW_PLANS_CONFIG
    owner = await seed_000_locked(kit, SLOW_RUNNING)
    await configure(kit, SLOW_PLANS_CONFIG)

    async def planned_under_it() -> bool:
        # a plan under the new config has run (its published status says resyncPeriod 10m): it read the config change,
        # which gate passes leave to a plan; the next change-driven plan comes 30 s after it at the earliest
        published = await kit.attempt("GET", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.STATUS_CONFIGMAP}")
        document = json.loads(((published or {}).get("data") or {}).get(keys.STATUS_KEY) or "{}")
        return (document.get("config") or {}).get("resyncPeriod") == "10m"
    await kit.wait_for(planned_under_it, what="a plan under the 30 s debounce", timeout=60)
    await asyncio.sleep(1)  # that plan's writes are done
    before = wakeups(await asyncio.to_thread(scrape, running.metrics_port))
    await kit.create_pod("short", {"cpu": "1"}, annotations=opting_in("10s", "8s"))

    pod = await bound_pod(kit, "short", what="the short pod let onto the locked node", agent=running)
    assert pod["spec"]["nodeName"] == NODE and pinned_to(pod["spec"], NODE), pod["spec"]
    assert any(t.get("value") == owner for t in pod["spec"]["tolerations"]), pod["spec"]
    after = wakeups(await asyncio.to_thread(scrape, running.metrics_port))
    assert after.get("gate", 0) > before.get("gate", 0), (before, after)
    assert after.get("change", 0) == before.get("change", 0), ("a plan ran meanwhile: the test shows nothing",
                                                               before, after)


@contextlib.asynccontextmanager
async def scheduler_stopped(kit: Kit) -> AsyncIterator[None]:
    """kube-scheduler stopped (SIGSTOP) while the body runs, resumed (SIGCONT) after it however it ends."""
    scheduler = next(c for c in kit.cluster.components if c.name == "kube-scheduler").process
    os.kill(scheduler.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(scheduler.pid, signal.SIGCONT)


async def narrowed_and_let_go(kit: Kit, name: str, runtime: int) -> dict:
    """A pod of 1 cpu that opts in, declaring `runtime` seconds and running until its deadline ends it (no
    complete-after: localcluster's pod-deadline stage ends it, as the kubelet), once the agent narrowed it to NODE and
    lifted its gate."""
    await kit.create_pod(name, {"cpu": "1"}, annotations=opting_in(f"{runtime}s", None))

    async def let_go() -> dict | None:
        pod = await kit.read_pod(name)
        return pod if not pod["spec"].get("schedulingGates") else None
    pod = await kit.wait_for(let_go, what=f"{name} narrowed to the node and let go", timeout=20)
    assert pod["spec"]["activeDeadlineSeconds"] == runtime and pinned_to(pod["spec"], NODE), pod["spec"]
    return pod


async def told_and_ended(kit: Kit, name: str, *words: str) -> dict:
    """The `BackfillDeadlineCut` Event on pod `name` (its message naming each of `words`), then the pod ended by its
    deadline (phase Failed, reason DeadlineExceeded): the pod as it ended."""
    async def told() -> bool:  # the Event goes after the patch
        events = await kit.raw("GET",
                               f"/api/v1/namespaces/{kit.namespace}/events?fieldSelector=involvedObject.name={name}")
        return any(e["reason"] == "BackfillDeadlineCut" and all(w in e["message"] for w in words)
                   for e in events["items"])
    await kit.wait_for(told, what=f"the BackfillDeadlineCut Event on {name} naming {words}", timeout=10)

    async def ended() -> dict | None:
        pod = await kit.read_pod(name)
        return pod if pod["status"].get("phase") == "Failed" else None
    pod = await kit.wait_for(ended, what=f"{name} ended at its cut deadline", timeout=20)
    assert pod["status"].get("reason") == "DeadlineExceeded", pod["status"]
    return pod


async def test_a_backfilled_pod_bound_late_has_its_deadline_cut_to_end_by_its_grant(
        kit: Kit, running: AgentProcess) -> None:
    """kube-scheduler stopped (SIGSTOP) while the agent lets a short pod onto the locked node: the pod binds about 7 s
    after its grant was made, past the 5 s margin, so 10 s from its start would run into the time the node is needed.
    The agent lowers its activeDeadlineSeconds so startTime + deadline is within its grant (backfill.deadline_cuts),
    says so in a `BackfillDeadlineCut` Event, and the pod is ended by then."""
    owner = await seed_000_locked(kit)

    async with scheduler_stopped(kit):
        pod = await narrowed_and_let_go(kit, "late", 10)
        grants = read_grants((await kit.read_node(NODE))["metadata"]["annotations"].get(keys.BACKFILL_GRANTS))
        until = grants[pod["metadata"]["uid"]].until
        # the grant ends 15 s after the plan (10 s + the 5 s margin): resumed 8 s before that, the pod starts past
        # its margin and well before `until`, so its cut deadline is one it can still run
        await asyncio.sleep(max(0.0, until.timestamp() - 8 - time.time()))

    async def cut() -> dict | None:
        pod = await kit.read_pod("late")
        return pod if pod["status"].get("startTime") and pod["spec"]["activeDeadlineSeconds"] < 10 else None
    try:
        pod = await kit.wait_for(cut, what="the late pod's deadline cut", timeout=20)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{running.log_text()[-3000:]}") from None
    started, deadline = parse_time(pod["status"]["startTime"]), pod["spec"]["activeDeadlineSeconds"]
    assert started is not None and started + timedelta(seconds=deadline) <= until, (
        pod["status"]["startTime"], pod["spec"]["activeDeadlineSeconds"], stamp(until))
    pod = await told_and_ended(kit, "late", NODE, owner)
    # ended by the cut deadline (which ends by `until`, above), not by anything else
    assert pod["spec"]["activeDeadlineSeconds"] == deadline, pod["spec"]


async def test_a_pod_narrowed_for_a_grant_that_ended_unbound_is_stopped_when_it_binds_under_the_owners_next_lock(
        kit: Kit, running: AgentProcess) -> None:
    """A pod let onto the locked node (narrowed: the owner's lock toleration, the pin, its deadline) that does not bind
    while the lock stands (kube-scheduler stopped here; a claim made late, an anti-affinity gone, for a tenant) loses
    its grant with the lock, but not what narrowing gave it, which cannot be taken back. The same owner locks the node
    again (pod-4 deleted and made again: the same owner id) and the pod binds there, under a lock with no grant naming
    it: the agent cuts its activeDeadlineSeconds to 1 and says why, and the kubelet (localcluster's pod-deadline stage)
    ends it at once, where before it ran its whole declared runtime into the owner's time."""
    owner = await seed_000_locked(kit, running=60)
    async with scheduler_stopped(kit):
        await narrowed_and_let_go(kit, "stuck", 20)
        await kit.raw("DELETE", f"/api/v1/namespaces/{kit.namespace}/pods/pod-4?gracePeriodSeconds=0")

        async def released() -> bool:
            node = await kit.read_node(NODE)
            held = [t for t in node["spec"].get("taints") or [] if t["key"] == keys.LOCK]
            return not held and not read_grants(node["metadata"]["annotations"].get(keys.BACKFILL_GRANTS))
        await kit.wait_for(released, what="the lock and the unbound pod's grant gone with the owner", timeout=30)
        assert not (await kit.read_pod("stuck"))["spec"].get("nodeName")

        await kit.create_pod("pod-4", {"cpu": "3"})

        async def locked_again() -> bool:
            node = await kit.read_node(NODE)
            return any(t["key"] == keys.LOCK and t.get("value") == owner for t in node["spec"].get("taints") or [])
        await kit.wait_for(locked_again, what="the node locked again for the same owner", timeout=30)
        grants = read_grants((await kit.read_node(NODE))["metadata"]["annotations"].get(keys.BACKFILL_GRANTS))
        assert not grants, grants

    async def cut() -> dict | None:
        pod = await kit.read_pod("stuck")
        return pod if pod["spec"].get("nodeName") and pod["spec"]["activeDeadlineSeconds"] == 1 else None
    try:
        await kit.wait_for(cut, what="the pod bound under the owner's next lock cut to 1 s", timeout=30)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{running.log_text()[-3000:]}") from None
    await told_and_ended(kit, "stuck", "no backfill grant", owner)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return response.read().decode()


# --- seed 000's story twice in one test, backfill off and then on, compared (issue 17) ---

# seconds after the lock: short pods arriving meanwhile, 1 cpu, declaring 10 s and running until their deadline ends
# them (no complete-after: each would run forever; localcluster's pod-deadline stage ends it as the kubelet would)
STREAM = (0, 8, 16, 24)


class Story:
    """One run of seed 000's story on its own node: what the node's lock left idle, and when pod-4 bound."""

    def __init__(self) -> None:
        # integral, over the lock's time until pod-4 could fit (pod-2 and pod-3 ended), of the node's cpu no running
        # pod requests: what backfill can use; after that moment the node idles for kube-scheduler's latency alone
        self.idle_cpu_seconds = 0.0
        self.pod_4_delay = 0.0  # pod-4's bind after the moment it could fit (the later of pod-2's and pod-3's ends)
        self.could_fit = datetime.min.replace(tzinfo=UTC)  # that moment, from the pods' own startTimes
        self.backfilled: list[dict] = []  # pods other than pod-4 bound on the node while it was locked


async def seed_000_story(kit: Kit, prefix: str, backfill: bool) -> Story:
    node, story = f"{prefix}-node", Story()
    await kit.create_node(node, {"cpu": "3", "memory": "16Gi"})
    for i in (2, 3):
        await kit.create_pod(f"{prefix}-pod-{i}", {"cpu": "1"}, extra_spec={"nodeName": node},
                             annotations={keys.MAXIMUM_RUNTIME: f"{RUNNING}s", COMPLETE_AFTER: f"{RUNNING}s"})
    await kit.create_pod(f"{prefix}-pod-4", {"cpu": "3"})
    owner = JobRef(kit.namespace, "Pod", f"{prefix}-pod-4").owner_id

    async def lock_held() -> bool:
        return any(t["key"] == keys.LOCK and t.get("value") == owner
                   for t in (await kit.read_node(node))["spec"].get("taints") or [])
    await kit.wait_for(lock_held, what=f"{node} locked for {prefix}-pod-4", timeout=30)
    if backfill:  # the stream is held for backfill once the agent has noted the lock's room and the webhook seen it
        await webhook_gating(kit, True)
    began = time.monotonic()
    stream = iter(STREAM)
    due = next(stream, None)
    seen_backfilled: dict[str, dict] = {}
    draining = {f"{prefix}-pod-2", f"{prefix}-pod-3"}
    last = time.monotonic()
    while await lock_held():
        if due is not None and time.monotonic() - began >= due:
            await kit.create_pod(f"{prefix}-short-{due}", {"cpu": "1"}, annotations=opting_in("10s", None))
            due = next(stream, None)
        pods = await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods?fieldSelector=spec.nodeName={node}")
        running = [p for p in pods["items"] if p["status"].get("phase") not in ("Succeeded", "Failed")]
        now = time.monotonic()
        if any(p["metadata"]["name"] in draining for p in running):
            story.idle_cpu_seconds += max(0.0, 3 - sum(cpu(p) for p in running)) * (now - last)
        last = now
        for p in running:
            if "short" in p["metadata"]["name"]:
                seen_backfilled[p["metadata"]["name"]] = p
        if time.monotonic() - began > RUNNING + 60:
            raise AssertionError(f"{node} still locked after {RUNNING + 60}s")
        await asyncio.sleep(0.5)
    # the lock goes when pod-4 fits the drained node, which may be a moment before kube-scheduler binds it there
    big = await bound_pod(kit, f"{prefix}-pod-4", what=f"{prefix}-pod-4 bound once the lock went")
    assert big["spec"].get("nodeName") == node, big
    ends = [parse_time((await kit.read_pod(f"{prefix}-pod-{i}"))["status"]["startTime"]) for i in (2, 3)]
    story.could_fit = max(e for e in ends if e is not None) + timedelta(seconds=RUNNING)
    story.pod_4_delay = (scheduled_at(big) or 0) - story.could_fit.timestamp()
    story.backfilled = list(seen_backfilled.values())
    return story


def cpu(pod: dict) -> float:
    total = 0.0
    for container in pod["spec"]["containers"]:
        text = str(((container.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
        total += float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return total


async def test_seed_000_with_backfill_off_and_on_idle_locked_cpu_falls_and_pod_4_is_not_later(
        kit: Kit, running: AgentProcess) -> None:
    await kit.create_node("spare", {"cpu": "100m", "memory": "1Gi"})  # one node alone locks nothing (90%)
    await configure(kit, STARVATION_CONFIG)  # backfill off: no namespace opts in
    off = await seed_000_story(kit, "off", backfill=False)
    assert off.backfilled == [], [p["metadata"]["name"] for p in off.backfilled]
    # the first run's node and pods go (its stream is still pending; its node, free again, would take the second's)
    await kit.raw("DELETE", f"/api/v1/namespaces/{kit.namespace}/pods")
    await kit.raw("DELETE", "/api/v1/nodes/off-node")

    await configure(kit, BACKFILL_CONFIG)  # the stream's pods are held once the lock's room is noted (issue 30)
    on = await seed_000_story(kit, "on", backfill=True)
    assert on.backfilled, "no short pod backfilled the draining node"
    for pod in on.backfilled:  # every backfilled pod carries the deadline that ends it in time, and was ended by it
        assert pod["spec"].get("activeDeadlineSeconds") == 10, pod["spec"]
        ended = (await kit.read_pod(pod["metadata"]["name"]))["status"]
        assert (ended.get("phase"), ended.get("reason")) == ("Failed", "DeadlineExceeded"), ended
        finished = parse_time(ended["containerStatuses"][0]["state"]["terminated"]["finishedAt"])
        ran = (finished - parse_time(ended["startTime"])).total_seconds()  # type: ignore[operator]
        assert ran >= 10, f"ended after {ran}s, before its deadline"
        # no owner delayed: it ended (kwok's finishedAt) by the moment pod-4 could fit (whole-second timestamps)
        assert finished <= on.could_fit + timedelta(seconds=1), (finished, on.could_fit)
    print(f"\nseed 000 backfill off -> on: locked idle cpu-s {off.idle_cpu_seconds:.1f} -> {on.idle_cpu_seconds:.1f}, "
          f"pod-4 bound {off.pod_4_delay:+.1f}s -> {on.pod_4_delay:+.1f}s after it could fit, "
          f"backfilled {len(on.backfilled)} pods")
    # the idle cpu-seconds and pod-4's delay, off against on, are measured side by side by `make bench-backfill`


# --- seed 004's window twice in one test, backfill off and then on, its lead scaled to a minute (issue 17) ---


class WindowStory:
    """One run of seed 004's window on its own node: the lock's idle cpu-seconds, the reserve pod's bind after the
    window opened, the pods that backfilled the node, and the plan's published estimate of the window's start."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.idle_cpu_seconds = 0.0
        self.locked_seconds = 0.0  # the lead varies with the moment the run begins: idle is compared per locked second
        self.reserve_delay = 0.0
        self.backfilled: dict[str, dict] = {}
        self.estimate: str | None = None


def window_story_config(name: str, start: datetime, backfill: bool) -> str:
    """Seed 004's window (the seed's startReserveAgo 2h scaled to 2m: its lock is due at once) opening at `start`,
    on the nodes labelled business=<name>; one reserve pod ends it (podNumToReserve 1)."""
    return f"""
starvation: {{enabled: false}}
maxLockedNodePercent: 90
resyncPeriod: {RESYNC_SECONDS}s
debounce: 200ms
windows:
- name: {name}
  nodeSelector: {{business: {name}}}
  resources: {{cpu: "4"}}
  schedule: "{start.minute} {start.hour} * * *"
  duration: 10m
  startReserveAgo: 2m
  podNumToReserve: 1
""" + ("backfill: {namespaces: ['*'], margin: 5s}\n" if backfill else "")


async def window_story(kit: Kit, name: str, backfill: bool) -> WindowStory:
    # the window opens at a minute's start 45 to 105 s from now: the lead the short pods can use
    start = (datetime.now(UTC) + timedelta(seconds=105)).replace(second=0, microsecond=0)
    story = WindowStory(start)
    node = f"{name}-node"
    await kit.create_node(node, {"cpu": "4", "memory": "16Gi"}, labels={"business": name})
    await configure(kit, window_story_config(name, start, backfill))
    owner = window_owner_id(name)

    async def lock_held() -> bool:
        return any(t["key"] == keys.LOCK and t.get("value") == owner
                   for t in (await kit.read_node(node))["spec"].get("taints") or [])
    await kit.wait_for(lock_held, what=f"{node} locked for window {name}", timeout=30)
    await webhook_gating(kit, backfill)
    began = time.monotonic()
    await kit.create_pod(f"{name}-long", {"cpu": "1"}, annotations=opting_in("5m", "8s"))  # would cross the start
    last, next_short, reserve_created = time.monotonic(), 0.0, False
    while await lock_held():
        now = datetime.now(UTC)
        if not reserve_created and now >= start:
            await kit.create_pod(f"{name}-reserve", {"cpu": "4"}, annotations={keys.RESERVEABLE: "true"},
                                 extra_spec={"nodeSelector": {"business": name}})
            reserve_created = True
        elif not reserve_created and time.monotonic() >= next_short and (start - now).total_seconds() > 16:
            await kit.create_pod(f"{name}-short-{now:%H%M%S}", {"cpu": "1"}, annotations=opting_in("10s", "8s"))
            next_short = time.monotonic() + 10
        if backfill and story.estimate is None and not reserve_created:
            published = await kit.attempt(
                "GET", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.STATUS_CONFIGMAP}")
            document = json.loads(((published or {}).get("data") or {}).get(keys.STATUS_KEY) or "{}")
            story.estimate = next((e["start"] for e in document.get("estimates") or () if e["owner"] == owner), None)
        pods = await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods?fieldSelector=spec.nodeName={node}")
        running = [p for p in pods["items"] if p["status"].get("phase") not in ("Succeeded", "Failed")]
        moment = time.monotonic()
        story.idle_cpu_seconds += max(0.0, 4 - sum(cpu(p) for p in running)) * (moment - last)
        last = moment
        story.backfilled.update({p["metadata"]["name"]: p for p in running if "short" in p["metadata"]["name"]
                                 or "long" in p["metadata"]["name"]})
        if now > start + timedelta(seconds=60):
            raise AssertionError(f"{node} still locked a minute after window {name} opened")
        await asyncio.sleep(0.5)
    story.locked_seconds = time.monotonic() - began
    reserve = await kit.wait_pod(f"{name}-reserve", lambda p: scheduled_at(p) is not None, "bound", timeout=30)
    assert reserve["spec"]["nodeName"] == node
    story.reserve_delay = (scheduled_at(reserve) or 0) - start.timestamp()
    long = await kit.read_pod(f"{name}-long")
    assert not long["spec"].get("nodeName"), f"a pod whose runtime crosses the window's start: {long['spec']}"
    return story


async def test_seed_004_with_backfill_off_and_on_short_pods_use_the_lead_and_the_reserve_pod_is_not_later(
        kit: Kit, running: AgentProcess) -> None:
    await kit.create_node("spare", {"cpu": "100m", "memory": "1Gi"})  # one node alone locks nothing (90%)
    off = await window_story(kit, "wof", backfill=False)
    assert off.backfilled == {}, list(off.backfilled)
    await kit.raw("DELETE", f"/api/v1/namespaces/{kit.namespace}/pods")
    await kit.raw("DELETE", "/api/v1/nodes/wof-node")
    on = await window_story(kit, "won", backfill=True)
    assert on.backfilled, "no short pod used the window's lead"
    for name, pod in on.backfilled.items():  # each with its deadline, gone before the window opened
        assert pod["spec"].get("activeDeadlineSeconds") == 10, pod["spec"]
        ended = await kit.read_pod(name)
        finished = parse_time(ended["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])
        assert finished is not None and finished <= on.start, (name, finished, on.start)
    assert on.estimate == stamp(on.start), (on.estimate, on.start)  # the window's start, published while it waits
    off_rate, on_rate = off.idle_cpu_seconds / off.locked_seconds, on.idle_cpu_seconds / on.locked_seconds
    print(f"\nseed 004 backfill off -> on: locked idle cpu-s {off.idle_cpu_seconds:.1f} in {off.locked_seconds:.0f}s "
          f"-> {on.idle_cpu_seconds:.1f} in {on.locked_seconds:.0f}s ({off_rate:.2f} -> {on_rate:.2f} idle cpu), "
          f"reserve pod bound {off.reserve_delay:+.1f}s -> {on.reserve_delay:+.1f}s after the window opened, "
          f"backfilled {len(on.backfilled)} pods")
    # the idle rates and the reserve pod's delay, off against on, are what `make bench-backfill` measures side by side


async def test_a_tenant_holds_at_most_its_share_of_a_locked_nodes_grants_with_pods_that_never_bind(
        kit: Kit, running: AgentProcess) -> None:
    """Session 24's finding, on the real control plane: pods that opt in and that kube-scheduler will never bind (a
    PersistentVolumeClaim that does not exist: a filter Reservoir does not model) were each granted the locked node,
    and kept the grant while they existed, up to the node's MAX_NODE_GRANTS, so no other tenant's pod could backfill
    there. One namespace's grants of pods not yet bound are now at most MAX_NAMESPACE_UNBOUND_GRANTS on a node: the
    pods past it are let go unchanged (no lock toleration, not narrowed), and the node carries no more grants of
    theirs; and the grants of the pods that never bind end at their `until`, the lock still standing."""
    owner = await seed_000_locked(kit, running=60)
    count = MAX_NAMESPACE_UNBOUND_GRANTS + 3
    never = {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "never-made"}}],
             "nodeSelector": {"kubernetes.io/hostname": NODE},  # not the spare node, which has room for them
             "terminationGracePeriodSeconds": 0}  # each grant's until: 8 s + the 5 s margin after its plan
    for i in range(count):
        await kit.create_pod(f"never-{i}", {"cpu": "1m"}, annotations=opting_in("8s", None), extra_spec=never)

    async def decided() -> list[dict] | None:
        pods = [await kit.read_pod(f"never-{i}") for i in range(count)]
        return pods if all(not p["spec"].get("schedulingGates") for p in pods) else None
    pods = await kit.wait_for(decided, what="every pod that never binds decided at the gate", timeout=30)
    narrowed = [p["metadata"]["name"] for p in pods if pinned_to(p["spec"], NODE)]
    let_go = [p for p in pods if not pinned_to(p["spec"], NODE)]
    assert len(narrowed) == MAX_NAMESPACE_UNBOUND_GRANTS, (narrowed, running.log_text()[-3000:])
    for pod in let_go:
        assert not any(t.get("value") == owner for t in pod["spec"].get("tolerations") or []), pod["spec"]
        assert "activeDeadlineSeconds" not in pod["spec"], pod["spec"]
    assert not any(p["spec"].get("nodeName") for p in pods), "a pod whose claim does not exist was bound"
    node = await kit.read_node(NODE)
    grants = read_grants(node["metadata"]["annotations"].get(keys.BACKFILL_GRANTS))
    ours = sorted(g.pod for g in grants.values() if g.pod.startswith(f"{kit.namespace}/never-"))
    assert ours == sorted(f"{kit.namespace}/{name}" for name in narrowed), (ours, narrowed)

    # past each grant's until the grants of the pods not bound go while the lock stands (grant_lives): they would
    # otherwise stay on the node, and count against MAX_NODE_GRANTS, for as long as the lock does; should one bind
    # after all, it is stopped at once (deadline_cuts, ungranted)
    async def expired() -> dict | None:
        node = await kit.read_node(NODE)
        left = read_grants(node["metadata"]["annotations"].get(keys.BACKFILL_GRANTS))
        return None if any(g.pod.startswith(f"{kit.namespace}/never-") for g in left.values()) else node
    node = await kit.wait_for(expired, what="the grants of the pods never bound gone at their until", timeout=30)
    assert any(t["key"] == keys.LOCK and t.get("value") == owner for t in node["spec"].get("taints") or []), (
        "the lock stands meanwhile", node["spec"])

    # the lock's owner goes: the lock goes
    await kit.raw("DELETE", f"/api/v1/namespaces/{kit.namespace}/pods/pod-4?gracePeriodSeconds=0")

    async def released() -> dict | None:
        node = await kit.read_node(NODE)
        held = [t for t in node["spec"].get("taints") or [] if t["key"] == keys.LOCK]
        left = read_grants(node["metadata"]["annotations"].get(keys.BACKFILL_GRANTS))
        return None if held or left else node
    await kit.wait_for(released, what="the lock gone with the owner, no grant left", timeout=30)
    assert not any(p["spec"].get("nodeName") for p in [await kit.read_pod(f"never-{i}") for i in range(count)])
