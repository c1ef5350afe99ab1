"""The validating webhook's decisions, as pure functions (DESIGN section 3). A denial names the object, the
field, the bad value and what would be accepted; a warning lets the object in and says why it is risky.

Each object's validator is composed of small functions bound to a field path, as kueue's webhooks are
(`validateClusterQueueSpec` and friends): each checks the one field its `FieldPath` names and returns its
problems, each starting with that path; the object's validator prefixes the object's name and joins them.

Every validator is total over the JSON it may be given: the fields the route reads without checking have been
checked by the request's shape (`webhook.admission`), and every other field is checked here, whatever its type, with
its value quoted short (`shown`) so a hostile value cannot flood a message.

On UPDATE only what the update changes is judged (`judge_update`): a problem the old object already had is carried
as a warning, not a denial, so an object admitted while the webhook was down (or before a rule existed) can still be
edited, its finalizers removed, its other fields fixed one at a time. A Queue's guarantee is held against the
cluster's size only where the update raises it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shared import keys
from shared.config import ConfigError, load_config
from shared.duration import DurationError, parse_duration
from shared.entitlement import Entitlement, unentitled
from shared.matching import controller_namespace, is_empty_selector
from shared.quantity import QuantityError, format_quantity, to_int
from shared.reservation_affinity import ignores_reservations, parse_reservation_affinity
from shared.resources import PODS, Resources, pod_requests
from shared.timestamps import parse_time
from shared.views import PERCENTAGE_EXAMPLE, parse_percentage_annotation
from webhook.admission import POD_SPEC, shown

GUARANTEE_POLICIES = ("Best-Effort", "Guaranteed")
ALLOCATE_POLICIES = (None, "", "Aligned", "Restricted")
OWNER_FIELDS = ("object", "controller", "labelSelector")
_STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage", "pods", "storage"}
MAX_RESOURCE_NAME = 253 + 1 + 63  # a DNS subdomain prefix, "/", a name
MAX_RESOURCES = 128  # names in one ResourceList: a cluster has a handful of resources, extended ones included
MAX_DNS_SUBDOMAIN = keys.MAX_DNS_SUBDOMAIN
PERCENTAGE_FIELDS = ("dimensions", "value")
_PREFIXED_RESOURCE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


@dataclass(frozen=True)
class Verdict:
    allowed: bool = True
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    problems: tuple[str, ...] = ()  # each problem of a denial, the object named: the message joins them


ALLOW = Verdict()


@dataclass(frozen=True)
class FieldPath:
    """Where in the object a problem is, as kueue's `field.Path`: `spec.guarantee.resource.cpu`,
    `spec.owners[0]`, `metadata.annotations["volcano.sh/reserveable"]`."""

    text: str

    def child(self, name: str) -> FieldPath:
        return FieldPath(f"{self.text}.{name}")

    def index(self, index: int) -> FieldPath:
        return FieldPath(f"{self.text}[{index}]")

    def key(self, key: str) -> FieldPath:
        return FieldPath(f'{self.text}["{key}"]')

    def __str__(self) -> str:
        return self.text


SPEC = FieldPath("spec")
ANNOTATIONS = FieldPath("metadata.annotations")
DATA = FieldPath("data")
# the Queue annotations standing in for fields Volcano's Queue schema prunes (shared.views.QueueView.from_obj)
PRIORITY_CLASS_ANNOTATION = ANNOTATIONS.key(keys.QUEUE_PRIORITY_CLASS)
POLICY_ANNOTATION = ANNOTATIONS.key(keys.QUEUE_GUARANTEE_POLICY)
PERCENTAGE_ANNOTATION = ANNOTATIONS.key(keys.QUEUE_GUARANTEE_PERCENTAGE)


def invalid(path: FieldPath, value: Any, expected: str) -> str:
    """kueue's `field.Invalid`: the field, its bad value (quoted short) and what would be accepted."""
    return f"{path} is {shown(value)}: {expected}"


def unreadable(path: FieldPath, err: Exception) -> str:
    """The field and the parser's own error, which quotes the value and says what is accepted."""
    return f"{path}: {err}"


def _verdict(what: str, problems: list[str], warnings: list[str] | None = None) -> Verdict:
    """Allowed when there is no problem; else denied, naming the object before each problem."""
    if problems:
        named = tuple(f"{what}: {problem}" for problem in problems)
        return Verdict(False, "; ".join(named), warnings or [], named)
    return Verdict(True, "", warnings or [])


def judge_update(new: Verdict, old: Verdict) -> Verdict:
    """UPDATE: `new` (the object after the update) denied only for problems `old` (the object before it, judged
    the same way) did not have; the problems it already had are carried as warnings (module docstring)."""
    if new.allowed:
        return new
    fresh = [problem for problem in new.problems if problem not in old.problems]
    carried = [f"{problem} (let through: this update does not change it)"
               for problem in new.problems if problem in old.problems]
    if fresh:
        return Verdict(False, "; ".join(fresh), carried + new.warnings, tuple(fresh))
    return Verdict(True, "", carried + new.warnings)


