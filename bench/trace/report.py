"""What a trace replay measured, as an operator reads it: per pod class how long pods waited to be placed, how much of
the cluster's GPUs were in use, what the locks cost (nodes locked, GPUs held idle on them), what backfill gave back,
how often a big pod was overtaken by later ones, and what was never placed.

Pure: the replay driver (bench/trace/run.py) records the moments it saw; this module only reads them. Percentiles are
linear interpolation between closest ranks (numpy's default); time averages treat samples as steps (each sample's
value holds until the next sample).
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.trace.trace import CLASSES, NodeRow, ReplayPod


@dataclass(frozen=True)
class PodRecord:
    """One replayed pod as the run saw it: created, bound (None if never), ended (None if not seen ending), in seconds
    on one clock; the node it was bound to ("" if none); whether it was backfilled onto a locked node; the GPU models it
    may use, `|`-separated ("" for any)."""

    name: str
    klass: str
    gpus: int
    created: float
    bound: float | None
    ended: float | None
    node: str
    backfilled: bool
    models: str = ""


@dataclass(frozen=True)
class Sample:
    """The cluster at one moment `t` (seconds from the arm's start): GPUs requested by pods bound and not ended, nodes
    locked, GPUs on locked nodes no running pod requests, pods of 2+ GPUs created and not bound."""

    t: float
    gpu_allocated: int
    locked_nodes: int
    locked_idle_gpus: int
    pending_multi_gpu: int


@dataclass(frozen=True)
class LockSpan:
    """One lock as the node watch saw it: its node, the class of the pod it was held for ("other" for an owner that is
    not one replayed pod), from and until (None: still held when the arm ended), on the records' clock."""

    node: str
    owner_class: str
    since: float
    until: float | None
    owner: str = ""  # the replayed pod it was held for, "" for any other owner


@dataclass
class Arm:
    """One arm of a run (kube-scheduler alone, or with Reservoir): its pods, its samples, the GPUs of its nodes, the
    owners' delays caused by backfill (empty when nothing was measured), how long it ran."""

    name: str
    records: list[PodRecord]
    samples: list[Sample]
    total_gpus: int
    owner_delays: list[float]
    seconds: float
    # the arrival window, seconds from the arm's start: GPU allocation is averaged over it, the same span in every arm
    # (an arm that drains its last pods longer would otherwise look emptier for it); None: over all samples
    window: float | None = None
    locks: list[LockSpan] = field(default_factory=list)
    node_gpus: dict[str, int] = field(default_factory=dict)  # GPUs of each node, by name
    node_models: dict[str, str] = field(default_factory=dict)  # the GPU model of each node, by name ("" for none)
    # per replayed pod's first lock: how much later its node could take it than the soonest could (lock_regrets)
    lock_regrets: list[float] = field(default_factory=list)
    # per pod of FLOOR_CLASS placed, by name: the soonest it could have started without eviction (reservation_floors)
    floors: dict[str, float] = field(default_factory=dict)


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks: rank (n - 1) * q / 100 of the
    sorted values. Refuses an empty list: a percentile of nothing is no number."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q}: expected 0..100")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def waits(records: Iterable[PodRecord]) -> list[float]:
    """Creation to bind, of the pods bound."""
    return [r.bound - r.created for r in records if r.bound is not None]


def classes(arms: Iterable[Arm]) -> list[str]:
    """The classes to report: the README's six in order, then any other class met (such as "other GPU"), sorted."""
    extra = sorted({r.klass for a in arms for r in a.records} - set(CLASSES))
    return [*CLASSES, *extra]


def class_rows(arm: Arm) -> list[dict[str, Any]]:
    """Per class (CLASSES order, then others met): pods, placed, unplaced and the placed pods' waits p50 / p95 / max
    (None when none was placed)."""
    rows = []
    for klass in classes([arm]):
        records = [r for r in arm.records if r.klass == klass]
        placed = waits(records)
        rows.append({"class": klass, "pods": len(records), "placed": len(placed),
                     "unplaced": len(records) - len(placed),
                     "wait_p50": percentile(placed, 50) if placed else None,
                     "wait_p95": percentile(placed, 95) if placed else None,
                     "wait_max": max(placed) if placed else None})
    return rows


def _step_mean(samples: Sequence[Sample], value: Callable[[Sample], float], start: float, end: float) -> float:
    """The time average over [start, end] of value(sample), each sample holding until the next; outside the samples'
    span nothing is known, so the interval is cut to it. A zero-length interval gives the value holding at start."""
    if not samples:
        return 0.0
    start, end = max(start, samples[0].t), min(end, samples[-1].t)
    if end <= start:
        holding = [s for s in samples if s.t <= start] or [samples[0]]
        return float(value(holding[-1]))
    total = 0.0
    for here, after in zip(samples, samples[1:], strict=False):
        lo, hi = max(here.t, start), min(after.t, end)
        if hi > lo:
            total += value(here) * (hi - lo)
    return total / (end - start)


def _step_integral(samples: Sequence[Sample], value: Callable[[Sample], float]) -> float:
    return sum(value(here) * (after.t - here.t) for here, after in zip(samples, samples[1:], strict=False))


def _ratio(arm: Arm) -> Callable[[Sample], float]:
    return lambda s: s.gpu_allocated / arm.total_gpus if arm.total_gpus else 0.0


def gpu_allocation(arm: Arm) -> float:
    """The time average of GPUs allocated / GPUs in the cluster over the arm's arrival window (`Arm.window`; all its
    samples when None), samples as steps (each holds until the next). 0.0 with no samples."""
    if not arm.samples:
        return 0.0
    end = arm.samples[-1].t if arm.window is None else min(arm.window, arm.samples[-1].t)
    return _step_mean(arm.samples, _ratio(arm), arm.samples[0].t, end)


