"""Issue 13, "Works with Volcano's real CRDs": with Volcano's own Queue and PodGroup CRDs installed instead of
Reservoir's (unchanged copies in ../shared/fixtures/volcano/), kube-apiserver prunes `spec.priorityClassName` and
`spec.guarantee.policy` / `.percentage` from Queues; their annotation forms carry them instead. Queue priority
inheritance (the webhook), a queue guarantee locking nodes (the agent, opted in) and QueueScoreOrder all work through
the annotations, and the webhook refuses a malformed one naming it.

The session's control plane is shared with every other test file, so the CRDs are swapped in place (PUT of the same
CRD names: no CRD is deleted, so no Queue or PodGroup is lost) and Reservoir's are put back after each test, each
swap awaited until kube-apiserver serves the new schema (a dry-run create shows it)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster.agent_process import AgentProcess
from localcluster.webhook_process import WebhookProcess
from shared import keys
from shared.ownership import queue_owner_id
from tests import logfmt
from tests.conftest import unavailable
from tests.e2e.kit import REPO, Kit, apply_setup, running_webhook
from tests.e2e.scenarios import QUEUE_CONFIG, SETUP, configure, locked_nodes

VOLCANO = f"/apis/{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FIXTURES = REPO / "tests" / "fixtures" / "volcano"  # Volcano's CRDs, copied unchanged
VOLCANO_CRDS = (FIXTURES / "scheduling.volcano.sh_queues.yaml", FIXTURES / "scheduling.volcano.sh_podgroups.yaml")
# Reservoir's own copies of the same two CRDs, wherever the setup installs them from
OUR_CRDS = tuple(REPO / name for name in SETUP if Path(name).name.startswith(f"{keys.VOLCANO_GROUP}_"))
GOLD, BRONZE = "reservoir-test-gold", "reservoir-test-bronze"
OPT_IN = {keys.QUEUE_LOCK_GUARANTEE: "true"}


def _crd(path: Path) -> dict[str, Any]:
    docs = yaml.safe_load_all(path.read_text())
    return next(doc for doc in docs if doc and doc["kind"] == "CustomResourceDefinition")


async def _replace_crds(kit: Kit, paths: tuple[Path, ...]) -> None:
    """PUT each CRD over the one of the same name (a replace, whoever applied it before: no field of the other
    schema survives), retried on a conflict."""
    for path in paths:
        want = _crd(path)
        name = want["metadata"]["name"]
        for _ in range(10):
            body = copy.deepcopy(want)
            current = await kit.raw("GET", f"{CRDS}/{name}")
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            answer = await kit.attempt("PUT", f"{CRDS}/{name}", body=body)
            if answer.get("kind") == "CustomResourceDefinition":
                break
            assert answer.get("reason") == "Conflict", f"replacing CRD {name}: {answer}"
        else:
            raise AssertionError(f"CRD {name} not replaced after 10 conflicts")


async def _served_schemas(kit: Kit) -> str:
    """Whose Queue and PodGroup schemas kube-apiserver serves now, by dry-run creates: Volcano's prunes a Queue's
    `spec.priorityClassName` and, with no status subresource, keeps a new PodGroup's status; Reservoir's keeps the
    former and, with one, drops the latter. "volcano", "reservoir", or what it saw when the two disagree."""
    queue = await kit.raw("POST", f"{VOLCANO}/queues?dryRun=All", body={
        "apiVersion": keys.VOLCANO_API_VERSION, "kind": "Queue", "metadata": {"generateName": "schema-probe-"},
        "spec": {"weight": 1, "priorityClassName": "schema-probe"}})
    group = await kit.raw("POST", f"{VOLCANO}/namespaces/{kit.namespace}/podgroups?dryRun=All", body={
        "apiVersion": keys.VOLCANO_API_VERSION, "kind": "PodGroup", "metadata": {"generateName": "schema-probe-"},
        "spec": {"minMember": 1}, "status": {"phase": "Pending"}})
    assert queue.get("kind") == "Queue" and group.get("kind") == "PodGroup", (queue, group)
    pruned = "priorityClassName" not in (queue.get("spec") or {})
    kept = (group.get("status") or {}).get("phase") == "Pending"
    return {(True, True): "volcano", (False, False): "reservoir"}.get((pruned, kept), f"queue pruned {pruned}, "
                                                                                     f"podgroup status kept {kept}")


async def _serve(kit: Kit, paths: tuple[Path, ...], whose: str) -> None:
    await _replace_crds(kit, paths)
    async def served() -> bool:
        return await _served_schemas(kit) == whose
    await kit.wait_for(served, what=f"kube-apiserver serving {whose}'s Queue and PodGroup schemas", timeout=30)


@pytest.fixture
async def volcano_crds(kit: Kit) -> AsyncIterator[list[str]]:
    """Reservoir's setup (namespace, RBAC of both components), then Volcano's CRDs in place of Reservoir's; yields the
    list of Queues a test creates. Afterwards the Queues, PriorityClasses, config and lease are deleted and Reservoir's
    CRDs served again, whatever the test did."""
    if not all(path.is_file() for path in VOLCANO_CRDS):
        message = f"Volcano's CRDs not found in {FIXTURES}"
        unavailable(message)
    assert OUR_CRDS, f"no Queue or PodGroup CRD among the setup files {SETUP}"
    await apply_setup(kit, *SETUP, "deploy/webhook-rbac.yaml")
    created: list[str] = []
    try:
        await _serve(kit, VOLCANO_CRDS, "volcano")
        yield created
    finally:
        for name in created:
            await kit.raw("DELETE", f"{VOLCANO}/queues/{name}")
        for name in (GOLD, BRONZE):
            await kit.raw("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
        await kit.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent")
        await _serve(kit, OUR_CRDS, "reservoir")


@pytest.fixture
async def webhook(kit: Kit, volcano_crds: list[str]) -> AsyncIterator[WebhookProcess]:
    async with running_webhook(kit) as process:
        yield process


async def apply_queue(kit: Kit, created: list[str], name: str, spec: dict[str, Any],
                      annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Server-side apply of a Queue (only fields Volcano's schema declares: apply refuses undeclared ones)."""
    if name not in created:
        created.append(name)
    return await kit.server_side_apply({"apiVersion": keys.VOLCANO_API_VERSION, "kind": "Queue",
                                        "metadata": {"name": name, "annotations": dict(annotations or {})},
                                        "spec": spec})


