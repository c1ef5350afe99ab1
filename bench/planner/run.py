"""`make bench-planner`: one full plan over synthetic clusters, side by side at three sizes, in one run.

Each cluster: N nodes (32 cpu, 128 Gi), 30 pods per node (1% of them pending, the rest running, half of those
with a maximum runtime), jobs of 1-8 pods, a tenth in PodGroups. Reported per size: snapshot build time, one
full plan's time (no earlier plan to reuse; collector paused, as the agent plans), the peak memory one plan allocates (tracemalloc, measured on a
separate run), and the time to re-plan after one pod event as the agent does it: a full plan over the updated
snapshot, handed the previous plan so node states whose node and pods did not change are reused. Each size runs
in its own process so peak memory is not shared. Then the queue-guarantee search: its quality against brute force
on small random clusters, and, at each size, a plan with 100 guaranteed queues beside one without.
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


QUEUES = 100


def measure_guarantees(nodes: int) -> dict:
    """The same cluster with QUEUES queues each guaranteed 64 cpu / 128Gi (two nodes' worth): one full plan
    with the guarantees beside one without, in the same process."""
    from dataclasses import replace

    from agent.gcpause import collector_paused
    from agent.planner.plan import plan
    from shared.config import load_config
    from shared.views import QueueView

    config = load_config("starvation: {starvingJobTimeThreshold: 10m}")
    snapshot = build(nodes)
    queues = {f"q{i:03d}": QueueView.from_obj({
        "metadata": {"name": f"q{i:03d}", "uid": f"q{i}", "creationTimestamp": stamp(NOW - timedelta(days=1, minutes=i))},
        "spec": {"weight": 1, "guarantee": {"resource": {"cpu": "64", "memory": "128Gi"}}}}) for i in range(QUEUES)}
    with collector_paused():
        began = time.perf_counter()
        plan(snapshot, config, NOW)
        without = time.perf_counter() - began
        began = time.perf_counter()
        result = plan(replace(snapshot, queues=queues), config, NOW)
        with_queues = time.perf_counter() - began
    return {"nodes": nodes, "without_s": without, "with_s": with_queues,
            "queue_nodes": sum(len(g.nodes) for g in result.guarantees)}


def search_quality(samples: int = 300, budget: int = 2000, seed: int = 11, exact_when_small: bool = True) -> dict:
    """Chosen score / brute-force optimum on random clusters of 1-12 nodes (queue use and idle random)."""
    from agent.planner.guarantee_search import Problem, brute_force, search
    from shared.resources import Resources

    rng = random.Random(seed)
    ratios, search_s, brute_s = [], 0.0, 0.0
    while len(ratios) < samples:
        n = rng.randint(1, 12)
        spec = [(rng.choice([2, 4, 8, 16]), rng.choice([4, 8, 16, 32, 64]), rng.randint(0, 100), rng.randint(0, 3))
                for _ in range(n)]
        alloc = [Resources({"cpu": c * 1000, "memory": m * 2**30}) for c, m, _, _ in spec]
        idle = [Resources({"cpu": c * 10 * p, "memory": m * 2**30 * p // 100}) for c, m, p, _ in spec]
        used = [Resources({"cpu": u * 1000, "memory": u * 2**30}) for *_, u in spec]
        problem = Problem([f"n{i}" for i in range(n)], alloc, idle, used,
                          Resources({"cpu": rng.randint(1, 64) * 1000, "memory": rng.randint(1, 200) * 2**30}),
                          Resources.total(alloc), Resources.total(used))
        began = time.perf_counter()
        best = brute_force(problem)
        brute_s += time.perf_counter() - began
        if best is None:
            continue
        began = time.perf_counter()
        found = search(problem, budget, exact_when_small)
        search_s += time.perf_counter() - began
        ratios.append(found[0] / best[0])
    return {"samples": samples, "min": min(ratios), "mean": sum(ratios) / len(ratios),
            "search_ms": search_s / samples * 1000, "brute_ms": brute_s / samples * 1000}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(measure(int(sys.argv[2]))))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--guarantees":
        print(json.dumps(measure_guarantees(int(sys.argv[2]))))
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
    for exact, label in ((True, "as run"), (False, "beams alone")):
        quality = search_quality(exact_when_small=exact)
        print(f"guarantee search quality, {label}, on {quality['samples']} random clusters of <= 12 nodes (score / "
              f"brute-force optimum): min {quality['min']:.3f}, mean {quality['mean']:.4f}; search "
              f"{quality['search_ms']:.1f} ms, brute force {quality['brute_ms']:.1f} ms per cluster", flush=True)
    for size in sizes:
        out = subprocess.run([sys.executable, "-m", "bench.planner.run", "--guarantees", str(size)],
                             capture_output=True, text=True, check=True)
        g = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{g['nodes']:>6} nodes, {QUEUES} guaranteed queues: plan {g['with_s']:.3f}s vs {g['without_s']:.3f}s "
              f"without (placement {1000 * (g['with_s'] - g['without_s']) / QUEUES:.1f} ms per queue), "
              f"{g['queue_nodes']} nodes locked for queues", flush=True)
    five = next((r for r in rows if r["nodes"] == 5000), rows[-1])
    print(f"planner: {five['nodes']} nodes full plan {five['plan_s']:.2f} s, peak {five['peak_mib']:.0f} MiB, "
          f"replan after one event {five['replan_ms']:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
