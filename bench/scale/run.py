"""`make bench-scale`: Reservoir on the local control plane at scale, side by side in one run (issue 15).

N kwok nodes (`--nodes`, default 1,000; 8 cpu / 32Gi each) and 30 pods pre-bound to each (spec.nodeName set, so
kube-scheduler is not the bottleneck; 200m / 512Mi each, `volcano.sh/maximum-runtime: 2h`), created concurrently
through the webhook while the webhook and the agent run as `make up` runs them (real processes, their
ServiceAccounts impersonated, deploy/configmap.yaml with starvingJobTimeThreshold shortened). Measured:

- long-running agent RSS: VmRSS of the agent that watched the whole fill, once every pod is Running;
- idle cpu: that agent's utime + stime (/proc/<pid>/stat) over 60 s with nothing changing but node heartbeats,
  with the wake-ups counted by cause (reservoir_reconcile_wakeups_total), the reconcile time in the window, and how
  many node watch events changed a NodeView (shared.views, what the agent compares) or its `ready`;
- fresh agent: the agent restarted (same identity, so no Lease wait), VmHWM / VmRSS sampled every 20 ms from
  /proc/<pid>/status; sync = process start to its `caches=synced` log line; peak = VmHWM once it has led and
  planned once; then its own idle window of 60 s, measured as the long-running agent's;
- lock: 4 pods of 4 cpu (each its own job), created 4 s apart, fit on no node now (6 of 8 cpu requested
  everywhere) but will once pods with a maximum runtime end; for each, threshold crossing = its creationTimestamp
  (whole seconds, what the agent reads) + starvingJobTimeThreshold, and the time its job's lock taint appears on a
  node (a node watch); the line reports the slowest of the 4;
- release: the 4 pods deleted at once; the time until all 4 lock taints are gone;
- `reservoir status -o json` while the 4 locks are held: seconds and bytes read (through a counting proxy), this
  tree's and, with `--status-base REV` (make: `STATUS_BASE=`), the same command as git rev REV has it.

Progress goes to stderr; the report to stdout, its last line
`scale: N nodes P pods: fresh agent peak F MiB (steady S MiB), sync T s, idle cpu C%, lock L s after threshold`.
A benchmark: it reports numbers, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import ssl
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from localcluster import binaries
from localcluster.agent_process import AgentProcess
from localcluster.cluster import LocalCluster, free_port, kwok_node
from localcluster.webhook_process import WebhookProcess
from shared import keys
from shared.config import ReservoirConfig
from shared.ownership import JobRef
from shared.timestamps import parse_time
from shared.views import NodeView, PodView

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "bench-scale"
PODS_PER_NODE = 30
NODE_SIZE = {"cpu": "8", "memory": "32Gi"}
FILL_REQUESTS = {"cpu": "200m", "memory": "512Mi"}
STARVING_REQUESTS = {"cpu": "4", "memory": "1Gi"}
MAXIMUM_RUNTIME = "2h"
THRESHOLD_SECONDS = 15
LOCKS = 4
STAGGER_SECONDS = 4
IDLE_SECONDS = 60
CONCURRENCY = 48
CONFIG = f"""
maxLockedNodePercent: 50
starvation:
  starvingJobTimeThreshold: {THRESHOLD_SECONDS}s
  reservedNodePercent: 20
