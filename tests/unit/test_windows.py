"""Seed 004, node resource reservation windows (agent/planner/windows.py), checked with the seed's own numbers: a
window `0 3 - 4 * * *` reserving 32 cpu and 64Gi on the `business_type: ebook` nodes, from 2h ahead, until 10 reserve
tasks are scheduled; ten reserve pods arriving over the hour (issue 11, seed 004)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from agent.planner.model import Lock, Plan
from agent.planner.plan import plan
from agent.planner.podindex import PodIndex
from agent.planner.reserve import is_reserve_pod, maximum_runtime, with_group_runtimes
from agent.planner.windows import window_bounds
from shared import keys
from shared.config import ReservoirConfig, load_config
from shared.ownership import window_owner_id
from shared.timestamps import stamp
from shared.tolerations import lock_toleration
from shared.views import NodeView, PodGroupView, PodView
from tests.builders import SEED_004_CONFIG, node, pod, snap


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, 22, hour, minute, tzinfo=UTC)


# --- the window tests that were in test_planner.py ---

WINDOW = load_config("""
maxLockedNodePercent: 90
starvation: {enabled: false}
windows:
- name: ebook
  nodeSelector: {business: ebook}
  resources: {cpu: "8"}
  cron: "0 3 - 4 * * *"
  startReserveAgo: 2h
  podNumToReserve: 2
