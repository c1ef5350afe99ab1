"""`reservoir record`'s pure part: what a pod or node object becomes in the trace CSV (shared/tracecsv.py), the
escaping and hashing of what tenants wrote, and the bookkeeping that lets a recording resume after a crash without
losing or duplicating a row. No Kubernetes client and no clock: the recorder (agent/record.py) hands in the objects
its watches show and the moment it saw them.

Times. A row's times are seconds since the recording's origin (the moment its first run started, kept in its state),
to the millisecond. Each is the API server's own stamp (creationTimestamp; the PodScheduled condition's
lastTransitionTime, else status.startTime; the latest container `finishedAt` of a pod that Succeeded or Failed),
which is to the second, refined to the moment the recorder's watch showed the change when that moment falls within
the stamp's second (`moment`): a change seen live, on a clock that agrees with the API server's. A change seen later
(on a list after a restart, or on a clock that disagrees) keeps the API's stamp. A deletion has no stamp of its own:
its time is the moment the watch showed it.

The end of a pod is the first of: its phase Succeeded or Failed, and its deletion (kube-scheduler frees its room
then). A pod's row is written once, when it ended; at the end of the recording (`--duration`) the pods still
pending or running are written too, with an empty deletion_time and an empty `end`.

Resume (`Recording`): the state (record-state.json, written whole to a temporary file and renamed) holds the origin,
the flags that shape the rows, the pods seen and not yet written (everything their row needs), and `seen_until`, the
last moment the recorder knew every pod's state. Rows are appended to pods.csv and synced before the pod leaves the
state, so a crash between the two leaves a pod in both: on resume the uids pods.csv holds are dropped from the state
(`Recording.resume`), never written twice; a last line cut short by the crash is cut off (`read_written_uids`) and its
pod, still in the state, written again whole. A pod in the state that the resumed recorder's first list no longer
shows vanished while it was down: its end is unknown and is written explicitly as such, `end` "Vanished", with
deletion_time the moment the first list showed it gone (the latest its end can be) and `end_after` the state's
`seen_until` (the earliest): a replay runs it to the later bound, an analysis may drop or bound it.

Tenant-written strings (pod names, namespaces, owner kinds, the GPU models a pod's selector names) are escaped before
they reach the CSV (`escape`): no control, format or line-separator character survives (each becomes `\\uXXXX`), a
backslash is doubled, a leading `=`, `+`, `-` or `@` gets a `'` (a spreadsheet would read it as a formula), and the
length is capped; the csv module quotes the rest. `--anonymize` replaces pod names, namespaces and node names with a
keyed hash (HMAC-SHA256 under a key kept in the recording's directory, so a resumed recording hashes alike).
GPU model names are kept: they name hardware the cluster's operator labelled (GPU feature discovery), not a tenant,
and they are what a replay matches pods' model choices to nodes by; a pod's own choice of models is escaped like
any tenant string.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from agent.planner.reserve import maximum_runtime
from shared import keys
from shared.resources import CPU, MEMORY, qos_class
from shared.timestamps import parse_time
from shared.tracecsv import POD_COLUMNS, RECORDED_POD_COLUMNS, NodeRow, PodRow, format_time, node_fields, pod_fields
from shared.views import NodeView, PodView, ViewError

RECORD_COLUMNS = (*POD_COLUMNS, *RECORDED_POD_COLUMNS)
MAX_FIELD = keys.MAX_DNS_SUBDOMAIN  # characters of a tenant-written field: every object name the API accepts fits
# GPU models a pod's row names at most (its first, sorted): a tenant may list thousands in one affinity term, and one
# such row would pass the csv module's field limit (131,072) and make the whole pods.csv unreadable
MAX_MODELS = 32
# owner kinds written as they are under --anonymize; any other (a custom controller's kind names a product) as "Other"
KNOWN_OWNER_KINDS = frozenset(("ReplicaSet", "Job", "StatefulSet", "DaemonSet", "ReplicationController", "CronJob",
                               "PodGroup", "Node"))
MIB = 1 << 20
TERMINAL = ("Succeeded", "Failed")
STATE_VERSION = 1
TIME_DECIMALS = 3  # decimals of a second written


class RecordingError(Exception):
    """A recording directory that cannot be resumed as asked: the message names the file and the fix."""


# --- escaping and hashing ---

_FORMULA = ("=", "+", "-", "@")


def escape(text: str, limit: int = MAX_FIELD, special: str = "") -> str:
    """A tenant-written string made safe for one CSV field: control, format, surrogate, private-use, unassigned and
    line/paragraph-separator characters (and any in `special`) as `\\uXXXX`, a backslash doubled, a leading formula
    character defused with a `'`, at most `limit` characters (cut ones end in `...`)."""
    out: list[str] = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char in special or unicodedata.category(char)[0] == "C" or unicodedata.category(char) in ("Zl", "Zp"):
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    safe = "".join(out)
    if safe.startswith(_FORMULA):
        safe = "'" + safe
    return safe if len(safe) <= limit else safe[:max(0, limit - 3)] + "..."


@dataclass(frozen=True)
class Anonymizer:
    """Names as written: escaped, or, with a key (`--anonymize`), replaced by `<kind>-` and 16 hex digits of
    HMAC-SHA256(key, kind NUL name): the same name hashes alike throughout a recording, resumes included, and cannot
    be guessed back without the key."""

    key: bytes | None = None

    def name(self, kind: str, text: str) -> str:
        if self.key is None:
            return escape(text)
        digest = hmac.new(self.key, f"{kind}\0{text}".encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        return f"{kind}-{digest[:16]}"


# --- objects as the recorder sees them ---

def _stamp(value: Any) -> float | None:
    """An RFC 3339 time as seconds since the Unix epoch; None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        moment = parse_time(value)
    except ValueError:
        return None
    return moment.timestamp() if moment is not None and moment.tzinfo is not None else None


