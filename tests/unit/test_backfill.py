"""Backfill (agent/planner/backfill.py, issue 17, DESIGN 4.6): a pod with a declared runtime runs on a locked node's
idle room only if it is gone by the time the lock's owner needs the node. Seed 000's draining node and seed 004's
window with their own numbers; each clause of the rule refusing; the margin; two candidates not sharing room; the
deadline; and the property that a backfilled pod never delays an owner, against a brute-force timeline, even when
its tenant rewrites its declared maximum runtime after the backfill (issue 29)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.planner.backfill import (
    MAX_GRACE_SECONDS,
    BackfillSlot,
    Candidate,
    backfill_slot,
    backfill_verdict,
    choose_backfills,
    deadline_seconds,
    fits_now,
    grant_marks,
    held_for,
    needed_by,
)
from agent.planner.capacity import NodeState, node_states, schedulable
from agent.planner.model import Backfill, Lock
from agent.planner.plan import plan
from agent.planner.reserve import maximum_runtime
from agent.planner.windows import window_bounds
from shared import keys
from shared.backfill import read_grants
from shared.keys import LockKind
from shared.ownership import window_owner_id
from shared.predicates import schedulable_on
from shared.resources import EMPTY, PODS, Resources
from shared.timestamps import stamp
from shared.views import NodeView, PodGroupView, PodView
from tests.builders import NOW, SEED_004_CONFIG, node, pod, snap

S = timedelta(seconds=1)
GI = 1024**3
OWNER = "job-ns-pod-4"


def job_lock(name: str, owner: str = OWNER) -> Lock:
    return Lock(node=name, owner=owner, kind=LockKind.JOB, subject="ns/pod-4", reason="starving job", since=NOW)


def state_of(view: NodeView, pods: list[PodView]) -> NodeState:
    return node_states({view.name: view}, pods)[view.name]


def seed_000_node(*, pod_3_runtime: str | None = "60s", name: str = "n1") -> NodeState:
    """Seed 000 at `Time2`: one 3-cpu node; pod-1 (1 cpu) has completed, pod-2 and pod-3 (1 cpu each, 60 s runtimes
    declared) run, started 50 s and 20 s ago: 1 cpu idle, 1 more at +10 s, the third at +40 s."""
    return state_of(node(name, cpu="3"), [
        pod(f"{name}-pod-2", "1", node_name=name, runtime="60s", started_ago=50 * S),
        pod(f"{name}-pod-3", "1", node_name=name, runtime=pod_3_runtime, started_ago=20 * S)])


def pod_4() -> Resources:
    """Seed 000's pod-4: the whole node (3 cpu; 1Gi as the builders give every pod)."""
    return pod("pod-4", "3").requests


def seed_000_slot(*, pod_3_runtime: str | None = "60s") -> BackfillSlot:
    state = seed_000_node(pod_3_runtime=pod_3_runtime)
    return backfill_slot(job_lock("n1"), state, now=NOW, tasks=[pod_4()])


def verdict(candidate: PodView, slot: BackfillSlot, *, margin: timedelta = 5 * S, is_owner: bool = False,
            fits_unlocked: bool = False, backfilled: tuple[PodView, ...] = ()) -> tuple[bool, str]:
    return backfill_verdict(candidate, runtime=candidate.maximum_runtime, fits_unlocked=fits_unlocked,
                            is_owner=is_owner, slot=slot, backfilled=backfilled, now=NOW, margin=margin)


# --- seed 000: the draining node ---


def test_seed_000_needed_by_is_when_pod_4_fits() -> None:
    slot = seed_000_slot()
    assert slot.taken_now == EMPTY, "pod-4 does not fit the 1 idle cpu"
    assert slot.needed_by == NOW + 40 * S, "pod-2 ends at +10 s, pod-3 at +40 s: then 3 cpu are idle"


def test_seed_000_a_short_pod_runs_on_the_draining_node_if_it_ends_before_pod_4_fits() -> None:
    slot = seed_000_slot()
    short = pod("short", "1", runtime="10s")
    allowed, reason = verdict(short, slot)
    assert allowed, reason
    assert stamp(NOW + 15 * S) in reason and stamp(NOW + 40 * S) in reason
    chosen = choose_backfills([Candidate(short, short.maximum_runtime)], [slot], now=NOW, margin=5 * S)
    assert chosen.nodes == {"ns/short": "n1"} and chosen.refused == {}
    assert chosen.placed[0].ends == NOW + 15 * S and chosen.placed[0].needed_by == NOW + 40 * S


def test_seed_000_a_pod_of_the_stream_crossing_pod_4s_fit_is_refused() -> None:
    slot = seed_000_slot()
    allowed, reason = verdict(pod("pod-5", "1", runtime="60s"), slot)
    assert not allowed and "after n1 is needed" in reason
    assert verdict(pod("edge", "1", runtime="35s"), slot)[0], "35 s + 5 s margin ends exactly at +40 s"
    assert not verdict(pod("over", "1", runtime="36s"), slot)[0]


def test_seed_000_no_backfill_where_a_pod_without_runtime_must_end_first() -> None:
    slot = seed_000_slot(pod_3_runtime=None)
    assert slot.needed_by is None, "pod-3 may run forever: when pod-4 fits is unknown"
    allowed, reason = verdict(pod("short", "1", runtime="10s"), slot)
    assert not allowed and "needed-by time of n1 is unknown" in reason


def test_margin() -> None:
    slot = seed_000_slot()
    short = pod("short", "1", runtime="10s")
    assert verdict(short, slot, margin=30 * S)[0], "10 s + 30 s ends at +40 s, when pod-4 fits"
    allowed, reason = verdict(short, slot, margin=31 * S)
    assert not allowed and "margin 31s" in reason


