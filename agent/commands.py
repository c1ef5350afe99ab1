"""`reservoir status` and `reservoir release`: read and remove locks from the command line.

`reservoir status` reads the locks from the nodes and the rest from the plan the leading agent published
(agent.published); it lists no pod and plans nothing (issue 14). `--why POD` reads that one pod and what it names.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml
from kubernetes_asyncio import client

from agent.planner.model import Lock, Snapshot
from agent.planner.plan import current_locks
from agent.published import StatusError, freshness, parse_published, start_text
from agent.why import explain, why_text
from agent.writer import RELEASE_MARKS, Writer
from shared import keys, kinds
from shared.config import ReservoirConfig
from shared.duration import format_duration
from shared.kube import NotFound, get_json, new_api_client, resource_path
from shared.logs import printable
from shared.ownership import queue_name as queue_name_of
from shared.timestamps import stamp
from shared.views import PodGroupView, PodView, QueueView, ViewError, WorkloadView, workloads_by_owner
from shared.watchcache import Skipped, WatchCache


async def _list(api: client.ApiClient, kind: kinds.Watched, skipped: list[Skipped] | None = None) -> list[Any]:
    """Every object of one watched kind, as its view, listed the way the agent's caches list it: an API that is not
    installed lists as empty, and an object that cannot be read is left out and added to `skipped`."""
    cache: WatchCache[Any] = WatchCache.of(api, kind, on_skip=skipped.append if skipped is not None else None)
    await cache.list()
    return list(cache.items.values())


async def read_locks(api: client.ApiClient) -> tuple[dict[str, Lock], list[Skipped]]:
    """The locks on the nodes, read back as the agent reads them (model.lock_on): the nodes listed in pages, the one
    cluster-wide list `reservoir status` makes (never the pods)."""
    skipped: list[Skipped] = []
    nodes = await _list(api, kinds.NODES, skipped)
    return current_locks(Snapshot(nodes={n.name: n for n in nodes})), skipped


async def _get(api: client.ApiClient, path: str) -> dict[str, Any] | None:
    try:
        return await get_json(api, path)
    except NotFound:
        return None


async def read_published(api: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    """The plan the agent published (agent.published) in ConfigMap `keys.STATUS_CONFIGMAP` of `namespace`; None when
    there is none."""
    configmap = await _get(api, resource_path("v1", "configmaps", name=keys.STATUS_CONFIGMAP, namespace=namespace))
    text = (configmap.get("data") or {}).get(keys.STATUS_KEY) if configmap is not None else None
    return parse_published(text, f"{namespace}/{keys.STATUS_CONFIGMAP}")


async def read_config(api: client.ApiClient, namespace: str) -> ReservoirConfig:
    """The config in force as the agent reads it (kinds.config_from): defaults when the ConfigMap is absent or
    invalid (the agent then keeps its last good one, which this command cannot know)."""
    configmap = await _get(api, resource_path("v1", "configmaps", name=keys.CONFIGMAP_NAME, namespace=namespace))
    config, _ = kinds.config_from("ADDED" if configmap is not None else "DELETED", configmap, ReservoirConfig())
    return config


OUTPUTS = ("table", "wide", "json", "yaml")


def _age(since: datetime, now: datetime) -> str:
    return format_duration(now - since)


def render_table(header: Sequence[str], rows: Iterable[Sequence[str]], empty: str | None = None) -> list[str]:
    """A table as kubectl prints one: each column as wide as its widest cell (header included), columns three spaces
    apart, the last column not padded, non-printable characters escaped (shared.logs.printable). No rows: the header
    and `empty` (when given)."""
    body = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(cell) for cell in column) for column in zip(header, *body, strict=True)]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in (list(header), *body)]
    if not body and empty is not None:
        lines.append(empty)
    return lines


def queue_table(published: Mapping[str, Any] | None, wide: bool = False) -> list[str]:
    """The queues of the last published plan, best first, with their score parts (seed 001), and the weights."""
    scores = list((published or {}).get("queues") or [])
    weights = ((published or {}).get("config") or {}).get("queueOrder") or {}
    order = ("by score" if weights.get("queueScoreOrderEnable", True)
             else "queueScoreOrderEnable false: by plugin order")
    header = ["QUEUE", "SCORE", "PRIORITY", "DRF", "PROPORTION", "QUEUE PRIORITY", "DOMINANT SHARE",
              "SHARE OF DESERVED"] + (["ALLOCATED", "DESERVED"] if wide else [])
    rows = [[s["name"], f"{s['score']:.3f}", f"{s['priorityScore']:.3f}", f"{s['drfScore']:.3f}",
             f"{s['proportionScore']:.3f}", str(s["priority"]), f"{s['drfShare']:.3f}", f"{s['proportionShare']:.3f}"]
            + ([_quantity_map(s["allocated"]), _quantity_map(s["deserved"])] if wide else []) for s in scores]
    lines = [f"weights {weights.get('priorityWeight', 0):g}/{weights.get('drfWeight', 0):g}/"
             f"{weights.get('proportionWeight', 0):g} (priority/drf/proportion), {weights.get('ordering', '-')}, "
             f"{order}"] if weights else []
    return lines + render_table(header, rows, "(no queues competed in the last published plan)")


def _dedupe(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records:
        seen.setdefault((str(record.get("kind")), str(record.get("name"))), record)
    return list(seen.values())


def status_document(locks: Mapping[str, Lock], published: Mapping[str, Any] | None, skipped: Sequence[Skipped],
                    now: datetime, where: str = f"{keys.NAMESPACE}/{keys.STATUS_CONFIGMAP}") -> dict[str, Any]:
    """`reservoir status -o json|yaml`: the one shape, every key camelCase as the API's (docs/tasks/command-line.md).
    Every key is always present; a value that does not apply is null. Times are RFC 3339, UTC. Locks are read from
    the nodes; starving jobs, windows and guarantees from the plan the agent published (agent.published), whose age
    `plan` says."""
    plan = published or {}
    estimates = {e.get("owner"): e for e in plan.get("estimates") or () if isinstance(e, Mapping)}
    return {
        "locks": [{"node": lock.node, "owner": lock.owner, "kind": lock.kind.value, "subject": lock.subject,
                   "reason": lock.reason, "since": stamp(lock.since), "age": _age(lock.since, now),
                   "expires": stamp(lock.expires) if lock.expires else None,
                   "start": start_text(estimates.get(lock.owner)),
                   "backfilled": (estimates.get(lock.owner) or {}).get("backfilled", 0),
                   "reserved": lock.reserved.to_quantities(), "tasks": list(lock.tasks),
                   "exclusive": lock.exclusive, "unreadable": lock.unreadable or None}
                  for lock in sorted(locks.values(), key=lambda lock: lock.node)],
        "starvingJobs": [{"subject": j["subject"], "owner": j["owner"], "queue": j["queue"], "priority": j["priority"],
                          "minMember": j["minMember"], "bound": j["bound"], "pending": j["pending"],
                          "reason": j["reason"], "starvingSince": j.get("starvingSince"), "nodes": j.get("nodes", []),
                          "start": start_text(estimates.get(j["owner"]))}
                         for j in plan.get("jobs") or () if j.get("starving")],
        "windows": list(plan.get("windows") or ()),
        "guarantees": list(plan.get("guarantees") or ()),
        "skipped": _dedupe([{"kind": s.kind, "name": s.name, "error": s.error} for s in skipped]
                           + list(plan.get("skipped") or ())),
        "plan": {**freshness(published, now, where), "omitted": dict(plan.get("omitted") or {})},
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
        columns(["NODE", "KIND", "OWNER", "AGE", "EXPIRES", "START", "BACKFILLED"],
                ["SINCE", "EXCLUSIVE", "RESERVED", "TASKS"]) + ["REASON"],
        (columns([lock["node"], lock["kind"], lock["subject"], lock["age"], lock["expires"] or "-",
                  lock["start"] or "-", str(lock["backfilled"])],
                 [lock["since"], str(lock["exclusive"]).lower(), _quantity_map(lock["reserved"]),
                  _joined(lock["tasks"])])
         + [lock["reason"] + (f" (unreadable: {lock['unreadable']})" if lock["unreadable"] else "")]
         for lock in document["locks"]), "(no locks)")
    lines += [""] + render_table(
        columns(["STARVING JOB", "QUEUE", "PRIORITY", "BOUND", "START"], ["PENDING", "OWNER", "SINCE"]) + ["REASON"],
        (columns([j["subject"], j["queue"], str(j["priority"]), f"{j['bound']}/{j['minMember']}", j["start"] or "-"],
                 [str(j["pending"]), j["owner"], j["starvingSince"] or "-"]) + [j["reason"]]
         for j in document["starvingJobs"]), "(none)")
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
    return lines + ["", plan_line(document["plan"])]


def plan_line(plan: Mapping[str, Any]) -> str:
    """The last line of the tables: whose plan, how old, what was cut from it."""
    if plan["planned"] is None:
        return "no published plan"
    omitted = plan.get("omitted") or {}
    cut = (" (cut to fit: " + ", ".join(f"{v} {k} left out" for k, v in sorted(omitted.items())) + ")"
           if omitted else "")
    return f"plan published by {plan['agent']} at {plan['planned']}, {plan['age']} ago{cut}"


def dump(document: Any, output: str) -> str:
    """`document` as `-o json` (indented, keys in document order) or `-o yaml` prints it."""
    if output == "yaml":
        return yaml.safe_dump(document, sort_keys=False, default_flow_style=False).rstrip("\n")
    return json.dumps(document, indent=2)


def render_status(locks: Mapping[str, Lock], published: Mapping[str, Any] | None, skipped: Sequence[Skipped],
                  now: datetime, output: str, queues: bool = False,
                  where: str = f"{keys.NAMESPACE}/{keys.STATUS_CONFIGMAP}") -> str:
    """What `reservoir status` prints, in `output` (one of OUTPUTS)."""
    if output not in OUTPUTS:
        raise ValueError(f"unknown output {output!r}: one of {', '.join(OUTPUTS)}")
    if queues:
        if output in ("json", "yaml"):
            return dump(list((published or {}).get("queues") or []), output)
        return "\n".join(queue_table(published, wide=output == "wide"))
    document = status_document(locks, published, skipped, now, where)
    if output in ("json", "yaml"):
        return dump(document, output)
    return "\n".join(status_tables(document, wide=output == "wide"))


@dataclass(frozen=True)
class Shown:
    """What a `status` command prints: `text` on stdout, `warning` (or None) on stderr."""

    text: str
    warning: str | None


async def status(kubeconfig: str | None, namespace: str, output: str, queues: bool = False,
                 context: str | None = None) -> Shown:
    """`reservoir status`: the nodes (their locks, in pages) and the one published ConfigMap; no pod is listed and
    nothing is planned here."""
    api = await new_api_client(kubeconfig, context=context)
    try:
        locks, skipped = await read_locks(api)
        published = await read_published(api, namespace)
    finally:
        await api.close()
    now = datetime.now(UTC)
    where = f"{namespace}/{keys.STATUS_CONFIGMAP}"
    return Shown(render_status(locks, published, skipped, now, output, queues, where),
                 freshness(published, now, where)["warning"])


async def why(kubeconfig: str | None, namespace: str, pod: str, reservoir_namespace: str, output: str,
              context: str | None = None) -> Shown:
    """`reservoir status --why POD -n NAMESPACE`: that pod, its PodGroup and Queue, the Reservations, the config, the
    locks on the nodes and the published plan, explained (agent.why.explain)."""
    api = await new_api_client(kubeconfig, context=context)
    try:
        obj = await _get(api, resource_path("v1", "pods", name=pod, namespace=namespace))
        if obj is None:
            raise StatusError(f"pod {namespace}/{pod} not found (give its namespace with -n)")
        group = ((obj.get("metadata") or {}).get("annotations") or {}).get(keys.GROUP_NAME)
        podgroup_obj = await _get(api, resource_path(keys.VOLCANO_API_VERSION, keys.PODGROUP_PLURAL, name=group,
                                                     namespace=namespace)) if group else None
        podgroup = PodGroupView.from_obj(podgroup_obj) if podgroup_obj is not None else None
        queue_name = queue_name_of(podgroup, (obj.get("metadata") or {}).get("annotations") or {})
        queue_obj = await _get(api, resource_path(keys.VOLCANO_API_VERSION, keys.QUEUE_PLURAL, name=queue_name))
        config = await read_config(api, reservoir_namespace)
        # both sources, keyed as the agent keys them (Koordinator's `scheduling.koordinator.sh/<name>`, issue 18)
        sources = [kinds.RESERVATIONS] + ([kinds.KOORDINATOR_RESERVATIONS] if config.koordinator.reservations else [])
        reservations = {r.key: r for kind in sources for r in await _list(api, kind)}
        workload = None
        if config.kueue.workloads:  # issue 32: the Workload of the pod's job, among its namespace's (unreadable: none)
            listed = await _get(api, resource_path(keys.KUEUE_API_VERSION, keys.WORKLOAD_PLURAL, namespace=namespace))
            views = []
            for item in (listed or {}).get("items") or ():
                with contextlib.suppress(ViewError):
                    views.append(WorkloadView.from_obj(item))
            workload = workloads_by_owner(views).get(PodView.from_obj(obj).job)
        locks, _ = await read_locks(api)
        published = await read_published(api, reservoir_namespace)
    finally:
        await api.close()
    answer = explain(obj, podgroup=podgroup, queue=QueueView.from_obj(queue_obj) if queue_obj is not None else None,
                     reservations=reservations, locks=locks, published=published, config=config,
                     now=datetime.now(UTC), where=f"{reservoir_namespace}/{keys.STATUS_CONFIGMAP}", workload=workload)
    text = dump(answer, output) if output in ("json", "yaml") else why_text(answer)
    return Shown(text, None)


async def release(kubeconfig: str | None, nodes: list[str], everything: bool,
                  context: str | None = None) -> list[str]:
    """Remove Reservoir's locks (taint, labels, info annotation, a starvation cool-down record, and a soft-drain
    taint) and nothing else."""
    api = await new_api_client(kubeconfig, context=context)
    try:
        writer = Writer(api, component="reservoir-release")
        listed = await _list(api, kinds.NODES)
        targets = [n.name for n in listed if everything or n.name in nodes]
        done = []
        for name in targets:
            # the starvation cool-down record and the soft-drain taint go too (RELEASE_MARKS)
            before, patched = await writer.set_lock(name, None, dict.fromkeys(RELEASE_MARKS))
            if patched:
                what = f"{before.kind.value} {before.subject}" if before else "leftover keys (lock or soft-drain)"
                done.append(f"{name}: released {what}")
                await writer.event(name, "NodeReleased", "released by `reservoir release`")
        return done or ["no Reservoir locks found"]
    finally:
        await api.close()
