"""Reservations on the real control plane (seed 003), with the webhook and the agent as their ServiceAccounts:
a Reservation with owners by label becomes Available on a node; a non-owner pod pinned there waits; an owner pod
lands there, is annotated and listed as current owner; allocateOnce makes the Reservation Succeeded and frees
the node, so the waiting pod binds; a Reservation with ttl 5s expires to Failed; ended Reservations are deleted
after gcGracePeriod; preAllocation on a full node
waits (Waiting) until the running pods finish, then is Available. Without the agent nothing is reserved."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER
from shared import keys
from shared.ownership import reservation_owner_id
from tests import logfmt
from tests.e2e.kit import Kit, apply_setup, running_webhook
from tests.e2e.scenarios import QUEUE_CONFIG, SETUP, configure, locked_nodes, spare_node

RESERVATIONS = f"/apis/{keys.RESERVATION_GROUP}/{keys.RESERVATION_VERSION}/reservations"


@pytest.fixture
async def running(kit: Kit) -> AsyncIterator[tuple[list[str], AgentProcess]]:
    """Webhook and agent running; yields the list the test appends its Reservation names to (deleted after)."""
    await apply_setup(kit, *SETUP, "deploy/webhook-rbac.yaml")
    await configure(kit, QUEUE_CONFIG + "reservations: {gcGracePeriod: 4s}\n")
    agent = AgentProcess(kit.cluster)
    created: list[str] = []
    try:
        async with running_webhook(kit):
            agent.start()
            try:
                yield created, agent
            finally:
                agent.stop()
    finally:
        for name in created:
            await kit.raw("DELETE", f"{RESERVATIONS}/{name}")
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
        await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")


async def create_reservation(kit: Kit, created: list[str], name: str, cpu: str, spec: dict) -> None:
    body = {"apiVersion": f"{keys.RESERVATION_GROUP}/{keys.RESERVATION_VERSION}", "kind": "Reservation",
            "metadata": {"name": name},
            "spec": {"template": {"spec": {"containers": [{"name": "r", "resources": {"requests": {"cpu": cpu}}}],
                                           **spec.pop("template_spec", {})}}, **spec}}
    await kit.raw("POST", RESERVATIONS, body=body)
    created.append(name)


async def wait_phase(kit: Kit, name: str, phase: str, timeout: float = 30) -> dict:
    async def probe() -> dict | None:
        obj = await kit.raw("GET", f"{RESERVATIONS}/{name}")
        return obj if (obj.get("status") or {}).get("phase") == phase else None
    return await kit.wait_for(probe, what=f"Reservation {name} {phase}", timeout=timeout)


async def test_owner_only_allocate_once_and_ttl_expiry(kit: Kit, running: tuple[list[str], AgentProcess]) -> None:
    created, agent = running
    for name in ("rs-1", "rs-2"):
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"})
    tag = kit.namespace[-5:]
    owners = [{"labelSelector": {"matchLabels": {"reservation": tag}}}]
    await create_reservation(kit, created, f"train-{tag}", "3", {"owners": owners})
    obj = await wait_phase(kit, f"train-{tag}", "Available")
    node = obj["status"]["nodeName"]
    assert (await locked_nodes(kit, ["rs-1", "rs-2"])) == {node: reservation_owner_id(f"train-{tag}")}
    ready = {c["type"]: c for c in obj["status"]["conditions"]}
    assert ready["Scheduled"]["status"] == "True" and ready["Ready"]["status"] == "True"

    # a stranger pinned to the node waits: it does not tolerate the Reservation's lock
    await kit.create_pod("stranger", {"cpu": "1"}, extra_spec={"nodeSelector": {"kubernetes.io/hostname": node}})
    async def unschedulable() -> bool:
        pod = await kit.read_pod("stranger")
        return any(c.get("reason") == "Unschedulable" for c in pod.get("status", {}).get("conditions") or [])
    await kit.wait_for(unschedulable, what="the stranger reported Unschedulable", timeout=20)

    # the owner lands on the reserved node (toleration + preferred affinity from the webhook)
    await kit.create_pod("owner", {"cpu": "3"}, labels={"reservation": tag})
    bound = await kit.wait_pod("owner", lambda p: bool(p["spec"].get("nodeName")), "bound")
    assert bound["spec"]["nodeName"] == node
    done = await wait_phase(kit, f"train-{tag}", "Succeeded")
    assert [o["name"] for o in done["status"]["currentOwners"]] == ["owner"]
    assert done["status"]["allocated"]["cpu"] == "3"
    annotated = await kit.wait_pod("owner", lambda p: p["metadata"].get("annotations", {}).get(
        keys.RESERVATION_ALLOCATED) == f"train-{tag}", "annotated reservation-allocated")
    assert annotated["metadata"]["annotations"][keys.RESERVATION_ALLOCATED] == f"train-{tag}"
    # the node is free again: the stranger binds there
    await kit.wait_pod("stranger", lambda p: p["spec"].get("nodeName") == node, f"bound on {node}", timeout=30)
    assert await locked_nodes(kit, ["rs-1", "rs-2"]) == {}

    # a Reservation with ttl 5s: Available, then Failed (Expired), its lock gone
    await create_reservation(kit, created, f"brief-{tag}", "1", {"owners": owners, "ttl": "5s"})
    await wait_phase(kit, f"brief-{tag}", "Available")
    failed = await wait_phase(kit, f"brief-{tag}", "Failed", timeout=20)
    assert {c["type"]: c for c in failed["status"]["conditions"]}["Ready"]["reason"] == "Expired"
    assert await locked_nodes(kit, ["rs-1", "rs-2"]) == {}
    events = await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.kind=Reservation")
    assert any(e["involvedObject"]["name"] == f"brief-{tag}" and e["reason"] == "Failed" for e in events["items"])
    assert logfmt.find(agent.log_text(), reservation=f"train-{tag}", decision="Succeeded")
    # both ended: garbage-collected gcGracePeriod (4s here) after
    async def collected() -> bool:
        names = {r["metadata"]["name"] for r in (await kit.raw("GET", RESERVATIONS))["items"]}
        return not names & {f"train-{tag}", f"brief-{tag}"}
    await kit.wait_for(collected, what="ended Reservations deleted after gcGracePeriod", timeout=30)


async def test_pre_allocation_waits_for_a_full_node_to_drain(kit: Kit, running: tuple[list[str], AgentProcess]) -> None:
    created, _ = running
    await kit.create_node("pa-1", {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    for i in range(2):
        await kit.create_pod(f"busy-{i}", {"cpu": "2"}, annotations={COMPLETE_AFTER: "8s"})
    for i in range(2):
        await kit.wait_pod(f"busy-{i}", lambda p: p.get("status", {}).get("phase") == "Running", "Running")
    tag = kit.namespace[-5:]
    await create_reservation(kit, created, f"pre-{tag}", "4", {
        "owners": [{"labelSelector": {"matchLabels": {"reservation": tag}}}], "preAllocation": True,
        "template_spec": {"nodeName": "pa-1"}})
    waiting = await wait_phase(kit, f"pre-{tag}", "Waiting")
    assert waiting["status"]["nodeName"] == "pa-1"
    assert await locked_nodes(kit, ["pa-1"]) == {"pa-1": reservation_owner_id(f"pre-{tag}")}
    # a newcomer cannot take the room the running pods free
    await kit.create_pod("newcomer", {"cpu": "1"})
    await wait_phase(kit, f"pre-{tag}", "Available", timeout=40)
    assert not (await kit.read_pod("newcomer"))["spec"].get("nodeName"), "the drained node stayed reserved"


async def test_without_the_agent_nothing_is_reserved(kit: Kit) -> None:
    """The opposite outcome: no agent, no lock; a stranger takes the node the Reservation wanted."""
    await apply_setup(kit, *SETUP)
    await kit.create_node("off-1", {"cpu": "4", "memory": "16Gi"})
    tag = kit.namespace[-5:]
    created: list[str] = []
    try:
        await create_reservation(kit, created, f"off-{tag}", "4", {
            "owners": [{"labelSelector": {"matchLabels": {"reservation": tag}}}], "template_spec": {"nodeName": "off-1"}})
        await kit.create_pod("stranger", {"cpu": "4"})
        await kit.wait_pod("stranger", lambda p: p["spec"].get("nodeName") == "off-1", "bound on off-1")
        assert not (await kit.raw("GET", f"{RESERVATIONS}/off-{tag}")).get("status")
        assert await locked_nodes(kit, ["off-1"]) == {}
    finally:
        for name in created:
            await kit.raw("DELETE", f"{RESERVATIONS}/{name}")