def test_each_clause_refuses() -> None:
    slot = seed_000_slot()
    short = pod("short", "1", runtime="10s")
    cases = {
        "owner": (verdict(short, slot, is_owner=True), "owner of the lock on n1"),
        "fits unlocked": (verdict(short, slot, fits_unlocked=True), "fits on an unlocked node"),
        "no runtime": (verdict(pod("forever", "1"), slot), "declares no volcano.sh/maximum-runtime"),
        "too long": (verdict(pod("long", "1", runtime="1h"), slot), "after n1 is needed"),
        "too big": (verdict(pod("big", "2", runtime="10s"), slot), "short of {'cpu': '1'}"),
        "bound": (verdict(pod("bound", "1", runtime="10s", node_name="other"), slot), "bound to other"),
        "finished": (verdict(replace(short, phase="Succeeded"), slot), "finished"),
        "deleting": (verdict(replace(short, deleting=True), slot), "being deleted"),
        "handover": (verdict(replace(short, handover_gated=True), slot), "Reservation's handover"),
        "selector": (verdict(replace(short, node_selector={"zone": "b"}), slot), "would not place it on n1"),
    }
    for name, ((allowed, reason), expected) in cases.items():
        assert not allowed, name
        assert expected in reason, (name, reason)
    assert verdict(replace(short, gated=True), slot)[0], "held by the backfill gate: still a candidate"


def test_cordoned_node_is_not_backfilled() -> None:
    state = seed_000_node()
    cordoned = NodeState(replace(state.node, unschedulable=True), state.pods, state.used)
    slot = backfill_slot(job_lock("n1"), cordoned, now=NOW, tasks=[pod_4()])
    assert not verdict(pod("short", "1", runtime="10s"), slot)[0]


def test_runtime_of_the_podgroup_counts() -> None:
    group = PodGroupView.from_obj({"metadata": {"name": "g", "namespace": "ns",
                                                "annotations": {keys.MAXIMUM_RUNTIME: "10s"},
                                                "creationTimestamp": stamp(NOW)}, "spec": {"minMember": 1}})
    member = pod("member", "1", group="g")
    runtime = maximum_runtime(member, {("ns", "g"): group})
    assert member.maximum_runtime is None and runtime == 10 * S
    slot = seed_000_slot()
    assert backfill_verdict(member, runtime=runtime, fits_unlocked=False, is_owner=False, slot=slot, now=NOW,
                            margin=5 * S).allowed


def test_two_candidates_do_not_share_the_room() -> None:
    slot = seed_000_slot()
    first = pod("first", "1", runtime="10s", age=2 * S)
    second = pod("second", "1", runtime="10s", age=1 * S)
    chosen = choose_backfills([Candidate(second, second.maximum_runtime), Candidate(first, first.maximum_runtime)],
                              [slot], now=NOW, margin=5 * S)
    assert chosen.nodes == {"ns/first": "n1"}, "the older first; the one idle cpu is then gone"
    assert "does not fit the room on n1" in chosen.refused["ns/second"]
    assert not verdict(second, slot, backfilled=(first,))[0]


def test_the_owners_tasks_that_fit_now_keep_their_room() -> None:
    """A 4-cpu node: p1 (1 cpu) ends at +10 s, p2 (2 cpu) at +40 s, 1 cpu idle. An owner with a 1-cpu task (fits
    now) and a 3-cpu task: the idle cpu is the first task's; the second fits when both end."""
    state = state_of(node("n1", cpu="4"), [pod("p1", "1", node_name="n1", runtime="20s", started_ago=10 * S),
                                           pod("p2", "2", node_name="n1", runtime="60s", started_ago=20 * S)])
    small, big = pod("t1", "1").requests, pod("t2", "3").requests
    assert fits_now(state, [small, big]) == (small, (big,))
    slot = backfill_slot(job_lock("n1"), state, now=NOW, tasks=[small, big])
    assert slot.taken_now == small and slot.needed_by == NOW + 40 * S
    allowed, reason = verdict(pod("short", "1", runtime="5s"), slot)
    assert not allowed and "does not fit the room" in reason
    assert verdict(pod("short", "1", runtime="5s"), backfill_slot(job_lock("n1"), state, now=NOW, tasks=[big]))[0]


def test_needed_by_is_when_the_first_waiting_task_fits() -> None:
    """Two 2-cpu tasks waiting on a 4-cpu node with 1 cpu idle: the first fits at +10 s, when p1 ends, not at +40 s
    when both would: a backfilled pod must be gone by then."""
    state = state_of(node("n1", cpu="4"), [pod("p1", "1", node_name="n1", runtime="20s", started_ago=10 * S),
                                           pod("p2", "2", node_name="n1", runtime="60s", started_ago=20 * S)])
    two = pod("t", "2").requests
    slot = backfill_slot(job_lock("n1"), state, now=NOW, tasks=[two, two])
    assert slot.needed_by == NOW + 10 * S
    assert not verdict(pod("short", "1", runtime="20s"), slot)[0]
    assert verdict(pod("short", "1", runtime="4s"), slot, margin=5 * S)[0]


def test_nothing_waiting_means_needed_now() -> None:
    state = seed_000_node()
    slot = backfill_slot(job_lock("n1"), state, now=NOW, tasks=[pod("t", "1").requests])
    assert slot.needed_by == NOW, "the owner's task fits now: it takes the node now"
    assert not verdict(pod("short", "1", runtime="1s"), slot, margin=timedelta(0))[0]


def test_reservation_and_queue_locks() -> None:
    state = seed_000_node()
    assert needed_by(LockKind.RESERVATION, state, now=NOW, waiting=[pod_4()]) == NOW + 40 * S
    assert needed_by(LockKind.QUEUE, state, now=NOW, waiting=[pod_4()]) is None, "a queue's pods may come any time"
    assert needed_by(LockKind.WINDOW, state, now=NOW) is None, "a window without its start"