""")


def test_window_bounds_with_start_reserve_ago() -> None:
    window = WINDOW.windows[0]
    assert window_bounds(window, at(0, 59)) == (at(3), at(4), False)
    assert window_bounds(window, at(1)) == (at(3), at(4), True)
    assert window_bounds(window, at(3, 59)) == (at(3), at(4), True)
    start, end, active = window_bounds(window, at(4))
    assert not active and start == at(3) + timedelta(days=1)


def test_window_locks_nodes_by_future_idle_until_resources_are_covered() -> None:
    labels = {"business": "ebook"}
    nodes = [node("e1", labels=labels), node("e2", labels=labels), node("e3", labels=labels), node("other")]
    pods = [pod("long", "3", node_name="e1", base=at(1)),  # runs forever
            pod("short", "3", node_name="e2", runtime="1h", started_ago=timedelta(0), base=at(1))]  # gone at 02:00
    result = plan(snap(nodes, pods), WINDOW, at(1, 30))
    assert set(result.locks) == {"e2", "e3"}, "4 + 4 cpu covers 8: the two nodes idle at 03:00"
    assert {lock.owner for lock in result.locks.values()} == {window_owner_id("ebook")}
    assert plan(snap(nodes, pods), WINDOW, at(0, 30)).locks == {}
    assert plan(snap(nodes, pods), WINDOW, at(4, 0)).locks == {}


def test_window_releases_after_pod_num_to_reserve_reserve_pods() -> None:
    labels = {"business": "ebook"}
    nodes = [node("e1", labels=labels), node("e2", labels=labels)]
    first = plan(snap(nodes, [], spare=1), WINDOW, at(3, 10))
    held = [node(n.name, labels=labels, lock=first.locks.get(n.name)) for n in nodes]
    one = [pod("r1", "1", node_name="e1", reserveable=True, started_ago=timedelta(minutes=5), base=at(3, 10)),
           pod("r2", "1", reserveable=True, base=at(3, 10))]
    assert len(plan(snap(held, one, spare=1), WINDOW, at(3, 10)).locks) == 2
    two = [pod("r1", "1", node_name="e1", reserveable=True, started_ago=timedelta(minutes=5), base=at(3, 10)),
           pod("r2", "1", node_name="e2", reserveable=True, started_ago=timedelta(minutes=1), base=at(3, 10)),
           pod("r3", "1", reserveable=True, base=at(3, 10))]
    result = plan(snap(held, two, spare=1), WINDOW, at(3, 10))
    assert result.locks == {} and "podNumToReserve 2" in result.windows[0].reason
    assert result.notes == ["policy=window window=ebook decision=release reason=2 reserve pods scheduled on its nodes "
                            "(podNumToReserve 2)"]
    after = plan(snap(nodes, two, spare=1), WINDOW, at(3, 11))
    assert after.locks == {} and after.notes == [], "released stays released; nothing held, nothing logged"


# --- seed 004's own configuration and story ---

EBOOK = {"business_type": "ebook"}
OWNER = window_owner_id("ebook")
EBOOK_NODES = [f"e{i}" for i in range(1, 9)]  # 8 cpu and 16Gi each: four of them are the seed's 32 cpu and 64Gi
OTHER_NODES = ["v1", "v2"]  # another business's nodes


def cluster(locks: Mapping[str, Lock] | None = None) -> list[NodeView]:
    held = locks or {}
    return ([node(n, cpu="8", labels=EBOOK, lock=held.get(n)) for n in EBOOK_NODES]
            + [node(n, cpu="8", labels={"business_type": "video"}, lock=held.get(n)) for n in OTHER_NODES])


def reserve(name: str, *, on: str = "", bound_at: datetime | None = None, now: datetime, ns: str = "ns",
            group: str | None = None, own_annotation: bool = True) -> PodView:
    """A seed-004 reserve task of 4 cpu (`volcano.sh/reserveable: "true"` on the pod unless `own_annotation` is
    False: then only its PodGroup says so), bound on `on` at `bound_at`, or pending."""
    return pod(name, "4", node_name=on, reserveable=own_annotation, ns=ns, group=group,
               started_ago=(now - bound_at) if bound_at is not None else None, age=timedelta(hours=3), base=now)


def replan(result: Plan, pods: list[PodView], now: datetime, config: ReservoirConfig = SEED_004_CONFIG,
           groups: list[PodGroupView] = ()) -> Plan:
    """The next plan, on nodes carrying the locks `result` wanted (as the writer would have left them)."""
    return plan(snap(cluster(result.locks), pods, groups), config, now)


def window_nodes_of(result: Plan) -> set[str]:
    return {name for name, lock in result.locks.items() if lock.owner == OWNER}


def test_one_reserve_pod_bound_at_0130_does_not_release_a_window_whose_pod_num_to_reserve_is_10() -> None:
    """Issue 11's example: one reserve pod bound at 01:30 released the 03:00-04:00 window (podNumToReserve 10),
    because one had started and none was pending."""
    first = plan(snap(cluster(), []), SEED_004_CONFIG, at(1))
    assert window_nodes_of(first) == {"e1", "e2", "e3", "e4"}, "32 cpu and 64Gi: four 8-cpu 16Gi nodes"
    one = [reserve("r0", on="e1", bound_at=at(1, 30), now=at(1, 30))]
    result = replan(first, one, at(1, 30))
    assert window_nodes_of(result) == {"e1", "e2", "e3", "e4"}
    assert result.windows[0].reason.startswith("holding 4 nodes for reserve pods: 1 of podNumToReserve 10 scheduled")


def test_seed_story_ten_reserve_pods_arriving_over_the_hour_keep_the_reservation_until_the_tenth() -> None:
    """The seed's story: ten reserve tasks (4 cpu each) arrive in waves; the window keeps
    max(allocated + pending, 32 cpu / 64Gi) on its nodes until the tenth is scheduled there, then lets go for good."""
    names = [f"r{i}" for i in range(10)]
    result = plan(snap(cluster(), []), SEED_004_CONFIG, at(1))
    assert len(window_nodes_of(result)) == 4

    def wave(now: datetime, bound: dict[str, str]) -> list[PodView]:
        return [reserve(n, on=bound.get(n, ""), bound_at=at(2, 5) if n in bound else None, now=now) for n in names]

    # 02:10, first wave: four bound (16 cpu allocated), six pending (24 cpu): max(40, 32) = 40 cpu -> five nodes
    first_wave = {"r0": "e1", "r1": "e1", "r2": "e2", "r3": "e2"}
    result = replan(result, wave(at(2, 10), first_wave), at(2, 10))
    assert window_nodes_of(result) == {"e1", "e2", "e3", "e4", "e5"}
    assert result.locks["e1"].reserved.to_quantities() == {"cpu": "40", "memory": "64Gi"}
    # 02:30, second wave: eight bound, two pending: still 40 cpu, still held
    second_wave = {**first_wave, "r4": "e3", "r5": "e3", "r6": "e4", "r7": "e4"}
    result = replan(result, wave(at(2, 30), second_wave), at(2, 30))
    assert window_nodes_of(result) == {"e1", "e2", "e3", "e4", "e5"}
    # 02:45: nine of ten
    third = {**second_wave, "r8": "e5"}
    result = replan(result, wave(at(2, 45), third), at(2, 45))
    assert len(window_nodes_of(result)) == 5 and "9 of podNumToReserve 10" in result.windows[0].reason
    # 02:50: the tenth is scheduled: stop reserve
    tenth = {**third, "r9": "e5"}
    result = replan(result, wave(at(2, 50), tenth), at(2, 50))
    assert window_nodes_of(result) == set()
    assert result.windows[0].reason == "10 reserve pods scheduled on its nodes (podNumToReserve 10)"
    # and it stays released while the window runs (its nodes are no longer held: counted on every ebook node)
    for later in (at(2, 55), at(3, 30)):
        result = replan(result, wave(later, tenth), later)
        assert window_nodes_of(result) == set() and result.notes == []


def test_without_pod_num_to_reserve_the_window_holds_until_its_end() -> None:
    """The seed's count check never lets anyone in when podNumToReserve is not set: no early release, even with
    every reserve pod placed and none pending."""
    uncounted = SEED_004_CONFIG.windows[0].model_copy(update={"pod_num_to_reserve": None})
    config = SEED_004_CONFIG.model_copy(update={"windows": [uncounted]})
    result = plan(snap(cluster(), []), config, at(1))
    placed = [reserve(f"r{i}", on=f"e{1 + i % 4}", bound_at=at(2), now=at(3, 30)) for i in range(8)]
    for now in (at(2, 30), at(3, 30), at(3, 59)):
        result = replan(result, placed, now, config)
        assert window_nodes_of(result) == {"e1", "e2", "e3", "e4"}
        assert "scheduled on them, 0 pending" in result.windows[0].reason
    assert replan(result, placed, at(4), config).locks == {}


def test_the_window_keeps_max_of_allocated_plus_pending_and_resources_in_the_dimensions_it_reserves() -> None:
    result = plan(snap(cluster(), []), SEED_004_CONFIG, at(1))
    # all ten pending at once: 40 cpu and 10Gi asked; max(40 cpu / 10Gi, 32 cpu / 64Gi) = 40 cpu / 64Gi: five nodes
    waiting = [reserve(f"r{i}", now=at(2)) for i in range(10)]
    assert len(window_nodes_of(replan(result, waiting, at(2)))) == 5
    # a reserve pod asking for a GPU the window does not reserve takes no more nodes
    gpu = PodView.from_obj({"metadata": {"name": "gpu", "namespace": "ns", "annotations": {keys.RESERVEABLE: "true"},
                                         "creationTimestamp": stamp(at(1))},
                            "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]},
                            "status": {"phase": "Pending"}})
    assert len(window_nodes_of(replan(result, [gpu], at(2)))) == 4
    # a pending reserve pod whose nodeSelector keeps it off the ebook nodes is not this window's demand
    video = [replace(p, node_selector={"business_type": "video"}) for p in waiting]
    assert len(window_nodes_of(replan(result, video, at(2)))) == 4


def test_reserve_pods_count_only_on_the_nodes_the_window_holds_within_its_range() -> None:
    """Issue 11: a reserve pod started on an unrelated node released another window. Ten reserve pods elsewhere (on
    another business's nodes, or on ebook nodes the window does not hold), or bound before the range, change
    nothing."""
    result = plan(snap(cluster(), []), SEED_004_CONFIG, at(1))
    held = window_nodes_of(result)
    elsewhere = [reserve(f"v{i}", on=OTHER_NODES[i % 2], bound_at=at(2), now=at(2, 30)) for i in range(10)]
    unheld = [reserve(f"u{i}", on=f"e{5 + i % 4}", bound_at=at(2), now=at(2, 30), ns="tenant") for i in range(10)]
    early = [reserve(f"x{i}", on=f"e{1 + i % 4}", bound_at=at(0, 30), now=at(2, 30)) for i in range(10)]
    for pods in (elsewhere, unheld, early, elsewhere + unheld + early):
        after = replan(result, pods, at(2, 30))
        assert window_nodes_of(after) == held, [p.name for p in pods[:1]]
        assert "0 of podNumToReserve 10 scheduled on them" in after.windows[0].reason


def test_a_hostile_tenant_cannot_release_a_window_it_is_not_let_into() -> None:
    """A window limited to namespace `books`: a tenant's reserve pods bound on the window's own nodes (BestEffort
    pods tolerate every lock, and a pod may be bound before the lock) are not the window's reserve pods."""
    config = load_config("""
maxLockedNodePercent: 90
starvation: {enabled: false}
windows:
- {name: ebook, nodeSelector: {business_type: ebook}, resources: {cpu: "32", memory: 64Gi}, startReserveAgo: 2h,
   podNumToReserve: 10, cron: "0 3 - 4 * * *", namespaces: [books]}
""")
    result = plan(snap(cluster(), []), config, at(1))
    held = sorted(window_nodes_of(result))
    best_effort = [replace(reserve(f"t{i}", on=held[i % 4], bound_at=at(2), now=at(2, 30), ns="tenant"),
                           best_effort=True) for i in range(10)]
    plain = [reserve(f"p{i}", on=held[i % 4], bound_at=at(2), now=at(2, 30), ns="tenant") for i in range(10)]
    assert window_nodes_of(replan(result, best_effort + plain, at(2, 30), config)) == set(held)
    books = [reserve(f"b{i}", on=held[i % 4], bound_at=at(2), now=at(2, 30), ns="books") for i in range(10)]
    assert window_nodes_of(replan(result, books, at(2, 30), config)) == set(), "its own ten release it"


# --- PodGroup annotations ---

def group(name: str, annotations: dict[str, str], ns: str = "ns") -> PodGroupView:
    return PodGroupView.from_obj({"metadata": {"name": name, "namespace": ns, "annotations": annotations},
                                  "spec": {"minMember": 1}})


def test_podgroup_view_reads_the_reserve_annotations_once_and_ignores_unreadable_ones() -> None:
    pg = group("report", {keys.RESERVEABLE: "true", keys.MAXIMUM_RUNTIME: "500s"})
    assert pg.reserveable and pg.maximum_runtime == timedelta(seconds=500)
    for bad in ("forever", "999999999999h", "2 hours", "x" * 10_000):
        assert group("g", {keys.MAXIMUM_RUNTIME: bad}).maximum_runtime is None
    assert not group("g", {keys.RESERVEABLE: "yes"}).reserveable and not group("g", {}).reserveable


def test_the_pods_own_annotation_comes_first_then_its_podgroups() -> None:
    groups = {("ns", "report"): group("report", {keys.RESERVEABLE: "true", keys.MAXIMUM_RUNTIME: "500s"})}
    member = pod("m", "1", group="report")
    assert is_reserve_pod(member, groups) and maximum_runtime(member, groups) == timedelta(seconds=500)
    says_no = replace(member, annotations={**member.annotations, keys.RESERVEABLE: "false"})
    assert not is_reserve_pod(says_no, groups), "as the webhook's copy and shared.entitlement have it"
    own = pod("o", "1", group="report", runtime="1h")
    assert maximum_runtime(own, groups) == timedelta(hours=1)
    assert not is_reserve_pod(pod("lone", "1"), groups) and maximum_runtime(pod("lone", "1"), groups) is None
    assert not is_reserve_pod(pod("m", "1", group="report", ns="elsewhere"), groups), "a PodGroup of its namespace"


def test_pods_of_a_reserveable_podgroup_count_toward_the_window_without_the_webhooks_copy() -> None:
    """Pods admitted before their PodGroup reached the webhook's cache, or while it was down: only the PodGroup says
    they are reserve tasks. Ten of them scheduled on the window's nodes release it; pending, one is given the
    window's toleration by repair."""
    groups = [group("report", {keys.RESERVEABLE: "true"})]
    result = plan(snap(cluster(), []), SEED_004_CONFIG, at(1))
    held = sorted(window_nodes_of(result))
    nine = [reserve(f"g{i}", on=held[i % 4], bound_at=at(2), now=at(2, 30), group="report", own_annotation=False)
            for i in range(9)]
    waiting = reserve("g9", now=at(2, 30), group="report", own_annotation=False)
    held_on = replan(result, [*nine, waiting], at(2, 30), groups=groups)
    # nine placed (36 cpu) and one waiting (4): max(40, 32) cpu, five nodes
    assert window_nodes_of(held_on) == {*held, "e5"} and "9 of podNumToReserve 10" in held_on.windows[0].reason
    assert [(r.name, r.add) for r in held_on.repairs] == [("g9", (lock_toleration(OWNER),))]
    tenth = replace(waiting, node_name="e5", phase="Running", started=at(2, 31))
    assert replan(held_on, [*nine, tenth], at(2, 32), groups=groups).locks == {}


def test_a_podgroups_maximum_runtime_counts_for_the_release_curve() -> None:
    """e1 runs a pod forever; e2 a pod of PodGroup `etl` (maximum runtime 1h, the pod says nothing) started at 01:00,
    gone at 02:00. At 03:00 e2 is idle: the window (16 cpu) takes e2 and e3, not e1."""
    config = load_config("""
maxLockedNodePercent: 90
starvation: {enabled: false}
windows:
- {name: ebook, nodeSelector: {business_type: ebook}, resources: {cpu: "16"}, cron: "0 3 - 4 * * *",
   startReserveAgo: 2h}
""")
    nodes = [node(n, cpu="8", labels=EBOOK) for n in ("e1", "e2", "e3")] + [node("v1", cpu="8")]
    pods = [pod("forever", "8", node_name="e1", started_ago=timedelta(minutes=30), base=at(1, 30)),
            pod("etl-0", "8", node_name="e2", group="etl", started_ago=timedelta(minutes=30), base=at(1, 30))]
    groups = [group("etl", {keys.MAXIMUM_RUNTIME: "1h"})]
    result = plan(snap(nodes, pods, groups), config, at(1, 30))
    assert set(result.locks) == {"e2", "e3"}
    assert result.states["e2"].releases.ends == [at(2)], "seed 000's release curve sees the PodGroup's runtime too"
    assert result.states["e1"].releases.ends == []
    assert set(plan(snap(nodes, pods), config, at(1, 30)).locks) == {"e1", "e3"}, "without it: forever, by name"


def test_with_group_runtimes_changes_only_the_pods_that_need_it() -> None:
    pods = [pod("a", "1", group="etl"), pod("b", "1", group="etl", runtime="5m"), pod("c", "1")]
    index = PodIndex.of(pods)
    assert with_group_runtimes(index, {}) == ({}, {})
    untimed = {("ns", "etl"): group("etl", {keys.RESERVEABLE: "true"})}
    assert with_group_runtimes(index, untimed) == ({}, {})
    timed = {("ns", "etl"): group("etl", {keys.MAXIMUM_RUNTIME: "1h"})}
    out, memo = with_group_runtimes(index, timed)
    assert set(out) == {"ns/a"} and out["ns/a"].maximum_runtime == timedelta(hours=1), "b has its own, c no group"
    again, _ = with_group_runtimes(index, timed, memo)
    assert again["ns/a"] is out["ns/a"], "the same view, the same replaced view"
    changed = {("ns", "etl"): group("etl", {keys.MAXIMUM_RUNTIME: "2h"})}
    assert with_group_runtimes(index, changed, memo)[0]["ns/a"].maximum_runtime == timedelta(hours=2)
    other = PodIndex.of([replace(pods[0]), *pods[1:]])  # an equal but new view (its object changed): a new one
    assert with_group_runtimes(other, timed, memo)[0]["ns/a"] is not out["ns/a"]


def test_a_podgroups_maximum_runtime_does_not_defeat_the_node_state_cache() -> None:
    """Issue 11 review: with_group_runtimes made new views of a timed PodGroup's pods on every plan, so the node state
    of every node hosting one was summed again each plan. The same input view maps to the same replaced view across
    plans (Plan.runtimes); a changed PodGroup runtime makes a new one."""
    nodes = [node(n, cpu="8", labels=EBOOK) for n in ("e1", "e2")]
    pods = [pod("etl-0", "4", node_name="e1", group="etl", started_ago=timedelta(minutes=30), base=at(1, 30)),
            pod("plain", "4", node_name="e2", started_ago=timedelta(minutes=30), base=at(1, 30))]
    snapshot = snap(nodes, pods, [group("etl", {keys.MAXIMUM_RUNTIME: "1h"})])
    first = plan(snapshot, SEED_004_CONFIG, at(1, 30))
    second = plan(snapshot, SEED_004_CONFIG, at(1, 31), first.locks, previous=first)
    assert second.states["e1"] is first.states["e1"] and second.states["e2"] is first.states["e2"]
    assert second.states["e1"].pods[0] is first.states["e1"].pods[0]
    assert second.states["e1"].releases.ends == [at(2)]
    longer = replace(snapshot, podgroups={("ns", "etl"): group("etl", {keys.MAXIMUM_RUNTIME: "2h"})})
    third = plan(longer, SEED_004_CONFIG, at(1, 32), second.locks, previous=second)
    assert third.states["e1"] is not second.states["e1"] and third.states["e1"].releases.ends == [at(3)]
    assert third.states["e2"] is second.states["e2"]


# --- a hostile tenant inflating a window's reserve (issue 11 review) ---

def reserve_spec(name: str, cpu: str, spec: dict, *, now: datetime, ns: str = "ns") -> PodView:
    """A pending reserve pod with extra spec fields (schedulingGates, affinity, tolerations, nodeSelector)."""
    return PodView.from_obj({
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "annotations": {keys.RESERVEABLE: "true"},
                     "creationTimestamp": stamp(now - timedelta(hours=1))},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}], **spec},
        "status": {"phase": "Pending"}})


