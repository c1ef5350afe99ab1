"""Who a pod belongs to (DESIGN section 1): its job, its queue, whether it is a DaemonSet's, and the owner ids of
the locks it may use. Each rule is written once here; pods reach it as API JSON (the webhook) or as views (the
planner), through the small adapters below.

Job: the Volcano PodGroup named by `scheduling.k8s.io/group-name`; else the Kubernetes PodGroup
(`scheduling.k8s.io/v1alpha2`, 1.36) its `spec.schedulingGroup.podGroupName` names (issue 32); else the pod group of
Kueue's pod integration its label `kueue.x-k8s.io/pod-group-name` names; else the pod's controlling ownerReference;
else the pod alone. A Kueue Workload is not a job of its own: it is found from the job
(shared.views.workloads_by_owner), so a job's identity, its lock owner id and its pods' tolerations are the same
with Kueue's Workloads read or not. Each names an object of the pod's own namespace: a pod that names
another job of its namespace joins that job, as a pod may join any PodGroup of its namespace.
Queue: PodGroup `spec.queue`, else `scheduling.volcano.sh/queue-name`, else `default`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared import keys
from shared.keys import LockKind, owner_id

if TYPE_CHECKING:
    from shared.views import PodGroupView, PodView


@dataclass(frozen=True, slots=True)
class JobRef:
    namespace: str
    kind: str  # PodGroup, Job, ReplicaSet, ..., or Pod
    name: str

    @property
    def full_name(self) -> str:
        return keys.job_full_name(self.namespace, self.kind, self.name)

    @property
    def owner_id(self) -> str:
        return owner_id(LockKind.JOB, self.full_name)


def job_identity(meta: Mapping[str, Any], spec: Mapping[str, Any] | None = None) -> tuple[str, str] | None:
    """(kind, name) of the job a pod with this metadata (and spec) belongs to (module docstring). None for a standalone
    pod whose name is not known yet (generateName at admission).

    A name no such object can have names no job: a group name that is not a DNS subdomain (every PodGroup's name is
    one) is passed over for the next rule, a controller whose name no object can have (keys.is_object_name) makes
    the pod its own job, as a controller of a kind no object has does. The webhook's `/validate/pods` refuses both;
    this is for the pods it never judged (made or edited while it was down, or labelled reservoir.sh/ignore): the
    job's name is written into its locks' lock-info annotation, and a group name of 262,100 characters made every
    patch of that lock fail (the API server's 256 KiB limit on a node's annotations) while each plan planned it
    again, holding the starvation budget for good, never written, so never expired."""
    annotations = meta.get("annotations") or {}
    group = annotations.get(keys.GROUP_NAME)
    if group and keys.is_dns_subdomain(group):
        return ("PodGroup", group)
    native = scheduling_group(spec or {})
    if native and keys.is_dns_subdomain(native):
        return (NATIVE_PODGROUP, native)
    kueue_group = kueue_pod_group(meta)
    if kueue_group and keys.is_object_name(kueue_group):
        return (KUEUE_POD_GROUP, kueue_group)
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            kind, name = ref.get("kind"), ref.get("name", "")
            if isinstance(kind, str) and CONTROLLER_KIND.fullmatch(kind) and keys.is_object_name(name):
                return (kind, name)
            break  # a controller of a kind or name no object has: the pod is its own job (CONTROLLER_KIND)
    name = meta.get("name")
    return ("Pod", name) if name else None


# The kind of a controller a pod may name for its job: a Kind as every API object has one (CamelCase letters and
# digits). A job's owner id is `job-<namespace>-<kind>-<name>` made readable, cut, then a 6-hex hash
# (keys.owner_id); with the kind starting with a capital and holding no `-`, the readable part tells namespaces apart
# (namespaces are lowercase), so a tenant cannot make another namespace's owner id by spelling a kind such as
# `prod~Job` in namespace `team` (`team-prod-Job-...`, one 24-bit hash search from team-prod's Job). A controller
# reference of any other kind is no job: the pod is its own.
CONTROLLER_KIND = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")

# issue 32: the kind of a job that is a Kubernetes PodGroup (scheduling.k8s.io), told apart from Volcano's PodGroup
NATIVE_PODGROUP = "PodGroup.scheduling.k8s.io"
# issue 32: the kind of a job that is a pod group of Kueue's pod integration (its Workload is named after the group)
KUEUE_POD_GROUP = "PodGroup.kueue.x-k8s.io"


def kueue_pod_group(meta: Mapping[str, Any]) -> str:
    """The pod group of Kueue's pod integration a pod's label `kueue.x-k8s.io/pod-group-name` names, or "". As with
    Volcano's group annotation, a tenant may write it: it groups pods of one namespace only, and what the group may
    have (minMember, admission, priority) is read from the Workload Kueue made for it, never from the pods."""
    labels = meta.get("labels")
    name = labels.get(keys.KUEUE_POD_GROUP_NAME) if isinstance(labels, Mapping) else None
    return name if isinstance(name, str) else ""


def scheduling_group(spec: Mapping[str, Any]) -> str:
    """The standalone PodGroup (`scheduling.k8s.io/v1alpha2`, same namespace) a pod's `spec.schedulingGroup` names
    (Kubernetes 1.36, feature gate GenericWorkload; it replaced 1.35's `spec.workloadRef`), or ""."""
    group = spec.get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return name if isinstance(name, str) else ""


def is_daemonset_pod(meta: Mapping[str, Any]) -> bool:
    """Controlled by a DaemonSet (a per-node system pod; evicting it is pointless, its controller puts it back)."""
    return any(r.get("controller") and r.get("kind") == "DaemonSet" for r in meta.get("ownerReferences") or ())


def daemonset_node(spec: Mapping[str, Any]) -> str:
    """The one node a DaemonSet pod's required node affinity names (the DaemonSet controller's `matchFields`
    `metadata.name In [node]`), or "" when no term names exactly one node this way."""
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
                if isinstance(node_affinity, Mapping) else None)
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    for term in terms if isinstance(terms, list) else ():
        fields = term.get("matchFields") if isinstance(term, Mapping) else None
        for field in fields if isinstance(fields, list) else ():
            if not isinstance(field, Mapping):
                continue
            values = field.get("values")
            if (field.get("key") == "metadata.name" and field.get("operator") == "In" and isinstance(values, list)
                    and len(values) == 1 and isinstance(values[0], str) and values[0]):
                return values[0]
    return ""


