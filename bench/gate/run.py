"""`make bench-gate`: the delay the backfill gate adds to a stream of pods that opt in, on the local control plane
(issue 34: a gate in front of kube-scheduler must not be the slowest part of the path).

NODES kwok nodes of 8 cpu, each half full with 1-cpu pods pre-bound to it (on DRAINING of them the pods declare a
maximum runtime and run exactly that, on the others they run on); LOCKS pods of 8 cpu fit nowhere and get starvation
locks past the threshold, so the locked nodes' idle cpu is backfill room the webhook sees: a pod that opts in is held
on the gate. Then for SECONDS, RATE pods a second (each created at its own moment, not one after the other), 1 cpu,
declaring a 10 s runtime and running 3 s, every one opting into backfill. Each pod's gate delay is from the moment its
create returned to the first watch event showing its backfill gate gone (arrival times of the events: below the
second), by outcome: backfilled (narrowed to a locked node, with activeDeadlineSeconds) or released (let go
unchanged). Pods the webhook did not hold are counted apart. With the agent's wake-ups by cause over the stream
(gate passes beside the plans).

Last line: `gate: R pods/s for S s, H held: delay p50 X s, p95 Y s, max Z s (released N, backfilled B), G gate
passes, P plans`. A benchmark: it reports numbers, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import yaml

from bench.backfill.run import pod as backfill_pod
from bench.scale.run import (
    _not_ready,
    _sh,
    create_all,
    log,
    metrics,
    reservoir_running,
    wait_until,
    wakeups,
    watch_events,
)
from localcluster.cluster import COMPLETE_AFTER, kwok_node
from shared import keys

NODES = 100
DRAINING = 8
NODE_CPU = 8
FILL = 4  # 1-cpu pods per node: half full, so a pod let go finds room at once
LOCKS = 4
FILL_RUNTIMES = (150, 180, 210)  # seconds, declared and run on the draining nodes: longer than the stream
RATE = 50
SECONDS = 60
THRESHOLD_SECONDS = 5
NAMESPACE = "bench-gate"


def config() -> str:
    return f"""
