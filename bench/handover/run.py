"""`make bench-handover`: seed 003's handover, the lock Reservoir uses against kube-scheduler's `nominatedNodeName`
set by an external component (KEP-5278, beta since 1.35), side by side in one run on the real control plane (issue 12).

What a handover must guarantee: when a Reservation's placeholder goes, the room it frees goes to the owner being
handed it, never to a pod that was waiting for room on that node. The agent does it (agent/writer.py) by locking the
node for that Reservation's owners only, deleting or shrinking the placeholder, lifting the owner's gate, and
releasing the lock once the owner is bound. KEP-5278 offers another way: write the owner's
`status.nominatedNodeName`, and kube-scheduler then counts the owner's requests on that node when it filters other
pods, but only pods of lower or equal priority (its nominator adds nominated pods of priority >= the pod being
scheduled). This measures both, with nothing else in the way: the bench itself plays the agent, with the same order
of writes, so the mechanism is the only thing that differs.

Each round: NODES kwok nodes of 16 cpu; on each, OWNERS_PER_NODE placeholders of 1 cpu bound by `spec.nodeName` at
the reservoir-placeholder class (deploy/priorityclass.yaml); strangers of 1 cpu fill every node and STRANGERS_WAITING
more stay pending, so a freed cpu is always wanted; then every owner (1 cpu, gated, pinned to its node, priority 0) is
handed its placeholder's room at once. Strangers run at a priority lower than, equal to, or higher than the owners';
every pod has `preemptionPolicy: Never`, so what is measured is the nomination, not preemption. An owner wins when it
is bound on its node within HANDOVER_TIMEOUT; it loses when a stranger took the room (it stays unschedulable).

Per round: owners bound / owners, the median and worst time from the handover's first write to the owner's binding.
Last line: `handover: lock W/N owners (lower/equal/higher strangers), nominated W/N (...)`.
A benchmark: it reports numbers, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.scale.run import Api, _sh, log, wait_until
from localcluster import binaries
from localcluster.cluster import LocalCluster, kwok_node

NODES = 5
NODE_CPU = 16
OWNERS_PER_NODE = 4
STRANGERS_WAITING = 40
HANDOVER_TIMEOUT = 20.0
GATE = "bench.reservoir.sh/handover"
LOCK = "bench.reservoir.sh/handover-lock"
PLACEHOLDER_CLASS = "reservoir-placeholder"
OWNER_PRIORITY = 0
STRANGER_PRIORITIES = {"lower": -10, "equal": OWNER_PRIORITY, "higher": 1000}
MECHANISMS = ("lock", "nominated")


@dataclass
class Round:
    mechanism: str
    strangers: str
    owners: int = 0
    won: int = 0
    waits: list[float] = field(default_factory=list)
    stolen_by: list[str] = field(default_factory=list)

    def line(self) -> str:
        timing = (f", median {statistics.median(self.waits):.2f} s, worst {max(self.waits):.2f} s" if self.waits
                  else "")
        return f"{self.mechanism:9} {self.strangers:6} strangers: {self.won}/{self.owners} owners bound{timing}"


def pod(name: str, namespace: str, *, priority_class: str, node: str | None = None, pinned: str | None = None,
        gated: bool = False, tolerate: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        "priorityClassName": priority_class,  # every class here has preemptionPolicy Never
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if node:
        spec["nodeName"] = node
    if pinned:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pinned]}]}]}}}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    if tolerate:
        spec["tolerations"].append({"key": LOCK, "operator": "Equal", "value": tolerate, "effect": "NoSchedule"})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


async def classes(api: Api) -> None:
    """The placeholder class as deploy/ ships it, and one class per stranger priority (bench-equal: the owners')."""
    bodies = [{"metadata": {"name": PLACEHOLDER_CLASS}, "value": 1_000_000_000, "preemptionPolicy": "Never"}]
    bodies += [{"metadata": {"name": f"bench-{name}"}, "value": value, "preemptionPolicy": "Never"}
               for name, value in STRANGER_PRIORITIES.items()]
    for body in bodies:
        await api.call("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                       {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", **body}, ok=(201, 409))


async def bound(api: Api, namespace: str, prefix: str) -> dict[str, str]:
    listed = await api.call("GET", f"/api/v1/namespaces/{namespace}/pods")
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in listed["items"]
            if p["metadata"]["name"].startswith(prefix) and p["spec"].get("nodeName")}