def queue_name(podgroup: PodGroupView | None, annotations: Mapping[str, str]) -> str:
    """The pod's queue: its PodGroup's `spec.queue`, else its `scheduling.volcano.sh/queue-name`, else `default`."""
    if podgroup is not None and podgroup.queue:
        return podgroup.queue
    return annotations.get(keys.QUEUE_NAME) or keys.DEFAULT_QUEUE


def podgroup_named(namespace: str, annotations: Mapping[str, str],
                   podgroups: Mapping[tuple[str, str], PodGroupView]) -> PodGroupView | None:
    """The PodGroup the pod names with `scheduling.k8s.io/group-name`, if it is known."""
    group = annotations.get(keys.GROUP_NAME)
    return podgroups.get((namespace, group)) if group else None


# --- adapters for a pod as API JSON (the webhook's request path) ---

def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def job_of(pod: Mapping[str, Any], namespace: str) -> JobRef | None:
    """The pod's job; None for a standalone pod whose name is not known yet (generateName at admission)."""
    identity = job_identity(_meta(pod), pod.get("spec") or {})
    return JobRef(namespace, *identity) if identity else None


def podgroup_of(pod: Mapping[str, Any], namespace: str,
                podgroups: Mapping[tuple[str, str], PodGroupView]) -> PodGroupView | None:
    return podgroup_named(namespace, _meta(pod).get("annotations") or {}, podgroups)


def queue_of(pod: Mapping[str, Any], podgroup: PodGroupView | None) -> str:
    return queue_name(podgroup, _meta(pod).get("annotations") or {})


# --- adapter for a pod view (the planner) ---

def pod_queue(pod: PodView, podgroups: Mapping[tuple[str, str], PodGroupView]) -> str:
    return queue_name(podgroup_named(pod.namespace, pod.annotations, podgroups), pod.annotations)


# --- owner ids of the lock kinds (DESIGN section 2) ---

def queue_owner_id(queue: str) -> str:
    return owner_id(LockKind.QUEUE, queue)


def window_owner_id(window: str) -> str:
    return owner_id(LockKind.WINDOW, window)


def reservation_owner_id(reservation: str) -> str:
    return owner_id(LockKind.RESERVATION, reservation)
