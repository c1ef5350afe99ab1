"""Issue 18 on the real control plane: Koordinator's own Reservation CRD installed unchanged
(tests/fixtures/koordinator), the switch `koordinator: {reservations: true}` on, the agent and the webhook as their
ServiceAccounts with deploy/components/koordinator's RBAC, and that component's webhook registered.

A Koordinator Reservation that sets `expires` (the CRD defaults `ttl` to 24h beside it) is placed and Available, held
by a placeholder owned by the Koordinator object; a pod matched only through a namespace-only `object` owner, one
through a `controller` owner without `controller: true`, and one through `reservationSelectorTerms` each take their
Reservation over (bound on its node; the owner carries Koordinator's `reservation-allocated` annotation); a pod that
names a Reservation it does not own is not handed it; a `reservation-ignored` owner is scheduled as if the Reservation
did not exist; expiry follows `expires`. With a second writer (status written by another field manager) Reservoir
writes nothing more to that object and says why (Event `LeftAlone`, agent log)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from localcluster.agent_process import AgentProcess
from localcluster.process import REPO
from localcluster.webhook_process import register
from shared import keys
from shared.ownership import reservation_owner_id
from shared.timestamps import stamp
from tests import logfmt
from tests.e2e.kit import Kit, apply_setup, running_webhook
from tests.e2e.scenarios import QUEUE_CONFIG, SETUP, configure, spare_node

KOORDINATOR = f"/apis/{keys.KOORDINATOR_API_VERSION}/reservations"
CRD = "tests/fixtures/koordinator/scheduling.koordinator.sh_reservations.yaml"
HOOK_CONFIG = "reservoir-koordinator-e2e"


def koordinator_webhooks(url: str, bundle: bytes) -> dict[str, Any]:
    """deploy/components/koordinator's webhook (its JSON patch's value) in a configuration of its own, pointed at
    the webhook process."""
    [op] = yaml.safe_load((REPO / "deploy/components/koordinator/webhook.yaml").read_text())
    hook = dict(op["value"])
    hook["clientConfig"] = {"url": f"{url}{hook['clientConfig']['service']['path']}",
                            "caBundle": base64.b64encode(bundle).decode()}
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": HOOK_CONFIG}, "webhooks": [hook]}


@pytest.fixture
async def served(kit: Kit) -> AsyncIterator[tuple[list[str], AgentProcess]]:
    """Koordinator's CRD, the component's RBAC, the switch on, webhook (with the component's hook) and agent running;
    yields the list the test appends its Reservation names to (deleted after)."""
    await apply_setup(kit, *SETUP, "deploy/webhook-rbac.yaml", CRD, "deploy/components/koordinator/rbac.yaml")
    await configure(kit, QUEUE_CONFIG + "reservations: {gcGracePeriod: 1h, maxReservedPercent: 90}\n"
                    "koordinator: {reservations: true}\n")
    agent = AgentProcess(kit.cluster)
    created: list[str] = []
    try:
        async with running_webhook(kit) as webhook:
            register(kit.cluster.kubectl, [koordinator_webhooks(webhook.url,
                                                                (webhook.dir / "ca-bundle.crt").read_bytes())])
            agent.start()
            try:
                yield created, agent
            finally:
                agent.stop()
                await kit.raw("DELETE", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
                                        f"{HOOK_CONFIG}")
    finally:
        for name in created:
            await kit.raw("DELETE", f"{KOORDINATOR}/{name}")
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
        await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")


async def create(kit: Kit, created: list[str], name: str, cpu: str, owners: list[dict[str, Any]], *,
                 node: str, labels: dict[str, str] | None = None, **spec: Any) -> tuple[dict[str, Any], list[str]]:
    """A Koordinator Reservation as a Koordinator user writes it (no ttl: the CRD defaults it); the stored object and
    the admission Warnings the API server passed on."""
    body = {"apiVersion": keys.KOORDINATOR_API_VERSION, "kind": "Reservation",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"template": {"spec": {"nodeName": node, "containers": [
                {"name": "r", "resources": {"requests": {"cpu": cpu}}}]}}, "owners": owners, **spec}}
    response = await kit.api.call_api(
        KOORDINATOR, "POST", body=body,
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        auth_settings=["BearerToken"], _preload_content=False, response_types_map={})
    raw = response[0] if isinstance(response, tuple) else response
    obj = json.loads(await raw.read())
    assert obj.get("kind") == "Reservation", obj
    created.append(name)
    return obj, list(raw.headers.getall("Warning", []))


async def wait_phase(kit: Kit, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        obj = await kit.raw("GET", f"{KOORDINATOR}/{name}")
        return obj if (obj.get("status") or {}).get("phase") == phase else None
    result: dict[str, Any] = await kit.wait_for(probe, what=f"Koordinator Reservation {name} {phase}", timeout=timeout)
    return result


async def webhook_gates(kit: Kit, body: dict[str, Any]) -> None:
    """Wait until the webhook's caches know the Reservation Available: a dry-run of `body` comes back gated."""
    async def probe() -> bool:
        made = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods?dryRun=All",
                             body={**body, "metadata": {**body["metadata"], "name": "probe"}})
        return any(g["name"] == keys.HANDOVER_GATE for g in made["spec"].get("schedulingGates") or [])
    await kit.wait_for(probe, what="the webhook gating the Reservation's owners", timeout=20)


