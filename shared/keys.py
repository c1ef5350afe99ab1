"""Every annotation, label and taint key Reservoir reads or writes, the owner-id rule, and API coordinates.

DESIGN section 2: a lock is one node held for one owner, written on the node as a `NoSchedule` taint and a
label (both keyed `reservoir.sh/lock`, valued with the owner id), a kind label and a JSON info annotation.
No other module spells these strings.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from functools import lru_cache

DOMAIN = "reservoir.sh"

# the names of PodGroups, Reservations, PriorityClasses (every CRD object's metadata.name): DNS subdomains
MAX_DNS_SUBDOMAIN = 253
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns_subdomain(name: object) -> bool:
    """A name such an object can have: lowercase letters, digits, '-' and '.', at most MAX_DNS_SUBDOMAIN characters."""
    return isinstance(name, str) and 0 < len(name) <= MAX_DNS_SUBDOMAIN and bool(_DNS_SUBDOMAIN.fullmatch(name))


_OBJECT_NAME = re.compile(r"[\x21-\x2e\x30-\x7e]+")  # printable ASCII but '/', no space


def is_object_name(name: object) -> bool:
    """A name any object of the API can have (a controller a pod's ownerReference names): at most MAX_DNS_SUBDOMAIN
    printable characters, no space or '/' (the API server refuses others in every object's metadata.name; it checks
    an ownerReference's name for being non-empty only)."""
    return isinstance(name, str) and 0 < len(name) <= MAX_DNS_SUBDOMAIN and bool(_OBJECT_NAME.fullmatch(name))

# --- on nodes: the lock (the agent's only durable state) ---
LOCK = f"{DOMAIN}/lock"  # taint key and label key; value = owner id
LOCK_KIND = f"{DOMAIN}/lock-kind"  # label; value = LockKind
LOCK_INFO = f"{DOMAIN}/lock-info"  # annotation; JSON: owner, kind, reason, since, expires, reserved
LOCK_EFFECT = "NoSchedule"
# annotation on the nodes a starvation lock held when it outlived maxLockDuration; JSON {job owner id: RFC 3339 time
# it expired}: the job's cool-down (starvation.lock_cooldowns), removed by the agent once `lockCooldown` has passed
LOCK_EXPIRED = f"{DOMAIN}/lock-expired"
# taint key, beside the lock taint, on a node whose lock the BestEffort exemption does not reach (a `Guaranteed`
# queue guarantee's, seed 002): only the owner's pods and those exempt as a DaemonSet's tolerate it; value = owner id
LOCK_EXCLUSIVE = f"{DOMAIN}/lock-exclusive"
LOCK_TAINT_KEYS = (LOCK, LOCK_EXCLUSIVE)  # every taint key Reservoir writes (both with effect LOCK_EFFECT)
# taint key with effect DRAIN_EFFECT on the node where a job not yet starving (or left without a lock) would fit
# soonest (starvation `softDrain`): kube-scheduler's TaintToleration score sends other pods elsewhere while they fit
# elsewhere, and never keeps one off the node; value = the job's owner id. Not a lock: nothing is refused for it, no
# toleration is added for it or checked. Written and removed by the agent as a node mark (Plan.node_marks)
DRAIN = f"{DOMAIN}/drain"
DRAIN_EFFECT = "PreferNoSchedule"

# --- on pods and other objects ---
IGNORE = f"{DOMAIN}/ignore"  # label: the webhook leaves the object alone
QUEUE_PRIORITY_CLASS = f"{DOMAIN}/priority-class"  # Queue annotation naming a PriorityClass
QUEUE_NAMESPACES = f"{DOMAIN}/namespaces"  # Queue annotation: comma-separated namespaces whose pods may use its lock
# Queue annotation: "true" opts the Queue's `spec.guarantee` into node locks (seed 002); without it Reservoir locks
# nothing for the guarantee (a Volcano cluster's existing guarantees are Volcano's quota floor). An annotation, since
# Volcano's Queue schema prunes every spec field it does not declare.
QUEUE_LOCK_GUARANTEE = f"{DOMAIN}/lock-guarantee"
# Queue annotations standing in for the seed 002 fields Volcano's Queue schema does not declare (kube-apiserver prunes
# them); the spec field wins when both are set (shared.views.QueueView). `Best-Effort` or `Guaranteed`:
QUEUE_GUARANTEE_POLICY = f"{DOMAIN}/guarantee-policy"
# `spec.guarantee.percentage` as JSON: '{"dimensions": ["cpu", "memory"], "value": 0.5}'
QUEUE_GUARANTEE_PERCENTAGE = f"{DOMAIN}/guarantee-percentage"
RESERVATION_AFFINITY = f"{DOMAIN}/reservation-affinity"  # pod annotation naming a Reservation
KOORDINATOR_RESERVATION_AFFINITY = "scheduling.koordinator.sh/reservation-affinity"  # the same, Koordinator's name
RESERVATION_ALLOCATED = f"{DOMAIN}/reservation-allocated"  # pod annotation: bound through this Reservation
# seed 003 placeholders (agent/planner/reservations.py): a pod in Reservoir's namespace, bound to the Reservation's
# node, requesting what the Reservation still holds. Label value: the Reservation's owner id; annotation: its name.
PLACEHOLDER = f"{DOMAIN}/placeholder"
PLACEHOLDER_RESERVATION = f"{DOMAIN}/reservation"  # placeholder annotation: its Reservation's name
# the PriorityClass placeholders run at: the highest a user-defined class may have, preemptionPolicy Never, so no
# ordinary pod can preempt one (preemption evicts only lower priorities); the webhook refuses it outside NAMESPACE
PLACEHOLDER_PRIORITY_CLASS = "reservoir-placeholder"  # deploy/priorityclass.yaml
# deploy/critical-priority-policy.yaml: the policy (and its binding) admitting a pod at or above the placeholder's
# priority only in the namespaces an admin labels CRITICAL_PRIORITY_LABEL=allowed
CRITICAL_PRIORITY_POLICY = "reservoir-critical-priority"
CRITICAL_PRIORITY_LABEL = f"{DOMAIN}/critical-priority"  # namespace label "allowed": may run critical priorities
# scheduling gate the webhook gives an owner of an Available Reservation at CREATE: the agent picks its Reservation,
# narrows its node affinity to that node, frees the reserved resources under a brief lock, then lifts the gate
HANDOVER_GATE = f"{DOMAIN}/reservation-handover"
# backfill (agent/planner/backfill.py): a pod (or its PodGroup) annotated "true" opts in; when the config's
# `backfill` switch covers its namespace or queue and it declares a maximum runtime, the webhook holds it at CREATE with
# the gate BACKFILL_GATE, and the agent lifts it within one resync: unchanged, or narrowed to one locked node with
# that lock's toleration and activeDeadlineSeconds
BACKFILL = f"{DOMAIN}/backfill"
BACKFILL_GATE = f"{DOMAIN}/backfill-check"  # scheduling gate: held for the agent's backfill choice
# node annotation, written by the agent only, before it lets a pod backfill the node: JSON {pod uid: {"pod":
# "namespace/name", "owner": lock owner id, "until": RFC 3339}}. The entitlement check accepts the lock's toleration
# on that pod because this record says so (shared.entitlement), never because of anything on the pod.
BACKFILL_GRANTS = f"{DOMAIN}/backfill-grants"
# node annotation, the agent's: the backfill room of a locked node, JSON {"room": ResourceList, "until":
# RFC 3339} (shared.backfill.Room); the webhook gates a pod only when some locked node's room takes it in time
BACKFILL_ROOM = f"{DOMAIN}/backfill-room"
# an owner's expected start as the agent last estimated it (agent/planner/backfill.start_estimates), on its
# PodGroup, else on its pending pods: an RFC 3339 time, or "unknown: N pods without a maximum runtime on node X". The
# agent rewrites it when the estimate moves (by 5 s or more) and leaves the last one in place once the owner starts.
EXPECTED_START = f"{DOMAIN}/expected-start"

# --- Koordinator's pod-side and Reservation keys (its apis/extension/reservation.go) ---
KOORDINATOR_DOMAIN = "scheduling.koordinator.sh"
# pod annotation, JSON {"name", "uid"}: written beside RESERVATION_ALLOCATED for tools built for Koordinator
KOORDINATOR_RESERVATION_ALLOCATED = f"{KOORDINATOR_DOMAIN}/reservation-allocated"
KOORDINATOR_RESERVATION_IGNORED = f"{KOORDINATOR_DOMAIN}/reservation-ignored"  # pod label "true": ignores them all
KOORDINATOR_RESERVATION_ORDER = f"{KOORDINATOR_DOMAIN}/reservation-order"  # Reservation label: lower is preferred
# read by nobody in Reservoir: the webhook warns that they are ignored (docs/tasks/koordinator.md)
KOORDINATOR_RESTRICTED_OPTIONS = f"{KOORDINATOR_DOMAIN}/reservation-restricted-options"  # pod annotation
KOORDINATOR_EXACT_MATCH = f"{KOORDINATOR_DOMAIN}/exact-match-reservation"  # pod annotation
KOORDINATOR_PRE_ALLOCATION_REQUIRED = f"{KOORDINATOR_DOMAIN}/pre-allocation-required"  # pod label
# the field manager Reservoir writes a Koordinator Reservation's status as; a later status write by any other manager
# means a second writer (Koordinator's own scheduler): Reservoir then leaves the object alone (shared.views)
KOORDINATOR_FIELD_MANAGER = "reservoir-agent"

# --- Kueue's keys (sigs.k8s.io/kueue v0.17 apis and pkg/controller/constants) ---
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/v1beta2"
WORKLOAD_PLURAL = "workloads"
# pod annotation Kueue writes into an admitted job's pod template (only with its TopologyAwareScheduling gate on): not
# read; a job's Workload is found by the Workload's ownerReference (shared.views.workloads_by_owner)
KUEUE_WORKLOAD = f"{KUEUE_GROUP}/workload"
KUEUE_QUEUE_NAME = f"{KUEUE_GROUP}/queue-name"  # a job's label: its LocalQueue (Reservoir reads the Workload's)
# pod label of Kueue's pod groups (its pod integration): the pods of one group, one job, one Workload of that name
KUEUE_POD_GROUP_NAME = f"{KUEUE_GROUP}/pod-group-name"
# Workload annotation "true", Kueue's, on a pod group's Workload (owned by every pod of the group, none its controller)
KUEUE_IS_GROUP_WORKLOAD = f"{KUEUE_GROUP}/is-group-workload"

# --- Kubernetes' own Workload API (scheduling.k8s.io/v1alpha2 in 1.36, feature gate GenericWorkload) ---
NATIVE_SCHEDULING_API_VERSION = "scheduling.k8s.io/v1alpha2"
NATIVE_PODGROUP_PLURAL = "podgroups"

# --- Kubernetes' own keys that Reservoir reads ---
MIRROR_POD = "kubernetes.io/config.mirror"  # pod annotation: a static pod's mirror, owned by the kubelet
# the user name prefix of a node's own identity (NodeRestriction's rule): only a request made as one is a kubelet's,
# so only such a request's mirror pod is left alone (`is_kubelets_mirror_pod`); deploy/webhook-configurations.yaml's
# matchConditions say the same in CEL
NODE_USER_PREFIX = "system:node:"
NODE_GROUP = "system:nodes"  # ...and a node's requests carry this group (NodeRestriction checks both)
CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")  # any value
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")

# --- Volcano's keys (seed 004 and DESIGN section 1) ---
RESERVEABLE = "volcano.sh/reserveable"  # pod or PodGroup annotation "true": a reserve pod (seed 004)
MAXIMUM_RUNTIME = "volcano.sh/maximum-runtime"  # pod or PodGroup annotation: its declared runtime (a duration)
GROUP_NAME = "scheduling.k8s.io/group-name"  # pod annotation: its Volcano PodGroup (the job)
QUEUE_NAME = "scheduling.volcano.sh/queue-name"  # pod annotation: its Volcano Queue
DEFAULT_QUEUE = "default"
# seed 002 `guarantee.percentage.dimensions`: the seed's own name for GPUs ("dimensions: ["cpu", "memory", "gpu"]"),
# read as the extended resource `guarantee.gpuResource` of the config (nvidia.com/gpu by default)
GPU_DIMENSION = "gpu"

# --- GPUs as `reservoir record` reads them (its --gpu-resource and --gpu-model-label defaults) ---
GPU_RESOURCE = "nvidia.com/gpu"  # NVIDIA's device plugin's extended resource
GPU_MODEL_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery's node label naming the GPU model

# --- Reservoir's own objects ---
CONFIGMAP_NAME = "reservoir-config"
CONFIG_KEY = "config.yaml"
# the leading agent's last plan, for `reservoir status` (agent.published): a ConfigMap beside reservoir-config
STATUS_CONFIGMAP = "reservoir-status"
STATUS_KEY = "status.json"
NAMESPACE = "reservoir-system"
# the webhook configurations' namespaceSelector skips these, and their pods are never evicted
SYSTEM_NAMESPACES = frozenset(("kube-system", NAMESPACE))

# --- API coordinates of the custom resources Reservoir reads ---
VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_VERSION = "v1beta1"
VOLCANO_API_VERSION = f"{VOLCANO_GROUP}/{VOLCANO_VERSION}"
PODGROUP_PLURAL = "podgroups"
QUEUE_PLURAL = "queues"
RESERVATION_GROUP = DOMAIN
RESERVATION_VERSION = "v1alpha1"
RESERVATION_API_VERSION = f"{RESERVATION_GROUP}/{RESERVATION_VERSION}"
RESERVATION_PLURAL = "reservations"
KOORDINATOR_GROUP = KOORDINATOR_DOMAIN  # Koordinator's Reservations, served when the config switches it on
KOORDINATOR_VERSION = "v1alpha1"
KOORDINATOR_API_VERSION = f"{KOORDINATOR_GROUP}/{KOORDINATOR_VERSION}"


class LockKind(StrEnum):
    """Who a lock is held for (DESIGN section 1, "Lock")."""

    JOB = "job"
    QUEUE = "queue"
    WINDOW = "window"
    RESERVATION = "reservation"


LABEL_VALUE_MAX = 63
_HASH_LEN = 6
_NOT_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@lru_cache(maxsize=65536)
def owner_id(kind: LockKind, full_name: str) -> str:
    """The owner id written as lock taint value and label value: `<kind>-<readable part>-<6 hex>`.

    DESIGN section 2: owner ids are valid label values (<= 63 characters). The readable part is the full name
    with every character a label value cannot hold replaced by `-`, cut to fit; the 6 hex digits are the start
    of sha256(`<kind>/<full name>`), so two names that read the same after cutting still differ.
    """
    kind = LockKind(kind)
    digest = hashlib.sha256(f"{kind.value}/{full_name}".encode()).hexdigest()[:_HASH_LEN]
    room = LABEL_VALUE_MAX - len(kind.value) - len(digest) - 2
    readable = _NOT_LABEL_CHARS.sub("-", full_name)[:room].strip("-_.")
    parts = [kind.value, readable, digest] if readable else [kind.value, digest]
    return "-".join(parts)


def owner_kind(owner: str) -> LockKind | None:
    """The kind encoded at the front of an owner id, or None when it is not one of Reservoir's."""
    head = owner.split("-", 1)[0]
    try:
        return LockKind(head)
    except ValueError:
        return None


def is_label_value(value: str) -> bool:
    return len(value) <= LABEL_VALUE_MAX and bool(_LABEL_VALUE.match(value))


def job_full_name(namespace: str, kind: str, name: str) -> str:
    """The full name a job's owner id is hashed from: `<namespace>/<owner kind>/<name>`."""
    return f"{namespace}/{kind}/{name}"


def is_kubelets_mirror_pod(annotations: object, username: str, groups: tuple[str, ...] = ()) -> bool:
    """A mirror pod the webhooks step aside for: the annotation `MIRROR_POD`, on a request made as a node's own
    identity (user `NODE_USER_PREFIX`<name> in group `NODE_GROUP`, as NodeRestriction reads it). Any pod may carry the
    annotation; whoever else sends one is judged as any pod."""
    return (isinstance(annotations, dict) and MIRROR_POD in annotations and username.startswith(NODE_USER_PREFIX)
            and NODE_GROUP in groups)
