"""Alibaba's production GPU cluster trace (`cluster-trace-gpu-v2023`, "openb") in its own CSV format: read it from a
path the user gives, write it, draw a synthetic one from the published figures (the trace itself may not be vendored,
see /work/shared/fixtures/traces/README.md), take a stratified subset of its nodes, and compress its pods into a
replay of minutes.

Pure: no Kubernetes, no network, no clock. Resources are integers (millicores, MiB, whole GPUs, thousandths of a
GPU) as the trace writes them; times are seconds, floats, as the trace's clock and the replay's are.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from statistics import NormalDist

# the CSV format itself lives in shared/tracecsv.py (`reservoir record` writes it too); re-exported here by its names
from shared.tracecsv import (
    NODE_COLUMNS,
    POD_COLUMNS,
    RECORDED_POD_COLUMNS,
    NodeRow,
    PodRow,
    TraceError,
    format_time,
    read_nodes,
    read_pods,
    write_nodes,
    write_pods,
)

__all__ = ["NODE_COLUMNS", "POD_COLUMNS", "RECORDED_POD_COLUMNS", "NodeRow", "PodRow", "TraceError", "format_time",
           "read_nodes", "read_pods", "write_nodes", "write_pods"]


CLASSES = ("CPU only", "GPU share", "1 GPU", "2 GPU", "4 GPU", "8 GPU")
OTHER_GPU = "other GPU"


@dataclass(frozen=True)
class Shape:
    """A node shape of the README's table: so many nodes of these cores, GiB, GPUs and GPU model."""

    cores: int
    memory_gib: int
    gpus: int
    model: str
    nodes: int

    @property
    def cpu_milli(self) -> int:
        return self.cores * 1000

    @property
    def memory_mib(self) -> int:
        return self.memory_gib * 1024


# The README's node-shape table, in its order: 1,523 nodes, 6,212 GPUs, 125,514 cores.
SHAPES: tuple[Shape, ...] = (
    Shape(96, 384, 8, "G2", 549),
    Shape(104, 512, 2, "T4", 387),
    Shape(32, 256, 0, "", 129),
    Shape(16, 120, 2, "P100", 107),
    Shape(96, 512, 0, "", 59),
    Shape(128, 768, 8, "G3", 39),
    Shape(96, 384, 0, "", 30),
    Shape(32, 128, 4, "V100M16", 28),
    Shape(32, 128, 0, "", 23),
    Shape(64, 256, 2, "P100", 22),
    Shape(64, 512, 0, "", 22),
    Shape(96, 768, 8, "V100M32", 21),
    Shape(104, 512, 0, "", 20),
    Shape(8, 32, 1, "V100M16", 19),
    Shape(96, 384, 4, "T4", 17),
    Shape(32, 64, 0, "", 10),
    Shape(48, 368, 4, "V100M32", 9),
    Shape(64, 256, 0, "", 8),
    Shape(64, 256, 8, "V100M16", 7),
    Shape(64, 128, 0, "", 4),
    Shape(104, 768, 0, "", 3),
    Shape(8, 60, 1, "P100", 3),
    Shape(8, 60, 2, "P100", 2),
    Shape(128, 1024, 1, "A10", 2),
    Shape(82, 336, 8, "V100M16", 1),
    Shape(104, 192, 0, "", 1),
    Shape(96, 768, 0, "", 1),
)


def _gib(value: float) -> int:
    return round(value * 1024)


@dataclass(frozen=True)
class ClassFigures:
    """One row of the README's pod-class table: how many pods, their cpu request (millicores) p50 / p90 / max, memory
    (MiB) p50 / max, runtime (deletion - scheduled, seconds) p50 / p90 / p99 (p99 None where the README gives none)
    and the wait in production (scheduled - creation, seconds) p50 / p90 / p95."""

    klass: str
    pods: int
    gpus: int
    cpu_milli: tuple[int, int, int]
    memory_mib: tuple[int, int]
    runtime: tuple[float, float, float | None]
    wait: tuple[float, float, float]