"""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- the API, as the admin, over one pooled HTTPS session ---

class Api:
    def __init__(self, cluster: LocalCluster) -> None:
        context = ssl.create_default_context(cafile=str(cluster.path("ca.crt")))
        context.load_cert_chain(str(cluster.path("admin.crt")), str(cluster.path("admin.key")))
        self.server = cluster.server
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=CONCURRENCY + 8),
                                             timeout=aiohttp.ClientTimeout(total=300), read_bufsize=1 << 20)

    async def close(self) -> None:
        await self.session.close()

    async def call(self, method: str, path: str, body: Any = None, *, accept: str = "application/json",
                   ok: tuple[int, ...] = (200, 201, 202), tries: int = 8) -> Any:
        """One request; 429, 5xx and dropped connections are retried with backoff (the fill pushes the API)."""
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(tries):
            try:
                async with self.session.request(method, self.server + path, data=data, headers={
                        "Content-Type": "application/json", "Accept": accept}) as response:
                    text = await response.read()
                    if response.status in ok:
                        return json.loads(text) if text else None
                    if response.status != 429 and response.status < 500 or attempt == tries - 1:
                        raise RuntimeError(f"{method} {path}: {response.status} {text[:500]!r}")
            except (TimeoutError, aiohttp.ClientConnectionError):
                if attempt == tries - 1:
                    raise
            await asyncio.sleep(min(0.2 * 2 ** attempt, 5))
        raise AssertionError("unreachable")

    async def count(self, path: str) -> int:
        """How many objects a list matches, page by page (metadata only)."""
        total, token = 0, ""
        sep = "&" if "?" in path else "?"
        while True:
            page = await self.call("GET", f"{path}{sep}limit=2000{'&continue=' + token if token else ''}",
                                   accept="application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")
            total += len(page.get("items") or [])
            token = page["metadata"].get("continue") or ""
            if not token:
                return total


async def create_all(api: Api, path: str, bodies: Iterator[dict[str, Any]], total: int, what: str) -> float:
    """POST every body, CONCURRENCY at a time, progress on stderr every 2 s; returns the seconds it took."""
    began = time.monotonic()
    done = 0

    async def worker() -> None:
        nonlocal done
        for body in bodies:  # one shared iterator: each body is taken by exactly one worker
            await api.call("POST", path, body, ok=(201, 409))  # 409: a retried POST that had gone through
            done += 1

    async def progress() -> None:
        while True:
            await asyncio.sleep(2)
            elapsed = time.monotonic() - began
            log(f"bench-scale: {what} {done:,}/{total:,} ({done / elapsed:.0f}/s)")

    reporter = asyncio.create_task(progress())
    try:
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    finally:
        reporter.cancel()
    seconds = time.monotonic() - began
    log(f"bench-scale: {what} {total:,} in {seconds:.0f}s ({total / seconds:.0f}/s)")
    return seconds


async def wait_until(probe: Callable[[], Any], what: str, timeout: float, interval: float = 2.0) -> None:
    began = last = time.monotonic()
    while True:
        left = await probe()
        if not left:
            log(f"bench-scale: {what} after {time.monotonic() - began:.1f}s")
            return
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"{what}: still {left} after {timeout:.0f}s")
        if time.monotonic() - last >= 2:
            last = time.monotonic()
            log(f"bench-scale: waiting for {what}: {left:,} left")
        await asyncio.sleep(interval)


def pod_body(name: str, requests: dict[str, str], node: str | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.invalid/reservoir-bench:1",
                                            "resources": {"requests": requests}}],
                            "terminationGracePeriodSeconds": 0}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations or {}}, "spec": spec}


# --- lock taints, as a node watch sees them ---

async def watch_events(api: Api, path: str, rv: str, on_event: Callable[[dict[str, Any], str], None]) -> None:
    """Watch `path` from resourceVersion `rv` for good (a watch that times out is started again where it was), calling
    `on_event(object, type)` for each ADDED, MODIFIED or DELETED. An ERROR event (a 410 Gone on a long run) is logged
    and the watch started again from the collection's current resourceVersion: what changed in between is missed."""
    while True:
        url = f"{api.server}{path}?watch=1&allowWatchBookmarks=true&timeoutSeconds=1800&resourceVersion={rv}"
        async with api.session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as response:
            async for line in response.content:
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    log(f"bench-scale: watch of {path}: {obj}; watching again from now")
                    rv = (await api.call("GET", f"{path}?limit=1"))["metadata"]["resourceVersion"]
                    break
                rv = obj["metadata"].get("resourceVersion", rv)
                if event["type"] != "BOOKMARK":
                    on_event(obj, event["type"])