def _name(obj: Mapping[str, Any], kind: str) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name") or meta.get("generateName") or "(unnamed)"
    namespace = meta.get("namespace")
    name, namespace = shown(name) if not isinstance(name, str) else name, str(namespace or "")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def is_known_resource_name(name: str) -> bool:
    """cpu, memory, ephemeral-storage, pods, hugepages-<size>, or a domain-prefixed name such as nvidia.com/gpu."""
    if len(name) > MAX_RESOURCE_NAME:
        return False
    return name in _STANDARD_RESOURCES or name.startswith("hugepages-") or bool(_PREFIXED_RESOURCE.match(name))


# --- Seed 004: reserve annotations, on pods and PodGroups ---

def _validate_reserveable(path: FieldPath, value: Any) -> list[str]:
    """Seed 004: `volcano.sh/reserveable`, when set, is "true" or "false"."""
    if value is None or value in ("true", "false"):
        return []
    return [invalid(path, value, 'expected "true" or "false"')]


def _validate_maximum_runtime(path: FieldPath, value: Any) -> list[str]:
    """Seed 004: `volcano.sh/maximum-runtime`, when set, is a positive Go duration."""
    if value is None:
        return []
    try:
        runtime = parse_duration(value)
    except DurationError as err:
        return [unreadable(path, err)]
    if runtime <= timedelta(0):
        return [invalid(path, value, "expected a positive duration such as 500s or 2h30m")]
    return []


def _validate_reserve_annotations(path: FieldPath, annotations: Mapping[str, Any]) -> list[str]:
    """Seed 004's annotations under `path` (`metadata.annotations`)."""
    return (_validate_reserveable(path.key(keys.RESERVEABLE), annotations.get(keys.RESERVEABLE))
            + _validate_maximum_runtime(path.key(keys.MAXIMUM_RUNTIME), annotations.get(keys.MAXIMUM_RUNTIME)))


def reserve_annotation_problems(what: str, annotations: Mapping[str, str]) -> list[str]:
    """Seed 004's annotations: `volcano.sh/reserveable` is "true" or "false"; `volcano.sh/maximum-runtime` is a
    positive Go duration. Each problem names `what`."""
    return [f"{what}: {problem}" for problem in _validate_reserve_annotations(ANNOTATIONS, annotations)]


# --- pods ---

def _validate_reservation_affinity(annotations: Mapping[str, Any], key: str) -> list[str]:
    """Seed 003: a reservation affinity annotation (`key`), when present, names a Reservation or selects some."""
    if key not in annotations:
        return []
    try:
        parse_reservation_affinity(annotations[key])
    except ValueError as err:
        return [unreadable(ANNOTATIONS.key(key), err)]
    return []


def _blanket_toleration_warnings(what: str, tolerations: Any) -> list[str]:
    """The locks of every seed (DESIGN section 3): a pod tolerating every taint (empty key, operator Exists) is let
    in, with a warning that no lock holds it off."""
    for toleration in tolerations if isinstance(tolerations, list) else ():
        if isinstance(toleration, Mapping) and not toleration.get("key") and toleration.get("operator") == "Exists":
            return [f"{what} tolerates every taint (empty key, operator Exists): it ignores every "
                    f"{keys.LOCK} lock, so reserved nodes are not reserved against it"]
    return []


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _koordinator_pod_warnings(what: str, annotations: Mapping[str, Any], labels: Mapping[str, Any]) -> list[str]:
    """Issue 18: Koordinator's pod-side keys Reservoir does not act on, and the affinity keys it ignores, named
    (docs/tasks/koordinator.md)."""
    warnings = []
    for key in (keys.KOORDINATOR_RESTRICTED_OPTIONS, keys.KOORDINATOR_EXACT_MATCH):
        if key in annotations:
            warnings.append(f"{what}: {ANNOTATIONS.key(key)} is ignored by Reservoir")
    if keys.KOORDINATOR_PRE_ALLOCATION_REQUIRED in labels:
        warnings.append(f"{what}: metadata.labels[{keys.KOORDINATOR_PRE_ALLOCATION_REQUIRED}] is ignored by Reservoir")
    for key in (keys.RESERVATION_AFFINITY, keys.KOORDINATOR_RESERVATION_AFFINITY):
        try:
            affinity = parse_reservation_affinity(annotations[key]) if key in annotations else None
        except ValueError:
            continue
        if affinity is None:
            continue
        if affinity.ignored:  # one warning however many keys (an admission response's warnings are bounded)
            names = ", ".join(shown(n) for n in affinity.ignored[:5])
            more = f" and {len(affinity.ignored) - 5} more" if len(affinity.ignored) > 5 else ""
            warnings.append(f"{what}: {ANNOTATIONS.key(key)}: {names}{more} "
                            f"{'is' if len(affinity.ignored) == 1 else 'are'} ignored by Reservoir")
        if ignores_reservations(labels):
            warnings.append(f"{what}: {ANNOTATIONS.key(key)} is ignored: the pod carries "
                            f"{keys.KOORDINATOR_RESERVATION_IGNORED}=true and ignores every Reservation")
    if (keys.RESERVATION_AFFINITY in annotations and keys.KOORDINATOR_RESERVATION_AFFINITY in annotations
            and annotations[keys.RESERVATION_AFFINITY]):
        warnings.append(f"{what}: {ANNOTATIONS.key(keys.KOORDINATOR_RESERVATION_AFFINITY)} is ignored: "
                        f"{keys.RESERVATION_AFFINITY} is set too, and wins")
    return warnings


