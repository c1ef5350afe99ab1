"""Jobs as the planner sees them (DESIGN section 1): pods grouped by PodGroup, controller, or alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from agent.planner.capacity import NodeState
from agent.planner.model import Snapshot
from shared.config import KueueConfig
from shared.entitlement import pods_queue
from shared.ownership import NATIVE_PODGROUP, JobRef
from shared.predicates import DEFAULT_SCHEDULER
from shared.priority import job_class, job_priority
from shared.resources import Resources
from shared.views import PodGroupView, PodView, QueueView, WorkloadView

# the queue of a pod that names none Reservoir honours (a Queue that does not admit its namespace): ranks after every
# queue in queue order, and no Queue's usage, guarantee or priority class is its
NO_QUEUE = ""


@dataclass
class Job:
    """Seed 000's job (DESIGN section 1): a PodGroup, else a controller, else a lone pod, with its pods."""

    ref: JobRef
    queue: str  # shared.entitlement.pods_queue of its first pod, NO_QUEUE when the Queue it names does not admit it
    created: datetime
    min_member: int
    pods: list[PodView] = field(default_factory=list)
    # seed 001: the value of the job's PriorityClass by shared.priority.job_class (its PodGroup's, else its queue's),
    # for a PodGroup's job; None when it has none (`job_class_value`)
    class_value: int | None = None
    # issue 32: the ClusterQueue that admitted its Kueue Workload (kueue_job), "" for any other job
    cluster_queue: str = ""
    # issue 32: the job's own starvation threshold, below starvingJobTimeThreshold (KueueConfig.threshold); None: that
    threshold: timedelta | None = None

    @cached_property
    def owner(self) -> str:
        return self.ref.owner_id

    @property
    def subject(self) -> str:
        return self.ref.full_name

    @cached_property
    def priority(self) -> int:
        """Seed 001 job priority (shared.priority.job_priority): a PodGroup's job has its PodGroup's class, else its
        queue's (`class_value`), but never more than the highest priority its pods were admitted with, and so does a
        Kueue Workload's job (`kueue_job`); any other job the highest of its pods' (a pod that chose no class got its
        queue's from the webhook)."""
        return job_priority(self.class_value, max((p.priority for p in self.pods), default=0))

    @cached_property
    def bound(self) -> int:
        """Seed 000 ReadyTaskNum: pods bound to a node."""
        return sum(1 for p in self.pods if p.is_bound)

    @cached_property
    def pending(self) -> list[PodView]:
        """Seed 000 pending tasks, the ones to reserve for: unbound pods not being deleted and not held by
        `spec.schedulingGates` (kube-scheduler does not try to place a gated pod: it is not starving), largest request
        first (cpu, then memory), then by name."""
        waiting = [p for p in self.pods if not p.is_bound and not p.deleting and not p.gated]
        return sorted(waiting, key=lambda p: (-p.requests["cpu"], -p.requests["memory"], p.name))

    @property
    def ready(self) -> bool:
        """Seed 000 "Job Ready": bound pods >= minMember."""
        return self.bound >= self.min_member


def usage_by_queue(states: Mapping[str, NodeState], podgroups: Mapping[tuple[str, str], PodGroupView],
                   queues: Mapping[str, QueueView]) -> dict[str, dict[str, Resources]]:
    """Seed 001 "allocated" and seed 002 "queue already used": queue -> node -> the queue's requests on that node,
    in one pass over the pods holding resources. A pod counts for the queue it names only when that Queue admits its
    namespace (shared.entitlement.pods_queue, issue 29); else for NO_QUEUE."""
    sums: dict[str, dict[str, list[Resources]]] = {}
    for name, state in states.items():
        for pod in state.pods:
            queue = pods_queue(pod, podgroups, queues) or NO_QUEUE
            sums.setdefault(queue, {}).setdefault(name, []).append(pod.requests)
    return {q: {n: Resources.total(r) for n, r in nodes.items()} for q, nodes in sums.items()}


def job_class_value(podgroup: PodGroupView | None, queue: str, snapshot: Snapshot) -> int | None:
    """Seed 001 (shared.priority.job_class, the one rule the webhook follows too): the value of a PodGroup's job's
    PriorityClass, its PodGroup's own else its queue's; None for a job without a PodGroup, or when neither exists."""
    if podgroup is None:
        return None
    found = job_class(podgroup, snapshot.queues.get(queue), snapshot.priority_classes)
    return None if found is None else found[0].value