FIGURES: tuple[ClassFigures, ...] = (
    ClassFigures("CPU only", 1088, 0, (12500, 32000, 32000), (_gib(50), _gib(64)), (494, 13207, 28365), (3, 35, 36)),
    ClassFigures("GPU share", 3078, 1, (4000, 11900, 12000), (_gib(14.9), _gib(46)), (539, 9219, 74631),
                 (1, 140, 309)),
    ClassFigures("1 GPU", 3911, 1, (11400, 16000, 24200), (_gib(47), _gib(123)), (757, 6025, 169864), (2, 137, 245)),
    ClassFigures("2 GPU", 16, 2, (16200, 30200, 30200), (_gib(65), _gib(157)), (2267, 22231, None), (1, 36, 77)),
    ClassFigures("4 GPU", 15, 4, (32200, 60200, 60200), (_gib(129), _gib(313)), (542, 17039, None), (0, 2, 424)),
    ClassFigures("8 GPU", 44, 8, (88000, 110400, 120200), (_gib(320), _gib(720)), (539, 94680, 1179693), (0, 32, 64)),
)

SHARE_MILLI = (320, 470, 650, 810)
# gpuspec33's named specs and how many GPU pods name each (2,042 of the 2,388 that name any; the README does not say
# what the other 346 name, so the synthetic trace leaves those pods free to use any model).
GPU_SPECS: tuple[tuple[str, int], ...] = (("T4", 1291), ("G2", 331), ("P100", 279), ("V100M16|V100M32", 141))
QOS: tuple[tuple[str, int], ...] = (("LS", 4647), ("BE", 3398), ("Burstable", 100), ("Guaranteed", 7))
WINDOW_DAYS = 34
BURST_DAYS = 2
# The hourly arrival rate's shape, chosen so that the hourly counts come out at mean 10, p90 about 20 and max about
# 57 as the README's: a day's swing of +-50%, an hour's own draw gamma with shape 4 (mean 1), and the last two days
# at twice the rate.
DIURNAL_SWING = 0.5
HOURLY_GAMMA_SHAPE = 4.0
BURST_FACTOR = 2.0
RUNTIME_MIN = 1.0
# cpu and memory of a pod go together: memory is paired with cpu by the rank of rho * z_cpu + noise.
CPU_MEMORY_RHO = 0.8
_Z90, _Z99 = NormalDist().inv_cdf(0.9), NormalDist().inv_cdf(0.99)


def pod_class(row: PodRow) -> str:
    """The README's class of a pod: CPU only, GPU share (one GPU, 0 < gpu_milli < 1000), 1, 2, 4 or 8 GPUs, and
    "other GPU" for any other count."""
    if row.num_gpu <= 0:
        return "CPU only"
    if row.num_gpu == 1:
        return "GPU share" if 0 < row.gpu_milli < 1000 else "1 GPU"
    return {2: "2 GPU", 4: "4 GPU", 8: "8 GPU"}.get(row.num_gpu, OTHER_GPU)


def node_shape_name(row: NodeRow) -> str:
    """A label-safe name of a node's shape: `g8-g2-96c-384g`, `cpu-32c-256g` (cores and GiB rounded down)."""
    size = f"{row.cpu_milli // 1000}c-{row.memory_mib // 1024}g"
    if row.gpu <= 0:
        return f"cpu-{size}"
    model = re.sub(r"[^a-z0-9]+", "-", row.model.lower()).strip("-") or "gpu"
    return f"g{row.gpu}-{model}-{size}"


# --- the synthetic trace ---------------------------------------------------------------------------------------------


def _stratified_normal(rng: random.Random, n: int) -> list[float]:
    """n standard normal draws, one from each of n equally likely strata, in random order: a class of 15 pods still
    has its median where the figures put it, which independent draws would miss by far."""
    z = [NormalDist().inv_cdf((k + max(rng.random(), 1e-12)) / n) for k in range(n)]
    rng.shuffle(z)
    return z


