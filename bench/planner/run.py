"""`make bench-planner`: one full plan over synthetic clusters, side by side at three sizes, in one run.

Each cluster: N nodes (32 cpu, 128 Gi), 30 pods per node (1% of them pending, the rest running, half of those
with a maximum runtime), jobs of 1-8 pods, a tenth in PodGroups. Reported per size: snapshot build time, one
full plan's time (no earlier plan to reuse; collector paused, as the agent plans), the peak memory one plan allocates (tracemalloc, measured on a
separate run), and the time to re-plan after one pod event as the agent does it: a full plan over the updated
snapshot, handed the previous plan so node states whose node and pods did not change are reused. Each size runs
in its own process so peak memory is not shared.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import tracemalloc
from datetime import datetime, timedelta, timezone

PODS_PER_NODE = 30
PENDING_FRACTION = 0.01
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def build(nodes: int, seed: int = 7):
    from agent.planner.model import Snapshot
    from shared import keys
    from shared.views import NodeView, PodGroupView, PodView

    rng = random.Random(seed)
    node_views = {}
    for i in range(nodes):
        name = f"node-{i:05d}"
        node_views[name] = NodeView.from_obj({"metadata": {"name": name, "labels": {"zone": f"z{i % 3}"},
                                                           "creationTimestamp": stamp(NOW - timedelta(days=3))},
                                              "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}})
    total = nodes * PODS_PER_NODE
    pending = int(total * PENDING_FRACTION)
    pods, groups = [], {}
    job = 0
    index = 0
    while index < total:
        size = rng.randint(1, 8)
        in_group = job % 10 == 0
        ns = f"ns-{job % 50}"
        if in_group:
            groups[(ns, f"job-{job}")] = PodGroupView.from_obj({"metadata": {"name": f"job-{job}", "namespace": ns,
                                                                             "creationTimestamp": stamp(NOW - timedelta(hours=1))},
                                                                "spec": {"minMember": size}})
        for task in range(size):
            if index >= total:
                break
            is_pending = index >= total - pending
            annotations = {keys.GROUP_NAME: f"job-{job}"} if in_group else {}
            if not is_pending and index % 2:
                annotations[keys.MAXIMUM_RUNTIME] = f"{rng.randint(5, 240)}m"
            spec = {"priority": rng.choice([0, 0, 0, 100, 1000]),
                    "containers": [{"name": "c", "resources": {"requests": {
                        "cpu": f"{rng.choice([250, 500, 1000, 2000]) if not is_pending else rng.choice([8000, 16000, 30000])}m",
                        "memory": f"{rng.choice([1, 2, 4])}Gi"}}}]}
            status = {"phase": "Pending"}
            if not is_pending:
                spec["nodeName"] = f"node-{(index // PODS_PER_NODE) % nodes:05d}"
                status = {"phase": "Running", "startTime": stamp(NOW - timedelta(minutes=rng.randint(1, 120)))}
            meta = {"name": f"job-{job}-{task}", "namespace": ns, "uid": f"u{index}", "annotations": annotations,
                    "creationTimestamp": stamp(NOW - timedelta(minutes=rng.randint(1, 180)))}
            if not in_group:
                meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{job}",
                                            "uid": f"j{job}", "controller": True}]
            pods.append(PodView.from_obj({"metadata": meta, "spec": spec, "status": status}))
            index += 1
        job += 1
    return Snapshot(nodes=node_views, pods=pods, podgroups=groups)


def measure(nodes: int) -> dict:
    from agent.gcpause import collector_paused
    from agent.planner.plan import plan
    from shared.config import load_config

    config = load_config("starvation: {starvingJobTimeThreshold: 10m}")
    began = time.perf_counter()
    snapshot = build(nodes)
    built = time.perf_counter() - began
    began = time.perf_counter()
    with collector_paused():  # as the agent plans
        result = plan(snapshot, config, NOW)
    full = time.perf_counter() - began
    tracemalloc.start()  # a second plan, for memory only: tracemalloc slows allocation-heavy code
    plan(snapshot, config, NOW)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # one pod event: a pending pod is bound; re-plan from the updated snapshot, keeping the locks just planned
    from dataclasses import replace
    pods = list(snapshot.pods)
    victim = next(i for i, p in enumerate(pods) if not p.is_bound)
    pods[victim] = replace(pods[victim], node_name="node-00000", phase="Running", started=NOW)
    updated = replace(snapshot, pods=pods)
    began = time.perf_counter()
    with collector_paused():
        plan(updated, config, NOW + timedelta(seconds=1), result.locks, previous=result)
    replan = time.perf_counter() - began
    return {"nodes": nodes, "pods": len(snapshot.pods), "snapshot_s": built, "plan_s": full,
            "peak_mib": peak / 2**20, "replan_ms": replan * 1000, "locks": len(result.locks),
            "starving": sum(1 for j in result.jobs if j.starving)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(measure(int(sys.argv[2]))))
        return 0
    sizes = [int(s) for s in (sys.argv[1:] or ["500", "5000", "10000"])]
    rows = []
    for size in sizes:
        out = subprocess.run([sys.executable, "-m", "bench.planner.run", "--one", str(size)], capture_output=True,
                             text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{r['nodes']:>6} nodes {r['pods']:>7} pods: snapshot {r['snapshot_s']:.2f}s, plan {r['plan_s']:.3f}s, "
              f"peak {r['peak_mib']:.0f} MiB, replan {r['replan_ms']:.0f} ms, {r['locks']} locks, {r['starving']} starving",
              flush=True)
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        growth = (b["plan_s"] / a["plan_s"]) / (b["nodes"] / a["nodes"])
        print(f"plan time growth per node-count growth, {a['nodes']} -> {b['nodes']}: {growth:.2f} (1.0 = linear)")
    five = next((r for r in rows if r["nodes"] == 5000), rows[-1])
    print(f"planner: {five['nodes']} nodes full plan {five['plan_s']:.2f} s, peak {five['peak_mib']:.0f} MiB, "
          f"replan after one event {five['replan_ms']:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