async def priority_class(kit: Kit, name: str, value: int) -> None:
    await kit.server_side_apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                 "metadata": {"name": name}, "value": value})


async def wait_locks(kit: Kit, names: list[str], want: dict[str, int], timeout: float = 30) -> dict[str, str]:
    """Until the lock owners over `names` count as `want` (owner -> number of nodes)."""
    async def probe() -> list[dict[str, str]] | None:
        locks = await locked_nodes(kit, names)
        counts: dict[str, int] = {}
        for owner in locks.values():
            counts[owner] = counts.get(owner, 0) + 1
        return [locks] if counts == want else None  # a list, so that no locks at all still counts as found
    return (await kit.wait_for(probe, what=f"locks {want}", timeout=timeout))[0]


def _refusal(answer: dict[str, Any]) -> str:
    assert answer.get("kind") == "Status" and answer.get("status") == "Failure", f"let in: {answer}"
    return str(answer.get("message"))


async def test_queue_priority_class_annotation_is_inherited_and_annotations_are_validated(
        kit: Kit, volcano_crds: list[str], webhook: WebhookProcess) -> None:
    """Seed 001 on Volcano's schema: `spec.priorityClassName` is pruned as the Queue is stored; the annotation
    `reservoir.sh/priority-class` gives a PodGroup and a pod of the queue its class (with value and preemption policy,
    so kube-apiserver's Priority plugin accepts the pod). A malformed annotation is refused, naming it."""
    await priority_class(kit, GOLD, 1000)
    queue = f"vc-gold-{kit.namespace[-5:]}"
    volcano_crds.append(queue)
    # as a seed 001 user writes it: the field (pruned here, kube-apiserver only warns) and its annotation
    stored = await kit.raw("POST", f"{VOLCANO}/queues", body={
        "apiVersion": keys.VOLCANO_API_VERSION, "kind": "Queue",
        "metadata": {"name": queue, "annotations": {keys.QUEUE_PRIORITY_CLASS: GOLD}},
        "spec": {"weight": 1, "priorityClassName": GOLD}})
    assert stored.get("kind") == "Queue", stored
    assert "priorityClassName" not in stored["spec"], "Volcano's schema prunes the field"

    pods = f"/api/v1/namespaces/{kit.namespace}/pods"
    body = kit.pod_body("member-0", {"cpu": "1"}, annotations={keys.QUEUE_NAME: queue})

    async def seen() -> bool:  # the webhook reads its caches: dry-run creates until it has seen the Queue
        return (await kit.raw("POST", pods + "?dryRun=All", body=body))["spec"].get("priorityClassName") == GOLD
    await kit.wait_for(seen, what="the webhook seeing the Queue", timeout=20)
    pod = await kit.raw("POST", pods, body=body)
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == (GOLD, 1000), pod["spec"]
    assert pod["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
    group = await kit.raw("POST", f"{VOLCANO}/namespaces/{kit.namespace}/podgroups", body={
        "apiVersion": keys.VOLCANO_API_VERSION, "kind": "PodGroup", "metadata": {"name": "gang"},
        "spec": {"minMember": 1, "queue": queue}})
    assert group.get("kind") == "PodGroup" and group["spec"].get("priorityClassName") == GOLD, group

    # the validating webhook checks the annotations as it checks the fields (it is reached by Queues that set
    # spec.guarantee, capability or deserved: deploy/webhook-configurations.yaml's matchConditions)
    bad = f"vc-bad-{kit.namespace[-5:]}"
    for marks, fragment in (
            ({keys.QUEUE_GUARANTEE_POLICY: "sometimes"},
             'metadata.annotations["reservoir.sh/guarantee-policy"] is \'sometimes\': expected Best-Effort or '
             'Guaranteed'),
            ({keys.QUEUE_GUARANTEE_PERCENTAGE: "50%"},
             'metadata.annotations["reservoir.sh/guarantee-percentage"]: \'50%\' is not JSON'),
            ({keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["cpu"], "value": 2}'},
             'metadata.annotations["reservoir.sh/guarantee-percentage"].value is 2: expected a number in [0, 1]')):
        answer = await kit.attempt("POST", f"{VOLCANO}/queues", body={
            "apiVersion": keys.VOLCANO_API_VERSION, "kind": "Queue",
            "metadata": {"name": bad, "annotations": marks},
            "spec": {"weight": 1, "guarantee": {"resource": {"cpu": "1"}}}})
        message = _refusal(answer)
        assert "denied the request" in message and fragment in message, message
    good = await apply_queue(kit, volcano_crds, bad, {"weight": 1, "guarantee": {"resource": {"cpu": "1"}}},
                             {keys.QUEUE_GUARANTEE_POLICY: "Guaranteed", **OPT_IN,
                              keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["cpu"], "value": 0.5}'})
    assert good.get("kind") == "Queue", good


async def test_a_guarantee_written_as_annotations_locks_nodes_and_is_released(
        kit: Kit, volcano_crds: list[str]) -> None:
    """Seed 002 on Volcano's schema: `reservoir.sh/guarantee-percentage` (half the nodes, by cpu) and
    `reservoir.sh/guarantee-policy: Guaranteed` on an opted-in Queue lock two of four nodes with the exclusive taint
    and write status.reservation (which Volcano's status schema declares); the policy back to Best-Effort drops the
    exclusive taint and the percentage removed releases them, without a restart."""
    await configure(kit, QUEUE_CONFIG)
    names = [f"vg-{i}" for i in range(1, 5)]
    for name in names:
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"})
    queue = f"vc-half-{kit.namespace[-5:]}"
    owner = queue_owner_id(queue)
    half = {keys.QUEUE_GUARANTEE_PERCENTAGE: '{"dimensions": ["cpu"], "value": 0.5}'}
    await apply_queue(kit, volcano_crds, queue, {"weight": 1},
                      {**OPT_IN, **half, keys.QUEUE_GUARANTEE_POLICY: "Guaranteed"})
    agent = AgentProcess(kit.cluster)
    agent.start()
    try:
        locks = await wait_locks(kit, names, {owner: 2})

        async def exclusive() -> set[str]:
            return {name for name in names for taint in (await kit.read_node(name))["spec"].get("taints") or []
                    if taint["key"] == keys.LOCK_EXCLUSIVE and taint["value"] == owner}
        assert await kit.wait_for(exclusive, what="the Guaranteed policy's exclusive taints", timeout=20) == set(locks)

        async def status_written() -> dict[str, Any] | None:
            reservation = ((await kit.raw("GET", f"{VOLCANO}/queues/{queue}")).get("status") or {}).get("reservation")
            return reservation if reservation and sorted(reservation.get("nodes", [])) == sorted(locks) else None
        reservation = await kit.wait_for(status_written, what="Queue status.reservation", timeout=20)
        assert reservation["resource"]["cpu"] == "8", reservation

        await apply_queue(kit, volcano_crds, queue, {"weight": 1}, {**OPT_IN, **half,
                                                                   keys.QUEUE_GUARANTEE_POLICY: "Best-Effort"})
        async def not_exclusive() -> bool:
            return not await exclusive()
        await kit.wait_for(not_exclusive, what="the exclusive taints gone with the Best-Effort policy", timeout=20)
        assert await locked_nodes(kit, names) == locks, "the same nodes stay locked"

        await apply_queue(kit, volcano_crds, queue, {"weight": 1}, OPT_IN)
        await wait_locks(kit, names, {})
        assert f"cache=queues skipped=Queue {queue} " not in agent.log_text(), "the Queue was readable throughout"
    finally:
        agent.stop()


async def test_queue_score_order_reads_the_priority_class_annotation(kit: Kit, volcano_crds: list[str]) -> None:
    """Seed 001 QueueScoreOrder on Volcano's schema: maxLockedNodePercent 50 over four nodes leaves two lockable and
    both queues' guarantees (Volcano's own `spec.guarantee.resource`) want two nodes. bronze is older, so it wins a
    tie; gold's class, named only by its annotation, gives it the higher priority score: gold gets the locks."""
    await configure(kit, QUEUE_CONFIG.replace("maxLockedNodePercent: 90", "maxLockedNodePercent: 50"))
    names = [f"vo-{i}" for i in range(1, 5)]
    for name in names:
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"})
    await priority_class(kit, GOLD, 1000)
    suffix = kit.namespace[-5:]
    gold, bronze = f"vc-gold-{suffix}", f"vc-bronze-{suffix}"
    guarantee = {"weight": 1, "guarantee": {"resource": {"cpu": "8"}}}
    await apply_queue(kit, volcano_crds, bronze, guarantee, OPT_IN)
    await apply_queue(kit, volcano_crds, gold, guarantee, {**OPT_IN, keys.QUEUE_PRIORITY_CLASS: GOLD})
    agent = AgentProcess(kit.cluster)
    agent.start()
    try:
        await wait_locks(kit, names, {queue_owner_id(gold): 2})
        out = subprocess.run([sys.executable, "-m", "reservoir.cli", "status", "--queues", "-o", "json",
                              f"--kubeconfig={kit.cluster.kubeconfig}"], capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, out.stderr
        scores = [q for q in json.loads(out.stdout) if q["name"] in (gold, bronze)]
        assert [(q["name"], q["priority"]) for q in scores] == [(gold, 1000), (bronze, 0)], scores
        assert logfmt.find(agent.log_text(), queue=bronze, decision="no-lock")
    finally:
        agent.stop()