def test_best_fit_and_determinism() -> None:
    """A 1-cpu pod fits both drained nodes; it goes where it leaves the least room (n-small), whatever the order."""
    big = state_of(node("n-big", cpu="8"), [pod("b", "4", node_name="n-big", runtime="60s", started_ago=0 * S)])
    small = state_of(node("n-small", cpu="3"), [pod("s", "1", node_name="n-small", runtime="60s", started_ago=0 * S)])
    slots = [backfill_slot(job_lock("n-big", "job-a"), big, now=NOW, tasks=[pod("a", "8").requests]),
             backfill_slot(job_lock("n-small", "job-b"), small, now=NOW, tasks=[pod("b", "3").requests])]
    short = pod("short", "1", runtime="10s")
    candidates = [Candidate(short, short.maximum_runtime), Candidate(pod("x", "4", runtime="10s"), 10 * S)]
    first = choose_backfills(candidates, slots, now=NOW, margin=5 * S)
    again = choose_backfills(candidates[::-1], slots[::-1], now=NOW, margin=5 * S)
    assert first == again
    assert first.nodes == {"ns/short": "n-small", "ns/x": "n-big"}


def test_refusal_names_each_node_only_when_they_differ() -> None:
    slot = seed_000_slot()
    other = backfill_slot(job_lock("n2", "other"), seed_000_node(name="n2"), now=NOW, tasks=[pod_4()])
    chosen = choose_backfills([Candidate(pod("forever", "1"), None)], [slot, other], now=NOW, margin=5 * S)
    assert chosen.refused["ns/forever"].startswith("it declares no volcano.sh/maximum-runtime")
    owner = pod("own", "1", runtime="10s")
    chosen = choose_backfills([Candidate(owner, 10 * S, owns=frozenset({OWNER}))], [slot, other], now=NOW,
                              margin=5 * S)
    assert chosen.nodes == {"ns/own": "n2"}, "an owner of n1's lock may still backfill another owner's node"
    chosen = choose_backfills([Candidate(owner, 10 * S, owns=frozenset({OWNER}))], [slot], now=NOW, margin=5 * S)
    assert chosen.nodes == {} and "owner of the lock on n1" in chosen.refused["ns/own"]


# --- seed 004: the window ---



def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, 22, hour, minute, tzinfo=UTC)


def test_seed_004_window_needed_by_is_its_start_not_the_lead_time() -> None:
    """From 01:00 (03:00 - startReserveAgo 2h) four 8-cpu ebook nodes are locked for 32 cpu / 64Gi; a pod that fits
    nowhere else may use one until 03:00, not across it."""
    nodes = [node(f"e{i}", cpu="8", labels={"business_type": "ebook"}) for i in range(4)]
    now = at(1, 30)
    # 5 schedulable nodes: maxLockedNodePercent 90 locks 4
    result = plan(snap(nodes, [], spare=1), SEED_004_CONFIG, now)
    assert set(result.locks) == {"e0", "e1", "e2", "e3"}
    window = SEED_004_CONFIG.windows[0]
    start, _, active = window_bounds(window, now)
    assert active and start == at(3) and start - window.start_reserve_ago == at(1)
    states = node_states({n.name: n for n in nodes}, [])
    lock = result.locks["e0"]
    assert lock.owner == window_owner_id("ebook")
    slot = backfill_slot(lock, states["e0"], now=now, start=start)
    assert slot.needed_by == at(3)

    def allowed(runtime: str, when: datetime = now) -> bool:
        candidate = pod("batch", "4", runtime=runtime, base=when)
        return backfill_verdict(candidate, runtime=candidate.maximum_runtime, fits_unlocked=False, is_owner=False,
                                slot=slot, now=when, margin=60 * S).allowed

    assert allowed("20m")
    assert allowed("89m"), "01:30 + 89 min + 1 min margin = 03:00"
    assert not allowed("90m"), "its runtime crosses the window's start"
    assert not allowed("2h")
    assert not allowed("1s", at(3, 10)), "the window is open: nothing is backfilled"


def test_a_window_weighs_its_oldest_pending_reserve_pods_once_for_all_its_nodes() -> None:
    """Anyone may make pods reserve pods of a window open to their namespace: each locked node of the window weighs at
    most MAX_WINDOW_TASKS of them, the oldest, and the window's slots share one tuple of their keys."""
    from agent.planner.backfill import MAX_WINDOW_TASKS, backfill_slots

    nodes = [node(f"e{i}", cpu="8", labels={"business_type": "ebook"}) for i in range(4)]
    now = at(1, 30)
    result = plan(snap(nodes, [], spare=1), SEED_004_CONFIG, now)
    owner = window_owner_id("ebook")
    flood = [pod(f"r{i:05d}", "100", reserveable=True, age=timedelta(seconds=i), base=now)
             for i in range(MAX_WINDOW_TASKS + 50)]
    slots, _ = backfill_slots(pods=flood, states=node_states({n.name: n for n in nodes}, []), locks=result.locks,
                              current=result.locks, now=now, window_starts={owner: at(3)},
                              window_tasks={owner: flood}, waiting_reservations=set())
    assert len(slots) == 4 and all(s.tasks is slots[0].tasks for s in slots)
    assert len(slots[0].tasks) == MAX_WINDOW_TASKS and slots[0].tasks[0] == f"ns/r{MAX_WINDOW_TASKS + 49:05d}"
    assert all(s.needed_by == at(3) for s in slots), "100-cpu pods fit nowhere: the start stands"


# --- the deadline ---


def test_deadline_seconds() -> None:
    assert deadline_seconds(10 * S) == 10
    assert deadline_seconds(timedelta(seconds=10, milliseconds=200)) == 11, "never stopped before its maximum"
    assert deadline_seconds(timedelta(milliseconds=300)) == 1
    assert deadline_seconds(timedelta(0)) == 1
    assert deadline_seconds(10 * S, 5) == 5, "its own smaller deadline stays"
    assert deadline_seconds(10 * S, 20) == 10
    assert deadline_seconds(10 * S, 0) == 10, "not a deadline the API server accepts: ignored"
    assert held_for(timedelta(seconds=10, milliseconds=1)) == 11 * S