def build_jobs(snapshot: Snapshot, kueue: KueueConfig | None = None,
               starving: timedelta | None = None) -> list[Job]:
    """Seed 000: every job with a pending pod not held by scheduling gates (a job with none cannot starve, and holds
    no lock); a Kueue Workload's job only while Kueue admits it (`kueue_job`; `kueue` and `starving`, the config's,
    give its threshold). minMember (the seed's MinAvailable): the PodGroup's, the Workload's admitted pods, a
    Kubernetes PodGroup's gang minCount; for any other job 1: without a gang constraint a job makes progress as soon
    as one of its pods is bound (a ReplicaSet kept partly pending by a full cluster is not starving; a lone pod that
    cannot be placed is). Jobs in job key order, each job's pods in pod key order (podindex), whatever order the
    watch delivered them in."""
    index = snapshot.index  # podindex: the pending pods and each job's pods, without a pass over every pod
    waiting = {pod.job for pod in index.unbound.values() if not pod.deleting and not pod.gated}
    grouped: dict[tuple[str, str, str], list[PodView]] = {}
    for job in sorted(waiting):
        pods = [pod for pod in index.by_job.get(job, ()) if pod.scheduler_name == DEFAULT_SCHEDULER]
        if pods:
            grouped[job] = pods
    jobs = []
    for key, pods in grouped.items():
        ref = JobRef(*key)
        workload = snapshot.workloads.get(key)
        if workload is not None:
            if not workload.admitted:
                continue  # Kueue's to wait for (queued, evicted or finished): not starving, nothing to lock for
            threshold = kueue.threshold(starving) if kueue is not None and starving is not None else None
            queue = pods_queue(pods[0], snapshot.podgroups, snapshot.queues) or NO_QUEUE
            jobs.append(kueue_job(ref, workload, pods, queue, threshold))
            continue
        native = snapshot.native_podgroups.get((ref.namespace, ref.name)) if ref.kind == NATIVE_PODGROUP else None
        if native is not None:  # issue 32: a gang of Kubernetes' own, its minCount, its priority (capped, seed 001)
            queue = pods_queue(pods[0], snapshot.podgroups, snapshot.queues) or NO_QUEUE
            jobs.append(Job(ref, queue, native.created, native.min_count, pods, native.priority))
            continue
        group = snapshot.podgroups.get((ref.namespace, ref.name)) if ref.kind == "PodGroup" else None
        if group is not None:
            created, min_member = group.created, group.min_member
        else:
            created, min_member = min(p.created for p in pods), 1
        queue = pods_queue(pods[0], snapshot.podgroups, snapshot.queues) or NO_QUEUE
        jobs.append(Job(ref, queue, created, min_member, pods, job_class_value(group, queue, snapshot)))
    return jobs


def kueue_job(ref: JobRef, workload: WorkloadView, pods: list[PodView], queue: str,
              threshold: timedelta | None = None) -> Job:
    """Issue 32: a job whose Kueue Workload Kueue admitted (found from the job: shared.views.workloads_by_owner). It
    starves from its admission (while Kueue holds a workload back it is Kueue's to wait for) and needs every pod Kueue
    admitted (minMember: a Workload is admitted whole, and its job runs only when all are placed). Its priority is the
    one Kueue resolved (`spec.priority`, from its WorkloadPriorityClass or PriorityClass), capped by its pods' own as
    a PodGroup's class is (seed 001): a tenant picks a WorkloadPriorityClass freely, and Kueue orders by it only
    within its ClusterQueue. Its queue (`queue`) is the one its pods name, as for any job (usage, guarantees and
    queue order stay Volcano's); the ClusterQueue that admitted it (`cluster_queue`) is what windows' and backfill's
    `queues` match (shared.entitlement.kueue_queue). What Kueue decided is read from the Workload's status, never
    from labels on the pods (a tenant writes those). `threshold`: its starvation threshold when Kueue's
    waitForPodsReady timeout caps it (KueueConfig.threshold)."""
    assert workload.admitted_at is not None
    return Job(ref, queue, workload.admitted_at, workload.count, pods, workload.priority,
               cluster_queue=workload.cluster_queue, threshold=threshold)
