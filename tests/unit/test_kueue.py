"""Issue 32, Kueue's Workloads as the planner reads them: a pod naming its Workload is a task of that Workload's job,
which starves only once Kueue admitted it, needs every pod admitted, is of the ClusterQueue that admitted it and has
the priority Kueue resolved; a Workload Kueue holds back, evicted or finished has no job."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
import yaml

from agent.planner.jobs import build_jobs
from agent.planner.plan import plan
from shared import keys, kinds
from shared.config import ReservoirConfig, load_config
from shared.ownership import KUEUE_POD_GROUP, JobRef, job_of
from shared.timestamps import stamp
from shared.views import PodView, ViewError, WorkloadView, workloads_by_owner
from tests.builders import CONFIG, NOW, node, pod, snap
from tests.unit.test_deploy import CHART, DEPLOY, helm_template, kustomize

OWNER = JobRef("ns", "Job", "train").owner_id


def workload_obj(name: str = "job-train-1a2b3", *, counts: tuple[int, ...] = (2,), admitted_ago: timedelta | None =
                 timedelta(minutes=5), cluster_queue: str = "team-a", priority: int | None = None,
                 evicted: bool = False, finished: bool = False) -> dict[str, Any]:
    """A Workload as Kueue's manager writes it for an admitted `batch/v1` Job (its shape read off the local cluster's
    Kueue v0.17.0)."""
    conditions = []
    if admitted_ago is not None:
        moment = stamp(NOW - admitted_ago)
        conditions += [{"type": kind, "status": "True", "lastTransitionTime": moment, "reason": kind}
                       for kind in ("QuotaReserved", "Admitted")]
    if evicted:
        conditions.append({"type": "Evicted", "status": "True", "lastTransitionTime": stamp(NOW),
                           "reason": "PodsReadyTimeout"})
    if finished:
        conditions.append({"type": "Finished", "status": "True", "lastTransitionTime": stamp(NOW),
                           "reason": "Succeeded"})
    spec: dict[str, Any] = {"queueName": "lq", "podSets": [{"name": f"set-{i}", "count": c, "template": {}}
                                                          for i, c in enumerate(counts)]}
    if priority is not None:
        spec["priority"] = priority
    status: dict[str, Any] = {"conditions": conditions}
    if admitted_ago is not None:
        status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": [
            {"name": f"set-{i}", "count": c} for i, c in enumerate(counts)]}
    return {"apiVersion": keys.KUEUE_API_VERSION, "kind": "Workload",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "creationTimestamp": stamp(NOW - timedelta(hours=1)),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train",
                                              "uid": "job-uid", "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec, "status": status}


def task(name: str, cpu: str, *, node_name: str = "", job: str = "train", priority: int = 0,
         age: timedelta = timedelta(hours=1)) -> PodView:
    """A pod of the Job `job`, as the Job controller makes it (its controller ownerReference)."""
    view = pod(name, cpu, node_name=node_name, priority=priority, age=age)
    return dataclasses.replace(view, job=("ns", "Job", job))


def kueue_snap(pods: list[PodView], workloads: list[WorkloadView], nodes: int = 2) -> Any:
    return dataclasses.replace(snap([node(f"n{i}") for i in range(1, nodes + 1)], pods, spare=2),
                               workloads=workloads_by_owner(workloads))


def test_a_workload_reads_what_kueue_wrote() -> None:
    view = WorkloadView.from_obj(workload_obj(counts=(2, 3), priority=1000))
    assert (view.queue_name, view.cluster_queue, view.count, view.priority) == ("lq", "team-a", 5, 1000)
    assert view.admitted and view.admitted_at == NOW - timedelta(minutes=5)
    queued = WorkloadView.from_obj(workload_obj(admitted_ago=None, counts=(4,)))
    assert not queued.admitted and queued.count == 4 and queued.cluster_queue == ""
    assert not WorkloadView.from_obj(workload_obj(evicted=True)).admitted
    assert not WorkloadView.from_obj(workload_obj(finished=True)).admitted


@pytest.mark.parametrize("bad, field", [
    ({"spec": {"podSets": "all"}}, "spec.podSets"),
    ({"spec": {"podSets": [{"count": -1}]}}, "spec.podSets"),
    ({"spec": {"podSets": [{"count": 10**12}]}}, "spec.podSets"),
    ({"spec": {"podSets": [{"count": 1}] * 9}}, "spec.podSets"),
    ({"spec": {"priority": "high"}}, "spec.priority"),
    ({"status": {"admission": {"clusterQueue": 7}}}, "status.admission.clusterQueue"),
    ({"status": {"conditions": [{"type": "Admitted", "status": "True", "lastTransitionTime": "soon"}]}},
     "status.conditions[0].lastTransitionTime"),
])
def test_an_unreadable_workload_is_refused_naming_the_field(bad: dict[str, Any], field: str) -> None:
    obj = workload_obj()
    for part, value in bad.items():
        obj[part] = {**obj[part], **value}
    with pytest.raises(ViewError, match=f"Workload ns/job-train-1a2b3: {field.replace('[', '.').replace(']', '.')}"):
        WorkloadView.from_obj(obj)


def test_a_jobs_workload_is_the_one_its_controller_reference_names_and_the_job_keeps_its_identity() -> None:
    """The Workload is found from the job (its controller ownerReference names the Job), never from what a pod says:
    the job stays `Job/train` for the webhook and the planner alike, with or without Kueue's Workloads read, so lock
    owner ids and tolerations do not change when the switch does. Kueue's annotation on the pod is not read."""
    meta = {"name": "train-0", "namespace": "ns", "annotations": {keys.KUEUE_WORKLOAD: "job-train-1a2b3"},
            "ownerReferences": [{"kind": "Job", "name": "train", "uid": "job-uid", "controller": True}]}
    assert job_of({"metadata": meta}, "ns") == JobRef("ns", "Job", "train")
    view = WorkloadView.from_obj(workload_obj())
    assert view.owner == ("Job", "train")
    older = dataclasses.replace(view, name="job-train-old", created=view.created - timedelta(hours=1))
    evicted = WorkloadView.from_obj(workload_obj(name="job-train-new", evicted=True))
    assert workloads_by_owner([older, view, evicted]) == {("ns", "Job", "train"): view}, "the admitted one"
    bare = workload_obj()
    orphan = WorkloadView.from_obj({**bare, "metadata": {**bare["metadata"], "ownerReferences": []}})
    assert workloads_by_owner([orphan]) == {}
    # a pod naming another Workload in Kueue's annotation joins nothing by it
    liar = task("liar", "4", job="other")
    assert build_jobs(kueue_snap([liar], [view]))[0].min_member == 1


