"""`make bench-trace`: a production GPU cluster's pods replayed through the real API server, webhook and kube-scheduler
on kwok nodes of the trace's shapes; kube-scheduler alone against Reservoir, side by side in one run.

The trace: Alibaba's `cluster-trace-gpu-v2023` ("openb") format (`bench/trace/trace.py`), read from `--pods` and
`--nodes`, or, by default, a synthetic trace drawn from that cluster's published figures (`trace.synthetic`). The
replay (`trace.replay`) keeps the node shapes (a stratified `--fraction` of them, 10% by default), the arrival order
and the runtimes, compressed: the trace's arrival span into `--arrival-seconds` (600), runtimes divided by
`--runtime-factor` (30) within [`--runtime-floor`, `--runtime-cap`] (2 s, 120 s); `--window` replays only the first
part of the arrivals at the same intensity (300 s by default). A GPU-sharing pod asks for one whole `nvidia.com/gpu`.

Each arm, one after the other with the same pods on the same nodes (made afresh for each arm, as kwok nodes with
`nvidia.com/gpu` as an extended resource and the GPU model as a label a pod naming models requires):
- `alone`: Reservoir installed in `dryRun`: the webhook mutates as it would, the agent plans, nothing is locked or
  gated: kube-scheduler alone decides;
- `starvation`: starvation locks (threshold 30 s, `reservedNodePercent` 20), and their soft drain before the
  threshold (`softDrain`, on by default: a `PreferNoSchedule` taint on the node an unschedulable job fits soonest);
- `backfill`: the same, and backfill for every pod (each declares its runtime, `volcano.sh/maximum-runtime`, and opts
  in, `reservoir.sh/backfill`).
Every pod is created at its arrival time, declares its compressed runtime and runs exactly that (kwok ends it,
localcluster's complete-after stage). Times come from the arrival of the watch events that showed them (bind, end,
gate lifted), not from whole-second timestamps. An arm ends when every pod is bound, or `--tail` seconds after the
last arrival (pods still pending then are unplaced).

Measured per arm (`bench/trace/report.py`): per pod class the waits (creation to bind) p50 / p95 / max, GPU
allocation over the run, nodes locked, locked-idle GPU-seconds, backfilled pods, the owner delay (how much later an
owner's node could take it because of pods backfilled there: 0 is the promise), for each 8-GPU pod how many later pods
were placed before it, unplaced pods; and the gate's delay per class (creation to the backfill gate lifted). Written
to `--out` (`.reservoir/bench-trace`): `trace.json` (every pod's record), `trace-timeline.png`, `trace-waits.png`,
`report.md`, `agent.log` (the agent's log: each decision with its reason) and `gates.json` (per arm, each pod held on
the backfill gate: when it was created and when the gate was lifted, null if never). Last line:
`trace: 8gpu p95 A s -> B s (xR), 1gpu p95 C s -> D s, gpu alloc E -> F, backfilled N, unplaced U`
(kube-scheduler alone -> Reservoir with backfill). A benchmark: it reports, it asserts nothing.

What the local control plane cannot show: kubelet start latency and image pulls (kwok starts a pod at once), real
GPU topology (a GPU is a counted resource here), node failures. What the replay keeps: the shapes, the order of
arrivals, the runtimes (compressed), the requests, the GPU models pods ask for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.backfill.run import gate_delay
from bench.scale.run import Api, _not_ready, _sh, create_all, log, reservoir_running, wait_until, watch_events
from bench.trace import report, simulate, trace
from localcluster.cluster import COMPLETE_AFTER, kwok_node
from shared import keys
from shared.ownership import JobRef
from shared.tracecsv import REPLAY_SETTING

REPO = Path(__file__).resolve().parents[2]
GPU = keys.GPU_RESOURCE
MODEL_LABEL = "bench.reservoir.sh/gpu-model"
ARMS = ("alone", "starvation", "backfill")
THRESHOLD = "30s"
RESERVED_NODE_PERCENT = 20
SAMPLE_SECONDS = 1.0


def arm_config(arm: str, namespace: str) -> str:
    """The config.yaml of an arm (module docstring)."""
    text = f"""
