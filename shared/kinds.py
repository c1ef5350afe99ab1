"""The objects Reservoir watches, each defined once (API path, cache key, view), for the webhook's caches, the
agent's caches and `reservoir status`; and the one rule for turning the Reservoir ConfigMap into a config."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared import keys
from shared.config import ConfigError, ReservoirConfig, load_config
from shared.views import (
    NativePodGroupView,
    NodeView,
    PodGroupView,
    PodView,
    PriorityClassView,
    QueueView,
    ReservationView,
    WorkloadView,
)


def by_name(obj: Mapping[str, Any]) -> str:
    name: str = obj["metadata"]["name"]
    return name


def by_namespace_and_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


@dataclass(frozen=True)
class Watched:
    name: str
    path: str
    convert: Callable[[Mapping[str, Any]], Any]
    key: Callable[[Mapping[str, Any]], Any] = by_name
    field_selector: str | None = None
    kind: str = ""  # the objects' kind and apiVersion, for an Event about one of them
    api_version: str = ""


_VOLCANO_API, _RESERVATION_API = keys.VOLCANO_API_VERSION, keys.RESERVATION_API_VERSION
_VOLCANO = f"/apis/{_VOLCANO_API}"
NODES = Watched("nodes", "/api/v1/nodes", NodeView.from_obj, kind="Node", api_version="v1")
PODS = Watched("pods", "/api/v1/pods", PodView.from_obj, by_namespace_and_name, kind="Pod", api_version="v1")
PODGROUPS = Watched("podgroups", f"{_VOLCANO}/{keys.PODGROUP_PLURAL}", PodGroupView.from_obj, by_namespace_and_name,
                    kind="PodGroup", api_version=_VOLCANO_API)
QUEUES = Watched("queues", f"{_VOLCANO}/{keys.QUEUE_PLURAL}", QueueView.from_obj, kind="Queue",
                 api_version=_VOLCANO_API)
PRIORITY_CLASSES = Watched("priorityclasses", "/apis/scheduling.k8s.io/v1/priorityclasses", PriorityClassView.from_obj,
                           kind="PriorityClass", api_version="scheduling.k8s.io/v1")
RESERVATIONS = Watched("reservations", f"/apis/{_RESERVATION_API}/{keys.RESERVATION_PLURAL}", ReservationView.from_obj,
                       kind="Reservation", api_version=_RESERVATION_API)


def by_koordinator_key(obj: Mapping[str, Any]) -> str:
    """A Koordinator Reservation's key, `scheduling.koordinator.sh/<name>` (ReservationView.key): never a Reservoir
    Reservation's (a name holds no `/`), so the two sources share one map."""
    return f"{keys.KOORDINATOR_GROUP}/{by_name(obj)}"


# Issue 18: Koordinator's own Reservations, watched only while `koordinator.reservations` is on (SwitchedCache)
KOORDINATOR_RESERVATIONS = Watched("koordinator-reservations",
                                   f"/apis/{keys.KOORDINATOR_API_VERSION}/{keys.RESERVATION_PLURAL}",
                                   ReservationView.from_koordinator, by_koordinator_key, kind="Reservation",
                                   api_version=keys.KOORDINATOR_API_VERSION)


# Issue 32: Kueue's Workloads, watched only while `kueue.workloads` is on (SwitchedCache)
WORKLOADS = Watched("workloads", f"/apis/{keys.KUEUE_API_VERSION}/{keys.WORKLOAD_PLURAL}", WorkloadView.from_obj,
                    by_namespace_and_name, kind="Workload", api_version=keys.KUEUE_API_VERSION)


# Issue 32: Kubernetes' own PodGroups (1.36, GenericWorkload), watched only where the API server serves them
_NATIVE = keys.NATIVE_SCHEDULING_API_VERSION
NATIVE_PODGROUPS = Watched("native-podgroups", f"/apis/{_NATIVE}/{keys.NATIVE_PODGROUP_PLURAL}",
                           NativePodGroupView.from_obj, by_namespace_and_name, kind="PodGroup", api_version=_NATIVE)


def _uid(obj: Mapping[str, Any]) -> str:
    uid = obj["metadata"]["uid"]
    if not isinstance(uid, str):
        raise ValueError(f"metadata.uid: expected a string, got {uid!r}")
    return uid


# Only each DaemonSet's uid: a DaemonSet pod is exempt from locks when its controller reference names a DaemonSet
# that exists with that uid (shared.entitlement), not merely when it says so.
DAEMONSETS = Watched("daemonsets", "/apis/apps/v1/daemonsets", _uid, by_namespace_and_name)


def config_map(namespace: str) -> Watched:
    """The Reservoir ConfigMap alone, kept as its JSON."""
    return Watched("config", f"/api/v1/namespaces/{namespace}/configmaps", lambda obj: obj,
                   field_selector=f"metadata.name={keys.CONFIGMAP_NAME}", kind="ConfigMap", api_version="v1")


def config_from(event: str, configmap: Mapping[str, Any] | None,
                last_good: ReservoirConfig) -> tuple[ReservoirConfig, ConfigError | None]:
    """The config a ConfigMap event leaves in force: defaults when it is deleted, its parsed `config.yaml` when
    valid, else `last_good` together with the error."""
    if event == "DELETED" or configmap is None:
        return ReservoirConfig(), None
    try:
        return load_config((configmap.get("data") or {}).get(keys.CONFIG_KEY)), None
    except ConfigError as err:
        return last_good, err