def _bound_stamp(status: Mapping[str, Any]) -> float | None:
    """When the API server says the pod was bound: its PodScheduled=True condition's lastTransitionTime, else its
    startTime (kwok's and the kubelet's, a moment after the binding)."""
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "PodScheduled" and \
                condition.get("status") == "True":
            stamp = _stamp(condition.get("lastTransitionTime"))
            if stamp is not None:
                return stamp
    return _stamp(status.get("startTime"))


def _ended_stamp(status: Mapping[str, Any]) -> float | None:
    """When the API server says a finished pod's last container ended: the latest `finishedAt` of its containers."""
    ends = []
    for container in status.get("containerStatuses") or ():
        terminated = ((container.get("state") or {}).get("terminated") or {}) if isinstance(container, Mapping) \
            else {}
        stamp = _stamp(terminated.get("finishedAt")) if isinstance(terminated, Mapping) else None
        if stamp is not None:
            ends.append(stamp)
    return max(ends) if ends else None


def _models(spec: Mapping[str, Any], label: str) -> tuple[str, ...]:
    """The GPU models a pod may use, by the node label `label`: its nodeSelector's value; else, when every term of
    its required node affinity names the label with `In`, the values of those terms; else none (any model)."""
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and isinstance(selector.get(label), str):
        return (selector[label],)
    affinity = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = affinity.get("nodeSelectorTerms") if isinstance(affinity, Mapping) else None
    if not isinstance(terms, list) or not terms:
        return ()
    models: set[str] = set()
    for term in terms:
        named = [e for e in ((term.get("matchExpressions") or ()) if isinstance(term, Mapping) else ())
                 if isinstance(e, Mapping) and e.get("key") == label and e.get("operator") == "In"
                 and isinstance(e.get("values"), list)]
        if not named:
            return ()  # this term lets the pod go to a node of any model
        models.update(v for v in named[0]["values"] if isinstance(v, str))
    return tuple(sorted(models)[:MAX_MODELS])


