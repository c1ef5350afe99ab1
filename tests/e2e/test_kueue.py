"""Kueue on the real control plane: Kueue's own manager, built from the module version localcluster/versions.env pins,
with its CRDs, its webhooks and its certificate management (localcluster/kueue_process.py), against the local
control plane of either supported Kubernetes version."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from localcluster import binaries
from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER, LocalCluster
from localcluster.kueue_process import API_VERSION, KueueManager
from shared import keys
from shared.ownership import JobRef
from tests.conftest import unavailable
from tests.e2e.kit import Kit, apply_setup
from tests.e2e.scenarios import (
    SETUP,
    STARVATION_CONFIG,
    STREAM_SECONDS,
    configure,
    scheduled_at,
    spare_node,
    stream_small_pods,
)

KUEUE = f"/apis/{API_VERSION}"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"


@pytest.fixture(scope="module")
def kueue(cluster: LocalCluster) -> Iterator[KueueManager]:
    """One Kueue manager for the module, its webhooks removed when it stops (its CRDs stay installed)."""
    if binaries.kueue_missing():
        unavailable(f"Kueue is not built in {binaries.kueue_dir()}: run `make cluster-bin`")
    manager = KueueManager(cluster)
    try:
        manager.install()
        manager.start()
        yield manager
    finally:
        manager.stop()


@pytest.fixture
async def queues(kit: Kit, kueue: KueueManager) -> AsyncIterator[str]:
    """A ResourceFlavor, a ClusterQueue with quota for the test's namespace and a LocalQueue in it: yields the
    LocalQueue's name; the cluster-scoped objects are deleted after."""
    cluster_queue = f"cq-{kit.namespace}"[:63]
    await kit.raw("POST", f"{KUEUE}/resourceflavors", {"apiVersion": API_VERSION, "kind": "ResourceFlavor",
                                                       "metadata": {"name": cluster_queue}})
    await kit.raw("POST", f"{KUEUE}/clusterqueues", {
        "apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kit.namespace}},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                     "name": cluster_queue, "resources": [{"name": "cpu", "nominalQuota": "16"},
                                                          {"name": "memory", "nominalQuota": "64Gi"}]}]}]}})
    await kit.raw("POST", f"{KUEUE}/namespaces/{kit.namespace}/localqueues", {
        "apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": {"name": "lq", "namespace": kit.namespace},
        "spec": {"clusterQueue": cluster_queue}})
    try:
        yield "lq"
    finally:
        await kit.attempt("DELETE", f"/apis/batch/v1/namespaces/{kit.namespace}/jobs?propagationPolicy=Background")
        await kit.attempt("DELETE", f"{KUEUE}/namespaces/{kit.namespace}/localqueues/lq")
        await kit.attempt("DELETE", f"{KUEUE}/clusterqueues/{cluster_queue}")
        await kit.attempt("DELETE", f"{KUEUE}/resourceflavors/{cluster_queue}")


