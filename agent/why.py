"""`reservoir status --why POD`: why a pod is or is not covered by a lock, from plain data (issue 14).

A pure function (`explain`) of the pod as the API gives it, its PodGroup and Queue, the Reservations, the locks read
back from the nodes, the document the agent published (agent.published) and the config. The rules are the planner's
and the webhook's own, called, not re-written: the job and queue (shared.ownership through the pod view), the lock
owners a pod may use (shared.entitlement), whether its tolerations let it onto a lock (shared.tolerations), the
starving test (agent.planner.starvation.is_starving over agent.planner.jobs.build_jobs), placeholders
(agent.planner.reservations.placeholder_of). What the planner decided for a job (its reason, its notes) is read from
the published plan, never re-planned.

The answer, in the order the checks are made (the first that applies), `reason` one of: `finished`, `deleting`,
`bound`, `placeholder`, `other-scheduler`, `handover`, `backfill`, `gated`, `locked` (a lock it may use is held and its
tolerations let it on), `untolerated` (such a lock is held but the pod lacks the toleration), `exempt` (BestEffort or
a DaemonSet's: it may use every lock and needs none), `starving-no-lock`, `not-starving`, `not-planned`, `no-plan`.
`covered` is true only for `locked`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agent.planner.jobs import build_jobs
from agent.planner.model import Lock, Snapshot
from agent.planner.reservations import is_owner, placeholder_of
from agent.planner.starvation import is_starving, job_threshold
from agent.published import freshness, start_text
from shared.config import KUEUE_THRESHOLD_SHARE, ReservoirConfig
from shared.duration import format_duration
from shared.entitlement import Grounds, entitlement
from shared.logs import printable
from shared.ownership import JobRef, pod_queue
from shared.predicates import DEFAULT_SCHEDULER
from shared.timestamps import parse_time, stamp
from shared.tolerations import tolerates_exclusive, tolerates_lock
from shared.views import PodGroupView, PodView, QueueView, ReservationView, WorkloadView


def _gates(pod: Mapping[str, Any]) -> list[str]:
    gates = (pod.get("spec") or {}).get("schedulingGates")
    return [str(g.get("name")) for g in gates if isinstance(g, Mapping)] if isinstance(gates, list) else []


def _published_job(published: Mapping[str, Any] | None, owner: str) -> Mapping[str, Any] | None:
    for job in (published or {}).get("jobs") or ():
        if isinstance(job, Mapping) and job.get("owner") == owner:
            return job
    return None


def _expected(published: Mapping[str, Any] | None, owner: str, starts: list[str]) -> str:
    """Issue 17: the owner's expected start from the published plan, as a clause ("" without one); appended to
    `starts`."""
    for estimate in (published or {}).get("estimates") or ():
        if isinstance(estimate, Mapping) and estimate.get("owner") == owner:
            start = start_text(estimate) or "unknown"
            starts.append(start)
            count = estimate.get("backfilled") or 0
            more = f"; {count} pod{'s' if count != 1 else ''} backfill its nodes meanwhile" if count else ""
            return f"; expected start {start}{more}"
    return ""


def _listed(nodes: Sequence[str], most: int = 5) -> str:
    shown = ", ".join(nodes[:most])
    return shown + (f" and {len(nodes) - most} more" if len(nodes) > most else "")


def explain(pod: Mapping[str, Any], *, podgroup: PodGroupView | None, queue: QueueView | None,
            reservations: Mapping[str, ReservationView], locks: Mapping[str, Lock],
            published: Mapping[str, Any] | None, config: ReservoirConfig, now: datetime,
            where: str = "reservoir-system/reservoir-status", workload: WorkloadView | None = None) -> dict[str, Any]:
    """The answer for one pod (module docstring): `{pod, job, owner, queue, covered, reason, explanation, nodes,
    tolerates, start, plan}`; `nodes`: the locked nodes it may use (or, for `bound`, its node); `tolerates`: whether its
    tolerations let it onto them (null when no lock is involved); `plan`: the published plan's age
    (agent.published.freshness). `workload`: the Kueue Workload of the pod's job (views.workloads_by_owner), read
    while `kueue.workloads` is on."""
    view = PodView.from_obj(pod)
    podgroups = {(podgroup.namespace, podgroup.name): podgroup} if podgroup is not None else {}
    ref = JobRef(*view.job)
    queues = {queue.name: queue} if queue is not None else {}
    workloads = {view.job: workload} if workload is not None else {}
    jobs = build_jobs(Snapshot(pods=[view], podgroups=podgroups, queues=queues, workloads=workloads), config.kueue,
                      config.starvation.starving_job_time_threshold)
    # the queue the pod names (its job's is NO_QUEUE when no such Queue exists or it does not admit the namespace)
    queue_name = pod_queue(view, podgroups) if jobs else (podgroup.queue if podgroup is not None and podgroup.queue
                                                          else "")
    plan = freshness(published, now, where)
    answer: dict[str, Any] = {"pod": view.key, "job": ref.full_name, "owner": ref.owner_id, "queue": queue_name or None,
                              "covered": False, "reason": "", "explanation": "", "nodes": [], "tolerates": None,
                              "start": None, "plan": plan}

    def done(reason: str, text: str, **more: Any) -> dict[str, Any]:
        stale = f" (Note: {plan['warning']}.)" if plan["warning"] and reason not in ("finished", "deleting") else ""
        answer.update(reason=reason, explanation=f"Pod {view.key}: {text}{stale}", **more)
        return answer

    if view.is_terminal:
        return done("finished", f"has finished (phase {view.phase}): there is nothing to cover.")
    if view.deleting:
        return done("deleting", "is being deleted: no lock is held for it.")
    if view.is_bound:
        lock = locks.get(view.node_name)
        held = (f"; that node is locked for {lock.subject} ({lock.kind.value})" if lock is not None
                else "; that node carries no Reservoir lock")
        return done("bound", f"is not pending: it is bound to node {view.node_name}{held}.", nodes=[view.node_name])
    reservation = placeholder_of(view)
    if reservation is not None:
        return done("placeholder", f"is a placeholder of Reservation owner {reservation}: it holds what an Available "
                                   "Reservation reserves on its node; no lock is held for it.")
    if view.scheduler_name != DEFAULT_SCHEDULER:
        return done("other-scheduler", f"is scheduled by {view.scheduler_name}, not default-scheduler: Reservoir "
                                       "plans only for pods kube-scheduler places.")
    if view.handover_gated:
        owned = sorted(key for key, r in reservations.items() if r.phase == "Available" and is_owner(r, view))
        if not owned:
            # the gate is Reservoir's, but a tenant can write it on any pod: it says nothing about ownership
            return done("handover", "carries Reservoir's handover gate but owns no Available Reservation: the agent "
                                    "lifts the gate at its next plan and the pod is scheduled as usual.")
        handover = next((h for h in (published or {}).get("handovers") or ()
                         if isinstance(h, Mapping) and h.get("pod") == view.key), None)
        if handover is None:
            step = "the last published plan has no step for it yet (the agent picks its Reservation at its next plan)"
        elif handover.get("node"):
            step = (f"the last plan hands it over to Reservation {handover.get('reservation')} on node "
                    f"{handover.get('node')}")
        else:
            step = f"the last plan lets it go without a Reservation: {handover.get('reason') or 'no reason given'}"
        return done("handover", f"is an owner of Available Reservation{'s' if len(owned) > 1 else ''} "
                                f"{_listed(owned)}, held by Reservoir's handover gate until the agent hands it "
                                f"over: {step}.")
    if view.backfill_gated:
        return done("backfill", "is held on Reservoir's backfill gate (it opted in with reservoir.sh/backfill): the "
                                "agent lifts it at its next plan, narrowed to a locked node it can use and leave in "
                                "time (with that lock's toleration and activeDeadlineSeconds), or unchanged.")
    gates = _gates(pod)
    if gates:
        return done("gated", f"is held by scheduling gates {', '.join(gates)}: kube-scheduler does not try to place "
                             "it, so it is not starving and no lock is held for it until the gates are lifted.")

    grounds = Grounds(podgroups=podgroups, queues=queues, reservations=reservations, config=config)
    rights = entitlement(pod, view.namespace, grounds, best_effort=view.best_effort)
    usable: dict[str, list[str]] = {}
    for node, lock in sorted(locks.items()):
        if lock.owner in rights.owners:
            usable.setdefault(lock.owner, []).append(node)
    if usable:
        parts, all_tolerated, nodes = [], True, []
        starts: list[str] = []
        for owner, owned in usable.items():
            exclusive = any(locks[n].exclusive for n in owned)
            tolerated = tolerates_lock(view.tolerations, owner) and (
                not exclusive or tolerates_exclusive(view.tolerations, owner))
            all_tolerated = all_tolerated and tolerated
            nodes += owned
            lock = locks[owned[0]]
            tasks = " (held for this very pod)" if any(view.key in locks[n].tasks for n in owned) else ""
            parts.append(f"{rights.owners[owner]} holds a {lock.kind.value} lock on {len(owned)} node"
                         f"{'s' if len(owned) != 1 else ''} ({_listed(owned)}){tasks}: {lock.reason or 'no reason'}"
                         + ("" if tolerated else f"; the pod lacks the toleration of {owner} (the webhook gives it at "
                                                 "creation, the agent's repair adds it to a pending pod)")
                         + _expected(published, owner, starts))
        reason = "locked" if all_tolerated else "untolerated"
        text = "is covered by a lock: " if all_tolerated else "has a lock it may use but cannot use it yet: "
        return done(reason, text + "; ".join(parts) + ".", covered=all_tolerated, nodes=nodes,
                    tolerates=all_tolerated, start=starts[0] if len(starts) == 1 else None)
    if rights.every_lock is not None:
        but = "" if rights.every_exclusive else " (but exclusive ones)"
        return done("exempt", f"is {rights.every_lock}: it may use every locked node{but} and no lock is held for it.")

    if workload is not None and not workload.admitted:
        state = "was evicted by Kueue" if workload.evicted else "has finished" if workload.finished else (
            f"is waiting in Kueue's LocalQueue {workload.queue_name or '(none)'}, not admitted yet")
        return done("kueue", f"its job is Kueue's Workload {workload.namespace}/{workload.name}, which {state}: Kueue "
                             "holds it back, so it is not starving and no lock is held for it until Kueue admits it.")
    starvation = config.starvation
    entry = _published_job(published, ref.owner_id)
    if entry is not None:
        notes = [n.partition(" reason=")[2] or n for n in entry.get("notes") or () if isinstance(n, str)]
        detail = f" The planner noted: {'; '.join(notes)}." if notes else ""
        if entry.get("starving"):
            since = entry.get("starvingSince")
            return done("starving-no-lock", f"its job {ref.full_name} is starving"
                                            f"{f' since {since}' if since else ''} but holds no lock: "
                                            f"{entry.get('reason')}.{detail}")
        return done("not-starving", f"its job {ref.full_name} is not starving: {entry.get('reason')}.{detail}")
    if published is None:
        return done("no-plan", "no lock is held for it, and the agent has published no plan to say why.")
    if not starvation.enabled:
        return done("not-planned", "starvation is disabled (starvation.enabled: false): no job gets a lock for "
                                   "waiting.")
    job = jobs[0] if jobs else None
    if job is None:
        return done("not-planned", "is not part of any job the planner considers (nothing pending to reserve for).")
    planned = parse_time(plan["planned"]) if plan["planned"] else None
    threshold = job_threshold(job, starvation)
    crossing = job.created + threshold
    capped = job.threshold is not None and job.threshold < starvation.starving_job_time_threshold
    which = (f"its threshold ({KUEUE_THRESHOLD_SHARE:g} of kueue.podsReadyTimeout)" if capped
             else "starvingJobTimeThreshold")
    if not is_starving(job, now=now, threshold=threshold):
        since = "admitted by Kueue" if workload is not None else "created"
        return done("not-starving", f"its job {ref.full_name} is not starving yet: {since} "
                                    f"{format_duration(now - job.created)} ago, {which} is "
                                    f"{format_duration(threshold)}; it may be locked for from {stamp(crossing)}.")
    omitted = int(((published.get("omitted") or {}).get("jobs")) or 0)
    if omitted:
        why = f"the published plan left out {omitted} jobs to fit its size limit, this one among them"
    elif planned is not None and job.created > planned:
        why = f"the job was created after the last published plan ({plan['planned']})"
    else:
        why = ("the last published plan did not judge it (one of its pods may not be pending, or the plan "
               "predates its pods)")
    return done("not-planned", f"its job {ref.full_name} has waited past {which} "
                               f"({format_duration(threshold)}) but {why}.")


def why_text(answer: Mapping[str, Any]) -> str:
    """`--why` as a table prints it: the paragraph, and the plan it was read from (non-printables escaped)."""
    plan = answer["plan"]
    tail = (f"(plan published by {plan['agent']} at {plan['planned']}, {plan['age']} ago)" if plan["planned"]
            else "(no published plan)")
    return f"{printable(answer['explanation'])}\n{printable(tail)}"