class LockWatch:
    """Every node's Reservoir lock taint value, updated from a watch; `seen[(node, value)]` when it appeared,
    `gone[(node, value)]` when it went (wall clock of the event's arrival)."""

    def __init__(self) -> None:
        self.locks: dict[str, str] = {}
        self.seen: dict[tuple[str, str], float] = {}
        self.gone: dict[tuple[str, str], float] = {}
        self.events = 0
        self.views: dict[str, Any] = {}
        self.view_changes = 0  # events that changed the agent's view of a node (shared.views.NodeView)
        self.not_ready_changes = 0  # of them, a change of `ready` (the node lifecycle controller's taints)

    async def run(self, api: Api) -> None:
        rv = (await api.call("GET", "/api/v1/nodes?limit=1"))["metadata"]["resourceVersion"]

        def on_event(obj: dict[str, Any], kind: str) -> None:
            self.events += 1
            self._update(obj["metadata"]["name"], None if kind == "DELETED" else obj)
        await watch_events(api, "/api/v1/nodes", rv, on_event)

    def _update(self, name: str, node: dict[str, Any] | None) -> None:
        now = time.time()
        view = NodeView.from_obj(node) if node is not None else None
        before_view = self.views.get(name)
        if before_view is not None and view != before_view:
            self.view_changes += 1
            self.not_ready_changes += view is None or view.ready != before_view.ready
        if view is not None:
            self.views[name] = view
        value = next((t.get("value", "") for t in ((node or {}).get("spec") or {}).get("taints") or []
                      if t.get("key") == keys.LOCK), None)
        before = self.locks.get(name)
        if value == before:
            return
        if before is not None:
            self.gone[(name, before)] = now
            del self.locks[name]
        if value is not None:
            self.seen[(name, value)] = now
            self.locks[name] = value

    def held(self, owners: set[str]) -> dict[str, str]:
        return {node: value for node, value in self.locks.items() if value in owners}


class PodWatch:
    """The bench namespace's pods as the agent views them (shared.views.PodView), from a list and then a watch
    started before the idle windows: of the events since, which changed a view, which PodView fields and whose write
    it was (the newest managedFields entry's manager and subresource), to name what wakes the agent's loop."""

    def __init__(self) -> None:
        self.views: dict[str, PodView] = {}
        self.events = 0
        self.changes: Counter[str] = Counter()  # "fields by manager" -> events

    async def start(self, api: Api) -> asyncio.Task[None]:
        path, token = f"/api/v1/namespaces/{NAMESPACE}/pods", ""
        while True:
            page = await api.call("GET", f"{path}?limit=2000{'&continue=' + token if token else ''}")
            for obj in page.get("items") or []:
                self.views[obj["metadata"]["name"]] = PodView.from_obj(obj)
            token = page["metadata"].get("continue") or ""
            if not token:
                return asyncio.create_task(watch_events(api, path, page["metadata"]["resourceVersion"], self._event))

    def _event(self, obj: dict[str, Any], kind: str) -> None:
        self.events += 1
        self._update(obj, kind)

    def _update(self, obj: dict[str, Any], kind: str) -> None:
        name = obj["metadata"]["name"]
        view = None if kind == "DELETED" else PodView.from_obj(obj)
        before = self.views.pop(name, None)
        if view is not None:
            self.views[name] = view
        if before is None or view is None:
            fields = "added" if view is not None else "deleted"
        else:
            fields = ",".join(f.name for f in dataclasses.fields(PodView)
                              if getattr(before, f.name) != getattr(view, f.name))
            if not fields:
                return
        entries = obj["metadata"].get("managedFields") or [{}]
        newest = max(entries, key=lambda e: e.get("time") or "")
        writer = newest.get("manager", "?") + (f"/{newest['subresource']}" if newest.get("subresource") else "")
        self.changes[f"{fields} by {writer}"] += 1

    def since(self, events: int, changes: Counter[str]) -> str:
        """Events and view changes since a (events, changes) snapshot, the changes by fields and writer."""
        delta = self.changes - changes
        named = ", ".join(f"{k} {v}" for k, v in delta.most_common(4)) or "none"
        return f"{self.events - events} pod events, {sum(delta.values())} changing a PodView ({named})"


# --- the agent process: memory, cpu, metrics, log ---

def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15 of stat(5))


def mib(kib: int) -> float:
    return kib / 1024


