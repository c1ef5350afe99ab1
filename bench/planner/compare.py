"""`make bench-planner-compare BASE=<git rev> [TREE=<git rev>]`: the planner benchmark of BASE and of the working
tree (or of the rev TREE), side by side in one run, so a refactor can show its figures are no worse.

BASE (and TREE) is checked out into a temporary git worktree; each measurement (`bench.planner.run --one N` and
`--guarantees N`, each in its own process) runs alternately in the two trees, `ROUNDS` times, and the best of each
is reported with the ratio working tree / BASE (below 1.00 is faster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROUNDS = 3
SIZES = (500, 5000)
REPO = Path(__file__).resolve().parents[2]


def measure(tree: Path, mode: str, size: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-m", "bench.planner.run", mode, str(size)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    tree_rev = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
    with tempfile.TemporaryDirectory(prefix="reservoir-bench-") as tmp:
        old = Path(tmp) / "base"
        new = Path(tmp) / "tree" if tree_rev else REPO
        for path, rev in ((old, base), (new, tree_rev)):
            if rev:
                subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=REPO, check=True,
                               capture_output=True)
        try:
            print(f"planner benchmark, {base} vs {tree_rev or 'the working tree'}, best of {ROUNDS} alternating runs",
                  file=sys.stderr)
            for size in SIZES:
                for mode, fields in (("--one", ("plan_s", "replan_ms", "peak_mib")),
                                     ("--guarantees", ("with_s", "without_s"))):
                    best: dict[str, dict[str, float]] = {"base": {}, "tree": {}}
                    for round_ in range(ROUNDS):
                        for label, tree in (("base", old), ("tree", new)):
                            print(f"  {size} nodes {mode} {label} round {round_ + 1}", file=sys.stderr, flush=True)
                            got = measure(tree, mode, size)
                            for name in fields:
                                best[label][name] = min(best[label].get(name, float("inf")), got[name])
                    for name in fields:
                        a, b = best["base"][name], best["tree"][name]
                        print(f"{size:>6} nodes {name:<10} base {a:10.3f}  tree {b:10.3f}  ratio {b / a:5.2f}",
                              flush=True)
        finally:
            for path in (old, new):
                if path != REPO:
                    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, check=False,
                                   capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
