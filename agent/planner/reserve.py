"""Seed 004's two pod annotations as the planner reads them, each written once here: whether a pod is a reserve pod
("recognize pods which need to be reserved") and its maximum runtime ("recognize pod max running time").

The seed sets either on the pod or on its PodGroup ("which means all pods under podgroup are reserve tasks", "the
podgroup will run for a maximum of 500 seconds"). The webhook copies the PodGroup's onto each pod it admits
(webhook/mutate.py copy_reserve_annotations), but a pod admitted before its PodGroup reached the webhook's cache, or
while the webhook was down, carries neither: so the planner reads the PodGroup too. The pod's own annotation comes
first, as the webhook's copy and shared.entitlement.is_reserve_pod have it: a pod that says
`volcano.sh/reserveable: "false"` is not a reserve pod in a reserveable PodGroup, and a pod's own readable maximum
runtime wins over its PodGroup's (an unreadable one, on the pod or the PodGroup, is ignored: shared.views._runtime).

A tenant may write either annotation on their own pods and PodGroups: being a reserve pod lets a pod use a window's
lock only as far as the window's `namespaces` and `queues` let it in (shared.entitlement), and it counts toward a
window only when bound on the nodes that window holds (windows.reserve_demand).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta

from agent.planner.podindex import PodIndex
from shared.entitlement import is_reserve_pod as shared_is_reserve_pod
from shared.ownership import podgroup_named
from shared.views import PodGroupView, PodView

PodGroups = Mapping[tuple[str, str], PodGroupView]


def pod_group(pod: PodView, podgroups: PodGroups) -> PodGroupView | None:
    """The PodGroup the pod names (`scheduling.k8s.io/group-name`), when it is known."""
    return podgroup_named(pod.namespace, pod.annotations, podgroups)


def is_reserve_pod(pod: PodView, podgroups: PodGroups) -> bool:
    """Seed 004: `volcano.sh/reserveable: "true"` on the pod, or on its PodGroup when the pod does not say: the one
    rule (shared.entitlement.is_reserve_pod), read from a pod view."""
    return shared_is_reserve_pod(pod.annotations, pod_group(pod, podgroups))


def maximum_runtime(pod: PodView, podgroups: PodGroups) -> timedelta | None:
    """Seed 004 `volcano.sh/maximum-runtime`: the pod's own, else its PodGroup's; None when neither has a readable one
    (the pod may run forever)."""
    if pod.maximum_runtime is not None:
        return pod.maximum_runtime
    group = pod_group(pod, podgroups)
    return group.maximum_runtime if group is not None else None


RuntimeMemo = Mapping[int, tuple[PodView, PodView]]
"""with_group_runtimes' memo: id(a pod view) -> (that view, the view given its PodGroup's maximum runtime). The
original is kept beside its id, so the id cannot be another view's while the memo lives."""


def with_group_runtimes(pods: PodIndex, podgroups: PodGroups,
                        previous: RuntimeMemo | None = None) -> tuple[dict[str, PodView], RuntimeMemo]:
    """The pods whose view the release curves (capacity.pod_end, capacity.Releases, capacity.future_idle) must see
    replaced, by key: a pod not finished, without a maximum runtime of its own, whose PodGroup has one, as a view
    carrying the PodGroup's (`maximum_runtime`). Only the pods of a PodGroup with a maximum runtime are looked at
    (podindex.PodIndex.by_job); every other pod stays the same object, so capacity.node_states still reuses the
    previous plan's state of every node that hosts none of these.

    With the memo the previous plan returned (`previous`; Plan.runtimes), a pod view given the same runtime as then
    is given the very view it was given then, so node_states reuses the state of a node hosting it too (a new view
    per plan would have it summed again on every plan). Returns the replacements and the memo of this plan (its
    entries only: it holds no pod that left)."""
    memo: dict[int, tuple[PodView, PodView]] = {}
    replaced: dict[str, PodView] = {}
    for (ns, name), group in podgroups.items():
        runtime = group.maximum_runtime
        if runtime is None:
            continue
        for pod in pods.by_job.get((ns, "PodGroup", name), ()):
            if pod.maximum_runtime is not None or maximum_runtime(pod, podgroups) != runtime:
                continue
            known = previous.get(id(pod)) if previous else None
            given = known[1] if known is not None and known[0] is pod and known[1].maximum_runtime == runtime \
                else replace(pod, maximum_runtime=runtime)
            memo[id(pod)] = (pod, given)
            replaced[pod.key] = given
    return replaced, memo
