"""`reservoir status --why POD` (agent.why.explain): one case per answer, over plain data and a real plan."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from agent.planner.model import Lock, Plan
from agent.planner.plan import plan
from agent.published import published_document, render
from agent.why import explain, why_text
from shared import keys
from shared.config import ReservoirConfig, load_config
from shared.keys import LockKind
from shared.ownership import window_owner_id
from shared.timestamps import stamp
from shared.tolerations import lock_toleration
from shared.views import PodGroupView, ReservationView
from tests.builders import CONFIG, NOW, node, pod, snap


def raw(name: str, cpu: str | None = "4", *, ns: str = "ns", age: timedelta = timedelta(minutes=10),
        node_name: str = "", phase: str | None = None, gates: tuple[str, ...] = (),
        tolerations: tuple[Mapping[str, str], ...] = (), annotations: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None, scheduler: str | None = None,
        deleting: bool = False) -> dict[str, Any]:
    """A pod as the API returns it."""
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}", "creationTimestamp": stamp(NOW - age),
                            "annotations": dict(annotations or {}), "labels": dict(labels or {})}
    if deleting:
        meta["deletionTimestamp"] = stamp(NOW)
    container: dict[str, Any] = {"name": "c"}
    if cpu is not None:
        container["resources"] = {"requests": {"cpu": cpu, "memory": "1Gi"}}
    spec: dict[str, Any] = {"containers": [container], "tolerations": [dict(t) for t in tolerations]}
    if node_name:
        spec["nodeName"] = node_name
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"metadata": meta, "spec": spec, "status": {"phase": phase or ("Running" if node_name else "Pending")}}


def starving_plan() -> Plan:
    """Two full 4-cpu nodes (and spare ones for the budget); `big` (4 cpu, 10 minutes pending) gets a lock on one;
    `late` (30s) is not starving yet; `huge` (16 cpu) fits nowhere."""
    nodes = [node("n1"), node("n2")]
    pods = [pod("hog1", "4", node_name="n1"), pod("hog2", "4", node_name="n2"),
            pod("big", "4", age=timedelta(minutes=10)), pod("late", "1", age=timedelta(seconds=30)),
            pod("huge", "16", age=timedelta(minutes=10))]
    return plan(snap(nodes, pods, spare=8), CONFIG, NOW)


def published(result: Plan, planned: datetime = NOW) -> dict[str, Any]:
    return json.loads(render(published_document(result, agent="agent-1", planned=planned, config=CONFIG)))


def why(pod_obj: Mapping[str, Any], *, locks: Mapping[str, Lock] | None = None,
        document: Mapping[str, Any] | None = None, config: ReservoirConfig = CONFIG,
        podgroup: PodGroupView | None = None, now: datetime = NOW,
        reservations: Mapping[str, ReservationView] | None = None) -> dict[str, Any]:
    result = starving_plan()
    return explain(pod_obj, podgroup=podgroup, queue=None, reservations=reservations or {},
                   locks=result.locks if locks is None else locks,
                   published=published(result) if document is None else document, config=config, now=now)


def test_a_finished_or_deleted_pod_needs_nothing() -> None:
    done = why(raw("big", phase="Succeeded"))
    assert (done["reason"], done["covered"]) == ("finished", False)
    assert done["explanation"] == "Pod ns/big: has finished (phase Succeeded): there is nothing to cover."
    assert why(raw("big", deleting=True))["reason"] == "deleting"


def test_a_bound_pod_is_not_pending_and_its_node_is_named() -> None:
    result = starving_plan()
    locked = next(iter(result.locks))
    answer = why(raw("x", node_name=locked))
    assert (answer["reason"], answer["nodes"]) == ("bound", [locked])
    assert answer["explanation"] == (f"Pod ns/x: is not pending: it is bound to node {locked}; that node is locked "
                                     "for ns/Pod/big (job).")


def test_gated_names_its_gates() -> None:
    answer = why(raw("big", gates=("example.com/quota", "example.com/other")))
    assert answer["reason"] == "gated" and not answer["covered"]
    assert "held by scheduling gates example.com/quota, example.com/other" in answer["explanation"]


def available(name: str, app: str) -> ReservationView:
    """An Available Reservation on n7 owned by the pods labelled app=`app` in namespace ns."""
    template = {"spec": {"containers": [{"name": "r", "resources": {"requests": {"cpu": "2"}}}]}}
    return ReservationView.from_obj({
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": stamp(NOW - timedelta(minutes=5))},
        "spec": {"template": template, "owners": [{"object": {"namespace": "ns"},
                                                   "labelSelector": {"matchLabels": {"app": app}}}]},
        "status": {"phase": "Available", "nodeName": "n7"}})


def test_a_handover_says_the_plan_s_step() -> None:
    document = published(starving_plan())
    document["handovers"] = [{"pod": "ns/owner", "reservation": "r1", "node": "n7", "reason": "claimed"}]
    owned = {"r1": available("r1", "train"), "r2": available("r2", "serve")}
    owner = raw("owner", gates=(keys.HANDOVER_GATE,), labels={"app": "train"})
    answer = why(owner, document=document, reservations=owned)
    assert answer["reason"] == "handover"
    assert "is an owner of Available Reservation r1, held by" in answer["explanation"]
    assert "the last plan hands it over to Reservation r1 on node n7" in answer["explanation"]
    waiting = why(owner, reservations=owned)
    assert "the last published plan has no step for it yet" in waiting["explanation"]


def test_a_handover_gate_a_tenant_wrote_claims_no_reservation() -> None:
    """Review finding L4: anyone can write the gate on their pod; --why does not call such a pod an owner."""
    answer = why(raw("stranger", gates=(keys.HANDOVER_GATE,), labels={"app": "other"}),
                 reservations={"r1": available("r1", "train")})
    assert answer["reason"] == "handover" and "owns no Available Reservation" in answer["explanation"]


def test_placeholders_and_other_schedulers_are_not_planned_for() -> None:
    placeholder = raw("reservoir-x", ns=keys.NAMESPACE, labels={keys.PLACEHOLDER: "reservation-r1-abcdef"})
    assert why(placeholder)["reason"] == "placeholder"
    assert why(raw("big", scheduler="volcano"))["reason"] == "other-scheduler"


def test_its_job_holds_a_lock_and_the_pod_tolerates_it() -> None:
    result = starving_plan()
    owner = keys.owner_id(LockKind.JOB, "ns/Pod/big")
    answer = why(raw("big", tolerations=(lock_toleration(owner),)))
    assert (answer["reason"], answer["covered"], answer["tolerates"]) == ("locked", True, True)
    assert answer["nodes"] == sorted(result.locks) and len(answer["nodes"]) == 1
    assert answer["explanation"].startswith(
        f"Pod ns/big: is covered by a lock: its job ns/Pod/big holds a job lock on 1 node ({answer['nodes'][0]}) "
        "(held for this very pod): ")
    assert (answer["job"], answer["owner"], answer["queue"]) == ("ns/Pod/big", owner, "default")


def test_its_job_holds_a_lock_but_the_pod_lacks_the_toleration() -> None:
    answer = why(raw("big"))
    assert (answer["reason"], answer["covered"], answer["tolerates"]) == ("untolerated", False, False)
    assert "the pod lacks the toleration of job-ns-Pod-big-" in answer["explanation"]


def test_starving_without_a_lock_gives_the_planner_s_reason_and_notes() -> None:
    document = published(starving_plan())
    entry = next(j for j in document["jobs"] if j["subject"] == "ns/Pod/huge")
    answer = why(raw("huge", "16"), document=document)
    assert (answer["reason"], answer["covered"]) == ("starving-no-lock", False)
    assert answer["explanation"].startswith(
        f"Pod ns/huge: its job ns/Pod/huge is starving since 2026-11-22T11:51:00Z but holds no lock: "
        f"{entry['reason']}. The planner noted: ")
    assert entry["reason"].startswith("cannot reserve")


def test_not_starving_yet_from_the_plan_and_from_its_age() -> None:
    planned = why(raw("late", "1", age=timedelta(seconds=30)))
    assert planned["reason"] == "not-starving"
    assert planned["explanation"] == "Pod ns/late: its job ns/Pod/late is not starving: waiting 30s of 60s threshold."
    # a pod the plan has not seen: judged by the planner's own rule, its age against starvingJobTimeThreshold
    young = why(raw("fresh", "1", age=timedelta(seconds=10)))
    assert young["reason"] == "not-starving"
    assert young["explanation"] == ("Pod ns/fresh: its job ns/Pod/fresh is not starving yet: created 10s ago, "
                                    "starvingJobTimeThreshold is 1m; it may be locked for from 2026-11-22T12:00:50Z.")


def test_a_pod_newer_than_the_plan_and_no_plan_at_all() -> None:
    result = starving_plan()
    old_plan = published(result, planned=NOW - timedelta(minutes=6))
    newer = why(raw("other", "1", age=timedelta(minutes=5)), document=old_plan)
    assert newer["reason"] == "not-planned"
    assert "was created after the last published plan (2026-11-22T11:54:00Z)" in newer["explanation"]
    assert "(Note: the published plan is 6m old, more than 3 resync periods (1m30s)" in newer["explanation"]
    nothing = explain(raw("big"), podgroup=None, queue=None, reservations={}, locks={}, published=None,
                      config=CONFIG, now=NOW)
    assert nothing["reason"] == "no-plan" and "the agent has published nothing" in nothing["explanation"]
    assert why_text(nothing).endswith("\n(no published plan)")


def test_a_best_effort_pod_is_exempt() -> None:
    answer = why(raw("tiny", None), locks={})
    assert answer["reason"] == "exempt" and not answer["covered"]
    assert "a BestEffort pod" in answer["explanation"]


def test_a_reserve_pod_of_a_window_is_covered_by_the_window_s_lock() -> None:
    config = load_config("starvation: {starvingJobTimeThreshold: 60s}\n"
                         "windows:\n- {name: nightly, schedule: '0 3 * * *', duration: 1h, resources: {cpu: '4'}}")
    owner = window_owner_id("nightly")
    lock = Lock(node="n3", owner=owner, kind=LockKind.WINDOW, subject="nightly", reason="window nightly is active",
                since=NOW)
    answer = why(raw("batch", annotations={keys.RESERVEABLE: "true"}, tolerations=(lock_toleration(owner),)),
                 locks={"n3": lock}, config=config)
    assert (answer["reason"], answer["covered"], answer["nodes"]) == ("locked", True, ["n3"])
    assert "a reserve pod of window nightly holds a window lock on 1 node (n3): window nightly is active" in \
        answer["explanation"]
    # the same pod without the annotation is no reserve pod: the window's lock is not for it
    plain = why(raw("batch", tolerations=(lock_toleration(owner),)), locks={"n3": lock}, config=config)
    assert (plain["reason"], plain["covered"], plain["nodes"]) == ("not-planned", False, [])


def test_a_podgroup_job_uses_its_podgroup() -> None:
    group = PodGroupView.from_obj({"metadata": {"name": "g", "namespace": "ns", "uid": "g1",
                                                "creationTimestamp": stamp(NOW - timedelta(seconds=20))},
                                   "spec": {"minMember": 2, "queue": "research"}})
    answer = why(raw("g-0", annotations={keys.GROUP_NAME: "g"}, age=timedelta(minutes=10)), podgroup=group,
                 locks={})
    # the job is the PodGroup, created 20s ago (not the pod, 10 minutes): not starving yet
    assert (answer["job"], answer["queue"], answer["reason"]) == ("ns/PodGroup/g", "research", "not-starving")
    assert "created 20s ago" in answer["explanation"]
