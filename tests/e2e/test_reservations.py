"""Reservations on the real control plane (seed 003), with the webhook and the agent as their ServiceAccounts.

A Reservation holds what it reserves, not its node: a placeholder pod bound to the node keeps those resources from
everyone else, and every other pod may use the rest (a 1-cpu stranger runs beside a 3-cpu Reservation on a 4-cpu node,
a 2-cpu one does not). An owner is handed the reserved resources over: gated at admission, narrowed to the node under a
brief lock, let go, bound there; allocateOnce makes the Reservation Succeeded (allocated cpu 3). Two Reservations share
a node; an owner that ran there before does not use one up; with allocateOnce false owners come and go and the
placeholder follows; Restricted sends a larger owner elsewhere; ttl expiry, garbage collection, preAllocation's drain;
50 handovers while strangers keep kube-scheduler busy on the same nodes. Without the agent nothing is reserved."""

from __future__ import annotations

import asyncio
import statistics
import time
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
    await configure(kit, QUEUE_CONFIG + "reservations: {gcGracePeriod: 4s, maxReservedPercent: 90}\n")
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


async def placeholders(kit: Kit) -> dict[str, tuple[str, dict]]:
    """Reservation owner id -> (node, requests) of each placeholder pod standing (not being deleted)."""
    pods = await kit.raw("GET", f"/api/v1/namespaces/{keys.NAMESPACE}/pods?labelSelector={keys.PLACEHOLDER}")
    return {p["metadata"]["labels"][keys.PLACEHOLDER]: (p["spec"]["nodeName"],
                                                         p["spec"]["containers"][0]["resources"]["requests"])
            for p in pods["items"] if not p["metadata"].get("deletionTimestamp")}


async def held_by(kit: Kit, name: str, requests: dict | None) -> None:
    """Wait until Reservation `name`'s placeholder holds `requests` (None: no placeholder)."""
    owner = reservation_owner_id(name)
    async def probe() -> bool:
        return (await placeholders(kit)).get(owner, (None, None))[1] == requests
    await kit.wait_for(probe, what=f"the placeholder of {name} holding {requests}", timeout=30)


async def webhook_gates(kit: Kit, labels: dict[str, str]) -> None:
    """Wait until the webhook's caches know the Reservation Available: a dry-run owner comes back gated."""
    async def probe() -> bool:
        body = kit.pod_body("probe", {"cpu": "1"}, labels=labels)
        made = await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods?dryRun=All", body=body)
        return any(g["name"] == keys.HANDOVER_GATE for g in made["spec"].get("schedulingGates") or [])
    await kit.wait_for(probe, what="the webhook gating the Reservation's owners", timeout=20)


def pinned(node: str) -> dict:
    return {"nodeSelector": {"kubernetes.io/hostname": node}}


async def unschedulable(kit: Kit, name: str) -> None:
    async def probe() -> bool:
        pod = await kit.read_pod(name)
        return any(c.get("reason") == "Unschedulable" for c in pod.get("status", {}).get("conditions") or [])
    await kit.wait_for(probe, what=f"{name} reported Unschedulable", timeout=20)


async def unlocked(kit: Kit, node: str, what: str) -> None:
    """Wait until `node` carries no Reservoir lock (`what`: the story's name for it)."""
    async def probe() -> bool:
        return await locked_nodes(kit, [node]) == {}
    await kit.wait_for(probe, what=what, timeout=20)


async def wait_phase(kit: Kit, name: str, phase: str, timeout: float = 30) -> dict:
    async def probe() -> dict | None:
        obj = await kit.raw("GET", f"{RESERVATIONS}/{name}")
        return obj if (obj.get("status") or {}).get("phase") == phase else None
    return await kit.wait_for(probe, what=f"Reservation {name} {phase}", timeout=timeout)


