"""Builders of plain planner inputs (views, snapshots) shared by the unit tests: one place, so tests do not import
each other."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

from aiohttp import web
from kubernetes_asyncio import client

from agent.planner.model import Lock, Snapshot
from localcluster.cluster import free_port
from shared import keys
from shared.config import load_config
from shared.timestamps import stamp
from shared.views import NodeView, PodGroupView, PodView

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CONFIG = load_config("starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 100}\nmaxLockedNodePercent: 90")
# seed 004's own window: ebook nodes, 32 cpu / 64Gi from 03:00 to 04:00, locked 2 h before, until 10 reserve pods
SEED_004_CONFIG = load_config("""
maxLockedNodePercent: 90
starvation: {enabled: false}
windows:
- name: ebook
  nodeSelector: {business_type: ebook}
  resources: {cpu: "32", memory: 64Gi}
  cron: "0 3 - 4 * * *"
  startReserveAgo: 2h
  podNumToReserve: 10
""")
# a config.yaml of 10^9 values once its aliases are expanded: read without bounds it would never finish
YAML_ALIAS_BOMB = "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"a{i}: &a{i} [{','.join([f'*a{i - 1}' if i > 1 else '*a'] * 10)}]\n" for i in range(1, 9))


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


def spare_nodes(count: int) -> tuple[list[NodeView], list[PodView]]:
    """`count` schedulable nodes that change no story, with the pods that fill them: each node is tiny (100m cpu) and
    full with one running pod of no maximum runtime, so no pending pod of a test fits there, now or ever, and no
    policy wants it. They only raise the cap's base: maxLockedNodePercent is at most 90, so locking k nodes takes
    at least ceil(k x 100 / 90) schedulable ones (one node locks nothing, 2 lock 1, 10 lock 9)."""
    nodes = [node(f"spare-{i}", cpu="100m") for i in range(count)]
    pods = [pod(f"spare-{i}-fill", "100m", node_name=f"spare-{i}", ns="spare") for i in range(count)]
    return nodes, pods


def snap(nodes: list[NodeView], pods: list[PodView], groups: list[PodGroupView] = (), *, spare: int = 0) -> Snapshot:
    """A snapshot of `nodes` and `pods`, plus `spare` spare nodes and their pods (`spare_nodes`) after them."""
    extra_nodes, extra_pods = spare_nodes(spare)
    return Snapshot(nodes={n.name: n for n in [*nodes, *extra_nodes]}, pods=[*pods, *extra_pods],
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
