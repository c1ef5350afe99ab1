"""`reservoir simulate`: the replay of `make bench-trace` as a deterministic discrete-event simulation in one process,
no Kubernetes: a model of kube-scheduler places the pods, and Reservoir's own code decides everything Reservoir
decides (the webhook's mutation, the planner's plans and gate passes, the writer's patches).

What is Reservoir's own code here, called as is (nothing of its rules is copied):
- the webhook: `webhook.mutate.mutate_pod` on each pod at its creation (its tolerations of the pod's own locks, its
  preferred node affinity to them, the backfill gate when some locked node's noted room takes the pod in time), with
  the webhook's read model (`webhook.lookup.Lookup`) built from the simulated nodes;
- the agent: `agent.planner.plan.plan(snapshot, config, now, current=..., previous=...)` for each reconcile and
  `plan.plan_gate` for each gate pass, on a `Snapshot` of `shared.views` views of the simulated objects (the pods
  through an incrementally updated `PodIndex`, as the agent keeps it), reading its own locks back with
  `current_locks(snapshot)`;
- the writer: `agent.writer`'s pure bodies (`node_patch` for each lock and node mark, `narrow_patch`, `deadline_patch`,
  `ungate_patch` for backfill, `repair_patch`), applied with `shared.jsonpatch.apply` to the objects' JSON, in the
  order `Writer.write` and `Writer.write_gate` send them;
- the objects: the same node and pod bodies `make bench-trace` creates (`bench/trace/run.py` `node_body`, `pod_body`;
  the arms' configs from `run.arm_config`), with what the API server and kwok add (uid, creationTimestamp to the
  second, priority 0, the DefaultTolerationSeconds tolerations; the binding's nodeName, Running with a startTime to the
  second, Succeeded after the pod's runtime: localcluster's kwok stages end a pod with `complete-after` at its runtime
  and ignore its activeDeadlineSeconds, so a cut deadline ends nothing here either).
agent/writer.py and bench/trace/run.py import the Kubernetes client and aiohttp; they are imported when an arm
starts, not with this module, so the engine imports without them.

The agent's cadence (agent/controller.py, `Agent.reconcile_loop` and `gate_loop`), in simulated time:
- a plan when the resync period passes (counted from the last resync: changes do not push it back), at the moment the
  last plan named (`Plan.wake_at`, + 0.05 s), and after a change: any pod or node change the agent's caches would see
  (a pod created, found unschedulable, bound, ended, patched; a node patched, by the agent itself too), planned
  SETTLE (0.1 s) after it, and at least `debounce` after the start of the last change-driven plan;
- a gate pass SETTLE after a pod arrives on the backfill gate, passes at least GATE_GAP (0.1 s) apart, on the last
  plan (none before the first plan, none once a moment the last plan named has passed, as `Agent.gate_pass`);
- the agent starts 10 s before the first arrival (bench-trace lets it see the nodes for 10 s), plans take no time and
  its writes land at the plan's moment: the planner's locks become taints at the plan moment, its backfill grants and
  ungated pods too. A `dryRun` config plans nothing here (its writer writes nothing and its webhook gates nothing).
The first column, kube-scheduler alone, has no Reservoir at all (bench-trace installs it in dryRun there: its webhook
then adds each pod's own lock toleration and preference, which no lock ever meets, so the placements are the same).
Arms share nothing and may run in processes side by side (`simulate(..., jobs=N)`): the result does not depend on it.

The kube-scheduler model:
- filters: NodeResourcesFit (cpu, memory, nvidia.com/gpu, pods) and the project's one predicate
  (`shared.predicates.schedulable_on`: nodeName, nodeSelector, required node affinity, taints and tolerations);
- scores: NodeResourcesFit LeastAllocated (cpu and memory, weight 1 each) and NodeResourcesBalancedAllocation (cpu and
  memory; from 1.36 the change the pod makes to the node's balance, before it the balance with the pod: `node_score`,
  `--kubernetes` for another version than bench-trace's), plugin weight 1 each, in kube-scheduler's integer arithmetic
  (`placement_agreement` checks them against a replay's binds, one at a time); NodeAffinity's preferred terms (plugin
  weight 2, normalised to 100), which only the webhook's preference for a pod's own locked nodes gives here; and
  TaintToleration (plugin weight 3: the PreferNoSchedule taints a pod does not tolerate, reversed and normalised to
  100), which only Reservoir's soft-drain taint (keys.DRAIN) gives here; the other default scores are the same on
  every node of such a cluster (no images, no topology spread or inter-pod affinity on these pods) and are left out;
- `percentageOfNodesToScore` adaptive: all nodes under 100, else (50 - nodes/125)% (at least 5%) of them, at least
  100; the search starts where the last one stopped (nextStartNodeIndex);
- the highest total wins, ties broken as selectHost does (reservoir sampling) with a seeded random.Random;
- the queue, as kube-scheduler 1.33 and later keep it (SchedulerPopFromBackoffQ, QueueingHints): a pod created (or
  ungated, or its spec changed) goes to the active queue, ordered by PrioritySort (priority, then its queue
  timestamp); one that fits nowhere is parked (unschedulablePods) with its failures counted, its timestamp refreshed
  and its backoff set (1 s doubling to 10 s, the expiry aligned to 1-s windows); when a pod ends every parked pod
  (NodeResourcesFit's hint for a deleted pod), and when a node changes (a lock, a grant) the parked pods it now takes,
  go to the backoff queue while their backoff has not ended, else to the active queue; the backoff queue's pods whose
  window has passed move to the active queue (its flush), and when the active queue is empty the scheduler pops the
  backoff queue's head (earliest expiry, then PrioritySort). So the waiting pods that failed fewest times are tried
  first and a pod just created before all of them.
- each attempt takes ATTEMPT_SECONDS (1.14 ms, kube-scheduler's own attempt duration in a replay); the scheduler tries
  one pod after another until the queues are empty, events (arrivals, ends, the agent's writes) coming in between;
- after a failed attempt the loop itself PATCHes the pod's PodScheduled condition (handleSchedulingFailure, 1.36) when
  its message changed: the first failure always, a later one when the count of some reason over the nodes did
  (`Scheduler.reasons`: the message counts, over every node, why the pod does not fit there); the loop waits for
  its client's rate limit (50 a second, bursts of 100, shared with the bindings) and PATCH_SECONDS (9.7 ms, measured)
  more. While it waits, pods arrive in the active queue, and they go before those the backoff queue holds: the
  crowding of a full GPU pool by later pods that the queue alone did not give (docs/design/benchmarks.md, "Why
  kube-scheduler's loop is slower than its attempts": 4,630 PATCHes in the model and 4,522 in the replay the API
  server's audit log counted, at that replay's measured timings).

Departures, each to be measured against the real replay (bench-trace's own table):
- the queue was first in, first out before this model (the waiting pods in the order they last failed, tried at the
  next change, in no time): on a default replay (bench-trace, kube-scheduler alone) a T4 pod was bound to a T4 node
  while an older T4 pod of one GPU or less waited 560 times, 0 times in that model, 533 in this one; that model's
  8-GPU and 4-GPU p95 were 197 and 299 s against the replay's 334 and 436 s, this one's 264 and 433 s. What is left:
  pods that name no GPU model took a T4 GPU an older T4 pod waited for 39 times in that replay, twice here (the sweep
  after an end reaches a fitting T4 pod sooner here than there: bind calls and event handling take time this model
  does not have), so the T4 pool is less crowded here and its pods' p95 waits lower (1 GPU 29 s against 54 s). The
  status PATCHes, modelled since, give part of it back: 5 to 11 such pods at the alone replay's timings (9.7 and
  9.8 ms a PATCH), against 19 in that replay;
- queueing hints coarsely: every parked pod moves after any pod ends, only those a changed node now takes after a
  node change; no event during an attempt sends the pod straight back to a queue (it is parked), no 5-minute flush;
- no latency but the scheduler's attempts and status PATCHes: the webhook, the planner, the writer, the watch caches,
  binding and kwok are instantaneous (bench-trace measured 0.1 s of gate delay at p50, and the agent's `caught_up`
  waits are moot; from bind to end a replayed pod held its node 0.04 s longer than its runtime on average);
  kube-scheduler's FailedScheduling events go through another client, off its loop, and are left out;
- the filter search is sequential from nextStartNodeIndex (kube-scheduler searches in parallel chunks and so finds
  a slightly different first set of feasible nodes when it stops early);
- a single scheduling profile, no preemption (every trace pod has priority 0), no nominated nodes;
- the validating webhook (pod-locks check) is not run: the only writers of pods are the webhook model, the scheduler
  and the agent's own bodies.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, TextIO

import numpy as np

from agent.planner.model import BackfillPlan, Lock, Plan, Snapshot
from agent.planner.plan import current_locks, plan, plan_gate
from agent.planner.podindex import PodIndex
from bench.trace import report, trace
from shared import keys
from shared.config import ReservoirConfig
from shared.jsonpatch import Op
from shared.jsonpatch import apply as apply_patch
from shared.ownership import JobRef
from shared.predicates import (
    NodeAffinity,
    Placement,
    node_selector,
    required_node_affinity,
    schedulable_on,
    selected_by,
    tolerations_allow,
)
from shared.resources import CPU, MEMORY, PODS, Resources, pod_requests
from shared.timestamps import stamp
from shared.tolerations import tolerates_taint
from shared.tracecsv import REPLAY_SETTING
from shared.views import NodeView, PodView, Taint
from webhook.lookup import Lookup
from webhook.mutate import mutate_pod

GPU = keys.GPU_RESOURCE
MODELLED = frozenset((CPU, MEMORY, GPU, PODS))  # the resources NodeResourcesFit is modelled on
# the simulated clock's zero: the first arrival. Any fixed moment would do; the planner reads only differences.
EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
AGENT_LEAD = 10.0  # seconds the agent runs before the first arrival (run.py sleeps 10 s after the nodes are Ready)
SAMPLE_SECONDS = 1.0  # bench/trace/run.py SAMPLE_SECONDS
CHECK_SECONDS = 5.0  # run.py's arm loop: whether every pod is bound, every 5 s after the last arrival
# agent/controller.py SETTLE and GATE_GAP (tests/unit/test_simulate.py checks they agree)
SETTLE = 0.1
GATE_GAP = 0.1
WAKE_SLACK = 0.05  # Agent.next_wait: a plan for a moment the last plan named comes this long after it
MAX_ESTIMATE_WRITES = 100  # agent/writer.py MAX_ESTIMATE_WRITES (checked by the tests too)
# kube-scheduler: MaxNodeScore, and the default plugin weights of the scores modelled
MAX_NODE_SCORE = 100
NODE_AFFINITY_WEIGHT = 2
TAINT_TOLERATION_WEIGHT = 3  # kube-scheduler's default profile: TaintToleration's score plugin weight
PREFER_NO_SCHEDULE = "PreferNoSchedule"
MIN_FEASIBLE_NODES = 100  # minFeasibleNodesToFind
# the kube-scheduler modelled: the minor of localcluster/versions.env's KUBERNETES_VERSION, the one make bench-trace
# runs (tests/unit/test_simulate.py checks they agree); `reservoir simulate --kubernetes 1.N` models another
KUBERNETES_MINOR = 36
BALANCE_CHANGE_MINOR = 36  # NodeResourcesBalancedAllocation scores the change in balance from 1.36 (node_score)
MIN_FEASIBLE_PERCENT = 5  # minFeasibleNodesPercentageToFind
PROGRESS_SECONDS = 3.0  # wall-clock seconds between progress lines
# label keys whose nodes Scheduler.labelled keeps (a recording's pods may prefer any keys: past this many, a pod
# whose terms read another is asked of every node, as before)
MAX_LABEL_KEYS = 1024
NO_TOLERATION_SECONDS = 300  # the DefaultTolerationSeconds admission plugin's not-ready / unreachable tolerations
# kube-scheduler's queue (Scheduler, "the queue" in the module docstring): podInitialBackoffSeconds and
# podMaxBackoffSeconds (1 and 10 by default), the backoff queue's ordering window (1 s, SchedulerPopFromBackoffQ)
INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 10.0
BACKOFF_WINDOW = 1.0
# what one scheduling attempt and one status PATCH take kube-scheduler, both read from its own metrics at the end of a
# replay of the alone arm (1.36.3, a5a47f6): scheduler_scheduling_attempt_duration_seconds, 1.14 ms for an attempt
# that failed (138.3 s over 120,990; most attempts fail); rest_client_request_duration_seconds less
# rest_client_rate_limiter_duration_seconds for its PATCHes, 9.7 ms (87.8 s over 9,051: the status PATCHes and the
# event series', which its client metrics do not tell apart; the API server's audit log of another replay put the
# status ones at 0.86 times the mean on the server). With both, the model makes 124,905 attempts for that arm, the
# replay 124,868; without the PATCHes 132,028, and at the 0.46 ms an earlier replay read 166,842.
# docs/design/benchmarks.md, "Why kube-scheduler's loop is slower than its attempts".
ATTEMPT_SECONDS = 0.00114
# the timings, as factors of Timing(), the model is run at again to show its own spread (timing_spread): 4% apart,
# each enough to change which pod takes which freed room
TIMING_SPREAD = (0.92, 0.96, 1.04, 1.08)
# kube-scheduler's client (KubeSchedulerConfiguration clientConnection's defaults): 50 requests a second in bursts of
# up to 100, one token bucket for the status patches its scheduling loop makes and the bindings it makes beside it
CLIENT_QPS = 50.0
CLIENT_BURST = 100
PATCH_SECONDS = 0.0097


class Timing(NamedTuple):
    """What kube-scheduler's loop spends: each scheduling attempt, and each status PATCH after a failed one whose
    message changed (None: the PATCH not modelled, the loop going on at once)."""

    attempt: float = ATTEMPT_SECONDS
    patch: float | None = PATCH_SECONDS

    def scaled(self, factor: float) -> Timing:
        """Both a little shorter or longer, as a slower or faster machine has them (timing_spread)."""
        return Timing(self.attempt * factor, None if self.patch is None else self.patch * factor)


DEFAULT_TIMING = Timing()


class SimulationError(ValueError):
    """An input the simulation cannot model: the message names the object, the field, the value and what would do."""


@dataclass(frozen=True)
class ArmSpec:
    """One column of the result: its name, its config (None: kube-scheduler alone, no Reservoir at all) and the
    namespace its pods are created in (a backfill config must name it, or `*`)."""

    name: str
    config: ReservoirConfig | None
    namespace: str


def default_arms() -> list[ArmSpec]:
    """bench-trace's three arms, with its own configs (run.arm_config): kube-scheduler alone, starvation locks, and
    the same with backfill."""
    from bench.trace.run import arm_config
    from shared.config import load_config

    arms = [ArmSpec("alone", None, "trace-alone")]
    for name in ("starvation", "backfill"):
        namespace = f"trace-{name}"
        arms.append(ArmSpec(name, load_config(arm_config(name, namespace)), namespace))
    return arms


def feasible_nodes_to_find(nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with the adaptive percentageOfNodesToScore: every node under 100;
    else (50 - nodes/125)%, at least 5%, of the nodes, and at least 100."""
    if nodes < MIN_FEASIBLE_NODES:
        return nodes
    percent = max(MIN_FEASIBLE_PERCENT, 50 - nodes // 125)
    return max(MIN_FEASIBLE_NODES, nodes * percent // 100)


def balance(cpu: Any, cpu_capacity: Any, memory: Any, memory_capacity: Any) -> Any:
    """kube-scheduler's balancedResourceScore of a node whose pods request `cpu` and `memory`: each requested
    fraction capped at 1, std = |f_cpu - f_memory| / 2 (the mean square formula for two resources; a resource the node
    has none of is left out, and with one left std is 0), int((1 - std) * 100): 50 to 100. Over numbers or numpy
    arrays of them, element by element, in float64 as Go computes it (quantities are far below 2**53: exact)."""
    cpu_capacity, memory_capacity = np.asarray(cpu_capacity), np.asarray(memory_capacity)
    both = (cpu_capacity > 0) & (memory_capacity > 0)
    cpu_part = np.minimum(1.0, np.asarray(cpu) / np.where(both, cpu_capacity, 1))
    memory_part = np.minimum(1.0, np.asarray(memory) / np.where(both, memory_capacity, 1))
    std = np.abs((cpu_part - memory_part) / 2)
    return np.where(both, ((1 - std) * MAX_NODE_SCORE).astype(np.int64), MAX_NODE_SCORE)


def node_score(cpu: Any, cpu_capacity: Any, memory: Any, memory_capacity: Any, *, pod_cpu: Any = 0,
               pod_memory: Any = 0, minor: int = KUBERNETES_MINOR) -> Any:
    """NodeResourcesFit LeastAllocated plus NodeResourcesBalancedAllocation (plugin weight 1 each) of a node whose pods,
    the one being scheduled with them, request `cpu` and `memory` (`pod_cpu` and `pod_memory` of them the pod's), in
    the arithmetic of kube-scheduler 1.`minor`; over numbers or numpy arrays of them (one node each), element by
    element:
    - LeastAllocated per resource (capacity - requested) * 100 / capacity, integer division (0 when the node has none
      of it or the request passes it), then (cpu + memory) / 2 (weight 1 each), integer division;
    - BalancedAllocation, from 1.36 (kubernetes#135573): the change the pod makes to the node's balance, 50 + (50 +
      balance with the pod - balance without it) / 2, integer division (`balance`); before 1.36 the balance with the
      pod alone. Told apart by the replay itself (placement_agreement): the 1.36 formula puts 94% of a bench-trace
      run's binds where 1.36's kube-scheduler put them, the older one 78% (docs/design/benchmarks.md)."""
    cpu, memory = np.asarray(cpu, dtype=np.int64), np.asarray(memory, dtype=np.int64)
    cpu_capacity = np.asarray(cpu_capacity, dtype=np.int64)
    memory_capacity = np.asarray(memory_capacity, dtype=np.int64)
    least_cpu = np.where((cpu_capacity > 0) & (cpu <= cpu_capacity),
                         (cpu_capacity - cpu) * MAX_NODE_SCORE // np.maximum(cpu_capacity, 1), 0)
    least_memory = np.where((memory_capacity > 0) & (memory <= memory_capacity),
                            (memory_capacity - memory) * MAX_NODE_SCORE // np.maximum(memory_capacity, 1), 0)
    balanced = balance(cpu, cpu_capacity, memory, memory_capacity)
    if minor >= BALANCE_CHANGE_MINOR:
        before = balance(cpu - pod_cpu, cpu_capacity, memory - pod_memory, memory_capacity)
        balanced = MAX_NODE_SCORE // 2 + (MAX_NODE_SCORE // 2 + balanced - before) // 2
    return (least_cpu + least_memory) // 2 + balanced


class Agreement(NamedTuple):
    """placement_agreement's count for one class: binds whose node scored highest (`top`), of them those where no other
    node scored as high (`alone`), and the binds counted (`binds`)."""

    top: int
    alone: int
    binds: int


def placement_agreement(records: Iterable[report.PodRecord], pods: Mapping[str, trace.ReplayPod],
                        nodes: Mapping[str, trace.NodeRow], *, minor: int = KUBERNETES_MINOR,
                        max_pods: int = 110) -> dict[str, Agreement]:
    """The scheduler model's scores held against the choices of a real kube-scheduler, one bind at a time: replaying
    the binds and ends of `records` (a run of kube-scheduler alone: no taints, no preferences), for each bind the
    nodes that could take the pod at that moment (GPUs, cpu, memory, `max_pods`, its GPU models) scored by node_score
    as kube-scheduler 1.`minor` would; per class, an Agreement. Independent of the queue: it asks only whether the
    model would have put the pod where the real scheduler did, given what ran where. A bind with more such nodes
    than kube-scheduler's search scores (`feasible_nodes_to_find`: 100 of 152 nodes) is left out: the node it chose
    need not be the best of all. A node that scores highest beside others counts as agreeing (kube-scheduler breaks
    such ties at random); `alone` counts the binds where it had no tie."""
    events: list[tuple[float, int, str, str]] = []
    for r in records:
        if r.bound is None or r.node not in nodes or r.name not in pods:
            continue
        events.append((r.bound, 1, r.name, r.node))
        if r.ended is not None:  # at one moment ends come before binds, but a pod's own end after its bind
            events.append((r.ended, 2 if r.ended <= r.bound else 0, r.name, r.node))
    events.sort()
    searched = feasible_nodes_to_find(len(nodes))
    names = list(nodes)
    at = {name: i for i, name in enumerate(names)}
    rows = list(nodes.values())
    cpu = np.array([r.cpu_milli for r in rows], dtype=np.int64)
    memory = np.array([r.memory_mib for r in rows], dtype=np.int64)
    gpus = np.array([r.gpu for r in rows], dtype=np.int64)
    models = np.array([r.model for r in rows], dtype=object)
    used = np.zeros((4, len(rows)), dtype=np.int64)  # cpu, memory MiB, GPUs, pods
    counts: dict[str, list[int]] = {}
    for _, kind, name, node in events:
        pod = pods[name]
        bind = kind == 1
        if bind:
            room = ((gpus - used[2] >= pod.gpus) & (cpu - used[0] >= pod.cpu_milli)
                    & (memory - used[1] >= pod.memory_mib) & (used[3] < max_pods))
            if pod.gpu_models:
                room &= np.isin(models, list(pod.gpu_models))
            could = np.flatnonzero(room)
            if len(could) <= searched:
                scores = node_score(used[0, could] + pod.cpu_milli, cpu[could], used[1, could] + pod.memory_mib,
                                    memory[could], pod_cpu=pod.cpu_milli, pod_memory=pod.memory_mib, minor=minor)
                tally = counts.setdefault(pod.klass, [0, 0, 0])
                best = scores.max(initial=-1)
                mine = np.flatnonzero(could == at[node])
                # a node the model finds no room on never agrees
                top = bool(len(mine)) and bool(scores[mine[0]] == best)
                tally[0] += top
                tally[1] += top and int((scores == best).sum()) == 1
                tally[2] += 1
        sign = 1 if bind else -1
        i = at[node]
        used[0, i] += sign * pod.cpu_milli
        used[1, i] += sign * pod.memory_mib
        used[2, i] += sign * pod.gpus
        used[3, i] += sign
    return {klass: Agreement(*tally) for klass, tally in counts.items()}


def agreement_line(records: Iterable[report.PodRecord], pods: Mapping[str, trace.ReplayPod],
                   nodes: Mapping[str, trace.NodeRow]) -> str:
    """placement_agreement of kube-scheduler alone's binds, every class, with the scores of the modelled
    kube-scheduler and of the one before NodeResourcesBalancedAllocation changed (1.35)."""
    kept = list(records)
    shares = []
    for minor in (KUBERNETES_MINOR, BALANCE_CHANGE_MINOR - 1):
        tally = placement_agreement(kept, pods, nodes, minor=minor).values()
        shares.append((minor, sum(a.top for a in tally), sum(a.alone for a in tally), sum(a.binds for a in tally)))
    (now, top, alone, total), (before, top_before, _, _) = shares
    return (f"placement agreement (kube-scheduler alone): the model's scores put the pod on the node kube-scheduler "
            f"chose for {top} of {total} binds ({top / max(total, 1):.0%}; {alone} with no other node scoring as "
            f"high) as 1.{now} scores; {top_before} ({top_before / max(total, 1):.0%}) as 1.{before} did")


# --- the kube-scheduler model ------------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class SchedNode:
    """A node as the scheduler's cache holds it: its place in Scheduler.nodes, its view (labels, taints), allocatable
    and what is free of it (Scheduler keeps the same figures in arrays over every node: take, give_back, set_view)."""

    index: int
    name: str
    view: NodeView
    cpu: int
    memory: int
    gpus: int
    pods: int
    free_cpu: int = 0
    free_memory: int = 0
    free_gpus: int = 0
    free_pods: int = 0
    # its PreferNoSchedule taints, the ones TaintToleration scores
    prefer: tuple[Taint, ...] = ()

    def __post_init__(self) -> None:
        self.free_cpu, self.free_memory, self.free_gpus, self.free_pods = self.cpu, self.memory, self.gpus, self.pods
        self.prefer = tuple(t for t in self.view.taints if t.effect == PREFER_NO_SCHEDULE)


@dataclass(eq=False, slots=True)
class Queued:
    """A pod in kube-scheduler's queue: its requests, its filters (`static_id` names its nodeSelector and required
    node affinity), its preferred node affinity terms (with the label keys they read), its priority and queue
    timestamp (refreshed at each failed attempt), and its place in the queue (Scheduler.push, step)."""

    name: str
    cpu: int
    memory: int
    gpus: int
    placement: Placement
    static_id: int
    preferred: tuple[tuple[int, NodeAffinity], ...]
    preferred_keys: frozenset[str]
    priority: int
    stamp: float
    # a preferred term may match a node with none of `preferred_keys` (NotIn, DoesNotExist, matchFields alone)
    prefers_unlabelled: bool = False
    fresh: bool = True  # not tried since it entered the queue or its spec changed: tried on every node
    unschedulable: bool = False  # its PodScheduled=False condition is written
    failures: int = 0  # UnschedulableCount: its backoff doubles with each
    expiry: float = -math.inf  # when its backoff ends, aligned to the ordering window
    seen: int = 0  # Scheduler.gains as far as its last attempt looked
    entry: int = 0  # its current entry in the active or backoff heap (older entries are stale)
    reasons: tuple[int, ...] = ()  # what its PodScheduled condition's message says (Scheduler.reasons); () unwritten
    # Scheduler.reasons' own: the nodes the filters before NodeResourcesFit let it onto, the counts of the others and
    # the Scheduler.views they were made at (-1: never), and its requests as a column to compare with Scheduler.free
    passed: np.ndarray | None = None
    filters: tuple[int, ...] = ()
    filtered: int = -1
    need: np.ndarray | None = None


_REQUESTS: dict[str, Resources] = {}  # pod_requests by the pod's resource fields (a quantity parses slowly)


def requests_of(spec: Mapping[str, Any]) -> Resources:
    """shared.resources.pod_requests (the effective request as kube-scheduler computes it), kept by the fields it
    reads."""
    key = json.dumps([spec.get(k) for k in ("containers", "initContainers", "overhead", "resources")],
                     sort_keys=True, default=str)
    found = _REQUESTS.get(key)
    if found is None:
        found = _REQUESTS[key] = pod_requests(spec)
    return found


class TokenBucket:
    """client-go's client-side rate limit (flowcontrol's token bucket, golang.org/x/time/rate): `qps` tokens a second
    up to `burst` held; each request takes the next token, waiting until it is due when none is left."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps, self.burst = qps, burst
        self.tokens = float(burst)
        self.last = -math.inf

    def wait(self, now: float) -> float:
        """A request made at `now` takes a token: how long it waits for it."""
        if now > self.last:
            self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.qps)
            self.last = now
        self.tokens -= 1
        return max(0.0, -self.tokens / self.qps)


class Scheduler:
    """kube-scheduler as the module docstring models it: its queue (active, backoff, unschedulable), one pod at a
    time, each attempt taking timing.attempt and each change of a failed pod's PodScheduled message its status
    PATCH (timing.patch after its client's rate limit); no bind or event latency."""

    def __init__(self, views: Sequence[NodeView], rng: random.Random, minor: int = KUBERNETES_MINOR,
                 timing: Timing = DEFAULT_TIMING) -> None:
        self.minor = minor  # the Kubernetes minor whose scores are modelled (node_score)
        self.timing = timing  # what each attempt and each status PATCH take (step)
        self.client = TokenBucket(CLIENT_QPS, CLIENT_BURST)  # the rate limit its PATCHes and bindings share
        self.patches = 0  # status PATCHes made
        self.stalled = 0.0  # seconds the loop spent on them
        self.clock = -math.inf  # when the attempt under way ends
        self.active: list[tuple[Any, ...]] = []  # activeQ: (-priority, timestamp, seq, name)
        self.backoff: list[tuple[Any, ...]] = []  # backoffQ: (expiry, -priority, timestamp, seq, name)
        self.parked: dict[str, None] = {}  # unschedulablePods, in the order they were parked
        self.gains: list[SchedNode] = []  # the nodes that gained room or changed, in order (Queued.seen indexes it)
        self.nodes: list[SchedNode] = []
        for i, view in enumerate(views):
            alloc = view.allocatable
            self.nodes.append(SchedNode(i, view.name, view, alloc[CPU], alloc[MEMORY], alloc[GPU], alloc[PODS]))
        self.by_name = {n.name: n for n in self.nodes}
        # the same figures over every node, in Scheduler.nodes' order, for the search and the scores (attempt, score)
        self.cpu = np.array([n.cpu for n in self.nodes], dtype=np.int64)
        self.memory = np.array([n.memory for n in self.nodes], dtype=np.int64)
        self.free = np.array([[n.free_cpu for n in self.nodes], [n.free_memory for n in self.nodes],
                              [n.free_gpus for n in self.nodes], [n.free_pods for n in self.nodes]],
                             dtype=np.int64).reshape(4, len(self.nodes))
        self.tainted = np.zeros(len(self.nodes), dtype=bool)  # with taints, schedulable: the predicate at each try
        self.plain = np.zeros(len(self.nodes), dtype=bool)  # neither tainted nor cordoned: the static answer holds
        self.preferring = np.zeros(len(self.nodes), dtype=bool)  # with PreferNoSchedule taints (TaintToleration)
        self.cordoned = np.zeros(len(self.nodes), dtype=bool)  # spec.unschedulable (NodeUnschedulable)
        # per placement id, NodeName's and NodeAffinity's answer (selected_by) on every node: 1 or 0, -1 not asked yet
        self.selected: dict[int, np.ndarray] = {}
        self.views = 0  # bumped at each change of a node's object (set_view)
        # per placement id, the static filters' answer (nodeSelector, required node affinity) on each plain node: 1
        # or 0, -1 not asked yet; 0 on the others
        self.static: dict[int, np.ndarray] = {}
        # per label key a preferred node affinity term read (at most MAX_LABEL_KEYS), the nodes labelled with it
        self.labelled: dict[str, np.ndarray] = {}
        self.queue: dict[str, Queued] = {}
        self.start = 0  # nextStartNodeIndex
        self.to_find = feasible_nodes_to_find(len(self.nodes))
        self.rng = rng
        self.seq = 0
        self.attempts = 0
        self.static_ids: dict[tuple[Any, ...], int] = {}
        for node in self.nodes:
            self.set_view(node.name, node.view)

    def set_view(self, name: str, view: NodeView) -> None:
        """The node's object changed (a lock, a label, a cordon): its filters are asked again."""
        node = self.by_name[name]
        node.view = view
        node.prefer = tuple(t for t in view.taints if t.effect == PREFER_NO_SCHEDULE)
        i = node.index
        self.tainted[i] = bool(view.taints) and not view.unschedulable
        self.plain[i] = not view.taints and not view.unschedulable
        self.preferring[i] = bool(node.prefer)
        self.cordoned[i] = view.unschedulable
        self.views += 1
        for answers in self.static.values():
            answers[i] = -1 if self.plain[i] else 0
        for answers in self.selected.values():
            answers[i] = -1
        for key, having in self.labelled.items():
            having[i] = key in view.labels

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def queued(self, obj: Mapping[str, Any], stamp_at: float) -> Queued:
        """The scheduler's view of a pod's JSON: its requests, the placement the one predicate reads, its preferred
        node affinity terms, its priority; in the queue at `stamp_at`."""
        meta, spec = obj["metadata"], obj["spec"]
        requests = requests_of(spec)
        other = sorted(set(requests) - MODELLED)
        if other:
            raise SimulationError(f"pod {meta['name']}: requests {', '.join(other)}: the scheduler model counts only "
                                  f"{', '.join(sorted(MODELLED))}")
        placement = Placement.of(node_selector=spec.get("nodeSelector") or {}, affinity=required_node_affinity(spec),
                                 tolerations=spec.get("tolerations") or ())
        static = (tuple(sorted(placement.node_selector.items())), placement.affinity)
        static_id = self.static_ids.setdefault(static, len(self.static_ids))
        preferred: list[tuple[int, NodeAffinity]] = []
        label_keys: set[str] = set()
        node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
        for term in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ():
            compiled = node_selector({"nodeSelectorTerms": [term.get("preference") or {}]})
            weight = term.get("weight")
            if compiled is not None and isinstance(weight, int) and weight > 0:
                preferred.append((weight, compiled))
                label_keys.update(r.key for t in compiled.terms for r in t.labels)
        priority = int(spec.get("priority") or 0)
        unlabelled = any(all(r.holds({}) for r in term.labels) for _, compiled in preferred for term in compiled.terms)
        return Queued(name=meta["name"], cpu=requests[CPU], memory=requests[MEMORY], gpus=requests[GPU],
                      placement=placement, static_id=static_id, preferred=tuple(preferred),
                      preferred_keys=frozenset(label_keys), priority=priority, stamp=stamp_at,
                      prefers_unlabelled=unlabelled)

    def enqueue(self, pod: Queued, now: float) -> None:
        """A pod enters the queue (created, ungated) or its spec changed (tried afresh, its timestamp and failures
        kept: into the backoff queue while backing off)."""
        pod.fresh = True
        self.queue[pod.name] = pod
        self.parked.pop(pod.name, None)
        self.push(pod, now)

    def forget(self, name: str) -> None:
        self.queue.pop(name, None)
        self.parked.pop(name, None)

    def take(self, node: SchedNode, pod: Queued) -> None:
        self.move(node, pod, -1)

    def give_back(self, node: SchedNode, pod: Queued) -> None:
        self.move(node, pod, 1)

    def move(self, node: SchedNode, pod: Queued, sign: int) -> None:
        node.free_cpu += sign * pod.cpu
        node.free_memory += sign * pod.memory
        node.free_gpus += sign * pod.gpus
        node.free_pods += sign
        free, i = self.free, node.index
        free[0, i], free[1, i], free[2, i], free[3, i] = node.free_cpu, node.free_memory, node.free_gpus, node.free_pods

    def fits(self, pod: Queued, node: SchedNode) -> bool:
        """The filters: NodeResourcesFit on the modelled resources and the pod count, then `passes`."""
        return (node.free_gpus >= pod.gpus and node.free_cpu >= pod.cpu and node.free_memory >= pod.memory
                and node.free_pods > 0 and self.passes(pod, node))

    def answers(self, pod: Queued) -> np.ndarray:
        """The static filters' answers for the pod's placement id (Scheduler.static), made when first asked."""
        found = self.static.get(pod.static_id)
        if found is None:
            found = self.static[pod.static_id] = np.where(self.plain, -1, 0).astype(np.int8)
        return found

    def passes(self, pod: Queued, node: SchedNode) -> bool:
        """The filters but NodeResourcesFit: NodeUnschedulable and the one predicate (shared.predicates.schedulable_on:
        nodeSelector, required node affinity, taints), its answer kept per placement while the node has no taints."""
        view = node.view
        if view.unschedulable:
            return False
        if view.taints:
            return schedulable_on(pod.placement, view, pods_on_node=node.pods - node.free_pods)
        answers = self.answers(pod)
        ok = answers[node.index]
        if ok < 0:
            ok = answers[node.index] = schedulable_on(pod.placement, view, pods_on_node=0)
        return bool(ok)

    def score(self, pod: Queued, feasible: np.ndarray) -> SchedNode:
        """The best node of `feasible` (indices into Scheduler.nodes, in the order searched) by LeastAllocated +
        BalancedAllocation (node_score) + 2 x NodeAffinity (its preferred terms' weights, normalised to 100 by the
        highest) + 3 x TaintToleration, ties broken as selectHost does: reservoir sampling over the top score, in
        the order searched (the random draws those of a walk over every node)."""
        nodes = self.nodes
        cpu, memory = self.cpu[feasible], self.memory[feasible]
        total = node_score(cpu - self.free[0, feasible] + pod.cpu, cpu, memory - self.free[1, feasible] + pod.memory,
                           memory, pod_cpu=pod.cpu, pod_memory=pod.memory, minor=self.minor)
        if pod.preferred:
            preference = self.preference(pod, feasible)
            top = int(preference.max())
            if top:
                total += NODE_AFFINITY_WEIGHT * (preference * MAX_NODE_SCORE // top)
        # TaintToleration: per node, the PreferNoSchedule taints the pod does not tolerate, reversed and normalised to
        # 100 by the highest count (DefaultNormalizeScore): 0 on every node when none has one
        preferring = np.flatnonzero(self.preferring[feasible])
        if len(preferring):
            avoided = np.zeros(len(feasible), dtype=np.int64)
            tolerated: dict[Taint, bool] = {}  # the pod's answer per taint: the same taints recur on many nodes
            for k in preferring.tolist():
                for taint in nodes[int(feasible[k])].prefer:
                    ok = tolerated.get(taint)
                    if ok is None:
                        ok = tolerated[taint] = any(tolerates_taint(tol, taint.key, taint.value, taint.effect)
                                                    for tol in pod.placement.tolerations)
                    if not ok:
                        avoided[k] += 1
            most = int(avoided.max())
            if most:
                total += TAINT_TOLERATION_WEIGHT * (MAX_NODE_SCORE - avoided * MAX_NODE_SCORE // most)
        # selectHost's reservoir sampling, drawing where a walk in order meets a score equal to the best so far
        on_top = np.flatnonzero(total == np.maximum.accumulate(total)).tolist()
        scores = total[on_top].tolist()
        best, best_score, tied = on_top[0], scores[0], 1
        for k, value in zip(on_top[1:], scores[1:], strict=True):
            if value > best_score:
                best, best_score, tied = k, value, 1
            else:
                tied += 1
                if self.rng.randrange(tied) == 0:
                    best = k
        return nodes[int(feasible[best])]

    def preference(self, pod: Queued, feasible: np.ndarray) -> np.ndarray:
        """NodeAffinity's raw score on each of `feasible`: the weights of the pod's preferred terms the node matches,
        summed; asked only of the nodes labelled with a key the terms read (Scheduler.labelled), the others 0, unless
        a term can match without any (Queued.prefers_unlabelled). The webhook gives each pod a term of its own job's
        lock, a label few nodes have, so most nodes are not asked (side by side, the starvation arm at 1,000 nodes took
        38.7 s of CPU against 39.1 s with a walk over every feasible node: within this machine's noise)."""
        keys_read = pod.preferred_keys
        candidates = np.full(len(feasible), pod.prefers_unlabelled, dtype=bool)
        for key in keys_read if not pod.prefers_unlabelled else ():
            having = self.labelled.get(key)
            if having is None:
                if len(self.labelled) >= MAX_LABEL_KEYS:
                    candidates[:] = True  # a walk over every node, as before
                    break
                having = self.labelled[key] = np.array([key in node.view.labels for node in self.nodes], dtype=bool)
            candidates |= having[feasible]
        preference = np.zeros(len(feasible), dtype=np.int64)
        for k in np.flatnonzero(candidates).tolist():
            view = self.nodes[int(feasible[k])].view
            preference[k] = sum(w for w, term in pod.preferred if term.matches(view))
        return preference

    def attempt(self, pod: Queued) -> SchedNode | None:
        """One scheduling cycle over every node, from nextStartNodeIndex until `to_find` feasible nodes are found;
        the start moves on by the nodes looked at. The filters over every node at once (`free`, `answers`), but
        a tainted node's predicate is asked in the order searched and only until the search would stop."""
        self.attempts += 1
        count, start, to_find = len(self.nodes), self.start, self.to_find
        if not count:
            return None
        free = self.free
        room = (free[2] >= pod.gpus) & (free[0] >= pod.cpu) & (free[1] >= pod.memory) & (free[3] > 0)
        answers = self.answers(pod)
        unknown = np.flatnonzero(room & (answers < 0))
        for i in unknown.tolist():
            answers[i] = schedulable_on(pod.placement, self.nodes[i].view, pods_on_node=0)
        sure = np.flatnonzero(room & (answers > 0))
        maybe = np.flatnonzero(room & self.tainted)
        if start:  # the order searched: from `start` round to it
            sure, maybe = (np.concatenate((found[found >= start], found[found < start])) for found in (sure, maybe))
        if len(maybe):
            rank = (sure - start) % count
            taken: list[int] = []
            for i in maybe.tolist():
                if int(np.searchsorted(rank, (i - start) % count)) + len(taken) >= to_find:
                    break  # the search stopped before this node
                node = self.nodes[i]
                if schedulable_on(pod.placement, node.view, pods_on_node=node.pods - node.free_pods):
                    taken.append(i)
            if taken:
                sure = np.concatenate((sure, np.array(taken, dtype=np.int64)))
                sure = sure[np.argsort((sure - start) % count, kind="stable")]
        feasible = sure[:to_find]
        looked = int((feasible[-1] - start) % count) + 1 if len(feasible) >= to_find else count
        self.start = (start + looked) % count
        return self.score(pod, feasible) if len(feasible) else None

    def reasons(self, pod: Queued) -> tuple[int, ...]:
        """What the message of a failed pod's PodScheduled condition says (kube-scheduler 1.36 FitError.Error): on
        every node the reasons of the first filter that fails it, counted ("0/152 nodes are available: 11 Insufficient
        cpu, 139 node(s) didn't match Pod's node affinity/selector, 8 Insufficient nvidia.com/gpu."), then
        DefaultPreemption's count of the nodes where removing pods could help (which only the filters before
        NodeResourcesFit and the nodes' allocatable decide). As counts: nodes cordoned, with a NoSchedule taint the pod
        does not tolerate (1.36 names no taint), not selected (nodeName, nodeSelector, required node affinity), then of
        the rest those with too little cpu, memory, GPUs and room for no more pods. The message changes when one of
        them does, and only then. The filters before NodeResourcesFit are asked again only after a node's object
        changed (Scheduler.views)."""
        passed, need = pod.passed, pod.need
        if passed is None or need is None or pod.filtered != self.views:
            nodes, n = self.nodes, len(self.nodes)
            selected = self.selected.get(pod.static_id)
            if selected is None:
                selected = self.selected[pod.static_id] = np.full(n, -1, dtype=np.int8)
            for i in np.flatnonzero(selected < 0).tolist():
                selected[i] = selected_by(pod.placement, nodes[i].view)
            passed = (selected > 0) & ~self.cordoned
            untolerated = 0
            for i in np.flatnonzero(self.tainted).tolist():
                if not tolerations_allow(pod.placement.tolerations, nodes[i].view):
                    untolerated += 1
                    passed[i] = False
            cordoned = int(np.count_nonzero(self.cordoned))
            pod.filters = (cordoned, untolerated, n - cordoned - untolerated - int(np.count_nonzero(passed)))
            passed = pod.passed = passed.astype(np.int64)
            need = pod.need = np.array([[pod.cpu], [pod.memory], [pod.gpus], [1]], dtype=np.int64)
            pod.filtered = self.views
        # NodeResourcesFit: a request above what is free (none for a resource not requested), no room for a pod
        return pod.filters + tuple(((self.free < need) @ passed).tolist())

    # --- kube-scheduler's queue ---

    def push(self, pod: Queued, now: float) -> None:
        """requeuePodWithQueueingStrategy: into the backoff queue while its backoff has not ended (its window not
        passed), else into the active queue."""
        seq = pod.entry = self.next_seq()
        if pod.expiry >= math.floor(now / BACKOFF_WINDOW) * BACKOFF_WINDOW:
            heapq.heappush(self.backoff, (pod.expiry, -pod.priority, pod.stamp, seq, pod.name))
        else:
            heapq.heappush(self.active, (-pod.priority, pod.stamp, seq, pod.name))

    def wake(self, now: float, gained: Sequence[SchedNode], requeue_all: bool) -> None:
        """MoveAllToActiveOrBackoffQueue: after a pod ended (`requeue_all`: NodeResourcesFit's hint for a deleted
        pod) every parked pod, after a node changed only those a `gained` node now takes (the hints of a node
        update), each into the backoff or the active queue (push)."""
        self.gains.extend(gained)
        if not self.parked or not (gained or requeue_all):
            return
        queue = self.queue
        if requeue_all:
            moved = [queue[name] for name in self.parked]
            self.parked.clear()
        else:
            moved = [pod for name in self.parked if any(self.fits(pod := queue[name], n) for n in gained)]
            for pod in moved:
                del self.parked[pod.name]
        for pod in moved:  # in the order they were parked: deterministic
            self.push(pod, now)

    def ready(self) -> bool:
        return bool(self.active or self.backoff)

    def pop(self, now: float) -> Queued | None:
        """The next pod to try: the backoff queue's pods whose window has passed go to the active queue first (its
        flush, every window); the active queue's head, else (SchedulerPopFromBackoffQ) the backoff queue's."""
        window = math.floor(now / BACKOFF_WINDOW) * BACKOFF_WINDOW
        backoff = self.backoff
        while backoff and backoff[0][0] < window:
            expiry, priority, stamp_at, seq, name = heapq.heappop(backoff)
            pod = self.queue.get(name)
            if pod is not None and pod.entry == seq:
                heapq.heappush(self.active, (priority, stamp_at, seq, name))
        for heap in (self.active, self.backoff):
            while heap:
                entry = heapq.heappop(heap)
                pod = self.queue.get(entry[-1])
                if pod is not None and pod.entry == entry[-2]:
                    return pod
        return None

    def step(self, now: float, on_bind: Callable[[Queued, SchedNode], None],
             on_fail: Callable[[Queued], None]) -> bool:
        """One scheduling cycle at `now`, taking timing.attempt: the next pod (pop) tried on every node when fresh,
        else on the nodes that gained room since its last attempt (no other node can take it now); bound, or parked
        with its failures counted, its timestamp refreshed and its backoff set. False when nothing was queued."""
        pod = self.pop(now)
        if pod is None:
            return False
        self.clock = now + self.timing.attempt
        node: SchedNode | None = None
        if pod.fresh:
            node = self.attempt(pod)
            pod.fresh = False
        else:
            gains, seen = self.gains, pod.seen
            if len(gains) - seen == 1:  # most often: the one node a pod's end freed
                taking = [gains[seen]] if self.fits(pod, gains[seen]) else []
            else:
                taking = [n for n in dict.fromkeys(gains[seen:]) if self.fits(pod, n)]
            if len(taking) >= self.to_find:  # the search would stop early: the real one decides
                node = self.attempt(pod)
            elif taking:
                self.attempts += 1
                node = self.score(pod, np.array([n.index for n in taking], dtype=np.int64))
            else:
                self.attempts += 1
        pod.seen = len(self.gains)
        if node is not None:
            self.forget(pod.name)
            self.take(node, pod)
            if self.timing.patch is not None:
                self.client.wait(self.clock)  # the binding, made beside the loop: it takes a token all the same
            on_bind(pod, node)
            return True
        pod.failures += 1
        pod.stamp = now
        backoff = min(MAX_BACKOFF, INITIAL_BACKOFF * 2 ** min(pod.failures - 1, 16))
        pod.expiry = math.floor((now + backoff) / BACKOFF_WINDOW) * BACKOFF_WINDOW
        self.parked[pod.name] = None
        on_fail(pod)
        if self.timing.patch is not None:  # handleSchedulingFailure: the condition PATCHed when its message changed
            reasons = self.reasons(pod)
            if reasons != pod.reasons:
                pod.reasons = reasons
                stall = self.client.wait(self.clock) + self.timing.patch
                self.clock += stall
                self.patches += 1
                self.stalled += stall
        return True



# --- the arm -----------------------------------------------------------------------------------------------------


ARRIVE, END, AGENT_DUE, AGENT_PLAN, GATE_PASS, SAMPLE, CHECK, SCHED = range(8)


@dataclass
class PodState:
    """One replayed pod in one arm: its JSON as the API server holds it, and what the run saw of it."""

    replay: trace.ReplayPod
    obj: dict[str, Any]
    created: float
    queued: Queued | None = None
    bound: float | None = None
    ended: float | None = None
    node: str = ""
    backfilled: bool = False


@dataclass
class Counts:
    """How much of each the arm did (progress lines, and the report's footnotes)."""

    plans: int = 0
    gate_passes: int = 0
    planner_seconds: float = 0.0
    node_writes: int = 0
    pod_writes: int = 0


class ArmRun:
    """One arm: the cluster's objects, kube-scheduler, and (with a config) the webhook and the agent."""

    def __init__(self, spec: ArmSpec, node_rows: Sequence[trace.NodeRow], replay: Sequence[trace.ReplayPod], *,
                 seed: int, tail: float, progress: TextIO | None = None, minor: int = KUBERNETES_MINOR,
                 timing: Timing = DEFAULT_TIMING) -> None:
        from bench.trace.run import node_body

        self.spec = spec
        self.config = spec.config.protecting(keys.NAMESPACE) if spec.config is not None else None
        self.agent_on = self.config is not None and not self.config.dry_run
        self.replay = list(replay)
        self.tail = tail
        self.progress = progress
        self.counts = Counts()
        self.now = -AGENT_LEAD
        self.heap: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.rows: dict[str, trace.NodeRow] = {}
        self.node_objs: dict[str, dict[str, Any]] = {}
        self.node_views: dict[str, NodeView] = {}
        self.version = 0  # bumped at each node write: the webhook's read model is rebuilt then
        for i, row in enumerate(node_rows):
            body = node_body(spec.name, row)
            body.setdefault("spec", {})  # the API server returns every Node with a spec
            meta = body["metadata"]
            meta.update(uid=f"node-uid-{i}", creationTimestamp=stamp(EPOCH - timedelta(seconds=AGENT_LEAD * 2)),
                        resourceVersion="1")
            name = meta["name"]
            if name in self.node_objs:
                raise SimulationError(f"node {row.sn!r} appears twice in the nodes: node names must be unique")
            self.rows[name] = row
            self.node_objs[name] = body
            self.node_views[name] = NodeView.from_obj(body)
        self.scheduler = Scheduler(list(self.node_views.values()), random.Random(seed), minor, timing)
        self.pods: dict[str, PodState] = {}
        self.lookup_cache: tuple[int, Lookup] | None = None
        # the sample's counters
        self.gpu_allocated = 0
        self.pending_multi = 0
        self.locks: dict[str, str] = {}  # node -> lock owner id, as the node's label says
        self.lock_history: list[tuple[str, str, float, float | None]] = []
        self.samples: list[report.Sample] = []
        self.unbound = 0
        self.done_at: float | None = None
        self.drain_due = False  # a SCHED event is queued: kube-scheduler's loop goes on then
        self.gated: dict[str, float] = {}  # pods created on the backfill gate, and when
        self.ungated: dict[str, float] = {}  # ... and when their gate was lifted
        self.agent = AgentModel(self) if self.agent_on else None
        self.wall_started = time.monotonic()
        self.wall_reported = self.wall_started

    # --- the event queue ---

    def at(self, moment: float, kind: int, payload: Any = None, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (moment, self.seq, kind, payload, token))

    def moment(self, t: float | None = None) -> datetime:
        return EPOCH + timedelta(seconds=self.now if t is None else t)

    def run(self) -> report.Arm:
        last_arrival = self.replay[-1].arrival if self.replay else 0.0
        for pod in self.replay:
            self.at(pod.arrival, ARRIVE, pod)
        self.at(0.0, SAMPLE)
        self.at(last_arrival, CHECK)
        if self.agent is not None:
            self.agent.start()
        limit = last_arrival + self.tail
        while self.heap and self.done_at is None:
            moment, _, kind, payload, token = heapq.heappop(self.heap)
            self.now = moment
            if kind == ARRIVE:
                self.arrive(payload)
            elif kind == END:
                self.end(payload)
            elif kind == SAMPLE:
                self.sample()
                self.at(moment + SAMPLE_SECONDS, SAMPLE)
            elif kind == SCHED:
                self.drain_due = False
                self.drain()
            elif kind == CHECK:
                if self.unbound == 0 or moment >= limit:
                    self.done_at = moment
                else:
                    self.at(min(moment + CHECK_SECONDS, max(limit, moment)), CHECK)
            elif self.agent is not None:
                self.agent.event(kind, payload, token)
            self.report_progress()
        end = self.done_at if self.done_at is not None else self.now
        self.report_progress(final=True)
        return self.result(end, last_arrival)

    # --- the API server, kwok and the webhook ---

    def lookup(self) -> Lookup:
        """The webhook's read model now (its caches: the nodes, the config), rebuilt when a node changed."""
        assert self.config is not None
        cached = self.lookup_cache
        if cached is None or cached[0] != self.version:
            cached = self.lookup_cache = (self.version, LookupAt(config=self.config, nodes=dict(self.node_views),
                                                                 clock=self.moment))
        return cached[1]

    def arrive(self, replayed: trace.ReplayPod) -> None:
        """A pod created: run.py's body, what the API server's admission adds, the webhook's mutation; then queued
        for kube-scheduler unless the webhook gated it."""
        from bench.trace.run import pod_body

        if replayed.name in self.pods:
            raise SimulationError(f"pod {replayed.name!r} appears twice in the replay: pod names must be unique")
        body = pod_body(replayed, self.spec.namespace)
        meta, spec = body["metadata"], body["spec"]
        meta.update(uid=f"{self.spec.name}-{len(self.pods) + 1}", creationTimestamp=stamp(self.moment()),
                    resourceVersion="1")
        spec.update(priority=0, preemptionPolicy="PreemptLowerPriority", schedulerName="default-scheduler",
                    tolerations=[*(spec.get("tolerations") or ()), *(
                        {"key": key, "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": NO_TOLERATION_SECONDS}
                        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"))])
        body["status"] = {"phase": "Pending"}
        if self.config is not None:
            mutation = mutate_pod(body, self.spec.namespace, self.lookup())
            if mutation.patch:
                body = apply_patch(body, mutation.patch)
        state = PodState(replayed, body, self.now)
        self.pods[replayed.name] = state
        self.unbound += 1
        if replayed.gpus >= 2:
            self.pending_multi += 1
        if not gates(body):
            self.queue(state, self.now)
        else:
            self.gated[replayed.name] = self.now
        if self.agent is not None:
            self.agent.pod_changed(state, added=True)
        self.schedule([], requeue_all=False)

    def queue(self, state: PodState, stamp_at: float) -> None:
        """Into kube-scheduler's queue at `stamp_at` (again, after a change of its spec: its Unschedulable condition,
        if written, stands)."""
        before = state.queued
        state.queued = self.scheduler.queued(state.obj, stamp_at)
        if before is not None:
            state.queued.unschedulable, state.queued.failures = before.unschedulable, before.failures
            state.queued.expiry, state.queued.seen = before.expiry, before.seen
            state.queued.reasons = before.reasons
        self.scheduler.enqueue(state.queued, self.now)

    def schedule(self, gained: Sequence[SchedNode], requeue_all: bool) -> None:
        self.scheduler.wake(self.now, gained, requeue_all)
        self.drain()

    def drain(self) -> None:
        """kube-scheduler's loop from now until the next event: one attempt after another, each taking
        timing.attempt (and its status PATCHes); what is still queued then goes on in a SCHED event at the moment it
        is due."""
        scheduler = self.scheduler
        if self.drain_due:
            return
        heap, bound, unschedulable = self.heap, self.bound, self.unschedulable
        while scheduler.ready():
            t = max(scheduler.clock, self.now)
            if heap and t >= heap[0][0]:
                self.drain_due = True
                self.at(t, SCHED)
                return
            self.now = t
            if not scheduler.step(t, bound, unschedulable):
                return

    def bound(self, pod: Queued, node: SchedNode) -> None:
        """The binding (spec.nodeName, PodScheduled) and kwok's start (Running, startTime); the end is due after the
        pod's runtime (localcluster's complete-after stage)."""
        state = self.pods[pod.name]
        obj = state.obj
        obj["spec"] = {**obj["spec"], "nodeName": node.name}  # copied: apply_patch shares what it does not change
        started = stamp(self.moment())
        obj["status"] = {"phase": "Running", "startTime": started,
                         "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": started}]}
        state.bound, state.node = self.now, node.name
        state.backfilled = obj["spec"].get("activeDeadlineSeconds") is not None  # run.py's Seen.backfilled
        self.unbound -= 1
        self.gpu_allocated += pod.gpus
        if state.replay.gpus >= 2:
            self.pending_multi -= 1
        self.at(self.now + state.replay.runtime, END, state)
        if self.agent is not None:
            self.agent.pod_changed(state)

    def unschedulable(self, pod: Queued) -> None:
        """kube-scheduler's PodScheduled=False (Unschedulable) condition, written at the first failure: a change the
        agent sees (its lastTransitionTime); later failures change only the message, which no view reads."""
        if pod.unschedulable:
            return
        pod.unschedulable = True
        state = self.pods[pod.name]
        state.obj["status"] = {**state.obj["status"], "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "lastTransitionTime": stamp(self.moment())}]}
        if self.agent is not None:
            self.agent.pod_changed(state)

    def end(self, state: PodState) -> None:
        """kwok's complete stage: Succeeded after the runtime; kube-scheduler frees the node and tries every waiting
        pod again."""
        obj = state.obj
        obj["status"] = {**obj["status"], "phase": "Succeeded"}
        state.ended = self.now
        node = self.scheduler.by_name[state.node]
        assert state.queued is not None
        self.scheduler.give_back(node, state.queued)
        self.gpu_allocated -= state.queued.gpus
        if self.agent is not None:
            self.agent.pod_changed(state)
        self.schedule([node], requeue_all=True)

    def write_node(self, name: str, ops: list[Op]) -> None:
        """A node patch (the writer's body), as the API server applies it; the scheduler's and the webhook's caches
        see the new node at once."""
        obj = apply_patch(self.node_objs[name], ops)
        self.version += 1
        obj["metadata"] = bumped(obj["metadata"])
        self.node_objs[name] = obj
        view = NodeView.from_obj(obj)
        self.node_views[name] = view
        self.scheduler.set_view(name, view)
        self.counts.node_writes += 1
        owner = (obj["metadata"].get("labels") or {}).get(keys.LOCK) or ""
        before = self.locks.get(name, "")
        if owner != before:
            if before:
                for i in range(len(self.lock_history) - 1, -1, -1):
                    node, held_by, since, until = self.lock_history[i]
                    if node == name and held_by == before and until is None:
                        self.lock_history[i] = (node, held_by, since, self.now)
                        break
            if owner:
                self.locks[name] = owner
                self.lock_history.append((name, owner, self.now, None))
            else:
                self.locks.pop(name, None)

    def write_pod(self, state: PodState, ops: list[Op]) -> None:
        """A pod patch (the writer's body); a pod not bound is tried afresh when its spec changed (tolerations,
        affinity) and enters the queue when its last gate went, with the timestamp it was created with."""
        before = state.obj
        state.obj = apply_patch(before, ops)
        state.obj["metadata"] = bumped(state.obj["metadata"])
        self.counts.pod_writes += 1
        if state.bound is None and state.obj["spec"] != before["spec"] and not gates(state.obj):
            if gates(before):
                self.ungated[state.replay.name] = self.now
            self.queue(state, state.queued.stamp if state.queued is not None else state.created)

    # --- what the run measures ---

    def sample(self) -> None:
        """run.py's sampler: GPUs requested by running pods, nodes locked (their lock label) and their GPUs no running
        pod requests, pending multi-GPU pods."""
        by_name = self.scheduler.by_name
        idle = sum(max(0, by_name[n].free_gpus) for n in self.locks)
        self.samples.append(report.Sample(t=self.now, gpu_allocated=self.gpu_allocated,
                                          locked_nodes=len(self.locks), locked_idle_gpus=idle,
                                          pending_multi_gpu=self.pending_multi))

    def report_progress(self, final: bool = False) -> None:
        if self.progress is None:
            return
        wall = time.monotonic()
        if not final and wall - self.wall_reported < PROGRESS_SECONDS:
            return
        self.wall_reported = wall
        counts = self.counts
        print(f"simulate: {self.spec.name} {'done at' if final else 'at'} {max(self.now, 0.0):.0f} s simulated: "
              f"{len(self.pods) - self.unbound}/{len(self.replay)} bound, {self.unbound} pending, "
              f"{len(self.locks)} nodes locked, {counts.plans} plans, {counts.gate_passes} gate passes, "
              f"{counts.node_writes} node and {counts.pod_writes} pod writes ({wall - self.wall_started:.1f} s, "
              f"{counts.planner_seconds:.1f} s of it in the planner)", file=self.progress, flush=True)

    def line(self) -> str:
        """What kube-scheduler's loop and the agent did in this arm, and the gate's holds per class (run.py's
        gate_costs)."""
        from bench.trace.run import Seen, gate_costs

        scheduler = self.scheduler
        loop = (f"kube-scheduler {scheduler.attempts} attempts, {scheduler.patches} status PATCHes "
                f"({scheduler.stalled:.1f} s of its loop)")
        if self.agent is None:
            return f"{self.spec.name}: {loop}; no agent" + (" (dryRun)" if self.config is not None else "")
        counts = self.counts
        seen = Seen(created={n: s.created for n, s in self.pods.items()}, ungated=dict(self.ungated))
        return (f"{self.spec.name}: {loop}; {counts.plans} plans, {counts.gate_passes} gate passes; "
                f"{gate_costs(seen, {p.name: p for p in self.replay})}")

    def result(self, end: float, last_arrival: float) -> report.Arm:
        from bench.trace.run import Seen, lock_spans, owner_delays

        records = []
        seen = Seen()
        for replayed in self.replay:
            state = self.pods.get(replayed.name)
            if state is None:  # never created: the run ended first (it cannot: creation ends before the checks)
                continue
            records.append(report.PodRecord(
                name=replayed.name, klass=replayed.klass, gpus=replayed.gpus, created=state.created,
                bound=state.bound, ended=state.ended, node=state.node, backfilled=state.backfilled,
                models="|".join(replayed.gpu_models)))
            seen.created[replayed.name] = state.created
            if state.bound is not None:
                seen.bound[replayed.name], seen.node[replayed.name] = state.bound, state.node
            if state.ended is not None:
                seen.ended[replayed.name] = state.ended
            if state.backfilled:
                seen.backfilled.add(replayed.name)
        seen.lock_history = list(self.lock_history)
        pods = {p.name: p for p in self.replay}
        locks = lock_spans(self.lock_history, pods, self.spec.namespace)
        delays = owner_delays(seen, pods, dict(self.rows), self.spec.namespace) if self.agent is not None else []
        arm = report.Arm(name=self.spec.name, records=records, samples=self.samples,
                         total_gpus=sum(r.gpu for r in self.rows.values()), owner_delays=delays, seconds=end,
                         window=last_arrival, locks=locks, node_gpus={n: r.gpu for n, r in self.rows.items()},
                         node_models={n: r.model for n, r in self.rows.items()})
        arm.lock_regrets = report.lock_regrets(arm, pods, self.rows)
        arm.floors = report.reservation_floors(arm, pods, self.rows)
        return arm


def bumped(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an object's metadata with its resourceVersion one on, as the API server's write leaves it (a copy:
    apply_patch's result shares with the object before it whatever the patch did not change)."""
    return {**meta, "resourceVersion": str(int(meta.get("resourceVersion") or "1") + 1)}


def gates(obj: Mapping[str, Any]) -> bool:
    """The pod carries scheduling gates: kube-scheduler leaves it out of its queue."""
    return bool((obj.get("spec") or {}).get("schedulingGates"))


@dataclass(frozen=True)
class LookupAt(Lookup):
    """The webhook's read model on the simulated clock. `mutate_pod` asks `backfill_room_for` with the wall clock (the
    default of `backfill_gate`'s `now`); the simulation answers for its own clock, `clock()`."""

    clock: Callable[[], datetime] = lambda: EPOCH

    def backfill_room_for(self, requests: Resources, runtime: timedelta, now: datetime) -> bool:
        return super().backfill_room_for(requests, runtime, self.clock())


# --- the agent -----------------------------------------------------------------------------------------------------


class AgentModel:
    """`reservoir agent`'s loops (agent/controller.py) in simulated time, its caches the arm's objects, its writes the
    writer's bodies (module docstring)."""

    def __init__(self, arm: ArmRun) -> None:
        assert arm.config is not None
        self.arm = arm
        self.config = arm.config
        self.index = PodIndex()
        self.views: dict[str, PodView] = {}
        self.dirty: dict[str, PodState] = {}  # pods changed since the last snapshot (Agent._pod_changes)
        self.last_plan: Plan | None = None
        self.changed = False
        self.waiting = True  # the reconcile loop waits for a change or its timeout (not settling)
        self.due_token = 0
        self.last_resync = 0.0
        self.last_started = -math.inf
        self.gate_sleeping = False  # a gate pass is due (gate_loop sleeping before it)
        self.gate_started = -math.inf
        self.gate_unsafe = False
        self.locked_owners: frozenset[str] = frozenset()

    # --- the loops ---

    def start(self) -> None:
        """Agent._lead: the reconcile loop starts with `changed` set (the caches just synced)."""
        self.last_resync = self.arm.now
        self.changed = True
        self.wait()

    def wait(self) -> None:
        """The top of `reconcile_loop`: wait for a change, at most until next_wait (the resync counted from the last
        one, or the moment the last plan named)."""
        self.waiting = True
        if self.changed:
            self.settle()
            return
        self.due_token += 1
        wait, cause = self.next_wait()
        self.arm.at(self.arm.now + wait, AGENT_DUE, cause, self.due_token)

    def next_wait(self) -> tuple[float, str]:
        now = self.arm.now
        waits = [(self.last_resync + self.config.resync_period.total_seconds() - now, "resync")]
        wake_at = self.last_plan.wake_at if self.last_plan is not None else None
        if wake_at is not None:
            waits.append(((wake_at - self.arm.moment()).total_seconds() + WAKE_SLACK, "time"))
        wait, cause = min(waits)
        return max(wait, 0.0), cause

    def settle(self) -> None:
        """A change: planned SETTLE after it, and at least `debounce` after the last change-driven plan started."""
        self.waiting = False
        self.due_token += 1  # the timeout no longer counts
        now = self.arm.now
        delay = max(SETTLE, self.last_started + self.config.debounce.total_seconds() - now)
        self.arm.at(now + delay, AGENT_PLAN, None, self.due_token)

    def poke(self) -> None:
        self.changed = True
        if self.waiting:
            self.settle()

    def event(self, kind: int, cause: Any, token: int) -> None:
        """A gate pass, a timeout of the reconcile loop's wait (`cause` resync or time), or a plan after a change."""
        if kind == GATE_PASS:
            self.gate_sleeping = False
            self.gate_started = self.arm.now
            self.gate_pass()
            return
        if token != self.due_token:
            return  # a timeout made moot by a change, or a plan by a later one
        self.waiting = False
        if kind == AGENT_PLAN:
            self.last_started = self.arm.now
        self.reconcile(resync=kind == AGENT_DUE and cause == "resync")

    def reconcile(self, *, resync: bool) -> None:
        if resync:
            self.last_resync = self.arm.now
        self.changed = False
        self.gate_unsafe = False
        snapshot = self.snapshot()
        current = current_locks(snapshot)
        now = self.arm.moment()
        began = time.perf_counter()
        result = plan(snapshot, self.config, now, current, previous=self.last_plan)
        self.arm.counts.planner_seconds += time.perf_counter() - began
        self.arm.counts.plans += 1
        self.last_plan = result
        self.locked_owners = frozenset(lock.owner for lock in result.locks.values())
        gained = self.apply(result.locks, current, result.node_marks, snapshot)
        self.cut_deadlines(result)
        self.repair(result)
        self.backfills(result.backfill)
        self.estimates(result)
        self.arm.schedule(gained, requeue_all=False)
        self.wait()

    def gate_set(self) -> None:
        """Agent.gate_loop: a pod on the backfill gate is decided SETTLE after, passes at least GATE_GAP apart."""
        if not self.gate_sleeping:
            self.gate_sleeping = True
            now = self.arm.now
            self.arm.at(now + max(SETTLE, self.gate_started + GATE_GAP - now), GATE_PASS)

    def gate_pass(self) -> None:
        """Agent.gate_pass: the gated pods decided on the last plan's locks (plan.plan_gate) and only that written:
        the grants on the nodes pods are let onto, then each pod let on or let go (Writer.write_gate)."""
        last = self.last_plan
        if last is None or self.gate_unsafe:
            return
        snapshot = self.snapshot()
        now = self.arm.moment()
        if (last.wake_at is not None and now >= last.wake_at) or not any(
                p.backfill_gated for p in snapshot.index.unbound.values()):
            return
        current = current_locks(snapshot)
        began = time.perf_counter()
        result = plan_gate(snapshot, self.config, now, last, current)
        self.arm.counts.planner_seconds += time.perf_counter() - began
        self.arm.counts.gate_passes += 1
        onto = {b.node for b in result.placed}
        held = {name: lock for name, lock in current.items() if name in onto}
        gained = self.apply(held, held, {n: m for n, m in result.marks.items() if n in onto}, snapshot)
        self.backfills(result)
        self.arm.schedule(gained, requeue_all=False)

    # --- the caches ---

    def pod_changed(self, state: PodState, added: bool = False) -> None:
        """Agent._pod_changed and _poke: the pod's new view for the next snapshot; a pod on the backfill gate wakes
        the gate loop; a new task of a job the last plan locked for leaves the gate to the next plan."""
        self.dirty[state.replay.name] = state
        spec = state.obj["spec"]
        if not spec.get("nodeName"):
            if any(g.get("name") == keys.BACKFILL_GATE for g in spec.get("schedulingGates") or ()):
                self.gate_set()
            elif added and JobRef(self.arm.spec.namespace, "Pod", state.replay.name).owner_id in self.locked_owners:
                self.gate_unsafe = True
        self.poke()

    def node_changed(self) -> None:
        self.poke()

    def snapshot(self) -> Snapshot:
        """Agent.snapshot: the nodes' views, the pods through the index brought up to date with the changes since."""
        if self.dirty:
            changed = []
            for state in self.dirty.values():
                view = PodView.from_obj(state.obj)
                self.views[view.key] = view
                changed.append(view)
            self.dirty = {}
            self.index = self.index.updated(changed)
        return Snapshot(nodes=dict(self.arm.node_views), pods=list(self.views.values())).with_index(self.index)

    # --- the writer (Writer.write, in its order) ---

    def apply(self, desired: Mapping[str, Lock], current: Mapping[str, Lock],
              marks: Mapping[str, Mapping[str, str | None]], snapshot: Snapshot) -> list[SchedNode]:
        """Writer.apply: every node whose lock differs from `desired`, or whose marks must change, patched whole
        (node_patch; the grants the plan did not see kept, keep_unseen_grants). The nodes patched."""
        from agent.writer import node_patch
        from shared.backfill import keep_unseen_grants

        patched = []
        for name in sorted(set(desired) | set(current) | set(marks)):
            want, have = desired.get(name), current.get(name)
            unreadable = have.unreadable if have is not None else ""
            same = (want is None and have is None) or (
                want is not None and want.same_hold(have) and not unreadable)
            if same and name not in marks:
                continue
            obj = self.arm.node_objs.get(name)
            if obj is None:
                continue
            node_marks = marks.get(name)
            seen = snapshot.nodes.get(name)
            if node_marks and keys.BACKFILL_GRANTS in node_marks and seen is not None:
                have_text = (obj["metadata"].get("annotations") or {}).get(keys.BACKFILL_GRANTS)
                node_marks = {**node_marks, keys.BACKFILL_GRANTS: keep_unseen_grants(
                    node_marks[keys.BACKFILL_GRANTS], have_text if isinstance(have_text, str) else None,
                    set(seen.backfill_grants))}
            ops = node_patch(obj, want, node_marks)
            if ops is None:
                continue
            self.arm.write_node(name, ops)
            patched.append(self.arm.scheduler.by_name[name])
        if patched:
            self.node_changed()
        return patched

    def state_of(self, namespace: str, name: str, uid: str) -> PodState | None:
        state = self.arm.pods.get(name)
        if state is None or namespace != self.arm.spec.namespace or state.obj["metadata"]["uid"] != uid:
            return None  # another pod, or gone: the writer reads the pod and checks its uid
        return state

    def pod_written(self, state: PodState, ops: list[Op]) -> None:
        if ops:
            self.arm.write_pod(state, ops)
            self.pod_changed(state)

    def cut_deadlines(self, result: Plan) -> None:
        """Writer.cut_deadlines: each backfilled pod that started late given its lower activeDeadlineSeconds."""
        from agent.writer import deadline_patch

        for cut in result.backfill.cuts:
            state = self.state_of(cut.pod.namespace, cut.pod.name, cut.pod.uid)
            if state is not None:
                ops = deadline_patch(state.obj, cut.deadline)
                if ops:
                    self.pod_written(state, [{"op": "test", "path": "/metadata/uid", "value": cut.pod.uid}, *ops])

    def repair(self, result: Plan) -> None:
        """Writer.repair: the lock tolerations a pending pod lacks."""
        from agent.writer import repair_patch

        for repair in result.repairs:
            state = self.arm.pods.get(repair.name)
            if state is not None and repair.namespace == self.arm.spec.namespace:
                self.pod_written(state, repair_patch(repair))

    def backfills(self, backfill: BackfillPlan) -> None:
        """Writer.backfills: each pod let onto a locked node (narrowed, the lock's toleration and its deadline in one
        patch, then the gate lifted) and each let go (the gate lifted)."""
        from agent.writer import deadline_patch, narrow_patch, ungate_patch
        from shared.tolerations import lock_toleration

        for chosen in backfill.placed:
            state = self.state_of(chosen.pod.namespace, chosen.pod.name, chosen.pod.uid)
            if state is None or not ungate_patch(state.obj, keys.BACKFILL_GATE):
                continue
            obj = state.obj
            ops = narrow_patch(obj, chosen.node, (lock_toleration(chosen.owner),))
            more = deadline_patch(obj, chosen.deadline)
            if more:
                ops = (ops or [{"op": "test", "path": "/metadata/resourceVersion",
                                "value": obj["metadata"].get("resourceVersion", "")}]) + more
            if ops:
                self.arm.write_pod(state, ops)
            self.pod_written(state, ungate_patch(state.obj, keys.BACKFILL_GATE))
        for release in backfill.released:
            state = self.state_of(release.namespace, release.name, release.uid)
            if state is not None:
                self.pod_written(state, ungate_patch(state.obj, keys.BACKFILL_GATE))

    def estimates(self, result: Plan) -> None:
        """Writer.estimates: each waiting owner's expected start on its pods (a merge patch of one annotation), at
        most MAX_ESTIMATE_WRITES a plan. The trace has no PodGroups."""
        sent = 0
        for mark in result.backfill.estimate_marks:
            state = self.arm.pods.get(mark.name)
            if mark.kind != "Pod" or state is None or mark.namespace != self.arm.spec.namespace:
                continue
            if sent >= MAX_ESTIMATE_WRITES:
                break
            sent += 1
            annotations = state.obj["metadata"].get("annotations") or {}
            if annotations.get(keys.EXPECTED_START) != mark.text:
                self.pod_written(state, [{"op": "add", "path": "/metadata/annotations",
                                          "value": {**annotations, keys.EXPECTED_START: mark.text}}])


# --- the runs ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replayed:
    """The nodes and pods of a replay, and the header line bench-trace prints for them."""

    nodes: list[trace.NodeRow]
    pods: list[trace.ReplayPod]
    header: str


def replayed(*, pods_csv: str | None = None, nodes_csv: str | None = None, seed: int = 0,
             fraction: float = REPLAY_SETTING["fraction"], arrival_seconds: float = REPLAY_SETTING["arrival_seconds"],
             runtime_factor: float = REPLAY_SETTING["runtime_factor"],
             runtime_floor: float = REPLAY_SETTING["runtime_floor"], runtime_cap: float = REPLAY_SETTING["runtime_cap"],
             window: float | None = REPLAY_SETTING["window"], as_recorded: bool = False) -> Replayed:
    """The replay bench-trace builds (bench/trace/run.py `run`): the trace's nodes (a stratified `fraction` of them)
    and its pods compressed (trace.replay), from the CSVs or the synthetic trace of `seed`.

    `as_recorded` (a recording of `reservoir record`, replayed at its own pace): every node, and trace.replay with the
    identity for each of its steps (no compression, no floor or cap, no window) and the pods the recording saw no
    end of kept (trace.replay `unended`); the other settings are not read."""
    if (pods_csv is None) != (nodes_csv is None):
        raise SimulationError("give both --pods (the pods CSV) and --nodes (the nodes CSV), or neither for the "
                              "synthetic trace")
    if pods_csv is not None and nodes_csv is not None:
        node_rows, pod_rows = trace.read_nodes(nodes_csv), trace.read_pods(pods_csv)
        source = f"{pods_csv} on {nodes_csv}"
    else:
        node_rows, pod_rows = trace.synthetic(seed)
        source = f"the synthetic trace (seed {seed})"
    try:
        if as_recorded:
            chosen = list(node_rows)
            replay = trace.replay(pod_rows, arrival_seconds=None, runtime_factor=1.0, runtime_floor=0.0,
                                  runtime_cap=math.inf, window=None, unended=True)
        else:
            chosen = trace.subset_nodes(node_rows, fraction)
            replay = trace.replay(pod_rows, arrival_seconds=arrival_seconds, runtime_factor=runtime_factor,
                                  runtime_floor=runtime_floor, runtime_cap=runtime_cap, window=window)
    except ValueError as err:
        raise SimulationError(str(err)) from None
    if not chosen:
        raise SimulationError(f"--fraction {fraction} of {len(node_rows)} nodes keeps none: give a larger fraction"
                              if not as_recorded else f"{nodes_csv}: no nodes")
    span = (replay.pods[-1].arrival if replay.pods else 0.0) if as_recorded else (window or arrival_seconds)
    pace = " as recorded" if as_recorded else ""
    header = (f"simulate: {source}: {len(chosen)} nodes ({sum(r.gpu for r in chosen)} GPUs), {len(replay.pods)} pods "
              f"over {span:.0f} s{pace} ({replay.skipped} never scheduled in the trace, left out)")
    return Replayed(chosen, replay.pods, header)


@dataclass(frozen=True)
class Outcome:
    """One arm's result: what bench/trace/report.py reads, and a line of what the agent did (plans, gate passes and
    the gate's holds as run.py's gate_costs says them), with the wall-clock seconds it took."""

    arm: report.Arm
    line: str
    wall: float


GC_THRESHOLD = 50_000  # the collector's youngest generation's threshold while an arm runs (run_arm)


def run_arm(spec: ArmSpec, node_rows: Sequence[trace.NodeRow], pods: Sequence[trace.ReplayPod], seed: int,
            tail: float, progress: bool = False, minor: int = KUBERNETES_MINOR,
            timing: Timing = DEFAULT_TIMING) -> Outcome:
    """One arm, start to end (a process of its own when arms run side by side), its progress on standard error;
    kube-scheduler's scores as 1.`minor` computes them, its loop's attempts and PATCHes taking `timing`."""
    import gc

    began = time.monotonic()
    # the run makes millions of short-lived objects, few of them in cycles: the collector's youngest generation at
    # its default threshold (700) took about 6% of the default run's CPU; 50,000 leaves it under 1%
    thresholds = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, *thresholds[1:])
    try:
        run = ArmRun(spec, node_rows, pods, seed=seed, tail=tail, progress=sys.stderr if progress else None,
                     minor=minor, timing=timing)
        arm = run.run()
    finally:
        gc.set_threshold(*thresholds)
    return Outcome(arm, run.line(), time.monotonic() - began)


def simulate(arms: Iterable[ArmSpec], node_rows: Sequence[trace.NodeRow], pods: Sequence[trace.ReplayPod], *,
             seed: int = 0, tail: float = 300.0, progress: bool = False, jobs: int = 1,
             minor: int = KUBERNETES_MINOR, timing: Timing = DEFAULT_TIMING) -> list[Outcome]:
    """Each arm on the same nodes and pods, kube-scheduler's ties drawn from random.Random(seed) afresh in each, in
    `jobs` processes at once (the arms share nothing: the outcomes are the same in any number of processes), in
    the order given; `progress`: a line on standard error every few seconds of each arm; kube-scheduler 1.`minor`'s
    scores, its loop's attempts and PATCHes taking `timing`."""
    specs = list(arms)
    if jobs <= 1 or len(specs) <= 1:
        return [run_arm(spec, node_rows, pods, seed, tail, progress, minor, timing) for spec in specs]
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    # the longest first (an agent's arm plans, kube-scheduler alone does not), so that a short arm fills the gap a
    # long one leaves rather than running before it: with three arms on two processes, alone after starvation. Each
    # arm in a process of its own (forked: the modules are loaded already), `jobs` at a time: an arm run after another
    # in the same process took longer (make bench-simulate, 5,000 nodes: the backfill arm 330-353 s of CPU third in
    # one process, 236 s in its own)
    fork = multiprocessing.get_context("fork")
    pools: list[ProcessPoolExecutor] = []
    futures: dict[int, Future[Outcome]] = {}
    running: set[Future[Outcome]] = set()
    try:
        for i in sorted(range(len(specs)), key=lambda i: arm_cost(specs[i]), reverse=True):
            while len(running) >= jobs:
                _, running = wait(running, return_when=FIRST_COMPLETED)
            pools.append(ProcessPoolExecutor(max_workers=1, mp_context=fork))
            futures[i] = pools[-1].submit(run_arm, specs[i], list(node_rows), list(pods), seed, tail, progress,
                                          minor, timing)
            running.add(futures[i])
        return [futures[i].result() for i in range(len(specs))]
    finally:
        for pool in pools:
            pool.shutdown(cancel_futures=True)


def timing_spread(arms: Iterable[ArmSpec], node_rows: Sequence[trace.NodeRow], pods: Sequence[trace.ReplayPod], *,
                  seed: int = 0, tail: float = 300.0, jobs: int = 1,
                  minor: int = KUBERNETES_MINOR) -> list[list[report.Arm]]:
    """The same arms again with every scheduling attempt and status PATCH a little shorter or longer (DEFAULT_TIMING
    scaled by each of TIMING_SPREAD): how far the run's figures move from timing alone, which decides which pod takes
    which freed room from then on (docs/design/benchmarks.md, "How much of a replay's spread is timing"). One list of
    arms per timing, in the order given."""
    specs = list(arms)
    return [[o.arm for o in simulate(specs, node_rows, pods, seed=seed, tail=tail, jobs=jobs, minor=minor,
                                     timing=DEFAULT_TIMING.scaled(factor))]
            for factor in TIMING_SPREAD]


def arm_cost(spec: ArmSpec) -> int:
    """A rank of what an arm costs to simulate, for the order arms are started in (simulate): kube-scheduler alone
    (or dryRun) least, an agent that plans more, one that also backfills (gate passes, grants) most."""
    if spec.config is None or spec.config.dry_run:
        return 0
    return 2 if spec.config.backfill.enabled else 1


def main_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """What bench-trace prints: the table (report.table), a line per arm of what the agent did, and the last line
    (report.last_line: kube-scheduler alone, the first arm, -> the arm named backfill, else the last one)."""
    arms = [o.arm for o in outcomes]
    lines = [report.table(arms), "", *report.criteria_lines(arms), "", *(o.line for o in outcomes)]
    reservoir = report.reservoir_arm(arms)
    if arms and reservoir is not None:
        lines.append(report.last_line(arms[0], reservoir))
    return lines


if __name__ == "__main__":  # python -m bench.trace.simulate: the default run, as `reservoir simulate`
    default = replayed()
    print(default.header)
    print("\n".join(main_lines(simulate(default_arms(), default.nodes, default.pods, progress=True))))
