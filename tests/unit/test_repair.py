"""DESIGN section 4 "Repair", the planner's side: which pending pods a lock of the plan is held for but lack its
toleration (repair.plan_repairs, filled into Plan.repairs)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from agent.planner.jobs import build_jobs
from agent.planner.model import Lock, Repair
from agent.planner.plan import plan
from agent.planner.repair import plan_repairs
from shared import keys
from shared.config import load_config
from shared.keys import LockKind
from shared.ownership import JobRef, queue_owner_id, reservation_owner_id, window_owner_id
from shared.timestamps import stamp
from shared.tolerations import BYPASS_TOLERATION, exclusive_toleration, lock_toleration
from shared.views import PodGroupView, PodView, QueueView, ReservationView
from tests.builders import CONFIG, NOW, node, pod, snap

EXISTS = {"key": keys.LOCK, "operator": "Exists"}


def owner_of(name: str) -> str:
    return JobRef("ns", "Pod", name).owner_id


def starving(**kw: object) -> list:
    """Seed 000's story: a node full of small pods and a big pod starving for it."""
    return [pod(f"small-{i}", "1", node_name="n1") for i in range(4)] + [pod("big", "4", **kw)]


def test_a_job_task_lacking_its_toleration_gets_it() -> None:
    result = plan(snap([node("n1")], starving(), spare=1), CONFIG, NOW)
    assert result.locks["n1"].tasks == ("ns/big",)
    assert result.repairs == [Repair(namespace="ns", name="big", tolerations=(),
                                     add=(lock_toleration(owner_of("big")),))]


def test_a_pod_tolerating_the_lock_key_with_exists_needs_no_repair() -> None:
    pods = starving()
    pods[-1] = replace(pods[-1], tolerations=(EXISTS,))
    result = plan(snap([node("n1")], pods, spare=1), CONFIG, NOW)
    assert result.locks["n1"].tasks == ("ns/big",) and result.repairs == []


def test_a_pod_already_tolerating_its_owner_needs_no_repair_and_others_keep_what_they_carry() -> None:
    mine = lock_toleration(owner_of("big"))
    other = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    pods = starving()
    pods[-1] = replace(pods[-1], tolerations=(mine,))
    assert plan(snap([node("n1")], pods, spare=1), CONFIG, NOW).repairs == []
    pods[-1] = replace(pods[-1], tolerations=(other,))
    [repair] = plan(snap([node("n1")], pods, spare=1), CONFIG, NOW).repairs
    assert repair.tolerations == (other,) and repair.add == (mine,) and repair.key == "ns/big"


def reservation(name: str, *, unschedulable: bool = False) -> ReservationView:
    return ReservationView.from_obj({
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": stamp(NOW - timedelta(minutes=1))},
        "spec": {"template": {"spec": {"containers": [{"name": "r", "resources": {"requests": {"cpu": "2"}}}]}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "owner"}}}], "unschedulable": unschedulable},
        "status": {"phase": "Available", "nodeName": "n1"}})


RESERVING = load_config("maxLockedNodePercent: 90\nstarvation: {enabled: false}")


def test_a_reservation_owner_gets_the_reservation_toleration_while_it_is_available() -> None:
    owner = replace(pod("owner", "1"), labels={"app": "owner"})
    stranger, bound = pod("stranger", "1"), replace(pod("bound", "1", node_name="n1"), labels={"app": "owner"})
    snapshot = replace(snap([node("n1")], [owner, stranger, bound], spare=1), reservations={"r1": reservation("r1")})
    result = plan(snapshot, RESERVING, NOW)
    assert result.reservations[0].phase == "Available"
    assert result.repairs == [Repair(namespace="ns", name="owner", tolerations=(),
                                     add=(lock_toleration(reservation_owner_id("r1")),))]
    # an `unschedulable` Reservation takes no new owners
    closed = replace(snapshot, reservations={"r1": reservation("r1", unschedulable=True)})
    assert plan(closed, RESERVING, NOW).repairs == []


WINDOWS = load_config("""
maxLockedNodePercent: 90
starvation: {enabled: false}
windows:
- {name: ebook, nodeSelector: {business: ebook}, resources: {cpu: "4"}, cron: "0 3 - 4 * * *", startReserveAgo: 2h}
- {name: idle, nodeSelector: {business: none}, resources: {cpu: "4"}, cron: "0 3 - 4 * * *", startReserveAgo: 2h}
""")


def test_a_reserve_pod_gets_the_tolerations_of_the_windows_that_hold_locks() -> None:
    at = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
    reserve = pod("r1", "1", reserveable=True, base=at)
    ordinary, finished = pod("plain", "1", base=at), pod("done", "1", reserveable=True, phase="Failed", base=at)
    result = plan(snap([node("e1", labels={"business": "ebook"})], [reserve, ordinary, finished], spare=1), WINDOWS, at)
    assert {lock.owner for lock in result.locks.values()} == {window_owner_id("ebook")}
    assert result.repairs == [Repair(namespace="ns", name="r1", tolerations=(),
                                     add=(lock_toleration(window_owner_id("ebook")),))]
    # outside the window's range no window holds a lock: nothing to repair
    early = at - timedelta(hours=1.5)
    assert plan(snap([node("e1", labels={"business": "ebook"})], [reserve], spare=1), WINDOWS, early).repairs == []