def _validate_job_names(pod: Mapping[str, Any], annotations: Mapping[str, Any]) -> list[str]:
    """The names a pod's job is known by (shared.ownership.job_identity): the PodGroup its
    `scheduling.k8s.io/group-name` names, a DNS subdomain as every PodGroup's name is; its controlling
    ownerReference's name, at most 253 printable characters without `/`. The API server checks neither (an
    ownerReference needs only a non-empty name), and both are shown to operators and written into the agent's
    decisions: a name no object can have is refused rather than carried."""
    problems: list[str] = []
    group = annotations.get(keys.GROUP_NAME)
    if group is not None and not keys.is_dns_subdomain(group):
        problems.append(invalid(ANNOTATIONS.key(keys.GROUP_NAME), group,
                                f"the name of a PodGroup: a DNS subdomain (lowercase letters, digits, '-' and '.', "
                                f"at most {MAX_DNS_SUBDOMAIN} characters) such as my-job"))
    meta = pod.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for index, ref in enumerate(refs if isinstance(refs, list) else ()):
        name = ref.get("name") if isinstance(ref, Mapping) else None
        if not isinstance(ref, Mapping) or not ref.get("controller") or not isinstance(name, str):
            continue
        if not keys.is_object_name(name):
            problems.append(invalid(FieldPath("metadata.ownerReferences").index(index).child("name"), name,
                                    f"the name of the pod's controller: at most {MAX_DNS_SUBDOMAIN} printable "
                                    f"characters, no space or '/'"))
    return problems


def validate_pod(pod: Mapping[str, Any]) -> Verdict:
    """Seed 004 (reserve annotations) and seed 003 (reservation affinity) refused when malformed; a blanket
    toleration let in with a warning; issue 18: Koordinator's keys Reservoir ignores, named in a warning; the
    names its job is known by, refused when no object could have them (`_validate_job_names`)."""
    what = _name(pod, "Pod")
    annotations = _annotations(pod)
    problems = _validate_reserve_annotations(ANNOTATIONS, annotations)
    problems += _validate_job_names(pod, annotations)
    for key in (keys.RESERVATION_AFFINITY, keys.KOORDINATOR_RESERVATION_AFFINITY):
        problems += _validate_reservation_affinity(annotations, key)
    warnings = _blanket_toleration_warnings(what, _spec(pod).get("tolerations"))
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    warnings += _koordinator_pod_warnings(what, annotations, labels if isinstance(labels, Mapping) else {})
    return _verdict(what, problems, warnings)


def validate_podgroup(podgroup: Mapping[str, Any]) -> Verdict:
    """Seed 004: a PodGroup's reserve annotations (the mutating webhook copies them to its pods); seed 000 and
    Volcano: `spec.minResources`, the resources the job needs to start, a ResourceList the agent reads."""
    problems = _validate_reserve_annotations(ANNOTATIONS, _annotations(podgroup))
    problems += _validate_resource_list(SPEC.child("minResources"), _spec(podgroup).get("minResources"))[1]
    return _verdict(_name(podgroup, "PodGroup"), problems)


# --- Seed 002: Queues ---

def _validate_resource_name(path: FieldPath, name: Any) -> list[str]:
    """One key of a resource list (`path` is the list's path)."""
    if is_known_resource_name(str(name)):
        return []
    return [f"{path}: unknown resource name {shown(name)}: expected cpu, memory, ephemeral-storage, pods, "
            "hugepages-<size> or a prefixed name such as nvidia.com/gpu"]


def _validate_resource_list(path: FieldPath, quantities: Any) -> tuple[Resources | None, list[str]]:
    """A ResourceList (`{cpu: "4", memory: 8Gi}`): known names, valid quantities within the parser's bounds, none
    negative. Returns it parsed (None when absent or unreadable) with its problems; a quantity the parser refuses is
    reported with its own error (which quotes it and says what is accepted) and the field it is in."""
    if quantities is None:
        return None, []
    if not isinstance(quantities, Mapping):
        return None, [f"{path} must be a mapping of resource names to quantities such as {{cpu: \"4\", memory: "
                      f"8Gi}}, not {shown(quantities)}"]
    if len(quantities) > MAX_RESOURCES:
        return None, [f"{path} names {len(quantities)} resources: at most {MAX_RESOURCES} (each resource once: cpu, "
                      "memory, nvidia.com/gpu, ...)"]
    problems = [problem for name in quantities for problem in _validate_resource_name(path, name)]
    amounts: dict[str, int] = {}
    for name, value in quantities.items():
        try:
            amounts[name] = to_int(name, value)
        except (QuantityError, OverflowError) as err:
            problems.append(f"{unreadable(path, err)} (at {path.child(shown(name) if len(name) > 80 else name)})")
    if len(amounts) < len(quantities):
        return None, problems
    resources = Resources(amounts)
    negative = [name for name, value in resources.items() if value < 0]
    if negative:
        problems.append(f"{path.child(negative[0])} is negative: expected a quantity >= 0")
    return resources, problems