async def metrics(port: int) -> dict[str, float]:
    """The agent's wake-up counters, view changes by cache and reconcile histogram sum/count."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("reservoir_reconcile_wakeups_total{", "reservoir_reconcile_duration_seconds_sum",
                            "reservoir_reconcile_duration_seconds_count", "reservoir_cache_view_changes_total{")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def wakeups(sample: dict[str, float], cause: str) -> float:
    return sample.get(f'reservoir_reconcile_wakeups_total{{cause="{cause}"}}', 0.0)


def view_changes(before: dict[str, float], after: dict[str, float]) -> str:
    """The watch events that changed a view, by cache, between two scrapes (reservoir_cache_view_changes_total): what
    woke the loop; "none" when no cache changed."""
    prefix = "reservoir_cache_view_changes_total{"
    changed = {name.removeprefix(prefix).rstrip("}"): value - before.get(name, 0.0)
               for name, value in after.items() if name.startswith(prefix)}
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(changed.items()) if v) or "none"


def reconcile_totals(sample: dict[str, float]) -> tuple[float, float]:
    return (sample.get("reservoir_reconcile_duration_seconds_count", 0.0),
            sample.get("reservoir_reconcile_duration_seconds_sum", 0.0))


async def wait_metric(port: int, ready: Callable[[dict[str, float]], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready(await metrics(port)):
                return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("agent metrics not ready in time")


async def fresh_agent(cluster: LocalCluster) -> tuple[AgentProcess, int, dict[str, float]]:
    """Start an agent and follow it until it has synced, led and planned once, sampling its memory every 20 ms."""
    port = free_port()
    agent = AgentProcess(cluster, identity="agent-0", metrics_port=port)
    began = time.monotonic()
    agent.start()
    assert agent.process is not None
    pid = agent.process.pid
    marks: dict[str, float] = {}
    samples: list[tuple[float, int]] = []
    wanted = {"first log line": "agent identity=", "synced": "caches=synced", "leader": "leader=acquired"}
    while True:
        if not agent.running():
            raise RuntimeError(f"fresh agent exited:\n{agent.log_text()[-3000:]}")
        status = proc_status(pid)
        samples.append((time.monotonic() - began, status["VmRSS"]))
        text = agent.log_text()
        for mark, needle in wanted.items():
            if mark not in marks and needle in text:
                marks[mark] = time.monotonic() - began
                log(f"bench-scale: fresh agent {mark} at {marks[mark]:.2f}s, VmRSS {mib(status['VmRSS']):.0f} MiB, "
                    f"VmHWM {mib(status['VmHWM']):.0f} MiB")
        if "leader" in marks:
            try:
                if reconcile_totals(await metrics(port))[0] >= 1:
                    break
            except aiohttp.ClientError:
                pass
        if time.monotonic() - began > 600:
            raise RuntimeError(f"fresh agent did not sync and plan in 600 s:\n{agent.log_text()[-3000:]}")
        await asyncio.sleep(0.02)
    status = proc_status(pid)
    at_sync = max((rss for t, rss in samples if t <= marks["synced"]), default=0)
    result = {"first_log": marks["first log line"], "sync": marks["synced"], "leader": marks["leader"],
              "planned": time.monotonic() - began, "hwm": status["VmHWM"], "rss": status["VmRSS"],
              "rss_peak_to_sync": at_sync}
    return agent, port, result


# --- the run ---

async def run(nodes: int, status_base: str | None = None) -> list[str]:
    report: list[str] = []
    bin_dir = binaries.ensure_built()
    cluster = LocalCluster(bin_dir=bin_dir, log=log)
    cluster.start()
    webhook = WebhookProcess(cluster)
    agent = AgentProcess(cluster, identity="agent-0", metrics_port=free_port())
    fresh: AgentProcess | None = None
    api = Api(cluster)
    watch_task: asyncio.Task[None] | None = None
    pod_watch_task: asyncio.Task[None] | None = None
    try:
        kubectl = cluster.kubectl
        await install(kubectl)
        configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.NAMESPACE},
                     "data": {keys.CONFIG_KEY: CONFIG}}
        await _sh(*kubectl, "apply", "-f", "-", stdin=yaml.safe_dump(configmap))
        await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        webhook.start()
        webhook.register(kubectl)
        agent.start()
        config = ReservoirConfig.model_validate(yaml.safe_load(CONFIG))
        log(f"bench-scale: webhook and agent running; config: threshold {THRESHOLD_SECONDS}s, resyncPeriod "
            f"{config.resync_period.total_seconds():g}s, debounce {config.debounce.total_seconds():g}s")

        # nodes, then pods bound to them
        names = [f"scale-node-{i:05d}" for i in range(nodes)]
        await create_all(api, "/api/v1/nodes", (kwok_node(n, NODE_SIZE) for n in names), nodes, "nodes")
        # the timeouts grow with the cluster: kwok made 3,000 nodes' pods Running at about 70 a second on 2 cores
        await wait_until(lambda: _not_ready(api, nodes), "nodes Ready", timeout=300 + nodes / 5)
        watch = LockWatch()
        watch_task = asyncio.create_task(watch.run(api))
        total = nodes * PODS_PER_NODE
        pods = (pod_body(f"fill-{i:05d}-{j:02d}", FILL_REQUESTS, names[i], {keys.MAXIMUM_RUNTIME: MAXIMUM_RUNTIME})
                for i in range(nodes) for j in range(PODS_PER_NODE))
        fill_seconds = await create_all(api, f"/api/v1/namespaces/{NAMESPACE}/pods", pods, total, "pods")
        # each probe has the API server filter every pod: at 90,000 pods, a probe every 2 s was a good part of its
        # cpu, and of the 2 cores kwok needs to make them Running
        await wait_until(lambda: api.count(f"/api/v1/namespaces/{NAMESPACE}/pods?fieldSelector=status.phase!=Running"),
                         "every pod Running", timeout=300 + total / 30, interval=max(2.0, total / 10_000))
        await asyncio.sleep(10)  # the last status updates reach the agent; nothing changes after this
        if not agent.running():
            raise RuntimeError(f"agent exited:\n{agent.log_text()[-3000:]}")

        pod_watch = PodWatch()
        pod_watch_task = await pod_watch.start(api)
        # the long-running agent: steady memory and idle cpu
        assert agent.process is not None
        pid = agent.process.pid
        steady = proc_status(pid)
        before, cpu_before, t_before = await metrics(agent.metrics_port), cpu_seconds(pid), time.monotonic()
        heartbeats_before, views_before, ready_before = watch.events, watch.view_changes, watch.not_ready_changes
        pods_before = pod_watch.events, Counter(pod_watch.changes)
        log(f"bench-scale: idle window {IDLE_SECONDS}s")
        profiler = await _profile(pid, IDLE_SECONDS)
        await asyncio.sleep(IDLE_SECONDS)
        if profiler is not None:
            await profiler.wait()
        after, cpu_after, t_after = await metrics(agent.metrics_port), cpu_seconds(pid), time.monotonic()
        idle_cpu = (cpu_after - cpu_before) / (t_after - t_before) * 100
        steady_end = proc_status(pid)
        count = reconcile_totals(after)[0] - reconcile_totals(before)[0]
        plan_seconds = reconcile_totals(after)[1] - reconcile_totals(before)[1]
        webhook_rss = proc_status(webhook.process.pid)["VmRSS"] if webhook.process else 0
        report += [
            f"fill: {nodes:,} nodes, {total:,} pods bound through the webhook in {fill_seconds:.0f}s "
            f"({total / fill_seconds:.0f}/s)",
            f"long-running agent: VmRSS {mib(steady['VmRSS']):.0f} MiB after the fill, "
            f"{mib(steady_end['VmRSS']):.0f} MiB after the idle window (VmHWM {mib(steady_end['VmHWM']):.0f} MiB, "
            f"the fill included); webhook VmRSS {mib(webhook_rss):.0f} MiB",
            f"idle {t_after - t_before:.0f}s: agent cpu {cpu_after - cpu_before:.2f}s = {idle_cpu:.2f}% of a core; "
            f"wake-ups change {wakeups(after, 'change') - wakeups(before, 'change'):.0f}, "
            f"resync {wakeups(after, 'resync') - wakeups(before, 'resync'):.0f} (views changed: "
            f"{view_changes(before, after)}); {count:.0f} reconciles, "
            f"{plan_seconds:.2f}s in them; {watch.events - heartbeats_before} node events meanwhile, "
            f"{watch.view_changes - views_before} of them changing a NodeView "
            f"({watch.not_ready_changes - ready_before} its `ready`); {pod_watch.since(*pods_before)}",
        ]
        for line in report[-3:]:
            log(f"bench-scale: {line}")

        # a freshly started agent
        agent.stop()
        log("bench-scale: agent stopped; starting a fresh one")
        fresh, port, f = await fresh_agent(cluster)
        report.append(
            f"fresh agent: first log line {f['first_log']:.2f}s, caches synced {f['sync']:.2f}s, leading "
            f"{f['leader']:.2f}s, first plan done {f['planned']:.2f}s after start; peak VmHWM {mib(f['hwm']):.0f} MiB "
            f"(VmRSS {mib(f['rss_peak_to_sync']):.0f} MiB at most until synced, {mib(f['rss']):.0f} MiB after the "
            f"first plan) = {f['hwm'] / steady['VmRSS']:.2f}x the long-running agent's {mib(steady['VmRSS']):.0f} MiB")
        log(f"bench-scale: {report[-1]}")
        fresh_pid = fresh.process.pid if fresh.process else 0
        before, cpu_before, t_before = await metrics(port), cpu_seconds(fresh_pid), time.monotonic()
        heartbeats_before, views_before, ready_before = watch.events, watch.view_changes, watch.not_ready_changes
        pods_before = pod_watch.events, Counter(pod_watch.changes)
        log(f"bench-scale: fresh agent idle window {IDLE_SECONDS}s")
        await asyncio.sleep(IDLE_SECONDS)
        after, cpu_after, t_after = await metrics(port), cpu_seconds(fresh_pid), time.monotonic()
        fresh_idle = (cpu_after - cpu_before) / (t_after - t_before) * 100
        report.append(
            f"fresh agent idle {t_after - t_before:.0f}s: cpu {cpu_after - cpu_before:.2f}s = {fresh_idle:.2f}% of a "
            f"core; wake-ups change {wakeups(after, 'change') - wakeups(before, 'change'):.0f}, resync "
            f"{wakeups(after, 'resync') - wakeups(before, 'resync'):.0f} (views changed: "
            f"{view_changes(before, after)}); {watch.events - heartbeats_before} node "
            f"events, {watch.view_changes - views_before} changing a NodeView "
            f"({watch.not_ready_changes - ready_before} its `ready`); {pod_watch.since(*pods_before)}; "
            f"VmRSS {mib(proc_status(fresh_pid)['VmRSS']):.0f} MiB")
        log(f"bench-scale: {report[-1]}")

        # threshold to taint, LOCKS starving jobs
        phase_before = await metrics(port)
        owners: dict[str, str] = {}
        crossings: dict[str, float] = {}
        for k in range(LOCKS):
            if k:
                await asyncio.sleep(STAGGER_SECONDS)
            name = f"starving-{k}"
            pod = await api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(name, STARVING_REQUESTS))
            owners[JobRef(NAMESPACE, "Pod", name).owner_id] = name
            crossings[name] = parse_time(pod["metadata"]["creationTimestamp"]).timestamp() + THRESHOLD_SECONDS
            log(f"bench-scale: created {name}; threshold crossed {crossings[name] - time.time():.1f}s from now")
        timeout = THRESHOLD_SECONDS + config.resync_period.total_seconds() + 60
        await wait_until(lambda: _async(LOCKS - len(watch.held(set(owners)))), f"{LOCKS} locks",
                         timeout=timeout, interval=0.05)
        lags = {}
        for node, value in watch.held(set(owners)).items():
            lags[owners[value]] = watch.seen[(node, value)] - crossings[owners[value]]
        report.append("threshold to taint: " + ", ".join(f"{name} {lag:.2f}s" for name, lag in sorted(lags.items()))
                      + f" (threshold {THRESHOLD_SECONDS}s from the whole-second creationTimestamp; resyncPeriod "
                      f"{config.resync_period.total_seconds():g}s, debounce {config.debounce.total_seconds():g}s)")
        log(f"bench-scale: {report[-1]}")

        report.append(await status_side_by_side(cluster, status_base))  # while the locks are held
        log(f"bench-scale: {report[-1]}")

        # release LOCKS at once: their owners go away
        held = watch.held(set(owners))
        began = time.time()
        await asyncio.gather(*(api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?gracePeriodSeconds=0")
                               for name in owners.values()))
        deleted = time.time() - began
        await wait_until(lambda: _async(len(watch.held(set(owners)))), f"{LOCKS} locks released", timeout=120,
                         interval=0.05)
        ends = sorted(watch.gone[(node, value)] - began for node, value in held.items())
        report.append(f"release: {LOCKS} owners deleted (the DELETEs took {deleted:.2f}s); taints gone after "
                      + ", ".join(f"{t:.2f}s" for t in ends) + f"; all {LOCKS} in {ends[-1]:.2f}s")
        log(f"bench-scale: {report[-1]}")
        phase_after = await metrics(port)
        count = reconcile_totals(phase_after)[0] - reconcile_totals(phase_before)[0]
        plan_seconds = reconcile_totals(phase_after)[1] - reconcile_totals(phase_before)[1]
        fresh_rss = proc_status(fresh.process.pid)["VmRSS"] if fresh.process else 0
        changes = wakeups(phase_after, "change") - wakeups(phase_before, "change")
        resyncs = wakeups(phase_after, "resync") - wakeups(phase_before, "resync")
        report.append(f"fresh agent during lock and release: wake-ups change {changes:.0f}, resync {resyncs:.0f}; "
                      f"{count:.0f} reconciles, {plan_seconds / max(count, 1):.2f}s each on average; "
                      f"VmRSS {mib(fresh_rss):.0f} MiB")
        log(f"bench-scale: {report[-1]}")
        if not fresh.running():
            raise RuntimeError(f"fresh agent exited:\n{fresh.log_text()[-3000:]}")
        report.append(f"scale: {nodes} nodes {total} pods: fresh agent peak {mib(f['hwm']):.0f} MiB "
                      f"(steady {mib(steady['VmRSS']):.0f} MiB), sync {f['sync']:.1f} s, idle cpu {idle_cpu:.1f}%, "
                      f"lock {max(lags.values()):.2f} s after threshold")
        return report
    finally:
        for task in (watch_task, pod_watch_task):
            if task is not None:
                task.cancel()
        await api.close()
        for process in (fresh, agent):
            if process is not None:
                process.stop()
        webhook.stop()
        cluster.stop()


class CountingProxy:
    """A TCP proxy in front of the API server that counts the bytes it sends back: what a client read, TLS and all.
    The API server's certificate names 127.0.0.1, so a kubeconfig pointing at the proxy's port verifies as before."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("https://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.read = 0
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, count: bool) -> None:
            try:
                while chunk := await source.read(1 << 16):
                    if count:
                        self.read += len(chunk)
                    sink.write(chunk)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()
        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))