def per_minute(arm: Arm) -> list[float]:
    """The GPU allocation ratio of each minute [60 m, 60 m + 60) from the arm's start to its last sample, averaged as
    gpu_allocation does over the part of the minute the samples cover."""
    if not arm.samples:
        return []
    minutes = max(1, math.ceil(arm.samples[-1].t / 60))
    return [_step_mean(arm.samples, _ratio(arm), 60.0 * m, 60.0 * (m + 1)) for m in range(minutes)]


def locked_idle_gpu_seconds(arm: Arm) -> float:
    """GPU-seconds held idle on locked nodes: locked_idle_gpus integrated over time (steps)."""
    return _step_integral(arm.samples, lambda s: s.locked_idle_gpus)


def max_locked(arm: Arm) -> int:
    return max((s.locked_nodes for s in arm.samples), default=0)


def backfilled(arm: Arm) -> int:
    return sum(1 for r in arm.records if r.backfilled)


def unplaced(arm: Arm) -> int:
    return sum(1 for r in arm.records if r.bound is None)


def overtaken(arm: Arm) -> list[int]:
    """For each 8-GPU pod (by creation, then name), how many pods created after it were bound before it: what
    starvation looks like from the big pod's side. An 8-GPU pod never bound counts every later pod bound in the run."""
    out = []
    for big in sorted((r for r in arm.records if r.klass == "8 GPU"), key=lambda r: (r.created, r.name)):
        out.append(sum(1 for r in arm.records if r.created > big.created and r.bound is not None
                       and (big.bound is None or r.bound < big.bound)))
    return out


SMALL = ("GPU share", "1 GPU")  # the classes whose cost pool_rows breaks down


def pool_rows(arms: Sequence[Arm]) -> list[dict[str, Any]]:
    """Where the small GPU pods' waits go: per GPU model named (`models`, "any" for none), the GPU-share and 1-GPU
    pods' count and per arm their mean and p95 wait (None when none was placed), `larger_gpu_seconds`: the
    GPU-seconds that pods of 2 GPUs or more naming the same models ran within the arrival window (first to last
    creation), `jumps` (queue_jumps) and, for a pool naming models, `taken` (taken_from_pool). A pod that names a
    model competes only on that model's nodes, so a lock there costs that pool alone: the rows say which; and in a
    pool the small pods keep full, every GPU-second a larger pod runs within the window (where kube-scheduler alone
    left it waiting until after) is one the small pods wait for; jumps and taken say how far kube-scheduler's queue
    order decides their waits (the model's own weak point: docs/design/benchmarks.md)."""
    rows: dict[str, dict[str, Any]] = {}
    for a in arms:
        pools: dict[str, list[PodRecord]] = {}
        larger: dict[str, float] = {}
        created = [r.created for r in a.records]
        start, stop = (min(created), max(created)) if created else (0.0, 0.0)
        for r in a.records:
            pool = r.models or "any"
            if r.klass in SMALL:
                pools.setdefault(pool, []).append(r)
            elif r.gpus >= 2 and r.bound is not None:
                ran = min(r.ended if r.ended is not None else stop, stop) - max(r.bound, start)
                larger[pool] = larger.get(pool, 0.0) + r.gpus * max(0.0, ran)
        for pool, records in pools.items():
            row = rows.setdefault(pool, {"models": pool, "pods": len(records)})
            placed = waits(records)
            row[a.name] = {"mean": statistics.mean(placed) if placed else None,
                           "p95": percentile(placed, 95) if placed else None,
                           "larger_gpu_seconds": larger.get(pool, 0.0), "jumps": queue_jumps(records),
                           "taken": taken_from_pool(a, pool) if pool != "any" else None}
    return sorted(rows.values(), key=lambda row: (-row["pods"], row["models"]))


def queue_jumps(records: Iterable[PodRecord]) -> int:
    """Of `records` (one pool's small pods), how many were bound while an older one (created before it) still
    waited: kube-scheduler's queue retries by backoff, so a newcomer takes room an older pod waits for. A pod never
    bound waits to the end."""
    jumps, latest = 0, -math.inf  # the latest bind (inf: never) among the pods created before, so far
    for _created, group in itertools.groupby(sorted(records, key=lambda r: r.created), key=lambda r: r.created):
        pods = list(group)
        jumps += sum(1 for r in pods if r.bound is not None and latest > r.bound)
        latest = max(latest, *(math.inf if r.bound is None else r.bound for r in pods))
    return jumps


def taken_from_pool(arm: Arm, pool: str) -> int:
    """How many small pods naming no GPU model were bound onto a node that a small pod naming `pool`'s models, older
    than them and still waiting then, was later bound to: room on that pool's nodes the pod waiting for it lost to a
    pod that could have gone anywhere."""
    waiting: dict[str, list[tuple[float, float]]] = {}  # node -> (created, bound) of the pool's pods bound there
    for r in arm.records:
        if r.klass in SMALL and r.models == pool and r.bound is not None:
            waiting.setdefault(r.node, []).append((r.created, r.bound))
    taken = 0
    for x in arm.records:
        bound = x.bound
        if x.klass in SMALL and not x.models and bound is not None and any(
                created < x.created and bound < later for created, later in waiting.get(x.node, ())):
            taken += 1
    return taken


def _lock_end(arm: Arm) -> float:
    """Where a lock still held when the arm ended is counted to: the arm's end, or the last moment a record saw."""
    return max([arm.seconds + min((r.created for r in arm.records), default=0.0)]
               + [r.ended or r.bound or r.created for r in arm.records])


