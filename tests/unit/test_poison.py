"""Issue 10, "one bad node annotation or one bad Reservation affects that node or that Reservation only": the planner
fed a node whose `reservoir.sh/lock-info` annotation is malformed (or a Reservation whose owners the matcher cannot
read) still plans the rest, and reads the lock back from the taint so that it can be removed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent.planner.model import lock_on
from agent.planner.plan import current_locks, plan
from agent.planner.reservations import is_owner
from agent.planner.model import Snapshot
from shared import keys
from shared.config import load_config
from shared.keys import LockKind
from shared.kinds import config_from
from shared.ownership import JobRef
from shared.timestamps import stamp
from shared.views import NodeView, PodView, ReservationView
from tests.builders import YAML_ALIAS_BOMB

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CREATED = NOW - timedelta(days=1)
CONFIG = load_config("starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 90}\nmaxLockedNodePercent: 90")
GONE_JOB = JobRef("ns", "Pod", "gone").owner_id  # a job that no longer exists: its lock must go


def node(name: str, *, owner: str | None = None, info: str | None = None, kind: str | None = "job") -> NodeView:
    meta: dict[str, Any] = {"name": name, "labels": {}, "annotations": {}, "creationTimestamp": stamp(CREATED)}
    spec: dict[str, Any] = {}
    if owner is not None:
        spec["taints"] = [{"key": keys.LOCK, "value": owner, "effect": "NoSchedule"}]
        meta["labels"][keys.LOCK] = owner
        if kind is not None:
            meta["labels"][keys.LOCK_KIND] = kind
    if info is not None:
        meta["annotations"][keys.LOCK_INFO] = info
    return NodeView.from_obj({"metadata": meta, "spec": spec,
                              "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}})


def pod(name: str, cpu: str, node_name: str = "", labels: dict[str, str] | None = None) -> PodView:
    return PodView.from_obj({
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels or {},
                     "creationTimestamp": stamp(NOW - timedelta(minutes=5))},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running" if node_name else "Pending"}})


BAD_INFOS = [
    "not json",
    "{",
    "[1, 2, 3]",
    '"a string"',
    "null",
    "5",
    '{"since": "yesterday"}',
    '{"since": 12345}',
    '{"since": "2026-11-22T10:00:00"}',  # no zone: not comparable with the planner's times
    '{"since": "9999-12-31T23:59:59Z", "expires": "0001-01-01T00:00:00Z"}',  # adding a duration would overflow
    '{"expires": ["tomorrow"]}',
    '{"reserved": {"cpu": "banana"}}',
    '{"reserved": {"cpu": "1e10000000"}}',
    '{"reserved": ["cpu"]}',
    '{"reserved": "4"}',
    '{"tasks": "ns/a"}',
    '{"tasks": [1, {"a": 2}, "ns/ok"]}',
    '{"tasks": {"ns/a": 1}}',
    '{"subject": ["x"], "reason": {"r": 1}, "kind": 5, "owner": null}',
    '{"a":' * 1000 + "1" + "}" * 1000,  # deeper than json.loads goes
    "[" * 100_000,
]


@pytest.mark.parametrize("info", BAD_INFOS, ids=range(len(BAD_INFOS)))
def test_a_malformed_lock_info_still_reads_back_the_lock_with_defaults(info: str) -> None:
    lock = lock_on(node("n1", owner=GONE_JOB, info=info))
    assert lock is not None and lock.owner == GONE_JOB and lock.kind is LockKind.JOB
    assert lock.since == CREATED or lock.since.year == 2026
    assert isinstance(lock.subject, str) and isinstance(lock.reason, str)
    assert all(isinstance(task, str) for task in lock.tasks)
    lock.info_json()  # and it can be written back
    # and what could not be read is said, for the node's Warning Event and `reservoir status`
    assert lock.unreadable.startswith(keys.LOCK_INFO + " ") and len(lock.unreadable) > len(keys.LOCK_INFO) + 1


def test_a_lock_info_as_the_agent_writes_it_is_readable_and_each_bad_field_is_named() -> None:
    written = lock_on(node("n1", owner=GONE_JOB, info='{"since": "2026-11-22T10:00:00Z", "expires": null, '
                                                     '"reserved": {"cpu": "2"}, "tasks": ["ns/a"], "reason": "r"}'))
    assert written is not None and written.unreadable == ""
    assert lock_on(node("n1", owner=GONE_JOB, info=written.info_json())).unreadable == ""
    bad = lock_on(node("n1", owner=GONE_JOB, info='{"since": "yesterday", "reserved": {"cpu": "x"}, "tasks": [1]}'))
    assert bad is not None
    for field in ("since is not an RFC 3339 time", "reserved is not a ResourceList", "tasks is not a list"):
        assert field in bad.unreadable, bad.unreadable
    assert "not JSON" in lock_on(node("n1", owner=GONE_JOB, info="{")).unreadable
    assert "missing" in lock_on(node("n1", owner=GONE_JOB, info=None)).unreadable


def test_defaults_replace_only_what_is_unreadable() -> None:
    lock = lock_on(node("n1", owner=GONE_JOB, info='{"since": "2026-11-22T10:00:00Z", "reserved": {"cpu": "x"}, '
                                                  '"tasks": [1, "ns/a"], "reason": "starving"}'))
    assert lock is not None
    assert lock.since == datetime(2026, 11, 22, 10, tzinfo=UTC) and lock.reason == "starving"
    assert not lock.reserved and lock.tasks == ("ns/a",) and lock.subject == GONE_JOB


@pytest.mark.parametrize("info", BAD_INFOS, ids=range(len(BAD_INFOS)))
def test_one_bad_node_does_not_fail_the_plan_and_its_lock_is_released(info: str) -> None:
    """A node locked for a job that is gone, with a malformed annotation: the plan releases it, and still locks
    another node for a starving job."""
    nodes = [node("poisoned", owner=GONE_JOB, info=info), node("n2"), node("n3")]
    busy = [pod(f"small-{name}-{i}", "1", node_name=name) for name in ("poisoned", "n2", "n3") for i in range(4)]
    big = pod("big", "4")
    snapshot = Snapshot(nodes={n.name: n for n in nodes}, pods=[*busy, big])
    current = current_locks(snapshot)
    assert current["poisoned"].owner == GONE_JOB
    result = plan(snapshot, CONFIG, NOW, current)
    assert "poisoned" not in result.locks or result.locks["poisoned"].owner != GONE_JOB
    big_owner = JobRef("ns", "Pod", "big").owner_id
    assert any(lock.owner == big_owner for lock in result.locks.values()), result.notes


def test_a_lock_info_on_a_lock_the_plan_keeps_is_rewritten_whole() -> None:
    """The starving job's own lock, with its annotation hand-edited: the plan keeps the lock, and its annotation is
    whole again (the writer patches a node whose annotation differs)."""
    big_owner = JobRef("ns", "Pod", "big").owner_id
    busy = [pod(f"small-{name}-{i}", "1", node_name=name) for name in ("n1", "n2", "n3") for i in range(4)]
    info = '{"tasks": "oops", "reserved": ["x"], "expires": 7, "since": "%s"}' % stamp(NOW - timedelta(minutes=1))
    nodes = [node("n1", owner=big_owner, info=info), node("n2"), node("n3")]
    snapshot = Snapshot(nodes={n.name: n for n in nodes}, pods=[*busy, pod("big", "4")])
    current = current_locks(snapshot)
    result = plan(snapshot, CONFIG, NOW, current)
    assert "n1" in result.locks, result.notes
    kept = result.locks["n1"]
    assert kept.owner == big_owner and kept.tasks == ("ns/big",)
    assert not kept.same_hold(current["n1"]), "the malformed annotation is rewritten"


def reservation(name: str, owners: list[Any]) -> ReservationView:
    return ReservationView.from_obj({
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": stamp(NOW - timedelta(minutes=1))},
        "spec": {"owners": owners, "template": {"spec": {"containers": [
            {"name": "r", "resources": {"requests": {"cpu": "1"}}}]}}}})


UNREADABLE_OWNERS = [
    [{"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": "owner"}]}}],
    [{"labelSelector": {"matchExpressions": [{"key": ["app"], "operator": "Exists"}]}}],
    [{"labelSelector": {"matchExpressions": "app"}}],
    [{"labelSelector": {"matchLabels": ["app"]}}],
    [{"object": ["a"]}],
    [{"controller": "job"}],
    ["owner", 5],
]


@pytest.mark.parametrize("owners", UNREADABLE_OWNERS, ids=range(len(UNREADABLE_OWNERS)))
def test_a_reservation_whose_owners_cannot_be_read_matches_nothing_and_the_plan_goes_on(owners: list[Any]) -> None:
    bad = reservation("bad", owners)
    good = reservation("good", [{"labelSelector": {"matchLabels": {"app": "owner"}}}])
    owner_pod = pod("o1", "1", labels={"app": "owner"})
    assert not is_owner(bad, owner_pod) and is_owner(good, owner_pod)
    snapshot = Snapshot(nodes={n: node(n) for n in ("n1", "n2", "n3")}, pods=[owner_pod],
                        reservations={"bad": bad, "good": good})
    result = plan(snapshot, CONFIG, NOW, {})
    phases = {status.name: status.phase for status in result.reservations}
    assert phases["good"] in ("Available", "Pending") and "bad" in phases


def test_the_agent_keeps_its_last_good_config_when_config_yaml_is_out_of_bounds() -> None:
    """The agent reads config.yaml through the same bounded `load_config` as the ConfigMap validator: a config
    written while the webhook was down (an alias bomb, 5000-deep nesting) is refused with its reason, and the last
    good config stays in force."""

    for text, reason in ((YAML_ALIAS_BOMB, "once its YAML aliases are expanded"), ("a: " + "{a: " * 5000, "nests deeper"),
                         ("dryRun: true\n# " + "x" * 70_000, "at most 65536")):
        config, error = config_from("MODIFIED", {"data": {keys.CONFIG_KEY: text}}, CONFIG)
        assert config is CONFIG and error is not None and reason in str(error)