def _paired(rng: random.Random, z: Sequence[float], rho: float) -> list[float]:
    """Another stratified normal sample, paired with z by rank of rho * z + noise: the marginal is stratified, the
    two go together (a pod asking for more cpu asks for more memory, mostly)."""
    own = sorted(_stratified_normal(rng, len(z)))
    noisy = [rho * v + math.sqrt(1 - rho * rho) * rng.gauss(0.0, 1.0) for v in z]
    out = [0.0] * len(z)
    for rank, i in enumerate(sorted(range(len(z)), key=lambda i: noisy[i])):
        out[i] = own[rank]
    return out


def _runtime(figures: ClassFigures, z: float, cap: float) -> float:
    """A lognormal through p50 and p90; above p90 a second lognormal slope through p99 where the README gives one."""
    p50, p90, p99 = figures.runtime
    low = math.log(p90 / p50) / _Z90
    high = math.log(p99 / p90) / (_Z99 - _Z90) if p99 is not None else low
    log_value = math.log(p50) + z * low if z <= _Z90 else math.log(p90) + (z - _Z90) * high
    return float(round(min(cap, max(RUNTIME_MIN, math.exp(min(log_value, 50.0))))))


def _wait(figures: ClassFigures, u: float) -> float:
    """Piecewise linear through (0, 0), (0.5, p50), (0.9, p90), (0.95, p95), (1, 2 p95 - p90)."""
    p50, p90, p95 = figures.wait
    points = ((0.0, 0.0), (0.5, p50), (0.9, p90), (0.95, p95), (1.0, max(p95, 2 * p95 - p90)))
    for (u0, v0), (u1, v1) in zip(points, points[1:], strict=False):
        if u <= u1:
            return float(round(v0 + (v1 - v0) * (u - u0) / (u1 - u0)))
    return float(round(points[-1][1]))


def _arrivals(rng: random.Random, count: int) -> list[float]:
    hours = WINDOW_DAYS * 24
    weights = [(1 + DIURNAL_SWING * math.sin(2 * math.pi * (h % 24 - 8) / 24))
               * rng.gammavariate(HOURLY_GAMMA_SHAPE, 1 / HOURLY_GAMMA_SHAPE)
               * (BURST_FACTOR if h >= hours - BURST_DAYS * 24 else 1.0) for h in range(hours)]
    chosen = rng.choices(range(hours), weights=weights, k=count)
    return sorted(float(h * 3600 + rng.randrange(3600)) for h in chosen)


def _fits(shape: Shape, gpus: int, cpu_milli: int, memory_mib: int) -> bool:
    return shape.gpus >= gpus and shape.cpu_milli >= cpu_milli and shape.memory_mib >= memory_mib


def _largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    whole = sum(weights)
    exact = [Fraction(total * w, whole) for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), -weights[i], i))
    for i in order[:total - sum(counts)]:
        counts[i] += 1
    return counts


def synthetic_nodes() -> list[NodeRow]:
    """The README's 1,523 nodes, shape by shape in the table's order, named openb-node-0001 on."""
    rows: list[NodeRow] = []
    for shape in SHAPES:
        for _ in range(shape.nodes):
            rows.append(NodeRow(f"openb-node-{len(rows) + 1:04d}", shape.cpu_milli, shape.memory_mib, shape.gpus,
                                shape.model))
    return rows


