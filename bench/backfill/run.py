"""`make bench-backfill`: seed 000's starvation locks with backfill off and on, side by side in one run on the local
control plane (issue 17).

Each phase (OFF, then ON; the same seeded random draws) on its own NODES kwok nodes of 8 cpu, with the webhook and
the agent running as `make up` runs them:
- fill: every node full with eight 1-cpu pods pre-bound to it; on DRAINING of the nodes each declares a maximum
  runtime drawn from FILL_RUNTIMES and runs exactly that (kwok's complete-after), on the others they declare none and
  run on (a busy cluster: the stream finds room only where pods end);
- owners: LOCKS pods of 8 cpu (each its own job) fit nowhere; past starvingJobTimeThreshold each gets a starvation
  lock on the node that drains soonest;
- stream: for STREAM_SECONDS, a 1-cpu pod every STREAM_EVERY seconds, declaring a runtime drawn from
  STREAM_RUNTIMES and running a fraction of it (STREAM_RUN_FRACTION), every one opting into backfill
  (`reservoir.sh/backfill: "true"`); the ON phase's config lets its namespace backfill, the OFF phase's has no
  `backfill` section.
Measured per phase, sampling every second until every owner is bound: locked-idle cpu-seconds (over the nodes
carrying a lock taint, allocatable cpu minus the requests of the pods running there), each owner's delay (its bind
after the moment its node's fill pods had all ended: what backfill must never add to; both moments are the arrival of
the watch event that showed them, so the delay is measured below the second the pods' timestamps round to), the
stream pods' wait
(creation to bind, those bound), and the pods backfilled (bound with an activeDeadlineSeconds). At the end, the
delay the gate added (the agent's reservoir_backfill_gate_seconds): to the pods let go unchanged, and to those
backfilled.

Last line: `backfill: locked idle cpu-s OFF -> ON (-X%), owner delay +D s, backfilled B pods`, D the mean owner
delay ON minus OFF. A benchmark: it reports numbers, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yaml

from bench.scale.run import Api, _not_ready, _sh, create_all, log, reservoir_running, wait_until, watch_events
from localcluster.cluster import COMPLETE_AFTER, kwok_node
from shared import keys
from shared.timestamps import parse_time

NODES = 200
DRAINING = 24
NODE_CPU = 8
LOCKS = 8
FILL_RUNTIMES = (40, 60, 80, 100, 120)  # seconds, declared and run
STREAM_SECONDS = 120
STREAM_EVERY = 0.5
STREAM_RUNTIMES = (10, 20, 40, 90)  # seconds declared
STREAM_RUN_FRACTION = (0.5, 1.0)  # of the declared runtime, run
THRESHOLD_SECONDS = 5
SEED = 17


def config(namespace: str, backfill: bool) -> str:
    text = f"""
