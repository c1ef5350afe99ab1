"""DESIGN section 4 "Repair" decided with the one entitlement function (shared.entitlement): a toleration is added only
for an owner the pod may use; and the pending DaemonSet pods of the namespaces the webhook skips get the lock of the
node their affinity names (issue 10)."""

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
from shared.ownership import JobRef, daemonset_node, reservation_owner_id, window_owner_id
from shared.timestamps import stamp
from shared.tolerations import lock_toleration
from shared.views import OwnerRef, PodView, ReservationView
from tests.builders import NOW, node, pod, snap

RESERVING = load_config("maxLockedNodePercent: 90\nstarvation: {enabled: false}\nreservations: {maxReservedPercent: 90}")
WINDOWS = load_config("""
maxLockedNodePercent: 90
starvation: {enabled: false}
windows:
- {name: ebook, nodeSelector: {business: ebook}, resources: {cpu: "4"}, cron: "0 3 - 4 * * *", startReserveAgo: 2h,
   namespaces: [books]}
- {name: open, nodeSelector: {business: open}, resources: {cpu: "4"}, cron: "0 3 - 4 * * *", startReserveAgo: 2h,
   queues: [night]}
webhook: {trustedNamespaces: [ops]}
""")
EBOOK, OPEN = window_owner_id("ebook"), window_owner_id("open")


def window_lock(node_name: str, owner: str) -> Lock:
    return Lock(node=node_name, owner=owner, kind=LockKind.WINDOW, subject="s", reason="r", since=NOW)


def repairs_of(pods: list[PodView], locks: dict[str, Lock], *, config=WINDOWS, with_grounds: bool = True,
               **snapshot_fields) -> list[Repair]:
    snapshot = replace(snap([], pods), **snapshot_fields)
    grounds = {"snapshot": snapshot, "config": config} if with_grounds else {}
    return plan_repairs(jobs=build_jobs(snapshot), pods=pods, locks=locks, statuses=(),
                        reservations=snapshot.reservations, windows=config.windows, **grounds)


def reservation(name: str, *, status: dict | None = None, **spec) -> ReservationView:
    return ReservationView.from_obj({
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": stamp(NOW - timedelta(minutes=1))},
        "spec": {"template": {"spec": {"containers": [{"name": "r", "resources": {"requests": {"cpu": "3"}}}]}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "owner"}}}], **spec},
        "status": status or {}})


def test_a_waiting_reservation_gives_its_owners_no_toleration_an_available_one_does() -> None:
    full = [pod(f"run-{i}", "1", node_name="n1", runtime="10m", started_ago=timedelta(minutes=5)) for i in range(4)]
    owner = replace(pod("owner", "1"), labels={"app": "owner"})
    waiting = replace(snap([node("n1")], [*full, owner], spare=1),
                      reservations={"r1": reservation("r1", preAllocation=True)})
    result = plan(waiting, RESERVING, NOW)
    assert result.reservations[0].phase == "Waiting" and "n1" in result.locks
    assert result.repairs == [], "entitlement: only an Available Reservation's owners may use its lock"
    # drained: its placeholder is created (still Waiting, under the lock), then stands: Available
    drained = [replace(p, phase="Succeeded") for p in full]
    placed = {"r1": reservation("r1", preAllocation=True, status={"phase": "Available", "nodeName": "n1"})}
    available = replace(snap([node("n1")], [*drained, owner], spare=1), reservations=placed)
    result = plan(available, RESERVING, NOW + timedelta(minutes=6))
    assert result.reservations[0].phase == "Available"
    assert result.repairs == [Repair(namespace="ns", name="owner", tolerations=(),
                                     add=(lock_toleration(reservation_owner_id("r1")),))]


def test_windows_give_reserve_pods_only_the_windows_their_namespace_and_queue_let_in() -> None:
    locks = {"e1": window_lock("e1", EBOOK), "o1": window_lock("o1", OPEN)}
    books = pod("reader", "1", reserveable=True, ns="books")
    night = replace(pod("owl", "1", reserveable=True), annotations={keys.RESERVEABLE: "true",
                                                                    keys.QUEUE_NAME: "night"})
    stranger = pod("stranger", "1", reserveable=True)
    repairs = {r.key: r.add for r in repairs_of([books, night, stranger], locks)}
    assert repairs == {"books/reader": (lock_toleration(EBOOK),), "ns/owl": (lock_toleration(OPEN),)}
    # without the snapshot and config, the windows given are still the grounds (plan.py's call today)
    assert {r.key: r.add for r in repairs_of([books, night, stranger], locks, with_grounds=False)} == repairs