resyncPeriod: 5s
starvation:
  starvingJobTimeThreshold: {THRESHOLD}
  reservedNodePercent: {RESERVED_NODE_PERCENT}
"""
    if arm == "alone":
        return "dryRun: true\n" + text
    if arm == "backfill":
        text += f"backfill: {{namespaces: [{namespace}], margin: 5s}}\n"
    return text


def node_name(arm: str, row: trace.NodeRow) -> str:
    return f"{arm}-{row.sn}".lower()


def node_body(arm: str, row: trace.NodeRow) -> dict[str, Any]:
    allocatable = {"cpu": f"{row.cpu_milli}m", "memory": f"{row.memory_mib}Mi"}
    if row.gpu:
        allocatable[GPU] = str(row.gpu)
    return kwok_node(node_name(arm, row), allocatable, {MODEL_LABEL: row.model} if row.model else {})


def pod_body(pod: trace.ReplayPod, namespace: str) -> dict[str, Any]:
    requests = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    resources: dict[str, Any] = {"requests": requests}
    if pod.gpus:
        requests[GPU] = str(pod.gpus)
        resources["limits"] = {GPU: str(pod.gpus)}  # an extended resource's request must equal its limit
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.invalid/reservoir-trace:1",
                                            "resources": resources}],
                            "terminationGracePeriodSeconds": 0}
    if pod.gpu_models:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": MODEL_LABEL, "operator": "In", "values": list(pod.gpu_models)}]}]}}}
    annotations = {COMPLETE_AFTER: f"{pod.runtime:.1f}s", keys.BACKFILL: "true"}
    if pod.declared is not None:  # a pod of a recording may declare none: then Reservoir knows nothing of its end
        annotations[keys.MAXIMUM_RUNTIME] = f"{math.ceil(pod.declared)}s"
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": pod.name, "namespace": namespace, "annotations": annotations}}


@dataclass
class Seen:
    """What the watches showed of one arm, by the wall clock of each event's arrival."""

    created: dict[str, float] = field(default_factory=dict)  # just before the POST
    bound: dict[str, float] = field(default_factory=dict)
    node: dict[str, str] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    ungated: dict[str, float] = field(default_factory=dict)  # the backfill gate lifted (pods created with it)
    gated: set[str] = field(default_factory=set)
    backfilled: set[str] = field(default_factory=set)  # bound with an activeDeadlineSeconds: the agent's grant
    locks: dict[str, str] = field(default_factory=dict)  # node -> lock owner id, now
    lock_history: list[tuple[str, str, float, float | None]] = field(default_factory=list)  # node, owner, from, to

    def pod_event(self, obj: dict[str, Any], kind: str) -> None:
        now, name = time.time(), obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        gates = {g.get("name") for g in spec.get("schedulingGates") or ()}
        if keys.BACKFILL_GATE in gates:
            self.gated.add(name)
        elif name in self.gated:
            self.ungated.setdefault(name, now)
        if spec.get("nodeName") and name not in self.bound:
            self.bound[name] = now
            self.node[name] = spec["nodeName"]
            if spec.get("activeDeadlineSeconds") is not None:
                self.backfilled.add(name)
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed") or kind == "DELETED":
            self.ended.setdefault(name, now)

    def node_event(self, obj: dict[str, Any], kind: str) -> None:
        now, name = time.time(), obj["metadata"]["name"]
        owner = "" if kind == "DELETED" else ((obj["metadata"].get("labels") or {}).get(keys.LOCK) or "")
        before = self.locks.get(name, "")
        if owner == before:
            return
        if before:
            for i in range(len(self.lock_history) - 1, -1, -1):
                node, held_by, since, until = self.lock_history[i]
                if node == name and held_by == before and until is None:
                    self.lock_history[i] = (node, held_by, since, now)
                    break
        if owner:
            self.locks[name] = owner
            self.lock_history.append((name, owner, now, None))
        else:
            self.locks.pop(name, None)