def _validate_guarantee_policy(path: FieldPath, policy: Any) -> list[str]:
    """Seed 002: `spec.guarantee.policy`, when set, is Best-Effort or Guaranteed."""
    if policy is None or policy in GUARANTEE_POLICIES:
        return []
    return [invalid(path, policy, "expected Best-Effort or Guaranteed")]


def _validate_percentage_value(path: FieldPath, value: Any) -> list[str]:
    """Seed 002: `spec.guarantee.percentage.value` is a number in [0, 1]."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
        return []
    return [invalid(path, value, "expected a number in [0, 1]")]


def _validate_percentage_dimensions(path: FieldPath, dimensions: Any) -> list[str]:
    """Seed 002: `spec.guarantee.percentage.dimensions` is a non-empty list of known resource names, or the seed's
    `gpu` (the extended resource `guarantee.gpuResource` of the config, nvidia.com/gpu by default)."""
    if not dimensions or not isinstance(dimensions, list):
        return [invalid(path, dimensions, "expected a non-empty list of resource names such as [cpu, memory]")]
    return [f"{path}: unknown resource name {shown(name)}: expected cpu, memory, ephemeral-storage, gpu or a prefixed "
            "name such as nvidia.com/gpu"
            for name in dimensions
            if not isinstance(name, str) or not (name == keys.GPU_DIMENSION or is_known_resource_name(name))]


def _validate_lock_guarantee(path: FieldPath, annotations: Mapping[str, Any], guarantee: Any,
                             warnings: list[str]) -> list[str]:
    """Seed 002 opt-in: `reservoir.sh/lock-guarantee`, when set, is "true" or "false"; a guarantee without "true" is
    let in with a warning that Reservoir locks no node for it."""
    value = annotations.get(keys.QUEUE_LOCK_GUARANTEE)
    if value is not None and value not in ("true", "false"):
        return [invalid(path, value, 'expected "true" (lock nodes for spec.guarantee) or "false"')]
    if guarantee is not None and value != "true":
        warnings.append(f"spec.guarantee locks no node until the Queue is annotated {keys.QUEUE_LOCK_GUARANTEE}: "
                        '"true" (Reservoir leaves a guarantee alone unless the Queue opts in)')
    return []


def _validate_percentage_annotation(path: FieldPath, text: Any) -> list[str]:
    """Seed 002 `spec.guarantee.percentage` in its annotation form (`reservoir.sh/guarantee-percentage`, for Volcano's
    Queue schema): the same object as JSON, checked as the field is (value in [0, 1], known dimensions), and no key
    but dimensions and value (a misspelt key would otherwise be dropped unseen)."""
    if text is None:
        return []
    if not isinstance(text, str):
        return [invalid(path, text, f"expected a JSON object such as {PERCENTAGE_EXAMPLE}")]
    try:
        percentage = parse_percentage_annotation(text)
    except ValueError as err:
        return [unreadable(path, err)]
    unknown = sorted(str(name) for name in percentage if name not in PERCENTAGE_FIELDS)
    problems = [f"{path} has unknown keys {shown(unknown)}: expected only dimensions and value, as in "
                f"{PERCENTAGE_EXAMPLE}"] if unknown else []
    return problems + _validate_percentage(path, percentage)


def _validate_priority_class_name(path: FieldPath, name: Any) -> list[str]:
    """Seed 001: a Queue's PriorityClass (`spec.priorityClassName`, or the annotation `reservoir.sh/priority-class` for
    Volcano's Queue schema), when set, is a name a PriorityClass can have: a DNS subdomain."""
    if name is None or name == "" or keys.is_dns_subdomain(name):
        return []
    return [invalid(path, name, "expected the name of a PriorityClass (lowercase letters, digits, '-' and '.', at most "
                                f"{MAX_DNS_SUBDOMAIN} characters) such as high-priority")]


def _ignored_annotation(path: FieldPath, value: Any, field_path: FieldPath, field_value: Any,
                        warnings: list[str]) -> None:
    """An annotation standing in for a field, and the field itself, both set and different: the field wins
    (shared.views.QueueView.from_obj); `warnings` says so."""
    if value not in (None, "") and field_value not in (None, "") and value != field_value:
        warnings.append(f"{path} ({shown(value)}) is ignored: {field_path} ({shown(field_value)}) is set and wins; "
                        "remove one of them")