NOWHERE = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "business_type", "operator": "In", "values": ["nowhere"]}]}]}}}}
GATED = {"schedulingGates": [{"name": "example.com/hold"}]}


def test_pending_reserve_pods_that_can_never_run_on_the_windows_nodes_reserve_nothing() -> None:
    """A tenant let into the window could make it lock every ebook node (up to maxLockedNodePercent) with pending
    reserve pods kube-scheduler will never place there: gated, asking for more than any of its nodes has, or whose
    required affinity, nodeSelector or taints keep them off its nodes. None of them counts; pods that could run
    there still do."""
    result = plan(snap(cluster(), []), SEED_004_CONFIG, at(1))
    assert len(window_nodes_of(result)) == 4
    now = at(2)
    hostile = {
        "gated and impossible": [reserve_spec("huge", "100000", {**GATED, **NOWHERE}, now=now)],
        "too big for any node": [reserve_spec("huge", "100000", {}, now=now)],
        "gated": [reserve_spec(f"g{i}", "4", GATED, now=now) for i in range(10)],
        "impossible affinity": [reserve_spec(f"a{i}", "4", NOWHERE, now=now) for i in range(10)],
        "nodeSelector elsewhere": [reserve_spec(f"n{i}", "4", {"nodeSelector": {"kubernetes.io/hostname": "v1"}},
                                            now=now) for i in range(10)],
    }
    for what, pods in hostile.items():
        after = replan(result, pods, now)
        assert window_nodes_of(after) == window_nodes_of(result), what
    # the same ten pods, able to run on an ebook node: 40 cpu, five nodes
    assert len(window_nodes_of(replan(result, [reserve_spec(f"r{i}", "4", {}, now=now) for i in range(10)],
                                      now))) == 5