async def one_round(api: Api, mechanism: str, strangers: str, index: int) -> Round:
    result = Round(mechanism, strangers)
    namespace = f"handover-{index}"
    await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    nodes = [f"handover-{index}-{i}" for i in range(NODES)]
    for node in nodes:
        await api.call("POST", "/api/v1/nodes", kwok_node(node, {"cpu": str(NODE_CPU), "memory": "64Gi"}))

    async def ready() -> int:
        listed = await api.call("GET", "/api/v1/nodes")
        up = {n["metadata"]["name"] for n in listed["items"]
              if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])}
        return len(set(nodes) - up)
    await wait_until(ready, f"round {index}: nodes Ready", timeout=120, interval=0.5)

    owners = [(f"owner-{n}-{j}", node) for n, node in enumerate(nodes) for j in range(OWNERS_PER_NODE)]
    result.owners = len(owners)
    for name, node in owners:
        await api.call("POST", f"/api/v1/namespaces/{namespace}/pods",
                       pod(f"placeholder-{name}", namespace, priority_class=PLACEHOLDER_CLASS, node=node))
    stranger_class = f"bench-{strangers}"
    fill = NODES * (NODE_CPU - OWNERS_PER_NODE) + STRANGERS_WAITING
    await asyncio.gather(*(api.call("POST", f"/api/v1/namespaces/{namespace}/pods",
                                    pod(f"stranger-{i:03d}", namespace, priority_class=stranger_class))
                           for i in range(fill)))

    async def filling() -> int:
        return NODES * (NODE_CPU - OWNERS_PER_NODE) - len(await bound(api, namespace, "stranger-"))
    await wait_until(filling, f"round {index}: strangers fill every node", timeout=120, interval=0.5)
    for name, node in owners:
        await api.call("POST", f"/api/v1/namespaces/{namespace}/pods",
                       pod(name, namespace, priority_class="bench-equal", pinned=node, gated=True,
                           tolerate=node if mechanism == "lock" else None))
    await asyncio.sleep(1)  # the gated owners are in kube-scheduler's cache before anything is freed

    began: dict[str, float] = {}
    first_write = time.monotonic()
    if mechanism == "lock":  # one lock per node for the owners handed over there (the agent: one Reservation's)
        await asyncio.gather(*(_taint(api, node) for node in nodes))

    async def hand_over(name: str, node: str) -> None:
        began[name] = first_write if mechanism == "lock" else time.monotonic()
        if mechanism == "nominated":
            await patch(api, f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                        {"status": {"nominatedNodeName": node}}, MERGE)
        await api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/placeholder-{name}?gracePeriodSeconds=0")
        await patch(api, f"/api/v1/namespaces/{namespace}/pods/{name}",
                    [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": GATE},
                     {"op": "remove", "path": "/spec/schedulingGates/0"}])

    await asyncio.gather(*(hand_over(name, node) for name, node in owners))
    deadline = time.monotonic() + HANDOVER_TIMEOUT
    done: dict[str, float] = {}
    while len(done) < len(owners) and time.monotonic() < deadline:
        now = time.monotonic()
        for name in await bound(api, namespace, "owner-"):
            if name not in done:
                done[name] = now
        await asyncio.sleep(0.1)
    for name, _ in owners:
        if name in done:
            result.won += 1
            result.waits.append(done[name] - began[name])
    if mechanism == "lock":
        for node in nodes:
            await _untaint(api, node)
    await api.call("DELETE", f"/api/v1/namespaces/{namespace}")
    for node in nodes:
        await api.call("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
    return result


JSON_PATCH = "application/json-patch+json"
MERGE = "application/merge-patch+json"


async def patch(api: Api, path: str, body: Any, content_type: str = JSON_PATCH) -> None:
    async with api.session.patch(api.server + path, json=body, headers={"Content-Type": content_type}) as response:
        if response.status != 200:
            raise RuntimeError(f"PATCH {path}: {response.status} {(await response.text())[:300]}")


async def _retaint(api: Api, node: str, change: Any) -> None:
    """Read the node, change its taints, write them back guarded by resourceVersion (retried on a conflict, as the
    agent's writer does): several handovers lock the same node at once."""
    for _ in range(20):
        obj = await api.call("GET", f"/api/v1/nodes/{node}")
        try:
            await patch(api, f"/api/v1/nodes/{node}", [
                {"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
                {"op": "add", "path": "/spec/taints", "value": change(obj["spec"].get("taints") or [])}])
            return
        except RuntimeError as err:
            if " 409 " not in str(err) and " 422 " not in str(err):
                raise
    raise RuntimeError(f"node {node}: taints never written")


async def _taint(api: Api, node: str) -> None:
    await _retaint(api, node, lambda taints: [*taints, {"key": LOCK, "value": node, "effect": "NoSchedule"}])


async def _untaint(api: Api, node: str) -> None:
    await _retaint(api, node, lambda taints: [t for t in taints if t.get("key") != LOCK])


async def feature_state(cluster: LocalCluster) -> str:
    """kube-scheduler's own word on the feature gate (its /metrics `kubernetes_feature_enabled`)."""
    process = await asyncio.create_subprocess_exec(*cluster.kubectl, "get", "--raw", "/metrics",
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    for line in out.decode().splitlines():
        if 'name="NominatedNodeNameForExpectation"' in line and line.startswith("kubernetes_feature_enabled"):
            return f"NominatedNodeNameForExpectation={'on' if line.rstrip().endswith(' 1') else 'off'}"
    return "NominatedNodeNameForExpectation: not reported by kube-apiserver"


async def run(rounds: int) -> list[str]:
    cluster = LocalCluster(bin_dir=binaries.ensure_built(), log=log)
    cluster.start()
    api = Api(cluster)
    report: list[str] = []
    try:
        await _sh(*cluster.kubectl, "version")
        await classes(api)
        results: list[Round] = []
        index = 0
        for _ in range(rounds):
            for mechanism in MECHANISMS:
                for strangers in STRANGER_PRIORITIES:
                    result = await one_round(api, mechanism, strangers, index)
                    index += 1
                    log(f"bench-handover: {result.line()}")
                    results.append(result)
        report.append(f"bench-handover: {NODES} nodes of {NODE_CPU} cpu, {NODES * OWNERS_PER_NODE} owners handed "
                      f"over at once, {STRANGERS_WAITING} strangers waiting; {await feature_state(cluster)}")
        report += [r.line() for r in results]
        summary = []
        for mechanism in MECHANISMS:
            mine = [r for r in results if r.mechanism == mechanism]
            won = "/".join(str(sum(r.won for r in mine if r.strangers == s)) for s in STRANGER_PRIORITIES)
            total = sum(r.owners for r in mine if r.strangers == "lower")
            summary.append(f"{mechanism} {won} of {total} owners (lower/equal/higher strangers)")
        report.append("handover: " + ", ".join(summary))
    finally:
        await api.close()
        cluster.stop()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.handover.run")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the six (mechanism x stranger priority)")
    args = parser.parse_args(argv)
    print("\n".join(asyncio.run(run(args.rounds))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
