"""`python -m bench.unit_speed`: the speed checks the unit tests no longer make, side by side in one run.

The unit tests check these bounds as work done (no Fraction made, no part matched, comparisons per evaluation, C
parser passes), never in seconds, so they pass on a slow machine. This times each hostile input beside an ordinary
one measured in the same run (best of REPEAT rounds, per call) and prints the ratio: a hostile input refused on its
bounds costs about what an ordinary one does. A benchmark: it reports numbers, it asserts nothing.

- duration: a million-digit text (refused on its length) vs `2h30m` (tests/unit/test_duration.py);
- quantity: `1e10000000` (refused on its exponent) vs `1e3` (tests/unit/test_quantity.py);
- queue view: a Queue deserving `1e10000000` cpu (skipped) vs one deserving `1` (tests/unit/test_watchcache.py);
- node affinity: a pod's 100,000-value In list vs a 1-value one, on a node (tests/unit/test_predicates.py);
- deep JSON: parse_json of a 10,000-deep object vs json.loads of 10,000 flat ones (tests/unit/test_watchcache.py).
"""

from __future__ import annotations

import json
import sys
import timeit
from collections.abc import Callable
from typing import Any

REPEAT = 5


def per_call(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of `fn`, the best of REPEAT rounds of `number` calls."""
    return min(timeit.repeat(fn, number=number, repeat=REPEAT)) / number


def refused(fn: Callable[..., object], *args: Any) -> Callable[[], None]:
    def call() -> None:
        try:
            fn(*args)
        except ValueError:  # DurationError, QuantityError and ViewError are ValueErrors
            return
        raise AssertionError(f"{fn.__name__}{args!r:.40} was not refused")
    return call


def cases() -> list[tuple[str, Callable[[], object], Callable[[], object], int]]:
    """(name, the hostile call, the ordinary call, calls per round)."""
    from shared.duration import parse_duration
    from shared.predicates import schedulable_on
    from shared.quantity import to_int
    from shared.views import NodeView, PodView, QueueView
    from shared.watchcache import parse_json

    def queue(cpu: str) -> dict[str, Any]:
        return {"metadata": {"name": "q", "uid": "u"}, "spec": {"deserved": {"cpu": cpu}}}

    def pod(names: list[str]) -> PodView:
        term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": names}]}
        return PodView.from_obj({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}}})

    node = NodeView.from_obj({"metadata": {"name": "n", "labels": {"kubernetes.io/hostname": "node-99999"}},
                              "status": {"allocatable": {"cpu": "4", "pods": "110"}}})
    huge, one = pod([f"node-{i}" for i in range(100_000)]).placement, pod(["node-99999"]).placement
    deep = '{"x":' * 10_000 + "1" + "}" * 10_000
    flat = "[" + ",".join(['{"x":1}'] * 10_000) + "]"
    long_text = "1" * 1_000_000 + "h"
    return [
        ("duration: 1e6 digits / 2h30m", refused(parse_duration, long_text), lambda: parse_duration("2h30m"), 200),
        ("quantity: 1e10000000 / 1e3", refused(to_int, "cpu", "1e10000000"), lambda: to_int("cpu", "1e3"), 2000),
        ("queue view: 1e10000000 / 1", refused(QueueView.from_obj, queue("1e10000000")),
         lambda: QueueView.from_obj(queue("1")), 1000),
        ("affinity: In of 100,000 / of 1", lambda: schedulable_on(huge, node, pods_on_node=0),
         lambda: schedulable_on(one, node, pods_on_node=0), 5000),
        ("JSON: 10,000 deep / 10,000 flat", lambda: parse_json(deep), lambda: json.loads(flat), 3),
    ]


def main() -> int:
    print(f"{'case (hostile / ordinary)':<34} {'hostile':>12} {'ordinary':>12} {'ratio':>8}   per call, best of "
          f"{REPEAT}")
    for name, hostile, ordinary, number in cases():
        a, b = per_call(hostile, number), per_call(ordinary, number)
        print(f"{name:<34} {a * 1e6:>10.1f}us {b * 1e6:>10.1f}us {a / b:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
