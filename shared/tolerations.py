"""Tolerations: the one rule for "does this toleration tolerate that taint", the lock toleration Reservoir grants,
and the JSON Patch that adds tolerations a pod lacks.

The rule is kube-scheduler's own (`v1.Toleration.ToleratesTaint`): an effect, when set, must equal the taint's; a
key, when set, must equal the taint's (an empty key with `Exists` tolerates every key); `Exists` ignores the
value, `Equal` (or no operator) requires it equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared import keys
from shared.jsonpatch import Op, add

# BestEffort and DaemonSet pods may use every locked node (DESIGN section 3, mutation 5)...
BYPASS_TOLERATION: dict[str, str] = {"key": keys.LOCK, "operator": "Exists"}
# ...but only DaemonSet pods every exclusive one (a `Guaranteed` queue's, keys.LOCK_EXCLUSIVE, seed 002)
EXCLUSIVE_BYPASS_TOLERATION: dict[str, str] = {"key": keys.LOCK_EXCLUSIVE, "operator": "Exists"}


def lock_toleration(owner: str) -> dict[str, str]:
    """The toleration of one owner's lock taint."""
    return {"key": keys.LOCK, "operator": "Equal", "value": owner, "effect": keys.LOCK_EFFECT}


def exclusive_toleration(owner: str) -> dict[str, str]:
    """The toleration of one owner's exclusive taint (keys.LOCK_EXCLUSIVE), beside its lock's."""
    return {"key": keys.LOCK_EXCLUSIVE, "operator": "Equal", "value": owner, "effect": keys.LOCK_EFFECT}


def owner_tolerations(owner: str, exclusive: bool) -> list[dict[str, str]]:
    """What a pod entitled to `owner`'s locks needs: the lock toleration, and the exclusive one when the owner's
    locks are exclusive."""
    return [lock_toleration(owner), exclusive_toleration(owner)] if exclusive else [lock_toleration(owner)]


def tolerates_taint(toleration: Mapping[str, Any], key: str, value: str, effect: str) -> bool:
    """kube-scheduler's ToleratesTaint (module docstring)."""
    wanted_effect = toleration.get("effect") or ""
    if wanted_effect and wanted_effect != effect:
        return False
    wanted_key = toleration.get("key") or ""
    if wanted_key and wanted_key != key:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == value


def tolerates_lock(tolerations: Iterable[Mapping[str, Any]], owner: str) -> bool:
    """The tolerations let a pod onto a node locked for `owner`."""
    return any(tolerates_taint(t, keys.LOCK, owner, keys.LOCK_EFFECT) for t in tolerations)


def tolerates_exclusive(tolerations: Iterable[Mapping[str, Any]], owner: str) -> bool:
    """The tolerations tolerate the exclusive taint (keys.LOCK_EXCLUSIVE) of `owner`'s locks."""
    return any(tolerates_taint(t, keys.LOCK_EXCLUSIVE, owner, keys.LOCK_EFFECT) for t in tolerations)


def _covers(have: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """`have` tolerates every taint `wanted` tolerates."""
    wanted_operator = wanted.get("operator") or "Equal"
    if (have.get("effect") or "") and have.get("effect") != (wanted.get("effect") or ""):
        return False
    if wanted_operator == "Exists":
        return ((have.get("operator") or "Equal") == "Exists"
                and (not have.get("key") or have.get("key") == wanted.get("key")))
    return tolerates_taint(have, wanted.get("key") or "", wanted.get("value") or "", wanted.get("effect") or "")


def missing(tolerations: Sequence[Mapping[str, Any]], wanted: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Those of `wanted` the pod's tolerations do not already cover."""
    return [dict(t) for t in wanted if not any(_covers(have, t) for have in tolerations)]


def toleration_ops(tolerations: Sequence[Mapping[str, Any]] | None, wanted: Iterable[Mapping[str, Any]]) -> list[Op]:
    """JSON Patch adding to a pod's `tolerations` (None when the field is absent) those of `wanted` it lacks."""
    lacking = missing(tolerations or (), wanted)
    if not lacking:
        return []
    if tolerations is None:
        return [add("/spec/tolerations", lacking)]
    return [add("/spec/tolerations/-", t) for t in lacking]