def test_an_admitted_workloads_job_starves_from_admission_needs_every_pod_with_kueues_priority_capped() -> None:
    workload = WorkloadView.from_obj(workload_obj(counts=(2,), priority=5000, admitted_ago=timedelta(minutes=5)))
    pods = [task("train-0", "2", node_name="n1", age=timedelta(hours=2), priority=6000),
            task("train-1", "4", age=timedelta(hours=2), priority=6000)]
    [job] = build_jobs(kueue_snap(pods, [workload]))
    assert (job.queue, job.cluster_queue, job.min_member, job.priority) == (keys.DEFAULT_QUEUE, "team-a", 2, 5000)
    assert job.created == NOW - timedelta(minutes=5), "starving counts from the admission, not the pods' creation"
    assert not job.ready, "one of the two pods Kueue admitted is placed: the job has not started"
    low = [dataclasses.replace(p, priority=0) for p in pods]
    assert build_jobs(kueue_snap(low, [workload]))[0].priority == 0, \
        "a WorkloadPriorityClass raises a job no higher than its pods' own PriorityClass (a tenant picks it freely)"


def test_a_workload_kueue_holds_back_has_no_job_and_without_the_workload_the_pods_are_a_job_as_before() -> None:
    pods = [task("train-0", "4")]
    for held in (workload_obj(admitted_ago=None), workload_obj(evicted=True), workload_obj(finished=True)):
        assert build_jobs(kueue_snap(pods, [WorkloadView.from_obj(held)])) == []
    [alone] = build_jobs(kueue_snap(pods, []))  # kueue.workloads off: the pods alone, minMember 1
    assert (alone.min_member, alone.created) == (1, NOW - timedelta(hours=1))


