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
    """Seed 000 (DESIGN 4.1)."""

    enabled: bool = True
    starving_job_time_threshold: Duration = Field(timedelta(minutes=10), alias="starvingJobTimeThreshold")
    reserved_node_percent: Percent = Field(20, alias="reservedNodePercent")
    max_lock_duration: Duration = Field(timedelta(hours=2), alias="maxLockDuration")
    # after its lock outlived maxLockDuration a job waits this long before it may lock any node again
    lock_cooldown: Duration = Field(timedelta(minutes=30), alias="lockCooldown")

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
    """Seed 004 (DESIGN 4.3): a cron window during which nodes are held for reserve pods.

    `schedule` is a standard 5-field cron expression for the window start, evaluated in `timezone`.
    The seed's `cron: "0 3 - 4 * * *"` ("from 3 to 4 o'clock") is accepted instead of schedule + duration.
    """

    name: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")]
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    resources: ResourceList
    schedule: str | None = None
    cron: str | None = None
    timezone: str = "UTC"
    duration: Duration | None = None
    start_reserve_ago: Duration = Field(timedelta(0), alias="startReserveAgo")
    pod_num_to_reserve: Annotated[int, Field(gt=0)] | None = Field(None, alias="podNumToReserve")
    # who may use the window's lock (DESIGN section 1, "Entitlement"): reserve pods of these namespaces and queues;
    # empty means any
    namespaces: list[str] = Field(default_factory=list)
    queues: list[str] = Field(default_factory=list)

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
    """Seed 001 (DESIGN 4.5): QueueScoreOrder weights and the ordering mode."""

    priority_weight: Annotated[float, Field(ge=0)] = Field(1.0, alias="priorityWeight")
    drf_weight: Annotated[float, Field(ge=0)] = Field(1.0, alias="drfWeight")
    proportion_weight: Annotated[float, Field(ge=0)] = Field(1.0, alias="proportionWeight")
    ordering: Literal["queue-first", "job-first"] = "queue-first"
    # the seed's `QueueScoreOrderEnable`: true orders queues by QueueScoreOrder (the weighted sum); false by the
    # plugins' own QueueOrderFn one after the other (priority, then DRF share, then proportion share, a plugin of
    # weight 0 left out). The seed's code defaults to false; Reservoir to true, the order it has always used.
    queue_score_order_enable: bool = Field(True, alias="queueScoreOrderEnable")


# an extended resource name: a DNS subdomain prefix, "/", a name (nvidia.com/gpu, amd.com/gpu)
_EXTENDED_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class GuaranteeConfig(_Model):
    """Seed 002 (DESIGN 4.2), and the guard rails of `Guaranteed` evictions (issue 10)."""

    enabled: bool = True
    search_budget: Annotated[int, Field(gt=0)] = Field(2000, alias="searchBudget")
    # at most this many evictions (accepted by the Eviction API) in any sliding minute; the rest wait for a later
    # reconcile. 0: `Guaranteed` evicts nothing.
    max_evictions_per_minute: Annotated[int, Field(ge=0)] = Field(10, alias="maxEvictionsPerMinute")
    # pods in these namespaces are never evicted; kube-system and Reservoir's own namespace never are, listed or not
    protected_namespaces: list[str] = Field(default_factory=list, alias="protectedNamespaces")
    # the seed's `gpu` dimension of `guarantee.percentage.dimensions`: the extended resource it stands for
    gpu_resource: str = Field("nvidia.com/gpu", alias="gpuResource")

    @field_validator("gpu_resource")
    @classmethod
    def _extended_resource(cls, value: str) -> str:
        if len(value) > 317 or not _EXTENDED_RESOURCE.match(value):
            raise ValueError("expected an extended resource name such as nvidia.com/gpu or amd.com/gpu")
        return value


class ReservationsConfig(_Model):
    """Seed 003 (DESIGN 4.4)."""

    enabled: bool = True
    gc_grace_period: Duration = Field(timedelta(hours=1), alias="gcGracePeriod")
    # the image of the placeholder pods holding an Available Reservation's resources (never run on kwok nodes)
    placeholder_image: str = Field("registry.k8s.io/pause:3.10", alias="placeholderImage", min_length=1,
                                   max_length=512)
    # at most this share of the cluster (each dimension of the schedulable nodes' allocatable) is held by
    # Reservations at once; a Reservation that would pass it stays Pending and says so
    max_reserved_percent: Annotated[int, Field(ge=0, le=90)] = Field(50, alias="maxReservedPercent")
    # an owner's handover (its node locked for the Reservation's owners) that has not bound it by then is given up:
    # the lock goes, the pod keeps its narrowed affinity and waits there like any pod
    handover_timeout: Duration = Field(timedelta(minutes=2), alias="handoverTimeout")