@dataclass(frozen=True)
class PodSeen:
    """What a recording keeps of a pod object (its watch cache's view: a change of anything else is no event).
    Times are seconds since the Unix epoch, the API server's stamps (to the second); `bound_at` and `ended_at` None
    until it is bound, finished."""

    uid: str
    namespace: str
    name: str
    owner_kind: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_models: tuple[str, ...]
    qos: str
    declared_runtime: float | None
    phase: str
    node: str
    gated: bool
    created_at: float
    bound_at: float | None
    ended_at: float | None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "gpu_models": list(self.gpu_models)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PodSeen:
        names = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: (tuple(v) if k == "gpu_models" else v) for k, v in data.items() if k in names}
        return cls(**values)


@dataclass(frozen=True)
class PodReader:
    """A pod object -> PodSeen, for the recorder's watch cache: requests as kube-scheduler counts them
    (shared.resources.pod_requests, through shared.views.PodView: init containers, sidecars, overhead), GPUs of
    `gpu_resource` (whole devices: gpu_milli 1000 each, the trace's way of writing a whole GPU), the models it may use
    by `model_label`, its declared maximum runtime as the planner reads it (agent.planner.reserve.maximum_runtime; the
    pod's own: a recording reads pods and nodes only, not PodGroups). Raises ViewError for an object it cannot read
    (the cache skips it, counts it and logs it once)."""

    gpu_resource: str = keys.GPU_RESOURCE
    model_label: str = keys.GPU_MODEL_LABEL

    def __call__(self, obj: Mapping[str, Any]) -> PodSeen:
        view = PodView.from_obj(obj)
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if not view.uid:
            raise ViewError(f"Pod {view.namespace}/{view.name}: metadata.uid: empty", "metadata.uid: empty", "Pod")
        runtime = maximum_runtime(view, {})
        gpus = view.requests.get(self.gpu_resource, 0)
        controller = view.controller
        return PodSeen(
            uid=view.uid, namespace=view.namespace, name=view.name,
            owner_kind=controller.kind if controller is not None else "",
            cpu_milli=view.requests.get(CPU, 0), memory_mib=-(-view.requests.get(MEMORY, 0) // MIB),
            num_gpu=gpus, gpu_milli=1000 if gpus > 0 else 0, gpu_models=_models(spec, self.model_label),
            qos=qos_class(spec), declared_runtime=runtime.total_seconds() if runtime is not None else None,
            phase=view.phase, node=view.node_name, gated=view.gated, created_at=view.created.timestamp(),
            bound_at=_bound_stamp(status) if view.node_name else None,
            ended_at=_ended_stamp(status) if view.phase in TERMINAL else None,
        )


@dataclass(frozen=True)
class NodeSeen:
    """What a recording keeps of a node: its row, unhashed, and whether it is a control-plane node (labelled so:
    not recorded, tenants' pods do not go there)."""

    row: NodeRow
    control_plane: bool


@dataclass(frozen=True)
class NodeReader:
    """A node object -> its NodeRow, unhashed (the recording hashes names when it writes them): cpu in millicores and
    memory in MiB (rounded down) of its allocatable, GPUs of `gpu_resource`, the model of the label `model_label`
    ("" without GPUs). Raises ViewError for an object it cannot read."""

    gpu_resource: str = keys.GPU_RESOURCE
    model_label: str = keys.GPU_MODEL_LABEL

    def __call__(self, obj: Mapping[str, Any]) -> NodeSeen:
        view = NodeView.from_obj(obj)
        gpus = view.allocatable.get(self.gpu_resource, 0)
        return NodeSeen(NodeRow(sn=view.name, cpu_milli=view.allocatable.get(CPU, 0),
                                memory_mib=view.allocatable.get(MEMORY, 0) // MIB, gpu=gpus,
                                model=view.labels.get(self.model_label, "") if gpus > 0 else ""),
                        view.control_plane)


def moment(stamp: float | None, observed: float | None) -> float | None:
    """A change's time: the API server's `stamp` (to the second), refined to `observed`, the moment the recorder saw
    it, when that falls within the stamp's second; the observed moment alone when there is no stamp."""
    if stamp is None:
        return observed
    if observed is not None and stamp <= observed < stamp + 1:
        return observed
    return stamp


# --- the recording ---

@dataclass
class OpenPod:
    """A pod seen and not yet written: its last view and the times the recorder settled (seconds since the epoch)."""

    seen: PodSeen
    created: float
    bound: float | None = None
    ungated: float | None = None
    ever_gated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"seen": self.seen.to_json(), "created": self.created, "bound": self.bound, "ungated": self.ungated,
                "ever_gated": self.ever_gated}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OpenPod:
        return cls(PodSeen.from_json(data["seen"]), float(data["created"]), _optional(data.get("bound")),
                   _optional(data.get("ungated")), bool(data.get("ever_gated")))


