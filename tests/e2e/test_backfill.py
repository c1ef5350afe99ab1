"""Backfill on the real control plane (issue 17): seed 000's draining node, locked for a starving big pod, lends its
idle cpu to a short pod that declares its runtime and opts in; the webhook holds it on the gate, the agent narrows it
to the node with the lock's toleration and activeDeadlineSeconds (accepted by the pod-locks check because of the
agent's grant on the node), lifts the gate, and the big pod still binds once the node has drained. A pod whose
runtime would cross the moment the node is needed is let go unchanged."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER, free_port
from shared import keys
from shared.backfill import pinned_to, read_grants
from shared.ownership import JobRef
from shared.timestamps import parse_time
from tests.e2e.kit import Kit, apply_setup, running_webhook
from tests.e2e.scenarios import SETUP, STARVATION_CONFIG, configure, scheduled_at

BACKFILL_CONFIG = STARVATION_CONFIG + "backfill: {namespaces: ['*'], margin: 5s}\n"
NODE = "bf-node"
RESYNC_SECONDS = 2  # scenarios.STARVATION_CONFIG's resyncPeriod
RUNNING = 40  # seconds the node's two running pods declare (and run): the big pod fits when they end


@pytest.fixture
async def running(kit: Kit) -> AsyncIterator[AgentProcess]:
    await apply_setup(kit, *SETUP, "deploy/webhook-rbac.yaml")
    await configure(kit, BACKFILL_CONFIG)
    agent = AgentProcess(kit.cluster, metrics_port=free_port())
    try:
        async with running_webhook(kit):
            agent.start()
            try:
                yield agent
            finally:
                agent.stop()
    finally:
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
        await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")


def opting_in(runtime: str, runs: str) -> dict[str, str]:
    return {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: runtime, COMPLETE_AFTER: runs}


async def webhook_gates(kit: Kit) -> None:
    """Wait until the webhook's caches have the config: a dry-run pod that opts in comes back gated."""
    async def probe() -> bool:
        body = kit.pod_body("probe", {"cpu": "1"}, annotations=opting_in("10s", "5s"))
        made = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods?dryRun=All", body=body)
        return any(g["name"] == keys.BACKFILL_GATE for g in made["spec"].get("schedulingGates") or [])
    await kit.wait_for(probe, what="the webhook holding pods that opt into backfill", timeout=20)


async def test_seed_000_a_short_pod_backfills_the_draining_node_and_the_big_pod_still_binds(
        kit: Kit, running: AgentProcess) -> None:
    await kit.create_node(NODE, {"cpu": "3", "memory": "16Gi"})
    await kit.create_node("spare", {"cpu": "100m", "memory": "1Gi"})  # one node alone locks nothing (90%)
    for i in (2, 3):  # seed 000 at Time2: pod-1 done, pod-2 and pod-3 running with their runtimes declared
        await kit.create_pod(f"pod-{i}", {"cpu": "1"}, extra_spec={"nodeName": NODE},
                             annotations={keys.MAXIMUM_RUNTIME: f"{RUNNING}s", COMPLETE_AFTER: f"{RUNNING}s"})
    await webhook_gates(kit)
    await kit.create_pod("pod-4", {"cpu": "3"})
    owner = JobRef(kit.namespace, "Pod", "pod-4").owner_id

    async def locked() -> bool:
        node = await kit.read_node(NODE)
        return any(t["key"] == keys.LOCK and t.get("value") == owner for t in node["spec"].get("taints") or [])
    await kit.wait_for(locked, what="the node locked for the starving pod-4", timeout=30)

    short = await kit.create_pod("short", {"cpu": "1"}, annotations=opting_in("10s", "8s"))
    assert any(g["name"] == keys.BACKFILL_GATE for g in short["spec"].get("schedulingGates") or []), short["spec"]
    long = await kit.create_pod("long", {"cpu": "1"}, annotations=opting_in("10m", "8s"))
    assert any(g["name"] == keys.BACKFILL_GATE for g in long["spec"].get("schedulingGates") or [])

    async def bound_short() -> dict | None:
        pod = await kit.read_pod("short")
        return pod if pod["spec"].get("nodeName") else None
    try:
        pod = await kit.wait_for(bound_short, what="the short pod bound on the locked node", timeout=20)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{running.log_text()[-3000:]}") from None
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

    async def bound_big() -> dict | None:
        pod = await kit.read_pod("pod-4")
        return pod if pod["spec"].get("nodeName") else None
    big = await kit.wait_for(bound_big, what="pod-4 bound once the node drained", timeout=RUNNING + 30)
    assert big["spec"]["nodeName"] == NODE
    assert (scheduled_at(big) or 0) > (scheduled_at(pod) or 0)
    # the start the agent estimated for pod-4 (when pod-2 and pod-3 end) and wrote on it: within a resync of its bind
    expected = parse_time(big["metadata"]["annotations"][keys.EXPECTED_START])
    assert expected is not None and abs(expected.timestamp() - (scheduled_at(big) or 0)) <= RESYNC_SECONDS, (
        big["metadata"]["annotations"][keys.EXPECTED_START], big["status"])

    async def error_counted() -> str | None:  # the estimate's error, once pod-4 is bound (one observation)
        text = await asyncio.to_thread(scrape, running.metrics_port)
        counts = [line for line in text.splitlines()
                  if line.startswith('reservoir_start_estimate_error_seconds_count{kind="job"')]
        return text if sum(float(line.rpartition(" ")[2]) for line in counts) == 1 else None
    await kit.wait_for(error_counted, what="the estimate's error observed once", timeout=10)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        return response.read().decode()


