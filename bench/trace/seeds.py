"""`make bench-seeds`: bench-trace's goals over many draws of the synthetic trace, in the model (`reservoir simulate`).

One replay on the control plane takes 23 minutes, and its verdicts move from run to run (kube-scheduler alone's 8-GPU
p95 was 217.8-333.9 s over ten runs of one trace): one run cannot say how often a goal holds. The model runs a draw in
seconds. For each seed (the synthetic trace's draws and kube-scheduler's tie-breaks) this runs bench-trace's three
arms and, beside them, the backfill arm with `softDrain: false` (the same config but the soft drain: what it changes,
measured side by side), and prints a line per seed and the count of seeds on which each goal holds, with the 8-GPU
pods' reservation floor (report.reservation_floors: what no reservation without eviction can beat on that draw), so
that a draw on which x3 is out of any reservation's reach says so. The model is
optimistic on the tails (the validation table of `make bench-trace`): these are the model's verdicts, not the
replay's. Last line: `seeds: N draws: 8gpu x3 met in A (B without softDrain; reachable without eviction in F),
every goal in C`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.trace import report, simulate
from bench.trace.run import arm_config
from shared.config import load_config


def arms() -> list[simulate.ArmSpec]:
    """bench-trace's arms, then its backfill arm without the soft drain."""
    namespace = "trace-nosoft"
    config = load_config(arm_config("backfill", namespace))
    nosoft = config.model_copy(update={"starvation": config.starvation.model_copy(update={"soft_drain": False})})
    return [*simulate.default_arms(), simulate.ArmSpec("nosoft", nosoft, namespace)]


def eight_gpu(alone: report.Arm, arm: report.Arm) -> tuple[str, bool]:
    """The 8-GPU pods' p95 with `arm` and how many times lower than alone's, and whether that meets the goal."""
    a8, r8 = report.class_p95(alone, "8 GPU"), report.class_p95(arm, "8 GPU")
    if a8 is None or r8 is None:
        return "n/a", False
    ratio = report.wait_ratio(a8, r8)
    return f"{r8:.1f} s (x{ratio:.1f})", ratio >= report.RATIO_GOAL


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-seeds", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=12, help="draws, seeds 0 .. N-1 (12)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="arms simulated at once (2)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: at least 1")
    met: dict[str, int] = {}
    ratio_met = without_met = floor_met = every = 0
    gaps: list[float] = []
    began = time.monotonic()
    for seed in range(args.seeds):
        replay = simulate.replayed(seed=seed)
        outcomes = simulate.simulate(arms(), replay.nodes, replay.pods, seed=seed, jobs=args.jobs)
        by_name = {o.arm.name: o.arm for o in outcomes}
        alone = by_name["alone"]
        rows = report.criteria([alone, by_name["starvation"], by_name["backfill"]])
        for row in rows:
            met[row["criterion"]] = met.get(row["criterion"], 0) + bool(row["met"])
        (with_soft, soft_met), (without, no_soft_met) = (eight_gpu(alone, by_name[name])
                                                         for name in ("backfill", "nosoft"))
        ratio_met += soft_met
        without_met += no_soft_met
        floor = report.floor_p95(by_name["backfill"])
        a8 = report.class_p95(alone, "8 GPU")
        reachable = a8 is not None and floor is not None and report.wait_ratio(a8, floor) >= report.RATIO_GOAL
        floor_met += reachable
        above = report.above_floor(by_name["backfill"])
        gaps += above
        reach = ("n/a" if a8 is None or floor is None else f"{floor:.1f} s (x{report.wait_ratio(a8, floor):.1f}), "
                 f"waits above it mean {statistics.mean(above):.1f} s")
        every += all(r["met"] for r in rows)
        missed = [r["criterion"] for r in rows if not r["met"]]
        print(f"seed {seed}: 8 GPU p95 alone {'n/a' if a8 is None else f'{a8:.1f} s'} -> {with_soft}; without "
              f"softDrain {without}; floor {reach}; "
              f"{'every goal met' if not missed else 'NOT MET: ' + '; '.join(missed)}", flush=True)
    print(f"\n{args.seeds} draws in {time.monotonic() - began:.0f} s; each goal, the draws it holds on:")
    for criterion, count in met.items():
        print(f"- {criterion}: {count} of {args.seeds}")
    if gaps:
        print(f"- 8 GPU pods' wait above their floor, over every draw: mean {statistics.mean(gaps):.1f} s, p95 "
              f"{report.percentile(gaps, 95):.1f} s ({len(gaps)} pods)")
    print(f"seeds: {args.seeds} draws: 8gpu x3 met in {ratio_met} ({without_met} without softDrain; reachable "
          f"without eviction in {floor_met}), every goal in {every}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