def test_a_partly_placed_workload_is_locked_for_where_without_kueue_it_would_count_as_started() -> None:
    """Seed 000 on a Kueue Job of two 4-cpu pods: one placed on n1, the other starving behind small pods on n2. With
    its Workload read, the job needs both and n2 is locked for it; without, one bound pod made it `ready`."""
    small = [pod(f"small-{i}", "1", node_name="n2", ns="other", runtime="10m", started_ago=timedelta(minutes=8))
             for i in range(4)]
    pods = [task("train-0", "4", node_name="n1"), task("train-1", "4"), *small]
    workload = WorkloadView.from_obj(workload_obj(counts=(2,)))
    with_kueue = plan(kueue_snap(pods, [workload]), CONFIG, NOW)
    assert {name: lock.owner for name, lock in with_kueue.locks.items()} == {"n2": OWNER}
    assert plan(kueue_snap(pods, []), CONFIG, NOW).locks == {}
    # admitted a moment ago: not starving yet, whatever the pods' age
    fresh = WorkloadView.from_obj(workload_obj(counts=(2,), admitted_ago=timedelta(seconds=10)))
    assert plan(kueue_snap(pods, [fresh]), CONFIG, NOW).locks == {}
    # evicted by Kueue (its waitForPodsReady timeout): the lock goes
    gone = WorkloadView.from_obj(workload_obj(counts=(2,), evicted=True))
    assert plan(kueue_snap(pods, [gone]), CONFIG, NOW).locks == {}


# --- the switch: config, kustomize component, Helm value ---

def kueue_roles(docs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """ClusterRoles granting kueue.x-k8s.io: name -> verbs."""
    return {d["metadata"]["name"]: {verb for rule in d["rules"] if keys.KUEUE_GROUP in rule.get("apiGroups", [])
                                    for verb in rule["verbs"]}
            for d in docs if d.get("kind") == "ClusterRole"
            and any(keys.KUEUE_GROUP in rule.get("apiGroups", []) for rule in d.get("rules") or [])}


KUEUE_ROLES = {"reservoir-agent-kueue": {"list", "watch", "patch"}, "reservoir-webhook-kueue": {"list", "watch"},
               "reservoir-status-kueue": {"get"}}


def test_the_switch_is_off_by_default_and_the_component_or_the_chart_value_adds_read_only_rbac() -> None:
    assert ReservoirConfig().kueue.workloads is False
    assert load_config("kueue: {workloads: true}").kueue.workloads is True
    assert kueue_roles(kustomize(DEPLOY)) == {}
    assert kueue_roles(kustomize(DEPLOY, ("kueue",))) == KUEUE_ROLES
    off = helm_template()
    assert off.returncode == 0, off.stderr
    assert kueue_roles([d for d in yaml.safe_load_all(off.stdout) if d]) == {}
    on = helm_template("kueue.workloads=true")
    assert on.returncode == 0, on.stderr
    docs = [d for d in yaml.safe_load_all(on.stdout) if d]
    assert kueue_roles(docs) == KUEUE_ROLES
    [configmap] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == keys.CONFIGMAP_NAME]
    assert load_config(configmap["data"][keys.CONFIG_KEY]).kueue.workloads is True
    assert (CHART / "files" / "kueue-rbac.yaml").resolve() == DEPLOY / "components" / "kueue" / "rbac.yaml"
    assert kinds.WORKLOADS.path == f"/apis/{keys.KUEUE_API_VERSION}/workloads"


# --- waitForPodsReady: the lock before Kueue gives up ---