def job_body(name: str, queue: str, cpu: str, count: int, runs: str = "600s") -> dict[str, Any]:
    """A `batch/v1` Job as a Kueue user writes it: `kueue.x-k8s.io/queue-name`, `count` pods of `cpu` each."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
            "spec": {"parallelism": count, "completions": count, "template": {
                "metadata": {"annotations": {COMPLETE_AFTER: runs}},
                "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [{
                    "name": "main", "image": "registry.invalid/job:1",
                    "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}}}


async def test_kueue_admits_a_job_and_its_pods_name_their_workload(kit: Kit, queues: str) -> None:
    """Kueue's webhook suspends the Job at creation, its manager makes the Workload, admits it against the
    ClusterQueue's quota and lets the Job run: its pods name the Workload (the annotation Reservoir reads) and are
    placed by kube-scheduler."""
    await kit.create_node("kueue-node", {"cpu": "8", "memory": "32Gi"})
    job = await kit.raw("POST", f"/apis/batch/v1/namespaces/{kit.namespace}/jobs", job_body("train", queues, "1", 2))
    assert job["spec"]["suspend"] is True, "Kueue's webhook suspends a queued Job at creation"

    async def admitted() -> dict[str, Any] | None:
        items = (await kit.raw("GET", f"{KUEUE}/namespaces/{kit.namespace}/workloads"))["items"]
        return next((w for w in items if any(c["type"] == "Admitted" and c["status"] == "True"
                                             for c in w.get("status", {}).get("conditions", ()))), None)

    workload = await kit.wait_for(admitted, what="the Job's Workload admitted", timeout=60)
    assert workload["status"]["admission"]["clusterQueue"].startswith("cq-")

    async def placed() -> list[dict[str, Any]] | None:
        pods = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
        return pods if len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = await kit.wait_for(placed, what="the Job's two pods placed", timeout=60)
    assert {p["metadata"]["annotations"].get(WORKLOAD_ANNOTATION) for p in pods} == {workload["metadata"]["name"]}


# --- seed 000's story with a Kueue Job: Reservoir off, then on ---

KUEUE_STARVATION = STARVATION_CONFIG + "kueue: {workloads: true}\n"


@pytest.fixture
async def agent(kit: Kit) -> AsyncIterator[AgentProcess]:
    """The agent as its ServiceAccount, with deploy/components/kueue's RBAC and `kueue.workloads` on."""
    await apply_setup(kit, *SETUP, "deploy/components/kueue/rbac.yaml")
    await configure(kit, KUEUE_STARVATION)
    process = AgentProcess(kit.cluster)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")


async def job_pods(kit: Kit, job: str) -> list[dict[str, Any]]:
    return (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods?labelSelector=job-name={job}"))["items"]


async def kueue_story(kit: Kit, queue: str) -> tuple[float, float, dict[str, Any]]:
    """Seed 000 with Kueue: small pods keep a 4-cpu node full; a Kueue Job of one 4-cpu pod is admitted at once (its
    ClusterQueue has quota) and its pod waits for the node. Returns (stream end, the big pod's bind time or inf, the
    Workload)."""
    await kit.create_node("starve-node", {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    stream = asyncio.create_task(stream_small_pods(kit, STREAM_SECONDS))
    await asyncio.sleep(3)  # the node is full of small pods
    await kit.raw("POST", f"/apis/batch/v1/namespaces/{kit.namespace}/jobs", job_body("big", queue, "4", 1))
    await stream
    stream_end = time.time()
    await asyncio.sleep(1)
    [workload] = (await kit.raw("GET", f"{KUEUE}/namespaces/{kit.namespace}/workloads"))["items"]
    [big] = await job_pods(kit, "big")
    bound = scheduled_at(big)
    return stream_end, bound if bound is not None else float("inf"), workload


async def test_without_reservoir_an_admitted_kueue_job_waits_for_the_stream_to_end(kit: Kit, queues: str) -> None:
    stream_end, big_bound, workload = await kueue_story(kit, queues)
    assert any(c["type"] == "Admitted" and c["status"] == "True" for c in workload["status"]["conditions"])
    assert big_bound > stream_end - 1, "kube-scheduler alone leaves the admitted Job's pod waiting as the stream runs"


async def test_with_reservoir_the_admitted_kueue_job_gets_its_node_locked_for_its_workload(
        kit: Kit, queues: str, agent: AgentProcess) -> None:
    stream_end, big_bound, workload = await kueue_story(kit, queues)
    owner = JobRef(kit.namespace, "Workload", workload["metadata"]["name"])
    assert big_bound < stream_end - 5, f"the big pod bound at {big_bound}, the stream ended at {stream_end}:\n" \
                                       f"{agent.log_text()[-3000:]}"
    events = (await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=starve-node"))
    locked = [e["message"] for e in events["items"] if e["reason"] == "NodeLocked"]
    assert any(owner.full_name in message for message in locked), locked
