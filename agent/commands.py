"""`reservoir status` and `reservoir release`: read and remove locks from the command line."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client

from agent.planner.capacity import node_states
from agent.planner.model import Snapshot
from agent.planner.ordering import QueueScore, score_queues
from agent.planner.plan import current_locks, plan
from agent.writer import Writer
from shared import keys, kinds
from shared.config import ReservoirConfig
from shared.duration import format_duration
from shared.kube import new_api_client
from shared.ownership import pod_queue
from shared.timestamps import stamp
from shared.watchcache import Skipped, WatchCache


async def _list(api: client.ApiClient, kind: kinds.Watched, skipped: list[Skipped] | None = None) -> list[Any]:
    """Every object of one watched kind, as its view, listed the way the agent's caches list it: an API that is not
    installed lists as empty, and an object that cannot be read is left out and added to `skipped`."""
    cache: WatchCache[Any] = WatchCache.of(api, kind, on_skip=skipped.append if skipped is not None else None)
    await cache.list()
    return list(cache.items.values())


async def read_snapshot(api: client.ApiClient, namespace: str) -> tuple[Snapshot, ReservoirConfig, list[Skipped]]:
    skipped: list[Skipped] = []
    nodes = await _list(api, kinds.NODES, skipped)
    groups = await _list(api, kinds.PODGROUPS, skipped)
    config = ReservoirConfig()
    for configmap in await _list(api, kinds.config_map(namespace), skipped):
        config, _ = kinds.config_from("ADDED", configmap, config)
    snapshot = Snapshot(
        nodes={n.name: n for n in nodes},
        pods=await _list(api, kinds.PODS, skipped),
        podgroups={(g.namespace, g.name): g for g in groups},
        queues={q.name: q for q in await _list(api, kinds.QUEUES, skipped)},
        priority_classes={c.name: c for c in await _list(api, kinds.PRIORITY_CLASSES, skipped)},
        reservations={r.name: r for r in await _list(api, kinds.RESERVATIONS, skipped)},
    )
    return snapshot, config, skipped


def _age(since: datetime, now: datetime) -> str:
    return format_duration(now - since)


def queue_table(snapshot: Snapshot, config: ReservoirConfig) -> tuple[list[QueueScore], list[str]]:
    """Every queue (Queue objects and queues pods name), best first, with its score parts (seed 001)."""
    states = node_states(snapshot.nodes, snapshot.pods)
    named = {pod_queue(p, snapshot.podgroups) for p in snapshot.pods if not p.is_terminal}
    scores = score_queues(snapshot, states, named, config.queue_order)
    weights = config.queue_order
    lines = [f"{'QUEUE':<24}{'SCORE':>8}{'PRIORITY':>10}{'DRF':>8}{'PROPORTION':>12}   "
             f"(weights {weights.priority_weight:g}/{weights.drf_weight:g}/{weights.proportion_weight:g}, "
             f"{weights.ordering}, "
             f"{'by score' if weights.queue_score_order_enable else 'queueScoreOrderEnable false: by plugin order'})"]
    for s in scores:
        lines.append(f"{s.name:<24}{s.total:>8.3f}{s.priority_score:>10.3f}{s.drf_score:>8.3f}"
                     f"{s.proportion_score:>12.3f}   priority {s.priority}, dominant share {s.drf_share:.3f}, "
                     f"share of deserved {s.proportion_share:.3f}")
    return scores, lines or ["(no queues)"]


async def status(kubeconfig: str | None, namespace: str, output: str, queues: bool = False) -> str:
    api = await new_api_client(kubeconfig)
    try:
        snapshot, config, skipped = await read_snapshot(api, namespace)
    finally:
        await api.close()
    now = datetime.now(UTC)
    if queues:
        scores, lines = queue_table(snapshot, config)
        if output == "json":
            return json.dumps([{**s.__dict__, "allocated": s.allocated.to_quantities(),
                                "deserved": s.deserved.to_quantities()} for s in scores], indent=2)
        return "\n".join(lines)
    locks = current_locks(snapshot)
    planned = plan(snapshot, config, now, locks)
    starving = [j for j in planned.jobs if j.starving]
    if output == "json":
        return json.dumps({
            "locks": [{"node": lock.node, **lock.info(), "age": _age(lock.since, now),
                       **({"unreadable": lock.unreadable} if lock.unreadable else {})}
                      for lock in sorted(locks.values(), key=lambda lock: lock.node)],
            "starvingJobs": [j.__dict__ for j in starving],
            "windows": [{"name": w.name, "active": w.active, "start": w.start.isoformat(), "end": w.end.isoformat(),
                         "reason": w.reason} for w in planned.windows],
            "guarantees": [{"queue": g.queue, "policy": g.policy, "nodes": list(g.nodes), "reason": g.reason}
                           for g in planned.guarantees],
            "skipped": [{"kind": s.kind, "name": s.name, "error": s.error} for s in skipped],
        }, indent=2, default=str)
    lines = [f"{'NODE':<24}{'KIND':<13}{'OWNER':<44}{'AGE':<10}{'EXPIRES':<22}REASON"]
    for lock in sorted(locks.values(), key=lambda lock: lock.node):
        expires = stamp(lock.expires) if lock.expires else "-"
        lines.append(f"{lock.node:<24}{lock.kind.value:<13}{lock.subject:<44}{_age(lock.since, now):<10}"
                     f"{expires:<22}{lock.reason}{f' (unreadable: {lock.unreadable})' if lock.unreadable else ''}")
    if not locks:
        lines.append("(no locks)")
    lines += ["", f"{'STARVING JOB':<44}{'QUEUE':<16}{'PRIORITY':<10}{'BOUND':<8}REASON"]
    lines += [f"{j.subject:<44}{j.queue:<16}{j.priority:<10}{f'{j.bound}/{j.min_member}':<8}{j.reason}"
              for j in starving] or ["(none)"]
    lines += ["", f"{'WINDOW':<20}{'ACTIVE':<8}{'START':<22}{'END':<22}REASON"]
    lines += [f"{w.name:<20}{str(w.active).lower():<8}{stamp(w.start)}  {stamp(w.end)}  {w.reason}"
              for w in planned.windows] or ["(no windows configured)"]
    lines += ["", f"{'GUARANTEE OF QUEUE':<24}{'POLICY':<13}{'NODES':<8}REASON"]
    lines += [f"{g.queue:<24}{g.policy:<13}{len(g.nodes):<8}{g.reason}"
              for g in planned.guarantees] or ["(no queue guarantees)"]
    if skipped:  # objects no cache can read: Reservoir acts as if they did not exist
        lines += ["", f"{'SKIPPED OBJECT':<44}ERROR"]
        lines += [f"{s.kind + ' ' + s.name:<44}{s.error}" for s in skipped]
    return "\n".join(lines)


async def release(kubeconfig: str | None, nodes: list[str], everything: bool) -> list[str]:
    """Remove Reservoir's locks (taint, labels, info annotation, and a starvation cool-down record) and nothing
    else."""
    api = await new_api_client(kubeconfig)
    try:
        writer = Writer(api, component="reservoir-release")
        listed = await _list(api, kinds.NODES)
        targets = [n.name for n in listed if everything or n.name in nodes]
        done = []
        for name in targets:
            # a starvation cool-down record (keys.LOCK_EXPIRED) goes too: nothing of Reservoir's is left on the node
            before, patched = await writer.set_lock(name, None, {keys.LOCK_EXPIRED: None})
            if patched:
                what = f"{before.kind.value} {before.subject}" if before else "leftover lock keys"
                done.append(f"{name}: released {what}")
                await writer.event(name, "NodeReleased", "released by `reservoir release`")
        return done or ["no Reservoir locks found"]
    finally:
        await api.close()