# --- seed 000's story twice in one test, backfill off and then on, compared (issue 17) ---

STREAM = (0, 8, 16, 24)  # seconds after the lock: short pods (1 cpu, 10 s declared, 8 s run) arriving meanwhile


class Story:
    """One run of seed 000's story on its own node: what the node's lock left idle, and when pod-4 bound."""

    def __init__(self) -> None:
        self.idle_cpu_seconds = 0.0  # integral over the lock's time of the node's cpu no running pod requests
        self.pod_4_delay = 0.0  # pod-4's bind after the moment it could fit (the later of pod-2's and pod-3's ends)
        self.backfilled: list[dict] = []  # pods other than pod-4 bound on the node while it was locked


async def seed_000_story(kit: Kit, prefix: str) -> Story:
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
    began = time.monotonic()
    stream = iter(STREAM)
    due = next(stream, None)
    seen_backfilled: dict[str, dict] = {}
    last = time.monotonic()
    while await lock_held():
        if due is not None and time.monotonic() - began >= due:
            await kit.create_pod(f"{prefix}-short-{due}", {"cpu": "1"}, annotations=opting_in("10s", "8s"))
            due = next(stream, None)
        pods = await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods?fieldSelector=spec.nodeName={node}")
        running = [p for p in pods["items"] if p["status"].get("phase") not in ("Succeeded", "Failed")]
        now = time.monotonic()
        story.idle_cpu_seconds += max(0.0, 3 - sum(cpu(p) for p in running)) * (now - last)
        last = now
        for p in running:
            if "short" in p["metadata"]["name"]:
                seen_backfilled[p["metadata"]["name"]] = p
        if time.monotonic() - began > RUNNING + 60:
            raise AssertionError(f"{node} still locked after {RUNNING + 60}s")
        await asyncio.sleep(0.5)
    big = await kit.read_pod(f"{prefix}-pod-4")
    assert big["spec"].get("nodeName") == node, big
    ends = [parse_time((await kit.read_pod(f"{prefix}-pod-{i}"))["status"]["startTime"]) for i in (2, 3)]
    story.pod_4_delay = (scheduled_at(big) or 0) - max(e.timestamp() for e in ends if e is not None) - RUNNING
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

    async def not_gating() -> bool:
        body = kit.pod_body("probe", {"cpu": "1"}, annotations=opting_in("10s", "5s"))
        made = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods?dryRun=All", body=body)
        return not made["spec"].get("schedulingGates")
    await kit.wait_for(not_gating, what="the webhook no longer holding pods for backfill", timeout=20)
    off = await seed_000_story(kit, "off")
    assert off.backfilled == [], [p["metadata"]["name"] for p in off.backfilled]
    # the first run's node and pods go (its stream is still pending; its node, free again, would take the second's)
    await kit.raw("DELETE", f"/api/v1/namespaces/{kit.namespace}/pods")
    await kit.raw("DELETE", "/api/v1/nodes/off-node")

    await configure(kit, BACKFILL_CONFIG)
    await webhook_gates(kit)
    on = await seed_000_story(kit, "on")
    assert on.backfilled, "no short pod backfilled the draining node"
    for pod in on.backfilled:  # every backfilled pod carries the deadline that ends it in time
        assert pod["spec"].get("activeDeadlineSeconds") == 10, pod["spec"]
    print(f"\nseed 000 backfill off -> on: locked idle cpu-s {off.idle_cpu_seconds:.1f} -> {on.idle_cpu_seconds:.1f}, "
          f"pod-4 bound {off.pod_4_delay:+.1f}s -> {on.pod_4_delay:+.1f}s after it could fit, "
          f"backfilled {len(on.backfilled)} pods")
    assert on.pod_4_delay <= off.pod_4_delay + RESYNC_SECONDS, (off.pod_4_delay, on.pod_4_delay)
    assert on.idle_cpu_seconds < off.idle_cpu_seconds - 5, (off.idle_cpu_seconds, on.idle_cpu_seconds)
