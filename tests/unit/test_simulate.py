"""`reservoir simulate` (bench/trace/simulate.py): the replay of bench-trace in one process, kube-scheduler modelled,
Reservoir's own webhook, planner and writer deciding. Hand-made traces whose outcomes are worked out in the comments,
kube-scheduler's scoring arithmetic on hand values, and determinism for a seed."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from agent.planner.model import lock_on
from bench.trace import report, simulate
from bench.trace.report import PodRecord
from bench.trace.run import arm_config as run_config
from bench.trace.trace import NodeRow, PodRow, ReplayPod, write_nodes, write_pods
from reservoir import cli
from shared import keys
from shared.keys import LockKind
from shared.views import NodeView

GIB = 1024  # MiB
REPO = Path(__file__).resolve().parents[2]


def small(name: str, arrival: float, runtime: float, *, models: tuple[str, ...] = ()) -> ReplayPod:
    return ReplayPod(name, "1 GPU", arrival, runtime, 1000, GIB, 1, 1000, models, declared=runtime)


def big(name: str, arrival: float, runtime: float) -> ReplayPod:
    return ReplayPod(name, "8 GPU", arrival, runtime, 8000, 8 * GIB, 8, 1000, (), declared=runtime)


# one node of 8 GPUs, where every GPU pod must go, and a CPU-only node beside it (so that maxLockedNodePercent 50 and
# reservedNodePercent 20 of 2 schedulable nodes leave room for one lock)
GPU_NODE = NodeRow("gpu-a", 64_000, 256 * GIB, 8, "G2")
CPU_NODE = NodeRow("cpu-b", 32_000, 128 * GIB, 0, "")
NODES = [GPU_NODE, CPU_NODE]


def stream() -> list[ReplayPod]:
    """1-GPU pods s00..s29 arriving every 2 s from t=0, each running 15 s: s_k runs over [2k, 2k + 15), so from t=14 on
    seven run at any moment and each arrival finds the one GPU s_(k-8) freed a second before; the 8-GPU pod arrives
    at t=1. Alone it waits until all 30 have ended (t = 2 x 29 + 15 = 73)."""
    return sorted([*(small(f"s{k:02d}", 2.0 * k, 15.0) for k in range(30)), big("p8", 1.0, 10.0)],
                  key=lambda p: (p.arrival, p.name))


def arms(*names: str) -> list[simulate.ArmSpec]:
    return [a for a in simulate.default_arms() if a.name in names]


def run(spec: simulate.ArmSpec, pods: Sequence[ReplayPod], nodes: Sequence[NodeRow] = NODES,
        seed: int = 0) -> report.Arm:
    return simulate.run_arm(spec, nodes, pods, seed, 300.0).arm


def record(arm: report.Arm, name: str) -> report.PodRecord:
    return next(r for r in arm.records if r.name == name)


def wait(arm: report.Arm, name: str) -> float:
    found = record(arm, name)
    assert found.bound is not None, f"{name} was never bound"
    return found.bound - found.created


def node_of(arm: str, row: NodeRow) -> str:
    return f"{arm}-{row.sn}"


def test_kube_scheduler_alone_starves_the_big_pod_and_a_starvation_lock_places_it_sooner() -> None:
    alone, starvation = (run(spec, stream()) for spec in arms("alone", "starvation"))
    # alone: some 1-GPU pod runs on the GPU node from t=0 to t=73 without a gap; the 8-GPU pod binds when the last,
    # s29 (58 + 15), ends
    assert record(alone, "p8").bound == 73.0
    # starvation (threshold 30 s): p8, created at t=1, starves from t=31; the change at t=31 (s08 ends) is planned
    # for at 31.1 and locks the GPU node for it. From then no 1-GPU pod lands there (s16, arriving at t=32, waits);
    # the seven running, s09..s15, end at 33, 35, ..., 45, and p8 binds at t=45 when s15 (30 + 15) ends (its attempt
    # after the other pods' tried first: ATTEMPT_SECONDS each)
    assert record(starvation, "p8").bound == pytest.approx(45.0, abs=0.01)
    assert wait(starvation, "p8") == pytest.approx(44.0, abs=0.01)
    assert wait(alone, "p8") == 72.0
    [lock] = [span for span in starvation.locks if span.owner_class == "8 GPU"]
    assert lock.node == node_of("starvation", GPU_NODE)
    assert 31.0 < lock.since <= 31.1 + 1e-9
    assert alone.locks == []


def test_a_locked_node_takes_only_its_owners_pods() -> None:
    starvation = run(arms("starvation")[0], stream())
    [lock] = starvation.locks
    until = lock.until if lock.until is not None else float("inf")
    on_it = [r.name for r in starvation.records
             if r.node == lock.node and r.bound is not None and lock.since <= r.bound < until]
    assert on_it == ["p8"]
    # s16 arrived at t=32 with a GPU free on the locked node, and waited. p8 (45 + 10) frees the eight GPUs at 55,
    # and kube-scheduler tries the waiting pods that failed fewest times first (its backoff queue): s19..s26, which
    # came later; s16, s17 and s18, which failed most, bind at 70 when the first of those end (after the loop's
    # attempts and status PATCHes of the pods tried before it: hundredths of a second)
    assert sorted(r.name for r in starvation.records if r.bound is not None and 55 <= r.bound < 56) == [
        f"s{k}" for k in range(19, 27)]
    assert record(starvation, "s16").bound == pytest.approx(70.0, abs=0.05)


def test_the_lock_on_the_node_is_the_one_the_writer_writes() -> None:
    # the story cut at its last arrival + 5 s (s16 at t=32): the run ends at t=37, the GPU node locked since 31.1
    run_ = simulate.ArmRun(arms("starvation")[0], NODES, stream()[:18], seed=0, tail=5.0)
    arm = run_.run()
    assert arm.seconds == 37.0
    view = NodeView.from_obj(run_.node_objs[node_of("starvation", GPU_NODE)])
    lock = lock_on(view)
    assert lock is not None and lock.owner.startswith("job-trace-starvation-Pod-p8-") and lock.kind is LockKind.JOB
    assert [(t.key, t.value, t.effect) for t in view.taints] == [(keys.LOCK, lock.owner, keys.LOCK_EFFECT)]
    assert view.labels[keys.LOCK] == lock.owner and view.labels[keys.LOCK_KIND] == "job"
    assert lock.tasks == ("trace-starvation/p8",) and lock.unreadable == ""
    assert lock_on(NodeView.from_obj(run_.node_objs[node_of("starvation", CPU_NODE)])) is None


def test_a_pod_naming_a_gpu_model_lands_only_on_that_models_nodes() -> None:
    # three 1-GPU pods naming T4 at t=0, running 10 s, on an empty G2 node of 8 GPUs and a T4 node of 2: two bind on
    # the T4 node at once, the third waits for one of them (t=10) though the G2 node stays empty; a pod naming no model
    # goes anywhere (the G2 node scores higher: LeastAllocated on its 96 cores)
    t4 = NodeRow("t4", 16_000, 64 * GIB, 2, "T4")
    g2 = NodeRow("g2", 96_000, 384 * GIB, 8, "G2")
    pods = [small("a", 0.0, 10.0, models=("T4",)), small("b", 0.0, 10.0, models=("T4",)),
            small("c", 0.0, 10.0, models=("T4",)), small("d", 0.5, 10.0)]
    for spec in arms("alone", "starvation"):
        arm = run(spec, pods, [t4, g2])
        assert {r.name: r.node for r in arm.records if r.models} == {n: node_of(spec.name, t4) for n in "abc"}
        assert sorted(wait(arm, n) for n in "abc") == pytest.approx([0.0, 0.0, 10.0], abs=0.01)
        assert record(arm, "d").node == node_of(spec.name, g2)


def test_backfill_uses_the_locked_nodes_room_and_the_owner_binds_as_without_it() -> None:
    # the starvation story, and a 1-GPU pod declaring 3 s arriving at t=33 while the GPU node is locked for p8 (from
    # 31.1) with 2 GPUs idle (s08 and s09 ended). The lock's node is needed at 45 (s15's start 30 + its 15 s), its
    # room noted until 45 - margin 5 = 40: 33 + 3 s ends by then, so the webhook holds the pod on the gate and the gate
    # pass (33.1) lets it onto the node with activeDeadlineSeconds 3; it ends at 36.1, and p8 binds at 45 as without
    pods = sorted([*stream(), small("short", 33.0, 3.0)], key=lambda p: (p.arrival, p.name))
    backfill = run(arms("backfill")[0], pods)
    short = record(backfill, "short")
    assert short.backfilled and short.node == node_of("backfill", GPU_NODE)
    assert short.bound == pytest.approx(33.1)
    assert record(backfill, "p8").bound == pytest.approx(45.0, abs=0.01)
    assert backfill.owner_delays == [0.0]
    # the other pods were let in ungated (none would end before the room's end) or let go: none backfilled
    assert [r.name for r in backfill.records if r.backfilled] == ["short"]


def test_a_run_is_the_same_for_the_same_seed() -> None:
    """The same seed, the same run: in this process, and with each arm in a process of its own, two at a time
    (simulate's `jobs`)."""
    replay = simulate.replayed(window=20.0, seed=3)
    first, second = (simulate.simulate(arms("alone", "starvation", "backfill"), replay.nodes, replay.pods, seed=3,
                                       jobs=jobs) for jobs in (1, 2))
    assert [o.arm.records for o in first] == [o.arm.records for o in second]
    assert [o.arm.samples for o in first] == [o.arm.samples for o in second]
    assert [o.arm.locks for o in first] == [o.arm.locks for o in second]
    assert [o.line for o in first] == [o.line for o in second]
    assert all(r.bound is not None for o in first for r in o.arm.records)


def test_each_attempt_takes_the_time_given_and_the_spread_runs_at_each_of_its_times() -> None:
    """Three pods created together on an empty node: kube-scheduler tries one at a time, so the k-th binds k attempts
    after its creation, at whatever attempt time the run is given; timing_spread runs the arms once per factor of
    TIMING_SPREAD on the default Timing, in that order."""
    pods = [small(f"s{k}", 0.0, 5.0) for k in range(3)]
    for attempt in (0.001, 0.01):
        arm = simulate.run_arm(arms("alone")[0], NODES, pods, 0, 300.0, timing=simulate.Timing(attempt)).arm
        assert [wait(arm, f"s{k}") for k in range(3)] == pytest.approx([0.0, attempt, 2 * attempt])
    spread = simulate.timing_spread(arms("alone", "starvation"), NODES, pods)
    assert [[a.name for a in run] for run in spread] == [["alone", "starvation"]] * len(simulate.TIMING_SPREAD)
    assert [wait(run[0], "s2") for run in spread] == pytest.approx(
        [2 * simulate.ATTEMPT_SECONDS * factor for factor in simulate.TIMING_SPREAD])
    assert 1.0 not in simulate.TIMING_SPREAD  # the model's own run is the first column, not repeated


def test_kube_schedulers_scores_and_search_on_hand_values() -> None:
    # kube-scheduler 1.35: BalancedAllocation is the balance with the pod, int((1 - std) * 100)
    # an empty 96-core, 384 GiB node taking a pod of 12 cores and 48 GiB: LeastAllocated (87 + 87) / 2 = 87;
    # fractions 0.125 and 0.125, BalancedAllocation 100
    assert simulate.node_score(12_000, 96_000, 48 * GIB, 384 * GIB, pod_cpu=12_000, pod_memory=48 * GIB,
                               minor=35) == 87 + 100
    # 48 of 64 cores and 64 of 256 GiB requested: LeastAllocated (25 + 75) / 2 = 50; std |0.75 - 0.25| / 2 = 0.25,
    # BalancedAllocation 75
    assert simulate.node_score(48_000, 64_000, 64 * GIB, 256 * GIB, pod_cpu=16_000, minor=35) == 50 + 75
    # a node with no memory reported: LeastAllocated 0 for memory, BalancedAllocation over cpu alone (std 0)
    assert simulate.node_score(32_000, 64_000, 1, 0, minor=35) == 25 + 100
    # 1.36 (kubernetes#135573): the change the pod makes to the balance, 50 + (50 + with - without) / 2
    # the empty node: 100 with the pod and 100 without, 75
    assert simulate.node_score(12_000, 96_000, 48 * GIB, 384 * GIB, pod_cpu=12_000, pod_memory=48 * GIB) == 87 + 75
    # 16 cores onto 32 of 64 cores and 64 of 256 GiB: 75 with it, int(87.5) = 87 without, 50 + 38 / 2 = 69
    assert simulate.node_score(48_000, 64_000, 64 * GIB, 256 * GIB, pod_cpu=16_000) == 50 + 69
    # 128 GiB onto 48 of 64 cores and 64 GiB: the node balanced by it, 100 with and 75 without, 50 + 75 / 2 = 87
    assert simulate.node_score(48_000, 64_000, 192 * GIB, 256 * GIB, pod_memory=128 * GIB) == (25 + 25) // 2 + 87
    assert simulate.node_score(32_000, 64_000, 1, 0, pod_cpu=1_000) == 25 + 75
    # percentageOfNodesToScore, adaptive: every node under 100; else 50 - nodes/125 percent (at least 5), at least 100
    assert [simulate.feasible_nodes_to_find(n) for n in (50, 152, 1000, 5000, 10_000)] == [50, 100, 420, 500, 500]


def test_the_scheduler_scores_as_the_kubernetes_version_it_is_given() -> None:
    """A pod of 8 cores and 8 GiB, two 64-core, 256 GiB nodes: a holds 16 cores and 32 GiB, b 96 GiB and no core.
    LeastAllocated is 73 on both; 1.35's BalancedAllocation (the balance with the pod: a 89, b 85) chooses a, 1.36's
    (the change the pod makes: a 50 + (50 + 89 - 93) / 2 = 73, b 50 + (50 + 85 - 81) / 2 = 77) chooses b."""
    def view(name: str) -> NodeView:
        return NodeView.from_obj({"metadata": {"name": name},
                                  "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}})

    def pod(name: str, cpu: str, memory: str) -> dict[str, object]:
        return {"metadata": {"name": name}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}

    chosen = {}
    for minor in (35, 36):
        scheduler = simulate.Scheduler([view("a"), view("b")], random.Random(0), minor)
        a, b = scheduler.nodes
        scheduler.take(a, scheduler.queued(pod("on-a", "16", "32Gi"), 0.0))
        scheduler.take(b, scheduler.queued(pod("on-b", "0", "96Gi"), 0.0))
        node = scheduler.attempt(scheduler.queued(pod("new", "8", "8Gi"), 0.0))
        assert node is not None
        chosen[minor] = node.name
    assert chosen == {35: "a", 36: "b"}


def test_the_queue_tries_newcomers_then_the_pods_that_failed_fewest_times_until_their_backoff_ends() -> None:
    """kube-scheduler's queue: a pod that failed waits out its backoff (1 s doubling to 10 s, aligned to 1-s windows)
    in the backoff queue, from which the scheduler pops by backoff expiry when its active queue is empty; a pod never
    tried, or one whose backoff has ended, is in the active queue, by priority then its last attempt. One node takes
    one 40-cpu pod at a time: `old` fails at 0, 1, 2 and 3 s (backoff 8 s: until 11), `new` at 3.5 s (until 4)."""
    def setup() -> tuple[simulate.Scheduler, simulate.SchedNode, list[str]]:
        node_view = NodeView.from_obj({"metadata": {"name": "n"},
                                       "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}})
        scheduler = simulate.Scheduler([node_view], random.Random(0))
        (node,) = scheduler.nodes
        resident = scheduler.queued(body("resident"), 0.0)
        scheduler.take(node, resident)
        bound: list[str] = []
        old = scheduler.queued(body("old"), 0.0)
        scheduler.enqueue(old, 0.0)
        for t in (0.0, 1.0, 2.0, 3.0):
            scheduler.wake(t, [node], True)
            assert scheduler.step(t, lambda p, n: bound.append(p.name), lambda p: None)
        scheduler.enqueue(scheduler.queued(body("new"), 3.5), 3.5)
        assert scheduler.step(3.5, lambda p, n: bound.append(p.name), lambda p: None)
        assert (old.failures, old.expiry, bound) == (4, 11.0, [])
        scheduler.give_back(node, resident)
        return scheduler, node, bound

    def body(name: str) -> dict[str, object]:
        return {"metadata": {"name": name}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": "40", "memory": "1Gi"}}}]}}

    def first_bound(scheduler: simulate.Scheduler, node: simulate.SchedNode, bound: list[str], now: float) -> str:
        scheduler.wake(now, [node], True)
        while not bound and scheduler.step(now, lambda p, n: bound.append(p.name), lambda p: None):
            pass
        return bound[0]

    # at 4.2 s both are backing off: the one that failed fewer times first
    assert first_bound(*setup(), 4.2) == "new"
    # at 12 s both backoffs have ended: the active queue's order, the older last attempt first
    assert first_bound(*setup(), 12.0) == "old"
    # a pod created meanwhile, never tried, goes before both
    scheduler, node, bound = setup()
    scheduler.enqueue(scheduler.queued(body("newest"), 4.1), 4.1)
    assert first_bound(scheduler, node, bound, 4.2) == "newest"


def test_a_failed_pods_reasons_count_each_nodes_first_failing_filter() -> None:
    """The message kube-scheduler writes for a failed pod counts, over every node, the reasons of the first filter
    that fails it there (NodeUnschedulable, TaintToleration, NodeAffinity, then every resource NodeResourcesFit finds
    short): a pod of 8 cpu and 1 GPU selecting pool a, on a cordoned node, a locked one of pool a, one of pool b, a
    locked one of pool b, one of pool a with 4 cpu free, one of pool a without GPUs and one of pool a short of both."""
    def node(name: str, pool: str, cpu: int, gpus: int, *, locked: bool = False,
             cordoned: bool = False) -> NodeView:
        taints = [{"key": keys.LOCK, "value": "job:x", "effect": "NoSchedule"}] if locked else []
        return NodeView.from_obj({"metadata": {"name": name, "labels": {"pool": pool}},
                                  "spec": {"taints": taints, "unschedulable": cordoned},
                                  "status": {"allocatable": {"cpu": str(cpu), "memory": "64Gi",
                                                             keys.GPU_RESOURCE: str(gpus), "pods": "110"}}})
    views = [node("cordoned", "a", 64, 8, cordoned=True), node("locked", "a", 64, 8, locked=True),
             node("other", "b", 64, 8), node("other-locked", "b", 64, 8, locked=True), node("busy", "a", 64, 8),
             node("cpu-only", "a", 64, 0), node("both", "a", 64, 8)]
    scheduler = simulate.Scheduler(views, random.Random(0))
    pod = scheduler.queued({"metadata": {"name": "p"}, "spec": {"nodeSelector": {"pool": "a"}, "containers": [
        {"name": "c", "resources": {"requests": {"cpu": "8", keys.GPU_RESOURCE: "1"}}}]}}, 0.0)
    for name, cpu, gpus in (("busy", "60", "0"), ("both", "60", "8")):
        filler = scheduler.queued({"metadata": {"name": f"on-{name}"}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, keys.GPU_RESOURCE: gpus}}}]}}, 0.0)
        scheduler.take(scheduler.by_name[name], filler)
    assert scheduler.attempt(pod) is None
    # cordoned, untolerated taint, not selected; then short of cpu, memory, GPUs, room for a pod
    assert scheduler.reasons(pod) == (1, 2, 1, 2, 0, 2, 0)
    # the lock lifted from the pool-a node: it fits there now (the filters asked again after a node's object
    # changed); once a 60-cpu pod takes it, one node fewer has a taint the pod does not tolerate, one more too
    # little cpu
    scheduler.set_view("locked", node("locked", "a", 64, 8))
    assert scheduler.attempt(pod) is scheduler.by_name["locked"]
    scheduler.take(scheduler.by_name["locked"], scheduler.queued({"metadata": {"name": "on-locked"}, "spec": {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "60"}}}]}}, 0.0))
    assert scheduler.reasons(pod) == (1, 1, 1, 3, 0, 2, 0)


