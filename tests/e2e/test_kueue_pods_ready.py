"""Issue 32, locks before Kueue gives up: Kueue's manager with `waitForPodsReady` (timeout PODS_READY seconds: an
admitted Workload whose pods are not all ready by then is evicted and requeued). Two 8-GPU nodes are kept busy by a
stream of 1-GPU pods (runtimes 3 to 7 s); an admitted Job of one 8-GPU pod waits for a whole node.
- kube-scheduler alone: the pod is not placed in time (not in half the timeout; at all, unless the stream's refills lag),
  and Kueue evicts the Workload (PodsReadyTimeout);
- with Reservoir, `starvingJobTimeThreshold` 10m (far past the timeout) and `kueue.podsReadyTimeout` set to Kueue's: the
  Workload's job starves after half the timeout, a node is locked and drains, the pod is placed and Ready before Kueue
  gives up, and the Workload is never evicted."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.cluster import LocalCluster
from localcluster.kueue_process import KueueManager
from tests.e2e.kit import Kit
from tests.e2e.kueue_scenarios import LOCAL_QUEUE, condition, job_body, job_pods, kueue_queues, running_kueue, workloads
from tests.e2e.scenarios import GPU, running_agent, scheduled_at, spare_node, stream_fills, stream_small_pods

PODS_READY = 40  # Kueue's waitForPodsReady timeout, seconds
STREAM = 70  # seconds of 1-GPU pods: past the timeout, with room for Kueue to act
EVICTION_LATE = 30  # seconds past STREAM that kube-scheduler alone's story streams on, waiting for Kueue's eviction
GPU_NODES = ("gpu-a", "gpu-b")  # two 8-GPU nodes
SPREAD = 4  # seconds: the 1-GPU pods run 3 to 7 s, so a node's pods do not all end at once (CI once saw them do so)

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


async def gpu_story(kit: Kit, *, until_evicted: bool = False) -> tuple[float, float, float, list[dict[str, Any]]]:
    """Two 8-GPU nodes full of 1-GPU pods for STREAM seconds (their runtimes spread, SPREAD s); an 8-GPU Kueue Job
    created once all 16 GPUs run them. With `until_evicted`, the stream goes on until the Workload is seen Evicted,
    EVICTION_LATE seconds more at most: Kueue evicts PODS_READY after the admission plus its own requeue check, which
    a loaded machine (the whole suite on two cores) has pushed past STREAM, and a node the stream left would let the
    pod on before it. Returns (the Job's creation, the stream's end, the 8-GPU pod's bind time or inf, the Workload's
    conditions as polled: every one seen True)."""
    for name in GPU_NODES:
        await kit.create_node(name, {"cpu": "32", "memory": "128Gi", GPU: "8"})
    await spare_node(kit)
    seconds = STREAM + (EVICTION_LATE if until_evicted else 0)
    stream = asyncio.create_task(stream_small_pods(kit, seconds, keep_pending=4, gpus=1, spread=SPREAD))
    await stream_fills(kit, stream, GPU_NODES, 8 * len(GPU_NODES))
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
        if until_evicted and any(c["type"] == "Evicted" for c in seen):
            stream.cancel()
            break
        await asyncio.sleep(0.5)
    with contextlib.suppress(asyncio.CancelledError):
        await stream
    return created, time.time(), bound, seen


async def test_without_reservoir_kueue_evicts_the_admitted_8_gpu_workload_it_could_not_place(
        kit: Kit, queues: str) -> None:
    created, _, bound, seen = await gpu_story(kit, until_evicted=True)
    kinds = {c["type"]: c.get("reason") for c in seen}
    assert "Admitted" in kinds, kinds
    assert kinds.get("Evicted") == "PodsReadyTimeout", \
        f"Kueue gave up on the Workload: {kinds}; the 8-GPU pod bound {bound - created:.1f} s after the Job was made"
    # Not "never placed": on a loaded machine (the whole suite on two cores) the stream's refills lag, a node's pods
    # can all end before new ones bind, and kube-scheduler alone then places the pod; CI saw it 37 s after the
    # admission, too late for Kueue all the same. What kube-scheduler alone cannot do is place it in time.
    assert bound - created > PODS_READY / 2, \
        f"kube-scheduler alone placed the 8-GPU pod {bound - created:.1f} s after the Job was made, before Reservoir " \
        f"would have locked a node for it (half of Kueue's {PODS_READY}-s timeout)"


async def test_with_reservoir_the_8_gpu_workload_is_placed_before_kueue_gives_up(
        kit: Kit, queues: str, agent: AgentProcess) -> None:
    created, stream_end, bound, seen = await gpu_story(kit)
    kinds = {c["type"]: c.get("reason") for c in seen}
    assert bound < stream_end - 5, f"the 8-GPU pod bound at {bound}, the stream ended at {stream_end}: {kinds}\n" \
                                   f"{agent.log_text()[-3000:]}"
    assert "Evicted" not in kinds, f"Kueue evicted the Workload: {kinds}"
    assert condition((await workloads(kit))[0], "Admitted")
    assert bound - created < PODS_READY, "placed within Kueue's timeout of its admission"
