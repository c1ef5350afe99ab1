"""Issue 10, lease fencing on the real control plane: the agent loses its Lease in the middle of a reconcile and writes
nothing afterwards.

A window wants three of four nodes, and a pending reserve pod lacks the window's toleration (the webhook is not
running): one reconcile would patch three nodes, then repair the pod. The failpoint `pause-after-node-patches:1:6`
holds that reconcile for 6 s right after its first node patch. Meanwhile a rival writes itself into the Lease through
the API and keeps renewing it, as another replica would. The agent's next Lease read shows the rival, the fence
closes, and when the reconcile resumes it writes nothing more: no second or third node lock, no Event, no repair;
then the election library gives up leading and the rival keeps the Lease."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

from agent.writer import FAILPOINT
from localcluster.agent_process import AgentProcess
from shared import keys
from shared.ownership import window_owner_id
from tests import logfmt
from tests.e2e.kit import Kit, apply_setup
from tests.e2e.scenarios import SETUP, configure, window_config

LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{keys.NAMESPACE}/leases/reservoir-agent"
NODES = [f"fence-{i}" for i in range(1, 5)]
PAUSE = 6


def _micro_time(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def seize_lease(kit: Kit, holder: str) -> dict[str, Any]:
    """Write `holder` into the Lease (a fresh renewTime), as a rival replica's renewal would; retried on conflict."""
    for _ in range(20):
        lease = await kit.raw("GET", LEASE)
        now = datetime.now(UTC)
        spec = lease.setdefault("spec", {})
        if spec.get("holderIdentity") != holder:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=holder, renewTime=_micro_time(now), leaseDurationSeconds=15)
        written = await kit.attempt("PUT", LEASE, body=lease)
        if written and written.get("kind") == "Lease":
            return written
        await asyncio.sleep(0.1)  # 409: the agent renewed in between; read again
    raise AssertionError(f"could not write {holder} into the Lease")


async def keep_renewing(kit: Kit, holder: str) -> None:
    while True:
        await asyncio.sleep(2)
        await seize_lease(kit, holder)


async def lock_state(kit: Kit) -> dict[str, tuple[Any, ...]]:
    """Per node: Reservoir's taint values, lock label and lock-info annotation (what the agent writes)."""
    state = {}
    for name in NODES:
        node = await kit.read_node(name)
        taints = tuple(t.get("value") for t in node["spec"].get("taints") or [] if t["key"] == keys.LOCK)
        state[name] = (taints, (node["metadata"].get("labels") or {}).get(keys.LOCK),
                       (node["metadata"].get("annotations") or {}).get(keys.LOCK_INFO))
    return state


async def node_locked_events(kit: Kit) -> list[str]:
    events = await kit.raw("GET", "/api/v1/namespaces/default/events?fieldSelector=reason=NodeLocked")
    return [e["involvedObject"]["name"] for e in events.get("items", []) if e["involvedObject"]["name"] in NODES]


async def test_agent_that_loses_its_lease_mid_reconcile_writes_nothing_afterwards(kit: Kit) -> None:
    await apply_setup(kit, *SETUP)
    config = window_config("fence", "{pool: fence}", cpu="12", pod_num_to_reserve=None)
    await configure(kit, config)
    for name in NODES:
        await kit.create_node(name, {"cpu": "4", "memory": "16Gi"}, labels={"pool": "fence"})
    # a reserve pod that stays pending (its selector matches no node) and lacks the window's toleration
    await kit.create_pod("reserve", {"cpu": "1"}, annotations={keys.RESERVEABLE: "true"},
                         extra_spec={"nodeSelector": {"pool": "nowhere"}})
    owner = window_owner_id("fence")

    agent = AgentProcess(kit.cluster, identity="agent-a")
    rival: asyncio.Task[None] | None = None
    try:
        agent.start(env={FAILPOINT: f"pause-after-node-patches:1:{PAUSE}"})
        await kit.wait_for(lambda: _log_has(agent, "pausing mid-reconcile"), what="the reconcile paused after one "
                           "node patch", timeout=60)
        await seize_lease(kit, "rival")
        rival = asyncio.create_task(keep_renewing(kit, "rival"))
        taken = await lock_state(kit)
        assert taken["fence-1"][0] == (owner,) and taken["fence-1"][1] == owner, taken
        assert all(taken[n] == ((), None, None) for n in NODES[1:]), f"one node patched before the pause: {taken}"

        await kit.wait_for(lambda: _log_has(agent, "resuming"), what="the reconcile resuming", timeout=PAUSE + 10)
        await kit.wait_for(lambda: _log_has(agent, "stopped mid-batch"), what="the writer fenced mid-batch",
                           timeout=10)
        log = agent.log_text()
        assert logfmt.find(log, decision="fenced", reason="the Lease is held by rival, not agent-a"), log
        # the election library gives up leading after its renew deadline; the rival keeps the Lease
        await kit.wait_for(lambda: _log_has(agent, "leader=lost"), what="the agent giving up leadership", timeout=20)
        await asyncio.sleep(4)  # a few more of the agent's own Lease attempts and would-be resyncs (2 s)

        assert await lock_state(kit) == taken, "no node written after the Lease was lost"
        assert await node_locked_events(kit) == [], "no Event either (fence-1's came after the patch, fenced too)"
        pod = await kit.read_pod("reserve")
        assert not any(t.get("key") == keys.LOCK for t in pod["spec"].get("tolerations") or []), \
            "the repair the plan asked for was not written"
        log = agent.log_text()
        assert not logfmt.find(log, node="fence-2", decision="lock") and not logfmt.find(log, decision="repair"), log
        assert (await kit.raw("GET", LEASE))["spec"]["holderIdentity"] == "rival"
        assert agent.running(), "fenced, not crashed"
    finally:
        if rival is not None:
            rival.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rival
        agent.stop()
        await kit.raw("DELETE", f"/api/v1/namespaces/{keys.NAMESPACE}/configmaps/{keys.CONFIGMAP_NAME}")
        await kit.raw("DELETE", LEASE)


async def _log_has(agent: AgentProcess, text: str) -> bool:
    return text in agent.log_text()
