"""Issue 10, a poisoned cluster: with the webhooks not registered (so nothing refuses them), each poison object of
items 6 and 7 is created through the API server; then the webhook and the agent start. Both become ready, the agent
leads, releases the lock of the node whose annotation is malformed, locks a node for a starving pod and releases it
once the pod is bound, and both name the objects they skipped.

The tightened PodGroup CRD (and the Queue CRD's quantity patterns) would refuse some of these objects, and the point
is a cluster where they already exist: so the test first installs permissive versions of those two CRDs (the
repository's, with `x-kubernetes-preserve-unknown-fields` on spec and no patterns, as the CRDs were before), creates
the poison, and puts the repository's CRDs back at the end. It also checks that the tightened PodGroup CRD refuses
`banana`, `1e1.5` and undeclared fields."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER, free_port
from localcluster.webhook_process import WebhookProcess
from shared import keys
from shared.ownership import JobRef
from shared.watchcache import parse_json
from tests.e2e.kit import REPO, Kit, apply_setup
from tests.e2e.scenarios import SETUP, configure

PODGROUP_CRD = "deploy/crds/scheduling.volcano.sh_podgroups.yaml"
QUEUE_CRD = "deploy/crds/scheduling.volcano.sh_queues.yaml"
VOLCANO = f"/apis/{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"
RESERVATIONS = f"/apis/{keys.RESERVATION_GROUP}/{keys.RESERVATION_VERSION}/{keys.RESERVATION_PLURAL}"
CONFIG = """
starvation: {starvingJobTimeThreshold: 3s, reservedNodePercent: 90, maxLockDuration: 10m}
maxLockedNodePercent: 90
resyncPeriod: 2s
debounce: 200ms
"""
DEPTH = 1000


def _loosened(schema: Any) -> Any:
    """`schema` without its patterns and length limits."""
    if isinstance(schema, dict):
        return {k: _loosened(v) for k, v in schema.items() if k not in ("pattern", "maxLength")}
    if isinstance(schema, list):
        return [_loosened(v) for v in schema]
    return schema


def crd_of(path: str) -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / path).read_text()))


def permissive(path: str) -> dict[str, Any]:
    """The repository's CRD as it was before issue 10: spec keeps unknown fields, quantities have no pattern."""
    crd = copy.deepcopy(crd_of(path))
    for version in crd["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec.update(_loosened(spec))
        spec["x-kubernetes-preserve-unknown-fields"] = True
    return crd


async def install(kit: Kit, crd: dict[str, Any]) -> None:
    await kit.server_side_apply(crd)
    name = crd["metadata"]["name"]

    async def established() -> bool:
        got = await kit.raw("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(c["type"] == "Established" and c["status"] == "True"  # (conditions are null at first)
                   for c in (got.get("status") or {}).get("conditions") or [])
    await kit.wait_for(established, what=f"CRD {name} Established")


async def post_text(kit: Kit, path: str, text: str) -> Any:
    """POST a body too deep for json.dumps (as YAML, a superset of JSON); the answer read by the parser the caches use
    (yaml and json.loads would both meet the recursion limit)."""
    response = await kit.api.call_api(
        path, "POST", body=text.encode(), header_params={"Content-Type": "application/yaml",
                                                         "Accept": "application/json"},
        auth_settings=["BearerToken"], _preload_content=False, response_types_map={})
    raw = response[0] if isinstance(response, tuple) else response
    return parse_json(await raw.read())


async def create(kit: Kit, path: str, body: dict[str, Any] | str, what: str) -> dict[str, Any]:
    """POST until the API server accepts it (a CRD just changed takes a moment to serve its new schema)."""
    async def created() -> dict[str, Any] | None:
        answer = await (post_text(kit, path, body) if isinstance(body, str) else kit.attempt("POST", path, body=body))
        return answer if answer and answer.get("kind") != "Status" else None
    return await kit.wait_for(created, what=f"{what} accepted by the API server", timeout=20)


def podgroup(kit: Kit, name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": kit.namespace}, "spec": {"minMember": 1, **spec}}


def reservation(name: str, owners: list[Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{keys.RESERVATION_GROUP}/{keys.RESERVATION_VERSION}", "kind": "Reservation",
            "metadata": {"name": name},
            "spec": {"owners": owners, "template": {"spec": {
                "nodeSelector": {"reservoir-test/nowhere": "true"},  # never placed: it takes no lock
                "containers": [{"name": "r", "resources": {"requests": {"cpu": "1"}}}]}}, **spec}}


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


@pytest.fixture
async def poisoned(kit: Kit) -> AsyncIterator[dict[str, str]]:
    """The cluster with every poison object in it; cleaned up (and the repository's CRDs back) afterwards."""
    for path in SETUP:
        if "/crds/" in path:
            await install(kit, crd_of(path))
    await apply_setup(kit, *(path for path in SETUP if "/crds/" not in path), "deploy/webhook-rbac.yaml")
    await configure(kit, CONFIG)
    tag = kit.namespace[-5:]
    names = {"queue": f"poison-banana-{tag}", "ttl": f"poison-ttl-{tag}", "owners": f"poison-owners-{tag}"}
    try:
        # the tightened PodGroup CRD refuses what a tenant used to be able to store
        for bad in ({"minResources": {"cpu": "banana"}}, {"minResources": {"cpu": "1e1.5"}}, {"junk": {"a": 1}}):
            answer = await kit.attempt("POST", f"{VOLCANO}/namespaces/{kit.namespace}/podgroups",
                                   body=podgroup(kit, "refused", **bad))
            if "junk" in bad:  # an undeclared field is pruned, not refused
                assert answer.get("kind") == "PodGroup" and "junk" not in answer["spec"], answer
                await kit.raw("DELETE", f"{VOLCANO}/namespaces/{kit.namespace}/podgroups/refused")
            else:
                assert answer.get("kind") == "Status" and answer.get("code") == 422, answer

        await install(kit, permissive(PODGROUP_CRD))
        await install(kit, permissive(QUEUE_CRD))
        base = f"{VOLCANO}/namespaces/{kit.namespace}/podgroups"
        await create(kit, base, podgroup(kit, "banana", minResources={"cpu": "banana"}), "PodGroup banana")
        await create(kit, base, podgroup(kit, "fraction", minResources={"cpu": "1e1.5"}), "PodGroup 1e1.5")
        await create(kit, base, podgroup(kit, "huge", minResources={"cpu": "1e10000000"}), "PodGroup 1e10000000")
        deep = json.dumps(podgroup(kit, "deep"))[:-2] + ', "junk": ' + '{"x":' * DEPTH + "1" + "}" * DEPTH + "}}"
        created = await create(kit, base, deep, "PodGroup nested 1000 deep")
        assert "junk" in created["spec"], "the permissive CRD keeps the deep JSON"
        await create(kit, f"{VOLCANO}/queues", {
            "apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "Queue",
            "metadata": {"name": names["queue"]}, "spec": {"capability": {"cpu": "banana"}}}, "Queue banana")
        await create(kit, RESERVATIONS, reservation(names["owners"], [{"labelSelector": {"matchExpressions": [
            {"key": "app", "operator": "In", "values": "abc"}]}}, {"object": {"name": ["x"]}}]),
            "Reservation with owners the matcher cannot read")
        await create(kit, RESERVATIONS, reservation(names["ttl"], [{"labelSelector": {"matchLabels": {"a": "b"}}}],
                                                    ttl="999999999999h"), "Reservation ttl 999999999999h")
        yield names
    finally:
        await kit.raw("DELETE", f"{VOLCANO}/queues/{names['queue']}")
        for name in (names["owners"], names["ttl"]):
            await kit.raw("DELETE", f"{RESERVATIONS}/{name}")
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
        await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")
        # (the PodGroups go with the test's namespace)
        await install(kit, crd_of(QUEUE_CRD))
        await install(kit, crd_of(PODGROUP_CRD))


async def warnings(kit: Kit, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str] | None:
    """The message of a Warning Event recorded (in `default`, as for every cluster-scoped object) on each (kind,
    name) of `wanted`, once there is one for all of them."""
    listed = await kit.raw("GET", "/api/v1/namespaces/default/events")
    found = {(e["involvedObject"].get("kind"), e["involvedObject"].get("name")): e.get("message", "")
             for e in listed.get("items") or [] if e.get("type") == "Warning"}
    return {w: found[w] for w in wanted} if wanted <= set(found) else None


async def lock_of(kit: Kit, node: str) -> str | None:
    taints = (await kit.read_node(node))["spec"].get("taints") or []
    return next((t.get("value") for t in taints if t["key"] == keys.LOCK), None)


async def test_a_poisoned_cluster_does_not_stop_the_webhook_or_the_agent(kit: Kit, poisoned: dict[str, str]) -> None:
    # nodes: "held" for the starving pod; "marked" locked for a job that is gone, with a malformed lock-info
    await kit.create_node("held", {"cpu": "4", "memory": "16Gi"})
    await kit.create_node("marked", {"cpu": "1", "memory": "16Gi"})
    gone = JobRef(kit.namespace, "Pod", "gone").owner_id
    await kit.raw("PATCH", "/api/v1/nodes/marked", content_type="application/merge-patch+json", body={
        "metadata": {"labels": {keys.LOCK: gone, keys.LOCK_KIND: "job"},
                     "annotations": {keys.LOCK_INFO: '{"since": "yesterday", "reserved": ["x"], "tasks": "a'}},
        "spec": {"taints": [{"key": keys.LOCK, "value": gone, "effect": keys.LOCK_EFFECT}]}})
    # a pod whose maximum runtime overflows timedelta (bound where it is, holding nothing)
    await kit.create_pod("overflow", annotations={keys.MAXIMUM_RUNTIME: "999999999999h"},
                         extra_spec={"nodeName": "held"})

    webhook = WebhookProcess(kit.cluster)  # started, not registered: only its caches and readiness are under test
    agent = AgentProcess(kit.cluster, metrics_port=free_port())
    try:
        webhook.start(timeout=60)  # returns once its /readyz answers 200
        agent.start()
        base = f"http://127.0.0.1:{agent.metrics_port}"

        async def ready() -> str | None:
            status, text = await asyncio.to_thread(get, f"{base}/readyz")
            return text if status == 200 else None
        await kit.wait_for(ready, what="the agent's /readyz answering 200", timeout=60)

        async def leading() -> bool:
            _, text = await asyncio.to_thread(get, f"{base}/metrics")
            return "reservoir_leader 1.0" in text
        await kit.wait_for(leading, what="the agent leading", timeout=60)

        async def released() -> bool:
            return await lock_of(kit, "marked") is None
        await kit.wait_for(released, what="the gone job's lock (malformed lock-info) released", timeout=30)

        # seed 000 still works: a node held by a pod that ends in 20 s, a big pod starving for the whole node
        await kit.create_pod("hog", {"cpu": "3"}, annotations={COMPLETE_AFTER: "20s"},
                             extra_spec={"nodeSelector": {"kubernetes.io/hostname": "held"}})
        await kit.wait_pod("hog", lambda p: p.get("status", {}).get("phase") == "Running", "Running")
        await kit.create_pod("big", {"cpu": "4"})
        big = JobRef(kit.namespace, "Pod", "big").owner_id

        async def locked() -> bool:
            return await lock_of(kit, "held") == big
        await kit.wait_for(locked, what="node held locked for the starving big pod", timeout=30)
        await kit.wait_pod("big", lambda p: p["spec"].get("nodeName") == "held", "bound on held", timeout=60)

        async def unlocked() -> bool:
            return await lock_of(kit, "held") is None
        await kit.wait_for(unlocked, what="the big pod's lock released once it was bound", timeout=30)

        assert webhook.running(), webhook.log_text()[-3000:]
        status, text = await asyncio.to_thread(get, f"{base}/readyz")
        assert status == 200, text
        # both name what they skipped: the Queue with cpu banana, the Reservation with ttl 999999999999h
        for process in (agent, webhook):
            log = process.log_text()
            assert f"skipped=Queue {poisoned['queue']}" in log, log[-3000:]
            assert f"skipped=Reservation {poisoned['ttl']}" in log, log[-3000:]
            assert "spec.capability.cpu" in log and "spec.ttl" in log
            # the PodGroups (banana, 1e1.5, 1e10000000, 1000 deep) and the Reservation with unreadable owners are
            # readable: Reservoir reads none of what is wrong with them
            assert "skipped=PodGroup" not in log and f"skipped=Reservation {poisoned['owners']}" not in log
            for crash in ("RecursionError", "OverflowError", "reconcile failed"):
                assert crash not in log, log[-3000:]
        overflow = await kit.read_pod("overflow")
        assert overflow["metadata"]["annotations"][keys.MAXIMUM_RUNTIME] == "999999999999h"
        # `reservoir status` reads the cluster as the caches do: it answers, and names what it skipped
        shown = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "reservoir", "status", f"--kubeconfig={kit.cluster.kubeconfig}",
                             "-o", "json"], capture_output=True, text=True, cwd=REPO)
        assert shown.returncode == 0, shown.stderr[-3000:]
        skipped = {(s["kind"], s["name"]) for s in json.loads(shown.stdout)["skipped"]}
        assert {("Queue", poisoned["queue"]), ("Reservation", poisoned["ttl"])} <= skipped, skipped
        # and each bad object is told on itself: a Warning Event naming what could not be read
        warned = await kit.wait_for(lambda: warnings(kit, {("Node", "marked"), ("Queue", poisoned["queue"]),
                                                             ("Reservation", poisoned["ttl"])}),
                                    what="Warning Events on the malformed node, Queue and Reservation", timeout=30)
        assert "not JSON" in warned[("Node", "marked")], warned
        assert warned[("Node", "marked")].startswith(keys.LOCK_INFO), warned
        assert "spec.capability.cpu" in warned[("Queue", poisoned["queue"])], warned
        assert "spec.ttl" in warned[("Reservation", poisoned["ttl"])], warned
    finally:
        agent.stop(remove_files=False)
        webhook.stop(remove_files=False)
        print("agent log tail:\n" + agent.log_text()[-4000:])
        print("webhook log tail:\n" + webhook.log_text()[-2000:])
        agent.stop()
        webhook.stop()