async def taken_over(kit: Kit, name: str, pod: str, node: str) -> None:
    """`pod` was handed Koordinator Reservation `name` over: bound on its node, its current owner (allocateOnce:
    Succeeded), with both allocated annotations."""
    bound = await kit.wait_pod(pod, lambda p: bool(p["spec"].get("nodeName")), "bound")
    assert bound["spec"]["nodeName"] == node
    done = await wait_phase(kit, name, "Succeeded")
    assert [o["name"] for o in done["status"]["currentOwners"]] == [pod]
    want = json.dumps({"name": name, "uid": done["metadata"]["uid"]}, separators=(",", ":"))
    annotated = await kit.wait_pod(pod, lambda p: p["metadata"].get("annotations", {}).get(
        keys.KOORDINATOR_RESERVATION_ALLOCATED) == want, "annotated with Koordinator's reservation-allocated")
    assert annotated["metadata"]["annotations"][keys.RESERVATION_ALLOCATED] == f"{keys.KOORDINATOR_GROUP}/{name}"


async def test_koordinator_reservations_are_served_by_koordinators_rules(
        kit: Kit, served: tuple[list[str], AgentProcess]) -> None:
    created, agent = served
    await kit.create_node("ko-1", {"cpu": "8", "memory": "16Gi"})
    spare = await spare_node(kit)
    tag, ns = kit.namespace[-5:], kit.namespace

    # expires set, ttl defaulted by the CRD: let in (Koordinator checks expires first), placed, Available
    expires = stamp(datetime.now(UTC) + timedelta(minutes=10))
    stored, warnings = await create(kit, created, f"ns-{tag}", "1", [{"object": {"namespace": ns}}], node="ko-1",
                                    expires=expires, preAllocationPolicy={"mode": "Default"})
    assert stored["spec"]["ttl"] == "24h" and stored["spec"]["expires"] == expires
    assert any("spec.preAllocationPolicy is ignored" in w for w in warnings), warnings
    obj = await wait_phase(kit, f"ns-{tag}", "Available")
    assert obj["status"]["nodeName"] == "ko-1" and obj["status"]["allocatable"] == {"cpu": "1"}
    placeholders = await kit.raw("GET", f"/api/v1/namespaces/{keys.NAMESPACE}/pods?labelSelector={keys.PLACEHOLDER}"
                                        f"={reservation_owner_id(f'{keys.KOORDINATOR_GROUP}/ns-{tag}')}")
    [holder] = placeholders["items"]
    assert holder["metadata"]["ownerReferences"][0]["apiVersion"] == keys.KOORDINATOR_API_VERSION

    # 1. matched only through the namespace-only object owner
    plain = kit.pod_body("by-namespace", {"cpu": "1"})
    await webhook_gates(kit, plain)
    await kit.raw("POST", f"/api/v1/namespaces/{ns}/pods", body=plain)
    await taken_over(kit, f"ns-{tag}", "by-namespace", "ko-1")

    # 2. a controller owner without `controller: true`: any ownerReference with its fields; a pod naming it that is
    #    not an owner is not handed it (it waits for the Reservation's node, and nothing gives it the lock)
    # the owner must exist (kube-controller-manager's garbage collector deletes a pod whose owners are gone): a
    # ConfigMap stands for the Job, no controller to make pods of its own
    owner = await kit.raw("POST", f"/api/v1/namespaces/{ns}/configmaps",
                          body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"owner-{tag}"}})
    job = {"apiVersion": "v1", "kind": "ConfigMap", "name": f"owner-{tag}", "uid": owner["metadata"]["uid"]}
    await create(kit, created, f"ctl-{tag}", "1", [{"controller": {**job, "namespace": ns}}], node="ko-1")
    await wait_phase(kit, f"ctl-{tag}", "Available")
    await kit.create_pod("namer", {"cpu": "1"},
                         annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: json.dumps({"name": f"ctl-{tag}"})})
    child = kit.pod_body("by-controller", {"cpu": "1"})
    child["metadata"]["ownerReferences"] = [{**job, "blockOwnerDeletion": False}]  # not a controller reference
    await webhook_gates(kit, child)
    await kit.raw("POST", f"/api/v1/namespaces/{ns}/pods", body=child)
    await taken_over(kit, f"ctl-{tag}", "by-controller", "ko-1")
    namer = await kit.read_pod("namer")
    assert not namer["spec"].get("nodeName") and not namer["spec"].get("schedulingGates"), "not an owner"

    # 3. reservationSelectorTerms (with an owner match still required)
    owners = [{"labelSelector": {"matchLabels": {"app": f"terms-{tag}"}}}]
    await create(kit, created, f"terms-{tag}", "1", owners, node="ko-1", labels={"pool": f"p-{tag}"})
    await wait_phase(kit, f"terms-{tag}", "Available")
    terms = {"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": [f"p-{tag}"]}]}]}}
    chooser = kit.pod_body("by-terms", {"cpu": "1"}, labels={"app": f"terms-{tag}"},
                           annotations={keys.KOORDINATOR_RESERVATION_AFFINITY: json.dumps(terms)})
    await webhook_gates(kit, chooser)
    await kit.raw("POST", f"/api/v1/namespaces/{ns}/pods", body=chooser)
    await taken_over(kit, f"terms-{tag}", "by-terms", "ko-1")

    # 4. reservation-ignored: an owner by its labels, scheduled as if the Reservation did not exist (8 - 3 taken -
    #    2 held = 3 cpu left on ko-1: the 3-cpu pod fits beside the held 2, untouched)
    await create(kit, created, f"kept-{tag}", "2", owners, node="ko-1")
    await wait_phase(kit, f"kept-{tag}", "Available")
    await webhook_gates(kit, kit.pod_body("x", {"cpu": "1"}, labels={"app": f"terms-{tag}"}))
    made = await kit.create_pod("ignoring", {"cpu": "3"}, labels={"app": f"terms-{tag}",
                                                                  keys.KOORDINATOR_RESERVATION_IGNORED: "true"},
                                extra_spec={"nodeSelector": {"kubernetes.io/hostname": "ko-1"}})
    kept_owner = reservation_owner_id(f"{keys.KOORDINATOR_GROUP}/kept-{tag}")
    assert not made["spec"].get("schedulingGates") and kept_owner not in json.dumps(made["spec"]), made["spec"]
    await kit.wait_pod("ignoring", lambda p: p["spec"].get("nodeName") == "ko-1", "bound on ko-1")
    await asyncio.sleep(2)  # a resync: it did not use the Reservation up
    kept = await kit.raw("GET", f"{KOORDINATOR}/kept-{tag}")
    assert kept["status"]["phase"] == "Available" and not kept["status"].get("currentOwners")

    # 5. expiry follows expires (the defaulted 24h ttl notwithstanding)
    soon = stamp(datetime.now(UTC) + timedelta(seconds=5))
    await create(kit, created, f"brief-{tag}", "50m", [{"object": {"namespace": ns}}], node=spare, expires=soon)
    await wait_phase(kit, f"brief-{tag}", "Available")
    failed = await wait_phase(kit, f"brief-{tag}", "Failed", timeout=20)
    ready = {c["type"]: c for c in failed["status"]["conditions"]}["Ready"]
    assert ready["reason"] == "Expired" and failed["spec"]["ttl"] == "24h"
    assert logfmt.find(agent.log_text(), reservation=f"{keys.KOORDINATOR_GROUP}/brief-{tag}", decision="Failed")


