"""The docs' examples, run as their reader runs them (tests/docs_examples.py): each command block marked
`<!-- example: NAME -->` on Getting started and the concept pages is run by bash, in page order, with `kubectl` and
`reservoir` in PATH and KUBECONFIG naming the local control plane, against what `make up` sets up (the same
manifests, the config of deploy/configmap.yaml, three 8-cpu kwok nodes, the webhook and the agent as their
ServiceAccounts); between and after the blocks, each story checks what the page says the reader sees."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from localcluster.agent_process import AgentProcess
from localcluster.cluster import LocalCluster
from shared import keys
from shared.keys import LockKind
from shared.ownership import JobRef
from tests.docs_examples import REPO, Block, examples
from tests.e2e.kit import Kit
from tests.e2e.scenarios import running_agent

NODES = ("kwok-node-0", "kwok-node-1", "kwok-node-2")  # make up's (localcluster/__main__.py), 8 cpu and 32Gi each


async def shell(cluster: LocalCluster, block: Block) -> str:
    """Run the block with bash (-euo pipefail) from the repository, as the page's reader in make up's shell; return
    its output. A failing command fails the test, naming the page and the block."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
           "PATH": os.pathsep.join((str(cluster.bin_dir), str(REPO / ".venv" / "bin"), os.environ.get("PATH", "")))}
    process = await asyncio.create_subprocess_exec(
        "bash", "-euo", "pipefail", "-c", block.text, cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    text = out.decode(errors="replace")
    assert process.returncode == 0, f"{block.page}:{block.line} failed ({process.returncode}):\n{block.text}\n{text}"
    return text


async def lock_on(kit: Kit, node: str) -> str | None:
    taints = (await kit.read_node(node))["spec"].get("taints") or ()
    return next((t.get("value") for t in taints if t["key"] == keys.LOCK), None)


async def bound_to(kit: Kit, name: str, namespace: str = "default") -> str | None:
    pod = await kit.raw("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod["spec"].get("nodeName") or None


async def seed_000(kit: Kit, blocks: list[Block], agent: AgentProcess) -> None:
    """Getting started, "The first lock": the stream, then (about 10 s later) the big pod; after the 30 s threshold
    kwok-node-0 is locked for it, `reservoir status` shows the lock, the other questions answer, and the big pod runs
    on the node while small pods wait."""
    stream, big, status, questions = blocks
    await shell(kit.cluster, stream)
    await asyncio.sleep(10)  # the page: "Wait about 10 s"
    await shell(kit.cluster, big)
    owner = JobRef("default", "Pod", "big")

    async def locked() -> str | None:
        return await lock_on(kit, "kwok-node-0") if await lock_on(kit, "kwok-node-0") == owner.owner_id else None
    try:
        await kit.wait_for(locked, what="kwok-node-0 locked for the big pod", timeout=90)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{agent.log_text()[-3000:]}") from None
    shown = await shell(kit.cluster, status)
    assert "kwok-node-0" in shown and owner.full_name in shown, shown
    answers = await shell(kit.cluster, questions)
    assert "big" in answers, answers
    await kit.wait_for(lambda: bound_to(kit, "big"), what="the big pod placed", timeout=90)
    assert await bound_to(kit, "big") == "kwok-node-0"


async def seed_001(kit: Kit, blocks: list[Block], agent: AgentProcess) -> None:
    """Queue priority, "See it": each pod that named no class takes its queue's (example-high, example-low), and once
    the agent has planned, `reservoir status --queues` lists team-high before team-low."""
    create, queues = blocks
    shown = await shell(kit.cluster, create)
    classes = {line.split()[0]: line.split()[1] for line in shown.splitlines() if line.endswith(("100000", "1000"))}
    assert classes == {"high-job": "example-high", "low-job": "example-low"}, shown

    async def ordered() -> str | None:
        out = await shell(kit.cluster, queues)
        return out if "team-high" in out and "team-low" in out else None
    try:
        out = await kit.wait_for(ordered, what="both queues scored in the published plan", timeout=90)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{agent.log_text()[-3000:]}") from None
    assert out.index("team-high") < out.index("team-low"), out


async def seed_002(kit: Kit, blocks: list[Block], agent: AgentProcess) -> None:
    """Queue guarantees, "Try it": the Queue `research`, guaranteed 8 cpu with its lock opted in, and its pod; a node
    is locked for the queue and the pod lands on it; run again once locked, `reservoir status` and the Queue's status
    show the lock."""
    [block] = blocks
    await shell(kit.cluster, block)

    async def queue_lock() -> str | None:
        for node in NODES:
            labels = (await kit.read_node(node))["metadata"].get("labels") or {}
            if labels.get(keys.LOCK_KIND) == LockKind.QUEUE.value and await lock_on(kit, node):
                return node
        return None
    try:
        node = await kit.wait_for(queue_lock, what="a node locked for the queue research", timeout=60)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{agent.log_text()[-3000:]}") from None
    await kit.wait_for(lambda: bound_to(kit, "research-job"), what="research-job placed", timeout=60)
    assert await bound_to(kit, "research-job") == node
    shown = await shell(kit.cluster, block)
    assert node in shown and "research" in shown, shown


async def seed_003(kit: Kit, blocks: list[Block], agent: AgentProcess) -> None:
    """Reservations, "Try it": the Reservation `train-capacity` (4 cpu for pods labelled app=train) becomes
    Available on a node, held by a placeholder; its owner `train-0` is handed over and runs on that node, the
    Reservation Succeeded, the placeholder gone, as the last block shows."""
    create, owner, look = blocks
    reservations = f"/apis/{keys.RESERVATION_API_VERSION}/{keys.RESERVATION_PLURAL}"
    await shell(kit.cluster, create)

    async def phase(wanted: str) -> dict[str, Any] | None:
        got = await kit.raw("GET", f"{reservations}/train-capacity")
        return got if (got.get("status") or {}).get("phase") == wanted else None
    try:
        available = await kit.wait_for(lambda: phase("Available"), what="train-capacity Available", timeout=60)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{agent.log_text()[-3000:]}") from None
    node = available["status"]["nodeName"]
    await shell(kit.cluster, owner)
    await kit.wait_for(lambda: phase("Succeeded"), what="train-capacity Succeeded", timeout=60)
    assert await bound_to(kit, "train-0") == node
    shown = await shell(kit.cluster, look)
    assert f"train-0   {node}" in shown and "Succeeded" in shown and "No resources found" in shown, shown


STORIES: dict[str, Callable[[Kit, list[Block], AgentProcess], Awaitable[None]]] = {
    "seed-001": seed_001,
    "seed-000": seed_000,
    "seed-002": seed_002,
    "seed-003": seed_003,
}


@pytest.fixture
async def made_up(kit: Kit) -> AsyncIterator[AgentProcess]:
    """What `make up` sets up, in the suite's control plane; what the examples made in `default`, and their Queue
    and config, removed after."""
    for node in NODES:
        await kit.create_node(node, {"cpu": "8", "memory": "32Gi"})
    try:
        async with running_agent(kit, None, "deploy/configmap.yaml", webhook=True) as agent:
            yield agent
    finally:
        await kit.attempt("DELETE", "/apis/apps/v1/namespaces/default/deployments/small-stream")
        for pod in ("big", "research-job", "train-0", "high-job", "low-job"):
            await kit.attempt("DELETE", f"/api/v1/namespaces/default/pods/{pod}?gracePeriodSeconds=0")
        for queue in ("research", "team-high", "team-low"):
            await kit.attempt("DELETE", f"/apis/{keys.VOLCANO_API_VERSION}/queues/{queue}")
        for priority_class in ("example-high", "example-low"):
            await kit.attempt("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{priority_class}")
        await kit.attempt("DELETE", f"/apis/{keys.RESERVATION_API_VERSION}/{keys.RESERVATION_PLURAL}/train-capacity")
        await kit.attempt("DELETE", "/api/v1/namespaces/default/pods?labelSelector=app%3Dsmall&gracePeriodSeconds=0")


@pytest.mark.parametrize("name", sorted(examples()))
async def test_a_docs_example_does_what_its_page_says(name: str, kit: Kit, made_up: AgentProcess) -> None:
    story = STORIES.get(name)
    assert story is not None, f"the docs name an example {name!r} no story here runs"
    await story(kit, examples()[name], made_up)


def test_every_story_here_is_an_example_of_the_docs() -> None:
    assert set(STORIES) == set(examples()), (set(STORIES), set(examples()))