def test_the_loop_patches_a_failed_pods_condition_when_its_message_changes_and_waits_for_it() -> None:
    """handleSchedulingFailure PATCHes the pod's PodScheduled condition from the scheduling loop when its message
    changed: the first failure always, a later one only when some count of reasons changed; the loop's next attempt
    waits for it. Two nodes of 64 cpu each hold a 40-cpu pod; a third 40-cpu pod fails on both ("2 Insufficient
    cpu")."""
    def view(name: str, *, cordoned: bool = False) -> NodeView:
        return NodeView.from_obj({"metadata": {"name": name}, "spec": {"unschedulable": cordoned},
                                  "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}})

    def body(name: str, cpu: str = "40") -> dict[str, object]:
        return {"metadata": {"name": name}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}

    timing = simulate.Timing(attempt=0.001, patch=0.01)
    scheduler = simulate.Scheduler([view("a"), view("b")], random.Random(0), timing=timing)
    residents = {}
    for node in scheduler.nodes:
        residents[node.name] = scheduler.queued(body(f"on-{node.name}"), 0.0)
        scheduler.take(node, residents[node.name])
    pod = scheduler.queued(body("p"), 0.0)
    scheduler.enqueue(pod, 0.0)

    def fail_at(now: float) -> float:
        scheduler.wake(now, scheduler.nodes, True)
        assert scheduler.step(now, lambda p, n: pytest.fail("bound"), lambda p: None)
        return scheduler.clock - now

    assert fail_at(0.0) == pytest.approx(0.011)  # the first failure: the condition is new
    assert scheduler.patches == 1
    assert fail_at(1.0) == pytest.approx(0.001)  # "2 Insufficient cpu" again: no PATCH
    # node b's pod gives way to a 30-cpu one: still too little cpu on both, the same message
    scheduler.give_back(scheduler.by_name["b"], residents["b"])
    scheduler.take(scheduler.by_name["b"], scheduler.queued(body("smaller", "30"), 2.0))
    assert fail_at(3.0) == pytest.approx(0.001)
    # node b cordoned: "1 Insufficient cpu, 1 node(s) were unschedulable", a PATCH
    scheduler.set_view("b", view("b", cordoned=True))
    assert fail_at(5.0) == pytest.approx(0.011)
    assert scheduler.patches == 2
    # not modelled: the loop goes straight on
    scheduler.timing = simulate.Timing(attempt=0.001, patch=None)
    scheduler.set_view("b", view("b"))
    assert (fail_at(9.0), scheduler.patches) == (pytest.approx(0.001), 2)


def test_the_clients_rate_limit_lets_a_burst_through_then_a_request_every_fiftieth_of_a_second() -> None:
    bucket = simulate.TokenBucket(simulate.CLIENT_QPS, simulate.CLIENT_BURST)
    assert [bucket.wait(0.0) for _ in range(100)] == [0.0] * 100
    assert [bucket.wait(0.0) for _ in range(2)] == pytest.approx([0.02, 0.04])
    # a second later 50 tokens have come back, of which the two borrowed above are owed
    assert [bucket.wait(1.0) for _ in range(48)] == [0.0] * 48
    assert bucket.wait(1.0) == pytest.approx(0.02)


def test_the_kube_scheduler_modelled_is_the_one_bench_trace_runs() -> None:
    versions = dict(line.split("=", 1) for line in (REPO / "localcluster" / "versions.env").read_text().splitlines()
                    if line and not line.startswith("#"))
    assert versions["KUBERNETES_VERSION"].startswith(f"v1.{simulate.KUBERNETES_MINOR}.")


def test_placement_agreement_counts_the_binds_whose_node_the_model_scores_highest() -> None:
    """Two empty nodes, one twice the other: LeastAllocated sends the first pod to the large one, alone on top. A run
    that put it on the small one disagrees; the second pod, on the large one, ties with the small one (each a quarter
    allocated then): it agrees, not alone."""
    nodes = {"big": NodeRow("big", 64_000, 256 * 1024, 8, "G2"), "small": NodeRow("small", 32_000, 128 * 1024, 8, "G2")}
    pods = {name: ReplayPod(name, "1 GPU", 0.0, 10.0, 8_000, 32 * 1024, 1, 1000, (), 10.0) for name in ("a", "b")}

    def record(name: str, node: str, bound: float) -> PodRecord:
        return PodRecord(name, "1 GPU", 1, bound, bound, bound + 10, node, False)
    assert simulate.placement_agreement([record("a", "big", 1.0), record("b", "big", 2.0)], pods, nodes) == {
        "1 GPU": simulate.Agreement(top=2, alone=1, binds=2)}
    assert simulate.placement_agreement([record("a", "small", 1.0), record("b", "big", 2.0)], pods, nodes) == {
        "1 GPU": simulate.Agreement(top=1, alone=1, binds=2)}
    # a pod naming a model no node has is placed nowhere in the model: its bind counts as not agreeing
    pods["b"] = ReplayPod("b", "1 GPU", 0.0, 10.0, 8_000, 32 * 1024, 1, 1000, ("T4",), 10.0)
    assert simulate.placement_agreement([record("a", "big", 1.0), record("b", "big", 2.0)], pods, nodes) == {
        "1 GPU": simulate.Agreement(top=1, alone=1, binds=2)}


def test_placement_agreement_leaves_out_binds_kube_schedulers_search_cuts_short() -> None:
    """On 150 nodes kube-scheduler scores the first 100 that fit: a pod fitting 150 may rightly land below the top, a
    pod fitting 100 may not."""
    nodes = {f"n{i:03}": NodeRow(f"n{i:03}", 32_000, 128 * 1024, 8 if i < 100 else 0, "G2") for i in range(150)}
    pods = {"cpu": ReplayPod("cpu", "CPU only", 0.0, 10.0, 1_000, 1024, 0, 0, (), 10.0),
            "gpu": ReplayPod("gpu", "1 GPU", 0.0, 10.0, 1_000, 1024, 1, 1000, (), 10.0)}
    records = [PodRecord("cpu", "CPU only", 0, 1.0, 1.0, 5.0, "n120", False),
               PodRecord("gpu", "1 GPU", 1, 2.0, 2.0, 6.0, "n050", False)]
    assert simulate.feasible_nodes_to_find(150) == 100
    assert simulate.placement_agreement(records, pods, nodes) == {"1 GPU": simulate.Agreement(1, 0, 1)}


def test_the_cadence_constants_are_the_agents() -> None:
    from agent import controller, writer

    assert (simulate.SETTLE, simulate.GATE_GAP) == (controller.SETTLE, controller.GATE_GAP)
    assert simulate.MAX_ESTIMATE_WRITES == writer.MAX_ESTIMATE_WRITES


def test_a_request_the_model_does_not_count_is_refused_by_name() -> None:
    scheduler = simulate.Scheduler([], random.Random(0))
    pod = {"metadata": {"name": "odd"}, "spec": {"containers": [{"name": "c", "resources": {
        "requests": {"cpu": "1", "example.com/fpga": "1"}, "limits": {"example.com/fpga": "1"}}}]}}
    with pytest.raises(simulate.SimulationError, match=r"pod odd: requests example\.com/fpga"):
        scheduler.queued(pod, 0.0)


def test_the_command_runs_a_trace_and_a_config_and_names_a_bad_one(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    write_nodes(tmp_path / "nodes.csv", NODES)
    # pods.csv in the trace's own format: the 8-GPU pod's story shortened (created at 0..20 s, 15 s runs), replayed
    # at the trace's own pace (--arrival-seconds 20 over a 20 s span, runtimes as written)
    rows = [PodRow(f"s{k}", 1000, GIB, 1, 1000, "", "LS", "Succeeded", 2.0 * k, 2.0 * k + 15, 2.0 * k)
            for k in range(11)] + [PodRow("p8", 8000, 8 * GIB, 8, 1000, "", "LS", "Succeeded", 1.0, 40.0, 30.0)]
    write_pods(tmp_path / "pods.csv", rows)
    (tmp_path / "locks.yaml").write_text(run_config("starvation", "trace-locks"))
    (tmp_path / "bad.yaml").write_text("starvation: {starvingJobTimeThreshold: soon}\n")
    common = ["simulate", "--pods", str(tmp_path / "pods.csv"), "--nodes", str(tmp_path / "nodes.csv"),
              "--fraction", "1", "--arrival-seconds", "20", "--window", "0", "--runtime-factor", "1", "-q", "-j", "1"]
    assert cli.main([*common, "--config", str(tmp_path / "bad.yaml")]) == 1
    assert "bad.yaml: invalid: starvation.starvingJobTimeThreshold" in capsys.readouterr().err
    assert cli.main([*common, "--tail", "-1"]) == 1
    assert "--tail -1.0: expected seconds >= 0" in capsys.readouterr().err
    assert cli.main([*common, "--kubernetes", "1.x"]) == 2
    assert "--kubernetes '1.x': expected a version such as 1.35" in capsys.readouterr().err
    assert cli.main([*common, "--kubernetes", "v1.35.2"]) == 0
    capsys.readouterr()
    assert cli.main([*common, "--config", str(tmp_path / "locks.yaml"), "-o", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [a["name"] for a in body["arms"]] == ["alone", "locks"]
    assert all(a["summary"]["unplaced"] == 0 for a in body["arms"])


def test_a_prefer_no_schedule_taint_sends_a_pod_elsewhere_unless_nothing_else_fits_or_it_tolerates_it() -> None:
    """TaintToleration's score (weight 3, the untainted node 100, the tainted 0) outweighs LeastAllocated and
    BalancedAllocation (at most 100 each): a pod goes to the emptier tainted node only when it tolerates the taint
    or nothing else fits. The soft-drain taint (keys.DRAIN) relies on it."""
    def view(name: str, taints: list[dict[str, str]]) -> NodeView:
        return NodeView.from_obj({"metadata": {"name": name}, "spec": {"taints": taints},
                                  "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}})

    def pod(name: str, cpu: str, tolerations: list[dict[str, str]] | None = None) -> dict[str, object]:
        return {"metadata": {"name": name}, "spec": {"tolerations": tolerations or [], "containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}

    drain = {"key": keys.DRAIN, "value": "job", "effect": "PreferNoSchedule"}
    scheduler = simulate.Scheduler([view("busy", []), view("empty", [drain])], random.Random(0))
    busy, empty = scheduler.nodes
    scheduler.take(busy, scheduler.queued(pod("resident", "40"), 0.0))
    assert scheduler.attempt(scheduler.queued(pod("a", "8"), 0.0)) is busy
    tolerant = scheduler.queued(pod("b", "8", [{"key": keys.DRAIN, "operator": "Exists"}]), 0.0)
    assert scheduler.attempt(tolerant) is empty
    assert scheduler.attempt(scheduler.queued(pod("c", "30"), 0.0)) is empty, "24 cpu left on busy: only empty fits"


def test_bench_seeds_runs_bench_traces_arms_and_the_backfill_arm_without_the_soft_drain() -> None:
    from bench.trace import seeds

    specs = {spec.name: spec for spec in seeds.arms()}
    assert list(specs) == ["alone", "starvation", "backfill", "nosoft"]
    backfill, nosoft = specs["backfill"].config, specs["nosoft"].config
    assert backfill is not None and nosoft is not None
    assert backfill.starvation.soft_drain and not nosoft.starvation.soft_drain
    assert nosoft.model_dump(exclude={"starvation", "backfill"}) == backfill.model_dump(exclude={"starvation",
                                                                                                "backfill"})
    assert nosoft.starvation.model_dump(exclude={"soft_drain"}) == backfill.starvation.model_dump(
        exclude={"soft_drain"})
    assert nosoft.backfill.namespaces == ["trace-nosoft"]


def walked(scheduler: simulate.Scheduler, pod: simulate.Queued) -> tuple[str | None, int]:
    """kube-scheduler's cycle as a walk over the nodes one by one (the model before its arrays): from the start
    index until `to_find` nodes pass the filters, then the best of them by the same scores and the same draws; the
    node chosen and the next start."""
    nodes, count, start = scheduler.nodes, len(scheduler.nodes), scheduler.start
    feasible = []
    looked = 0
    for node in nodes[start:] + nodes[:start]:
        looked += 1
        if scheduler.fits(pod, node):
            feasible.append(node)
            if len(feasible) >= scheduler.to_find:
                break
    best, best_score, tied = None, -1, 0
    most = max((len(n.prefer) for n in feasible), default=0)  # the pods below tolerate no PreferNoSchedule taint
    for node in feasible:
        total = int(simulate.node_score(node.cpu - node.free_cpu + pod.cpu, node.cpu,
                                        node.memory - node.free_memory + pod.memory, node.memory,
                                        pod_cpu=pod.cpu, pod_memory=pod.memory))
        if most:
            total += simulate.TAINT_TOLERATION_WEIGHT * (100 - len(node.prefer) * 100 // most)
        if total > best_score:
            best, best_score, tied = node, total, 1
        elif total == best_score:
            tied += 1
            if scheduler.rng.randrange(tied) == 0:
                best = node
    scheduler.start = (start + looked) % count
    return (best.name if best is not None else None), scheduler.start


def test_the_search_over_every_node_at_once_is_the_walk_node_by_node() -> None:
    """The arrays (Scheduler.attempt, score) choose the node, and move the start index, as a walk over the nodes in
    order does, with the same random draws: on 120 nodes of mixed shapes, some locked (a taint only the lock's owner
    tolerates), some soft-drained (PreferNoSchedule), some cordoned, some labelled for a nodeSelector, pods of random
    sizes bound one after another."""
    rng = random.Random(7)
    views = []
    for i in range(120):
        taints = []
        if i % 7 == 0:
            taints.append({"key": keys.LOCK, "value": "job:a", "effect": "NoSchedule"})
        if i % 5 == 0:
            taints.append({"key": "soft", "value": "x", "effect": "PreferNoSchedule"})
        views.append(NodeView.from_obj({
            "metadata": {"name": f"n{i:03}", "labels": {"pool": "a" if i % 3 else "b"}},
            "spec": {"taints": taints, "unschedulable": i % 23 == 0},
            "status": {"allocatable": {"cpu": str(rng.choice([8, 16, 64])), "memory": f"{rng.choice([32, 256])}Gi",
                                       keys.GPU_RESOURCE: str(rng.choice([0, 4, 8])), "pods": "110"}}}))
    twins = [simulate.Scheduler(views, random.Random(3)) for _ in range(2)]
    for k in range(400):
        spec: dict[str, object] = {"containers": [{"name": "c", "resources": {"requests": {
            "cpu": f"{rng.randint(1, 6000)}m", "memory": f"{rng.randint(1, 20)}Gi",
            keys.GPU_RESOURCE: str(rng.choice([0, 0, 1, 2, 8]))}}}]}
        if k % 4 == 0:
            spec["nodeSelector"] = {"pool": "b"}
        if k % 6 == 0:
            spec["tolerations"] = [{"key": keys.LOCK, "operator": "Equal", "value": "job:a", "effect": "NoSchedule"}]
        body = {"metadata": {"name": f"p{k}"}, "spec": spec}
        arrays, walk = twins
        pod = arrays.queued(body, 0.0)
        want, start = walked(walk, walk.queued(body, 0.0))
        got = arrays.attempt(pod)
        assert (got.name if got is not None else None, arrays.start) == (want, start), k
        if got is not None:
            for twin in twins:
                twin.take(twin.by_name[got.name], pod)


def test_preferred_node_affinity_is_asked_of_the_nodes_labelled_with_a_key_it_reads(monkeypatch) -> None:
    """NodeAffinity's raw score (the weights of the preferred terms a node matches, summed), asked only of the nodes
    labelled with a key the terms read (Scheduler.labelled), is what the terms say of every node, follows a node's
    labels when its object changes, and is the same past MAX_LABEL_KEYS (asked of every node); a term that matches
    a node without the keys (NotIn) is asked of every node (the model once scored such nodes 0)."""
    def view(name: str, labels: dict[str, str]) -> NodeView:
        return NodeView.from_obj({"metadata": {"name": name, "labels": labels},
                                  "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}})

    def body(name: str, disk: str = "In") -> dict:
        terms = [{"weight": 30, "preference": {"matchExpressions": [
                     {"key": "zone", "operator": "In", "values": ["a"]}]}},
                 {"weight": 5, "preference": {"matchExpressions": [
                     {"key": "disk", "operator": disk, "values": ["ssd" if disk == "In" else "hdd"]}]}}]
        return {"metadata": {"name": name}, "spec": {"affinity": {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": terms}}, "containers": [{"name": "c"}]}}
    views = [view("n0", {"zone": "a", "disk": "ssd"}), view("n1", {"zone": "a", "disk": "hdd"}),
             view("n2", {"zone": "b", "disk": "ssd"}), view("n3", {"other": "x"})]
    every = np.arange(4)

    def by_walk(scheduler: simulate.Scheduler, pod: simulate.Queued) -> list[int]:
        return [sum(w for w, term in pod.preferred if term.matches(node.view)) for node in scheduler.nodes]
    scheduler = simulate.Scheduler(views, random.Random(0))
    pod = scheduler.queued(body("p"), 0.0)
    assert scheduler.preference(pod, every).tolist() == by_walk(scheduler, pod) == [35, 30, 5, 0]
    assert scheduler.preference(pod, np.array([2, 0])).tolist() == [5, 35]
    not_in = scheduler.queued(body("q", "NotIn"), 0.0)
    assert not_in.prefers_unlabelled and not pod.prefers_unlabelled
    assert scheduler.preference(not_in, every).tolist() == by_walk(scheduler, not_in) == [35, 30, 5, 5]
    scheduler.set_view("n3", view("n3", {"zone": "a"}))
    assert scheduler.preference(pod, every).tolist() == by_walk(scheduler, pod) == [35, 30, 5, 30]
    assert sorted(scheduler.labelled) == ["disk", "zone"]
    assert scheduler.preference(not_in, every).tolist() == by_walk(scheduler, not_in) == [35, 30, 5, 35]
    monkeypatch.setattr(simulate, "MAX_LABEL_KEYS", 0)
    fresh = simulate.Scheduler(views, random.Random(0))
    assert fresh.preference(fresh.queued(body("r"), 0.0), every).tolist() == [35, 30, 5, 0]
    assert not fresh.labelled
