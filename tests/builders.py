"""Builders of plain planner inputs (views, snapshots) shared by the unit tests: one place, so tests do not import
each other."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone

from aiohttp import web
from kubernetes_asyncio import client

from agent.planner.model import Lock, Snapshot
from localcluster.cluster import free_port
from shared import keys
from shared.config import load_config
from shared.timestamps import stamp
from shared.views import NodeView, PodGroupView, PodView

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
CONFIG = load_config("starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 100}\nmaxLockedNodePercent: 100")


def node(name: str, cpu: str = "4", labels: dict | None = None, unschedulable: bool = False, lock: Lock | None = None) -> NodeView:
    meta: dict = {"name": name, "labels": dict(labels or {}), "annotations": {}, "creationTimestamp": stamp(NOW - timedelta(days=1))}
    spec: dict = {"unschedulable": unschedulable}
    if lock is not None:
        spec["taints"] = [{"key": keys.LOCK, "value": lock.owner, "effect": "NoSchedule"}]
        meta["labels"].update({keys.LOCK: lock.owner, keys.LOCK_KIND: lock.kind.value})
        meta["annotations"][keys.LOCK_INFO] = lock.info_json()
    return NodeView.from_obj({"metadata": meta, "spec": spec, "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"}}})


def pod(name: str, cpu: str, *, node_name: str = "", age: timedelta = timedelta(minutes=5), priority: int = 0,
        runtime: str | None = None, started_ago: timedelta | None = None, group: str | None = None,
        reserveable: bool = False, phase: str | None = None, ns: str = "ns", base: datetime = NOW) -> PodView:
    annotations = {}
    if runtime:
        annotations[keys.MAXIMUM_RUNTIME] = runtime
    if group:
        annotations[keys.GROUP_NAME] = group
    if reserveable:
        annotations[keys.RESERVEABLE] = "true"
    status: dict = {"phase": phase or ("Running" if node_name else "Pending")}
    if node_name:
        status["startTime"] = stamp(base - (started_ago if started_ago is not None else age))
    return PodView.from_obj({
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": annotations,
                     "creationTimestamp": stamp(base - age)},
        "spec": {"nodeName": node_name, "priority": priority,
                 "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
        "status": status,
    })


def snap(nodes: list[NodeView], pods: list[PodView], groups: list[PodGroupView] = ()) -> Snapshot:
    return Snapshot(nodes={n.name: n for n in nodes}, pods=pods,
                    podgroups={(g.namespace, g.name): g for g in groups})


@asynccontextmanager
async def loopback_api(handle: Callable[[web.Request], Awaitable[web.StreamResponse]],
                       method: str = "*") -> AsyncIterator[client.ApiClient]:
    """An ApiClient talking plain HTTP to `handle`, served on 127.0.0.1 for as long as the block runs: a stand-in
    API server for tests of the client edge and the watch cache."""
    app = web.Application()
    app.router.add_route(method, "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    api = client.ApiClient(configuration=configuration)
    try:
        yield api
    finally:
        await api.close()
        await runner.cleanup()
