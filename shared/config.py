"""Reservoir's configuration: one pydantic model, the defaults written once, used by the agent, the webhook and
the ConfigMap validator alike. Unknown keys are rejected; errors name the field path and the bad value.

The ConfigMap `reservoir-config` holds it as YAML under `config.yaml`.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from croniter import croniter
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from shared.duration import DurationError, format_duration, parse_duration
from shared.quantity import QuantityError, to_int
from shared.resources import Resources


def _duration(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):  # plain seconds, as the seed's starvingJobTimeThreshold: 172800
        return timedelta(seconds=value)
    try:
        return parse_duration(value)
    except DurationError as err:
        raise ValueError(str(err)) from None


def _resources(value: Any) -> Resources:
    if isinstance(value, Resources):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"{value!r} is not a resource list: expected a mapping such as {{cpu: '32', memory: 64Gi}}")
    try:
        return Resources({str(name): to_int(str(name), amount) for name, amount in value.items()})
    except QuantityError as err:
        raise ValueError(str(err)) from None


Duration = Annotated[timedelta, BeforeValidator(_duration), PlainSerializer(format_duration, return_type=str)]
ResourceList = Annotated[
    Resources, BeforeValidator(_resources), PlainSerializer(lambda r: r.to_quantities(), return_type=dict)
]
Percent = Annotated[int, Field(ge=0, le=100)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, arbitrary_types_allowed=True)


class StarvationConfig(_Model):
    """Starvation locks (seed 000). A job that has not become ready for longer than `starvingJobTimeThreshold` is
    starving: Reservoir locks nodes for the tasks it still needs, so that the pods already there drain and no other
    pod takes the room it waits for. Only nodes that must drain are locked; a task that fits somewhere now needs no
    lock. The locks are bounded in number (`reservedNodePercent`, within `maxLockedNodePercent`) and in time
    (`maxLockDuration`, then `lockCooldown`)."""

    enabled: bool = Field(True, description="Lock nodes for starving jobs. `false`: no job gets a starvation lock.")
    starving_job_time_threshold: Duration = Field(
        timedelta(minutes=10), alias="starvingJobTimeThreshold",
        description="A job not ready for longer than this is starving and may lock nodes. Not ready: fewer pods bound "
        "than its PodGroup's `minMember` (1 for any other job). A duration, 0 or more. For a job whose Kueue "
        "Workload was admitted it counts from the admission, and is at most half of `kueue.podsReadyTimeout` when "
        "that is set.")
    reserved_node_percent: Percent = Field(
        20, alias="reservedNodePercent",
        description="At most this percent of the schedulable nodes hold starvation locks at once: "
        "floor(percent x nodes / 100), but at least 1 when the percent is above 0 (3 nodes: 1; 10 nodes: 2), always "
        "within `maxLockedNodePercent`. 0 to 100; `0` locks no node for starving jobs.")
    soft_drain: bool = Field(
        True, alias="softDrain",
        description="Before a job is starving, and while it has no lock, prefer to keep other pods off the node where "
        "its pending tasks would fit soonest: a `reservoir.sh/drain` taint with effect `PreferNoSchedule`, which "
        "kube-scheduler's default TaintToleration score weighs, so pods that fit on another node go there and the "
        "node drains; no pod is ever kept off it. Only for tasks kube-scheduler has found fitting on no node for 5 s "
        "and that smaller pods could crowd out, on at most the nodes the starvation budget (`reservedNodePercent`) "
        "has left after this plan's locks. `false`: no such taint.")
    max_lock_duration: Duration = Field(
        timedelta(hours=2), alias="maxLockDuration",
        description="A starvation lock older than this is released and its job goes to the back of the order. "
        "A duration, more than 0.")
    lock_cooldown: Duration = Field(
        timedelta(minutes=30), alias="lockCooldown",
        description="After its lock outlived `maxLockDuration`, a job waits this long before it may lock any node "
        "again (kept in the `reservoir.sh/lock-expired` node annotation). A duration, 0 or more; `0` only sends the "
        "job to the back for one plan.")

    @field_validator("starving_job_time_threshold", "lock_cooldown")
    @classmethod
    def _not_negative(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError(f"{format_duration(value)} is negative: expected 0 or more")
        return value

    @field_validator("max_lock_duration")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError(f"{format_duration(value)} must be positive")
        return value


# The seed's "from H1 to H2 o'clock" form: `<minute> <H1> - <H2> <day-of-month> <month> <day-of-week>`.
_SEED_CRON = re.compile(r"^\s*(\S+)\s+(\d{1,2})\s*-\s*(\d{1,2})\s+(\S+)\s+(\S+)\s+(\S+)\s*$")


class WindowConfig(_Model):
    """A reservation window (seed 004): a recurring time range during which nodes are held for the window's reserve
    pods (pods annotated `volcano.sh/reserveable: "true"`, on themselves or on their PodGroup). The range runs from
    `startReserveAgo` before each start until the start plus `duration`. Through it, nodes matching `nodeSelector`
    are locked until their allocatable covers `resources` (more while the window's reserve pods ask for more), and
    stay locked until the range ends or `podNumToReserve` of its reserve pods were scheduled on them. Give the start
    as `schedule`, a standard 5-field cron expression evaluated in `timezone`, together with `duration`; or the
    seed's `cron: "0 3 - 4 * * *"` ("from 3 to 4 o'clock") instead of both.
    """

    name: Annotated[str, Field(
        pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$",
        description="The window's name, unique among `windows`, as it appears in the agent's decisions and in "
        "`reservoir status`: 1 to 40 lowercase letters, digits and `-`, starting and ending with a letter or digit.")]
    node_selector: dict[str, str] = Field(
        default_factory=dict, alias="nodeSelector",
        description="The labels a node must carry, each with exactly this value, to be held by the window. Empty (the "
        "default): every schedulable node may be.")
    resources: ResourceList = Field(
        description="The least the window holds, as a resource list of Kubernetes quantities such as "
        "`{cpu: '32', memory: 64Gi}`: matching nodes are taken (those it already holds first, then the most idle at "
        "the window start) until their allocatable covers it, or covers more while the window's reserve pods, "
        "placed on its nodes and pending, ask for more. Only the resources named here are counted.")
    schedule: str | None = Field(
        None,
        description="When each window starts: a standard 5-field cron expression (minute, hour, day of month, month, "
        "day of week) read in `timezone`, such as `'0 3 * * *'` (3:00 every day). Needs `duration`; not allowed "
        "with `cron`.")
    cron: str | None = Field(
        None,
        description="The seed's form, instead of `schedule` and `duration`: `'M H1 - H2 dom month dow'` runs the "
        "window from H1 to H2 o'clock, such as `'0 3 - 4 * * *'` (3:00 to 4:00 every day). Hours are 0-23 and must "
        "differ; an H2 below H1 runs past midnight. Not allowed with `schedule` or `duration`.")
    timezone: str = Field(
        "UTC",
        description="The time zone `schedule` (or `cron`) is read in: an IANA name such as `UTC` or `Europe/Paris`.")
    duration: Duration | None = Field(
        None,
        description="How long each window lasts from its start. A duration, more than 0. Needs `schedule`; not "
        "allowed with `cron`.")
    start_reserve_ago: Duration = Field(
        timedelta(0), alias="startReserveAgo",
        description="Lead time: the window's nodes are locked this long before each start, so that they can drain "
        "before it opens (the seed's \"start reserve 2h ago\"). A duration, 0 or more; `0` locks them at the start.")
    pod_num_to_reserve: Annotated[int, Field(gt=0)] | None = Field(
        None, alias="podNumToReserve",
        description="Once this many of the window's reserve pods were scheduled on its nodes within its range, the "
        "window lets its nodes go before its end. It also bounds the pending reserve pods whose requests count "
        "towards what the window holds (this many less those scheduled, the largest first). More than 0; unset "
        "(the default): the nodes stay held until the range ends.")
    namespaces: list[str] = Field(
        default_factory=list,
        description="Only reserve pods of these namespaces may use the window's lock and count towards its demand "
        "and `podNumToReserve`. Empty (the default): any namespace. With `queues` also set, a pod must match both.")
    queues: list[str] = Field(
        default_factory=list,
        description="Only reserve pods of these queues may use the window's lock and count towards its demand and "
        "`podNumToReserve`. A pod's queue counts only where the Queue admits the pod's namespace; with "
        "`kueue.workloads`, the ClusterQueue that admitted its Workload matches too. Empty (the default): any queue. "
        "With `namespaces` also set, a pod must match both.")

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {value!r}: expected an IANA name such as UTC or Europe/Paris") from None
        return value

    @model_validator(mode="after")
    def _schedule_and_duration(self) -> WindowConfig:
        if self.cron is not None:
            if self.schedule is not None or self.duration is not None:
                raise ValueError("give either cron (seed form 'M H1 - H2 * * *') or schedule + duration, not both")
            match = _SEED_CRON.match(self.cron)
            if not match:
                raise ValueError(f"cron {self.cron!r} is not the seed's form 'M H1 - H2 dom month dow', "
                                 "e.g. '0 3 - 4 * * *'")
            minute, start, end, dom, month, dow = match.groups()
            start_h, end_h = int(start), int(end)
            if start_h > 23 or end_h > 23 or start_h == end_h:
                raise ValueError(f"cron {self.cron!r}: hours must be 0-23 and differ")
            object.__setattr__(self, "schedule", f"{minute} {start_h} {dom} {month} {dow}")
            object.__setattr__(self, "duration", timedelta(hours=(end_h - start_h) % 24))
            object.__setattr__(self, "cron", None)
        if self.schedule is None or self.duration is None:
            raise ValueError("a window needs schedule (5-field cron) and duration, or the seed's cron form")
        if len(self.schedule.split()) != 5 or not croniter.is_valid(self.schedule):
            raise ValueError(f"schedule {self.schedule!r} is not a 5-field cron expression such as '0 3 * * *'")
        if self.duration <= timedelta(0):
            raise ValueError(f"duration {format_duration(self.duration)} must be positive")
        if self.start_reserve_ago < timedelta(0):
            raise ValueError("startReserveAgo must not be negative")
        return self


class QueueOrderConfig(_Model):
    """Who goes first when the caps bind (seed 001). Queues are ranked by QueueScoreOrder, the weighted sum of a
    priority score (the queue's PriorityClass), a DRF score (1 - dominant share / weight) and a proportion score
    (1 - allocated / deserved), ties broken by creation time; or, with `queueScoreOrderEnable: false`, by Volcano's
    QueueOrderFn. `ordering` then says whether jobs are served queue by queue or all together by priority."""

    priority_weight: Annotated[float, Field(ge=0)] = Field(
        1.0, alias="priorityWeight",
        description="Weight of the priority score (the queue's PriorityClass) in QueueScoreOrder. 0 or more; `0` "
        "leaves priority out of the queue order.")
    drf_weight: Annotated[float, Field(ge=0)] = Field(
        1.0, alias="drfWeight",
        description="Weight of the DRF score (1 - dominant share / weight) in QueueScoreOrder. 0 or more; `0` leaves "
        "the DRF share out of the queue order.")
    proportion_weight: Annotated[float, Field(ge=0)] = Field(
        1.0, alias="proportionWeight",
        description="Weight of the proportion score (1 - allocated / deserved) in QueueScoreOrder. 0 or more; `0` "
        "leaves the proportion share out of the queue order.")
    ordering: Literal["queue-first", "job-first"] = Field(
        "queue-first",
        description="`queue-first`: jobs are served queue by queue, in queue order, then by job priority. "
        "`job-first`: all jobs are ordered by their own priority across queues, the queue order breaking ties.")
    queue_score_order_enable: bool = Field(
        True, alias="queueScoreOrderEnable",
        description="The seed's `QueueScoreOrderEnable`. `true`: queues are ordered by QueueScoreOrder (the weighted "
        "sum). `false`: by Volcano's QueueOrderFn, priority, then DRF share, then proportion share, each deciding "
        "only a tie of the one before. Either way a score of weight 0 is left out. The seed defaults to `false`; "
        "Reservoir to `true`.")


# an extended resource name: a DNS subdomain prefix, "/", a name (nvidia.com/gpu, amd.com/gpu)
_EXTENDED_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class GuaranteeConfig(_Model):
    """Queue guarantees (seed 002). A Queue annotated `reservoir.sh/lock-guarantee: "true"` gets nodes locked that
    cover its `spec.guarantee` (a resource list, a percentage of the nodes, or both: the larger wins), chosen by a
    bounded search. Under the Queue's policy `Guaranteed`, Reservoir also evicts other queues' pods from those nodes
    through the Eviction API (PodDisruptionBudgets hold); `maxEvictionsPerMinute` and `protectedNamespaces` are the
    guard rails of those evictions."""

    enabled: bool = Field(
        True,
        description="Lock nodes for queue guarantees. Each Queue still opts in with the annotation "
        "`reservoir.sh/lock-guarantee: \"true\"`. `false`: no guarantee locks and no evictions.")
    search_budget: Annotated[int, Field(gt=0)] = Field(
        2000, alias="searchBudget",
        description="Bound of the search for each queue guarantee's nodes: exact when the counts of alike nodes "
        "number at most twice this; else this many combinations in the beams and as many hill-climbing moves. More "
        "than 0; a larger budget may find a better set of nodes, at more planning time.")
    max_evictions_per_minute: Annotated[int, Field(ge=0)] = Field(
        10, alias="maxEvictionsPerMinute",
        description="At most this many `Guaranteed` evictions accepted by the Eviction API in any sliding minute; the "
        "rest wait for a later reconcile. 0 or more; `0`: `Guaranteed` evicts nothing.")
    protected_namespaces: list[str] = Field(
        default_factory=list, alias="protectedNamespaces",
        description="Pods in these namespaces are never evicted by `Guaranteed`. `kube-system` and Reservoir's own "
        "namespace never are, listed or not.")
    gpu_resource: str = Field(
        "nvidia.com/gpu", alias="gpuResource",
        description="The extended resource the seed's `gpu` dimension of a Queue's "
        "`guarantee.percentage.dimensions` stands for: a domain prefix, `/` and a name, such as `nvidia.com/gpu` or "
        "`amd.com/gpu` (at most 317 characters).")

    @field_validator("gpu_resource")
    @classmethod
    def _extended_resource(cls, value: str) -> str:
        if len(value) > 317 or not _EXTENDED_RESOURCE.match(value):
            raise ValueError("expected an extended resource name such as nvidia.com/gpu or amd.com/gpu")
        return value


class ReservationsConfig(_Model):
    """Reservation objects (seed 003, Koordinator's Reservation design). A Reservation holds resources on one node
    with placeholder pods until a pod its owners match is handed over to that node; only its owners may use what it
    holds. These fields switch the feature on or off, bound the share of the cluster Reservations may hold, and set
    the placeholder image and the timings."""

    enabled: bool = Field(
        True, description="Serve Reservation objects (seed 003). `false`: Reservations are not served.")
    gc_grace_period: Duration = Field(
        timedelta(hours=1), alias="gcGracePeriod",
        description="Failed and Succeeded Reservations are deleted this long after they end. A duration.")
    placeholder_image: str = Field(
        "registry.k8s.io/pause:3.10", alias="placeholderImage", min_length=1, max_length=512,
        description="The container image of the placeholder pods that hold an Available Reservation's resources. "
        "1 to 512 characters.")
    max_reserved_percent: Annotated[int, Field(ge=0, le=90)] = Field(
        50, alias="maxReservedPercent",
        description="At most this share of the cluster's allocatable (each resource dimension, over the schedulable "
        "nodes) is held by Reservations at once; a Reservation that would pass it stays `Pending` and says so. "
        "0 to 90.")
    handover_timeout: Duration = Field(
        timedelta(minutes=2), alias="handoverTimeout",
        description="An owner let go to its Reservation's node (the node locked for the Reservation's owners) but "
        "not bound there by then (say, a host port taken) is given up: the lock goes, and the pod keeps its narrowed "
        "node affinity and waits there like any pod. A duration.")


class KoordinatorConfig(_Model):
    """Koordinator compatibility. With `reservations: true` the agent and the webhook also serve Koordinator's own
    `scheduling.koordinator.sh/v1alpha1` Reservations (Koordinator's CRD, unchanged), with the same planner as
    Reservoir's. This needs `deploy/components/koordinator` or the Helm value `koordinator.reservations`, for the
    RBAC and webhook rules of that API group."""

    reservations: bool = Field(
        False,
        description="Also serve Koordinator's `scheduling.koordinator.sh/v1alpha1` Reservations. Needs "
        "`deploy/components/koordinator` or the Helm value `koordinator.reservations`.")


KUEUE_THRESHOLD_SHARE = 0.5  # of Kueue's waitForPodsReady.timeout: a Workload's job starves after at most this much


class KueueConfig(_Model):
    """Kueue compatibility. With `workloads: true` the agent and the webhook read Kueue's Workloads
    (`kueue.x-k8s.io/v1beta2`): a job whose Workload (the one its controller ownerReference names) Kueue admitted
    starves counted from that admission, needs all the pods Kueue admitted, and has the priority Kueue resolved
    (capped by its pods'); its ClusterQueue is matched by the `queues` of windows and of backfill. This needs
    `deploy/components/kueue` or the Helm value `kueue.workloads`, for the RBAC. Set `podsReadyTimeout` when Kueue's
    waitForPodsReady is on, so that a job's lock comes before Kueue gives up on it."""

    workloads: bool = Field(
        False,
        description="Read Kueue's Workloads (`kueue.x-k8s.io/v1beta2`) for the jobs of the pods that name one. Needs "
        "`deploy/components/kueue` or the Helm value `kueue.workloads`.")
    pods_ready_timeout: Duration | None = Field(
        None, alias="podsReadyTimeout",
        description="Kueue's own `waitForPodsReady.timeout` (in Kueue's Configuration), when that is on: Kueue "
        "evicts and requeues an admitted Workload whose pods are not all ready by then. Given, a Workload's job "
        "starves after the smaller of `starvation.starvingJobTimeThreshold` and half of this, so its lock comes "
        "while the other half is left for its node to drain. A duration, more than 0; unset (the "
        "default): Kueue's timeout is not taken into account.")

    @field_validator("pods_ready_timeout")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError(f"{format_duration(value)} must be positive (Kueue's waitForPodsReady.timeout)")
        return value

    def threshold(self, starving: timedelta) -> timedelta:
        """The starvation threshold of a Kueue Workload's job: `starving` (starvingJobTimeThreshold), at most
        KUEUE_THRESHOLD_SHARE of podsReadyTimeout when it is given."""
        if self.pods_ready_timeout is None:
            return starving
        return min(starving, self.pods_ready_timeout * KUEUE_THRESHOLD_SHARE)


class BackfillConfig(_Model):
    """Backfill: a pod that declares its runtime (`volcano.sh/maximum-runtime`, its own or its PodGroup's) may use a
    locked node's idle room until the lock's owner needs it, as Slurm's backfill lets short jobs run ahead of a
    waiting big one. Off until a namespace or a queue is named: a pod opts in with the annotation
    `reservoir.sh/backfill: "true"` (on it or its PodGroup), and only where `namespaces` or `queues` covers it
    (`"*"` covers all)."""

    namespaces: list[str] = Field(
        default_factory=list,
        description="Pods of these namespaces may opt into backfill; `\"*\"` covers all. Empty here and in "
        "`queues` (the default): backfill is off.")
    queues: list[str] = Field(
        default_factory=list,
        description="Pods of these queues may opt into backfill, whatever their namespace; `\"*\"` covers all. A "
        "pod's queue counts only where a Queue of that name admits the pod's namespace; with `kueue.workloads`, it "
        "is the ClusterQueue that admitted the pod's Workload. Empty here and in `namespaces` (the default): "
        "backfill is off.")
    margin: Duration = Field(
        timedelta(seconds=10),
        description="Added to a backfilled pod's runtime, beside the pod's own `terminationGracePeriodSeconds`, "
        "before it must be gone from the node: covers the time from the plan that grants the node to the pod's "
        "start (the gate lifted, kube-scheduler's bind, the kubelet's start). A duration.")
    max_gate_wait: Duration = Field(
        timedelta(minutes=2), alias="maxGateWait",
        description="A pod held on the backfill gate longer than this (the agent down, or its writes failing) is "
        "let go unchanged at the agent's next plan: Reservoir never holds a pod back to wait for a backfill slot. "
        "A duration.")

    def covers(self, namespace: str, queue: str | None) -> bool:
        """The switch: pods of this namespace or queue may opt in. `queue` is the pod's queue only when the Queue
        admits its namespace (shared.entitlement.admitted_queue), else None: naming a queue is no way in."""
        return ("*" in self.namespaces or namespace in self.namespaces
                or (queue is not None and ("*" in self.queues or queue in self.queues)))

    @property
    def enabled(self) -> bool:
        return bool(self.namespaces or self.queues)


class WebhookConfig(_Model):
    """Who may use every lock, whoever it is held for. The mutating webhook (and the agent's repair of pods created
    while it was down) gives BestEffort and DaemonSet pods the lock tolerations, and the validating pod-locks check
    lets the pods of trusted namespaces carry any they bring. Every other pod may use only the locks of its job, its
    queue, the windows it is a reserve pod of, the Reservations whose owners match it and a backfill slot granted to
    it."""

    tolerate_best_effort: bool = Field(
        True, alias="tolerateBestEffort",
        description="BestEffort pods (no request and no limit of any resource) tolerate every lock (seed 000): they "
        "take none of the room a lock holds. The exclusive locks of a `Guaranteed` queue still keep out all but "
        "the queue's own. `false`: BestEffort pods are treated like any other pod.")
    tolerate_daemonsets: bool = Field(
        True, alias="tolerateDaemonSets",
        description="Pods of a DaemonSet that exists with their controller's uid tolerate every lock. A DaemonSet's "
        "uid proves it exists, not who made it: where tenants may create DaemonSets (Kubernetes' built-in `edit` "
        "role allows it), set `false`.")
    trusted_namespaces: list[str] = Field(
        default_factory=list, alias="trustedNamespaces",
        description="Pods in these namespaces may carry any lock toleration or `nodeName` (the pod-locks check lets "
        "them in), such as an admin's own monitoring namespace; nothing is added to them.")


# Every default lives here and nowhere else.
class ReservoirConfig(_Model):
    """The whole configuration: the YAML document under `config.yaml` in the ConfigMap `reservoir-config` (namespace
    `reservoir-system`), read alike by the agent, the webhook and `reservoir check-config FILE`. Every field is
    optional, and an empty document means all defaults. Durations are Go durations (`90m`, `2h30m`) or plain
    seconds; quantities are Kubernetes quantities. Unknown keys are refused, and an invalid edit keeps the last good
    configuration."""

    dry_run: bool = Field(
        False, alias="dryRun",
        description="Compute and report locks without tainting nodes: the agent plans as usual but only logs "
        "`would-lock` / `would-release` decisions, writes nothing else, and lets go any pod held on a gate.")
    max_locked_node_percent: Annotated[int, Field(ge=0, le=90)] = Field(
        50, alias="maxLockedNodePercent",
        description="At most this percent of the schedulable nodes (not cordoned, Ready, not control-plane) are "
        "locked at once, all kinds together. The cap is floor(percent x nodes / 100) and the field is at most `90`, "
        "so some node always stays unlocked for the pods no lock is held for (a one-node cluster locks nothing, "
        "2 nodes lock 1, 10 lock 9). 0 to 90; `0` locks nothing.")
    resync_period: Duration = Field(
        timedelta(seconds=30), alias="resyncPeriod",
        description="Interval of the full reconcile, besides the event-driven ones (counted from the last resync; a "
        "change does not push it back). The agent also plans at each moment the last plan named where time alone "
        "changes the answer: a job crossing `starvingJobTimeThreshold`, a lock reaching `maxLockDuration`, a "
        "cool-down ending, a window's range starting or ending. A duration.")
    debounce: Duration = Field(
        timedelta(seconds=1),
        description="The least time between the starts of two reconciles that changes set off: a stream of changes "
        "costs at most one plan per `debounce`. A change after a quiet spell is planned for 0.1 s after it (the rest "
        "of its burst joins it), not a whole `debounce` later. Pods arriving on the backfill gate do not wait for "
        "it: a gate pass decides them within 0.1 s. A duration.")
    starvation: StarvationConfig = Field(
        default_factory=StarvationConfig, description="Starvation locks for jobs that wait too long (seed 000).")
    windows: list[WindowConfig] = Field(
        default_factory=list,
        description="The reservation windows (seed 004), each a mapping with the fields of a window; names must be "
        "unique. Empty (the default): no window.")
    queue_order: QueueOrderConfig = Field(
        default_factory=QueueOrderConfig, alias="queueOrder",
        description="The order of queues and jobs when the caps bind (seed 001).")
    guarantee: GuaranteeConfig = Field(
        default_factory=GuaranteeConfig, description="Queue guarantees and their evictions (seed 002).")
    reservations: ReservationsConfig = Field(
        default_factory=ReservationsConfig, description="Reservation objects (seed 003).")
    koordinator: KoordinatorConfig = Field(
        default_factory=KoordinatorConfig, description="Serving Koordinator's own Reservations.")
    kueue: KueueConfig = Field(default_factory=KueueConfig, description="Reading Kueue's Workloads.")
    backfill: BackfillConfig = Field(
        default_factory=BackfillConfig, description="Which pods may use a locked node's idle room, and the timings.")
    webhook: WebhookConfig = Field(
        default_factory=WebhookConfig, description="Which pods may use every lock, whoever it is held for.")

    def protecting(self, namespace: str) -> ReservoirConfig:
        """This config with `namespace` (the agent's own) among `guarantee.protectedNamespaces`."""
        if namespace in self.guarantee.protected_namespaces:
            return self
        guarantee = self.guarantee.model_copy(
            update={"protected_namespaces": [*self.guarantee.protected_namespaces, namespace]})
        return self.model_copy(update={"guarantee": guarantee})

    @field_validator("windows")
    @classmethod
    def _unique_window_names(cls, windows: list[WindowConfig]) -> list[WindowConfig]:
        seen: set[str] = set()
        for window in windows:
            if window.name in seen:
                raise ValueError(f"window name {window.name!r} is used twice: names must be unique")
            seen.add(window.name)
        return windows


class ConfigError(ValueError):
    """A configuration that can not be used; the message lists every bad field with its path and value."""


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith("function-"):  # pydantic's name for a model validator, not a field
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def describe_validation_error(err: ValidationError) -> str:
    """One line per problem: `windows[0].duration: <message> (got '2x')`."""
    lines = []
    for problem in err.errors():
        message = problem["msg"].removeprefix("Value error, ")
        got = problem.get("input")
        got_text = "" if isinstance(got, dict) or problem["type"] == "missing" else f" (got {got!r})"
        if problem["type"] == "extra_forbidden":
            message = ("unknown field: check the spelling against the configuration reference "
                       "(docs/reference/configuration.md)")
        lines.append(f"{_path(tuple(problem['loc']))}: {message}{got_text}")
    return "; ".join(lines)


def parse_config(data: Any) -> ReservoirConfig:
    """Validate a decoded config mapping (None or empty means all defaults)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"the config must be a mapping of fields, got {type(data).__name__}")
    try:
        return ReservoirConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err)) from None


MAX_CONFIG_BYTES = 64 * 1024  # config.yaml: a real one is a few KiB; parsing it is pure Python
MAX_CONFIG_DEPTH = 32  # nesting of config.yaml; the model itself nests 4 deep
MAX_CONFIG_NODES = 20_000  # values in config.yaml once its aliases are expanded (a "billion laughs" has 10^9)

_TOO_DEEP = (f"config.yaml nests deeper than {MAX_CONFIG_DEPTH} levels (the config itself is 4 deep): remove the "
             "extra brackets or indentation")
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's event parser when built with it


def _yaml_bounds(text: str) -> str | None:
    """`config.yaml` within bounds before the model parses it: its size, its nesting, and its values counted with
    every alias expanded (a few lines of anchors can stand for 10^9 values). The event stream is walked with an
    explicit stack (neither PyYAML's parser nor this recurses), so depth and size are known before anything is built.
    Malformed YAML is left to the model's own error, except where the parser gave up on the nesting itself: libyaml
    (PyYAML's wheels bundle it) scans ahead and stops at 1,000 levels of flow nesting before this walk sees the 33rd
    collection, and that refusal must read the same as the walk's own, whichever parser runs."""
    if len(text) > MAX_CONFIG_BYTES:
        return f"config.yaml is {len(text)} characters: at most {MAX_CONFIG_BYTES}"
    sizes: dict[str, int] = {}  # values under each anchor, itself included
    open_collections: list[list[Any]] = []  # [anchor, values inside so far] of each open mapping or sequence
    total = 0
    try:
        for event in yaml.parse(text, Loader=_YAML_LOADER):
            if isinstance(event, yaml.CollectionStartEvent):
                if len(open_collections) >= MAX_CONFIG_DEPTH:
                    return _TOO_DEEP
                open_collections.append([event.anchor, 1])
                count = 1
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, inside = open_collections.pop()
                if anchor:
                    sizes[anchor] = inside
                if open_collections:
                    open_collections[-1][1] += inside
                continue
            elif isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
                if isinstance(event, yaml.AliasEvent):
                    count = sizes.get(event.anchor or "", 1)
                else:
                    count = 1
                    if event.anchor:
                        sizes[event.anchor] = 1
                if open_collections:
                    open_collections[-1][1] += count
            else:
                continue
            total += count
            if total > MAX_CONFIG_NODES:
                return f"config.yaml holds more than {MAX_CONFIG_NODES} values once its YAML aliases are expanded"
    except yaml.YAMLError as err:
        if "nesting depth" in str(getattr(err, "problem", "") or ""):  # libyaml: "exceeded maximum nesting depth"
            return _TOO_DEEP
        return None
    return None


def load_config(text: str | None) -> ReservoirConfig:
    """Parse the YAML held in the ConfigMap under `config.yaml`, within bounds (`_yaml_bounds`): the agent, the
    CLI and the ConfigMap validator all read it here, so no config an admin can write stalls any of them."""
    if text is not None and not isinstance(text, str):
        raise ConfigError(f"config.yaml must be a string of YAML, got {type(text).__name__}")
    bounds = _yaml_bounds(text or "")
    if bounds:
        raise ConfigError(bounds)
    try:
        data = yaml.safe_load(text or "")
    except yaml.YAMLError as err:
        raise ConfigError(f"config.yaml is not valid YAML: {err}") from None
    except RecursionError:
        raise ConfigError("config.yaml nests too deep to read") from None
    except (ValueError, TypeError, OverflowError) as err:  # what YAML itself refuses to build (an int of 5000 digits)
        raise ConfigError(f"config.yaml cannot be read: {err}") from None
    return parse_config(data)