def test_a_fractional_runtime_is_reckoned_with_its_rounded_up_deadline() -> None:
    slot = seed_000_slot()
    assert backfill_verdict(pod("a", "1"), runtime=35 * S, fits_unlocked=False, is_owner=False, slot=slot, now=NOW,
                            margin=5 * S).allowed
    # 34.5 s + 5.5 s would end at +40 s exactly; its deadline is 35 s, so it may hold the node until +40.5 s
    assert not backfill_verdict(pod("a", "1"), runtime=timedelta(seconds=34.5), fits_unlocked=False, is_owner=False,
                                slot=slot, now=NOW, margin=timedelta(seconds=5.5)).allowed


# --- the property: a backfilled pod never delays an owner ---

TEMPLATE = pod("template", "1")
HORIZON = 150  # seconds simulated


@dataclass
class Running:
    """A pod on a node in the simulation: its view (what the planner sees) and when it really ends (None: never)."""

    view: PodView
    ends: datetime | None
    lied: bool = False  # its tenant rewrote its declared maximum runtime since it was backfilled


@dataclass
class NodeSpec:
    name: str
    cpu: int
    memory: int
    pods: list[tuple[int, int, int | None, int, int | None]]  # cpu, memory, runtime s, started ago s, real end s
    tasks: list[tuple[int, int]]  # the owner's pending tasks (cpu, memory); a window has none
    window_start: int | None  # seconds from NOW: the node is a window's; else a starvation lock's


@dataclass
class CandidateSpec:
    name: str
    cpu: int
    memory: int
    runtime: float | None  # seconds
    arrives: int
    fits_unlocked: bool
    owns: str | None  # the node whose lock it is an owner of
    # its tenant's rewrites of its `volcano.sh/maximum-runtime` once it is backfilled: (seconds after the backfill,
    # what it becomes: REWRITES)
    rewrites: tuple[tuple[int, str], ...] = ()


@dataclass
class Scenario:
    nodes: list[NodeSpec]
    candidates: list[CandidateSpec]
    margin: int  # seconds a backfilled pod holds its node past its deadline: the grace used to the full, and the rest
    early: bool = False  # pods may end before their maximum runtime (and backfilled ones before their deadline)
    # of the margin, the candidates' terminationGracePeriodSeconds (the config's margin is the rest: the sim binds a
    # pod at the plan's second, the room it holds from then on standing for the bind lag)
    grace: int = 0
    rewrites: bool = False  # the candidates' tenants rewrite their runtimes once backfilled (CandidateSpec.rewrites)


def requests(cpu: int, memory: int) -> Resources:
    return Resources({"cpu": cpu * 1000, "memory": memory * GI, "pods": 1})


def view(name: str, node_name: str, cpu: int, memory: int, *, started: datetime | None,
         runtime: timedelta | None, grace: int = 30) -> PodView:
    return replace(TEMPLATE, name=name, uid=f"uid-{name}", node_name=node_name, requests=requests(cpu, memory),
                   phase="Running" if node_name else "Pending", started=started, maximum_runtime=runtime,
                   created=started or NOW, termination_grace=grace)


# a candidate's maximum runtime in seconds: none, whole seconds, or tenths (its deadline rounds up)
RUNTIMES = st.one_of(st.none(), st.integers(1, 60).map(float), st.floats(0.1, 30).map(lambda f: round(f, 1)))
ARRIVALS = st.one_of(st.just(0), st.integers(0, 60))  # a second: many at the start, when the owners' tasks bind
# what a hostile tenant rewrites a backfilled pod's `volcano.sh/maximum-runtime` to: raised tenfold or a thousandfold,
# raised to 3 h, removed, or made tiny (issue 29)
REWRITES = ("x10", "x1000", "3h", "removed", "1ms")


def rewritten(what: str, runtime: timedelta) -> timedelta | None:
    """The maximum runtime a pod that declared `runtime` declares once its tenant rewrote it as `what` (REWRITES)."""
    if what == "removed":
        return None
    if what.startswith("x"):
        return runtime * int(what[1:])
    return {"3h": timedelta(hours=3), "1ms": timedelta(milliseconds=1)}[what]


def tenant_rewrites(runtime: float | None) -> st.SearchStrategy[tuple[tuple[int, str], ...]]:
    """One or two rewrites of a candidate's runtime, each at a second after its backfill: often within 3 s (while it
    still runs, even when it ends early), else up to its deadline and a bit beyond."""
    last = math.ceil(runtime) + 5 if runtime is not None else 5
    after = st.one_of(st.integers(1, 3), st.integers(1, last))
    return st.lists(st.tuples(after, st.sampled_from(REWRITES)), min_size=1, max_size=2).map(
        lambda drawn: tuple(sorted(drawn)))


