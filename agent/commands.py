"""`reservoir status` and `reservoir release`: read and remove locks from the command line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import yaml
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
from shared.resources import Resources
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


OUTPUTS = ("table", "wide", "json", "yaml")


def _age(since: datetime, now: datetime) -> str:
    return format_duration(now - since)


def render_table(header: Sequence[str], rows: Iterable[Sequence[str]], empty: str | None = None) -> list[str]:
    """A table as kubectl prints one: each column as wide as its widest cell (header included), columns three spaces
    apart, the last column not padded. No rows: the header and `empty` (when given)."""
    body = [list(row) for row in rows]
    widths = [max(len(cell) for cell in column) for column in zip(header, *body, strict=True)]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in (list(header), *body)]
    if not body and empty is not None:
        lines.append(empty)
    return lines


def _quantities(resources: Resources) -> str:
    return _quantity_map(resources.to_quantities())


def queue_document(scores: Sequence[QueueScore]) -> list[dict[str, Any]]:
    """`reservoir status --queues -o json|yaml`: one entry per queue, best first (README, "reservoir status")."""
    return [{"name": s.name, "priority": s.priority, "score": s.total, "priorityScore": s.priority_score,
             "drfShare": s.drf_share, "drfScore": s.drf_score, "proportionShare": s.proportion_share,
             "proportionScore": s.proportion_score, "allocated": s.allocated.to_quantities(),
             "deserved": s.deserved.to_quantities()} for s in scores]


def queue_table(snapshot: Snapshot, config: ReservoirConfig, wide: bool = False) -> tuple[list[QueueScore], list[str]]:
    """Every queue (Queue objects and queues pods name), best first, with its score parts (seed 001)."""
    states = node_states(snapshot.nodes, snapshot.pods)
    named = {pod_queue(p, snapshot.podgroups) for p in snapshot.pods if not p.is_terminal}
    scores = score_queues(snapshot, states, named, config.queue_order)
    weights = config.queue_order
    order = "by score" if weights.queue_score_order_enable else "queueScoreOrderEnable false: by plugin order"
    header = ["QUEUE", "SCORE", "PRIORITY", "DRF", "PROPORTION", "QUEUE PRIORITY", "DOMINANT SHARE",
              "SHARE OF DESERVED"] + (["ALLOCATED", "DESERVED"] if wide else [])
    rows = [[s.name, f"{s.total:.3f}", f"{s.priority_score:.3f}", f"{s.drf_score:.3f}", f"{s.proportion_score:.3f}",
             str(s.priority), f"{s.drf_share:.3f}", f"{s.proportion_share:.3f}"]
            + ([_quantities(s.allocated), _quantities(s.deserved)] if wide else []) for s in scores]
    lines = [f"weights {weights.priority_weight:g}/{weights.drf_weight:g}/{weights.proportion_weight:g} "
             f"(priority/drf/proportion), {weights.ordering}, {order}"]
    return scores, lines + render_table(header, rows, "(no queues)")


def status_document(snapshot: Snapshot, config: ReservoirConfig, skipped: Sequence[Skipped],
                    now: datetime) -> dict[str, Any]:
    """`reservoir status -o json|yaml`: the one shape, every key camelCase as the API's (README, "reservoir status").
    Every key is always present; a value that does not apply is null. Times are RFC 3339, UTC."""
    locks = current_locks(snapshot)
    planned = plan(snapshot, config, now, locks)
    return {
        "locks": [{"node": lock.node, "owner": lock.owner, "kind": lock.kind.value, "subject": lock.subject,
                   "reason": lock.reason, "since": stamp(lock.since), "age": _age(lock.since, now),
                   "expires": stamp(lock.expires) if lock.expires else None,
                   "reserved": lock.reserved.to_quantities(), "tasks": list(lock.tasks),
                   "exclusive": lock.exclusive, "unreadable": lock.unreadable or None}
                  for lock in sorted(locks.values(), key=lambda lock: lock.node)],
        "starvingJobs": [{"subject": j.subject, "owner": j.owner, "queue": j.queue, "priority": j.priority,
                          "minMember": j.min_member, "bound": j.bound, "pending": j.pending, "reason": j.reason}
                         for j in planned.jobs if j.starving],
        "windows": [{"name": w.name, "active": w.active, "start": stamp(w.start), "end": stamp(w.end),
                     "reason": w.reason} for w in planned.windows],
        "guarantees": [{"queue": g.queue, "policy": g.policy, "nodes": list(g.nodes),
                        "resource": g.resource.to_quantities(), "reason": g.reason, "warning": g.warning}
                       for g in planned.guarantees],
        "skipped": [{"kind": s.kind, "name": s.name, "error": s.error} for s in skipped],
    }


def _joined(values: Sequence[str]) -> str:
    return ",".join(values) or "-"


def _quantity_map(quantities: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(quantities.items())) or "-"


def status_tables(document: dict[str, Any], wide: bool = False) -> list[str]:
    """The tables of `reservoir status` (`-o table`, or `-o wide` with more columns), from status_document."""
    def columns(base: list[str], more: list[str]) -> list[str]:
        return base + more if wide else base

    lines = render_table(
        columns(["NODE", "KIND", "OWNER", "AGE", "EXPIRES"], ["SINCE", "EXCLUSIVE", "RESERVED", "TASKS"]) + ["REASON"],
        (columns([lock["node"], lock["kind"], lock["subject"], lock["age"], lock["expires"] or "-"],
                 [lock["since"], str(lock["exclusive"]).lower(), _quantity_map(lock["reserved"]),
                  _joined(lock["tasks"])])
         + [lock["reason"] + (f" (unreadable: {lock['unreadable']})" if lock["unreadable"] else "")]
         for lock in document["locks"]), "(no locks)")
    lines += [""] + render_table(
        columns(["STARVING JOB", "QUEUE", "PRIORITY", "BOUND"], ["PENDING", "OWNER"]) + ["REASON"],
        (columns([j["subject"], j["queue"], str(j["priority"]), f"{j['bound']}/{j['minMember']}"],
                 [str(j["pending"]), j["owner"]]) + [j["reason"]] for j in document["starvingJobs"]), "(none)")
    lines += [""] + render_table(
        ["WINDOW", "ACTIVE", "START", "END", "REASON"],
        ([w["name"], str(w["active"]).lower(), w["start"], w["end"], w["reason"]] for w in document["windows"]),
        "(no windows configured)")
    lines += [""] + render_table(
        columns(["GUARANTEE OF QUEUE", "POLICY", "NODES"], ["NODE NAMES", "RESOURCE"]) + ["REASON"],
        (columns([g["queue"], g["policy"], str(len(g["nodes"]))], [_joined(g["nodes"]), _quantity_map(g["resource"])])
         + [g["reason"] + (f" (refused: {g['warning']})" if wide and g["warning"] else "")]
         for g in document["guarantees"]), "(no queue guarantees)")
    if document["skipped"]:  # objects no cache can read: Reservoir acts as if they did not exist
        lines += [""] + render_table(["SKIPPED OBJECT", "ERROR"],
                                     ([f"{s['kind']} {s['name']}", s["error"]] for s in document["skipped"]))
    return lines


def dump(document: Any, output: str) -> str:
    """`document` as `-o json` (indented, keys in document order) or `-o yaml` prints it."""
    if output == "yaml":
        return yaml.safe_dump(document, sort_keys=False, default_flow_style=False).rstrip("\n")
    return json.dumps(document, indent=2)


def render_status(snapshot: Snapshot, config: ReservoirConfig, skipped: Sequence[Skipped], now: datetime,
                  output: str, queues: bool = False) -> str:
    """What `reservoir status` prints for one snapshot, in `output` (one of OUTPUTS)."""
    if output not in OUTPUTS:
        raise ValueError(f"unknown output {output!r}: one of {', '.join(OUTPUTS)}")
    if queues:
        scores, lines = queue_table(snapshot, config, wide=output == "wide")
        return dump(queue_document(scores), output) if output in ("json", "yaml") else "\n".join(lines)
    document = status_document(snapshot, config, skipped, now)
    if output in ("json", "yaml"):
        return dump(document, output)
    return "\n".join(status_tables(document, wide=output == "wide"))


async def status(kubeconfig: str | None, namespace: str, output: str, queues: bool = False,
                 context: str | None = None) -> str:
    api = await new_api_client(kubeconfig, context=context)
    try:
        snapshot, config, skipped = await read_snapshot(api, namespace)
    finally:
        await api.close()
    return render_status(snapshot, config, skipped, datetime.now(UTC), output, queues)


async def release(kubeconfig: str | None, nodes: list[str], everything: bool,
                  context: str | None = None) -> list[str]:
    """Remove Reservoir's locks (taint, labels, info annotation, and a starvation cool-down record) and nothing
    else."""
    api = await new_api_client(kubeconfig, context=context)
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