def synthetic(seed: int = 0) -> tuple[list[NodeRow], list[PodRow]]:
    """A trace of the openb format drawn from the README's figures with random.Random(seed), for running the
    benchmark without the real trace (which the project may not ship).

    Kept exactly: the 27 node shapes and their counts (1,523 nodes, openb-node-0001 on, in the table's order); the
    8,152 pods and their class counts; QoS counts (LS 4,647, BE 3,398, Burstable 100, Guaranteed 7, shuffled over the
    pods); the GPU pods naming models: T4 1,291, G2 331, P100 279, V100M16|V100M32 141, each given to GPU pods drawn
    at random among those that fit some node of that model (enough GPUs, cores and memory).
    Drawn per class, from stratified normal draws (one per equally likely stratum, so that the small classes keep
    their medians): cpu lognormal through p50 and p90, clipped to the max (rounded to 100 millicores); memory
    lognormal with the class's median and cpu's spread, clipped to the max (rounded to 256 MiB), paired with cpu by
    rank (rho 0.8); runtime (deletion - scheduled) lognormal through p50 and p90 and, above p90, through p99 where
    given, clipped to [1 s, 34 days], whole seconds; wait (scheduled - creation) piecewise linear through the
    production wait's p50, p90, p95; gpu_milli 320, 470, 650 or 810 for a GPU share (uniform), 1000 for whole GPUs.
    Arrivals: per-hour weights (a day's swing, a gamma draw per hour, twice the rate on the last two days) over a
    34-day window from time 0, each pod's hour drawn from them, its second within the hour uniform; classes shuffled
    over the arrivals; names openb-pod-0001 on in arrival order.
    pod_phase: Running when the deletion falls after the window's end, Succeeded otherwise (deletion_time is set
    either way, so a replay knows every runtime).
    Not kept: the 897 pods never scheduled (every synthetic pod is scheduled: a replay leaves those out anyway);
    the 346 gpuspec33 pods naming specs the README does not list; any correlation between class, size, runtime and
    arrival time the real trace has (they are drawn independently, but for cpu with memory); the exact tails of cpu,
    memory and runtime (only the quoted quantiles are aimed at); the 33 pods the real list has outside its 34-day
    window (all synthetic pods arrive inside it).
    """
    rng = random.Random(seed)
    nodes = synthetic_nodes()
    count = sum(f.pods for f in FIGURES)
    arrivals = _arrivals(rng, count)
    labels = [f.klass for f in FIGURES for _ in range(f.pods)]
    rng.shuffle(labels)
    window_end = WINDOW_DAYS * 86400.0
    drawn: dict[str, list[tuple[int, int, int, float, float]]] = {}
    for f in FIGURES:
        z_cpu = _stratified_normal(rng, f.pods)
        z_memory = _paired(rng, z_cpu, CPU_MEMORY_RHO)
        z_runtime = _stratified_normal(rng, f.pods)
        u_wait = [(k + rng.random()) / f.pods for k in range(f.pods)]
        rng.shuffle(u_wait)
        cpu_p50, cpu_p90, cpu_max = f.cpu_milli
        sigma = math.log(cpu_p90 / cpu_p50) / _Z90
        memory_p50, memory_max = f.memory_mib
        rows = []
        for k in range(f.pods):
            cpu = max(100, min(cpu_max, round(cpu_p50 * math.exp(sigma * z_cpu[k]) / 100) * 100))
            memory = max(256, min(memory_max, round(memory_p50 * math.exp(sigma * z_memory[k]) / 256) * 256))
            milli = rng.choice(SHARE_MILLI) if f.klass == "GPU share" else (1000 if f.gpus else 0)
            rows.append((cpu, memory, milli, _runtime(f, z_runtime[k], window_end), _wait(f, u_wait[k])))
        drawn[f.klass] = rows
    gpus = {f.klass: f.gpus for f in FIGURES}
    taken = dict.fromkeys(drawn, 0)
    pods: list[PodRow] = []
    for i, (klass, created) in enumerate(zip(labels, arrivals, strict=True)):
        cpu, memory, milli, runtime, wait = drawn[klass][taken[klass]]
        taken[klass] += 1
        scheduled = created + wait
        deleted = scheduled + runtime
        pods.append(PodRow(name=f"openb-pod-{i + 1:04d}", cpu_milli=cpu, memory_mib=memory, num_gpu=gpus[klass],
                           gpu_milli=milli, gpu_spec="", qos="", creation_time=created, deletion_time=deleted,
                           scheduled_time=scheduled, pod_phase="Running" if deleted > window_end else "Succeeded"))
    qos = [name for name, n in QOS for _ in range(n)]
    rng.shuffle(qos)
    specs = [""] * len(pods)
    for spec, n in GPU_SPECS:
        models = set(spec.split("|"))
        eligible = [i for i, p in enumerate(pods) if p.num_gpu > 0 and not specs[i] and any(
            s.model in models and _fits(s, p.num_gpu, p.cpu_milli, p.memory_mib) for s in SHAPES)]
        for i in rng.sample(eligible, n):
            specs[i] = spec
    return nodes, [replace(p, gpu_spec=specs[i], qos=qos[i]) for i, p in enumerate(pods)]