def _placed_by_node(arm: Arm) -> dict[str, list[PodRecord]]:
    on_node: dict[str, list[PodRecord]] = {}
    for r in arm.records:
        if r.node and r.bound is not None:
            on_node.setdefault(r.node, []).append(r)
    return on_node


def backfill_filled_gpu_seconds(arm: Arm) -> float:
    """Backfill's give-back measured within one run: the GPU-seconds of locked nodes' GPUs that only backfilled pods
    used, i.e. the locked-idle GPU-seconds of the arm's locks were its backfilled pods taken away, less those it had
    (both from the pods' bind and end moments, _idle_gpu_seconds). The starvation and backfill arms are two runs that
    part at their first different choice, so their locked-idle GPU-seconds differ by more than what backfill did; this
    is what backfill did."""
    end, on_node = _lock_end(arm), _placed_by_node(arm)
    filled = 0.0
    for span in arm.locks:
        until, gpus = span.until if span.until is not None else end, arm.node_gpus.get(span.node, 0)
        pods = on_node.get(span.node, [])
        filled += (_idle_gpu_seconds(gpus, [r for r in pods if not r.backfilled], span.since, until)
                   - _idle_gpu_seconds(gpus, pods, span.since, until))
    return filled


def _lock_idle(arm: Arm) -> Iterator[tuple[LockSpan, float, float]]:
    """Each lock with the moment it ended (a lock still held at the end: _lock_end) and the GPU-seconds its node held
    idle meanwhile (GPUs no running pod requested, from the pods' own bind and end moments)."""
    end, on_node = _lock_end(arm), _placed_by_node(arm)
    for span in arm.locks:
        until = span.until if span.until is not None else end
        yield span, until, _idle_gpu_seconds(arm.node_gpus.get(span.node, 0), on_node.get(span.node, ()),
                                              span.since, until)


def lock_rows(arm: Arm) -> list[dict[str, Any]]:
    """Per class of the pod a lock was held for: how many locks, node-seconds locked, and GPU-seconds those nodes held
    idle while locked (_lock_idle). Which locks cost what the other classes wait for."""
    rows: dict[str, dict[str, Any]] = {}
    for span, until, idle in _lock_idle(arm):
        row = rows.setdefault(span.owner_class, {"class": span.owner_class, "locks": 0, "node_seconds": 0.0,
                                                 "idle_gpu_seconds": 0.0})
        row["locks"] += 1
        row["node_seconds"] += max(0.0, until - span.since)
        row["idle_gpu_seconds"] += idle
    order = {k: i for i, k in enumerate(classes([arm]))}
    return sorted(rows.values(), key=lambda row: order.get(row["class"], len(order)))


def lock_pool_rows(arm: Arm) -> list[dict[str, Any]]:
    """Per GPU model of the locked node ("" for none) and class of the pod the lock was held for: how many locks,
    their idle GPU-seconds (_lock_idle), `waiting`: the small pods naming that model (SMALL; a pod naming no model
    is left out, it may go anywhere) already waiting when each lock was made, summed over the locks, and `short`: of
    them, those whose runtime (bind to end) would have ended before the lock did, had they started when it was made.
    Backfill lets only pods held on the gate at creation onto a locked node, never these: `short` says how many pods
    kube-scheduler already held could have used the drain instead (docs/design/benchmarks.md)."""
    small: dict[str, list[PodRecord]] = {}
    for r in arm.records:
        if r.klass in SMALL and r.models:
            for model in r.models.split("|"):
                small.setdefault(model, []).append(r)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for span, until, idle in _lock_idle(arm):
        model = arm.node_models.get(span.node, "")
        row = rows.setdefault((model, span.owner_class), {"model": model, "class": span.owner_class, "locks": 0,
                                                          "idle_gpu_seconds": 0.0, "waiting": 0, "short": 0})
        row["locks"] += 1
        row["idle_gpu_seconds"] += idle
        waiting = [r for r in small.get(model, ()) if r.created <= span.since and (r.bound is None or
                                                                                  r.bound > span.since)]
        row["waiting"] += len(waiting)
        row["short"] += sum(1 for r in waiting if r.bound is not None and r.ended is not None
                            and r.ended - r.bound <= until - span.since)
    order = {k: i for i, k in enumerate(classes([arm]))}
    return sorted(rows.values(), key=lambda row: (row["model"], order.get(row["class"], len(order))))


def first_locks(arm: Arm) -> dict[str, LockSpan]:
    """Each replayed pod a lock was held for: its first lock."""
    first: dict[str, LockSpan] = {}
    for span in arm.locks:
        if span.owner and (span.owner not in first or span.since < first[span.owner].since):
            first[span.owner] = span
    return first


def lock_waits(arm: Arm) -> list[dict[str, Any]]:
    """Per class, the pods a lock was held for and bound: their waits cut at their first lock, p50 / p95 of creation
    to the lock (the starvation threshold and the planner's latency) and of the lock to the bind (the locked node's
    drain). Which part of a locked pod's wait Reservoir's rules decide, and which the pods already running do."""
    by_name = {r.name: r for r in arm.records}
    parts: dict[str, tuple[list[float], list[float]]] = {}
    for name, span in first_locks(arm).items():
        record = by_name.get(name)
        if record is None or record.bound is None:
            continue
        to_lock, to_bind = parts.setdefault(record.klass, ([], []))
        to_lock.append(max(0.0, span.since - record.created))
        to_bind.append(max(0.0, record.bound - span.since))
    order = {k: i for i, k in enumerate(classes([arm]))}
    return [{"class": klass, "pods": len(to_lock), "to_lock_p50": percentile(to_lock, 50),
             "to_lock_p95": percentile(to_lock, 95), "to_bind_p50": percentile(to_bind, 50),
             "to_bind_p95": percentile(to_bind, 95)}
            for klass, (to_lock, to_bind) in sorted(parts.items(), key=lambda kv: order.get(kv[0], len(order)))]


