"""Seed 001 "Job's Priority inherits Queue's Priority" (the seed's `cache.go`), written once: which PriorityClass a
job has. The webhook gives it to a pod that chose no class; the planner ranks the job by it.

    class(job) = its PodGroup's own `spec.priorityClassName`, when that PriorityClass exists;
                 else its queue's class (QueueView.class_name: `spec.priorityClassName`, else the
                 `reservoir.sh/priority-class` annotation), when that PriorityClass exists;
                 else none.

A job without a PodGroup has no class of its own but its pods' (a pod naming a class chose it; the webhook gives one
that chose none its queue's class, the rule above with no PodGroup).

Hostile tenants. Whoever may create a PodGroup may name any PriorityClass on it (Volcano checks nothing, and a
PodGroup is no pod: ResourceQuota's PriorityClass scope does not count it); whoever may create a pod may name any
existing class on it too, unless a ResourceQuota with a PriorityClass scope (and, for a class an admin reserves,
the ResourceQuota admission plugin's `limitedResources`) forbids it. Hence:
- the webhook's route (a pod's class from its PodGroup) gives nothing a pod naming the class itself would not get:
  the ResourceQuota admission plugin runs after every mutating webhook and judges the pod with the class the webhook
  set, exactly as if the tenant had written it (the Priority plugin, which runs again after the webhook, checks that
  `priority` and `preemptionPolicy` match it);
- the planner's job priority (`job_priority`) follows the rule but never exceeds the highest priority any of the
  job's pods was admitted with: a PodGroup naming `system-cluster-critical` over pods admitted at 0 (the webhook
  skipped with the `reservoir.sh/ignore` label, or down) ranks at 0, not above every other job. This departs from
  the seed, whose scheduler trusts the PodGroup: Reservoir's planner has no ResourceQuota to judge it by, and the
  pods are what kube-apiserver judged.
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.views import PodGroupView, PriorityClassView, QueueView


def job_class(podgroup: PodGroupView | None, queue: QueueView | None,
              classes: Mapping[str, PriorityClassView]) -> tuple[PriorityClassView, str] | None:
    """Seed 001 `cache.go` (module docstring): the job's PriorityClass and where it comes from ("PodGroup ns/name",
    "queue q"), or None when neither the PodGroup's class nor the queue's exists."""
    if podgroup is not None and podgroup.priority_class_name:
        own = classes.get(podgroup.priority_class_name)
        if own is not None:
            return own, f"PodGroup {podgroup.key}"
    if queue is not None and queue.class_name:
        inherited = classes.get(queue.class_name)
        if inherited is not None:
            return inherited, f"queue {queue.name}"
    return None


def job_priority(class_value: int | None, admitted: int) -> int:
    """Seed 001 job priority in the planner: `class_value` (the value of `job_class`, for a PodGroup's job) but never
    above `admitted` (the highest priority among the job's pods, as kube-apiserver admitted them; module docstring);
    `admitted` when the job has no class by the rule (no PodGroup, or neither class exists)."""
    return admitted if class_value is None else min(class_value, admitted)