def test_with_kueues_pods_ready_timeout_a_workloads_job_starves_after_at_most_half_of_it() -> None:
    """starvingJobTimeThreshold 60 s; Kueue evicts a Workload whose pods are not ready 80 s after admission: its job
    starves after 40 s (half), so a Workload admitted 50 s ago is locked for, and still not one admitted 30 s ago; a
    timeout of 10 min leaves the 60 s threshold as it is. Other jobs keep the config's threshold."""
    small = [pod(f"small-{i}", "1", node_name="n2", ns="other", runtime="10m", started_ago=timedelta(minutes=8))
             for i in range(4)]
    pods = [task("train-0", "4", node_name="n1"), task("train-1", "4"), *small]
    timed = load_config("starvation: {starvingJobTimeThreshold: 60s, reservedNodePercent: 100}\n"
                        "maxLockedNodePercent: 90\nkueue: {workloads: true, podsReadyTimeout: 80s}")
    assert timed.kueue.threshold(timedelta(seconds=60)) == timedelta(seconds=40)
    at_50 = WorkloadView.from_obj(workload_obj(counts=(2,), admitted_ago=timedelta(seconds=50)))
    assert plan(kueue_snap(pods, [at_50]), CONFIG, NOW).locks == {}, "60 s threshold without the timeout"
    assert {n: lock.owner for n, lock in plan(kueue_snap(pods, [at_50]), timed, NOW).locks.items()} == {"n2": OWNER}
    at_30 = WorkloadView.from_obj(workload_obj(counts=(2,), admitted_ago=timedelta(seconds=30)))
    result = plan(kueue_snap(pods, [at_30]), timed, NOW)
    assert result.locks == {} and result.wake_at == NOW + timedelta(seconds=10), "woken when it crosses 40 s"
    assert load_config("kueue: {podsReadyTimeout: 10m}").kueue.threshold(timedelta(seconds=60)) == timedelta(seconds=60)
    with pytest.raises(Exception, match="podsReadyTimeout"):
        load_config("kueue: {podsReadyTimeout: 0s}")


def test_a_workloads_start_estimate_goes_on_the_workload() -> None:
    """Issue 17's estimate of a Workload's job is written where Kueue's users look: the Workload (an annotation),
    not its pods; rewritten only when it moves, as on a PodGroup."""
    from agent.planner.backfill import estimate_marks
    from agent.planner.model import StartEstimate

    view = WorkloadView.from_obj(workload_obj())
    pods = {p.key: p for p in (task("train-0", "4"), task("train-1", "4"))}
    estimate = StartEstimate(owner=OWNER, kind=keys.LockKind.JOB, subject="ns/Job/train",
                             at=NOW + timedelta(minutes=3), unknown="", nodes=("n2",), backfilled=0,
                             tasks=tuple(sorted(pods)))
    [mark] = estimate_marks([estimate], pods, {}, NOW, workloads_by_owner([view]))
    assert (mark.kind, mark.namespace, mark.name, mark.text) == ("Workload", "ns", view.name,
                                                                 stamp(NOW + timedelta(minutes=3)))
    written = dataclasses.replace(view, annotations={keys.EXPECTED_START: stamp(NOW + timedelta(minutes=3, seconds=2))})
    assert estimate_marks([estimate], pods, {}, NOW, workloads_by_owner([written])) == ()
    # without the Workload (kueue.workloads off) the pods carry it, as before
    assert {m.kind for m in estimate_marks([estimate], pods, {}, NOW)} == {"Pod"}


# --- a ClusterQueue is a queue by its name: windows' and backfill's `queues` ---