def _optional(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Options:
    """The flags that shape the rows: a recording resumes only with the same ones."""

    anonymize: bool = False
    gpu_resource: str = keys.GPU_RESOURCE
    gpu_model_label: str = keys.GPU_MODEL_LABEL

    def flags(self) -> str:
        anonymize = " --anonymize" if self.anonymize else ""
        return f"--gpu-resource {self.gpu_resource} --gpu-model-label {self.gpu_model_label}{anonymize}"


@dataclass
class Recording:
    """A recording's bookkeeping: its origin, the pods open and the uids written, the nodes seen. The recorder feeds it
    what its watches show (`pod_changed`, `pod_deleted`, `node_seen`) with the moment it saw it, writes the rows it
    returns (appended and synced), then calls `written` for each; `state_json` is what it saves."""

    origin: float
    options: Options
    anonymizer: Anonymizer
    open: dict[str, OpenPod] = field(default_factory=dict)  # by uid
    # the uids of the rows pods.csv holds, as written there (`written_form`: hashed under --anonymize)
    written_uids: set[str] = field(default_factory=set)
    nodes: dict[str, NodeRow] = field(default_factory=dict)  # by the sn written
    seen_until: float | None = None
    finished: bool = False
    pods_seen: int = 0  # distinct pods in the recording, every run's
    # the uid of each row made and not yet appended (its pod is on its way out), by its uid as written (`written` is
    # told the written one)
    made: dict[str, str] = field(default_factory=dict)

    # --- state ---

    def state_json(self) -> str:
        return json.dumps({"version": STATE_VERSION, "origin": self.origin, "options": asdict(self.options),
                           "seen_until": self.seen_until, "finished": self.finished,
                           "open": {uid: pod.to_json() for uid, pod in sorted(self.open.items())}},
                          separators=(",", ":"))

    @classmethod
    def from_state(cls, text: str, where: str, options: Options, key: bytes | None) -> Recording:
        """The recording a state file holds; RecordingError naming `where` when it is not one, or was made with
        other flags than `options`."""
        try:
            data = json.loads(text)
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {STATE_VERSION}")
            saved = Options(**data["options"])
            recording = cls(origin=float(data["origin"]), options=saved, anonymizer=Anonymizer(key),
                            open={uid: OpenPod.from_json(pod) for uid, pod in data["open"].items()},
                            seen_until=_optional(data.get("seen_until")), finished=bool(data.get("finished")))
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise RecordingError(f"{where}: not a recording state this version can resume ({err}); give another "
                                 f"--out, or move the directory's files away to start afresh") from None
        if saved != options:
            raise RecordingError(f"{where}: this recording was made with {saved.flags()}; resume it with the same "
                                 f"flags, or give another --out for a new recording")
        return recording

    # --- pods ---

    def ending(self, uid: str) -> bool:
        """Whether the pod of `uid` has its row made and not yet appended."""
        return self.written_form(uid) in self.made

    def written_form(self, uid: str) -> str:
        """A uid as pods.csv's uid column has it (hashed under --anonymize): what written_uids holds."""
        return self.anonymizer.name("uid", uid)

    def pod_changed(self, pod: PodSeen, now: float) -> list[list[str]]:
        """A pod's view as a watch or list showed it at `now`: tracked, and its row when it has ended (Succeeded or
        Failed). A pod already written, or whose row is on its way, is ignored."""
        written = self.written_form(pod.uid)
        if written in self.made or written in self.written_uids:  # its row on its way, or written
            return []
        tracked = self.open.get(pod.uid)
        if tracked is None:
            self.pods_seen += 1
            created = moment(pod.created_at, now)
            assert created is not None
            tracked = self.open[pod.uid] = OpenPod(pod, created)
        tracked.seen = pod
        if pod.gated:
            tracked.ever_gated = True
        elif tracked.ever_gated and tracked.ungated is None:
            tracked.ungated = now
        if pod.node and tracked.bound is None:
            tracked.bound = moment(pod.bound_at, now)
        if pod.phase in TERMINAL:
            return [self.row(tracked, end=moment(pod.ended_at, now), how=pod.phase)]
        return []

    def pod_deleted(self, pod: PodSeen, now: float) -> list[list[str]]:
        """A pod the watch showed deleted at `now` (not seen finished first): its row, ended then."""
        written = self.written_form(pod.uid)
        if written in self.written_uids:
            self.written_uids.discard(written)  # deleted: it cannot show up again, so the recorder need not hold it
            return []
        if self.ending(pod.uid):
            return []
        if pod.uid not in self.open:
            self.pod_changed(pod, now)
        return [self.row(self.open[pod.uid], end=now, how="Deleted")]

    def pod_vanished(self, pod: PodSeen, now: float, known_until: float) -> list[list[str]]:
        """A pod a relist no longer shows (its watch broke, or the API server was out of reach, and it was deleted
        meanwhile): ended at some moment between `known_until` (the last word from the watch) and `now`, written
        as Vanished with both bounds, as after a restart."""
        written = self.written_form(pod.uid)
        if written in self.written_uids:
            self.written_uids.discard(written)
            return []
        if self.ending(pod.uid):
            return []
        if pod.uid not in self.open:
            self.pod_changed(pod, now)
        return [self.row(self.open[pod.uid], end=now, how="Vanished", end_after=min(known_until, now))]

    def resume(self, present: Iterable[str], now: float) -> list[list[str]]:
        """After the first list of a resumed run: the pods of the state pods.csv already holds are dropped (a crash
        after their row was appended, before the state was saved); the rows of the pods the list no longer shows
        (they vanished while the recorder was down: module docstring)."""
        for uid in [uid for uid in self.open if self.written_form(uid) in self.written_uids]:
            del self.open[uid]
        here = set(present)
        # only a pod still listed can show up again: the rest of pods.csv is history
        self.written_uids &= {self.written_form(uid) for uid in here}
        return [self.row(pod, end=now, how="Vanished", end_after=self.seen_until)
                for uid, pod in sorted(self.open.items()) if uid not in here and not self.ending(uid)]

    def finish(self) -> list[list[str]]:
        """The end of the recording: the rows of the pods still pending or running (no deletion time, no `end`)."""
        self.finished = True
        return [self.row(pod, end=None, how="") for uid, pod in sorted(self.open.items()) if not self.ending(uid)]

    def written(self, written_uid: str) -> None:
        """The row whose uid column is `written_uid` (as `row` made it) is appended and synced: its pod leaves the
        open pods for good."""
        uid = self.made.pop(written_uid, written_uid)
        self.written_uids.add(written_uid)
        self.open.pop(uid, None)

    def row(self, pod: OpenPod, *, end: float | None, how: str, end_after: float | None = None) -> list[str]:
        """The CSV fields (RECORD_COLUMNS) of a pod ending at `end` (None: not ended), `how` it ended; the pod counts
        as on its way out (`ending`) until `written`."""
        self.made[self.written_form(pod.seen.uid)] = pod.seen.uid
        seen, name = pod.seen, self.anonymizer.name
        phase = "Unknown" if how == "Vanished" else how if how in TERMINAL else seen.phase
        anonymous = self.anonymizer.key is not None
        carried = {row.model for row in self.nodes.values()} if anonymous else set()
        models = "|".join(m if m in carried else name("model", m) if anonymous else m
                          for m in (escape(m, special="|") for m in seen.gpu_models))
        owner_kind = ("Other" if anonymous and seen.owner_kind and seen.owner_kind not in KNOWN_OWNER_KINDS
                      else escape(seen.owner_kind))
        openb = PodRow(name=name("pod", seen.name), cpu_milli=seen.cpu_milli, memory_mib=seen.memory_mib,
                       num_gpu=seen.num_gpu, gpu_milli=seen.gpu_milli, gpu_spec=models, qos=escape(seen.qos),
                       pod_phase=escape(phase), creation_time=self.since(pod.created),
                       deletion_time=self.since(end), scheduled_time=self.since(pod.bound))
        extra = [self.written_form(seen.uid), name("ns", seen.namespace), owner_kind,
                 format_time(seen.declared_runtime), name("node", seen.node) if seen.node else "",
                 "yes" if pod.ever_gated else "", format_time(self.since(pod.ungated)), how,
                 format_time(self.since(end_after))]
        return [str(v) for v in pod_fields(openb)] + extra

    def since(self, value: float | None) -> Any:
        """Seconds since the origin, to the millisecond."""
        return None if value is None else round(value - self.origin, TIME_DECIMALS)

    # --- nodes ---

    def node_seen(self, seen: NodeSeen) -> bool:
        """A node as a watch showed it: kept under its written name (a control-plane node is not); whether the node
        list changed. A node once seen stays in the list (it held pods of the recording)."""
        if seen.control_plane:
            return False
        node = seen.row
        row = NodeRow(self.anonymizer.name("node", node.sn), node.cpu_milli, node.memory_mib, node.gpu,
                      escape(node.model, special="|"))
        if self.nodes.get(row.sn) == row:
            return False
        self.nodes[row.sn] = row
        return True

    def node_rows(self) -> list[list[str]]:
        return [[str(v) for v in node_fields(row)] for _, row in sorted(self.nodes.items())]


# --- the files ---

def read_written_uids(path: Path) -> set[str]:
    """The uids of the rows pods.csv holds. A last line without its line end (a crash while it was appended) is cut
    off first: its pod is still among the state's open pods and is written again whole."""
    if not path.exists():
        return set()
    with path.open("rb+") as handle:
        data = handle.read()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            handle.truncate(cut)
            data = data[:cut]
    try:
        reader = csv.DictReader(io.StringIO(data.decode("utf-8")))
        if reader.fieldnames is not None and list(reader.fieldnames) != list(RECORD_COLUMNS):
            # rows appended under another header would land in the wrong columns, silently
            raise RecordingError(f"{path}: its columns {','.join(reader.fieldnames)[:300]!r} are not the ones "
                                 f"`reservoir record` writes ({','.join(RECORD_COLUMNS)}): restore the file as it "
                                 f"wrote it, or give another --out")
        return {row["uid"] for row in reader if row.get("uid")}
    except (csv.Error, UnicodeDecodeError) as err:
        raise RecordingError(f"{path}: unreadable as CSV ({err}): not as `reservoir record` wrote it; give another "
                             f"--out") from None


def header_line(columns: Sequence[str]) -> str:
    return ",".join(columns) + "\n"


def duration_left(origin: float, duration: float, now: float) -> float:
    """Seconds until the recording's end (origin + duration); 0 when it is past, inf for no end."""
    return max(0.0, origin + duration - now) if math.isfinite(duration) else math.inf
