"""`make bench-simulate`: how `reservoir simulate` scales (issue 31: "100,000 pods on 5,000 nodes in under 5 minutes on
one core, with memory stated").

The cluster: the synthetic trace's 1,523 nodes copied four times (each copy's names prefixed) and a stratified subset
of 5,000 of them kept, so the 27 shapes keep their mix. The pods: synthetic traces of seeds 0, 1, ... merged (names
prefixed by seed), each at its own arrival times, until the replay at bench-trace's setting (34 days into 600 s,
the first 300 s, runtimes / 30 from 2 s to 120 s) holds at least PODS pods. The load per node is then about
bench-trace's own (its 152 nodes take 3,877 pods in those 300 s; 5,000 nodes take about 33 times as many).

kube-scheduler's status PATCHes are left out of the model here (`simulate.Timing(patch=None)`; `--status-patches`
puts them back). At 33 times bench-trace's arrivals on one scheduler, they throttle its loop: almost every retry of a
pod that fits nowhere finds another count of reasons over 5,000 nodes, so its condition is PATCHed, 9.7 ms each
behind a client limited to 50 requests a second, and the model's kube-scheduler alone placed 30,118 of 100,191 pods
in 600 s (the real one does the same: its status PATCH is made in the scheduling loop, kubernetes#126858, and
SchedulerAsyncAPICalls, which moves it out, is off by default in 1.36). Pods then pile up beyond the load this
benchmark is for, the speed of the simulation at bench-trace's load per node: with about 9,600 pods pending,
Reservoir's planner took about 20 s a plan on 5,000 nodes (docs/design/benchmarks.md).

Each arm runs in a process of its own, forked from this one once the nodes and pods are built, one after the other
(kube-scheduler alone, starvation locks, locks and backfill, bench-trace's configs), as `reservoir simulate` runs its
arms: one arm at a time, on one core. Each is measured by itself: the CPU seconds of its process (contention on a
shared machine does not inflate it, wall seconds are shown beside it) and the peak RSS its process reached (VmHWM,
the trace it shares with this one included). Run one after another in one process, an arm took longer the later it
came (the backfill arm third: 330-353 s of CPU; in its own process, 236 s), and its peak was the earlier arms' too.
Last line: `simulate: N pods on M nodes: alone C s, starvation C s, backfill C s of CPU; peak RSS R MiB` (the
largest arm's).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from bench.trace import simulate, trace
from shared.tracecsv import REPLAY_SETTING

NODE_COPIES = 4


def scaled_nodes(nodes: int) -> list[trace.NodeRow]:
    """`nodes` of the synthetic trace's nodes copied NODE_COPIES times, a stratified subset."""
    base = trace.synthetic_nodes()
    copies = [dataclasses.replace(row, sn=f"c{k}-{row.sn}") for k in range(NODE_COPIES) for row in base]
    if nodes > len(copies):
        raise SystemExit(f"bench-simulate: NODES {nodes}: at most {len(copies)}")
    return trace.subset_nodes(copies, nodes / len(copies))


def scaled_pods(pods: int) -> tuple[list[trace.ReplayPod], int]:
    """The replay (bench-trace's setting) of synthetic traces merged seed by seed until it holds `pods` pods; and how
    many traces that took."""
    rows: list = []
    seed = 0
    while True:
        rows += [dataclasses.replace(row, name=f"s{seed}-{row.name}") for row in trace.synthetic(seed)[1]]
        seed += 1
        replay = trace.replay(rows, **{k: v for k, v in REPLAY_SETTING.items() if k != "fraction"})
        if len(replay.pods) >= pods:
            return replay.pods, seed


def peak_rss_mib() -> float:
    """The process's peak resident set (VmHWM), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000, help="nodes (5000)")
    parser.add_argument("--pods", type=int, default=100_000, help="pods replayed, at least (100000)")
    parser.add_argument("--arms", default="alone,starvation,backfill", help="arms, in order")
    parser.add_argument("--status-patches", action="store_true",
                        help="model kube-scheduler's status PATCHes too (off: the module docstring)")
    args = parser.parse_args(argv)
    began = time.process_time()
    nodes = scaled_nodes(args.nodes)
    pods, traces = scaled_pods(args.pods)
    print(f"bench-simulate: {len(pods)} pods ({traces} synthetic traces merged) on {len(nodes)} nodes "
          f"({sum(r.gpu for r in nodes)} GPUs), built in {time.process_time() - began:.1f} s of CPU", flush=True)
    wanted = args.arms.split(",")
    specs = [a for a in simulate.default_arms() if a.name in wanted]
    cpu: dict[str, float] = {}
    peaks: list[float] = []
    timing = simulate.Timing() if args.status_patches else simulate.Timing(patch=None)
    fork = multiprocessing.get_context("fork")  # the child shares the trace built above instead of a pickled copy
    for spec in specs:
        with ProcessPoolExecutor(max_workers=1, mp_context=fork) as pool:  # a fresh process for each arm
            measured = pool.submit(measure_arm, spec, nodes, pods, timing).result()
        cpu[spec.name] = measured["cpu"]
        peaks.append(measured["rss"])
        print(f"bench-simulate: {spec.name}: {measured['cpu']:.1f} s of CPU ({measured['wall']:.1f} s wall), peak "
              f"RSS {measured['rss']:.0f} MiB; {measured['placed']} of {measured['pods']} placed; {measured['line']}",
              flush=True)
    print(f"simulate: {len(pods)} pods on {len(nodes)} nodes: "
          + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in cpu.items())
          + f" of CPU; peak RSS {max(peaks, default=peak_rss_mib()):.0f} MiB")
    return 0


def measure_arm(spec: simulate.ArmSpec, nodes: list[trace.NodeRow], pods: list[trace.ReplayPod],
                timing: simulate.Timing) -> dict[str, Any]:
    """One arm in this (forked) process: its CPU and wall seconds, the process's peak RSS, what it placed and its
    line."""
    cpu_before, wall_before = time.process_time(), time.monotonic()
    outcome = simulate.run_arm(spec, nodes, pods, seed=0, tail=300.0, progress=True, timing=timing)
    cpu = time.process_time() - cpu_before
    records = outcome.arm.records
    return {"cpu": cpu, "wall": time.monotonic() - wall_before, "rss": peak_rss_mib(),
            "placed": sum(r.bound is not None for r in records), "pods": len(records), "line": outcome.line}


if __name__ == "__main__":
    sys.exit(main())
