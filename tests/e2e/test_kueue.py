"""Kueue on the real control plane: Kueue's own manager, built from the module version localcluster/versions.env pins,
with its CRDs, its webhooks and its certificate management (localcluster/kueue_process.py), against the local
control plane of either supported Kubernetes version."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from localcluster import binaries
from localcluster.cluster import COMPLETE_AFTER, LocalCluster
from localcluster.kueue_process import API_VERSION, KueueManager
from tests.conftest import unavailable
from tests.e2e.kit import Kit

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
