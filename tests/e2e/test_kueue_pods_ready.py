"""Issue 32, locks before Kueue gives up: Kueue's manager with `waitForPodsReady` (timeout PODS_READY seconds: an
admitted Workload whose pods are not all ready by then is evicted and requeued). Two 8-GPU nodes are kept busy by a
stream of 1-GPU pods (runtimes 3 to 7 s); an admitted Job of one 8-GPU pod waits for a whole node.
- kube-scheduler alone: the pod is never placed while the stream runs, and Kueue evicts the Workload (PodsReadyTimeout);
- with Reservoir, `starvingJobTimeThreshold` 10m (far past the timeout) and `kueue.podsReadyTimeout` set to Kueue's: the
  Workload's job starves after half the timeout, a node is locked and drains, the pod is placed and Ready before Kueue
  gives up, and the Workload is never evicted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.cluster import LocalCluster
from localcluster.kueue_process import KueueManager
from tests.e2e.kit import Kit
from tests.e2e.kueue_scenarios import LOCAL_QUEUE, condition, job_body, job_pods, kueue_queues, running_kueue, workloads
from tests.e2e.scenarios import GPU, running_agent, scheduled_at, spare_node, stream_small_pods

PODS_READY = 40  # Kueue's waitForPodsReady timeout, seconds
STREAM = 70  # seconds of 1-GPU pods: past the timeout, with room for Kueue to act
EVICTION_LATE = 30  # seconds after the stream that kube-scheduler alone's story still waits for Kueue's eviction
GPU_NODES = ("gpu-a", "gpu-b")  # two 8-GPU nodes
SPREAD = 4  # seconds: the 1-GPU pods run 3 to 7 s, so a node's pods do not all end at once (CI once saw them do so)
FULL_BY = 30  # seconds the stream has to fill both nodes before the Job is created

CONFIG = f"""
starvation: {{starvingJobTimeThreshold: 10m, reservedNodePercent: 100, maxLockDuration: 10m}}
maxLockedNodePercent: 90
resyncPeriod: 2s
debounce: 200ms
kueue: {{workloads: true, podsReadyTimeout: {PODS_READY}s}}
"""


@pytest.fixture(scope="module")
def kueue(cluster: LocalCluster) -> Iterator[KueueManager]:
    with running_kueue(cluster, wait_for_pods_ready=PODS_READY) as manager:
        yield manager


@pytest.fixture
async def queues(kit: Kit, kueue: KueueManager) -> AsyncIterator[str]:
    async with kueue_queues(kit, {"cpu": "64", "memory": "256Gi", GPU: "16"}):
        yield LOCAL_QUEUE


@pytest.fixture
async def agent(kit: Kit) -> AsyncIterator[AgentProcess]:
    async with running_agent(kit, CONFIG, "deploy/components/kueue/rbac.yaml") as process:
        yield process


async def conditions_seen(kit: Kit, seen: list[dict[str, Any]]) -> None:
    """Adds to `seen` every condition of the namespace's Workloads that is True now and not seen before."""
    for workload in await workloads(kit):
        seen += [c for c in (workload.get("status") or {}).get("conditions") or () if c.get("status") == "True"
                 and c not in seen]


async def both_nodes_full(kit: Kit, stream: asyncio.Task) -> None:
    """Waits until the stream's 1-GPU pods run on all 16 GPUs of the two nodes (FULL_BY seconds at most)."""
    deadline = time.monotonic() + FULL_BY
    while True:
        pods = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods?labelSelector=stream=small"))["items"]
        running = sum(1 for p in pods if p["spec"].get("nodeName") in GPU_NODES
                      and p.get("status", {}).get("phase") not in ("Succeeded", "Failed"))
        if running >= 8 * len(GPU_NODES):
            return
        assert time.monotonic() < deadline and not stream.done(), f"{running} 1-GPU pods run after {FULL_BY} s"
        await asyncio.sleep(0.2)


async def gpu_story(kit: Kit) -> tuple[float, float, float, list[dict[str, Any]]]:
    """Two 8-GPU nodes full of 1-GPU pods for STREAM seconds (their runtimes spread, SPREAD s); an 8-GPU Kueue Job
    created once all 16 GPUs run them. Returns (the Job's creation, the stream's end, the 8-GPU pod's bind time or
    inf, the Workload's conditions as polled: every one seen True)."""
    for name in GPU_NODES:
        await kit.create_node(name, {"cpu": "32", "memory": "128Gi", GPU: "8"})
    await spare_node(kit)
    stream = asyncio.create_task(stream_small_pods(kit, STREAM, keep_pending=4, gpus=1, spread=SPREAD))
    await both_nodes_full(kit, stream)
    created = time.time()
    await kit.raw("POST", f"/apis/batch/v1/namespaces/{kit.namespace}/jobs",
                  job_body("big", {"cpu": "4", "memory": "8Gi", GPU: "8"}, 1))
    seen: list[dict[str, Any]] = []
    bound = float("inf")
    while not stream.done():
        await conditions_seen(kit, seen)
        for pod in await job_pods(kit, "big"):
            at = scheduled_at(pod)
            if at is not None:
                bound = min(bound, at)
        await asyncio.sleep(0.5)
    await stream
    return created, time.time(), bound, seen


async def evicted_by(kit: Kit, seen: list[dict[str, Any]], deadline: float) -> dict[str, str | None]:
    """The Workload's conditions seen True, type -> reason, polled on until Kueue's eviction shows or `deadline`: Kueue
    evicts after PODS_READY from the admission plus its own requeue check, which a loaded machine (the whole suite on
    two cores) has pushed past the stream's end."""
    while True:
        kinds = {c["type"]: c.get("reason") for c in seen}
        if "Evicted" in kinds or time.time() > deadline:
            return kinds
        await asyncio.sleep(0.5)
        await conditions_seen(kit, seen)


async def test_without_reservoir_kueue_evicts_the_admitted_8_gpu_workload_it_could_not_place(
        kit: Kit, queues: str) -> None:
    _, stream_end, bound, seen = await gpu_story(kit)
    kinds = await evicted_by(kit, seen, time.time() + EVICTION_LATE)
    assert "Admitted" in kinds, kinds
    assert kinds.get("Evicted") == "PodsReadyTimeout", f"Kueue gave up on the Workload: {kinds}"
    assert bound > stream_end - 1, "kube-scheduler alone never placed the 8-GPU pod while the stream ran"


async def test_with_reservoir_the_8_gpu_workload_is_placed_before_kueue_gives_up(
        kit: Kit, queues: str, agent: AgentProcess) -> None:
    created, stream_end, bound, seen = await gpu_story(kit)
    kinds = {c["type"]: c.get("reason") for c in seen}
    assert bound < stream_end - 5, f"the 8-GPU pod bound at {bound}, the stream ended at {stream_end}: {kinds}\n" \
                                   f"{agent.log_text()[-3000:]}"
    assert "Evicted" not in kinds, f"Kueue evicted the Workload: {kinds}"
    assert condition((await workloads(kit))[0], "Admitted")
    assert bound - created < PODS_READY, "placed within Kueue's timeout of its admission"
