"""Which locks already on the nodes a policy may take over: the displacement rule, written once.

A node holds at most one lock (DESIGN section 1). Within one plan, precedence decides: a node a policy locked is
`taken` for every policy after it (plan.POLICIES, PlanContext.taken). Across plans, a node carries the lock the last
plan wrote (`current`, read back from the node); a policy may always keep its own, and may take another owner's only
when the table below lists that lock's kind for the policy's kind (the kind of lock the policy writes):

| policy (writes)            | may take a current lock of kind                         |
|----------------------------|---------------------------------------------------------|
| reservation (seed 003)     | none                                                    |
| queue guarantee (seed 002) | window; job, when the job is not live                   |
| window (seed 004)          | job, live or not                                        |
| starvation (seed 000)      | reservation, queue, window; job, when the job is not live |

The one condition beyond the kind is a job's liveness, checked for every policy not in TAKES_FROM_LIVE_JOBS: a job
lock still claims its node while its job is *live*, as the policy asking judges it (`live_jobs`):
- for a queue guarantee, every job with a pending pod that is not Job Ready (PlanContext.live_jobs);
- for starvation, those of them with a pending task whose locks have not outlived `maxLockDuration` and that are not
  cooling down after one did (seed 000: such a lock is released, its job goes to the back of the order and waits
  `lockCooldown`, starvation.lock_cooldowns).

A window takes a live job's node while a guarantee may not: meant, and kept. A window is due at a fixed time on the
nodes its `nodeSelector` names and cannot look elsewhere, while a starvation lock is the one kind that can be made
again on other nodes in the same plan (starvation plans last and re-places the job). A guarantee is standing,
chooses among every schedulable node, and seed 002 forbids it "nodes locked by target job".

A Reservation already placed keeps its node whatever the node's lock (its status names the node); the table decides
where a new one may be placed.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from types import MappingProxyType

from agent.planner.model import Lock
from shared.keys import LockKind

DISPLACES: Mapping[LockKind, frozenset[LockKind]] = MappingProxyType({
    # A new Reservation is placed only where it holds no one else's node: its owners are promised resources it
    # can hold now (or drain for, preAllocation), never someone else's lock.
    LockKind.RESERVATION: frozenset(),
    # Seed 002 "Nodes locked by another queue cannot be chosen as locked node": not another queue's, nor a
    # Reservation's (it outranks the guarantee). A window ranks below the guarantee, so its node may be taken; a
    # job's too ("Nodes locked by target job cannot be chosen") once the job is no longer live.
    LockKind.QUEUE: frozenset({LockKind.WINDOW, LockKind.JOB}),
    # Seed 004: the window's nodes are the ones its nodeSelector names; it takes them back from starvation locks
    # (live or not, see the module docstring), never from a queue or a Reservation, which outrank it.
    LockKind.WINDOW: frozenset({LockKind.JOB}),
    # Seed 000, last in precedence: a node some other policy wants is taken already in this plan, so another
    # kind's lock still on a node was released this plan and the node is free; another job's lock is free once that
    # job is no longer live.
    LockKind.JOB: frozenset({LockKind.RESERVATION, LockKind.QUEUE, LockKind.WINDOW, LockKind.JOB}),
})

# The policies that take a job lock whether its job is live or not (module docstring); every other policy that may
# take a job lock takes it only from a job that is not live.
TAKES_FROM_LIVE_JOBS: frozenset[LockKind] = frozenset({LockKind.WINDOW})


def displaces(policy: LockKind, lock: Lock, *, live_jobs: Set[str]) -> bool:
    """Seeds 000, 002, 003, 004 under DESIGN 4's precedence: the policy writing `policy` locks may take over `lock`,
    another owner's lock on a node (DISPLACES, and for a job lock the job's liveness)."""
    if lock.kind not in DISPLACES[policy]:
        return False
    return lock.kind is not LockKind.JOB or policy in TAKES_FROM_LIVE_JOBS or lock.owner not in live_jobs


def may_take(policy: LockKind, lock: Lock | None, *, owner: str, live_jobs: Set[str]) -> bool:
    """Seeds 000, 002, 003, 004: a node whose current lock is `lock` is open to the policy writing `policy` locks for
    `owner`: unlocked, held for `owner` already, or held by a lock the policy displaces. (Nodes taken in this plan are
    checked apart.)"""
    return lock is None or lock.owner == owner or displaces(policy, lock, live_jobs=live_jobs)
