"""What several end-to-end stories share: the setup files, the configs, and small readers of what the cluster did.
Test modules import these from here, never from each other."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER
from shared import keys
from shared.timestamps import parse_time
from shared.views import TERMINAL
from tests.e2e.kit import Kit, apply_setup, running_webhook

SETUP = ("deploy/crds/scheduling.volcano.sh_queues.yaml", "deploy/crds/scheduling.volcano.sh_podgroups.yaml",
         "deploy/crds/reservoir.sh_reservations.yaml", "deploy/namespace.yaml", "deploy/agent-rbac.yaml",
         "deploy/priorityclass.yaml", "deploy/critical-priority-policy.yaml")

# Seed 000's story: a job starving for 3 s may lock every node.
STARVATION_CONFIG = """
starvation: {starvingJobTimeThreshold: 3s, reservedNodePercent: 100, maxLockDuration: 10m}
maxLockedNodePercent: 90
resyncPeriod: 2s
debounce: 200ms
"""

# Queue and Reservation stories: starvation off, so only the policy under test locks nodes.
QUEUE_CONFIG = """
starvation: {enabled: false}
maxLockedNodePercent: 90
resyncPeriod: 2s
debounce: 200ms
"""


@asynccontextmanager
async def running_agent(kit: Kit, config: str | None, *setup: str, webhook: bool = False,
                        **options: Any) -> AsyncIterator[AgentProcess]:
    """The agent (AgentProcess `options`) as its ServiceAccount under `config` (None: a manifest of `setup` holds it),
    after SETUP and the manifests `setup` are applied; with `webhook`, the webhook too, as its ServiceAccount and
    registered (tests.e2e.kit.running_webhook). Stopped after, the webhook unregistered, the config and the agent's
    Lease removed."""
    await apply_setup(kit, *SETUP, *(("deploy/webhook-rbac.yaml",) if webhook else ()), *setup)
    if config is not None:
        await configure(kit, config)
    process = AgentProcess(kit.cluster, **options)
    try:
        async with running_webhook(kit) if webhook else nullcontext():
            process.start()
            try:
                yield process
            finally:
                process.stop()
    finally:
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
        await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")


async def configure(kit: Kit, text: str) -> None:
    await kit.server_side_apply({"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.NAMESPACE},
                                 "data": {keys.CONFIG_KEY: text}})


def window_config(name: str = "ebook", selector: str = "{business: ebook}", cpu: str = "8",
                  pod_num_to_reserve: int | None = 2) -> str:
    """A config whose window opens within the minute, its lock already due (startReserveAgo 3m)."""
    start = (datetime.now(UTC) + timedelta(minutes=1)).replace(second=0, microsecond=0)
    cap = f"\n  podNumToReserve: {pod_num_to_reserve}" if pod_num_to_reserve else ""
    return f"""
starvation: {{enabled: false}}
maxLockedNodePercent: 90
resyncPeriod: 2s
debounce: 200ms
windows:
- name: {name}
  nodeSelector: {selector}
  resources: {{cpu: "{cpu}"}}
  schedule: "{start.minute} {start.hour} * * *"
  duration: 10m
  startReserveAgo: 3m{cap}
"""


STREAM_SECONDS = 30  # seed 000's story: how long small pods keep coming
SMALL_RUNS_SECONDS = 5  # ... each running this long
SMALL_RUNS_SPREAD = 2  # ... give or take half this (seconds): pods created together do not end together
STREAM_FILLS = 30  # seconds the stream has to fill its nodes before a story goes on
GOLDEN = (5 ** 0.5 - 1) / 2  # n * GOLDEN mod 1 for n = 0, 1, 2, ...: points spread evenly over [0, 1) however many
GPU = "nvidia.com/gpu"  # GPUs, as the device plugin counts them


async def small_pods(kit: Kit) -> list[dict[str, Any]]:
    """The stream's small pods in the kit's namespace (label stream=small), as listed now."""
    return (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods?labelSelector=stream=small"))["items"]


async def stream_small_pods(kit: Kit, seconds: float, keep_pending: int = 3, gpus: int = 0,
                            spread: float = SMALL_RUNS_SPREAD) -> None:
    """Keep `keep_pending` small pods (1 cpu, or with `gpus`: 100m cpu and that many `nvidia.com/gpu`) waiting at all
    times, for `seconds`. Their runtimes are spread evenly over SMALL_RUNS_SECONDS plus or minus half of `spread`
    (seconds), so pods created together do not end together: a node whose pods all end within one scheduling cycle is
    empty for whichever pending pod is tried first, however many small ones wait (CI once saw kube-scheduler alone
    place the big pod so, with every pod running 5 s: a pod bound as another ends, ends as the next binds, and ends
    drift together)."""
    counter = itertools.count()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pods = await small_pods(kit)
        pending = sum(1 for p in pods if not p["spec"].get("nodeName"))
        for _ in range(keep_pending - pending):
            n = next(counter)
            runs = f"{round(1000 * (SMALL_RUNS_SECONDS + spread * ((n * GOLDEN) % 1 - 0.5)))}ms"
            body = kit.pod_body(f"small-{n}", {"cpu": "100m", GPU: str(gpus)} if gpus else {"cpu": "1"},
                                labels={"stream": "small"}, annotations={COMPLETE_AFTER: runs})
            if gpus:  # an extended resource's request must equal its limit
                body["spec"]["containers"][0]["resources"]["limits"] = {GPU: str(gpus)}
            await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods", body)
        await asyncio.sleep(0.3)


async def stream_fills(kit: Kit, stream: asyncio.Task, nodes: Sequence[str], pods: int) -> None:
    """Waits until `pods` of the stream's small pods run on `nodes` (a story's nodes full of them); fails after
    STREAM_FILLS seconds, or if the stream has ended."""
    deadline = time.monotonic() + STREAM_FILLS
    while True:
        items = await small_pods(kit)
        running = sum(1 for p in items if p["spec"].get("nodeName") in nodes
                      and p.get("status", {}).get("phase") not in TERMINAL)
        if running >= pods:
            return
        assert time.monotonic() < deadline and not stream.done(), \
            f"{running} of {pods} small pods run on {list(nodes)} after {STREAM_FILLS} s"
        await asyncio.sleep(0.2)


def scheduled_at(pod: dict) -> float | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition["status"] == "True":
            return parse_time(condition["lastTransitionTime"]).timestamp()
    return None


async def locked_nodes(kit: Kit, names: list[str]) -> dict[str, str]:
    out = {}
    for name in names:
        for taint in (await kit.read_node(name))["spec"].get("taints") or []:
            if taint["key"] == keys.LOCK:
                out[name] = taint["value"]
    return out


SPARE_NODE = "spare"


async def spare_node(kit: Kit, name: str = SPARE_NODE) -> str:
    """A Ready node no test pod fits on (100m cpu): with maxLockedNodePercent at most 90 (floor of 90% of the
    schedulable nodes), a story told on one node needs a second schedulable node for its one lock."""
    await kit.create_node(name, {"cpu": "100m", "memory": "1Gi"})
    return name