@st.composite
def scenarios(draw: st.DrawFn, early: bool = False) -> Scenario:
    specs = []
    for index in range(draw(st.integers(1, 3))):
        cpu, memory = draw(st.integers(2, 6)), draw(st.integers(2, 6))
        pods: list[tuple[int, int, int | None, int, int | None]] = []
        free_cpu, free_memory = cpu, memory
        for _ in range(draw(st.integers(0, 6))):
            p_cpu, p_memory = draw(st.integers(1, 2)), draw(st.integers(0, 2))
            if p_cpu > free_cpu or p_memory > free_memory:
                continue
            free_cpu, free_memory = free_cpu - p_cpu, free_memory - p_memory
            runtime = None if draw(st.integers(0, 4)) == 0 else draw(st.integers(1, 120))
            ago = draw(st.integers(0, runtime - 1)) if runtime is not None else draw(st.integers(0, 100))
            real = runtime - ago if runtime is not None else None  # seconds from NOW
            if early:
                real = draw(st.one_of(st.none(), st.integers(1, 150))) if real is None else draw(st.integers(1, real))
            pods.append((p_cpu, p_memory, runtime, ago, real))
        window = draw(st.integers(0, 120)) if draw(st.integers(0, 3)) == 0 else None
        # one task mostly too big for the node's idle now (the node drains for it), maybe a small one that fits
        tasks = [] if window is not None else [(draw(st.integers(max(1, cpu - 2), cpu)), draw(st.integers(0, memory)))]
        if window is None and draw(st.booleans()):
            tasks.insert(draw(st.integers(0, 1)), (1, draw(st.integers(0, 1))))
        specs.append(NodeSpec(f"n{index}", cpu, memory, pods, tasks, window))
    names = [spec.name for spec in specs]
    rewrites = draw(st.integers(0, 9)) != 9  # nine times in ten, nominally (not 0: hypothesis favours it)
    candidates = []
    for i in range(draw(st.integers(0, 10))):
        declared = draw(RUNTIMES)
        candidates.append(CandidateSpec(
            name=f"c{i}", cpu=draw(st.integers(1, 2)), memory=draw(st.integers(0, 2)), runtime=declared,
            arrives=draw(ARRIVALS), fits_unlocked=draw(st.integers(0, 9)) == 0,
            owns=draw(st.sampled_from(names)) if draw(st.integers(0, 4)) == 0 else None,
            rewrites=draw(tenant_rewrites(declared)) if rewrites else ()))
    margin = draw(st.integers(0, 5))
    return Scenario(specs, candidates, margin, early, grace=draw(st.integers(0, margin)), rewrites=rewrites)


@st.composite
def steered(draw: st.DrawFn, early: bool = False) -> Scenario:
    """A scenario, three times in four with a chance of backfill added: one more node locked for a starving owner
    whose task waits for a running pod with 30 s or more of its declared runtime left, 1 cpu or more idle meanwhile,
    and one more candidate, small, short and arriving early (its tenant rewriting its runtime, as the scenario's
    others do). (Left alone, `scenarios` backfills in under half its examples.)"""
    scenario = draw(scenarios(early))
    if draw(st.integers(0, 3)) == 3:  # not 0: hypothesis draws its simplest value more often than the others
        return scenario
    cpu, blocked = draw(st.integers(3, 6)), draw(st.integers(1, 2))
    runtime = draw(st.integers(30, 120))
    ago = draw(st.integers(0, runtime - 30))
    real = runtime - ago if not early else draw(st.integers(5, runtime - ago))  # ends after the candidate arrives
    drain = NodeSpec(f"n{len(scenario.nodes)}", cpu, 4, [(blocked, 1, runtime, ago, real)],
                     [(draw(st.integers(cpu - blocked + 1, cpu)), draw(st.integers(0, 3)))], None)
    declared = float(draw(st.integers(1, 20)))
    small = CandidateSpec(name=f"c{len(scenario.candidates)}", cpu=1, memory=draw(st.integers(0, 1)),
                          runtime=declared, arrives=draw(st.integers(0, 3)), fits_unlocked=False, owns=None,
                          rewrites=draw(tenant_rewrites(declared)) if scenario.rewrites else ())
    return replace(scenario, nodes=[*scenario.nodes, drain], candidates=[*scenario.candidates, small])


def owner_of(spec: NodeSpec) -> str:
    return window_owner_id(spec.name) if spec.window_start is not None else f"job-{spec.name}"


@dataclass
class Timeline:
    """One simulated run: on each node, the names of the pods there at each second, when each owner task bound, each
    node's needed-by time at the start, the backfills made (pod, node, second, needed-by then), the rewrites of a
    backfilled pod's runtime while it ran (pod, second, what), and how many plans weighed candidates while a pod whose
    runtime was rewritten ran."""

    present: dict[str, list[frozenset[str]]] = field(default_factory=dict)
    bound: dict[tuple[str, int], int] = field(default_factory=dict)
    first: dict[str, datetime | None] = field(default_factory=dict)
    backfills: list[tuple[CandidateSpec, str, int, datetime]] = field(default_factory=list)
    rewrites: list[tuple[str, int, str]] = field(default_factory=list)
    decided_over_lies: int = 0