class KoordinatorConfig(_Model):
    """Issue 18: `reservations: true` makes the agent and the webhook also serve Koordinator's own
    `scheduling.koordinator.sh/v1alpha1` Reservations, with the same planner (needs deploy/components/koordinator or
    the Helm value `koordinator.reservations`, for the RBAC and webhook rules of that group)."""

    reservations: bool = False


KUEUE_THRESHOLD_SHARE = 0.5  # of Kueue's waitForPodsReady.timeout: a Workload's job starves after at most this much


class KueueConfig(_Model):
    """Issue 32: `workloads: true` makes the agent and the webhook read Kueue's Workloads (`kueue.x-k8s.io/v1beta2`):
    a job whose Workload (the one its controller ownerReference names) Kueue admitted starves from that admission,
    needs all the pods Kueue admitted and has the priority Kueue resolved (capped by its pods'); its ClusterQueue is
    matched by windows' and backfill's `queues` (needs deploy/components/kueue or the Helm value `kueue.workloads`,
    for the RBAC). `podsReadyTimeout`: Kueue's waitForPodsReady timeout, when on; the job's lock then comes before
    Kueue gives up."""

    workloads: bool = False
    # Kueue's own `waitForPodsReady.timeout` (its Configuration), when it is on: an admitted Workload whose pods are
    # not all ready by then is evicted and requeued. Given, a Workload's job starves after at most half of it
    # (KUEUE_THRESHOLD_SHARE), so its lock comes while the other half is left for its node to drain.
    pods_ready_timeout: Duration | None = Field(None, alias="podsReadyTimeout")

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
    """Issue 17, backfill (agent/planner/backfill.py): which pods may opt in, and the timings. Off until a namespace or
    a queue is named: a pod opts in with the annotation `reservoir.sh/backfill: "true"` (on it or its PodGroup), and
    only where `namespaces` or `queues` covers it ("*" covers all)."""

    namespaces: list[str] = Field(default_factory=list)
    queues: list[str] = Field(default_factory=list)
    # added to a backfilled pod's runtime before it must end, beside the pod's own terminationGracePeriodSeconds (the
    # kubelet may take that long to stop it once activeDeadlineSeconds passes): covers the time from the plan that
    # grants the node to the pod's startTime (the gate lifted, kube-scheduler's bind, the kubelet's start)
    margin: Duration = Field(timedelta(seconds=10))
    # a pod held on the gate longer than this (the agent down, or its writes failing) is let go unchanged when the
    # agent next plans: Reservoir never holds a pod back to wait for a backfill slot
    max_gate_wait: Duration = Field(timedelta(minutes=2), alias="maxGateWait")

    def covers(self, namespace: str, queue: str | None) -> bool:
        """The switch: pods of this namespace or queue may opt in. `queue` is the pod's queue only when the Queue
        admits its namespace (shared.entitlement.admitted_queue), else None: naming a queue is no way in."""
        return ("*" in self.namespaces or namespace in self.namespaces
                or (queue is not None and ("*" in self.queues or queue in self.queues)))

    @property
    def enabled(self) -> bool:
        return bool(self.namespaces or self.queues)


class WebhookConfig(_Model):
    """DESIGN section 3, mutation 5: who may ignore every lock."""

    tolerate_best_effort: bool = Field(True, alias="tolerateBestEffort")
    tolerate_daemonsets: bool = Field(True, alias="tolerateDaemonSets")
    # namespaces whose pods may use every lock and carry any lock toleration (an admin's own, e.g. monitoring)
    trusted_namespaces: list[str] = Field(default_factory=list, alias="trustedNamespaces")


class ReservoirConfig(_Model):
    """The whole configuration. Every default lives here and nowhere else."""

    dry_run: bool = Field(False, alias="dryRun")
    # at most 90 (issue 10's guard rail): some node always stays unlocked for the pods no lock owns. The cap is
    # floor(percent x schedulable nodes / 100), so a one-node cluster locks nothing (seed 002 "Safety").
    max_locked_node_percent: Annotated[int, Field(ge=0, le=90)] = Field(50, alias="maxLockedNodePercent")
    resync_period: Duration = Field(timedelta(seconds=30), alias="resyncPeriod")
    debounce: Duration = Field(timedelta(seconds=1))
    starvation: StarvationConfig = Field(default_factory=StarvationConfig)
    windows: list[WindowConfig] = Field(default_factory=list)
    queue_order: QueueOrderConfig = Field(default_factory=QueueOrderConfig, alias="queueOrder")
    guarantee: GuaranteeConfig = Field(default_factory=GuaranteeConfig)
    reservations: ReservationsConfig = Field(default_factory=ReservationsConfig)
    koordinator: KoordinatorConfig = Field(default_factory=KoordinatorConfig)
    kueue: KueueConfig = Field(default_factory=KueueConfig)
    backfill: BackfillConfig = Field(default_factory=BackfillConfig)
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)

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
            message = "unknown field: check the spelling against the config reference in the README"
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
