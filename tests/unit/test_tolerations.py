"""Tolerations against taints (kube-scheduler's ToleratesTaint), the lock tolerations the webhook adds, and the
node predicates built on them (nodeSelector, taints; the whole predicate in test_predicates.py)."""

from __future__ import annotations

from typing import Any

import pytest

from shared import keys
from shared.jsonpatch import apply
from shared.predicates import selects, tolerations_allow
from shared.tolerations import (
    BYPASS_TOLERATION,
    lock_toleration,
    missing,
    tolerates_lock,
    tolerates_taint,
    toleration_ops,
)
from shared.views import NodeView

OWNER = "job-team-a-podgroup-train-0a1b2c"
OTHER = "queue-default-3d4e5f"
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


# --- ToleratesTaint ---

@pytest.mark.parametrize("effect", EFFECTS)
def test_empty_effect_matches_every_effect(effect: str) -> None:
    assert tolerates_taint({"key": "k", "operator": "Equal", "value": "v"}, "k", "v", effect)
    assert tolerates_taint({"key": "k", "operator": "Exists"}, "k", "v", effect)


def test_set_effect_must_equal_the_taints() -> None:
    toleration = {"key": "k", "operator": "Exists", "effect": "NoSchedule"}
    assert tolerates_taint(toleration, "k", "v", "NoSchedule")
    assert not tolerates_taint(toleration, "k", "v", "NoExecute")
    assert not tolerates_taint(toleration, "k", "v", "PreferNoSchedule")


@pytest.mark.parametrize("key", ["a", keys.LOCK, "node.kubernetes.io/not-ready"])
def test_empty_key_with_exists_matches_every_key(key: str) -> None:
    assert tolerates_taint({"operator": "Exists"}, key, "any", "NoSchedule")
    assert tolerates_taint({"key": "", "operator": "Exists"}, key, "", "NoExecute")


def test_set_key_must_equal_the_taints() -> None:
    assert not tolerates_taint({"key": "a", "operator": "Exists"}, "b", "", "NoSchedule")
    assert not tolerates_taint({"key": "a", "operator": "Equal", "value": "v"}, "b", "v", "NoSchedule")


def test_equal_requires_the_value_and_is_the_default_operator() -> None:
    assert tolerates_taint({"key": "k", "operator": "Equal", "value": "v"}, "k", "v", "NoSchedule")
    assert not tolerates_taint({"key": "k", "operator": "Equal", "value": "v"}, "k", "w", "NoSchedule")
    assert not tolerates_taint({"key": "k", "operator": "Equal"}, "k", "w", "NoSchedule")
    assert tolerates_taint({"key": "k", "operator": "Equal"}, "k", "", "NoSchedule"), "no value equals an empty one"
    assert tolerates_taint({"key": "k", "value": "v"}, "k", "v", "NoSchedule"), "no operator means Equal"
    assert not tolerates_taint({"key": "k", "value": "v"}, "k", "w", "NoSchedule")


def test_exists_ignores_the_value() -> None:
    assert tolerates_taint({"key": "k", "operator": "Exists", "value": "ignored"}, "k", "w", "NoSchedule")


def test_unknown_operator_tolerates_nothing() -> None:
    assert not tolerates_taint({"key": "k", "operator": "Gt", "value": "v"}, "k", "v", "NoSchedule")


def test_tolerates_lock() -> None:
    assert tolerates_lock([lock_toleration(OWNER)], OWNER)
    assert not tolerates_lock([lock_toleration(OWNER)], OTHER)
    assert tolerates_lock([{"key": "a", "operator": "Exists"}, BYPASS_TOLERATION], OTHER)
    assert not tolerates_lock([], OWNER)


def test_lock_toleration_is_equal_on_the_lock_taint() -> None:
    assert lock_toleration(OWNER) == {"key": keys.LOCK, "operator": "Equal", "value": OWNER,
                                      "effect": keys.LOCK_EFFECT}
    assert BYPASS_TOLERATION == {"key": keys.LOCK, "operator": "Exists"}


# --- missing and toleration_ops ---

def test_lock_exists_needs_no_owner_toleration() -> None:
    have = [{"key": keys.LOCK, "operator": "Exists"}]
    assert missing(have, [lock_toleration(OWNER), lock_toleration(OTHER)]) == []
    assert toleration_ops(have, [lock_toleration(OWNER)]) == []


def test_lock_exists_for_no_execute_only_still_needs_the_owner_toleration() -> None:
    have = [{"key": keys.LOCK, "operator": "Exists", "effect": "NoExecute"}]
    assert missing(have, [lock_toleration(OWNER)]) == [lock_toleration(OWNER)]
    assert toleration_ops(have, [lock_toleration(OWNER)]) == [
        {"op": "add", "path": "/spec/tolerations/-", "value": lock_toleration(OWNER)}]