def _validate_queue_annotations(annotations: Mapping[str, Any], spec: Mapping[str, Any],
                                warnings: list[str]) -> list[str]:
    """The Queue annotations that stand in for fields Volcano's Queue schema does not declare, each checked as its
    field is: `reservoir.sh/priority-class` (spec.priorityClassName), `reservoir.sh/guarantee-policy`
    (spec.guarantee.policy), `reservoir.sh/guarantee-percentage` (spec.guarantee.percentage, as JSON); one set beside
    its field, differently, is let in with a warning that the field wins."""
    guarantee = spec.get("guarantee")
    guarantee = guarantee if isinstance(guarantee, Mapping) else {}
    policy, text = annotations.get(keys.QUEUE_GUARANTEE_POLICY), annotations.get(keys.QUEUE_GUARANTEE_PERCENTAGE)
    problems = _validate_priority_class_name(PRIORITY_CLASS_ANNOTATION, annotations.get(keys.QUEUE_PRIORITY_CLASS))
    problems += _validate_guarantee_policy(POLICY_ANNOTATION, policy)
    problems += _validate_percentage_annotation(PERCENTAGE_ANNOTATION, text)
    _ignored_annotation(PRIORITY_CLASS_ANNOTATION, annotations.get(keys.QUEUE_PRIORITY_CLASS),
                        SPEC.child("priorityClassName"), spec.get("priorityClassName"), warnings)
    _ignored_annotation(POLICY_ANNOTATION, policy, SPEC.child("guarantee").child("policy"), guarantee.get("policy"),
                        warnings)
    if text and guarantee.get("percentage") is not None:
        warnings.append(f"{PERCENTAGE_ANNOTATION} is ignored: {SPEC.child('guarantee').child('percentage')} is set "
                        "and wins; remove one of them")
    return problems


def _validate_percentage(path: FieldPath, percentage: Any) -> list[str]:
    """Seed 002: `spec.guarantee.percentage`, when set: its value and its dimensions."""
    if percentage is None:
        return []
    fields = percentage if isinstance(percentage, Mapping) else {}
    return (_validate_percentage_value(path.child("value"), fields.get("value"))
            + _validate_percentage_dimensions(path.child("dimensions"), fields.get("dimensions")))


def _as_written(value: Any) -> str:
    """A quantity quoted back as it was written: `8`, `500m` (not `'500m'`)."""
    return value if isinstance(value, str) and len(value) <= 80 else shown(value)


def _validate_within_capability(path: FieldPath, resource: Resources, given: Mapping[str, Any],
                                capability_path: FieldPath, capability: Resources,
                                capability_given: Mapping[str, Any]) -> list[str]:
    """Seed 002: the guaranteed resource is <= `spec.capability` in every dimension the capability names.
    `given` and `capability_given` are the quantities as written, quoted back."""
    return [f"{path.child(name)} ({_as_written(given[name])}) exceeds {capability_path.child(name)} "
            f"({_as_written(capability_given[name])}): lower the guarantee or raise the capability"
            for name, amount in sorted(resource.items()) if name in capability and amount > capability[name]]


def _validate_within_cluster(path: FieldPath, resource: Resources, given: Mapping[str, Any],
                             cluster: Resources, before: Resources, warnings: list[str]) -> list[str]:
    """Seed 002: the guaranteed resource is <= what the cluster's schedulable nodes hold (a larger one would lock
    every node and still not be met), in each dimension where it is more than `before` (the guarantee before this
    update; nothing on CREATE): a guarantee the cluster shrank under can still be kept, or lowered, by an edit, with
    a warning in `warnings`."""
    problems = []
    for name, amount in sorted(resource.items()):
        if amount <= cluster[name]:
            continue
        too_much = (f"{path.child(name)} ({_as_written(given[name])}) is more than the cluster's schedulable nodes "
                    f"hold ({format_quantity(name, cluster[name])})")
        if amount > before[name]:
            problems.append(f"{too_much}: it would lock every node and still not be met; lower it or add nodes")
        else:
            warnings.append(f"{too_much}: kept as it was (this update does not raise it), but it cannot be met "
                            "until it is lowered or nodes are added")
    return problems


def _guaranteed(queue: Mapping[str, Any] | None) -> Resources:
    """`spec.guarantee.resource` of a Queue as it was (before an update); nothing when absent or unreadable."""
    guarantee = _spec(queue).get("guarantee") if isinstance(queue, Mapping) else None
    resource = guarantee.get("resource") if isinstance(guarantee, Mapping) else None
    return _validate_resource_list(FieldPath(""), resource)[0] or Resources()


_NEEDS = ("give at least one (where Volcano's Queue schema prunes spec.guarantee.percentage, the percentage is the "
          f"annotation {keys.QUEUE_GUARANTEE_PERCENTAGE}: '{PERCENTAGE_EXAMPLE}')")