def simulate(scenario: Scenario, *, backfill: bool) -> Timeline:
    """Second by second from NOW: pods end when they really end; the tenants of backfilled pods rewrite their runtimes
    as drawn; then the planner runs (backfill on) and the pods it lets on bind; then the owners' tasks that fit bind
    (after the backfills: the order least kind to the owner), and run to the horizon. A backfilled pod holds its room
    until its deadline plus the margin (the kubelet's grace period used to the full), or less when pods end early,
    whatever its tenant rewrites: the kubelet enforces activeDeadlineSeconds, not the annotation.

    What the planner sees of a backfilled pod is what the real agent would have: the candidate's own grace
    (terminationGracePeriodSeconds, `Scenario.grace`, added to the config's margin as plan_backfill adds it), the
    activeDeadlineSeconds the writer patches onto it (Backfill.deadline), and on its node the grant the plan records
    (grant_marks, read back from the annotation's text: kept while its pod lives), besides its runtime as its tenant
    last wrote it."""
    margin = scenario.margin * S
    config_margin = (scenario.margin - scenario.grace) * S
    views = {spec.name: replace(node(spec.name), allocatable=Resources(
        {"cpu": spec.cpu * 1000, "memory": spec.memory * GI, "pods": 110})) for spec in scenario.nodes}
    running: dict[str, list[Running]] = {spec.name: [] for spec in scenario.nodes}
    for spec in scenario.nodes:
        for i, (cpu, memory, runtime, ago, real) in enumerate(spec.pods):
            if real is not None and real <= 0:
                continue
            started = NOW - ago * S
            running[spec.name].append(Running(
                view(f"{spec.name}-p{i}", spec.name, cpu, memory, started=started,
                     runtime=runtime * S if runtime is not None else None),
                NOW + real * S if real is not None else None))
    unbound = {spec.name: list(range(len(spec.tasks))) for spec in scenario.nodes}
    waiting = list(scenario.candidates) if backfill else []
    due: dict[int, list[tuple[str, str, timedelta, str]]] = {}  # second -> (node, pod, its runtime, rewritten to)
    timeline = Timeline(present={spec.name: [] for spec in scenario.nodes})
    for second in range(HORIZON + 1):
        now = NOW + second * S
        for name in running:
            running[name] = [r for r in running[name] if r.ends is None or r.ends > now]
        for node_name, pod_name, span, what in due.pop(second, []):
            for r in running[node_name]:
                if r.view.name == pod_name:  # still running: the tenant rewrites its annotation
                    r.view, r.lied = replace(r.view, maximum_runtime=rewritten(what, span)), True
                    timeline.rewrites.append((pod_name, second, what))
        states = node_states(views, [r.view for pods in running.values() for r in pods])
        slots = []
        locks = {}
        for spec in scenario.nodes:
            lock = locks[spec.name] = Lock(node=spec.name, owner=owner_of(spec),
                                           kind=LockKind.WINDOW if spec.window_start is not None else LockKind.JOB,
                                           subject=spec.name, reason="", since=NOW)
            tasks = [requests(*spec.tasks[i]) for i in unbound[spec.name]]
            start = NOW + spec.window_start * S if spec.window_start is not None else None
            slot = backfill_slot(lock, states[spec.name], now=now, tasks=tasks, start=start)
            if second == 0:
                timeline.first[spec.name] = slot.needed_by
            slots.append(slot)
        arrived = [c for c in waiting if c.arrives <= second]
        placed_now: tuple[Backfill, ...] = ()
        if arrived:
            timeline.decided_over_lies += any(r.lied for pods in running.values() for r in pods)
            chosen = choose_backfills([Candidate(
                view(c.name, "", c.cpu, c.memory, started=None, grace=scenario.grace,
                     runtime=c.runtime * S if c.runtime is not None else None),
                runtime=c.runtime * S if c.runtime is not None else None, fits_unlocked=c.fits_unlocked,
                owns=frozenset({owner_of(next(s for s in scenario.nodes if s.name == c.owns))}) if c.owns else
                frozenset(), grace=min(scenario.grace, MAX_GRACE_SECONDS) * S) for c in arrived],
                slots, now=now, margin=config_margin)
            placed_now = chosen.placed
            by_name = {c.name: c for c in arrived}
            for placed in chosen.placed:
                spec_c = by_name[placed.pod.name]
                assert spec_c.runtime is not None
                span = spec_c.runtime * S
                ends = now + held_for(span) + margin
                assert placed.ends == ends, "the grant's until is when the pod really ends (pods not ending early)"
                if scenario.early:
                    ends = now + (held_for(span) + margin) * ((spec_c.arrives % 4) + 1) / 4
                # bound, started now, with the deadline the writer patches on (deadline_patch: Backfill.deadline)
                running[placed.node].append(Running(replace(placed.pod, node_name=placed.node, phase="Running",
                                                            started=now, active_deadline=placed.deadline), ends))
                for after, what in spec_c.rewrites:
                    due.setdefault(second + after, []).append((placed.node, spec_c.name, span, what))
                timeline.backfills.append((spec_c, placed.node, second, placed.needed_by))
                waiting.remove(spec_c)
        if backfill:  # the plan's grants, as the writer records them on the nodes (and drops them with their pods)
            by_uid = {r.view.uid: r.view for pods in running.values() for r in pods}
            for name, marks in grant_marks(views, by_uid, placed_now, now, locks).items():
                views[name] = replace(views[name], backfill_grants=read_grants(marks[keys.BACKFILL_GRANTS]))
        states = node_states(views, [r.view for pods in running.values() for r in pods])
        for spec in scenario.nodes:
            assert states[spec.name].used.fits_in(views[spec.name].allocatable), "backfills overcommit the node"
            idle = states[spec.name].idle
            for i in list(unbound[spec.name]):
                task = requests(*spec.tasks[i])
                if idle.covers(task):
                    idle = idle - task
                    unbound[spec.name].remove(i)
                    timeline.bound[(spec.name, i)] = second
                    running[spec.name].append(Running(
                        view(f"{spec.name}-owner-{i}", spec.name, *spec.tasks[i], started=now, runtime=None), None))
        for spec in scenario.nodes:
            timeline.present[spec.name].append(frozenset(r.view.name for r in running[spec.name]))
    return timeline


def step(moment: datetime) -> int:
    """The first simulated second at or after `moment`."""
    return max(0, math.ceil((moment - NOW) / S))


def waiting_at_start(spec: NodeSpec, view_of_node: NodeState) -> list[int]:
    taken, _ = fits_now(view_of_node, [requests(*t) for t in spec.tasks])
    # fits_now's split by index: the tasks kube-scheduler places now, in order, skipping those that do not fit
    idle, out = view_of_node.idle, []
    for i, task in enumerate(spec.tasks):
        if idle.covers(requests(*task)):
            idle = idle - requests(*task)
        else:
            out.append(i)
    assert Resources.total(requests(*spec.tasks[i]) for i in range(len(spec.tasks)) if i not in out) == taken
    return out


# one entry per example of the property running (`requiring_backfills`): a pod backfilled; a backfilled pod's runtime
# rewritten by its tenant while it ran, a plan running after that (the rewrite's own second's, at least); and a plan
# weighing candidates while a pod whose runtime was rewritten ran
BACKFILLED: list[bool] = []
REWROTE: list[bool] = []
DECIDED_OVER_LIES: list[bool] = []


def record(timeline: Timeline) -> None:
    """What `requiring_backfills` counts of one example's run with backfill."""
    BACKFILLED.append(bool(timeline.backfills))
    REWROTE.append(bool(timeline.rewrites))
    DECIDED_OVER_LIES.append(timeline.decided_over_lies > 0)