def test_a_pending_reserve_pod_must_tolerate_the_windows_nodes_taints() -> None:
    """The window's nodes are tainted `dedicated=ebook:NoSchedule` (the window's own lock taint aside): a pending
    reserve pod without that toleration cannot go there and counts for nothing; with it, it counts."""
    def tainted(name: str) -> NodeView:
        return NodeView.from_obj({"metadata": {"name": name, "labels": EBOOK},
                                  "spec": {"taints": [{"key": "dedicated", "value": "ebook", "effect": "NoSchedule"}]},
                                  "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}})
    nodes = [tainted(n) for n in EBOOK_NODES] + [node("v1", cpu="8"), node("v2", cpu="8")]
    now = at(2)
    plain = [reserve_spec(f"p{i}", "4", {}, now=now) for i in range(10)]
    tolerating = [reserve_spec(f"t{i}", "4", {"tolerations": [{"key": "dedicated", "operator": "Equal",
                                                               "value": "ebook", "effect": "NoSchedule"}]}, now=now)
                  for i in range(10)]
    assert len(window_nodes_of(plan(snap(nodes, plain), SEED_004_CONFIG, now))) == 4
    assert len(window_nodes_of(plan(snap(nodes, tolerating), SEED_004_CONFIG, now))) == 5


def test_pending_reserve_pods_count_only_up_to_the_pods_the_window_still_waits_for() -> None:
    """podNumToReserve 10 and nine scheduled on its nodes: the window is released by the tenth, so at most one more
    pending pod's request (the largest) counts: a tenant's twenty pending pods do not make it take every node."""
    result = plan(snap(cluster(), []), SEED_004_CONFIG, at(1))
    held = sorted(window_nodes_of(result))
    nine = [reserve(f"s{i}", on=held[i % 4], bound_at=at(2), now=at(2, 30)) for i in range(9)]
    flood = [reserve(f"w{i}", now=at(2, 30)) for i in range(20)]
    after = replan(result, [*nine, *flood], at(2, 30))
    # 36 cpu placed and one 4-cpu pod waiting: max(40, 32) cpu, five nodes (not 36 + 80 cpu: every ebook node)
    assert len(window_nodes_of(after)) == 5 and "20 pending" in after.windows[0].reason


def test_the_plan_names_the_moment_a_window_starts_or_ends_so_the_agent_wakes_then() -> None:
    """Nothing in the cluster changes when a window's range begins: the plan says when (Plan.wake_at), and the
    agent's loop plans again at that moment instead of at the next resync."""
    labels = {"business": "ebook"}
    nodes = [node("e1", labels=labels), node("e2", labels=labels)]
    assert plan(snap(nodes, [], spare=1), WINDOW, at(0, 30)).wake_at == at(1), "03:00 - startReserveAgo 2h"
    assert plan(snap(nodes, [], spare=1), WINDOW, at(1, 30)).wake_at == at(4), "in its range: its end"