def _validate_guarantee(path: FieldPath, guarantee: Any, spec: Mapping[str, Any], capability: Resources | None,
                        cluster: Resources | None, before: Resources, warnings: list[str],
                        annotations: Mapping[str, Any]) -> list[str]:
    """Seed 002: `spec.guarantee`, when set: policy, percentage, resource (one of percentage and resource at
    least, the percentage perhaps its annotation), resource <= capability (`capability`, parsed from `spec`) and
    resource <= `cluster` where it is raised above `before`. A guarantee policy annotation with no guarantee at all
    needs a resource or percentage as `spec.guarantee.policy` does."""
    annotated = bool(annotations.get(keys.QUEUE_GUARANTEE_PERCENTAGE))
    if guarantee is None:
        if annotations.get(keys.QUEUE_GUARANTEE_POLICY) and not annotated:
            return [f"{POLICY_ANNOTATION} sets a policy for no guarantee: it needs spec.guarantee.resource and/or a "
                    f"percentage: {_NEEDS}"]
        return []
    if not isinstance(guarantee, Mapping):
        return [f"{path} must be an object with policy, percentage and/or resource, not {shown(guarantee)}"]
    problems = _validate_guarantee_policy(path.child("policy"), guarantee.get("policy"))
    percentage = guarantee.get("percentage")
    problems += _validate_percentage(path.child("percentage"), percentage)
    resource_path = path.child("resource")
    resource, resource_problems = _validate_resource_list(resource_path, guarantee.get("resource"))
    problems += resource_problems
    if percentage is None and not resource and not annotated:
        problems.append(f"{path} needs resource and/or percentage: {_NEEDS}")
    if resource and capability:
        problems += _validate_within_capability(resource_path, resource, guarantee["resource"],
                                                SPEC.child("capability"), capability, spec["capability"])
    if resource and cluster:
        problems += _validate_within_cluster(resource_path, resource, guarantee["resource"], cluster, before,
                                             warnings)
    return problems


def validate_queue(queue: Mapping[str, Any], cluster: Resources | None = None,
                   old: Mapping[str, Any] | None = None) -> Verdict:
    """Seed 002: guarantee policy, percentage {dimensions, value in [0,1]}, resource <= capability, and resource
    <= `cluster` (the schedulable nodes' allocatable, when the webhook knows any node) where an UPDATE (`old`: the
    Queue before it) does not lower or keep it; Volcano's `spec.capability` and `spec.deserved` are ResourceLists;
    the opt-in annotation `reservoir.sh/lock-guarantee` is "true" or "false" (a guarantee without "true": a
    warning). Seed 001: the queue's PriorityClass is a PriorityClass name. The annotations standing in for the fields
    Volcano's Queue schema prunes (priority class, guarantee policy and percentage) are checked as their fields are."""
    spec = _spec(queue)
    annotations = _annotations(queue)
    capability, problems = _validate_resource_list(SPEC.child("capability"), spec.get("capability"))
    problems += _validate_resource_list(SPEC.child("deserved"), spec.get("deserved"))[1]
    problems += _validate_priority_class_name(SPEC.child("priorityClassName"), spec.get("priorityClassName"))
    warnings: list[str] = []
    problems += _validate_guarantee(SPEC.child("guarantee"), spec.get("guarantee"), spec, capability, cluster,
                                    _guaranteed(old), warnings, annotations)
    problems += _validate_queue_annotations(annotations, spec, warnings)
    guaranteed = spec.get("guarantee") if spec.get("guarantee") is not None else (
        annotations.get(keys.QUEUE_GUARANTEE_PERCENTAGE) or annotations.get(keys.QUEUE_GUARANTEE_POLICY) or None)
    problems += _validate_lock_guarantee(ANNOTATIONS.key(keys.QUEUE_LOCK_GUARANTEE), annotations, guaranteed,
                                         warnings)
    what = _name(queue, "Queue")
    return _verdict(what, problems, [f"{what}: {warning}" for warning in warnings])


# --- Seed 003: Reservations ---

def _validate_owner(path: FieldPath, owner: Any) -> list[str]:
    """Seed 003: one `spec.owners[i]` sets at least one of object, controller, labelSelector, each an object."""
    if not isinstance(owner, Mapping) or all(owner.get(name) is None for name in OWNER_FIELDS):
        return [f"{path} sets none of object, controller, labelSelector"]
    return [invalid(path.child(name), owner[name], "expected an object such as {name: ...} or {matchLabels: {...}}")
            for name in OWNER_FIELDS if owner.get(name) is not None and not isinstance(owner[name], Mapping)]


def _validate_owners(path: FieldPath, owners: Any) -> list[str]:
    """Seed 003: `spec.owners` is a non-empty list of owners."""
    if not owners or not isinstance(owners, list):
        return [f"{path} is empty: give at least one owner (object, controller or labelSelector)"]
    return [problem for index, owner in enumerate(owners) for problem in _validate_owner(path.index(index), owner)]