def test_blanket_toleration_covers_every_wanted_one() -> None:
    assert missing([{"operator": "Exists"}], [lock_toleration(OWNER), BYPASS_TOLERATION]) == []


def test_owner_toleration_does_not_cover_the_bypass() -> None:
    assert missing([lock_toleration(OWNER)], [BYPASS_TOLERATION]) == [BYPASS_TOLERATION]
    narrow = {"key": keys.LOCK, "operator": "Exists", "effect": keys.LOCK_EFFECT}
    assert missing([narrow], [BYPASS_TOLERATION]) == [BYPASS_TOLERATION], "the bypass tolerates every effect"


def test_missing_keeps_the_wanted_order_and_copies() -> None:
    wanted = [lock_toleration(OTHER), lock_toleration(OWNER)]
    lacking = missing([lock_toleration(OWNER)], wanted)
    assert lacking == [lock_toleration(OTHER)]
    assert lacking[0] is not wanted[0]


def test_toleration_ops_creates_the_list_when_absent() -> None:
    assert toleration_ops(None, [lock_toleration(OWNER)]) == [
        {"op": "add", "path": "/spec/tolerations", "value": [lock_toleration(OWNER)]}]
    assert toleration_ops([], [lock_toleration(OWNER)]) == [
        {"op": "add", "path": "/spec/tolerations/-", "value": lock_toleration(OWNER)}]
    assert toleration_ops(None, []) == []


@pytest.mark.parametrize("tolerations", [
    None,
    [],
    [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
    [lock_toleration(OWNER)],
    [{"key": keys.LOCK, "operator": "Exists", "effect": "NoExecute"}],
])
@pytest.mark.parametrize("wanted", [
    [lock_toleration(OWNER), lock_toleration(OTHER)],
    [BYPASS_TOLERATION],
])
def test_toleration_ops_is_idempotent(tolerations: list[dict[str, Any]] | None,
                                      wanted: list[dict[str, Any]]) -> None:
    pod: dict[str, Any] = {"spec": {} if tolerations is None else {"tolerations": tolerations}}
    once = apply(pod, toleration_ops(pod["spec"].get("tolerations"), wanted))
    assert missing(once["spec"]["tolerations"], wanted) == []
    assert toleration_ops(once["spec"]["tolerations"], wanted) == []
    assert once["spec"]["tolerations"][:len(tolerations or [])] == (tolerations or []), "existing ones kept"


# --- predicates ---

def node(labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> NodeView:
    return NodeView.from_obj({"metadata": {"name": "n1", "labels": labels or {}}, "spec": {"taints": taints or []}})


def test_selects_needs_every_label_equal() -> None:
    gpu = node({"pool": "gpu", "zone": "a"})
    assert selects({}, gpu)
    assert selects({"pool": "gpu"}, gpu)
    assert selects({"pool": "gpu", "zone": "a"}, gpu)
    assert not selects({"pool": "gpu", "zone": "b"}, gpu)
    assert not selects({"rack": "1"}, gpu)


# required node affinity (kube's semantics, matchFields, empty terms): tests/unit/test_predicates.py


def test_tolerations_allow_every_blocking_taint_tolerated() -> None:
    tainted = node(taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                           {"key": "maintenance", "value": "", "effect": "NoExecute"},
                           {"key": "soft", "value": "x", "effect": "PreferNoSchedule"}])
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "ml"}
    maintenance = {"key": "maintenance", "operator": "Exists"}
    assert tolerations_allow([dedicated, maintenance], tainted), "PreferNoSchedule does not block"
    assert not tolerations_allow([dedicated], tainted)
    assert not tolerations_allow([maintenance], tainted)
    assert tolerations_allow([{"operator": "Exists"}], tainted)
    assert tolerations_allow([], node())


def test_tolerations_allow_ignore_lock() -> None:
    locked = node(taints=[{"key": keys.LOCK, "value": OWNER, "effect": keys.LOCK_EFFECT}])
    assert not tolerations_allow([], locked)
    assert tolerations_allow([], locked, ignore_lock=True)
    assert tolerations_allow([lock_toleration(OWNER)], locked)
    assert not tolerations_allow([lock_toleration(OTHER)], locked)
    both = node(taints=[{"key": keys.LOCK, "value": OWNER, "effect": keys.LOCK_EFFECT},
                        {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}])
    assert not tolerations_allow([], both, ignore_lock=True), "only the lock taint is skipped"
    assert tolerations_allow([{"key": "dedicated", "operator": "Exists"}], both, ignore_lock=True)