maxLockedNodePercent: 50
resyncPeriod: 5s
starvation:
  starvingJobTimeThreshold: {THRESHOLD_SECONDS}s
  reservedNodePercent: {LOCKS * 100 // NODES}
"""
    return text + (f"backfill: {{namespaces: [{namespace}], margin: 5s}}\n" if backfill else "")


def pod(name: str, namespace: str, cpu: str, *, node: str = "", annotations: dict[str, str] | None = None
        ) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.invalid/reservoir-bench:1",
                                            "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}],
                            "terminationGracePeriodSeconds": 0}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}}}


def scheduled_at(obj: dict[str, Any]) -> float | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            moment = parse_time(condition.get("lastTransitionTime"))
            return moment.timestamp() if moment is not None else None
    return None


def cpu_of(obj: dict[str, Any]) -> float:
    total = 0.0
    for container in obj["spec"]["containers"]:
        text = str(((container.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
        total += float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return total


@dataclass
class Phase:
    name: str
    idle_cpu_seconds: float = 0.0
    owner_delays: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    stream: int = 0
    backfilled: int = 0
    seconds: float = 0.0


class Moments:
    """When each pod of a namespace was first seen bound (spec.nodeName set) and first seen ended (phase Succeeded or
    Failed), by the wall clock of the watch event's arrival: sub-second, where the pods' own timestamps (PodScheduled,
    finishedAt) are whole seconds. kube-scheduler learns of an ending from the same kind of event."""

    def __init__(self) -> None:
        self.bound: dict[str, float] = {}
        self.ended: dict[str, float] = {}

    def start(self, api: Api, namespace: str, rv: str) -> asyncio.Task[None]:
        return asyncio.create_task(watch_events(api, f"/api/v1/namespaces/{namespace}/pods", rv, self._event))

    def _event(self, obj: dict[str, Any], kind: str) -> None:
        now, name = time.time(), obj["metadata"]["name"]
        if (obj.get("spec") or {}).get("nodeName"):
            self.bound.setdefault(name, now)
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.ended.setdefault(name, now)


async def list_pods(api: Api, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        page = await api.call("GET", f"/api/v1/namespaces/{namespace}/pods?limit=2000"
                                     + (f"&continue={token}" if token else ""))
        items += page.get("items") or []
        token = page["metadata"].get("continue") or ""
        if not token:
            return items


async def phase(api: Api, kubectl: list[str], name: str, backfill: bool) -> Phase:
    rng = random.Random(SEED)
    namespace = f"bench-backfill-{name}"
    result = Phase(name)
    await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}}, ok=(201, 409))
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.NAMESPACE},
                 "data": {keys.CONFIG_KEY: config(namespace, backfill)}}
    await _sh(*kubectl, "apply", "-f", "-", stdin=yaml.safe_dump(configmap))
    nodes = [f"{name}-node-{i:04d}" for i in range(NODES)]
    await create_all(api, "/api/v1/nodes", (kwok_node(n, {"cpu": str(NODE_CPU), "memory": "64Gi"}) for n in nodes),
                     NODES, f"{name} nodes")
    await wait_until(lambda: _not_ready(api, NODES), f"{name} nodes Ready",
                     timeout=300)
    runtimes = {(n, j): rng.choice(FILL_RUNTIMES) for n in nodes[:DRAINING] for j in range(NODE_CPU)}

    def declared(n: str, j: int) -> dict[str, str]:
        runtime = runtimes.get((n, j))
        return {keys.MAXIMUM_RUNTIME: f"{runtime}s", COMPLETE_AFTER: f"{runtime}s"} if runtime else {}
    await create_all(api, f"/api/v1/namespaces/{namespace}/pods", (
        pod(f"fill-{n}-{j}", namespace, "1", node=n, annotations=declared(n, j))
        for n in nodes for j in range(NODE_CPU)), NODES * NODE_CPU, f"{name} fill")
    await wait_until(lambda: api.count(f"/api/v1/namespaces/{namespace}/pods?fieldSelector=status.phase!=Running"),
                     f"{name} fill Running", timeout=300)
    moments = Moments()
    watching = moments.start(api, namespace, (await api.call(
        "GET", f"/api/v1/namespaces/{namespace}/pods?limit=1"))["metadata"]["resourceVersion"])
    began = time.time()
    for k in range(LOCKS):
        await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod(f"owner-{k}", namespace, str(NODE_CPU)))
    draws = [(rng.choice(STREAM_RUNTIMES), rng.uniform(*STREAM_RUN_FRACTION))
             for _ in range(int(STREAM_SECONDS / STREAM_EVERY))]

    async def stream() -> None:
        for i, (declared, fraction) in enumerate(draws):
            await asyncio.sleep(max(0.0, began + i * STREAM_EVERY - time.time()))
            await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod(f"short-{i:04d}", namespace, "1",
                           annotations={keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: f"{declared}s",
                                        COMPLETE_AFTER: f"{declared * fraction:.1f}s"}))
            result.stream += 1
    streaming = asyncio.create_task(stream())
    last = time.time()
    try:
        while True:
            pods = await list_pods(api, namespace)
            locked = {n["metadata"]["name"] for n in (await api.call(
                "GET", f"/api/v1/nodes?labelSelector={keys.LOCK}"))["items"]}
            now = time.time()
            used: dict[str, float] = {}
            for p in pods:
                node = p["spec"].get("nodeName")
                if node in locked and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    used[node] = used.get(node, 0.0) + cpu_of(p)
            result.idle_cpu_seconds += sum(max(0.0, NODE_CPU - used.get(n, 0.0)) for n in locked) * (now - last)
            last = now
            owners = [p for p in pods if p["metadata"]["name"].startswith("owner-")]
            if all(scheduled_at(p) is not None for p in owners) and streaming.done():
                break
            if now - began > max(FILL_RUNTIMES) + STREAM_SECONDS + 120:
                raise RuntimeError(f"{name}: owners still pending after {now - began:.0f}s")
            log(f"bench-backfill: {name} {now - began:.0f}s: {len(locked)} nodes locked, "
                f"{sum(scheduled_at(p) is not None for p in owners)}/{LOCKS} owners bound, {result.stream} streamed")
            await asyncio.sleep(1)
    finally:
        streaming.cancel()
        watching.cancel()
    result.seconds = time.time() - began
    by_node: dict[str, list[dict[str, Any]]] = {}
    for p in pods:
        by_node.setdefault(p["spec"].get("nodeName") or "", []).append(p)
    for owner in owners:
        fills = [p["metadata"]["name"] for p in by_node[owner["spec"]["nodeName"]]
                 if p["metadata"]["name"].startswith("fill-")]
        bound = moments.bound.get(owner["metadata"]["name"])
        if bound is not None and fills and all(f in moments.ended for f in fills):
            result.owner_delays.append(bound - max(moments.ended[f] for f in fills))
    for p in pods:
        if p["metadata"]["name"].startswith("short-") and (bound := scheduled_at(p)) is not None:
            created = parse_time(p["metadata"]["creationTimestamp"])
            result.waits.append(bound - (created.timestamp() if created else bound))
            result.backfilled += "activeDeadlineSeconds" in p["spec"]
    await api.call("DELETE", f"/api/v1/namespaces/{namespace}")
    for n in nodes:
        await api.call("DELETE", f"/api/v1/nodes/{n}", ok=(200, 202, 404))
    return result


async def gate_delay(port: int) -> str:
    """The delay the backfill gate added (the agent's reservoir_backfill_gate_seconds): from creation to the gate
    lifted, for the pods let go unchanged (placed as usual) and for those backfilled."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    values = {}
    for line in text.splitlines():
        if line.startswith("reservoir_backfill_gate_seconds_"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    parts = []
    for outcome in ("released", "backfilled"):
        count = values.get(f'reservoir_backfill_gate_seconds_count{{outcome="{outcome}"}}', 0.0)
        total = values.get(f'reservoir_backfill_gate_seconds_sum{{outcome="{outcome}"}}', 0.0)
        parts.append(f"{outcome} {count:.0f} pods, mean {total / count if count else 0:.2f}s")
    return "gate (creation to the gate lifted): " + "; ".join(parts)


def describe(p: Phase) -> str:
    delays = p.owner_delays or [0.0]
    waits = p.waits or [0.0]
    return (f"{p.name.upper()}: locked idle cpu-s {p.idle_cpu_seconds:.0f}; owner delay after its node's fill ended "
            f"mean {statistics.mean(delays):.2f}s max {max(delays):.2f}s ({len(p.owner_delays)} owners); stream "
            f"pods bound {len(p.waits)}/{p.stream}, wait median {statistics.median(waits):.1f}s mean "
            f"{statistics.mean(waits):.1f}s; backfilled {p.backfilled}; {p.seconds:.0f}s")


async def run() -> list[str]:
    async with reservoir_running() as (cluster, api, agent):
        kubectl = cluster.kubectl
        off = await phase(api, kubectl, "off", backfill=False)
        log(f"bench-backfill: {describe(off)}")
        on = await phase(api, kubectl, "on", backfill=True)
        log(f"bench-backfill: {describe(on)}")
        gate = await gate_delay(agent.metrics_port)
        log(f"bench-backfill: {gate}")
        if not agent.running():
            raise RuntimeError(f"agent exited:\n{agent.log_text()[-3000:]}")
        base = off.idle_cpu_seconds
        change = (on.idle_cpu_seconds - base) / base * 100 if base else 0.0
        # (rounded first: a difference below the printed precision is +0.00, not -0.00)
        delay = round(statistics.mean(on.owner_delays or [0.0]) - statistics.mean(off.owner_delays or [0.0]), 2) + 0.0
        return [describe(off), describe(on), gate,
                f"backfill: locked idle cpu-s {base:.0f} -> {on.idle_cpu_seconds:.0f} ({change:+.0f}%), "
                f"owner delay {delay:+.2f} s, backfilled {on.backfilled} pods"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-backfill", description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    for line in asyncio.run(run()):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
