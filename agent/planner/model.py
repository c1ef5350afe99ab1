"""Plain data the planner works on: the snapshot it reads, the locks it returns and every status beside them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, TypedDict, cast

from agent.planner.capacity import NodeState, ShapeRanking
from agent.planner.podindex import PodIndex
from shared import keys
from shared.config import ReservoirConfig
from shared.entitlement import Grounds
from shared.keys import LockKind
from shared.resources import EMPTY, Resources
from shared.timestamps import FIRST_YEAR, LAST_YEAR, in_range, parse_time, stamp
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

# the most pods a lock names (Lock.tasks): 256 keys of the longest "namespace/name" (317 characters) are 82 KiB of a
# node's 256 KiB of annotations; a starvation lock reserves at most this many tasks on one node (reserve_tasks), a
# Reservation's handover lock names at most this many of the owners it hands over
MAX_LOCK_TASKS = 256
# the most backfill grants one node holds (keys.BACKFILL_GRANTS: pods let onto it and not finished): an entry of the
# longest pod key and owner id is at most 760 bytes (472 measured), so 128 are under 95 KiB, beside a lock's 82 KiB; a
# node allowing more pods than this takes no more backfills, and notes no room, until some of its grants end
# (backfill.backfill_verdict, backfill.room_marks)
MAX_NODE_GRANTS = 128
# the most grants of one namespace's pods not bound yet that one node holds: a pod granted, narrowed and let go that
# kube-scheduler never binds (pinned there, and kept off by a filter Reservoir does not model: a missing volume, pod
# anti-affinity) keeps its grant until the grant's `until` while the owner's lock stands (backfill.grant_lives);
# without this bound a tenant's 1m-cpu pods filled MAX_NODE_GRANTS with such grants and shut everyone else out of
# backfill on the node (backfill.backfill_verdict)
MAX_NAMESPACE_UNBOUND_GRANTS = 32


@dataclass(frozen=True)
class Snapshot:
    """What the cluster looked like at one moment, from the watch caches."""

    nodes: Mapping[str, NodeView] = field(default_factory=dict)
    pods: Sequence[PodView] = ()
    podgroups: Mapping[tuple[str, str], PodGroupView] = field(default_factory=dict)
    queues: Mapping[str, QueueView] = field(default_factory=dict)
    priority_classes: Mapping[str, PriorityClassView] = field(default_factory=dict)
    reservations: Mapping[str, ReservationView] = field(default_factory=dict)
    # each DaemonSet's uid by (namespace, name): a pod's DaemonSet controller reference is believed only when it names
    # one that exists with that uid (guarantee.Witnesses)
    daemonsets: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # issue 32: Kueue's Workloads by the (namespace, kind, name) of the job each stands for (views.workloads_by_owner),
    # while `kueue.workloads` is on (else none: jobs.build_jobs)
    workloads: Mapping[tuple[str, str, str], WorkloadView] = field(default_factory=dict)
    # issue 32: Kubernetes' own PodGroups by (namespace, name), where the API server serves them
    native_podgroups: Mapping[tuple[str, str], NativePodGroupView] = field(default_factory=dict)

    @cached_property
    def index(self) -> PodIndex:
        """The pods indexed by node, job, uid and pending (podindex.PodIndex): built from `pods` on first use, unless
        the snapshot was made `with_index` (the agent keeps one up to date from its pod cache's changes)."""
        return PodIndex.of(self.pods)

    def grounds(self, config: ReservoirConfig, *, reservations: bool = True) -> Grounds:
        """Entitlement's grounds in the planner (shared.entitlement): this snapshot's PodGroups, Queues, DaemonSets
        and Kueue Workloads, its Reservations unless `reservations` is false (a policy no Reservation bears on
        skips matching every pod against them), and `config`."""
        return Grounds(podgroups=self.podgroups, queues=self.queues, daemonsets=self.daemonsets, config=config,
                       reservations=self.reservations if reservations else {}, workloads=self.workloads)

    def with_index(self, index: PodIndex) -> Snapshot:
        """This snapshot, its `index` given: `index` must be the index of `pods` (the agent's, kept up to date from the
        same cache; a replace() of the snapshot builds its own again)."""
        self.__dict__["index"] = index
        return self


class LockInfo(TypedDict, total=False):
    """The `reservoir.sh/lock-info` annotation's JSON (DESIGN section 2). Lock.info() writes every key; read back
    (lock_on) any of them may be missing or hand-edited, so each is read with a fallback."""

    owner: str
    kind: str  # a LockKind value
    subject: str
    reason: str
    since: str  # RFC 3339
    expires: str | None
    reserved: dict[str, str]  # a ResourceList
    tasks: list[str]  # "namespace/name" of the pods the lock is held for (starvation locks)


class LockInfoError(ValueError):
    """A `reservoir.sh/lock-info` annotation that is not a JSON object."""


def read_lock_info(text: str) -> LockInfo:
    """The annotation's JSON; empty when it is absent. LockInfoError when it is not JSON (or nested too deep to
    parse) or not an object."""
    try:
        info = json.loads(text or "{}")
    except (ValueError, RecursionError) as err:
        raise LockInfoError(f"not JSON: {str(err)[:120]}") from None
    if not isinstance(info, dict):
        raise LockInfoError(f"not a JSON object but {type(info).__name__}")
    # a JSON object is all json.loads can say; its keys are checked one by one where they are read
    return cast(LockInfo, info)


@dataclass(frozen=True)
class Lock:
    """One node held for one owner (DESIGN section 2). `subject` is the owner's readable name. `tasks` names at most
    MAX_LOCK_TASKS pods (the policies that make locks hold to it), so the lock-info annotation stays far below the
    256 KiB the API server allows a node's annotations however many pods a node allows and however long their names."""

    node: str
    owner: str
    kind: LockKind
    subject: str
    reason: str
    since: datetime
    expires: datetime | None = None
    reserved: Resources = EMPTY
    tasks: tuple[str, ...] = ()
    # the BestEffort exemption does not reach it (a `Guaranteed` queue's, seed 002): the node carries the
    # `reservoir.sh/lock-exclusive` taint too (shared.entitlement, "Exclusive locks"); read back from that taint when
    # its value is the lock's owner
    exclusive: bool = False
    # read back (lock_on) from an annotation or taints Reservoir did not write as they are: what could not be read or
    # did not agree, else "". Not part of the lock's identity: the writer rewrites the lock whole (taints, labels,
    # annotation) and reports it (a Warning Event).
    unreadable: str = field(default="", compare=False)

    def info(self) -> LockInfo:
        """The `reservoir.sh/lock-info` annotation's JSON."""
        return {
            "owner": self.owner, "kind": self.kind.value, "subject": self.subject, "reason": self.reason,
            "since": stamp(self.since), "expires": stamp(self.expires) if self.expires else None,
            "reserved": self.reserved.to_quantities(), "tasks": list(self.tasks),
        }

    def info_json(self) -> str:
        return json.dumps(self.info(), sort_keys=True, separators=(",", ":"))

    def same_hold(self, other: Lock | None) -> bool:
        """True when `other` holds the node for the same owner with the same annotation and taints (nothing to
        patch)."""
        return (other is not None and self.owner == other.owner and self.exclusive == other.exclusive
                and self.info_json() == other.info_json())


def lock_on(node: NodeView) -> Lock | None:
    """Read back the lock Reservoir wrote on a node (taints + labels + info annotation), or None.

    A taint whose info annotation is missing or unreadable still counts as a lock of its owner, so the agent
    can always find and remove what it wrote; so does any one of Reservoir's taints alone (NodeView.lock_owner: a
    lone `reservoir.sh/lock-exclusive`), and an exclusive taint counts only when it names the lock's owner
    (lock_taint_problems). Total over any annotation text: one that is not JSON (or nested too
    deep to parse), not an object, or whose fields have the wrong shape (a `since` that is no RFC 3339 time with a
    zone between the years 1970 and 9000, `reserved` with a bad quantity or not an object, `tasks` that is not a
    list of strings) gives that field's default (node creation time, nothing reserved, no tasks), never an error:
    one hand-edited node must not fail the plan. What could not be read is said in `Lock.unreadable` (the writer
    reports it in a Warning Event on the node and rewrites the annotation; `reservoir status` shows it)."""
    owner = node.lock_owner
    if owner is None:
        return None
    problems: list[str] = []
    inconsistent = lock_taint_problems(node, owner)
    text_of_info = node.annotations.get(keys.LOCK_INFO, "")
    try:
        info: Mapping[str, Any] = read_lock_info(text_of_info)
    except Exception as err:  # LockInfoError, or anything else: unreadable as a whole
        info = {}
        problems.append(str(err) or type(err).__name__)
    if not text_of_info:
        problems.append("missing")

    def text(name: str) -> str:
        value = info.get(name)
        if isinstance(value, str):
            return value
        if name in info:
            problems.append(f"{name} is not a string")
        return ""

    def moment(name: str) -> datetime | None:
        raw = info.get(name)
        try:
            value = parse_time(raw) if isinstance(raw, str) else None
        except ValueError:
            value = None
        if not in_range(value):
            if raw is not None:
                problems.append(f"{name} is not an RFC 3339 time between {FIRST_YEAR} and {LAST_YEAR}")
            return None  # naive (not comparable), or so far off that adding a duration overflows
        return value

    label_kind = node.labels.get(keys.LOCK_KIND, "")
    from_label = LockKind(label_kind) if label_kind in LockKind.__members__.values() else LockKind.JOB
    kind = keys.owner_kind(owner) or from_label
    raw_reserved = info.get("reserved")
    reserved = EMPTY
    try:
        if isinstance(raw_reserved, Mapping):
            reserved = Resources.parse(raw_reserved)
        elif raw_reserved is not None:
            raise ValueError(type(raw_reserved).__name__)
    except ValueError:
        problems.append("reserved is not a ResourceList of quantities")
    raw_tasks = info.get("tasks")
    tasks = tuple(t for t in raw_tasks if isinstance(t, str)) if isinstance(raw_tasks, list) else ()
    if raw_tasks is not None and (not isinstance(raw_tasks, list) or len(tasks) != len(raw_tasks)):
        problems.append("tasks is not a list of strings")
    subject, reason = text("subject"), text("reason")
    since, expires = moment("since"), moment("expires")
    return Lock(
        node=node.name, owner=owner, kind=kind, subject=subject or owner, reason=reason,
        since=since or node.created, expires=expires, reserved=reserved, tasks=tasks,
        exclusive=any(t.key == keys.LOCK_EXCLUSIVE and t.effect == keys.LOCK_EFFECT and t.value == owner
                      for t in node.taints),
        unreadable="; ".join(inconsistent + ([f"{keys.LOCK_INFO} {'; '.join(problems)}"] if problems else [])),
    )


def lock_taint_problems(node: NodeView, owner: str) -> list[str]:
    """What is inconsistent in the lock taints (keys.LOCK_TAINT_KEYS) of a node locked for `owner`
    (NodeView.lock_owner): no `reservoir.sh/lock` taint beside an exclusive one, or an exclusive taint naming another
    owner (then the lock reads as not exclusive). Said in Lock.unreadable, so the writer rewrites the taints whole (or
    removes them)."""
    problems = []
    ours = [t for t in node.taints if t.key in keys.LOCK_TAINT_KEYS and t.effect == keys.LOCK_EFFECT]
    if not any(t.key == keys.LOCK for t in ours):
        problems.append(f"{keys.LOCK_EXCLUSIVE} taint without a {keys.LOCK} taint")
    problems += [f"{keys.LOCK_EXCLUSIVE} taint names {t.value!r}, not the lock's owner {owner!r}"
                 for t in ours if t.key == keys.LOCK_EXCLUSIVE and t.value != owner]
    return problems


@dataclass(frozen=True)
class JobStatus:
    """Seed 000: one job with a pending pod, as the starvation policy judged it."""

    subject: str
    owner: str
    queue: str
    priority: int
    min_member: int
    bound: int
    pending: int
    starving: bool
    reason: str
    created: datetime | None = None  # the job's creation time (its PodGroup's, else its oldest pod's); None: unknown
    threshold: timedelta | None = None  # its own starvation threshold when below the config's (Job.threshold)


@dataclass(frozen=True)
class WindowStatus:
    """Seed 004: one configured window, running or next."""

    name: str
    active: bool
    start: datetime
    end: datetime
    reason: str


@dataclass(frozen=True)
class QueueScore:
    """Seed 001: one queue's QueueScoreOrder score and its parts (ordering module docstring)."""

    name: str
    priority: int
    priority_score: float
    drf_share: float
    drf_score: float
    proportion_share: float
    proportion_score: float
    total: float
    allocated: Resources
    deserved: Resources


@dataclass(frozen=True)
class QueueGuaranteeStatus:
    """Seed 002: one queue's guarantee, as the agent writes it to `status.reservation` (and reports a refusal)."""

    queue: str
    nodes: tuple[str, ...]
    resource: Resources  # total idle on the locked nodes (seed 002 status.reservation.resource)
    policy: str
    reason: str
    warning: str | None = None  # set when the guarantee is refused (too large): reported as a Warning Event
    evict: tuple[str, ...] = ()  # `Guaranteed`: other queues' pods on the locked nodes, "namespace/name"


@dataclass(frozen=True)
class ReservationStatus:
    """Seed 003: one Reservation's phase, node, conditions and current owners, as the agent writes them."""

    name: str
    phase: str
    node: str
    reason: str  # the Ready condition's reason
    message: str
    allocatable: Resources
    allocated: Resources
    owners: tuple[PodView, ...] = ()  # current owners
    annotate: tuple[str, ...] = ()  # owner pods ("namespace/name") still lacking the allocated annotation
    delete: bool = False  # terminal for longer than the grace period: garbage-collect the object
    final: bool = False  # ended in an earlier plan: its status stays as written then
    conditions: tuple[dict[str, Any], ...] = field(default=())
    # issue 18: `name` is the Reservation's key (ReservationView.key); the object itself is `object_name` of
    # `api_version` (Reservoir's or Koordinator's group), with `uid`
    object_name: str = ""
    uid: str = ""
    api_version: str = keys.RESERVATION_API_VERSION
    # issue 18: another field manager writes this Koordinator Reservation's status: Reservoir writes nothing to it
    left_alone: str = ""

    def status(self) -> dict[str, Any]:
        """The object's `status`, as the agent writes it."""
        return {
            "phase": self.phase, "nodeName": self.node or None, "conditions": list(self.conditions),
            "allocatable": self.allocatable.to_quantities(), "allocated": self.allocated.to_quantities(),
            "currentOwners": [{"namespace": p.namespace, "name": p.name, "uid": p.uid} for p in self.owners],
        }


def koordinator_allocated(name: str, uid: str) -> str:
    """Koordinator's `reservation-allocated` annotation value (its ReservationAllocated, as Go's json.Marshal writes
    it): {"name":"<reservation>","uid":"<uid>"}."""
    return json.dumps({"name": name, "uid": uid}, separators=(",", ":"))


def placeholder_name(owner: str, requests: Resources) -> str:
    """A placeholder pod's name: `reservoir-<Reservation owner id>-<6 hex of its requests>`. The size is in the name
    because a pod's requests cannot change: a placeholder resized is a new pod beside the old one's deletion."""
    sized = json.dumps(requests.to_quantities(), sort_keys=True, separators=(",", ":"))
    return f"reservoir-{owner}-{hashlib.sha256(sized.encode()).hexdigest()[:6]}"


@dataclass(frozen=True)
class Placeholder:
    """Seed 003 (DESIGN 1, "Reserved amount"): the pod that holds what an Available Reservation still reserves on its
    node, so kube-scheduler sees it used and every other pod may use the rest of the node."""

    reservation: str
    reservation_uid: str
    owner: str  # the Reservation's owner id (the PLACEHOLDER label's value)
    node: str
    requests: Resources
    # issue 18: `reservation` is the Reservation's key; its ownerReference names `object_name` of `api_version`
    object_name: str = ""
    api_version: str = keys.RESERVATION_API_VERSION

    @property
    def name(self) -> str:
        return placeholder_name(self.owner, self.requests)


@dataclass(frozen=True)
class Handover:
    """Seed 003: the next step of one owner pod held by Reservoir's scheduling gate (keys.HANDOVER_GATE). With a
    `node`, the writer narrows the pod's required node affinity to that node and adds `tolerate`, then lifts the gate;
    without, it only lifts the gate (the pod is scheduled as usual)."""

    namespace: str
    name: str
    uid: str
    reservation: str
    node: str = ""
    tolerate: tuple[dict[str, str], ...] = ()
    reason: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Repair:
    """DESIGN section 4 "Repair": a pending pod that a lock is held for but that lacks its toleration (created while
    the webhook was down, or before Reservoir was installed). The writer adds `add` to the pod's tolerations."""

    namespace: str
    name: str
    tolerations: tuple[Mapping[str, Any], ...]  # what the pod carries now
    add: tuple[dict[str, str], ...]  # lock tolerations it lacks, owners sorted

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Plan:
    locks: Mapping[str, Lock]  # node -> desired lock
    jobs: Sequence[JobStatus] = ()
    windows: Sequence[WindowStatus] = ()
    notes: Sequence[str] = ()  # one line per decision not to lock, with the reason, each `policy=<name> ...`
    queues: Sequence[QueueScore] = ()  # best first, when queues competed in this plan
    guarantees: Sequence[QueueGuaranteeStatus] = ()  # per queue with a guarantee
    reservations: Sequence[ReservationStatus] = ()  # per Reservation
    repairs: Sequence[Repair] = ()  # pods to give the lock tolerations they lack, by (namespace, name)
    # seed 003: every placeholder pod there should be (the writer creates the missing, deletes the others)
    placeholders: Sequence[Placeholder] = ()
    handovers: Sequence[Handover] = ()  # seed 003: gated owner pods to hand over or let go, oldest first
    # node -> Reservoir's marks (other than the lock) to write there, text or None to remove, only where the node
    # differs: seed 000's `reservoir.sh/lock-expired` annotation (starvation.lock_cooldowns), backfill's annotations,
    # and the soft-drain taint under keys.DRAIN (plan.drain_marks; writer.node_patch)
    node_marks: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    # node -> owner id: the soft-drain taints this plan wants (starvation.soft_drains), written through node_marks
    drains: Mapping[str, str] = field(default_factory=dict)
    # the earliest PolicyResult.wake_at: when the agent must plan again though nothing in the cluster changed
    wake_at: datetime | None = None
    # the node states this plan computed, handed to the next plan to reuse what did not change
    states: Mapping[str, NodeState] = field(default_factory=dict, compare=False, repr=False)
    # id(pod view) -> (that view, it with its PodGroup's maximum runtime), handed to the next plan so the same view
    # is given the same object and its node's state is reused (reserve.with_group_runtimes)
    runtimes: Mapping[int, tuple[PodView, PodView]] = field(default_factory=dict, compare=False, repr=False)
    # seed 000's node order per task shape, handed to the next plan (capacity.ShapeRanking, issue 34)
    rankings: Mapping[str, ShapeRanking] = field(default_factory=dict, compare=False, repr=False)
    # issue 17: the gated pods let onto locked nodes or let go, and every backfill slot (agent/planner/backfill.py)
    backfill: BackfillPlan = field(default_factory=lambda: BackfillPlan())


# --- backfill (issue 17, agent/planner/backfill.py) ---


@dataclass(frozen=True)
class BackfillSlot:
    """One locked node as backfill sees it: the node's state, the lock's owner id and kind, what the owner's tasks
    that fit now take there (kept from backfill, clause 7) and the node's needed-by time (None: unknown)."""

    state: NodeState
    owner: str
    kind: LockKind
    needed_by: datetime | None
    taken_now: Resources = EMPTY
    waiting: int = 0  # the owner's pending tasks on the node (a window's pending reserve pods there)
    # the pods granted this node (shared.backfill grants) that live: bound or about to be
    backfilled: int = 0
    tasks: tuple[str, ...] = ()  # the keys of the owner's pending pods among them (none for a Reservation)
    # the uids of the node's grants this plan keeps (backfill.grant_lives): what MAX_NODE_GRANTS counts
    granted: frozenset[str] = frozenset()
    # (uid, namespace) of those of `granted` whose pods are not bound yet: what MAX_NAMESPACE_UNBOUND_GRANTS counts
    unbound: frozenset[tuple[str, str]] = frozenset()

    @property
    def node(self) -> str:
        return self.state.node.name


@dataclass(frozen=True)
class EstimateMark:
    """Issue 17: one object to carry an owner's expected start in keys.EXPECTED_START (backfill.estimate_marks): a
    PodGroup, a Kueue Workload or a Pod, by kind, namespace and name."""

    kind: str
    namespace: str
    name: str
    text: str


@dataclass(frozen=True)
class StartEstimate:
    """Issue 17: when one owner waiting on its locks is expected to start (backfill.start_estimates): `at`, or None
    with `unknown` saying why; its locked nodes and the pods backfilling them now."""

    owner: str
    kind: LockKind
    subject: str
    at: datetime | None
    unknown: str
    nodes: tuple[str, ...]
    backfilled: int
    tasks: tuple[str, ...] = ()  # the keys of its pending pods on those nodes (none for a Reservation)

    @property
    def text(self) -> str:
        """As published (keys.EXPECTED_START): the RFC 3339 time, or the unknown reason."""
        return stamp(self.at) if self.at is not None else self.unknown


@dataclass(frozen=True)
class Backfill:
    """One pod let onto one locked node: it must end by `ends` (its deadline, with the margin), by `needed_by`."""

    pod: PodView
    node: str
    owner: str
    ends: datetime
    needed_by: datetime
    reason: str
    deadline: int = 0  # the activeDeadlineSeconds it is given (deadline_seconds)

    @property
    def key(self) -> str:
        return self.pod.key


@dataclass(frozen=True)
class DeadlineCut:
    """Issue 17: a backfilled pod that started late (kube-scheduler bound it after its grant's margin was spent) and
    whose activeDeadlineSeconds is lowered to `deadline` so it still ends by its grant's `until`; or (`ungranted`) a pod
    narrowed for a grant that ended before it bound, bound since under a lock of the same owner with no grant, cut to 1
    (backfill.deadline_cuts)."""

    pod: PodView
    node: str
    owner: str
    until: datetime  # the grant's `until`; with `ungranted`, when the owner's lock began
    deadline: int
    # bound under the lock with no grant naming it: narrowed for a grant that ended unbound (deadline_cuts)
    ungranted: bool = False

    @property
    def key(self) -> str:
        return self.pod.key


@dataclass(frozen=True)
class Release:
    """A gated pod let go unchanged (its backfill gate lifted, nothing else): kube-scheduler places it as usual."""

    namespace: str
    name: str
    uid: str
    reason: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class BackfillPlan:
    """backfill.plan_backfill's answer: the pods let onto locked nodes (each narrowed to its node, given the lock's
    toleration and its deadline, then ungated), the gated pods let go unchanged, every slot (for the start estimates
    and `reservoir status`) and one note per decision. The grants each node must carry go into Plan.node_marks."""

    placed: tuple[Backfill, ...] = ()
    released: tuple[Release, ...] = ()
    marks: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    slots: tuple[BackfillSlot, ...] = ()
    notes: tuple[str, ...] = ()
    estimates: tuple[StartEstimate, ...] = ()  # every owner with a slot and a task waiting (start_estimates)
    estimate_marks: tuple[EstimateMark, ...] = ()  # where the estimates are to be written (estimate_marks)
    cuts: tuple[DeadlineCut, ...] = ()  # backfilled pods that started late, their deadlines lowered (deadline_cuts)


NO_BACKFILL = BackfillPlan()