async def reservation_on_a_node(kit: Kit, created: list[str], node: str, name: str) -> tuple[str, list[dict], dict]:
    """A 4-cpu node `node` (and a spare), a Reservation `name` of 3 cpu on it for the pods labelled reservation=<tag>,
    Available: (the tag, the Reservation's owners, the Reservation)."""
    await kit.create_node(node, {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    tag = kit.namespace[-5:]
    owners = [{"labelSelector": {"matchLabels": {"reservation": tag}}}]
    await create_reservation(kit, created, name, "3", {"owners": owners, "template_spec": {"nodeName": node}})
    return tag, owners, await wait_phase(kit, name, "Available")


async def test_a_reservation_holds_only_its_resources_and_hands_them_over_to_its_owner(
        kit: Kit, running: tuple[list[str], AgentProcess]) -> None:
    created, agent = running
    tag, owners, obj = await reservation_on_a_node(kit, created, "rs-1", f"train-{kit.namespace[-5:]}")
    assert obj["status"]["nodeName"] == "rs-1" and obj["status"]["allocatable"] == {"cpu": "3"}
    ready = {c["type"]: c for c in obj["status"]["conditions"]}
    assert ready["Scheduled"]["status"] == "True" and ready["Ready"]["status"] == "True"
    assert await locked_nodes(kit, ["rs-1"]) == {}, "a Reservation holds its resources, not its node"
    assert (await placeholders(kit))[reservation_owner_id(f"train-{tag}")] == ("rs-1", {"cpu": "3"})

    # only the reserved resources are kept: a 1-cpu stranger runs beside, a 2-cpu one does not fit
    await kit.create_pod("small", {"cpu": "1"}, extra_spec=pinned("rs-1"))
    await kit.wait_pod("small", lambda p: p["spec"].get("nodeName") == "rs-1", "bound on rs-1")
    await kit.create_pod("big", {"cpu": "2"}, extra_spec=pinned("rs-1"))
    await unschedulable(kit, "big")

    # the owner: gated at admission, handed over, bound on rs-1; allocateOnce: Succeeded, allocated cpu 3
    await webhook_gates(kit, {"reservation": tag})
    made = await kit.create_pod("owner", {"cpu": "3"}, labels={"reservation": tag})
    assert [g["name"] for g in made["spec"]["schedulingGates"]] == [keys.HANDOVER_GATE]
    bound = await kit.wait_pod("owner", lambda p: bool(p["spec"].get("nodeName")), "bound")
    assert bound["spec"]["nodeName"] == "rs-1"
    done = await wait_phase(kit, f"train-{tag}", "Succeeded")
    assert {c["type"]: c for c in done["status"]["conditions"]}["Ready"]["reason"] == "Succeeded"
    assert [o["name"] for o in done["status"]["currentOwners"]] == ["owner"]
    assert done["status"]["allocated"] == {"cpu": "3"}
    await kit.wait_pod("owner", lambda p: p["metadata"].get("annotations", {}).get(
        keys.RESERVATION_ALLOCATED) == f"train-{tag}", "annotated reservation-allocated")
    await held_by(kit, f"train-{tag}", None)
    await unlocked(kit, "rs-1", "the handover's lock released")
    assert not (await kit.read_pod("big"))["spec"].get("nodeName"), "1 + 3 of 4 cpu used: the big one still waits"
    assert logfmt.find(agent.log_text(), decision="handover", node="rs-1")
    assert logfmt.find(agent.log_text(), reservation=f"train-{tag}", decision="Succeeded")

    # a Reservation with ttl 5s: Available, then Failed (Expired), its placeholder gone
    await create_reservation(kit, created, f"brief-{tag}", "100m", {"owners": owners, "ttl": "5s"})  # on the spare
    await wait_phase(kit, f"brief-{tag}", "Available")
    failed = await wait_phase(kit, f"brief-{tag}", "Failed", timeout=20)
    assert {c["type"]: c for c in failed["status"]["conditions"]}["Ready"]["reason"] == "Expired"
    await held_by(kit, f"brief-{tag}", None)
    events = await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.kind=Reservation")
    assert any(e["involvedObject"]["name"] == f"brief-{tag}" and e["reason"] == "Failed" for e in events["items"])
    async def collected() -> bool:
        names = {r["metadata"]["name"] for r in (await kit.raw("GET", RESERVATIONS))["items"]}
        return not names & {f"train-{tag}", f"brief-{tag}"}
    await kit.wait_for(collected, what="ended Reservations deleted after gcGracePeriod", timeout=30)


async def test_an_owner_holding_a_gate_of_its_own_is_not_handed_over(
        kit: Kit, running: tuple[list[str], AgentProcess]) -> None:
    """An owner created with a scheduling gate of its own beside the handover gate would, handed over, keep the
    Reservation's node locked for as long as its tenant held the gate (never Unschedulable, so never given up): it is
    let go instead, its own gate kept, the node never locked, and the Reservation stays whole for an honest owner."""
    created, agent = running
    tag, _, _ = await reservation_on_a_node(kit, created, "rs-g", f"gated-{kit.namespace[-5:]}")
    await webhook_gates(kit, {"reservation": tag})
    made = await kit.create_pod("sly", {"cpu": "3"}, labels={"reservation": tag},
                                extra_spec={"schedulingGates": [{"name": "example.com/mine"}]})
    assert {g["name"] for g in made["spec"]["schedulingGates"]} == {"example.com/mine", keys.HANDOVER_GATE}
    let_go = await kit.wait_pod("sly", lambda p: [g["name"] for g in p["spec"].get("schedulingGates") or []] == [
        "example.com/mine"], "the handover gate lifted, its own kept")
    node_affinity = (let_go["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in node_affinity, "not narrowed to rs-g"
    assert logfmt.find(agent.log_text(), decision="ungate", pod=f"{kit.namespace}/sly")
    assert await locked_nodes(kit, ["rs-g"]) == {}, "its node never locked for it"
    assert (await placeholders(kit))[reservation_owner_id(f"gated-{tag}")] == ("rs-g", {"cpu": "3"})
    await kit.create_pod("owner", {"cpu": "3"}, labels={"reservation": tag})
    bound = await kit.wait_pod("owner", lambda p: bool(p["spec"].get("nodeName")), "bound")
    assert bound["spec"]["nodeName"] == "rs-g"
    done = await wait_phase(kit, f"gated-{tag}", "Succeeded")
    assert [o["name"] for o in done["status"]["currentOwners"]] == ["owner"]


async def test_two_reservations_share_a_node_and_an_owner_running_before_uses_none_up(
        kit: Kit, running: tuple[list[str], AgentProcess]) -> None:
    created, _ = running
    await kit.create_node("sh-1", {"cpu": "8", "memory": "16Gi"})
    await spare_node(kit)
    tag = kit.namespace[-5:]
    await kit.create_pod("early", {"cpu": "1"}, labels={"reservation": tag}, extra_spec=pinned("sh-1"))
    await kit.wait_pod("early", lambda p: p["spec"].get("nodeName") == "sh-1", "bound on sh-1")
    owners = [{"labelSelector": {"matchLabels": {"reservation": tag}}}]
    for name in (f"a-{tag}", f"b-{tag}"):
        await create_reservation(kit, created, name, "3", {"owners": owners, "template_spec": {"nodeName": "sh-1"}})
    for name in (f"a-{tag}", f"b-{tag}"):
        obj = await wait_phase(kit, name, "Available")
        assert obj["status"]["nodeName"] == "sh-1"
    held = await placeholders(kit)
    for name in (f"a-{tag}", f"b-{tag}"):
        assert held[reservation_owner_id(name)] == ("sh-1", {"cpu": "3"})
    await asyncio.sleep(2)  # several reconciles (resync 2s): the early owner still uses neither
    for name in (f"a-{tag}", f"b-{tag}"):
        obj = await kit.raw("GET", f"{RESERVATIONS}/{name}")
        assert obj["status"]["phase"] == "Available" and not obj["status"].get("currentOwners")
    # 8 - 1 (early) - 3 - 3 = 1 cpu left: a 2-cpu stranger does not fit, a 1-cpu one does
    await kit.create_pod("two", {"cpu": "2"}, extra_spec=pinned("sh-1"))
    await unschedulable(kit, "two")
    await kit.create_pod("one", {"cpu": "1"}, extra_spec=pinned("sh-1"))
    await kit.wait_pod("one", lambda p: p["spec"].get("nodeName") == "sh-1", "bound on sh-1")


async def test_allocate_once_false_owners_come_and_go_and_the_placeholder_follows(
        kit: Kit, running: tuple[list[str], AgentProcess]) -> None:
    created, _ = running
    await kit.create_node("ao-1", {"cpu": "8", "memory": "16Gi"})
    await spare_node(kit)
    tag = kit.namespace[-5:]
    name = f"pool-{tag}"
    await create_reservation(kit, created, name, "3", {
        "owners": [{"labelSelector": {"matchLabels": {"reservation": tag}}}], "allocateOnce": False,
        "template_spec": {"nodeName": "ao-1"}})
    await wait_phase(kit, name, "Available")
    await webhook_gates(kit, {"reservation": tag})
    for i, left in enumerate(({"cpu": "2"}, {"cpu": "1"}, None)):
        await kit.create_pod(f"o{i}", {"cpu": "1"}, labels={"reservation": tag}, annotations={COMPLETE_AFTER: "6s"})
        await kit.wait_pod(f"o{i}", lambda p: p["spec"].get("nodeName") == "ao-1", "bound on ao-1")
        await held_by(kit, name, left)
    obj = await kit.raw("GET", f"{RESERVATIONS}/{name}")
    assert obj["status"]["phase"] == "Available" and obj["status"]["allocated"] == {"cpu": "3"}
    assert sorted(o["name"] for o in obj["status"]["currentOwners"]) == ["o0", "o1", "o2"]
    # they end: what they held goes back to the placeholder
    await held_by(kit, name, {"cpu": "3"})
    obj = await kit.raw("GET", f"{RESERVATIONS}/{name}")
    assert obj["status"]["phase"] == "Available" and not obj["status"].get("currentOwners")
    await unlocked(kit, "ao-1", "no lock left once the placeholder is whole")


async def test_restricted_sends_an_owner_larger_than_the_reservation_elsewhere(
        kit: Kit, running: tuple[list[str], AgentProcess]) -> None:
    created, _ = running
    await kit.create_node("re-1", {"cpu": "4", "memory": "16Gi"})
    await kit.create_node("re-2", {"cpu": "4", "memory": "16Gi"})
    tag = kit.namespace[-5:]
    name = f"strict-{tag}"
    await create_reservation(kit, created, name, "3", {
        "owners": [{"labelSelector": {"matchLabels": {"reservation": tag}}}], "allocatePolicy": "Restricted",
        "template_spec": {"nodeName": "re-1"}})
    await wait_phase(kit, name, "Available")
    await webhook_gates(kit, {"reservation": tag})
    await kit.create_pod("large", {"cpu": "4"}, labels={"reservation": tag})
    bound = await kit.wait_pod("large", lambda p: bool(p["spec"].get("nodeName")), "bound")
    assert bound["spec"]["nodeName"] == "re-2" and not bound["spec"].get("schedulingGates")
    obj = await kit.raw("GET", f"{RESERVATIONS}/{name}")
    assert obj["status"]["phase"] == "Available" and not obj["status"].get("currentOwners")
    assert (await placeholders(kit))[reservation_owner_id(name)] == ("re-1", {"cpu": "3"})


async def test_pre_allocation_waits_for_a_full_node_to_drain(kit: Kit, running: tuple[list[str], AgentProcess]) -> None:
    created, _ = running
    await kit.create_node("pa-1", {"cpu": "4", "memory": "16Gi"})
    await spare_node(kit)
    for i in range(2):
        await kit.create_pod(f"busy-{i}", {"cpu": "2"}, annotations={COMPLETE_AFTER: "8s"})
    for i in range(2):
        await kit.wait_pod(f"busy-{i}", lambda p: p.get("status", {}).get("phase") == "Running", "Running")
    tag = kit.namespace[-5:]
    await create_reservation(kit, created, f"pre-{tag}", "3", {
        "owners": [{"labelSelector": {"matchLabels": {"reservation": tag}}}], "preAllocation": True,
        "template_spec": {"nodeName": "pa-1"}})
    waiting = await wait_phase(kit, f"pre-{tag}", "Waiting")
    assert waiting["status"]["nodeName"] == "pa-1"
    # the agent writes the Waiting status, then the drain lock (a few ms apart): wait for the lock, not a snapshot
    drain = {"pa-1": reservation_owner_id(f"pre-{tag}")}
    async def drain_locked() -> bool:
        return await locked_nodes(kit, ["pa-1"]) == drain
    await kit.wait_for(drain_locked, what="pa-1 locked for the preAllocation drain", timeout=10)
    # a newcomer cannot take the room the running pods free, then or after: 3 of the 4 cpu stay reserved
    await kit.create_pod("newcomer", {"cpu": "2"})
    await wait_phase(kit, f"pre-{tag}", "Available", timeout=40)
    await held_by(kit, f"pre-{tag}", {"cpu": "3"})
    await unlocked(kit, "pa-1", "the drain lock released once the placeholder stands")
    await unschedulable(kit, "newcomer")
    assert not (await kit.read_pod("newcomer"))["spec"].get("nodeName"), "the drained node stayed reserved"


async def test_fifty_handovers_while_strangers_keep_kube_scheduler_busy_on_the_same_nodes(
        kit: Kit, running: tuple[list[str], AgentProcess]) -> None:
    """The race the handover must win: 50 owners, each of its own 1-cpu Reservation on 5 nodes, created at once while
    150 stranger pods stream onto the same nodes. Every owner is bound on its Reservation's node (a stranger in the
    reserved room would leave the narrowed owner unschedulable), and no node ever runs more than it has."""
    created, agent = running
    await configure(kit, QUEUE_CONFIG + "reservations: {gcGracePeriod: 10m, maxReservedPercent: 90}\n")
    nodes = [f"race-{i}" for i in range(5)]
    for node in nodes:
        await kit.create_node(node, {"cpu": "16", "memory": "64Gi"})
    tag = kit.namespace[-5:]
    for i in range(50):
        await create_reservation(kit, created, f"race-{tag}-{i}", "1", {
            "owners": [{"labelSelector": {"matchLabels": {"race": f"{tag}-{i}"}}}],
            "template_spec": {"nodeName": nodes[i % 5]}})
    for i in range(50):
        await wait_phase(kit, f"race-{tag}-{i}", "Available", timeout=60)
    await webhook_gates(kit, {"race": f"{tag}-49"})
    overcommitted: list[str] = []
    stop = asyncio.Event()

    async def strangers() -> None:
        for i in range(150):
            await kit.create_pod(f"stranger-{i}", {"cpu": "1"}, annotations={COMPLETE_AFTER: "3s"})
            await asyncio.sleep(0.05)
        stop.set()

    async def watch_usage() -> None:
        while not stop.is_set():
            pods = (await kit.raw("GET", "/api/v1/pods?fieldSelector=status.phase=Running"))["items"]
            used: dict[str, int] = {}
            for p in pods:
                if p["spec"].get("nodeName") in nodes:
                    cpu = sum(int(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
                              for c in p["spec"]["containers"])
                    used[p["spec"]["nodeName"]] = used.get(p["spec"]["nodeName"], 0) + cpu
            overcommitted.extend(f"{n}: {u} cpu" for n, u in used.items() if u > 16)
            await asyncio.sleep(0.5)

    started: dict[str, float] = {}
    bound_at: dict[str, float] = {}

    async def owners() -> None:
        for i in range(50):
            started[f"owner-{i}"] = time.monotonic()
            await kit.create_pod(f"owner-{i}", {"cpu": "1"}, labels={"race": f"{tag}-{i}"})
        pending = set(started)
        deadline = time.monotonic() + 120
        while pending and time.monotonic() < deadline:
            listed = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
            for p in listed:
                name = p["metadata"]["name"]
                if name in pending and p["spec"].get("nodeName"):
                    bound_at[name] = time.monotonic()
                    pending.discard(name)
            await asyncio.sleep(0.2)

    await asyncio.gather(strangers(), watch_usage(), owners())
    assert len(bound_at) == 50, f"owners never bound: {sorted(set(started) - set(bound_at))}"
    for i in range(50):
        pod = await kit.read_pod(f"owner-{i}")
        assert pod["spec"]["nodeName"] == nodes[i % 5], f"owner-{i} bound off its Reservation's node"
        obj = await wait_phase(kit, f"race-{tag}-{i}", "Succeeded")
        assert obj["status"]["allocated"] == {"cpu": "1"}
    assert overcommitted == [], overcommitted
    strangers_bound = [p for p in (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
                       if p["metadata"]["name"].startswith("stranger-") and p["spec"].get("nodeName")]
    assert strangers_bound, "the strangers did run on the same nodes"
    waits = sorted(bound_at[n] - started[n] for n in bound_at)
    print(f"handover: 50 owners, median {statistics.median(waits):.2f} s, worst {waits[-1]:.2f} s, "
          f"{len(strangers_bound)} strangers bound meanwhile")
    assert logfmt.find(agent.log_text(), decision="handover")


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
