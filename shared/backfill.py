"""Backfill's rules shared by the webhook and the agent (issue 17; the planning is agent/planner/backfill.py).

Who is held for backfill (`hold_refusal`): a pod that opts in (`reservoir.sh/backfill: "true"` on it or its
PodGroup), of a namespace or queue the config's `backfill` switch covers, that declares a maximum runtime (its own
`volcano.sh/maximum-runtime` or its PodGroup's). The webhook gates such a pod at CREATE; the planner asks again of
every gated pod (anyone may write a gate on their pod), and lifts the gate unchanged from one it refuses.

Grants: the agent's record, on a locked node, of the pods it let backfill that node.
Written by the agent only, as the node annotation keys.BACKFILL_GRANTS, before it lifts a pod's gate with the lock's
toleration; JSON `{pod uid: {"pod": "namespace/name", "owner": lock owner id, "until": RFC 3339}}`. Tenants cannot
write nodes, and a pod's uid is the API server's, so a grant names one pod that exists and nothing on the pod can
forge one: the entitlement check (shared.entitlement) accepts the lock's toleration on that pod, pinned to that node,
because of this record. The agent drops a grant once its pod is gone or finished.

Room (issue 30): the agent's note, on each locked node backfill could use now, of what a backfilled pod could still
take there and by when it must have ended: the node annotation keys.BACKFILL_ROOM, JSON `{"room": ResourceList,
"until": RFC 3339}` (the slot's room after the owner's tasks that fit now and the pods granted there; its needed-by
time less the margin). The webhook gates a pod that opts in only when some locked node's room takes it in time
(`room_for`): where nothing is locked, or no lock has room for it, the pod's wait is kube-scheduler's alone. The
agent rewrites the note when it changes and removes it when the node's slot goes; the webhook reads it only on a
node that carries a lock.

Read total over any text (a hand edit must not stop the agent or the webhook): what is not JSON, not an object, or an
entry of the wrong shape is skipped, never an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared import keys
from shared.config import BackfillConfig
from shared.duration import DurationError, parse_duration
from shared.predicates import DEFAULT_SCHEDULER, NODE_NAME_FIELD
from shared.resources import Resources
from shared.timestamps import in_range, parse_time, stamp


@dataclass(frozen=True, slots=True)
class Grant:
    """One pod let onto one locked node: its uid and "namespace/name", the lock's owner id, and the moment by which
    it must have ended (its deadline, with the margin)."""

    uid: str
    pod: str
    owner: str
    until: datetime

    def entry(self) -> dict[str, str]:
        return {"pod": self.pod, "owner": self.owner, "until": stamp(self.until)}


def read_grants(text: str | None) -> dict[str, Grant]:
    """The grants an annotation holds, by pod uid; {} when absent or unreadable."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    grants = {}
    for uid, entry in data.items():
        if not isinstance(entry, dict):
            continue
        pod, owner = entry.get("pod"), entry.get("owner")
        try:
            until = parse_time(entry.get("until")) if isinstance(entry.get("until"), str) else None
        except ValueError:
            until = None
        # a hand-edited `until` far out must not overflow the arithmetic of every plan
        if uid and isinstance(pod, str) and isinstance(owner, str) and until is not None and in_range(until):
            grants[uid] = Grant(uid, pod, owner, until)
    return grants


def grants_text(grants: Iterable[Grant]) -> str | None:
    """The annotation's value for these grants (sorted by uid, compact), None when there are none (the annotation
    is removed)."""
    entries = {g.uid: g.entry() for g in sorted(grants, key=lambda g: g.uid)}
    return json.dumps(entries, sort_keys=True, separators=(",", ":")) if entries else None


def keep_unseen_grants(planned: str | None, current: str | None, seen: Set[str]) -> str | None:
    """The grants text to write on a node: the plan's (`planned`), plus each grant the node carries now (`current`,
    read just before the patch) whose uid the plan did not see (`seen`: the uids on the node in the plan's snapshot).
    Such a grant was written after the snapshot was taken (the agent's own previous reconcile, not yet in its cache):
    the plan cannot have meant to drop it, and dropping it would take the slot's room out of the next plan's count
    while its pod is let onto the node. The next plan, which sees it, keeps or drops it by its pod."""
    extra = {uid: g for uid, g in read_grants(current).items() if uid not in seen}
    if not extra:
        return planned
    return grants_text({**extra, **read_grants(planned)}.values())


def pinned_to(spec: Mapping[str, Any], node: str) -> bool:
    """The pod can be placed on `node` only: its required node affinity has terms, each with a matchFields
    `metadata.name In [node]` (what the agent's narrowing adds, agent.writer.narrow_patch), and its nodeName is empty
    or that node."""
    if spec.get("nodeName") not in (None, "", node):
        return False
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(
        node_affinity, Mapping) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not isinstance(terms, list) or not terms:
        return False
    return all(isinstance(term, Mapping) and isinstance(term.get("matchFields"), list) and any(
        isinstance(r, Mapping) and r.get("key") == NODE_NAME_FIELD and r.get("operator") == "In"
        and r.get("values") == [node] for r in term["matchFields"]) for term in terms)