def could_ever(want: ReplayPod, row: NodeRow) -> bool:
    """The node of `row` could take `want` with nothing on it: big enough, and of a GPU model it names (if any)."""
    return not ((want.gpu_models and row.model not in want.gpu_models) or want.cpu_milli > row.cpu_milli
                or want.memory_mib > row.memory_mib or want.gpus > row.gpu)


Shape = tuple[int, int, int, tuple[str, ...]]  # a pod's request: cpu, memory, GPUs, the GPU models it names


def could_take(want: ReplayPod, nodes: Mapping[str, NodeRow], known: dict[Shape, list[str]]) -> list[str]:
    """The nodes that could ever take `want` (could_ever), in `nodes`' order, kept in `known` per request."""
    shape = (want.cpu_milli, want.memory_mib, want.gpus, want.gpu_models)
    found = known.get(shape)
    if found is None:
        found = known[shape] = [n for n, row in nodes.items() if could_ever(want, row)]
    return found


def fit_moment(want: ReplayPod, row: NodeRow, running: Iterable[tuple[ReplayPod, float]], at: float) -> float | None:
    """When the node of `row` could first take `want` from `at` on, were nothing else to come: `at` if its room
    covers the request, else the end of the running pod (its pod, its end) whose end frees enough; None if it never
    could (too small, another GPU model: could_ever; or room only after pods with no end seen)."""
    if not could_ever(want, row):
        return None
    cpu, memory, gpus = row.cpu_milli - want.cpu_milli, row.memory_mib - want.memory_mib, row.gpu - want.gpus
    ends = sorted(running, key=lambda pod_end: pod_end[1])
    cpu -= sum(p.cpu_milli for p, _ in ends)
    memory -= sum(p.memory_mib for p, _ in ends)
    gpus -= sum(p.gpus for p, _ in ends)
    moment = at
    for pod, end in ends:
        if cpu >= 0 and memory >= 0 and gpus >= 0:
            break
        cpu, memory, gpus, moment = cpu + pod.cpu_milli, memory + pod.memory_mib, gpus + pod.gpus, end
    return moment if cpu >= 0 and memory >= 0 and gpus >= 0 and math.isfinite(moment) else None


def lock_regrets(arm: Arm, pods: Mapping[str, ReplayPod], nodes: Mapping[str, NodeRow]) -> list[float]:
    """Seed 000 locks the node where the task fits soonest. For each replayed pod's first lock: how much later the
    node locked could take it than the node that could soonest (of those no other pod's lock held at that moment:
    the planner leaves another job's locked node alone), from the pods running on each node at the lock and
    the moments they really ended (what the planner reads from their declared runtimes; a pod not seen ending never
    frees its room). 0 where the lock went to the soonest node; the lock's node is what its drain (lock_waits'
    lock -> bind) is made of."""
    running = _placed_by_node(arm)
    shapes: dict[Shape, list[str]] = {}  # could_take's

    def fits(name: str, want: ReplayPod, at: float) -> float | None:
        on = [(pods[r.name], r.ended if r.ended is not None else math.inf) for r in running.get(name, ())
              if r.name in pods and r.name != want.name and r.bound is not None and r.bound <= at
              and (r.ended is None or r.ended > at)]
        return fit_moment(want, nodes[name], on, at)

    regrets = []
    for owner, span in sorted(first_locks(arm).items()):
        want = pods.get(owner)
        if want is None or span.node not in nodes:
            continue
        others = {s.node for s in arm.locks if s.owner != owner and s.since <= span.since
                  and (s.until is None or s.until > span.since)}
        chosen = fits(span.node, want, span.since)
        # the other nodes' fit_moment is None: these only are asked (at scale, the walk was most of the report)
        best = min((m for m in (fits(n, want, span.since) for n in could_take(want, nodes, shapes) if n not in others)
                    if m is not None), default=None)
        if chosen is not None and best is not None:
            regrets.append(chosen - best)
    return regrets


FLOOR_CLASS = "8 GPU"


def reservation_floors(arm: Arm, pods: Mapping[str, ReplayPod], nodes: Mapping[str, NodeRow],
                       klass: str = FLOOR_CLASS) -> dict[str, float]:
    """What no reservation without eviction can beat in this arm: for each pod of `klass` the arm placed, in order of
    creation, how long after its creation some node could first have taken it had nothing been placed on any node
    after it arrived (the pods running then, ending when they really ended: fit_moment), a node being given first to
    the pods of the class that arrived before it and were still waiting (each holds the node from its own floor for
    its runtime; one already running is among the running pods). A
    reservation made at the pod's very arrival on the best node, with every later pod kept off, gets exactly this;
    a real one (threshold, node choice from declared runtimes, its caps) can only come later. Pod name -> seconds,
    in creation order."""
    # a sweep in time over the records: `active` holds, per node, the pods bound and not ended at the moment swept to
    starts = sorted(((r.bound, r) for r in arm.records if r.node and r.bound is not None and r.name in pods),
                    key=lambda pair: pair[0])
    ends: list[tuple[float, str, str]] = []  # heap of (end, node, name)
    active: dict[str, dict[str, tuple[ReplayPod, float]]] = {}
    shapes: dict[Shape, list[str]] = {}  # could_take's
    held: dict[str, list[tuple[float, float, float]]] = {}  # node -> (from, until, bound) of earlier pods of the class
    floors: dict[str, float] = {}
    started = 0
    for bound, record in sorted(((r.bound, r) for r in arm.records if r.klass == klass and r.bound is not None),
                                key=lambda pair: (pair[1].created, pair[1].name)):
        want = pods.get(record.name)
        if want is None:
            continue
        at = record.created
        while started < len(starts) and starts[started][0] <= at:
            r = starts[started][1]
            started += 1
            end = r.ended if r.ended is not None else math.inf
            if end > at:
                active.setdefault(r.node, {})[r.name] = (pods[r.name], end)
                heapq.heappush(ends, (end, r.node, r.name))
        while ends and ends[0][0] <= at:
            _, node, name = heapq.heappop(ends)
            active.get(node, {}).pop(name, None)
        best: tuple[float, str] | None = None
        for name in could_take(want, nodes, shapes):
            on = [pod_end for other, pod_end in active.get(name, {}).items() if other != want.name]
            moment = fit_moment(want, nodes[name], on, at)
            if moment is None:
                continue
            for since, until, theirs in sorted(held.get(name, ())):  # theirs: when that pod really bound
                if theirs > at and until > moment and since < moment + want.runtime:
                    moment = until
            if best is None or moment < best[0]:
                best = (moment, name)
        if best is None:
            continue
        held.setdefault(best[1], []).append((best[0], best[0] + want.runtime, bound))
        floors[record.name] = best[0] - at
    return floors


