"""The validating webhook's decisions, as pure functions (DESIGN section 3). A denial names the object, the
field, the bad value and what would be accepted; a warning lets the object in and says why it is risky."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shared import keys
from shared.config import ConfigError, load_config
from shared.duration import DurationError, parse_duration
from shared.quantity import QuantityError, format_quantity
from shared.resources import PODS, Resources, pod_requests
from shared.timestamps import parse_time
from webhook.mutate import parse_reservation_affinity

GUARANTEE_POLICIES = ("Best-Effort", "Guaranteed")
_STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage", "pods", "storage"}
_PREFIXED_RESOURCE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Verdict:
    allowed: bool = True
    message: str = ""
    warnings: list[str] = field(default_factory=list)


ALLOW = Verdict()


def _deny(problems: list[str], warnings: list[str] | None = None) -> Verdict:
    if problems:
        return Verdict(False, "; ".join(problems), warnings or [])
    return Verdict(True, "", warnings or [])


def is_known_resource_name(name: str) -> bool:
    """cpu, memory, ephemeral-storage, pods, hugepages-<size>, or a domain-prefixed name such as nvidia.com/gpu."""
    return name in _STANDARD_RESOURCES or name.startswith("hugepages-") or bool(_PREFIXED_RESOURCE.match(name))


def reserve_annotation_problems(what: str, annotations: Mapping[str, str]) -> list[str]:
    """Seed 004's annotations: `volcano.sh/reserveable` is "true" or "false"; `volcano.sh/maximum-runtime` is a
    positive Go duration."""
    problems = []
    reserveable = annotations.get(keys.RESERVEABLE)
    if reserveable is not None and reserveable not in ("true", "false"):
        problems.append(f'{what}: metadata.annotations["{keys.RESERVEABLE}"] is {reserveable!r}: '
                        'expected "true" or "false"')
    runtime = annotations.get(keys.MAXIMUM_RUNTIME)
    if runtime is not None:
        try:
            value = parse_duration(runtime)
        except DurationError as err:
            problems.append(f'{what}: metadata.annotations["{keys.MAXIMUM_RUNTIME}"]: {err}')
        else:
            if value <= timedelta(0):
                problems.append(f'{what}: metadata.annotations["{keys.MAXIMUM_RUNTIME}"] is {runtime!r}: '
                                'expected a positive duration such as 500s or 2h30m')
    return problems


def _name(obj: Mapping[str, Any], kind: str) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "(unnamed)"
    return f"{kind} {meta['namespace']}/{name}" if meta.get("namespace") else f"{kind} {name}"


def validate_pod(pod: Mapping[str, Any]) -> Verdict:
    what = _name(pod, "Pod")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    problems = reserve_annotation_problems(what, annotations)
    for key in (keys.RESERVATION_AFFINITY, keys.KOORDINATOR_RESERVATION_AFFINITY):
        if key in annotations:
            try:
                parse_reservation_affinity(annotations[key])
            except ValueError as err:
                problems.append(f'{what}: metadata.annotations["{key}"]: {err}')
    warnings = []
    for toleration in (pod.get("spec") or {}).get("tolerations") or ():
        if not toleration.get("key") and toleration.get("operator") == "Exists":
            warnings.append(f"{what} tolerates every taint (empty key, operator Exists): it ignores every "
                            f"{keys.LOCK} lock, so reserved nodes are not reserved against it")
            break
    return _deny(problems, warnings)


def validate_podgroup(podgroup: Mapping[str, Any]) -> Verdict:
    annotations = (podgroup.get("metadata") or {}).get("annotations") or {}
    return _deny(reserve_annotation_problems(_name(podgroup, "PodGroup"), annotations))


def _resource_problems(what: str, path: str, quantities: Any) -> tuple[Resources | None, list[str]]:
    if quantities is None:
        return None, []
    if not isinstance(quantities, Mapping):
        return None, [f"{what}: {path} must be a mapping of resource names to quantities"]
    problems = []
    for name in quantities:
        if not is_known_resource_name(str(name)):
            problems.append(f"{what}: {path}.{name}: unknown resource name {name!r}: expected cpu, memory, "
                            "ephemeral-storage, pods, hugepages-<size> or a prefixed name such as nvidia.com/gpu")
    try:
        resources = Resources.parse(quantities)
    except QuantityError as err:
        return None, problems + [f"{what}: {path}: {err}"]
    negative = [n for n, v in resources.items() if v < 0]
    if negative:
        problems.append(f"{what}: {path}.{negative[0]} is negative: expected a quantity >= 0")
    return resources, problems


def validate_queue(queue: Mapping[str, Any], cluster: Resources | None = None) -> Verdict:
    """Seed 002: guarantee policy, percentage {dimensions, value in [0,1]}, resource <= capability, and resource
    <= `cluster` (the schedulable nodes' allocatable, when the webhook knows any node)."""
    what = _name(queue, "Queue")
    spec = queue.get("spec") or {}
    guarantee = spec.get("guarantee")
    problems: list[str] = []
    capability, cap_problems = _resource_problems(what, "spec.capability", spec.get("capability"))
    problems += cap_problems
    if guarantee is None:
        return _deny(problems)
    if not isinstance(guarantee, Mapping):
        return _deny(problems + [f"{what}: spec.guarantee must be an object with policy, percentage and/or resource"])
    policy = guarantee.get("policy")
    if policy is not None and policy not in GUARANTEE_POLICIES:
        problems.append(f"{what}: spec.guarantee.policy is {policy!r}: expected Best-Effort or Guaranteed")
    percentage = guarantee.get("percentage")
    if percentage is not None:
        value = percentage.get("value") if isinstance(percentage, Mapping) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
            problems.append(f"{what}: spec.guarantee.percentage.value is {value!r}: expected a number in [0, 1]")
        dimensions = percentage.get("dimensions") if isinstance(percentage, Mapping) else None
        if not dimensions or not isinstance(dimensions, list):
            problems.append(f"{what}: spec.guarantee.percentage.dimensions is {dimensions!r}: expected a non-empty "
                            "list of resource names such as [cpu, memory]")
        else:
            for name in dimensions:
                if not isinstance(name, str) or not is_known_resource_name(name):
                    problems.append(f"{what}: spec.guarantee.percentage.dimensions: unknown resource name {name!r}: "
                                    "expected cpu, memory, ephemeral-storage or a prefixed name such as nvidia.com/gpu")
    resource, resource_problems = _resource_problems(what, "spec.guarantee.resource", guarantee.get("resource"))
    problems += resource_problems
    if percentage is None and not resource:
        problems.append(f"{what}: spec.guarantee needs resource and/or percentage: give at least one")
    if resource and capability:
        for name, amount in sorted(resource.items()):
            if name in capability and amount > capability[name]:
                problems.append(
                    f"{what}: spec.guarantee.resource.{name} ({guarantee['resource'][name]}) exceeds "
                    f"spec.capability.{name} ({spec['capability'][name]}): lower the guarantee or raise the capability")
    if resource and cluster:
        for name, amount in sorted(resource.items()):
            if amount > cluster[name]:
                problems.append(
                    f"{what}: spec.guarantee.resource.{name} ({guarantee['resource'][name]}) is more than the "
                    f"cluster's schedulable nodes hold ({format_quantity(name, cluster[name])}): it would lock every "
                    "node and still not be met; lower it or add nodes")
    return _deny(problems)


def validate_reservation(reservation: Mapping[str, Any]) -> Verdict:
    """Seed 003: owners non-empty (each with object, controller or labelSelector), ttl and expires exclusive,
    template requests present."""
    what = _name(reservation, "Reservation")
    spec = reservation.get("spec") or {}
    problems = []
    owners = spec.get("owners")
    if not owners or not isinstance(owners, list):
        problems.append(f"{what}: spec.owners is empty: give at least one owner (object, controller or labelSelector)")
    else:
        for index, owner in enumerate(owners):
            if not isinstance(owner, Mapping) or not any(owner.get(f) is not None for f in ("object", "controller", "labelSelector")):
                problems.append(f"{what}: spec.owners[{index}] sets none of object, controller, labelSelector")
    ttl, expires = spec.get("ttl"), spec.get("expires")
    if ttl is not None and expires is not None:
        problems.append(f"{what}: spec.ttl ({ttl}) and spec.expires ({expires}) are mutually exclusive: keep one")
    if ttl is not None:
        try:
            if parse_duration(str(ttl)) < timedelta(0):
                problems.append(f"{what}: spec.ttl is {ttl!r}: expected a duration >= 0 (0 disables expiry)")
        except DurationError as err:
            problems.append(f"{what}: spec.ttl: {err}")
    if expires is not None:
        try:
            if parse_time(str(expires)) is None:
                raise ValueError
        except ValueError:
            problems.append(f"{what}: spec.expires is {expires!r}: expected an RFC 3339 time such as 2026-12-01T00:00:00Z")
    template = spec.get("template")
    template_spec = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(template_spec, Mapping) or not template_spec.get("containers"):
        problems.append(f"{what}: spec.template.spec.containers is missing: give a pod template with resource requests")
    else:
        try:
            requests = pod_requests(template_spec) - {PODS: 1}
        except QuantityError as err:
            problems.append(f"{what}: spec.template.spec: {err}")
        else:
            if not requests:
                problems.append(f"{what}: spec.template requests nothing: set resources.requests (cpu, memory, ...) "
                                "on its containers")
    policy = spec.get("allocatePolicy")
    if policy not in (None, "", "Aligned", "Restricted"):
        problems.append(f"{what}: spec.allocatePolicy is {policy!r}: expected Aligned or Restricted")
    return _deny(problems)


def validate_configmap(configmap: Mapping[str, Any]) -> Verdict:
    """The Reservoir ConfigMap is parsed by the same model the agent uses; other ConfigMaps pass."""
    meta = configmap.get("metadata") or {}
    if meta.get("name") != keys.CONFIGMAP_NAME:
        return ALLOW
    data = configmap.get("data") or {}
    try:
        load_config(data.get(keys.CONFIG_KEY))
    except ConfigError as err:
        return Verdict(False, f"ConfigMap {meta.get('namespace', '')}/{keys.CONFIGMAP_NAME}: data[\"{keys.CONFIG_KEY}\"]: {err}")
    unknown = sorted(set(data) - {keys.CONFIG_KEY})
    if unknown:
        return Verdict(True, "", [f"ConfigMap {keys.CONFIGMAP_NAME}: keys {unknown} are ignored; the config lives "
                                   f"under {keys.CONFIG_KEY}"])
    return ALLOW