async def test_with_a_second_writer_reservoir_writes_nothing_and_says_why(
        kit: Kit, served: tuple[list[str], AgentProcess]) -> None:
    created, agent = served
    await kit.create_node("sw-1", {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    name = f"theirs-{kit.namespace[-5:]}"
    await create(kit, created, name, "1", [{"object": {"namespace": kit.namespace}}], node="sw-1")
    placed = await wait_phase(kit, name, "Available")
    assert [m["manager"] for m in placed["metadata"]["managedFields"] if m.get("subresource") == "status"] == [
        keys.KOORDINATOR_FIELD_MANAGER]

    # Koordinator's scheduler writes the status: another field manager
    theirs = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Available",
                                         "message": "reserved by koord-scheduler"}]}}
    written = await kit.raw("PATCH", f"{KOORDINATOR}/{name}/status?fieldManager=koord-scheduler", body=theirs,
                            content_type="application/merge-patch+json")
    version = written["metadata"]["resourceVersion"]

    async def told() -> list[dict[str, Any]] | None:
        events = await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name=" + name)
        found = [e for e in events["items"] if e["reason"] == "LeftAlone"]
        return found or None
    [event] = await kit.wait_for(told, what="a LeftAlone Event on the Reservation", timeout=20)
    assert "koord-scheduler" in event["message"]
    assert event["involvedObject"]["apiVersion"] == keys.KOORDINATOR_API_VERSION
    assert logfmt.find(agent.log_text(), decision="left-alone", writer="koord-scheduler")

    # its placeholder goes (Reservoir holds nothing for it), and nothing more is written to the object
    owner = reservation_owner_id(f"{keys.KOORDINATOR_GROUP}/{name}")

    async def released() -> bool:
        pods = await kit.raw("GET", f"/api/v1/namespaces/{keys.NAMESPACE}/pods?labelSelector={keys.PLACEHOLDER}"
                                    f"={owner}")
        return not [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    await kit.wait_for(released, what="Reservoir's placeholder of it deleted", timeout=20)
    await asyncio.sleep(5)  # two resync periods and more
    after = await kit.raw("GET", f"{KOORDINATOR}/{name}")
    assert after["metadata"]["resourceVersion"] == version, "Reservoir wrote to an object another writer serves"
    assert after["status"]["conditions"] == theirs["status"]["conditions"]