# --- a smaller cluster of the same mix --------------------------------------------------------------------------------


def shape_of(row: NodeRow) -> tuple[int, int, int, str]:
    """What makes two nodes interchangeable for placement: cpu, memory, GPUs and GPU model."""
    return (row.cpu_milli, row.memory_mib, row.gpu, row.model)


def subset_nodes(nodes: Sequence[NodeRow], fraction: float) -> list[NodeRow]:
    """A stratified subset keeping the shape mix: round(fraction * len(nodes)) nodes (half up), shared among the
    shapes by largest remainder of fraction * count (exact arithmetic; ties go to the shape with more nodes, then to
    the shape met first), each shape's first nodes in the given order. The result keeps the given order.
    `fraction` is read as the decimal it was written as (0.1 is a tenth, not the binary float just above it)."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction {fraction}: expected a number from 0 to 1")
    exact = Fraction(fraction).limit_denominator(1_000_000)
    groups: dict[tuple[int, int, int, str], list[int]] = {}
    for i, row in enumerate(nodes):
        groups.setdefault(shape_of(row), []).append(i)
    total = math.floor(exact * len(nodes) + Fraction(1, 2))
    counts = _largest_remainder(total, [len(g) for g in groups.values()]) if nodes else []
    kept = {i for group, n in zip(groups.values(), counts, strict=True) for i in group[:n]}
    return [row for i, row in enumerate(nodes) if i in kept]


# --- the replay ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayPod:
    """A pod to create in a replay: when (seconds from the replay's start), how long it runs once bound (seconds,
    compressed), what it asks for. `gpus` are whole GPUs (a GPU share rounded up to one, as the device plugin
    hands out); `gpu_milli` is the trace's; `gpu_models` the models it may use, empty for any."""

    name: str
    klass: str
    arrival: float
    runtime: float
    cpu_milli: int
    memory_mib: int
    gpus: int
    gpu_milli: int
    gpu_models: tuple[str, ...]
    # the maximum runtime it declares (seconds, compressed as its runtime), None for none: its runtime for a trace
    # that does not say (bench-trace's setting: every pod declares it), what the recording says for a recording
    declared: float | None = None


@dataclass(frozen=True)
class Replay:
    """The replay's pods, sorted by (arrival, name); how many trace pods were left out because the trace never
    scheduled them (no scheduled or no deletion time: their runtime is unknown), and how many arrive after the
    window; the compression of arrivals (trace seconds per replay second)."""

    pods: list[ReplayPod]
    skipped: int
    outside_window: int
    factor: float


_DNS_INVALID = re.compile(r"[^a-z0-9-]+")


def pod_name(text: str) -> str:
    """A valid Kubernetes pod name (a DNS-1123 label: lowercase letters, digits and '-', alphanumeric at both ends,
    at most 63 characters) made from a trace name."""
    name = re.sub(r"-{2,}", "-", _DNS_INVALID.sub("-", text.lower()))[:63].strip("-")
    return name or "pod"