def _fits(moment: float, want: trace.ReplayPod, row: trace.NodeRow, others: Sequence[str], seen: Seen,
          pods: dict[str, trace.ReplayPod], with_backfilled: bool, since: float = -math.inf) -> bool:
    """Whether `row`'s allocatable less the pods of `others` running at `moment` (those backfilled from `since` on
    only when `with_backfilled`) covers `want`'s request."""
    running = [pods[p] for p in others if seen.bound[p] <= moment < seen.ended.get(p, math.inf)
               and (with_backfilled or p not in seen.backfilled or seen.bound[p] < since)]
    return (row.cpu_milli - sum(p.cpu_milli for p in running) >= want.cpu_milli
            and row.memory_mib - sum(p.memory_mib for p in running) >= want.memory_mib
            and row.gpu - sum(p.gpus for p in running) >= want.gpus)


def lock_spans(history: Sequence[tuple[str, str, float, float | None]], pods: Mapping[str, trace.ReplayPod],
               namespace: str) -> list[report.LockSpan]:
    """The node watch's lock history (node, owner id, from, until) as the report reads it: each lock with the replayed
    pod it was held for and that pod's class ("other" and "" for an owner that is not one replayed pod)."""
    owner_pod = {JobRef(namespace, "Pod", name).owner_id: name for name in pods}
    return [report.LockSpan(node, pods[owner_pod[owner]].klass if owner in owner_pod else "other", since, until,
                            owner_pod.get(owner, "")) for node, owner, since, until in history]


def owner_delays(seen: Seen, pods: dict[str, trace.ReplayPod], nodes: dict[str, trace.NodeRow],
                 namespace: str) -> list[float]:
    """For each owner that bound on a node locked for it: how much later its node could take it because of pods
    backfilled there. `first`: the first moment, from the lock on, when the node's allocatable less the pods running
    there that were not backfilled covers the owner's request; `every`: the same counting the backfilled pods too; the
    delay is every - first (0 when backfill held nothing up). A pod backfilled before the owner's lock began (under
    another owner's lock on that node) counts as any pod already running: the lock's node choice saw it, and the
    promise was to the other owner. From the watch events' moments."""
    owner_pod = {JobRef(namespace, "Pod", name).owner_id: name for name in pods}
    out = []
    for node, owner, since, _until in seen.lock_history:
        name = owner_pod.get(owner)
        if name is None or seen.node.get(name) != node or name not in seen.bound:
            continue
        bound, want, row = seen.bound[name], pods[name], nodes[node]
        others = [p for p, n in seen.node.items() if n == node and p != name]
        moments = sorted({since, *(seen.ended[p] for p in others
                                   if p in seen.ended and since <= seen.ended[p] <= bound)})
        first = next((m for m in moments if _fits(m, want, row, others, seen, pods, False, since)), None)
        every = next((m for m in moments if _fits(m, want, row, others, seen, pods, True)), None)
        if first is not None:
            out.append(max(0.0, (every if every is not None else bound) - first))
    return out


async def sample(api: Api, seen: Seen, pods: dict[str, trace.ReplayPod], gpus_of: dict[str, int], began: float,
                 samples: list[report.Sample]) -> None:
    """Every SAMPLE_SECONDS, from what the watches showed: GPUs allocated, nodes locked and their idle GPUs, pending
    multi-GPU pods."""
    while True:
        now = time.time()
        running = [p for p in seen.bound if p not in seen.ended]
        on_node: dict[str, int] = {}
        for p in running:
            on_node[seen.node[p]] = on_node.get(seen.node[p], 0) + pods[p].gpus
        locked = [n for n in seen.locks if n in gpus_of]
        samples.append(report.Sample(
            t=now - began, gpu_allocated=sum(pods[p].gpus for p in running), locked_nodes=len(locked),
            locked_idle_gpus=sum(max(0, gpus_of[n] - on_node.get(n, 0)) for n in locked),
            pending_multi_gpu=sum(1 for p in seen.created if p not in seen.bound and pods[p].gpus >= 2)))
        await asyncio.sleep(SAMPLE_SECONDS)