def test_exempt_pods_get_every_owed_toleration() -> None:
    locks = {"e1": window_lock("e1", EBOOK), "o1": window_lock("o1", OPEN)}
    everything = tuple(lock_toleration(o) for o in sorted((EBOOK, OPEN)))
    best_effort = replace(pod("light", "1", reserveable=True), best_effort=True)
    trusted = pod("admin", "1", reserveable=True, ns="ops")
    repairs = {r.key: r.add for r in repairs_of([best_effort, trusted], locks)}
    assert repairs == {"ns/light": everything, "ops/admin": everything}
    # the trusted namespaces are the config's: without it only BestEffort is exempt
    assert [r.key for r in repairs_of([best_effort, trusted], locks, with_grounds=False)] == ["ns/light"]


def test_a_job_lock_task_gets_its_job_toleration_through_entitlement() -> None:
    owner = JobRef("ns", "Pod", "big").owner_id
    lock = Lock(node="n1", owner=owner, kind=LockKind.JOB, subject="ns/Pod/big", reason="r", since=NOW,
                tasks=("ns/big",))
    assert repairs_of([pod("big", "4")], {"n1": lock}) == [
        Repair(namespace="ns", name="big", tolerations=(), add=(lock_toleration(owner),))]


def daemon_pod(name: str, ns: str = "kube-system", **kw) -> PodView:
    base = pod(name, "100m", ns=ns, **kw)
    return replace(base, daemon=True, owners=(OwnerRef("apps/v1", "DaemonSet", "agent", "uid-ds", True),))


def test_a_pending_daemonset_pod_of_a_skipped_namespace_gets_the_lock_of_its_node() -> None:
    locks = {"n1": window_lock("n1", EBOOK)}
    system, own = daemon_pod("agent-x"), daemon_pod("agent-y", ns=keys.NAMESPACE)
    free, bound = daemon_pod("agent-free"), daemon_pod("agent-bound", node_name="n1")
    tenant = daemon_pod("agent-t", ns="ns")
    not_daemon = replace(daemon_pod("lone"), daemon=False, owners=())
    system, own, bound, tenant, not_daemon = (replace(p, daemon_node="n1")
                                              for p in (system, own, bound, tenant, not_daemon))
    free = replace(free, daemon_node="n2")
    repairs = repairs_of([system, own, free, bound, tenant, not_daemon], locks)
    assert repairs == [Repair(namespace="kube-system", name="agent-x", tolerations=(), add=(lock_toleration(EBOOK),)),
                       Repair(namespace=keys.NAMESPACE, name="agent-y", tolerations=(),
                              add=(lock_toleration(EBOOK),))]
    # no target known, nothing to repair
    assert repairs_of([replace(system, daemon_node="")], locks) == []


def test_daemonset_node_reads_the_daemonset_controllers_affinity() -> None:
    def spec(*terms: dict) -> dict:
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": list(terms)}}}}

    named = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert daemonset_node(spec(named)) == "n1"
    assert daemonset_node(spec({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, named)) == "n1"
    assert daemonset_node(spec({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]})) == ""
    assert daemonset_node(spec({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["a"]}]})) == ""
    assert daemonset_node({}) == "" and daemonset_node({"affinity": "x"}) == ""
    assert daemonset_node(spec("junk", {"matchFields": "junk"})) == ""


def test_the_plan_repairs_nothing_beyond_entitlement_at_a_window() -> None:
    at = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
    reader = pod("reader", "1", reserveable=True, ns="books", base=at)
    other = pod("other", "1", reserveable=True, base=at)
    result = plan(snap([node("e1", labels={"business": "ebook"})], [reader, other], spare=1), WINDOWS, at)
    assert {lock.owner for lock in result.locks.values()} == {EBOOK}
    assert [r.key for r in result.repairs] == ["books/reader"]
