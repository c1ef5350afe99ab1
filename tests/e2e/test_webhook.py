"""The webhook end to end: a real `reservoir webhook` process, registered by the real webhook configurations,
running as its ServiceAccount (impersonated: a missing RBAC permission fails here), in front of a real
kube-apiserver whose Priority admission plugin re-validates what the webhook sets."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared import keys
from shared.ownership import JobRef, queue_owner_id
from tests.e2e.kit import Kit, apply_setup, running_webhook
from localcluster.webhook_process import WebhookProcess

SETUP = ("deploy/crds/scheduling.volcano.sh_queues.yaml", "deploy/crds/scheduling.volcano.sh_podgroups.yaml",
         "deploy/crds/reservoir.sh_reservations.yaml", "deploy/namespace.yaml", "deploy/webhook-rbac.yaml")
VOLCANO = f"/apis/{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"


@pytest.fixture
async def webhook(kit: Kit) -> AsyncIterator[WebhookProcess]:
    await apply_setup(kit, *SETUP)
    async with running_webhook(kit) as process:
        yield process


async def _priority_class(kit: Kit, name: str, value: int, global_default: bool = False) -> None:
    await kit.server_side_apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                 "metadata": {"name": name}, "value": value, "globalDefault": global_default})


async def _queue(kit: Kit, name: str, priority_class: str) -> None:
    await kit.server_side_apply({"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
                                 "metadata": {"name": name}, "spec": {"weight": 1, "priorityClassName": priority_class}})


async def _dry_run_pod(kit: Kit, body: dict) -> dict:
    return await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods?dryRun=All", body=body)


async def _until_webhook_sees(kit: Kit, body: dict, check, what: str) -> None:
    """The webhook reads watch caches: wait (with dry-run creates, which pass through admission and persist
    nothing) until the objects the test just made are visible to it."""
    async def probe():
        return check(await _dry_run_pod(kit, body))
    await kit.wait_for(probe, what=what, timeout=30)


async def test_pod_comes_back_mutated_with_inherited_priority(kit: Kit, webhook: WebhookProcess) -> None:
    queue = f"research-{kit.namespace}"[:60]
    await _priority_class(kit, "e2e-research-high", 1000)
    await _queue(kit, queue, "e2e-research-high")
    await kit.custom.create_namespaced_custom_object(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, kit.namespace,
                                                     keys.PODGROUP_PLURAL, {
        "apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "PodGroup",
        "metadata": {"name": "train", "annotations": {keys.RESERVEABLE: "true", keys.MAXIMUM_RUNTIME: "2h"}},
        "spec": {"minMember": 1, "queue": queue}})
    body = kit.pod_body("train-0", {"cpu": "1"}, annotations={keys.GROUP_NAME: "train"})
    await _until_webhook_sees(kit, body, lambda p: (p["metadata"].get("annotations") or {}).get(keys.RESERVEABLE),
                              "the webhook to see PodGroup train")
    await kit.create_node("wh-node", {"cpu": "4", "memory": "8Gi"})
    pod = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods", body=body)
    assert pod.get("kind") == "Pod", pod

    annotations = pod["metadata"]["annotations"]
    assert annotations[keys.RESERVEABLE] == "true" and annotations[keys.MAXIMUM_RUNTIME] == "2h"
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == ("e2e-research-high", 1000)
    owners = {t.get("value") for t in pod["spec"]["tolerations"] if t.get("key") == keys.LOCK}
    assert {JobRef(kit.namespace, "PodGroup", "train").owner_id, queue_owner_id(queue)} <= owners
    preferred = pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["weight"] == 100
    # and kube-scheduler still places it
    running = await kit.wait_pod("train-0", lambda p: p.get("status", {}).get("phase") == "Running", "Running")
    assert running["spec"]["nodeName"] == "wh-node"


async def test_global_default_class_counts_as_no_class(kit: Kit, webhook: WebhookProcess) -> None:
    queue = f"q-{kit.namespace}"[:60]
    await _priority_class(kit, "e2e-queue-class", 500)
    await _priority_class(kit, "e2e-global-default", 7, global_default=True)
    try:
        await _queue(kit, queue, "e2e-queue-class")
        in_queue = kit.pod_body("in-queue", {"cpu": "100m"}, annotations={keys.QUEUE_NAME: queue})
        await _until_webhook_sees(kit, in_queue, lambda p: p["spec"].get("priorityClassName") == "e2e-queue-class",
                                  "the webhook to see the queue and its class")
        pod = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods", body=in_queue)
        assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == ("e2e-queue-class", 500), pod
        # without the webhook's class the apiserver's Priority plugin would have given the globalDefault:
        plain = await kit.create_pod("no-queue", {"cpu": "100m"})
        assert (plain["spec"]["priorityClassName"], plain["spec"]["priority"]) == ("e2e-global-default", 7)
    finally:
        await kit.raw("DELETE", "/apis/scheduling.k8s.io/v1/priorityclasses/e2e-global-default")


async def test_invalid_queue_guarantee_is_refused_with_the_webhook_message(kit: Kit, webhook: WebhookProcess) -> None:
    body = {"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
            "metadata": {"name": f"greedy-{kit.namespace}"[:60]},
            "spec": {"capability": {"cpu": "4"}, "guarantee": {"resource": {"cpu": "8"}}}}
    answer = await kit.attempt("POST", f"{VOLCANO}/queues", body=body)
    assert answer["kind"] == "Status" and answer["status"] == "Failure", answer
    assert "queues.validate.reservoir.sh" in answer["message"]
    assert "spec.guarantee.resource.cpu (8) exceeds spec.capability.cpu (4)" in answer["message"]


async def test_queue_guarantee_larger_than_the_cluster_is_refused(kit: Kit, webhook: WebhookProcess) -> None:
    await kit.create_node("wh-1", {"cpu": "4", "memory": "16Gi"})
    body = {"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
            "metadata": {"name": f"huge-{kit.namespace}"[:60]}, "spec": {"guarantee": {"resource": {"cpu": "100"}}}}
    # the webhook's node cache sees the new node within moments; until then it cannot judge and lets it pass
    async def refused() -> dict | None:
        answer = await kit.attempt("POST", f"{VOLCANO}/queues", body=body)
        if answer.get("kind") == "Queue":
            await kit.raw("DELETE", f"{VOLCANO}/queues/{body['metadata']['name']}")
            return None
        return answer
    answer = await kit.wait_for(refused, what="the oversize guarantee refused", timeout=20)
    assert answer["status"] == "Failure" and "spec.guarantee.resource.cpu (100) is more than the cluster" in answer["message"]


async def test_invalid_reservoir_configmap_is_refused(kit: Kit, webhook: WebhookProcess) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.NAMESPACE},
            "data": {keys.CONFIG_KEY: "maxLockedNodePercent: 150\n"}}
    answer = await kit.attempt("POST", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps", body=body)
    assert answer["kind"] == "Status" and answer["code"] in (400, 422), answer
    assert "maxLockedNodePercent" in answer["message"] and "150" in answer["message"]
    body["data"][keys.CONFIG_KEY] = "maxLockedNodePercent: 40\n"
    created = await kit.raw("POST", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps", body=body)
    try:
        assert created["kind"] == "ConfigMap", created
    finally:
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")


async def test_pod_creation_fails_open_when_the_webhook_is_down(kit: Kit, webhook: WebhookProcess) -> None:
    webhook.stop(remove_files=True)
    await kit.create_node("fo-node", {"cpu": "2", "memory": "4Gi"})
    pod = await kit.create_pod("still-created", {"cpu": "100m"})
    assert pod.get("kind") == "Pod", pod
    assert not any(t.get("key") == keys.LOCK for t in pod["spec"].get("tolerations", []))
    await kit.wait_pod("still-created", lambda p: p.get("status", {}).get("phase") == "Running", "Running")


async def test_certs_command_injects_ca_bundle_and_writes_secret(kit: Kit, webhook: WebhookProcess, tmp_path) -> None:
    import base64
    import subprocess
    import sys

    from tests.e2e.kit import REPO
    out = subprocess.run(
        [sys.executable, "-m", "reservoir.cli", "certs", f"--out-dir={tmp_path}", "--ip=127.0.0.1", "--inject=reservoir",
         "--secret=reservoir-webhook-tls", f"--kubeconfig={kit.cluster.kubeconfig}"],
        capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "caBundle injected into MutatingWebhookConfiguration/reservoir" in out.stdout
    bundle = base64.b64encode((tmp_path / "ca-bundle.crt").read_bytes()).decode()
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        config = await kit.raw("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}/reservoir")
        assert {hook["clientConfig"]["caBundle"] for hook in config["webhooks"]} == {bundle}
    secret = await kit.raw("GET", f"/api/v1/namespaces/{keys.NAMESPACE}/secrets/reservoir-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(secret["data"]["tls.crt"]) == (tmp_path / "tls.crt").read_bytes()
