"""Proof that the local control plane is real: kube-scheduler places, kwok runs and finishes pods, taints are
honoured, and the CRDs accept PodGroups and Queues (issue: foundation, section 4)."""

from __future__ import annotations

import subprocess

from localcluster import binaries
from localcluster.cluster import COMPLETE_AFTER
from shared import keys
from tests.e2e.kit import Kit, apply_setup

CPU4 = {"cpu": "4", "memory": "8Gi"}


def _scheduled_on(pod: dict) -> str:
    return pod["spec"].get("nodeName", "")


def _running(pod: dict) -> bool:
    return pod.get("status", {}).get("phase") == "Running"


def test_binaries_report_pinned_versions() -> None:
    pinned = binaries.versions()
    out = subprocess.run([str(binaries.bin_dir() / "kube-apiserver"), "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == f"Kubernetes {pinned['KUBERNETES_VERSION']}"
    out = subprocess.run([str(binaries.bin_dir() / "etcd"), "--version"], capture_output=True, text=True)
    assert f"etcd Version: {pinned['ETCD_VERSION'].lstrip('v')}" in out.stdout
    out = subprocess.run([str(binaries.bin_dir() / "kwok"), "--version"], capture_output=True, text=True)
    assert pinned["KWOK_VERSION"] in out.stdout + out.stderr


async def test_control_plane_serves_the_selected_kubernetes_version(kit: Kit) -> None:
    """RESERVOIR_KUBERNETES=oldest (make e2e-oldest) really runs the suite against the oldest supported minor."""
    served = await kit.raw("GET", "/version")
    assert served["gitVersion"] == binaries.versions()["KUBERNETES_VERSION"], served


async def test_scheduler_places_and_kwok_runs_pods(kit: Kit) -> None:
    await kit.create_node("harness-a", CPU4)
    await kit.create_node("harness-b", CPU4)

    await kit.create_pod("first", {"cpu": "1"})
    first = await kit.wait_pod("first", _running, "Running")
    assert _scheduled_on(first) in {"harness-a", "harness-b"}
    assert first["status"]["podIP"]


async def test_lock_taint_keeps_other_pods_off_and_lets_tolerating_pods_on(kit: Kit) -> None:
    await kit.create_node("harness-a", CPU4)
    await kit.create_node("harness-b", CPU4)
    await kit.patch_node("harness-a", [
        {"op": "add", "path": "/spec/taints", "value": [{"key": keys.LOCK, "value": "x", "effect": keys.LOCK_EFFECT}]}
    ])

    for i in range(4):
        await kit.create_pod(f"plain-{i}", {"cpu": "500m"})
    for i in range(4):
        pod = await kit.wait_pod(f"plain-{i}", _running, "Running")
        assert _scheduled_on(pod) == "harness-b", f"plain-{i} landed on the locked node"

    toleration = {"key": keys.LOCK, "operator": "Equal", "value": "x", "effect": keys.LOCK_EFFECT}
    await kit.create_pod("tolerating", {"cpu": "500m"}, tolerations=[toleration],
                         extra_spec={"nodeSelector": {"kubernetes.io/hostname": "harness-a"}})
    pod = await kit.wait_pod("tolerating", _running, "Running")
    assert _scheduled_on(pod) == "harness-a"

    # The opposite: the same pod without the toleration stays Pending with the taint named in its condition.
    await kit.create_pod("not-tolerating", {"cpu": "500m"},
                         extra_spec={"nodeSelector": {"kubernetes.io/hostname": "harness-a"}})

    def unschedulable(pod: dict) -> bool:
        conditions = pod.get("status", {}).get("conditions") or []
        # kube-scheduler 1.36 says "1 node(s) had untolerated taint(s)" without naming the key.
        return any(c.get("reason") == "Unschedulable" and "untolerated taint" in c.get("message", "")
                   for c in conditions)

    pod = await kit.wait_pod("not-tolerating", unschedulable, "Unschedulable because of the lock taint")
    assert not _scheduled_on(pod)


async def test_pod_with_run_duration_succeeds_after_it(kit: Kit) -> None:
    await kit.create_node("harness-a", CPU4)
    await kit.create_pod("short", {"cpu": "1"}, annotations={COMPLETE_AFTER: "2s"})
    running = await kit.wait_pod("short", _running, "Running")
    done = await kit.wait_pod("short", lambda p: p.get("status", {}).get("phase") == "Succeeded", "Succeeded")
    started = running["status"]["startTime"]
    finished = done["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
    from shared.timestamps import parse_time
    elapsed = (parse_time(finished) - parse_time(started)).total_seconds()
    # ran its 2 s (whole-second stamps: 1 s at the least); how much longer a busy machine takes is no behaviour
    assert elapsed >= 1.0, elapsed

    # A finished pod frees its resources: a pod needing the whole node is bound afterwards.
    await kit.create_pod("whole-node", {"cpu": "4"})
    pod = await kit.wait_pod("whole-node", _running, "Running")
    assert _scheduled_on(pod) == "harness-a"


async def test_podgroup_and_queue_round_trip_through_the_crds(kit: Kit) -> None:
    await apply_setup(kit, "deploy/crds/scheduling.volcano.sh_queues.yaml",
                      "deploy/crds/scheduling.volcano.sh_podgroups.yaml", "deploy/crds/reservoir.sh_reservations.yaml")

    queue_name = f"q-{kit.namespace}"[:63]
    queue = {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": queue_name},
        "spec": {"weight": 2, "priorityClassName": "high", "capability": {"cpu": "8"},
                 "guarantee": {"policy": "Guaranteed", "percentage": {"dimensions": ["cpu"], "value": 0.25},
                               "resource": {"cpu": "2", "memory": "4Gi"}},
                 "someVolcanoField": {"kept": True}},
    }
    await kit.custom.create_cluster_custom_object(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, keys.QUEUE_PLURAL, queue)
    try:
        back = await kit.raw("GET", f"/apis/scheduling.volcano.sh/v1beta1/queues/{queue_name}")
        assert back["spec"]["guarantee"]["resource"] == {"cpu": "2", "memory": "4Gi"}
        assert back["spec"]["guarantee"]["percentage"]["value"] == 0.25
        assert back["spec"]["someVolcanoField"] == {"kept": True}
        status = {"status": {"reservation": {"nodes": ["n1"], "resource": {"cpu": "2"}}}}
        await kit.raw("PATCH", f"/apis/scheduling.volcano.sh/v1beta1/queues/{queue_name}/status", body=status,
                      content_type="application/merge-patch+json")
        back = await kit.raw("GET", f"/apis/scheduling.volcano.sh/v1beta1/queues/{queue_name}")
        assert back["status"]["reservation"]["nodes"] == ["n1"]

        bad = dict(queue, metadata={"name": queue_name + "-bad"})
        bad["spec"] = {"guarantee": {"policy": "Sometimes"}}
        response = await kit.attempt("POST", "/apis/scheduling.volcano.sh/v1beta1/queues", body=bad)
        assert response["kind"] == "Status" and response["code"] == 422, response
        assert "spec.guarantee.policy" in response["message"]
    finally:
        await kit.custom.delete_cluster_custom_object(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, keys.QUEUE_PLURAL,
                                                      queue_name)

    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "pg", "namespace": kit.namespace,
                     "annotations": {keys.RESERVEABLE: "true", keys.MAXIMUM_RUNTIME: "2h30m"}},
        "spec": {"minMember": 3, "queue": queue_name, "priorityClassName": "high"},
    }
    await kit.custom.create_namespaced_custom_object(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, kit.namespace,
                                                     keys.PODGROUP_PLURAL, group)
    back = await kit.raw("GET", f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{kit.namespace}/podgroups/pg")
    from shared.views import PodGroupView
    view = PodGroupView.from_obj(back)
    assert (view.min_member, view.queue, view.annotations[keys.MAXIMUM_RUNTIME]) == (3, queue_name, "2h30m")
