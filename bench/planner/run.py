"""`make bench-planner`: one full plan over synthetic clusters, side by side at three sizes, in one run.

Each cluster: N nodes (32 cpu, 128 Gi), 30 pods per node (1% of them pending, the rest running, spread over every
node, half of those with a maximum runtime), jobs of 1-8 pods, a tenth in PodGroups. The running pods ask for 750m
or 1 cpu, so every node is full to 25-27 of its 32 cpu; the pending ones ask for 10, 12 or 16 cpu: none fits on any
node now, each fits once enough of a node's pods with a maximum runtime end. So the starving jobs take the drain
path (seed 000 locks only where a node must drain), and the plan measures it. Reported per size: snapshot build
time, one full plan's time (no earlier plan to reuse; collector paused, as the agent plans), the peak memory one plan
allocates (tracemalloc, measured on a separate run), and the time to re-plan after one pod event as the agent does
it: the pod index updated with the one change (agent/planner/podindex.py), then a full plan over the updated
snapshot, handed the previous plan so node states whose node and pods did not change are reused. Each size runs
in its own process so peak memory is not shared. Then the queue-guarantee search: its quality against brute force
on small random clusters (of few node shapes, and of nodes all different), and, at each size, a plan with 100
guaranteed queues beside one without.

Last, a heterogeneous ("mixed") cluster at 500 and 5,000 nodes: MIXED_SHAPES (24 node shapes, 4-128 cpu, 2-8 GiB
per cpu), each node's allocatable a little less than its shape's by a random amount (kube-reserved, the memory the
kernel reports), so no two nodes have the same allocatable; random usage (each node filled to a random 0-95% of its
cpu with pods of random size; 1% of pods pending), a tenth of the jobs in PodGroups of the 100 queues, and 100 queues
guaranteed 16-256 cpu (2 or 4 GiB per cpu) each, opted into locks, all from a fixed seed. Reported: one full plan
with the guarantees (collector paused) beside one without, and the tracemalloc peak of the allocations one plan with
the guarantees makes (a separate run; the snapshot, built before, is not counted).

A tenant's flood at 5,000 nodes (measure_flood): FLOOD starving pods of as many shapes in one namespace, one plan
and the plan after it, and whether the other namespaces' starving jobs were still locked for.

Backfill (issue 17), at each size: one full plan with 100 pods on the backfill gate (backfill.MAX_DECISIONS, the most
one plan decides), each asking 10 cpu so it fits nowhere (the worst case of clause 3's first-fit pass over the open
nodes; no slot, the snapshot carrying no lock yet), beside one without.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta

PODS_PER_NODE = 30
PENDING_FRACTION = 0.01
REPLANS = 5  # pod events in a row for the replan's median
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


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
                                              "status": {"allocatable": {"cpu": "32", "memory": "128Gi",
                                                                         "pods": "110"}}})
    total = nodes * PODS_PER_NODE
    pending = int(total * PENDING_FRACTION)
    pods, groups = [], {}
    job = 0
    index = 0
    running = 0  # running pods so far: each goes to the next node in turn, so every node is about as full
    while index < total:
        size = rng.randint(1, 8)
        in_group = job % 10 == 0
        ns = f"ns-{job % 50}"
        if in_group:
            created = stamp(NOW - timedelta(hours=1))
            groups[(ns, f"job-{job}")] = PodGroupView.from_obj({"metadata": {"name": f"job-{job}", "namespace": ns,
                                                                             "creationTimestamp": created},
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
                        "cpu": f"{rng.choice([750, 1000]) if not is_pending else rng.choice([10000, 12000, 16000])}m",
                        "memory": f"{rng.choice([1, 2, 4])}Gi"}}}]}
            status = {"phase": "Pending"}
            if not is_pending:
                spec["nodeName"] = f"node-{running % nodes:05d}"
                running += 1
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


def replace_snapshot(snapshot):  # type: ignore[no-untyped-def]
    """The same snapshot as a new object, so its index is not the one the first plan built and cached."""
    from dataclasses import replace
    return replace(snapshot)


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
    # issue 34: what the agent keeps from one plan to the next beyond the views themselves: the pod index and the plan
    # (its node states, with the ranks they remember), measured as what is still allocated once the plan returned
    from agent.planner.podindex import PodIndex
    tracemalloc.start()
    index = PodIndex.of(snapshot.pods)
    indexed = tracemalloc.get_traced_memory()[0]
    kept_plan = plan(replace_snapshot(snapshot).with_index(index), config, NOW)
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept_plan, index
    # one pod event: a pending pod is bound; re-plan from the updated snapshot, keeping the locks just planned. As the
    # agent does it: the index updated with the one change (podindex), then a plan from the last one. Five events in
    # a row, each from the plan before; the median is reported (one event alone is at the mercy of the machine)
    from dataclasses import replace
    unbound = [i for i, p in enumerate(snapshot.pods) if not p.is_bound][:REPLANS]
    current, last, times = snapshot, result, []
    for step, victim in enumerate(unbound):
        pods = list(current.pods)
        pods[victim] = bound = replace(pods[victim], node_name=f"node-{step:05d}", phase="Running", started=NOW)
        began = time.perf_counter()
        with collector_paused():
            updated = replace(current, pods=pods).with_index(current.index.updated([bound]))
            last = plan(updated, config, NOW + timedelta(seconds=1 + step), last.locks, previous=last)
        times.append(time.perf_counter() - began)
        current = updated
    replan = statistics.median(times)
    later = NOW + timedelta(seconds=1 + len(unbound))
    # one node event, after those: a node's view changes (a label), its pods do not
    nodes_now = dict(current.nodes)
    nodes_now["node-00001"] = replace(nodes_now["node-00001"], labels={"zone": "z9"})
    began = time.perf_counter()
    with collector_paused():
        plan(replace(current, nodes=nodes_now).with_index(current.index), config, later, last.locks, previous=last)
    node_event = time.perf_counter() - began
    # time alone: the last snapshot a second later (a threshold, an expiry, the resync)
    began = time.perf_counter()
    with collector_paused():
        plan(current, config, later, last.locks, previous=last)
    time_alone = time.perf_counter() - began
    return {"nodes": nodes, "pods": len(snapshot.pods), "snapshot_s": built, "plan_s": full,
            "peak_mib": peak / 2**20, "index_mib": indexed / 2**20, "kept_mib": kept / 2**20,
            "replan_ms": replan * 1000, "node_event_ms": node_event * 1000,
            "time_ms": time_alone * 1000, "locks": len(result.locks),
            "starving": sum(1 for j in result.jobs if j.starving)}


QUEUES = 100


def opt_in() -> dict[str, str]:
    """The annotation a Queue opts its guarantee into node locks with (none when this tree has no opt-in)."""
    from shared import keys

    key = getattr(keys, "QUEUE_LOCK_GUARANTEE", None)
    return {key: "true"} if key else {}


OPT_IN = opt_in()


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
        "metadata": {"name": f"q{i:03d}", "uid": f"q{i}", "annotations": OPT_IN,
                     "creationTimestamp": stamp(NOW - timedelta(days=1, minutes=i))},
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


def search_quality(samples: int = 300, budget: int = 2000, seed: int = 11, exact_when_small: bool = True,
                   mixed: bool = False) -> dict:
    """Chosen score / brute-force optimum on random clusters of 1-12 nodes (queue use and idle random); `mixed`: every
    node's allocatable a little less than its shape's, by a random amount, so no two are alike."""
    from agent.planner.guarantee_search import Problem, brute_force, search
    from shared.resources import Resources

    rng = random.Random(seed)
    ratios, search_s, brute_s = [], 0.0, 0.0
    while len(ratios) < samples:
        n = rng.randint(1, 12)
        spec = [(rng.choice([2, 4, 8, 16]), rng.choice([4, 8, 16, 32, 64]), rng.randint(0, 100), rng.randint(0, 3))
                for _ in range(n)]
        cut = [(rng.randint(0, 300), rng.randint(0, 700) * 2**20) if mixed else (0, 0) for _ in range(n)]
        alloc = [Resources({"cpu": c * 1000 - dc, "memory": m * 2**30 - dm})
                 for (c, m, _, _), (dc, dm) in zip(spec, cut, strict=True)]
        idle = [Resources({"cpu": a["cpu"] * p // 100, "memory": a["memory"] * p // 100})
                for a, (_, _, p, _) in zip(alloc, spec, strict=True)]
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


MIXED_SIZES = (500, 5000)
MIXED_SHAPES = [(cpu, per) for cpu in (4, 8, 16, 32, 48, 64, 96, 128) for per in (2, 4, 8)]  # cpu, GiB per cpu


def build_mixed(nodes: int, seed: int = 2002):
    """The heterogeneous cluster of the module docstring, and its QUEUES guaranteed queues."""
    from agent.planner.model import Snapshot
    from shared import keys
    from shared.views import NodeView, PodGroupView, PodView, QueueView

    rng = random.Random(seed)
    node_views, placed = {}, []
    for i in range(nodes):
        name = f"node-{i:05d}"
        cpu, per = rng.choice(MIXED_SHAPES)
        milli, mib = cpu * 1000 - rng.randint(50, 400), cpu * per * 1024 - rng.randint(1, 512)
        node_views[name] = NodeView.from_obj({"metadata": {"name": name, "labels": {"zone": f"z{i % 3}"},
                                                           "creationTimestamp": stamp(NOW - timedelta(days=3))},
                                              "status": {"allocatable": {"cpu": f"{milli}m", "memory": f"{mib}Mi",
                                                                         "pods": "110"}}})
        fill, used = rng.uniform(0, 0.95) * milli, 0
        while used < fill:
            request = rng.choice([250, 500, 1000, 2000, 4000])
            placed.append((name, request, request * per * rng.choice([1, 2, 3]) // 2000))
            used += request
    pending = len(placed) // 99  # 1% of all pods
    placed += [(None, rng.choice([8000, 16000, 30000]), rng.choice([16, 32, 64]) * 1024) for _ in range(pending)]
    pods, groups, job, index = [], {}, 0, 0
    while index < len(placed):
        size, ns = rng.randint(1, 8), f"ns-{job % 50}"
        in_group = job % 10 == 0
        if in_group:
            groups[(ns, f"job-{job}")] = PodGroupView.from_obj({
                "metadata": {"name": f"job-{job}", "namespace": ns,
                             "creationTimestamp": stamp(NOW - timedelta(hours=1))},
                "spec": {"minMember": size, "queue": f"q{job // 10 % QUEUES:03d}"}})
        for task, (node_name, milli, mib) in enumerate(placed[index:index + size]):
            requests = {"cpu": f"{milli}m", "memory": f"{mib}Mi"}
            spec = {"priority": rng.choice([0, 0, 0, 100, 1000]),
                    "containers": [{"name": "c", "resources": {"requests": requests}}]}
            status = {"phase": "Pending"}
            if node_name is not None:
                spec["nodeName"] = node_name
                status = {"phase": "Running", "startTime": stamp(NOW - timedelta(minutes=rng.randint(1, 120)))}
            meta = {"name": f"job-{job}-{task}", "namespace": ns, "uid": f"u{index + task}",
                    "annotations": {keys.GROUP_NAME: f"job-{job}"} if in_group else {},
                    "creationTimestamp": stamp(NOW - timedelta(minutes=rng.randint(1, 180)))}
            if not in_group:
                meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{job}",
                                            "uid": f"j{job}", "controller": True}]
            pods.append(PodView.from_obj({"metadata": meta, "spec": spec, "status": status}))
        index += size
        job += 1
    queues = {}
    for i in range(QUEUES):
        cpu = rng.choice([16, 32, 64, 128, 256])
        resource = {"cpu": str(cpu), "memory": f"{cpu * rng.choice([2, 4])}Gi"}
        queues[f"q{i:03d}"] = QueueView.from_obj({
            "metadata": {"name": f"q{i:03d}", "uid": f"q{i}", "annotations": OPT_IN,
                         "creationTimestamp": stamp(NOW - timedelta(days=1, minutes=i))},
            "spec": {"weight": 1, "guarantee": {"resource": resource}}})
    return Snapshot(nodes=node_views, pods=pods, podgroups=groups), queues


def measure_mixed(nodes: int) -> dict:
    """The mixed cluster: one full plan with its QUEUES guaranteed queues beside one without, and the tracemalloc peak
    of one plan with them."""
    from dataclasses import replace

    from agent.gcpause import collector_paused
    from agent.planner.plan import plan
    from shared.config import load_config

    config = load_config("starvation: {starvingJobTimeThreshold: 10m}")
    snapshot, queues = build_mixed(nodes)
    guaranteed = replace(snapshot, queues=queues)
    with collector_paused():
        began = time.perf_counter()
        plan(snapshot, config, NOW)
        without = time.perf_counter() - began
        began = time.perf_counter()
        result = plan(guaranteed, config, NOW)
        with_queues = time.perf_counter() - began
    tracemalloc.start()  # a second plan, for memory only
    plan(guaranteed, config, NOW)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    allocatables = {n.allocatable for n in snapshot.nodes.values()}
    return {"nodes": nodes, "pods": len(snapshot.pods), "shapes": len(MIXED_SHAPES), "allocatables": len(allocatables),
            "without_s": without, "with_s": with_queues, "peak_mib": peak / 2**20,
            "queue_nodes": sum(len(g.nodes) for g in result.guarantees),
            "placed": sum(1 for g in result.guarantees if g.nodes)}


GATED = 100  # backfill.MAX_DECISIONS: the most gated pods one plan decides


def measure_backfill(nodes: int) -> dict:
    """The same cluster with GATED pods on the backfill gate, each asking 10 cpu (so it fits on no node: clause 3's
    first-fit pass over the open nodes walks every one of them): one full plan with them beside one without, in the
    same process, backfill on in both. The snapshot carries no lock yet, so there is no slot to weigh: this measures
    the decision and clause 3, not choose_backfills."""
    from dataclasses import replace

    from agent.gcpause import collector_paused
    from agent.planner.plan import plan
    from shared import keys
    from shared.config import load_config
    from shared.views import PodView

    config = load_config("starvation: {starvingJobTimeThreshold: 10m}\nbackfill: {namespaces: ['*'], margin: 5s}")
    snapshot = build(nodes)
    gated = [PodView.from_obj({
        "metadata": {"name": f"gated-{i}", "namespace": "ns-gated", "uid": f"g{i}",
                     "annotations": {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10m"},
                     "creationTimestamp": stamp(NOW - timedelta(seconds=5))},
        "spec": {"schedulingGates": [{"name": keys.BACKFILL_GATE}],
                 "containers": [{"name": "c", "resources": {"requests": {"cpu": "10", "memory": "1Gi"}}}]},
        "status": {"phase": "Pending"}}) for i in range(GATED)]
    with collector_paused():
        began = time.perf_counter()
        plain = plan(snapshot, config, NOW)
        without = time.perf_counter() - began
        began = time.perf_counter()
        result = plan(replace(snapshot, pods=[*snapshot.pods, *gated]), config, NOW)
        with_gated = time.perf_counter() - began
    return {"nodes": nodes, "without_s": without, "with_s": with_gated, "slots": len(result.backfill.slots),
            "decided": len(result.backfill.placed) + len(result.backfill.released), "locks": len(plain.locks)}


GATE_STREAM = 1000  # gated pods arriving at once for measure_gate


def measure_gate(nodes: int) -> dict:
    """Gate decisions per second, as the agent makes them: GATE_STREAM pods on the backfill gate arrive (the index
    updated with them), in 20 namespaces, of four shapes (1 or 2 cpu, with or without a zone nodeSelector), each
    declaring a runtime. Gate passes (plan.plan_gate, on the last full plan, as agent.controller.Agent.gate_pass)
    decide what they may (backfill.MAX_DECISIONS a pass), and the writer's answer is applied: each decided pod's
    view loses the gate. Passes run until none is left on the gate; decisions per second = GATE_STREAM / the time of
    those passes and index updates. The cluster is the `measure` one (full to 25-27 of 32 cpu, so a gated pod fits
    now)."""
    from dataclasses import replace

    from agent.gcpause import collector_paused
    from agent.planner.plan import plan, plan_gate
    from shared import keys
    from shared.config import load_config
    from shared.views import PodView

    config = load_config("starvation: {starvingJobTimeThreshold: 10m}\nbackfill: {namespaces: ['*'], margin: 5s}")
    snapshot = build(nodes)
    with collector_paused():
        result = plan(snapshot, config, NOW)
    gated = [PodView.from_obj({
        "metadata": {"name": f"gated-{i}", "namespace": f"tenant-{i % 20}", "uid": f"g{i}",
                     "annotations": {keys.BACKFILL: "true", keys.MAXIMUM_RUNTIME: "10m"},
                     "creationTimestamp": stamp(NOW - timedelta(seconds=1))},
        "spec": {"schedulingGates": [{"name": keys.BACKFILL_GATE}],
                 **({"nodeSelector": {"zone": "z1"}} if i % 4 >= 2 else {}),
                 "containers": [{"name": "c", "resources": {"requests": {"cpu": str(1 + i % 2), "memory": "1Gi"}}}]},
        "status": {"phase": "Pending"}}) for i in range(GATE_STREAM)]
    index = snapshot.index
    pods = {p.key: p for p in snapshot.pods}
    changed = gated
    plans = count = 0
    spent = 0.0
    now = NOW
    while changed:
        began = time.perf_counter()
        with collector_paused():
            index = index.updated(changed)
            pods.update((p.key, p) for p in changed)
            now += timedelta(milliseconds=100)  # agent.controller.GATE_GAP
            decided = plan_gate(type(snapshot)(nodes=snapshot.nodes, pods=list(pods.values()),
                                               podgroups=snapshot.podgroups).with_index(index), config, now, result)
        spent += time.perf_counter() - began
        plans += 1
        done = {r.key for r in decided.released} | {b.pod.key for b in decided.placed}
        count += len(done)
        changed = [replace(pods[key], gated=False, backfill_gated=False) for key in sorted(done)]
    return {"nodes": nodes, "gated": GATE_STREAM, "decided": count, "plans": plans, "seconds": spent,
            "per_second": count / spent if spent else 0.0}


FLOOD = 1000  # a tenant's starving pods of as many shapes, for measure_flood


def measure_flood(nodes: int) -> dict:
    """A tenant's flood (the `measure` cluster, plus FLOOD starving pods in namespace `tenant`, each of its own shape:
    a cpu request a millicore apart, 20 cpu and up, so each fits once a node drains): one full plan, the plan after it
    (from the first, as the agent plans), the tracemalloc peak of a third, and how many of the other namespaces'
    starving jobs were locked for. One plan ranks the nodes for at most capacity.plan_rankings shapes, each namespace
    promised its share (starvation.NodeChooser); before that bound, each plan ranked every node for every shape."""
    from dataclasses import replace

    from agent.gcpause import collector_paused
    from agent.planner.plan import plan
    from shared.config import load_config
    from shared.views import PodView

    config = load_config("starvation: {starvingJobTimeThreshold: 10m}")
    snapshot = build(nodes)
    flood = [PodView.from_obj({
        "metadata": {"name": f"flood-{k}", "namespace": "tenant", "uid": f"f{k}",
                     "creationTimestamp": stamp(NOW - timedelta(hours=1))},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": f"{20000 + k}m", "memory": "1Gi"}}}]},
        "status": {"phase": "Pending"}}) for k in range(FLOOD)]
    flooded = replace(snapshot, pods=[*snapshot.pods, *flood])
    with collector_paused():
        began = time.perf_counter()
        first = plan(flooded, config, NOW)
        first_s = time.perf_counter() - began
        began = time.perf_counter()
        second = plan(replace(flooded), config, NOW + timedelta(seconds=1), first.locks, previous=first)
        second_s = time.perf_counter() - began
    tracemalloc.start()
    plan(replace(flooded), config, NOW + timedelta(seconds=2), second.locks, previous=second)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    others = {j.owner for j in first.jobs if j.starving and not j.subject.startswith("tenant/")}
    locked = {lock.owner for lock in first.locks.values()}
    return {"nodes": nodes, "first_s": first_s, "next_s": second_s, "peak_mib": peak / 2**20,
            "tenant_locks": sum(1 for lock in first.locks.values() if lock.subject.startswith("tenant/")),
            "locks": len(first.locks), "others": len(others), "others_locked": len(others & locked)}


def _child(flag: str, size: int) -> dict:
    """One measurement in a fresh interpreter (`--one`, `--guarantees` or `--mixed` N), so each starts from an empty
    heap: the JSON its last line prints."""
    out = subprocess.run([sys.executable, "-m", "bench.planner.run", flag, str(size)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(measure(int(sys.argv[2]))))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--guarantees":
        print(json.dumps(measure_guarantees(int(sys.argv[2]))))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--backfill":
        print(json.dumps(measure_backfill(int(sys.argv[2]))))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--gate":
        print(json.dumps(measure_gate(int(sys.argv[2]))))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--flood":
        print(json.dumps(measure_flood(int(sys.argv[2]))))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--mixed":
        print(json.dumps(measure_mixed(int(sys.argv[2]))))
        return 0
    sizes = [int(s) for s in (sys.argv[1:] or ["500", "5000", "10000"])]
    rows = []
    for size in sizes:
        rows.append(_child("--one", size))
        r = rows[-1]
        print(f"{r['nodes']:>6} nodes {r['pods']:>7} pods: snapshot {r['snapshot_s']:.2f}s, plan {r['plan_s']:.3f}s, "
              f"peak {r['peak_mib']:.0f} MiB, kept between plans {r['kept_mib']:.0f} MiB (pod index "
              f"{r['index_mib']:.0f} MiB), replan after one pod event {r['replan_ms']:.0f} ms (median of {REPLANS}), "
              f"after one node event {r['node_event_ms']:.0f} ms, after time alone {r['time_ms']:.0f} ms, "
              f"{r['locks']} locks, {r['starving']} starving",
              flush=True)
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        growth = (b["plan_s"] / a["plan_s"]) / (b["nodes"] / a["nodes"])
        print(f"plan time growth per node-count growth, {a['nodes']} -> {b['nodes']}: {growth:.2f} (1.0 = linear)")
    for exact, mixed, label in ((True, False, "as run"), (False, False, "beams alone"),
                                (True, True, "as run, all nodes different")):
        quality = search_quality(exact_when_small=exact, mixed=mixed)
        print(f"guarantee search quality, {label}, on {quality['samples']} random clusters of <= 12 nodes (score / "
              f"brute-force optimum): min {quality['min']:.3f}, mean {quality['mean']:.4f}; search "
              f"{quality['search_ms']:.1f} ms, brute force {quality['brute_ms']:.1f} ms per cluster", flush=True)
    for size in sizes:
        g = _child("--guarantees", size)
        print(f"{g['nodes']:>6} nodes, {QUEUES} guaranteed queues: plan {g['with_s']:.3f}s vs {g['without_s']:.3f}s "
              f"without (placement {1000 * (g['with_s'] - g['without_s']) / QUEUES:.1f} ms per queue), "
              f"{g['queue_nodes']} nodes locked for queues", flush=True)
    for size in sizes:
        b = _child("--backfill", size)
        print(f"{b['nodes']:>6} nodes, {GATED} pods on the backfill gate fitting nowhere: plan {b['with_s']:.3f}s vs "
              f"{b['without_s']:.3f}s without ({1000 * (b['with_s'] - b['without_s']) / GATED:.1f} ms per gated pod), "
              f"{b['decided']} decided, {b['slots']} slots", flush=True)
    five = next((r for r in rows if r["nodes"] == 5000), rows[-1])
    gate = _child("--gate", five["nodes"])
    print(f"{gate['nodes']:>6} nodes, {gate['gated']} pods arriving on the backfill gate (4 shapes, 20 namespaces): "
          f"{gate['decided']} decided in {gate['plans']} gate passes, {gate['seconds']:.2f} s: "
          f"{gate['per_second']:.0f} gate decisions a second", flush=True)
    flood = _child("--flood", five["nodes"])
    print(f"{flood['nodes']:>6} nodes, a tenant's {FLOOD} starving pods of as many shapes: plan "
          f"{flood['first_s']:.2f} s, the next {flood['next_s']:.2f} s, peak {flood['peak_mib']:.0f} MiB "
          f"(tracemalloc); {flood['tenant_locks']} of {flood['locks']} locks the tenant's, {flood['others_locked']} of "
          f"the other {flood['others']} starving jobs locked for", flush=True)
    print(f"planner: {five['nodes']} nodes full plan {five['plan_s']:.2f} s, peak {five['peak_mib']:.0f} MiB, "
          f"replan after one event {five['replan_ms']:.0f} ms, {gate['per_second']:.0f} gate decisions/s", flush=True)
    mixed = []
    for size in MIXED_SIZES:
        mixed.append(_child("--mixed", size))
        m = mixed[-1]
        placement = 1000 * (m["with_s"] - m["without_s"]) / QUEUES
        print(f"{m['nodes']:>6} mixed nodes {m['pods']:>7} pods ({m['shapes']} shapes, {m['allocatables']} different "
              f"allocatables), {QUEUES} guaranteed queues: plan {m['with_s']:.3f}s vs {m['without_s']:.3f}s without "
              f"(placement {placement:.1f} ms per queue), peak {m['peak_mib']:.0f} MiB (tracemalloc), "
              f"{m['queue_nodes']} nodes locked for {m['placed']} queues", flush=True)
    m = mixed[-1]
    print(f"planner: {m['nodes']} mixed nodes, {QUEUES} guarantees: plan {m['with_s']:.2f} s, "
          f"peak {m['peak_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