def test_a_kueue_pod_is_of_its_workloads_cluster_queue_for_windows_and_backfill_never_by_its_labels() -> None:
    """Windows' and backfill's `queues` match a Kueue pod's ClusterQueue, read from its job's admitted Workload; its
    Volcano queue (usage, guarantees, queue order, the queue's lock) stays the one it names, for the webhook and the
    planner alike. A label saying the ClusterQueue opens nothing."""
    from shared.entitlement import Grounds, backfill_queue, entitlement, kueue_queue, pods_queue
    from shared.ownership import queue_owner_id, window_owner_id

    admitted = WorkloadView.from_obj(workload_obj())
    workloads = workloads_by_owner([admitted])
    view = task("train-1", "4")
    assert kueue_queue(view.job, workloads) == "team-a"
    assert backfill_queue(view, Grounds(workloads=workloads)) == "team-a"
    assert pods_queue(view, {}, {}) == backfill_queue(view, Grounds()) == keys.DEFAULT_QUEUE
    held = workloads_by_owner([WorkloadView.from_obj(workload_obj(evicted=True))])
    assert kueue_queue(view.job, held) is None

    config = load_config("windows:\n- name: nightly\n  nodeSelector: {pool: gpu}\n  resources: {cpu: '8'}\n"
                         "  cron: '0 3 - 4 * * *'\n  queues: [team-a]\nkueue: {workloads: true}")
    meta = {"name": "train-1", "namespace": "ns", "labels": {"kueue.x-k8s.io/cluster-queue-name": "team-a"},
            "annotations": {keys.RESERVEABLE: "true"},
            "ownerReferences": [{"kind": "Job", "name": "train", "uid": "job-uid", "controller": True}]}
    pod_obj = {"metadata": meta, "spec": {"containers": []}}
    window = window_owner_id("nightly")
    rights = entitlement(pod_obj, "ns", Grounds(config=config, workloads=workloads)).owners
    assert window in rights and queue_owner_id(keys.DEFAULT_QUEUE) in rights
    assert queue_owner_id("team-a") not in rights, "a ClusterQueue is matched by name, not a Volcano queue's lock"
    # the same pod and labels without the Workload admitting it (or with kueue.workloads off): not the window's
    assert window not in entitlement(pod_obj, "ns", Grounds(config=config, workloads=held)).owners
    assert window not in entitlement(pod_obj, "ns", Grounds(config=config)).owners


# --- Kubernetes' own PodGroups (1.36, GenericWorkload) ---

def native_group(min_count: int | None = 2, priority: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}} if min_count else {"basic": {}}}
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": keys.NATIVE_SCHEDULING_API_VERSION, "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "ns", "uid": "pg",
                         "creationTimestamp": stamp(NOW - timedelta(hours=1))},
            "spec": spec}


def test_a_pod_in_a_scheduling_group_is_a_task_of_that_podgroups_job_of_min_count() -> None:
    from shared.ownership import NATIVE_PODGROUP
    from shared.views import NativePodGroupView

    obj = {"metadata": {"name": "train-0", "namespace": "ns", "uid": "u", "creationTimestamp": stamp(NOW)},
           "spec": {"schedulingGroup": {"podGroupName": "train"}, "containers": [
               {"name": "c", "resources": {"requests": {"cpu": "4"}}}]}, "status": {}}
    assert job_of(obj, "ns") == JobRef("ns", NATIVE_PODGROUP, "train")
    view = PodView.from_obj(obj)
    assert view.job == ("ns", NATIVE_PODGROUP, "train")
    group = NativePodGroupView.from_obj(native_group(min_count=2, priority=100))
    assert (group.min_count, group.priority) == (2, 100)
    assert NativePodGroupView.from_obj(native_group(min_count=None)).min_count == 1, "the basic policy: one by one"
    with pytest.raises(ViewError, match="minCount"):
        NativePodGroupView.from_obj(native_group(min_count=-3))
    snapshot = dataclasses.replace(snap([node("n1")], [view]), native_podgroups={("ns", "train"): group})
    [job] = build_jobs(snapshot)
    assert (job.min_member, job.created, job.priority) == (2, NOW - timedelta(hours=1), 0), \
        "the group's priority is capped by its pods' own, as a Volcano PodGroup's class is"
    [alone] = build_jobs(snap([node("n1")], [view]))  # API not served: the pod alone, minMember 1
    assert alone.min_member == 1