@dataclass(frozen=True, slots=True)
class Room:
    """One locked node's backfill room (module docstring, "Room"): what a pod may take there, and by when it must
    have ended."""

    room: Resources
    until: datetime

    def text(self) -> str:
        return json.dumps({"room": self.room.to_quantities(), "until": stamp(self.until)}, sort_keys=True,
                          separators=(",", ":"))

    def takes(self, requests: Mapping[str, int], runtime: timedelta, now: datetime) -> bool:
        """A pod of these `requests` running `runtime` from `now` fits the room in time (the agent's own rule,
        agent/planner/backfill.py, decides for real: this one only says whether holding the pod could lead to
        anything)."""
        return now + runtime <= self.until and self.room.covers(
            {name: amount for name, amount in requests.items() if name != "pods"})


def read_room(text: str | None) -> Room | None:
    """The room an annotation holds; None when absent or unreadable (the webhook then holds no pod for that node)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("until"), str):
            return None
        until = parse_time(data["until"])
        room = Resources.parse(data.get("room")) if isinstance(data.get("room"), dict) else None
    except (ValueError, TypeError, RecursionError):
        return None
    return Room(room, until) if room is not None and until is not None and in_range(until) else None


def runtime_of(annotations: Mapping[str, str]) -> timedelta | None:
    """`volcano.sh/maximum-runtime` of one object's annotations; None when absent, unreadable or not positive (the
    webhook rejects such values, but a pod admitted while it was down, or labelled reservoir.sh/ignore, still
    carries them: "-1h" would read as a pod that ended an hour before it started)."""
    text = annotations.get(keys.MAXIMUM_RUNTIME)
    if not text:
        return None
    try:
        runtime = parse_duration(text)
    except ValueError:  # DurationError: malformed, or beyond Go's 2^63-1 ns
        return None
    return runtime if runtime > timedelta(0) else None


def declared_runtime(annotations: Mapping[str, str], podgroup_annotations: Mapping[str, str]) -> timedelta | None:
    """The pod's `volcano.sh/maximum-runtime`, else its PodGroup's (as the planner reads them:
    agent/planner/reserve.maximum_runtime); None when neither is a positive duration."""
    return runtime_of(annotations) or runtime_of(podgroup_annotations)


def opts_in(annotations: Mapping[str, str], podgroup_annotations: Mapping[str, str]) -> bool:
    """The pod opts into backfill: keys.BACKFILL "true" on it or on its PodGroup."""
    return "true" in (annotations.get(keys.BACKFILL), podgroup_annotations.get(keys.BACKFILL))


def hold_refusal(annotations: Mapping[str, str], podgroup_annotations: Mapping[str, str], *, namespace: str,
                 queue: str | None, config: BackfillConfig, scheduler: str = DEFAULT_SCHEDULER) -> str | None:
    """Why the pod is not one backfill may hold (module docstring); "" when it does not opt in (nothing to say),
    None when it is. `scheduler`: its spec.schedulerName. A pod another scheduler places is not held: the room is
    reckoned by kube-scheduler's filters, and a pod that names a scheduler nobody runs would never bind and would
    keep its grant, and the room it holds, while it exists."""
    if not opts_in(annotations, podgroup_annotations):
        return ""
    if scheduler != DEFAULT_SCHEDULER:
        return (f"{keys.BACKFILL} is ignored: the pod is scheduled by {scheduler[:63]!r}, not {DEFAULT_SCHEDULER}, "
                "and backfill lets onto locked nodes only pods kube-scheduler places")
    if not config.covers(namespace, queue):
        return (f"{keys.BACKFILL} is ignored: the config's backfill.namespaces and backfill.queues cover neither "
                f"namespace {namespace} nor " + (f"queue {queue}" if queue is not None else
                                                 "its queue (whose Queue does not admit the namespace)"))
    text = annotations.get(keys.MAXIMUM_RUNTIME) or podgroup_annotations.get(keys.MAXIMUM_RUNTIME)
    if not text:
        return (f"{keys.BACKFILL} is ignored: the pod declares no {keys.MAXIMUM_RUNTIME} (nor does its PodGroup), "
                "and backfill lets only pods that say when they end onto locked nodes")
    try:
        runtime = parse_duration(text)
    except DurationError as err:
        return f"{keys.BACKFILL} is ignored: {keys.MAXIMUM_RUNTIME} {text[:40]!r} is not a duration ({err})"
    if runtime.total_seconds() <= 0:
        return f"{keys.BACKFILL} is ignored: {keys.MAXIMUM_RUNTIME} {text[:40]!r} is not positive"
    return None