def requiring_backfills(prop: Callable[[], None]) -> None:
    """Run the @given property `prop`, then require that at least half of its examples backfilled a pod, that at
    least a quarter had a backfilled pod's runtime rewritten by its tenant while it ran (each rewrite is followed by a
    plan: the planner runs every simulated second, the rewrite's own first), and that a tenth had a plan weigh
    candidates while such a pod ran: a property of backfilled pods and lying tenants that met none tested nothing.
    (Measured over a dozen runs of each property: about 0.8, 0.6 and 0.5 of the examples, the least 0.69, 0.40 and
    0.30; the third was 0.19 once since, so its floor is a tenth.)"""
    for seen in (BACKFILLED, REWROTE, DECIDED_OVER_LIES):
        seen.clear()
    prop()
    n = len(BACKFILLED)
    assert sum(BACKFILLED) >= n / 2 > 0, f"{sum(BACKFILLED)} of {n} examples backfilled"
    assert sum(REWROTE) >= n / 4, f"{sum(REWROTE)} of {n} examples rewrote a running backfilled pod's runtime"
    decided = sum(DECIDED_OVER_LIES)
    assert decided >= n / 10, f"{decided} of {n} examples decided over a rewritten runtime"


def test_a_backfilled_pod_never_delays_an_owner() -> None:
    """Pods end exactly at their maximum runtime (backfilled ones at their deadline plus the margin). In most examples
    the tenants are hostile (issue 29): once a pod is backfilled, at seconds drawn for it, its tenant rewrites its
    `volcano.sh/maximum-runtime` (raised tenfold, a thousandfold or to 3 h, removed, or made 1 ms) while the kubelet
    still ends it at its deadline; the planner must go by what the tenant cannot stretch, the activeDeadlineSeconds
    and grace on the pod and the grant on its node (capacity.pod_end). With and without backfill every owner task
    binds at the same second; a window's node holds the same pods from its start on, a starvation lock's from its last
    task's binding on. The needed-by time is checked against the brute force: without backfill, the first waiting task
    binds at that second, and never when it is unknown; and nothing is backfilled on a node whose needed-by time is
    unknown. Most examples backfill a pod (`steered`), and many rewrite one's runtime while it runs, with plans after
    (`requiring_backfills`)."""
    requiring_backfills(never_delays)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steered())
def never_delays(scenario: Scenario) -> None:
    without = simulate(scenario, backfill=False)
    with_backfill = simulate(scenario, backfill=True)
    record(with_backfill)
    assert with_backfill.bound == without.bound
    assert with_backfill.first == without.first
    for spec in scenario.nodes:
        first = without.first[spec.name]
        binds = [without.bound.get((spec.name, i)) for i in range(len(spec.tasks))]
        if spec.window_start is not None:
            since: int | None = step(NOW + spec.window_start * S)
        else:
            since = max(b for b in binds if b is not None) if binds and None not in binds else None
        if since is not None:
            assert with_backfill.present[spec.name][since:] == without.present[spec.name][since:], spec.name
        if spec.window_start is None:
            views = node_states({spec.name: replace(node(spec.name), allocatable=Resources(
                {"cpu": spec.cpu * 1000, "memory": spec.memory * GI, "pods": 110}))}, [
                view(f"p{i}", spec.name, c, m, started=NOW - ago * S, runtime=r * S if r is not None else None)
                for i, (c, m, r, ago, _) in enumerate(spec.pods)])
            late = waiting_at_start(spec, views[spec.name])
            late_binds = [without.bound[(spec.name, i)] for i in late if (spec.name, i) in without.bound]
            if first is None:
                assert late_binds == [], "needed-by unknown, yet a waiting task bound"
                assert all(node_name != spec.name for _, node_name, _, _ in with_backfill.backfills)
            elif late and step(first) <= HORIZON:
                assert min(late_binds) == step(first), "the release curve agrees with the timeline"
    for candidate, node_name, _, _ in with_backfill.backfills:
        assert candidate.runtime is not None and not candidate.fits_unlocked and candidate.owns != node_name


def test_with_pods_ending_early_an_owner_still_fits_by_its_needed_by_time() -> None:
    """Pods may end before their maximum runtime, and pods without one may end at all: the owner may then fit sooner
    without backfill, and backfill may take that chance (as Slurm's does); but with backfill some waiting task of the
    owner still binds by the needed-by time computed at the start, and a window's node holds no backfilled pod from
    its start on, even when, as in most examples, the tenants of backfilled pods rewrite their declared runtimes
    after the backfill (raised, removed or made tiny, at drawn seconds: issue 29), the pods still ending by their
    deadlines. Most examples backfill a pod (`steered`), and many rewrite one's runtime while it runs, with plans
    after (`requiring_backfills`)."""
    requiring_backfills(fits_by_needed_by)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steered(early=True))
def fits_by_needed_by(scenario: Scenario) -> None:
    timeline = simulate(scenario, backfill=True)
    record(timeline)
    for spec in scenario.nodes:
        first = timeline.first[spec.name]
        if spec.window_start is not None:
            since = step(NOW + spec.window_start * S)
            backfilled = {c.name for c, node_name, _, _ in timeline.backfills if node_name == spec.name}
            assert all(not (names & backfilled) for names in timeline.present[spec.name][since:])
            continue
        if first is None or step(first) > HORIZON:
            continue
        views = node_states({spec.name: replace(node(spec.name), allocatable=Resources(
            {"cpu": spec.cpu * 1000, "memory": spec.memory * GI, "pods": 110}))}, [
            view(f"p{i}", spec.name, c, m, started=NOW - ago * S, runtime=r * S if r is not None else None)
            for i, (c, m, r, ago, real) in enumerate(spec.pods) if real is None or real > 0])
        late = waiting_at_start(spec, views[spec.name])
        if late:
            binds = [timeline.bound[(spec.name, i)] for i in late if (spec.name, i) in timeline.bound]
            assert binds and min(binds) <= step(first), (spec.name, first, binds)
    for _, _, second, needed in timeline.backfills:
        assert needed >= NOW + second * S