def _owner_warnings(path: FieldPath, owners: Any) -> list[str]:
    """Issue 18: owner entries that match no pod by Reservoir's departures from Koordinator's rules
    (shared.matching), said at admission rather than found out later."""
    warnings = []
    for index, owner in enumerate(owners if isinstance(owners, list) else ()):
        if not isinstance(owner, Mapping):
            continue
        entry = path.index(index)
        obj, controller = owner.get("object"), owner.get("controller")
        if isinstance(obj, Mapping) and not any(obj.get(f) for f in ("name", "namespace", "uid")):
            warnings.append(f"{entry.child('object')} sets none of name, namespace, uid: it matches no pod (Reservoir "
                            "does not let an empty object match every pod of the cluster); set a namespace at least")
        elif (isinstance(obj, Mapping) and obj.get("name") and not obj.get("namespace") and not obj.get("uid")
              and controller is None):
            warnings.append(f"{entry.child('object')} sets a name without a namespace or uid: it matches no pod (a pod "
                            "of that name can be made in any namespace); set object.namespace")
        if isinstance(controller, Mapping) and not controller_namespace(owner):
            warnings.append(f"{entry.child('controller').child('namespace')} is not set: this controller matches no "
                            "pod (any pod can carry a forged ownerReference); set the controller's namespace")
        selector = owner.get("labelSelector")
        if is_empty_selector(selector):
            warnings.append(f"{entry.child('labelSelector')} is empty: it matches no pod (Reservoir does not let an "
                            "empty selector match every pod of the cluster); give matchLabels or matchExpressions")
        elif (isinstance(selector, Mapping) and obj is None and controller is None):
            warnings.append(f"{entry.child('labelSelector')} alone matches pods in every namespace, and anyone who can "
                            "create a pod can give it these labels; add object.namespace to confine it")
    return warnings


def _koordinator_warnings(spec: Mapping[str, Any], labels: Any) -> list[str]:
    """Issue 18: the fields of Koordinator's Reservation Reservoir does not act on (docs/tasks/koordinator.md), named
    rather than silently dropped."""
    warnings = []
    if spec.get("preAllocationPolicy") is not None:
        warnings.append(f"{SPEC.child('preAllocationPolicy')} is ignored: Reservoir pre-allocates only as "
                        "spec.preAllocation does (it waits on its node for running pods to end)")
    taints = spec.get("taints")
    for index, taint in enumerate(taints if isinstance(taints, list) else ()):
        if isinstance(taint, Mapping) and taint.get("effect") not in ("NoSchedule", "NoExecute"):
            warnings.append(f"{SPEC.child('taints').index(index).child('effect')} {_as_written(taint.get('effect'))} "
                            "is ignored: only NoSchedule and NoExecute taints keep pods off a Reservation")
    order = labels.get(keys.KOORDINATOR_RESERVATION_ORDER) if isinstance(labels, Mapping) else None
    if order is not None and (not isinstance(order, str) or not re.fullmatch(r"-?[0-9]{1,18}", order)):
        warnings.append(f"metadata.labels[{keys.KOORDINATOR_RESERVATION_ORDER}] {_as_written(order)} is not an "
                        "integer: it is read as 0 (no preference)")
    return warnings


def _validate_ttl(path: FieldPath, ttl: Any) -> list[str]:
    """Seed 003: `spec.ttl`, when set, is a Go duration >= 0 (0 disables expiry)."""
    if ttl is None:
        return []
    if not isinstance(ttl, str):
        return [invalid(path, ttl, "expected a Go duration string such as 24h or 90m (0 disables expiry)")]
    try:
        duration = parse_duration(ttl)
    except (DurationError, OverflowError) as err:
        return [unreadable(path, err)]
    if duration < timedelta(0):
        return [invalid(path, ttl, "expected a duration >= 0 (0 disables expiry)")]
    return []


def _validate_expires(path: FieldPath, expires: Any) -> list[str]:
    """Seed 003: `spec.expires`, when set, is an RFC 3339 time."""
    if expires is None:
        return []
    try:
        moment = parse_time(expires) if isinstance(expires, str) and len(expires) <= 64 else None
    except (ValueError, OverflowError):
        moment = None
    if moment is None:
        return [invalid(path, expires, "expected an RFC 3339 time such as 2026-12-01T00:00:00Z")]
    return []


def _validate_template(path: FieldPath, template: Any) -> list[str]:
    """Seed 003: `spec.template` is a pod template with containers whose requests are readable and not empty."""
    template_spec = template.get("spec") if isinstance(template, Mapping) else None
    spec_path = path.child("spec")
    if not isinstance(template_spec, Mapping) or not template_spec.get("containers"):
        return [f"{spec_path.child('containers')} is missing: give a pod template with resource requests"]
    wrong = POD_SPEC.check(template_spec, str(spec_path))  # a pod's spec, as the API server would hold it
    if wrong:
        return [wrong]
    try:
        requests = pod_requests(template_spec) - {PODS: 1}
    except (QuantityError, OverflowError) as err:  # the field it is in, found by parsing each quantity again
        return [POD_SPEC.problem(template_spec, str(spec_path), deep=True) or unreadable(spec_path, err)]
    if not requests:
        return [f"{path} requests nothing: set resources.requests (cpu, memory, ...) on its containers"]
    return []


def _validate_allocate_policy(path: FieldPath, policy: Any) -> list[str]:
    """Seed 003: `spec.allocatePolicy`, when set, is Aligned or Restricted (Koordinator's values)."""
    if policy in ALLOCATE_POLICIES:
        return []
    return [invalid(path, policy, "expected Aligned or Restricted")]