REGRET_SECONDS = 0.5  # a node that could take the pod this close to the soonest counts as the soonest


def _idle_gpu_seconds(gpus: int, pods: Iterable[PodRecord], since: float, until: float) -> float:
    """The integral over [since, until] of the node's GPUs that no running pod requests."""
    if until <= since or gpus <= 0:
        return 0.0
    changes: list[tuple[float, int]] = []
    for r in pods:
        assert r.bound is not None
        start, stop = max(r.bound, since), min(r.ended if r.ended is not None else until, until)
        if r.gpus and start < stop:
            changes += [(start, r.gpus), (stop, -r.gpus)]
    total, used, last = 0.0, 0, since
    for moment, delta in sorted(changes):
        total += max(0, gpus - used) * (moment - last)
        used, last = used + delta, moment
    return total + max(0, gpus - used) * (until - last)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _count(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def summary(arm: Arm) -> dict[str, Any]:
    """The figures of an arm below its table."""
    passed = overtaken(arm)
    return {"gpu_allocation": gpu_allocation(arm), "max_locked": max_locked(arm),
            "locked_idle_gpu_seconds": locked_idle_gpu_seconds(arm), "backfilled": backfilled(arm),
            "backfill_filled_gpu_seconds": backfill_filled_gpu_seconds(arm),
            "owner_delay_mean": statistics.mean(arm.owner_delays) if arm.owner_delays else None,
            "owner_delay_max": max(arm.owner_delays) if arm.owner_delays else None,
            "overtaken_median": statistics.median(passed) if passed else None,
            "unplaced": unplaced(arm), "seconds": arm.seconds,
            "floor_p50": percentile(arm.floors.values(), 50) if arm.floors else None, "floor_p95": floor_p95(arm),
            "above_floor_mean": statistics.mean(above_floor(arm)) if arm.floors else None}


def table(arms: Sequence[Arm]) -> str:
    """A Markdown table, a row per class, per arm the waits p50 / p95 / max (seconds) and placed / pods; then a line
    per arm of what the cluster as a whole saw."""
    head = ["class"]
    for a in arms:
        head += [f"{a.name} wait p50 / p95 / max (s)", f"{a.name} placed / pods"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_arm = [{row["class"]: row for row in class_rows(a)} for a in arms]
    for klass in classes(arms):
        cells = [klass]
        for rows in by_arm:
            row = rows.get(klass, {"pods": 0, "placed": 0, "wait_p50": None, "wait_p95": None, "wait_max": None})
            cells += [" / ".join(_seconds(row[k]) for k in ("wait_p50", "wait_p95", "wait_max")),
                      f"{row['placed']} / {row['pods']}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for a in arms:
        s = summary(a)
        delay = ("n/a" if s["owner_delay_mean"] is None
                 else f"mean {s['owner_delay_mean']:.1f} s / max {s['owner_delay_max']:.1f} s")
        passed = "n/a" if s["overtaken_median"] is None else _count(s["overtaken_median"])
        lines.append(f"- {a.name}: GPU allocation {s['gpu_allocation']:.3f}, max nodes locked {s['max_locked']}, "
                     f"locked-idle GPU-s {s['locked_idle_gpu_seconds']:.0f}, backfilled {s['backfilled']}, "
                     f"owner delay {delay}, 8-GPU overtaken median {passed}, unplaced pods {s['unplaced']}")
        if s["floor_p95"] is not None:
            lines.append(f"  - {a.name} {FLOOR_CLASS} pods' floor (the soonest a node could take each, nothing placed "
                         f"after it arrived, no eviction) p50 / p95: {_seconds(s['floor_p50'])} / "
                         f"{_seconds(s['floor_p95'])} s; their wait above it: mean {_seconds(s['above_floor_mean'])} s")
        held = lock_rows(a)
        if held:
            lines.append(f"  - {a.name} locks by the class they were held for: " + "; ".join(
                f"{row['class']} {row['locks']} locks, {row['node_seconds']:.0f} node-s, "
                f"{row['idle_gpu_seconds']:.0f} idle GPU-s" for row in held))
        by_pool = [row for row in lock_pool_rows(a) if row["model"]]
        if by_pool:
            lines.append(f"  - {a.name} locks on GPU nodes by the node's model and the class held for, with the "
                         "GPU-share and 1-GPU pods naming that model already waiting when each was made (of them, "
                         "those whose runtime would have ended before the lock did): " + "; ".join(
                             f"{row['model']} for {row['class']} {row['locks']} locks, "
                             f"{row['idle_gpu_seconds']:.0f} idle GPU-s, {row['waiting']} waiting ({row['short']})"
                             for row in by_pool))
        parts = lock_waits(a)
        if parts:
            line = (f"  - {a.name} pods locked for, wait p50 / p95 (s) from creation to their first lock, then to "
                    f"their bind: " + "; ".join(
                        f"{row['class']} {row['pods']} pods {_seconds(row['to_lock_p50'])} / "
                        f"{_seconds(row['to_lock_p95'])}, then {_seconds(row['to_bind_p50'])} / "
                        f"{_seconds(row['to_bind_p95'])}" for row in parts))
            if a.lock_regrets:
                soonest = sum(1 for r in a.lock_regrets if r <= REGRET_SECONDS)
                line += (f"; {soonest} of {len(a.lock_regrets)} first locks on a node that could take the pod "
                         f"soonest" + ("" if soonest == len(a.lock_regrets) else
                                       f" (the others up to {max(a.lock_regrets):.1f} s later)"))
            lines.append(line)
    pools = pool_rows(arms)
    if len(pools) > 1:
        lines += ["", "GPU-share and 1-GPU pods by the GPU models they name, wait mean / p95 (s), the GPU-seconds "
                  "pods of 2+ GPUs naming the same models ran within the arrival window, the pods bound while an older "
                  "one of the pool waited, and those naming no model bound on a node such an older one later took:",
                  "",
                  "| models named | pods | " + " | ".join(a.name for a in arms) + " |",
                  "|" + "---|" * (len(arms) + 2)]
        for row in pools:
            cells = []
            for a in arms:
                cell = row.get(a.name, {})
                larger = "-" if "larger_gpu_seconds" not in cell else _count(round(cell["larger_gpu_seconds"]))
                order = "" if "jumps" not in cell else f" / {cell['jumps']} jumps" + (
                    "" if cell["taken"] is None else f", {cell['taken']} taken")
                cells.append(" / ".join(_seconds(cell.get(k)) for k in ("mean", "p95")) + f" / {larger} GPU-s{order}")
            lines.append(f"| {row['models']} | {row['pods']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def class_p95(arm: Arm, klass: str) -> float | None:
    """The p95 wait of the class's placed pods, None when none was placed."""
    placed = waits(r for r in arm.records if r.klass == klass)
    return percentile(placed, 95) if placed else None


def floor_p95(arm: Arm) -> float | None:
    """The p95 of the arm's reservation floors (reservation_floors), None when none was measured."""
    return percentile(arm.floors.values(), 95) if arm.floors else None


def above_floor(arm: Arm) -> list[float]:
    """Per pod with a floor: how much longer it waited than its floor (what the arm's reservations left to gain)."""
    bound = {r.name: r.bound - r.created for r in arm.records if r.bound is not None}
    return [bound[name] - floor for name, floor in arm.floors.items() if name in bound]


def wait_ratio(alone: float, reservoir: float) -> float:
    """How many times lower a wait is with Reservoir: alone / reservoir; inf when Reservoir's is 0 and alone's is
    not, 1.0 when both are 0."""
    if reservoir > 0:
        return alone / reservoir
    return math.inf if alone > 0 else 1.0


def last_line(alone: Arm, reservoir: Arm) -> str:
    """`trace: 8gpu p95 A s -> B s (xR), 1gpu p95 C s -> D s, gpu alloc E -> F, backfilled N, unplaced U`: the 8-GPU
    and 1-GPU pods' wait p95 and the GPU allocation, kube-scheduler alone -> with Reservoir; R = A / B ("inf" when B
    is 0 and A is not, "1.0" when both are 0; "n/a" when a side placed no 8-GPU pod, and that side's p95 too); N and
    U: pods backfilled and pods never placed with Reservoir."""
    a, b = class_p95(alone, "8 GPU"), class_p95(reservoir, "8 GPU")
    c, d = class_p95(alone, "1 GPU"), class_p95(reservoir, "1 GPU")
    ratio = "n/a" if a is None or b is None else f"{wait_ratio(a, b):.1f}"

    def s(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f}"
    return (f"trace: 8gpu p95 {s(a)} s -> {s(b)} s (x{ratio}), 1gpu p95 {s(c)} s -> {s(d)} s, "
            f"gpu alloc {gpu_allocation(alone):.3f} -> {gpu_allocation(reservoir):.3f}, "
            f"backfilled {backfilled(reservoir)}, unplaced {unplaced(reservoir)}")


# The trace issue's goals (issue 30, "What it must show"), kube-scheduler alone against Reservoir, in one run.
RATIO_GOAL = 3.0  # 8-GPU pods' p95 wait at least this many times lower
EXTRA_WAIT_GOAL = 10.0  # every other class's p95 wait at most this many seconds higher


def reservoir_arm(arms: Sequence[Arm]) -> Arm | None:
    """The arm the last line and the goals read as "with Reservoir": the one named backfill, else the last one that is
    not kube-scheduler alone."""
    by_name = {a.name: a for a in arms}
    others = [a for a in arms if a.name != "alone"]
    return by_name.get("backfill") or (others[-1] if others else None)


def criteria(arms: Sequence[Arm]) -> list[dict[str, Any]]:
    """Each goal of the trace issue measured on these arms: `{criterion, value, met}`, alone (the arm named alone)
    against Reservoir (reservoir_arm); the backfill goals against the arm named starvation when there is one. Empty
    without both sides. A class that one side placed no pod of has no p95 goal."""
    by_name = {a.name: a for a in arms}
    alone, reservoir = by_name.get("alone"), reservoir_arm(arms)
    if alone is None or reservoir is None:
        return []
    rows: list[dict[str, Any]] = []
    a8, r8 = class_p95(alone, "8 GPU"), class_p95(reservoir, "8 GPU")
    if a8 is not None and r8 is not None:
        ratio = wait_ratio(a8, r8)
        floor = floor_p95(reservoir)
        most = "any" if floor is None or floor <= 0 else f"at most x{wait_ratio(a8, floor):.1f}"
        reach = "" if floor is None else f"; without eviction {most} here (the floor's p95 {floor:.1f} s)"
        rows.append({"criterion": f"8 GPU p95 at least {RATIO_GOAL:g}x lower",
                     "value": f"{a8:.1f} -> {r8:.1f} s (x{ratio:.1f}){reach}", "met": ratio >= RATIO_GOAL})
    for klass in classes([alone, reservoir]):
        a, r = class_p95(alone, klass), class_p95(reservoir, klass)
        if klass == "8 GPU" or a is None or r is None:
            continue
        rows.append({"criterion": f"{klass} p95 at most {EXTRA_WAIT_GOAL:g} s higher",
                     "value": f"{a:.1f} -> {r:.1f} s ({r - a:+.1f})", "met": r - a <= EXTRA_WAIT_GOAL})
    placed_alone = {r.name for r in alone.records if r.bound is not None}
    lost = sorted(r.name for r in reservoir.records if r.bound is None and r.name in placed_alone)
    rows.append({"criterion": "no pod left unplaced that kube-scheduler alone placed",
                 "value": f"{len(lost)} pods" + (f" ({', '.join(lost[:3])}{', ...' if len(lost) > 3 else ''})"
                                                 if lost else ""), "met": not lost})
    ga, gr = gpu_allocation(alone), gpu_allocation(reservoir)
    rows.append({"criterion": "GPU allocation no lower", "value": f"{ga:.3f} -> {gr:.3f}", "met": gr >= ga})
    starvation = by_name.get("starvation")
    if starvation is not None and reservoir is not starvation and reservoir.name == "backfill":
        ls, lb = locked_idle_gpu_seconds(starvation), locked_idle_gpu_seconds(reservoir)
        filled = backfill_filled_gpu_seconds(reservoir)
        rows.append({"criterion": "locked-idle GPU-s lower with backfill",
                     "value": f"{ls:.0f} -> {lb:.0f} (in its own run, backfilled pods used {filled:.0f} GPU-s of "
                              f"locked nodes' idle GPUs)", "met": lb < ls})
        worst = max(reservoir.owner_delays, default=0.0)
        rows.append({"criterion": "owner delay 0 with backfill", "value": f"max {worst:.1f} s", "met": worst <= 0})
    return rows


def criteria_lines(arms: Sequence[Arm]) -> list[str]:
    """criteria as lines: `goal: met|NOT MET: criterion: value`."""
    return [f"goal {'met' if row['met'] else 'NOT MET'}: {row['criterion']}: {row['value']}" for row in criteria(arms)]


VALIDATION_SECONDS = 10.0  # issue 31: per-class p50 and p95 within 20% or 10 s, whichever is larger
VALIDATION_SHARE = 0.2
VALIDATION_ALLOCATION = 0.03  # GPU allocation within 0.03


def validation_rows(real: Sequence[Arm], model: Sequence[Arm],
                    spread: Sequence[Sequence[Arm]] = ()) -> list[dict[str, Any]]:
    """The simulation (`reservoir simulate`) against the replay on the control plane, arm by arm (matched by name)
    and class by class: p50 and p95 waits on each side and whether the model is within VALIDATION_SECONDS or
    VALIDATION_SHARE of the replay, whichever is larger; a row per arm for GPU allocation (within
    VALIDATION_ALLOCATION). `spread`: the same arms of the model at other timings (simulate.timing_spread):
    each row then also gives the lowest and highest the model reached over all its runs, and whether the replay lies
    in that range widened by the tolerance (`in_spread`; without `spread`, the same as `met`)."""
    rows: list[dict[str, Any]] = []
    by_name = {a.name: a for a in model}
    others = [{a.name: a for a in arms} for arms in spread]
    for arm in real:
        sim = by_name.get(arm.name)
        if sim is None:
            continue
        runs = [sim, *(o[arm.name] for o in others if arm.name in o)]
        for klass in classes([arm, sim]):
            placed_real = waits(r for r in arm.records if r.klass == klass)
            placed_sim = [waits(r for r in run.records if r.klass == klass) for run in runs]
            if not placed_real or not placed_sim[0]:
                continue
            for q in (50, 95):
                a = percentile(placed_real, q)
                rows.append(_validation_row(arm.name, f"{klass} p{q}", a, [percentile(p, q) for p in placed_sim if p],
                                            max(VALIDATION_SECONDS, VALIDATION_SHARE * a)))
        rows.append(_validation_row(arm.name, "GPU allocation", gpu_allocation(arm),
                                    [gpu_allocation(run) for run in runs], VALIDATION_ALLOCATION))
    return rows


def _validation_row(arm: str, what: str, replay: float, values: Sequence[float], tolerance: float) -> dict[str, Any]:
    """One measure of validation_rows: the replay's figure against the model's (`values`: its own run first, then
    its runs at other timings), within `tolerance` of its own run (`met`) and of the range of all of them
    (`in_spread`)."""
    low, high = min(values), max(values)
    return {"arm": arm, "what": what, "replay": replay, "simulate": values[0],
            "met": abs(replay - values[0]) <= tolerance, "low": low, "high": high,
            "in_spread": low - tolerance <= replay <= high + tolerance}


def verdicts(arms: Sequence[Arm]) -> dict[str, bool]:
    """Each goal's criterion (criteria) and whether these arms met it."""
    return {row["criterion"]: row["met"] for row in criteria(arms)}


def validation_table(real: Sequence[Arm], model: Sequence[Arm], spread: Sequence[Sequence[Arm]] = ()) -> str:
    """validation_rows as a markdown table, then the goals' verdicts on each side (criteria), and whether they agree;
    with `spread` (the model at other timings), the model's range over all its runs beside each measure, how
    many of the replay's figures lie in it (widened by the tolerance), and how many of its verdicts one run gives."""
    rows = validation_rows(real, model, spread)
    head = "| arm | measure | replay | simulate | within tolerance |"
    if spread:
        head += f" simulate over {len(spread) + 1} timings | within tolerance of that range |"
    lines = [head, "|---" * head.count(" | ") + "|---|"]
    for row in rows:
        fmt = "{:.3f}" if row["what"] == "GPU allocation" else "{:.1f}"
        line = (f"| {row['arm']} | {row['what']} | {fmt.format(row['replay'])} | {fmt.format(row['simulate'])} "
                f"| {'yes' if row['met'] else 'NO'} |")
        if spread:
            line += (f" {fmt.format(row['low'])} - {fmt.format(row['high'])} "
                     f"| {'yes' if row['in_spread'] else 'NO'} |")
        lines.append(line)
    within = sum(row["met"] for row in rows)
    lines += ["", f"validation: {within} of {len(rows)} measures within tolerance "
              f"({VALIDATION_SHARE:.0%} or {VALIDATION_SECONDS:g} s; allocation {VALIDATION_ALLOCATION:g})"]
    verdicts_real, verdicts_sim = verdicts(real), verdicts(model)
    differ = sorted(k for k in verdicts_real if verdicts_sim.get(k) != verdicts_real[k])
    lines.append(f"validation: the same verdict on {len(verdicts_real) - len(differ)} of {len(verdicts_real)} goals"
                 + (f" (differs: {'; '.join(differ)})" if differ else ""))
    if spread:
        runs = [verdicts_sim, *(verdicts(arms) for arms in spread)]
        unreached = sorted(k for k, met in verdicts_real.items() if all(v.get(k) != met for v in runs))
        lines.append(f"validation over the model's {len(runs)} timings: "
                     f"{sum(row['in_spread'] for row in rows)} of {len(rows)} measures within tolerance of its range, "
                     f"the replay's verdict reached by one run on {len(verdicts_real) - len(unreached)} of "
                     f"{len(verdicts_real)} goals" + (f" (not: {'; '.join(unreached)})" if unreached else ""))
    return "\n".join(lines)


def plot(arms: Sequence[Arm], out_dir: Path) -> list[Path]:
    """Two pictures in out_dir: `trace-timeline.png`, GPU allocation and pending multi-GPU pods over the run per arm;
    `trace-waits.png`, per class the CDF of waits per arm (log x, waits below 0.1 s drawn at 0.1 s; the curve ends
    at placed / pods, short of 1.0 when pods were never placed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    timeline, waits_png = out_dir / "trace-timeline.png", out_dir / "trace-waits.png"

    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 7))
    for a in arms:
        t = [s.t for s in a.samples]
        top.step(t, [s.gpu_allocated / a.total_gpus if a.total_gpus else 0.0 for s in a.samples], where="post",
                 label=a.name)
        bottom.step(t, [s.pending_multi_gpu for s in a.samples], where="post", label=a.name)
    top.set_title("GPU allocation (GPUs requested by running pods / GPUs in the cluster)")
    top.set_ylabel("allocation ratio")
    top.set_ylim(0, 1.05)
    top.legend()
    bottom.set_title("Pending multi-GPU pods (2+ GPUs, created, not bound)")
    bottom.set_ylabel("pods")
    bottom.set_xlabel("seconds from the arm's start")
    bottom.legend()
    figure.tight_layout()
    figure.savefig(timeline, dpi=100)
    plt.close(figure)

    present = [k for k in classes(arms) if any(r.klass == k for a in arms for r in a.records)] or ["(no pods)"]
    columns = min(3, len(present))
    rows = math.ceil(len(present) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for i, klass in enumerate(present):
        ax = axes[i // columns][i % columns]
        for a in arms:
            records = [r for r in a.records if r.klass == klass]
            placed = sorted(max(0.1, w) for w in waits(records))
            if records and placed:
                ys = [(k + 1) / len(records) for k in range(len(placed))]
                ax.step([placed[0], *placed], [0.0, *ys], where="post",
                        label=f"{a.name} ({len(placed)}/{len(records)})")
            elif records:
                ax.plot([], [], label=f"{a.name} (0/{len(records)})")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{klass}: wait CDF")
        ax.set_xlabel("wait, creation to bind (s)")
        ax.set_ylabel("share of the class's pods placed")
        ax.legend(fontsize="small")
    for j in range(len(present), rows * columns):
        axes[j // columns][j % columns].set_visible(False)
    figure.tight_layout()
    figure.savefig(waits_png, dpi=100)
    plt.close(figure)
    return [timeline, waits_png]


def write_json(arms: Sequence[Arm], path: Path) -> None:
    """Every pod's record, every lock and every sample, per arm, with the arm's per-class rows and summary figures."""
    body = {"arms": [{"name": a.name, "total_gpus": a.total_gpus, "seconds": a.seconds,
                      "owner_delays": a.owner_delays, "summary": summary(a), "classes": class_rows(a),
                      "locks_by_class": lock_rows(a), "locks_by_pool": lock_pool_rows(a),
                      "locks": [asdict(span) for span in a.locks],
                      "overtaken": overtaken(a), "per_minute": per_minute(a),
                      "records": [asdict(r) for r in a.records], "samples": [asdict(s) for s in a.samples]}
                     for a in arms]}
    Path(path).write_text(json.dumps(body, indent=1) + "\n")
