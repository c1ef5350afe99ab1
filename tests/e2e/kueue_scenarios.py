"""What the Kueue stories share (tests/e2e/test_kueue*.py): Kueue's manager run for a module, a ClusterQueue with
quota and a LocalQueue for a test, Jobs as Kueue users write them. Test modules import these from here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from localcluster import binaries
from localcluster.cluster import COMPLETE_AFTER, LocalCluster
from localcluster.kueue_process import API_VERSION, KueueManager
from shared import keys
from tests.conftest import unavailable
from tests.e2e.kit import Kit

KUEUE = f"/apis/{API_VERSION}"
LOCAL_QUEUE = "lq"


@contextmanager
def running_kueue(cluster: LocalCluster, **options: Any) -> Iterator[KueueManager]:
    """Kueue's manager (KueueManager `options`) installed and running; stopped, its webhooks removed, after (its CRDs
    stay installed)."""
    if binaries.kueue_missing():
        unavailable(f"Kueue is not built in {binaries.kueue_dir()}: run `make cluster-bin`")
    manager = KueueManager(cluster, **options)
    try:
        manager.install()
        manager.start()
        yield manager
    finally:
        manager.stop()


@asynccontextmanager
async def kueue_queues(kit: Kit, quota: Mapping[str, str]) -> AsyncIterator[str]:
    """A ResourceFlavor, a ClusterQueue with `quota` for the test's namespace alone and a LocalQueue in it: yields the
    ClusterQueue's name; the Jobs and queues are deleted after."""
    cluster_queue = f"cq-{kit.namespace}"[:63]
    await kit.raw("POST", f"{KUEUE}/resourceflavors", {"apiVersion": API_VERSION, "kind": "ResourceFlavor",
                                                       "metadata": {"name": cluster_queue}})
    await kit.raw("POST", f"{KUEUE}/clusterqueues", {
        "apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kit.namespace}},
                 "resourceGroups": [{"coveredResources": list(quota), "flavors": [{
                     "name": cluster_queue,
                     "resources": [{"name": name, "nominalQuota": value} for name, value in quota.items()]}]}]}})
    await kit.raw("POST", f"{KUEUE}/namespaces/{kit.namespace}/localqueues", {
        "apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE, "namespace": kit.namespace},
        "spec": {"clusterQueue": cluster_queue}})
    try:
        yield cluster_queue
    finally:
        await kit.attempt("DELETE", f"/apis/batch/v1/namespaces/{kit.namespace}/jobs?propagationPolicy=Background")
        await kit.attempt("DELETE", f"{KUEUE}/namespaces/{kit.namespace}/localqueues/{LOCAL_QUEUE}")
        await kit.attempt("DELETE", f"{KUEUE}/clusterqueues/{cluster_queue}")
        await kit.attempt("DELETE", f"{KUEUE}/resourceflavors/{cluster_queue}")


def job_body(name: str, requests: Mapping[str, str], count: int, runs: str = "600s",
             queue: str = LOCAL_QUEUE) -> dict[str, Any]:
    """A `batch/v1` Job as a Kueue user writes it: `kueue.x-k8s.io/queue-name`, `count` pods of `requests` each (an
    extended resource's limit set equal, as the API requires)."""
    resources: dict[str, Any] = {"requests": dict(requests)}
    extended = {name: value for name, value in requests.items() if "/" in name}
    if extended:
        resources["limits"] = extended
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {keys.KUEUE_QUEUE_NAME: queue}},
            "spec": {"parallelism": count, "completions": count, "backoffLimit": 0, "template": {
                "metadata": {"annotations": {COMPLETE_AFTER: runs}},
                "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [{
                    "name": "main", "image": "registry.invalid/job:1", "resources": resources}]}}}}


async def workloads(kit: Kit) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await kit.raw("GET", f"{KUEUE}/namespaces/{kit.namespace}/workloads"))["items"]
    return items


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The object's status condition of type `kind` when True, else None."""
    return next((c for c in (obj.get("status") or {}).get("conditions") or ()
                 if c.get("type") == kind and c.get("status") == "True"), None)


async def job_pods(kit: Kit, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await kit.raw(
        "GET", f"/api/v1/namespaces/{kit.namespace}/pods?labelSelector=job-name={job}"))["items"]
    return items