def _unique(name: str, used: set[str]) -> str:
    candidate, k = name, 2
    while candidate in used:
        suffix = f"-{k}"
        candidate = (name[:63 - len(suffix)].rstrip("-") or "pod") + suffix
        k += 1
    used.add(candidate)
    return candidate


def replay(pods: Sequence[PodRow], *, arrival_seconds: float | None = 600.0, runtime_factor: float = 30.0,
           runtime_floor: float = 2.0, runtime_cap: float = 120.0, window: float | None = None,
           unended: bool = False) -> Replay:
    """The README's replay setting: the span from the first to the last creation time (of all the trace's pods)
    compressed into `arrival_seconds` (about 4,895 trace seconds to one for the real trace), each runtime
    (deletion - scheduled) divided by `runtime_factor` and clamped to [runtime_floor, runtime_cap]; arrivals are
    compressed far more than runtimes because at the trace's own pace the cluster is nearly empty. Pods the trace
    never scheduled are left out and counted. `window` keeps only the pods arriving within its first seconds (the
    same intensity, a part of the arrivals).

    A recording replayed at its own pace (`reservoir simulate --as-recorded`) is the same function with the identity
    for each step: `arrival_seconds` None (arrivals as the trace has them, factor 1), `runtime_factor` 1, floor 0,
    cap math.inf, no window; and `unended`: a pod the trace saw no end of (deletion_time empty: still running or still
    pending when the recording stopped) is kept, and runs, once bound, until the trace's last moment (the latest
    creation, scheduled or deletion time of any pod), counted from its scheduled time (from its creation when it
    was never scheduled): all the trace knows is that it held its node that long. A pod deleted before it was ever
    scheduled is still left out (its runtime, had it run, is unknown)."""
    if arrival_seconds is not None and arrival_seconds <= 0:
        raise ValueError("arrival_seconds must be > 0 (or None: as the trace has them)")
    if runtime_factor <= 0 or not 0 <= runtime_floor <= runtime_cap:
        raise ValueError("runtime_factor must be > 0, and 0 <= runtime_floor <= runtime_cap")
    if not pods:
        return Replay([], 0, 0, 1.0)
    first = min(p.creation_time for p in pods)
    span = max(p.creation_time for p in pods) - first
    factor = span / arrival_seconds if arrival_seconds is not None and span > 0 else 1.0
    last = max(max(p.creation_time, p.scheduled_time or p.creation_time, p.deletion_time or p.creation_time)
               for p in pods)
    skipped = outside = 0
    kept: list[tuple[float, str, PodRow, float]] = []
    for p in pods:
        if p.deletion_time is None and unended:
            ran = last - (p.scheduled_time if p.scheduled_time is not None else p.creation_time)
        elif p.scheduled_time is None or p.deletion_time is None:
            skipped += 1
            continue
        else:
            ran = p.deletion_time - p.scheduled_time
        arrival = (p.creation_time - first) / factor
        if window is not None and arrival > window:
            outside += 1
            continue
        kept.append((arrival, p.name, p, ran))
    kept.sort(key=lambda k: (k[0], k[1]))
    used: set[str] = set()
    out = []
    for arrival, name, p, ran in kept:
        runtime = min(runtime_cap, max(runtime_floor, ran / runtime_factor))
        gpus = p.num_gpu if p.num_gpu > 0 else int(p.gpu_milli > 0)
        models = tuple(m.strip() for m in p.gpu_spec.split("|") if m.strip())
        if not p.declares:
            declared: float | None = runtime
        elif p.declared_runtime is None:
            declared = None
        else:
            declared = min(runtime_cap, max(runtime_floor, p.declared_runtime / runtime_factor))
        out.append(ReplayPod(_unique(pod_name(name), used), pod_class(p), arrival, runtime, p.cpu_milli,
                             p.memory_mib, gpus, p.gpu_milli, models, declared))
    out.sort(key=lambda r: (r.arrival, r.name))
    return Replay(out, skipped, outside, factor)