def validate_reservation(reservation: Mapping[str, Any], koordinator: bool = False) -> Verdict:
    """Seed 003: owners non-empty (each with object, controller or labelSelector), template requests present, ttl
    and expires readable. Issue 18: `ttl` beside `expires` is let in, as Koordinator's CRD defaults `ttl` to 24h
    (`expires` is checked first: agent/planner/reservations.py `expiry`); what Reservoir ignores or matches to no pod
    is a Warning naming the field. A Koordinator Reservation (`koordinator`) is never refused (its own scheduler may
    be the one serving it): its problems come back as warnings."""
    spec = _spec(reservation)
    ttl, expires = spec.get("ttl"), spec.get("expires")
    problems = _validate_owners(SPEC.child("owners"), spec.get("owners"))
    problems += _validate_ttl(SPEC.child("ttl"), ttl)
    problems += _validate_expires(SPEC.child("expires"), expires)
    problems += _validate_template(SPEC.child("template"), spec.get("template"))
    problems += _validate_allocate_policy(SPEC.child("allocatePolicy"), spec.get("allocatePolicy"))
    what = _name(reservation, "Reservation")
    meta = reservation.get("metadata")
    warnings = _owner_warnings(SPEC.child("owners"), spec.get("owners"))
    warnings += _koordinator_warnings(spec, meta.get("labels") if isinstance(meta, Mapping) else None)
    if koordinator:
        warnings = [*problems, *warnings]
        problems = []
    return _verdict(what, problems, [f"{what}: {warning}" for warning in warnings])


# --- the Reservoir ConfigMap ---

def _validate_config(path: FieldPath, text: Any) -> list[str]:
    """`data["config.yaml"]` parses with the model the agent uses (every seed's settings live there), within the
    bounds `load_config` itself enforces."""
    try:
        load_config(text)
    except ConfigError as err:
        return [unreadable(path, err)]
    return []


def validate_configmap(configmap: Mapping[str, Any]) -> Verdict:
    """The Reservoir ConfigMap is parsed by the same model the agent uses; other ConfigMaps pass."""
    meta = configmap.get("metadata") or {}
    if not isinstance(meta, Mapping) or meta.get("name") != keys.CONFIGMAP_NAME:
        return ALLOW
    data = configmap.get("data")
    data = data if isinstance(data, Mapping) else {}
    problems = _validate_config(DATA.key(keys.CONFIG_KEY), data.get(keys.CONFIG_KEY))
    if problems:
        return _verdict(f"ConfigMap {meta.get('namespace', '')}/{keys.CONFIGMAP_NAME}", problems)
    unknown = sorted(set(data) - {keys.CONFIG_KEY})
    if unknown:
        return Verdict(True, "", [f"ConfigMap {keys.CONFIGMAP_NAME}: keys {shown(unknown)} are ignored; the config "
                                   f"lives under {keys.CONFIG_KEY}"])
    return ALLOW


# --- Entitlement (DESIGN section 1): what a pod brings itself ---

def added_on_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """What a pod UPDATE adds that the entitlement check judges: `new` with each toleration `old` already had (one for
    one) replaced by None, so that the others keep their index for the messages, and `spec.nodeName` only when the
    update changes it. What the pod already carried was judged when it came (the check fails closed), and the API
    server lets an update only add tolerations, so judging it again gains nothing; it would only refuse every later
    update once the pod's rights changed (its job, its queue's binding, a window ended), such as Kueue adding its
    flavor's tolerations when it admits the pod, or the agent adding a lock toleration it lacks."""
    new_spec, old_spec = new.get("spec"), old.get("spec")
    spec: dict[str, Any] = dict(new_spec) if isinstance(new_spec, Mapping) else {}
    if not isinstance(old_spec, Mapping):
        old_spec = {}
    before = list(old_spec.get("tolerations") or ()) if isinstance(old_spec.get("tolerations"), list) else []
    tolerations = spec.get("tolerations")
    if isinstance(tolerations, list):
        added: list[Any] = []
        for toleration in tolerations:
            if toleration in before:
                before.remove(toleration)
                added.append(None)
            else:
                added.append(toleration)
        spec["tolerations"] = added
    if spec.get("nodeName") == old_spec.get("nodeName"):
        spec.pop("nodeName", None)
    return {**new, "spec": spec}


def validate_pod_locks(pod: Mapping[str, Any], namespace: str, rights: Entitlement,
                       lock_of_node: Mapping[str, str]) -> Verdict:
    """A pod that carries a `reservoir.sh/lock` toleration, an empty-key `Exists` toleration, or a `spec.nodeName` on
    a locked node that it is not entitled to (shared.entitlement) is refused, naming the toleration or the node, the
    owner and why. This check fails closed; the webhook configuration sends it only the pods that carry such a
    thing (matchConditions), so every other pod is untouched by it. A pod at the `reservoir-placeholder` PriorityClass
    (seed 003) outside Reservoir's namespace is refused too: that class is for the placeholders no pod may preempt."""
    problems = unentitled(pod, namespace, rights, lock_of_node)
    if _spec(pod).get("priorityClassName") == keys.PLACEHOLDER_PRIORITY_CLASS and namespace != keys.NAMESPACE:
        problems.append(f"spec.priorityClassName: {keys.PLACEHOLDER_PRIORITY_CLASS!r} is the class of Reservoir's "
                        "Reservation placeholders, which no pod may preempt; choose another PriorityClass")
    return _verdict(_name(pod, "Pod"), problems)