def test_a_bound_pod_gets_no_repair() -> None:
    owner = owner_of("big")
    lock = Lock(node="n1", owner=owner, kind=LockKind.JOB, subject="ns/Pod/big", reason="r", since=NOW,
                tasks=("ns/big", "ns/gone"))
    big, bound = pod("big", "4"), pod("big", "4", node_name="n1")
    # a task no longer in the snapshot (ns/gone) has nothing to repair
    assert plan_repairs(jobs=build_jobs(snap([], [big])), pods=[big], locks={"n1": lock}, statuses=(),
                        reservations={}, windows=()) == [Repair(namespace="ns", name="big", tolerations=(),
                                                                add=(lock_toleration(owner),))]
    assert plan_repairs(jobs=build_jobs(snap([], [bound])), pods=[bound], locks={"n1": lock}, statuses=(),
                        reservations={}, windows=()) == []
    at = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
    started = pod("r1", "1", reserveable=True, node_name="e1", base=at)
    waiting = pod("r2", "1", reserveable=True, base=at)
    result = plan(snap([node("e1", labels={"business": "ebook"})], [started, waiting], spare=1), WINDOWS, at)
    assert result.locks and [r.name for r in result.repairs] == ["r2"]


def test_repairs_are_sorted_and_add_owners_sorted() -> None:
    groups = [PodGroupView.from_obj({"metadata": {"name": g, "namespace": ns}, "spec": {"minMember": 2}})
              for g, ns in (("g", "ns"), ("h", "other"))]
    pods = [pod("x", "1", group="g"), pod("z", "1", group="h", ns="other"), pod("a", "1", group="g"),
            pod("r", "1", reserveable=True)]
    g, h = (JobRef(ns, "PodGroup", name).owner_id for name, ns in (("g", "ns"), ("h", "other")))
    ebook, idle = (window_owner_id(w.name) for w in WINDOWS.windows)
    locks = {"n1": Lock(node="n1", owner=g, kind=LockKind.JOB, subject="s", reason="r", since=NOW,
                        tasks=("ns/a", "ns/x")),
             "n2": Lock(node="n2", owner=h, kind=LockKind.JOB, subject="s", reason="r", since=NOW, tasks=("other/z",)),
             "n3": Lock(node="n3", owner=idle, kind=LockKind.WINDOW, subject="s", reason="r", since=NOW),
             "n4": Lock(node="n4", owner=ebook, kind=LockKind.WINDOW, subject="s", reason="r", since=NOW)}
    repairs = plan_repairs(jobs=build_jobs(snap([], pods, groups)), pods=pods, locks=locks, statuses=(),
                           reservations={}, windows=WINDOWS.windows)
    assert [r.key for r in repairs] == ["ns/a", "ns/r", "ns/x", "other/z"]
    assert repairs[1].add == tuple(lock_toleration(o) for o in sorted((ebook, idle)))


def guaranteed(name: str, policy: str = "Best-Effort", namespaces: str | None = None) -> QueueView:
    annotations = {keys.QUEUE_LOCK_GUARANTEE: "true", **({keys.QUEUE_NAMESPACES: namespaces} if namespaces else {})}
    return QueueView.from_obj({"metadata": {"name": name, "uid": f"uid-{name}", "annotations": annotations,
                                            "creationTimestamp": stamp(NOW - timedelta(days=1))},
                               "spec": {"guarantee": {"policy": policy, "resource": {"cpu": "4"}}}})


def of_queue(name: str, queue_name: str, *, ns: str = "ns", **kw: object) -> PodView:
    base = pod(name, "1", ns=ns, **kw)
    return replace(base, annotations={**base.annotations, keys.QUEUE_NAME: queue_name})


def test_a_pending_pod_of_a_queue_whose_guarantee_holds_a_lock_gets_its_queues_toleration() -> None:
    """Issue 11: repair gave pending pods their job's, windows' and Reservations' tolerations but not their queue's.
    Now a pending pod of a queue holding a guarantee lock gets it (a `Guaranteed` queue's: both, the lock's and the
    exclusive one), as far as the Queue's `reservoir.sh/namespaces` lets it in; other queues' pods, bound pods and
    pods of a namespace the Queue does not admit get nothing."""
    gold, strict = queue_owner_id("gold"), queue_owner_id("strict")
    pods = [of_queue("w", "gold"), of_queue("bound", "gold", node_name="n9"), of_queue("elsewhere", "other"),
            of_queue("outsider", "gold", ns="team-x"), of_queue("s", "strict"), pod("plain", "1")]
    queues = {"gold": guaranteed("gold", namespaces="ns"), "strict": guaranteed("strict", "Guaranteed")}
    snapshot = replace(snap([node("n1"), node("n2")], pods, spare=1), queues=queues)
    result = plan(snapshot, RESERVING, NOW)
    assert sorted(lock.owner for lock in result.locks.values()) == sorted((gold, strict))
    assert result.repairs == [
        Repair(namespace="ns", name="s", tolerations=(), add=(lock_toleration(strict), exclusive_toleration(strict))),
        Repair(namespace="ns", name="w", tolerations=(), add=(lock_toleration(gold),))]
    # a BestEffort pod of the Guaranteed queue tolerates every lock's taint already: it lacks the exclusive one only
    best_effort = replace(of_queue("be", "strict"), best_effort=True, tolerations=(BYPASS_TOLERATION,))
    result = plan(replace(snapshot, pods=[best_effort]), RESERVING, NOW)
    assert result.repairs == [Repair(namespace="ns", name="be", tolerations=(BYPASS_TOLERATION,),
                                     add=(exclusive_toleration(strict),))]