# --- clause 3 over many nodes: OpenNodes' index gives the walk over every node's answer ---


def reference_open_fits(candidates: list[Candidate], states: dict[str, NodeState],
                        locks: dict[str, Lock]) -> list[bool]:
    """Clause 3 as open_fits' docstring words it, walking every node by name for every candidate: the first node,
    by name, that is schedulable, open to the candidate (no lock, or one it owns), whose idle less what the candidates
    before took covers it, and whose filters let it on with their pods counted."""
    used: dict[str, Resources] = {}
    answers = []
    for candidate in sorted(candidates, key=lambda c: (c.pod.created, c.pod.key)):
        pod_ = candidate.pod
        found = None
        for name in sorted(states):
            state, lock = states[name], locks.get(name)
            if not schedulable(state.node) or (lock is not None and lock.owner not in candidate.owns):
                continue
            taken = used.get(name, EMPTY)
            if (state.idle - taken).covers(pod_.requests) and schedulable_on(
                    pod_.placement, state.node, pods_on_node=len(state.pods) + taken[PODS], ignore_lock=True):
                found = name
                break
        if found is not None:
            used[found] = used.get(found, EMPTY) + pod_.requests
        answers.append(found is not None)
    return answers


def gpu_node(name: str, cpu: int, gpus: int, zone: str, pods: int, cordoned: bool) -> NodeView:
    allocatable = {"cpu": str(cpu), "memory": "64Gi", "pods": str(pods)}
    if gpus:
        allocatable[keys.GPU_RESOURCE] = str(gpus)
    return NodeView.from_obj({"metadata": {"name": name, "labels": {"zone": zone},
                                           "creationTimestamp": stamp(NOW - timedelta(days=1))},
                              "spec": {"unschedulable": cordoned}, "status": {"allocatable": allocatable}})


def gpu_pod(name: str, cpu: int, gpus: int, *, node_name: str = "", zone: str | None = None,
            age: int = 60) -> PodView:
    requests = {"cpu": str(cpu), "memory": "1Gi"}
    if gpus:
        requests[keys.GPU_RESOURCE] = str(gpus)
    return PodView.from_obj({
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                     "creationTimestamp": stamp(NOW - age * S)},
        "spec": {"nodeName": node_name, "nodeSelector": {"zone": zone} if zone else {},
                 "containers": [{"name": "c", "resources": {"requests": requests}}]},
        "status": {"phase": "Running" if node_name else "Pending"}})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_open_fits_is_the_walk_over_every_node(data: st.DataObject) -> None:
    """Nodes of several shapes (GPUs or none, two zones, some cordoned, some locked, few pod slots), pods running on
    them, candidates asking for GPUs or not, some pinned to a zone, some owning a lock: open_fits answers as the walk
    over every node does, candidates sharing the idle room in order."""
    from agent.planner.backfill import open_fits

    count = data.draw(st.integers(1, 12), label="nodes")
    views = {}
    running: list[PodView] = []
    for i in range(count):
        name = f"n{i:02d}"
        gpus = data.draw(st.sampled_from([0, 1, 2, 4, 8]))
        views[name] = gpu_node(name, data.draw(st.integers(1, 16)), gpus, data.draw(st.sampled_from("ab")),
                               data.draw(st.integers(1, 4)), data.draw(st.booleans().map(lambda b: b and i % 5 == 4)))
        for j in range(data.draw(st.integers(0, 2))):
            running.append(gpu_pod(f"r{i}-{j}", data.draw(st.integers(0, 4)), data.draw(st.integers(0, gpus)),
                                   node_name=name))
    states = node_states(views, running)
    owners = ["job-a", "job-b"]
    locks = {name: job_lock(name, owner=data.draw(st.sampled_from(owners)))
             for name in views if data.draw(st.integers(0, 3)) == 0}
    candidates = [Candidate(gpu_pod(f"c{k}", data.draw(st.integers(0, 6)), data.draw(st.sampled_from([0, 1, 2, 4, 8])),
                                    zone=data.draw(st.sampled_from([None, "a", "b"])),
                                    age=data.draw(st.integers(1, 9))),
                            timedelta(seconds=30), owns=frozenset(data.draw(st.sets(st.sampled_from(owners)))))
                  for k in range(data.draw(st.integers(1, 10)))]
    got = [c.fits_unlocked for c in open_fits(candidates, states, locks)]
    assert got == reference_open_fits(candidates, states, locks)


def test_open_fits_checks_a_node_once_per_shape_and_stops_at_the_first_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work counted, not timed: 100 gated pods of one shape that fits nowhere on 500 CPU nodes cost one check per
    node, not one per node and pod (the review of the first OpenNodes walked every node for each pod); a shape that
    fits the first node costs one check however many nodes follow."""
    from agent.planner import backfill

    checks: list[str] = []
    real = backfill.fits_idle

    def counted(state: NodeState, pod_: PodView, placement: object, kept: str) -> bool:
        checks.append(state.node.name)
        return real(state, pod_, placement, kept)  # type: ignore[arg-type]

    monkeypatch.setattr(backfill, "fits_idle", counted)
    views = {f"n{i:03d}": gpu_node(f"n{i:03d}", 8, 0, "a", 110, False) for i in range(500)}
    states = node_states(views, [])
    big = [Candidate(gpu_pod(f"big{k}", 64, 0), timedelta(seconds=30)) for k in range(100)]
    assert not any(c.fits_unlocked for c in backfill.open_fits(big, states, {}))
    assert len(checks) == 500
    checks.clear()
    small = [Candidate(gpu_pod("small", 1, 0), timedelta(seconds=30))]
    assert [c.fits_unlocked for c in backfill.open_fits(small, states, {})] == [True] and checks == ["n000"]
