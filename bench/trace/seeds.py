"""`make bench-seeds`: bench-trace's goals over many draws of the synthetic trace, in the model (`reservoir simulate`).

One replay on the control plane takes 23 minutes, and its verdicts move from run to run (kube-scheduler alone's 8-GPU
p95 was 217.8-332.4 s over six runs of one trace): one run cannot say how often a goal holds. The model runs a draw in
seconds. For each seed (the synthetic trace's draws and kube-scheduler's tie-breaks) this runs bench-trace's three
arms and, beside them, the backfill arm with `softDrain: false` (the same config but the soft drain: what it changes,
measured side by side), and prints a line per seed and the count of seeds on which each goal holds. The model is
optimistic on the tails (the validation table of `make bench-trace`): these are the model's verdicts, not the
replay's. Last line: `seeds: N draws: 8gpu x3 met in A (B without softDrain), every goal in C`.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.trace import report, simulate
from bench.trace.run import arm_config
from shared.config import load_config

RATIO = "8 GPU p95 at least"


def arms() -> list[simulate.ArmSpec]:
    """bench-trace's arms, then its backfill arm without the soft drain."""
    namespace = "trace-nosoft"
    text = arm_config("backfill", namespace).replace("reservedNodePercent:", "softDrain: false\n  reservedNodePercent:")
    return [*simulate.default_arms(), simulate.ArmSpec("nosoft", load_config(text), namespace)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-seeds", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=12, help="draws, seeds 0 .. N-1 (12)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="arms simulated at once (2)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: at least 1")
    met: dict[str, int] = {}
    ratio_met = without_met = every = 0
    began = time.monotonic()
    for seed in range(args.seeds):
        replay = simulate.replayed(seed=seed)
        outcomes = simulate.simulate(arms(), replay.nodes, replay.pods, seed=seed, jobs=args.jobs)
        by_name = {o.arm.name: o.arm for o in outcomes}
        rows = report.criteria([by_name["alone"], by_name["starvation"], by_name["backfill"]])
        for row in rows:
            met[row["criterion"]] = met.get(row["criterion"], 0) + bool(row["met"])
        without = report.criteria([by_name["alone"], by_name["nosoft"]])
        ratio = next(r for r in rows if r["criterion"].startswith(RATIO))
        ratio_without = next(r for r in without if r["criterion"].startswith(RATIO))
        ratio_met += bool(ratio["met"])
        without_met += bool(ratio_without["met"])
        every += all(r["met"] for r in rows)
        missed = [r["criterion"] for r in rows if not r["met"]]
        print(f"seed {seed}: 8 GPU p95 {ratio['value']}; without softDrain {ratio_without['value'].split(' -> ')[1]}"
              f"; {'every goal met' if not missed else 'NOT MET: ' + '; '.join(missed)}", flush=True)
    print(f"\n{args.seeds} draws in {time.monotonic() - began:.0f} s; each goal, the draws it holds on:")
    for criterion, count in met.items():
        print(f"- {criterion}: {count} of {args.seeds}")
    print(f"seeds: {args.seeds} draws: 8gpu x3 met in {ratio_met} ({without_met} without softDrain), every goal in "
          f"{every}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