async def arm(api: Api, kubectl: list[str], name: str, node_rows: Sequence[trace.NodeRow],
              replay: Sequence[trace.ReplayPod], tail: float) -> tuple[report.Arm, Seen]:
    namespace = f"trace-{name}"
    await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}}, ok=(201, 409))
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.NAMESPACE},
                 "data": {keys.CONFIG_KEY: arm_config(name, namespace)}}
    await _sh(*kubectl, "apply", "-f", "-", stdin=yaml.safe_dump(configmap))
    nodes = {node_name(name, row): row for row in node_rows}
    await create_all(api, "/api/v1/nodes", (node_body(name, row) for row in node_rows), len(node_rows),
                     f"{name} nodes")
    await wait_until(lambda: _not_ready(api, len(nodes)), f"{name} nodes Ready", timeout=300)
    await asyncio.sleep(10)  # the agent and the webhook see the config and the nodes before the first pod
    pods = {p.name: p for p in replay}
    seen = Seen()
    rv = (await api.call("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1"))["metadata"]["resourceVersion"]
    node_rv = (await api.call("GET", "/api/v1/nodes?limit=1"))["metadata"]["resourceVersion"]
    watches = [asyncio.create_task(watch_events(api, f"/api/v1/namespaces/{namespace}/pods", rv, seen.pod_event)),
               asyncio.create_task(watch_events(api, "/api/v1/nodes", node_rv, seen.node_event))]
    samples: list[report.Sample] = []
    began = time.time()
    sampler = asyncio.create_task(sample(api, seen, pods, {n: r.gpu for n, r in nodes.items()}, began, samples))
    queue: asyncio.Queue[trace.ReplayPod | None] = asyncio.Queue()

    async def creator() -> None:
        while (pod := await queue.get()) is not None:
            seen.created[pod.name] = time.time()
            await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", pod_body(pod, namespace), ok=(201, 409))

    creators = [asyncio.create_task(creator()) for _ in range(16)]
    last_arrival = replay[-1].arrival if replay else 0.0
    try:
        for pod in replay:  # each at its arrival; 16 creators keep up when the API is slow
            await asyncio.sleep(max(0.0, began + pod.arrival - time.time()))
            await queue.put(pod)
        for _ in creators:
            await queue.put(None)
        await asyncio.gather(*creators)
        while True:
            now = time.time()
            pending = [p for p in pods if p not in seen.bound]
            log(f"bench-trace: {name} {now - began:.0f}s: {len(seen.bound)}/{len(pods)} bound, "
                f"{len(pending)} pending ({sum(1 for p in pending if pods[p].gpus >= 8)} of 8 GPUs), "
                f"{len(seen.locks)} nodes locked, {len(seen.backfilled)} backfilled")
            if not pending or now - began > last_arrival + tail:
                break
            await asyncio.sleep(5)
    finally:
        for task in creators:
            task.cancel()
        sampler.cancel()
        for task in watches:
            task.cancel()
    seconds = time.time() - began
    records = [report.PodRecord(name=p.name, klass=p.klass, gpus=p.gpus, created=seen.created.get(p.name, began),
                                bound=seen.bound.get(p.name), ended=seen.ended.get(p.name),
                                node=seen.node.get(p.name, ""), backfilled=p.name in seen.backfilled,
                                models="|".join(p.gpu_models))
               for p in replay]
    locks = lock_spans(seen.lock_history, pods, namespace)
    result = report.Arm(name=name, records=records, samples=samples, total_gpus=sum(r.gpu for r in node_rows),
                        owner_delays=owner_delays(seen, pods, nodes, namespace), seconds=seconds,
                        window=last_arrival, locks=locks, node_gpus={n: row.gpu for n, row in nodes.items()},
                        node_models={n: row.model for n, row in nodes.items()})
    result.lock_regrets = report.lock_regrets(result, pods, nodes)
    result.floors = report.reservation_floors(result, pods, nodes)
    await api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0", ok=(200, 202, 404))
    await api.call("DELETE", f"/api/v1/namespaces/{namespace}", ok=(200, 202, 404))
    for node in nodes:
        await api.call("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
    await wait_until(lambda: api.count(f"/api/v1/namespaces/{namespace}/pods"), f"{name} pods gone", timeout=300)
    return result, seen


def gate_costs(seen: Seen, pods: dict[str, trace.ReplayPod]) -> str:
    """Per class, how long the pods held on the backfill gate waited there (creation to the gate lifted)."""
    by_class: dict[str, list[float]] = {}
    for name, lifted in seen.ungated.items():
        by_class.setdefault(pods[name].klass, []).append(lifted - seen.created.get(name, lifted))
    parts = [f"{k} {len(v)} pods p50 {report.percentile(v, 50):.1f} s p95 {report.percentile(v, 95):.1f} s"
             for k, v in sorted(by_class.items(), key=lambda kv: trace.CLASSES.index(kv[0])
                                if kv[0] in trace.CLASSES else 99)]
    return "gate (creation to the gate lifted): " + ("; ".join(parts) or "no pod held")


async def run(args: argparse.Namespace) -> list[str]:
    if args.pods or args.nodes:
        if not (args.pods and args.nodes):
            raise SystemExit("bench-trace: give both TRACE (the pods CSV) and NODES (the nodes CSV), or neither")
        node_rows, pod_rows = trace.read_nodes(Path(args.nodes)), trace.read_pods(Path(args.pods))
        source = f"{args.pods} on {args.nodes}"
    else:
        node_rows, pod_rows = trace.synthetic(args.seed)
        source = f"the synthetic trace (seed {args.seed})"
    chosen = trace.subset_nodes(node_rows, args.fraction)
    replayed = trace.replay(pod_rows, arrival_seconds=args.arrival_seconds, runtime_factor=args.runtime_factor,
                            runtime_floor=args.runtime_floor, runtime_cap=args.runtime_cap, window=args.window)
    header = (f"bench-trace: {source}: {len(chosen)} nodes ({sum(r.gpu for r in chosen)} GPUs), "
              f"{len(replayed.pods)} pods over {args.window or args.arrival_seconds:.0f} s "
              f"({replayed.skipped} never scheduled in the trace, left out)")
    log(header)
    pods = {p.name: p for p in replayed.pods}
    arms: list[report.Arm] = []
    lines = [header]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gates: dict[str, dict[str, list[float | None]]] = {}  # arm -> pod -> [created, gate lifted], each pod held
    async with reservoir_running() as (cluster, api, agent):
        for name in args.arms:
            result, seen = await arm(api, cluster.kubectl, name, chosen, replayed.pods, args.tail)
            arms.append(result)
            gates[name] = {p: [seen.created.get(p), seen.ungated.get(p)] for p in sorted(seen.gated)}
            line = f"{name}: {result.seconds:.0f} s; " + gate_costs(seen, pods)
            log(f"bench-trace: {line}")
            lines.append(line)
            if not agent.running():
                raise RuntimeError(f"agent exited:\n{agent.log_text()[-3000:]}")
        lines.append(await gate_delay(agent.metrics_port))
        # the agent's own account of every decision (its log lives in a directory removed with the cluster)
        (out / "agent.log").write_text(agent.log_text())
    (out / "gates.json").write_text(json.dumps(gates) + "\n")
    log("bench-trace: the same replay simulated (reservoir simulate), for the validation table, and again at "
        f"{len(simulate.TIMING_SPREAD)} other timings (its own spread)")
    specs = [a for a in simulate.default_arms() if a.name in args.arms]
    jobs = os.cpu_count() or 1  # the control plane is gone: the machine is the model's
    model = [o.arm for o in simulate.simulate(specs, chosen, replayed.pods, seed=args.seed, tail=args.tail,
                                              jobs=jobs)]
    spread = simulate.timing_spread(specs, chosen, replayed.pods, seed=args.seed, tail=args.tail, jobs=jobs)
    agreement = [simulate.agreement_line(a.records, pods, {node_name(a.name, row): row for row in chosen})
                 for a in arms if a.name == "alone"]
    table = "\n".join([report.table(arms), "", *report.criteria_lines(arms), "",
                       "The same pods, nodes and configs in `reservoir simulate` (the model) beside this replay:", "",
                       report.validation_table(arms, model, spread), *agreement])
    report.write_json(arms, out / "trace.json")
    pictures = report.plot(arms, out)
    command = "make bench-trace" + "".join(f" {k}={v}" for k, v in (("TRACE", args.pods), ("NODES", args.nodes),
                                                                     ("FRACTION", args.fraction
                                                                      if args.fraction != REPLAY_SETTING["fraction"]
                                                                      else None),
                                                                     ("WINDOW", args.window
                                                                      if args.window != REPLAY_SETTING["window"]
                                                                      else None))
                                           if v is not None)
    (out / "report.md").write_text(f"`{command}`\n\n{header}\n\n{table}\n\n" + "\n".join(lines[1:]) + "\n")
    lines += [table, *(f"picture: {p}" for p in pictures), f"records: {out / 'trace.json'}"]
    by_name = {a.name: a for a in arms}
    reservoir = report.reservoir_arm(arms)
    if "alone" in by_name and reservoir is not None:
        lines.append(report.last_line(by_name["alone"], reservoir))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-trace", description=__doc__.split("\n")[0])
    parser.add_argument("--pods", help="the trace's pods CSV (openb format); default: the synthetic trace")
    parser.add_argument("--nodes", help="the trace's nodes CSV (openb format)")
    setting = REPLAY_SETTING
    parser.add_argument("--fraction", type=float, default=setting["fraction"],
                        help="share of each node shape replayed (%(default)g)")
    parser.add_argument("--window", type=float, default=setting["window"],
                        help="seconds of the compressed arrivals replayed, at the same intensity (%(default)g)")
    parser.add_argument("--arrival-seconds", type=float, default=setting["arrival_seconds"],
                        help="the trace's arrival span compressed into this many seconds (%(default)g)")
    parser.add_argument("--runtime-factor", type=float, default=setting["runtime_factor"],
                        help="runtimes divided by this (%(default)g)")
    parser.add_argument("--runtime-floor", type=float, default=setting["runtime_floor"],
                        help="shortest replayed runtime, seconds (%(default)g)")
    parser.add_argument("--runtime-cap", type=float, default=setting["runtime_cap"],
                        help="longest replayed runtime, seconds (%(default)g)")
    parser.add_argument("--tail", type=float, default=300.0,
                        help="seconds after the last arrival an arm waits for pending pods (300)")
    parser.add_argument("--seed", type=int, default=0, help="the synthetic trace's seed (0)")
    parser.add_argument("--arms", type=lambda s: tuple(s.split(",")), default=ARMS,
                        help="arms to run, in order (alone,starvation,backfill)")
    parser.add_argument("--out", default=str(REPO / ".reservoir" / "bench-trace"), help="where the report goes")
    args = parser.parse_args(argv)
    unknown = set(args.arms) - set(ARMS)
    if unknown:
        parser.error(f"--arms: unknown {sorted(unknown)}; expected some of {','.join(ARMS)}")
    if args.window is not None and args.window <= 0:
        args.window = None
    for line in asyncio.run(run(args)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