def test_the_planner_entitles_a_scheduling_group_pod_to_its_podgroups_lock_as_the_webhook_does() -> None:
    """The repair (and every planner entitlement) reads the pod through pod_meta: it must see the same job as the
    webhook, which reads the whole pod, or the pod is never given its gang's toleration."""
    from agent.planner.reservations import pod_meta
    from shared.entitlement import Grounds, entitlement
    from shared.ownership import NATIVE_PODGROUP

    obj = {"metadata": {"name": "train-0", "namespace": "ns", "uid": "u", "creationTimestamp": stamp(NOW)},
           "spec": {"schedulingGroup": {"podGroupName": "train"}, "containers": []}, "status": {}}
    view = PodView.from_obj(obj)
    owner = JobRef("ns", NATIVE_PODGROUP, "train").owner_id
    assert owner in entitlement(obj, "ns", Grounds()).owners
    assert owner in entitlement(pod_meta(view), "ns", Grounds(), best_effort=view.best_effort).owners


# --- pod groups of Kueue's pod integration ---

def group_workload_obj(name: str = "trainers", count: int = 3) -> dict[str, Any]:
    """The Workload Kueue makes for a pod group (pod_controller.go ConstructComposableWorkload): named after the group,
    annotated `kueue.x-k8s.io/is-group-workload: "true"`, owned by every pod of the group, none its controller."""
    obj = workload_obj(name, counts=(count,))
    obj["metadata"]["annotations"] = {keys.KUEUE_IS_GROUP_WORKLOAD: "true"}
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": f"{name}-{i}", "uid": f"u{i}"}
                                          for i in range(count)]
    return obj


def test_a_kueue_pod_group_is_one_job_of_its_workloads_count_and_its_pods_share_its_lock() -> None:
    """Pods labelled `kueue.x-k8s.io/pod-group-name: trainers` are one job, `PodGroup.kueue.x-k8s.io/trainers`, for
    the webhook and the planner alike; its Workload (Kueue's group Workload of that name) gives minMember, admission
    and priority, so three admitted pods starve together and the group's lock is every member's."""
    meta = {"name": "trainers-0", "namespace": "ns", "labels": {keys.KUEUE_POD_GROUP_NAME: "trainers"}}
    ref = job_of({"metadata": meta}, "ns")
    assert ref == JobRef("ns", KUEUE_POD_GROUP, "trainers")
    view = WorkloadView.from_obj(group_workload_obj())
    assert view.owner == (KUEUE_POD_GROUP, "trainers")
    assert workloads_by_owner([view]) == {("ns", KUEUE_POD_GROUP, "trainers"): view}
    pods = [dataclasses.replace(pod(f"trainers-{i}", "4", age=timedelta(hours=1)), job=("ns", KUEUE_POD_GROUP,
                                                                                         "trainers"))
            for i in range(3)]
    [job] = build_jobs(kueue_snap(pods, [view], nodes=3))
    assert (job.ref, job.min_member, job.created) == (ref, 3, NOW - timedelta(minutes=5))
    held = WorkloadView.from_obj({**group_workload_obj(), "status": {"conditions": []}})
    assert build_jobs(kueue_snap(pods, [held], nodes=3)) == [], "not admitted: Kueue's to wait for"


def test_only_kueues_group_annotation_makes_a_workload_a_pod_groups_and_the_label_groups_one_namespace() -> None:
    plain = group_workload_obj()
    plain["metadata"]["annotations"] = {}
    assert WorkloadView.from_obj(plain).owner == ("", ""), "owned by pods, none its controller, not a group's: none"
    flagged = group_workload_obj()
    flagged["metadata"]["annotations"] = {keys.KUEUE_IS_GROUP_WORKLOAD: "yes"}
    assert WorkloadView.from_obj(flagged).owner == ("", "")
    # a controller reference wins over the annotation: the Workload is its controller's
    both = group_workload_obj()
    both["metadata"]["ownerReferences"] = workload_obj()["metadata"]["ownerReferences"]
    assert WorkloadView.from_obj(both).owner == ("Job", "train")
    # the label joins a group of the pod's own namespace only, and a non-string label value names none
    assert job_of({"metadata": {"name": "p", "labels": {keys.KUEUE_POD_GROUP_NAME: "trainers"}}}, "other") == \
        JobRef("other", KUEUE_POD_GROUP, "trainers")
    assert job_of({"metadata": {"name": "p", "labels": {keys.KUEUE_POD_GROUP_NAME: ""}}}, "ns") == \
        JobRef("ns", "Pod", "p")