async def status_cost(cluster: LocalCluster, source: Path) -> tuple[float, int, int]:
    """`reservoir status -o json` as the code in `source` (a checkout) has it, run against the cluster through a
    CountingProxy: seconds, bytes read, exit code."""
    proxy = CountingProxy(cluster.server)
    port = await proxy.start()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kubeconfig = Path(f"/tmp/bench-scale-status-{os.getpid()}.kubeconfig")
    kubeconfig.write_text(yaml.safe_dump(config))
    kubeconfig.chmod(0o600)
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reservoir", "status", "-o", "json", f"--kubeconfig={kubeconfig}", cwd=source,
        env={**os.environ, "PYTHONPATH": str(source)}, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    _, err = await process.communicate()
    seconds = time.monotonic() - began
    await proxy.close()
    kubeconfig.unlink()
    if process.returncode:
        log(f"bench-scale: reservoir status ({source}) exit {process.returncode}: {err.decode()[-500:]}")
    return seconds, proxy.read, process.returncode or 0


async def status_side_by_side(cluster: LocalCluster, base: str | None) -> str:
    """`reservoir status` of the working tree, and of the git rev `base` (a temporary worktree) when given."""
    runs = [("this tree", REPO)]
    worktree = Path(f"/tmp/bench-scale-base-{os.getpid()}")
    if base:
        await _sh("git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), base)
        runs.insert(0, (base, worktree))
    try:
        parts = []
        for label, source in runs:
            seconds, read, code = await status_cost(cluster, source)
            parts.append(f"{label} {seconds:.2f} s, {read / 2**20:.1f} MiB read" + (f" (exit {code})" if code else ""))
        return "reservoir status -o json: " + "; ".join(parts)
    finally:
        if base:
            await _sh("git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree))


async def _profile(pid: int, seconds: int) -> asyncio.subprocess.Process | None:
    """With $BENCH_SCALE_PYSPY naming a py-spy binary: sample the agent over its idle window into
    /tmp/bench-scale-idle.txt (collapsed stacks, one per line with its count), to find what the idle cpu is."""
    spy = os.environ.get("BENCH_SCALE_PYSPY")
    if not spy:
        return None
    return await asyncio.create_subprocess_exec(spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "50",
                                                "-f", "raw", "-o", "/tmp/bench-scale-idle.txt",
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


async def _async(value: int) -> int:
    return value


async def _not_ready(api: Api, nodes: int) -> int:
    listed = await api.call("GET", "/api/v1/nodes")
    ready = sum(1 for n in listed["items"] for c in (n.get("status") or {}).get("conditions") or []
                if c.get("type") == "Ready" and c.get("status") == "True" and not any(
                    t.get("key") == "node.kubernetes.io/not-ready" for t in n["spec"].get("taints") or []))
    return nodes - ready


async def install(kubectl: list[str]) -> None:
    """What `make up` applies before the programs start: the CRDs (Established), the namespace, both RBACs and the
    default config."""
    await _sh(*kubectl, "apply", "-k", str(REPO / "deploy" / "crds"))
    await _sh(*kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    for manifest in ("namespace.yaml", "webhook-rbac.yaml", "agent-rbac.yaml", "priorityclass.yaml",
                     "critical-priority-policy.yaml", "configmap.yaml"):
        await _sh(*kubectl, "apply", "-f", str(REPO / "deploy" / manifest))


@asynccontextmanager
async def reservoir_running() -> AsyncIterator[tuple[LocalCluster, Api, AgentProcess]]:
    """A local control plane with Reservoir installed and running as `make up` runs it (the webhook registered, the
    agent with a metrics port); everything stopped on the way out."""
    cluster = LocalCluster(bin_dir=binaries.ensure_built(), log=log)
    cluster.start()
    webhook = WebhookProcess(cluster)
    agent = AgentProcess(cluster, identity="agent-0", metrics_port=free_port())
    api = Api(cluster)
    try:
        await install(cluster.kubectl)
        webhook.start()
        webhook.register(cluster.kubectl)
        agent.start()
        yield cluster, api, agent
    finally:
        await api.close()
        agent.stop()
        webhook.stop()
        cluster.stop()


async def _sh(*args: str, stdin: str | None = None) -> None:
    process = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.PIPE,
                                                   stdout=asyncio.subprocess.DEVNULL)
    await process.communicate(stdin.encode() if stdin else None)
    if process.returncode:
        raise RuntimeError(f"{' '.join(args)}: exit {process.returncode}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.run")
    parser.add_argument("--nodes", type=int, default=1000, help="kwok nodes (default 1,000); 30 pods each")
    parser.add_argument("--status-base", default=None, metavar="REV",
                        help="also time `reservoir status` as git rev REV has it, beside this tree's")
    args = parser.parse_args(argv)
    began = time.monotonic()
    report = asyncio.run(run(args.nodes, args.status_base))
    log(f"bench-scale: done in {time.monotonic() - began:.0f}s")
    print("\n".join(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