maxLockedNodePercent: 50
starvation:
  starvingJobTimeThreshold: {THRESHOLD_SECONDS}s
  reservedNodePercent: {LOCKS * 100 // NODES}
backfill: {{namespaces: [{NAMESPACE}], margin: 5s}}
"""


def pod(name: str, cpu: str, *, node: str = "", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return backfill_pod(name, NAMESPACE, cpu, node=node, annotations=annotations)


def gated(obj: dict[str, Any]) -> bool:
    return any(g.get("name") == keys.BACKFILL_GATE for g in (obj.get("spec") or {}).get("schedulingGates") or ())


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def run(rate: int, seconds: int) -> list[str]:
    async with reservoir_running() as (cluster, api, agent):
        await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}, ok=(201, 409))
        configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.NAMESPACE},
                     "data": {keys.CONFIG_KEY: config()}}
        await _sh(*cluster.kubectl, "apply", "-f", "-", stdin=yaml.safe_dump(configmap))
        nodes = [f"gate-node-{i:04d}" for i in range(NODES)]
        await create_all(api, "/api/v1/nodes", (kwok_node(n, {"cpu": str(NODE_CPU), "memory": "64Gi"})
                                                for n in nodes), NODES, "nodes")
        await wait_until(lambda: _not_ready(api, NODES), "nodes Ready", timeout=300)

        def declared(i: int, j: int) -> dict[str, str]:
            if i >= DRAINING:
                return {}
            runtime = FILL_RUNTIMES[(i + j) % len(FILL_RUNTIMES)]
            return {keys.MAXIMUM_RUNTIME: f"{runtime}s", COMPLETE_AFTER: f"{runtime}s"}
        await create_all(api, f"/api/v1/namespaces/{NAMESPACE}/pods", (
            pod(f"fill-{n}-{j}", "1", node=n, annotations=declared(i, j)) for i, n in enumerate(nodes)
            for j in range(FILL)), NODES * FILL, "fill")
        await wait_until(lambda: api.count(f"/api/v1/namespaces/{NAMESPACE}/pods?fieldSelector=status.phase!=Running"),
                         "fill Running", timeout=300)
        for k in range(LOCKS):
            await api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod(f"owner-{k}", str(NODE_CPU)))

        async def unlocked() -> int:
            have = len((await api.call("GET", f"/api/v1/nodes?labelSelector={keys.LOCK}"))["items"])
            return LOCKS - have
        await wait_until(unlocked, "the owners' nodes locked", timeout=120, interval=0.5)

        async def not_holding() -> int:  # the webhook holds a pod that opts in once it sees the locks' room
            made = await api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All", pod(
                "probe", "1", annotations={keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10s"}))
            return 0 if gated(made) else 1
        await wait_until(not_holding, "the webhook holding pods that opt in", timeout=60, interval=0.5)

        created: dict[str, float] = {}
        lifted: dict[str, tuple[float, bool]] = {}  # name -> (when the gate was seen gone, backfilled)
        held: set[str] = set()

        def on_event(obj: dict[str, Any], kind: str) -> None:
            name = obj["metadata"]["name"]
            if name.startswith("s-") and name not in lifted and kind != "DELETED" and not gated(obj):
                lifted[name] = (time.time(), "activeDeadlineSeconds" in (obj.get("spec") or {}))
        rv = (await api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1"))["metadata"]["resourceVersion"]
        watching = asyncio.create_task(watch_events(api, f"/api/v1/namespaces/{NAMESPACE}/pods", rv, on_event))
        before = await metrics(agent.metrics_port)
        began = time.time()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, began + i / rate - time.time()))
            name = f"s-{i:05d}"
            made = await api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod(
                name, "1", annotations={keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10s", COMPLETE_AFTER: "3s"}))
            created[name] = time.time()
            if gated(made):
                held.add(name)
        total = rate * seconds
        await asyncio.gather(*(one(i) for i in range(total)))
        log(f"bench-gate: {total} pods created in {time.time() - began:.1f}s, {len(held)} held on the gate")
        deadline = time.time() + 180
        while any(name not in lifted for name in held) and time.time() < deadline:
            await asyncio.sleep(0.5)
        watching.cancel()
        after = await metrics(agent.metrics_port)
        if not agent.running():
            raise RuntimeError(f"agent exited:\n{agent.log_text()[-3000:]}")
        delays = {name: lifted[name][0] - created[name] for name in held if name in lifted}
        backfilled = sum(1 for name in delays if lifted[name][1])
        values = list(delays.values())
        by_cause = {cause: wakeups(after, cause) - wakeups(before, cause)
                    for cause in ("gate", "change", "time", "resync")}
        lines = []
        for label, names in (("released", [n for n in delays if not lifted[n][1]]),
                             ("backfilled", [n for n in delays if lifted[n][1]])):
            part = [delays[n] for n in names]
            lines.append(f"{label}: {len(part)} pods, gate delay p50 {quantile(part, 0.5):.2f} s, p95 "
                         f"{quantile(part, 0.95):.2f} s, max {max(part, default=0.0):.2f} s")
        lines.append(f"not held by the webhook: {total - len(held)}; held and never let go: "
                     f"{len(held) - len(delays)}; mean {statistics.mean(values) if values else 0.0:.2f} s")
        lines.append("agent wake-ups over the stream: " + ", ".join(f"{c} {n:.0f}" for c, n in by_cause.items()))
        plans = by_cause["change"] + by_cause["time"] + by_cause["resync"]
        lines.append(f"gate: {rate} pods/s for {seconds} s, {len(held)} held: delay p50 {quantile(values, 0.5):.2f} s, "
                     f"p95 {quantile(values, 0.95):.2f} s, max {max(values, default=0.0):.2f} s (released "
                     f"{len(delays) - backfilled}, backfilled {backfilled}), {by_cause['gate']:.0f} gate passes, "
                     f"{plans:.0f} plans")
        return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-gate", description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=RATE, help="pods a second that opt into backfill")
    parser.add_argument("--seconds", type=int, default=SECONDS, help="how long the stream lasts")
    args = parser.parse_args(argv)
    for line in asyncio.run(run(args.rate, args.seconds)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
