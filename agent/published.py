"""What the agent publishes for `reservoir status` (issue 14): the last plan's decisions, in one ConfigMap.

`reservoir status` used to list every pod and re-plan on the client: at 30,000 pods that is the whole cluster read
by every operator who asks. Instead the leading agent writes what it decided into the ConfigMap
`keys.STATUS_CONFIGMAP` (in its `--namespace`, beside `reservoir-config`), key `keys.STATUS_KEY`, as JSON:

    format        1 (this shape)
    agent         the leading agent's identity (its leader-election identity)
    planned       RFC 3339 time of the plan published (refreshed at least every resync period)
    dryRun        the plan was made with dryRun
    config        what the CLI needs to read the rest: resyncPeriod, starvation {enabled, starvingJobTimeThreshold,
                  maxLockDuration}, queueOrder {priorityWeight, drfWeight, proportionWeight, ordering,
                  queueScoreOrderEnable} (durations as Go durations)
    jobs          [{subject, owner, queue, priority, minMember, bound, pending, starving, starvingSince, reason,
                    nodes, notes}] every job with a pending pod the starvation policy judged: with a lock first, then
                  starving, then the rest; nodes: the nodes the plan locks for it; notes: the planner's decision
                  lines about it
    windows       [{name, active, start, end, reason}]
    guarantees    [{queue, policy, nodes, resource, reason, warning}]
    reservations  [{name, phase, node, reason, message, owners}]   owners: ["namespace/name"]
    handovers     [{pod, reservation, node, reason}]   gated Reservation owners the plan hands over or lets go
    estimates     [{owner, kind, subject, start, unknown, nodes, backfilled}] issue 17: every owner waiting on its
                  locks, its expected start (RFC 3339; null with `unknown` the reason) and how many pods backfill its
                  nodes (agent/planner/backfill.start_estimates)
    queues        the QueueScoreOrder scores when queues competed (as `status --queues -o json` prints them)
    notes         the planner's decision lines not about one job
    skipped       [{kind, name, error}] objects the agent's caches cannot read
    omitted       {section: entries left out} when the document was cut to MAX_BYTES (empty when not)

Only the plan is published; locks are read from the nodes, where they are written. The document is written when its
content (everything but `planned`) changed, and otherwise once every resync period, so its age says whether an agent
is alive and leading. It is bounded (`bounded`): a cluster with thousands of pending jobs cuts the least telling
entries (notes first, then jobs without a lock that are not starving, ...) and counts them in `omitted`. The write
goes through the Writer, fenced like every other write: only the replica holding a fresh Lease publishes.

Tenants: the ConfigMap lives in Reservoir's namespace, which no tenant role reaches (deploy/tenant-rbac.yaml); it
names every job with a pending pod, so it is for operators (deploy/status-rbac.yaml).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from agent.planner.model import JobStatus, Plan, QueueScore
from shared import keys
from shared.config import ReservoirConfig
from shared.duration import format_duration, parse_duration
from shared.logs import fields, note_fields
from shared.timestamps import parse_time, stamp
from shared.watchcache import Skipped

if TYPE_CHECKING:
    from agent.writer import Writer

log = logging.getLogger("reservoir.agent")

FORMAT = 1
MAX_BYTES = 512 * 1024  # the document's JSON; a ConfigMap holds at most 1 MiB
# sections cut when the document is too large, least telling first; each is cut from its end (jobs are sorted so that
# the jobs without a lock that are not starving are at the end). The sections tenants can grow (their pods' jobs and
# handovers, objects the caches skip) go before the ones only operators write (Queues, Reservations, the config's
# guarantees and windows), so no number of tenant objects pushes those out.
CUT_ORDER = ("notes", "handovers", "jobs", "estimates", "skipped", "queues", "reservations", "guarantees", "windows")
# a string a tenant chose (a job named by a pod's group-name annotation or ownerReference, a reason quoting it) is
# cut to this many characters, and a job carries at most MAX_JOB_NOTES notes: one pod cannot fill the document
MAX_TEXT = 256
MAX_JOB_NOTES = 8


def queue_document(scores: Sequence[QueueScore]) -> list[dict[str, Any]]:
    """`reservoir status --queues -o json|yaml`: one entry per queue, best first (docs/tasks/command-line.md)."""
    return [{"name": s.name, "priority": s.priority, "score": s.total, "priorityScore": s.priority_score,
             "drfShare": s.drf_share, "drfScore": s.drf_score, "proportionShare": s.proportion_share,
             "proportionScore": s.proportion_score, "allocated": s.allocated.to_quantities(),
             "deserved": s.deserved.to_quantities()} for s in scores]


def clip(text: Any, limit: int = MAX_TEXT) -> Any:
    """A string cut to `limit` characters (the cut marked with an ellipsis); anything else as it is."""
    return text[:limit - 1] + "\u2026" if isinstance(text, str) and len(text) > limit else text


def _job_entry(job: JobStatus, nodes: Sequence[str], notes: Sequence[str], threshold: Any) -> dict[str, Any]:
    if job.threshold is not None:
        threshold = min(threshold, job.threshold)
    since = job.created + threshold if job.starving and job.created is not None else None
    return {"subject": clip(job.subject), "owner": clip(job.owner), "queue": clip(job.queue),
            "priority": job.priority, "minMember": job.min_member, "bound": job.bound, "pending": job.pending,
            "starving": job.starving, "starvingSince": stamp(since) if since is not None else None,
            "reason": clip(job.reason), "nodes": sorted(nodes), "notes": [clip(n) for n in notes[:MAX_JOB_NOTES]]}


def published_document(result: Plan, *, agent: str, planned: datetime, config: ReservoirConfig,
                       skipped: Sequence[Skipped] = ()) -> dict[str, Any]:
    """The document for one plan (module docstring): a pure function of the plan, the config it was made with, and
    the objects the caches skip."""
    starvation, order = config.starvation, config.queue_order
    by_owner: dict[str, list[str]] = {}
    for lock in result.locks.values():
        by_owner.setdefault(lock.owner, []).append(lock.node)
    subjects = {job.subject for job in result.jobs}
    job_notes: dict[str, list[str]] = {}
    other_notes: list[str] = []
    for note in result.notes:
        parsed = note_fields(note)
        subject = str(parsed.get("job", "")) if parsed is not None else ""
        if subject in subjects:
            job_notes.setdefault(subject, []).append(note)
        else:
            other_notes.append(note)
    jobs = jobs_in_turns(result.jobs, by_owner)
    return {
        "format": FORMAT,
        "agent": agent,
        "planned": stamp(planned),
        "dryRun": config.dry_run,
        "config": {
            "resyncPeriod": format_duration(config.resync_period),
            "starvation": {"enabled": starvation.enabled,
                           "starvingJobTimeThreshold": format_duration(starvation.starving_job_time_threshold),
                           "maxLockDuration": format_duration(starvation.max_lock_duration)},
            "queueOrder": {"priorityWeight": order.priority_weight, "drfWeight": order.drf_weight,
                           "proportionWeight": order.proportion_weight, "ordering": order.ordering,
                           "queueScoreOrderEnable": order.queue_score_order_enable},
        },
        "jobs": [_job_entry(j, by_owner.get(j.owner, ()), job_notes.get(j.subject, ()),
                            starvation.starving_job_time_threshold) for j in jobs],
        "windows": [{"name": w.name, "active": w.active, "start": stamp(w.start), "end": stamp(w.end),
                     "reason": w.reason} for w in result.windows],
        "guarantees": [{"queue": g.queue, "policy": g.policy, "nodes": list(g.nodes),
                        "resource": g.resource.to_quantities(), "reason": g.reason, "warning": g.warning}
                       for g in result.guarantees],
        "reservations": [{"name": r.name, "phase": r.phase, "node": r.node or None, "reason": r.reason,
                          "message": clip(r.message), "owners": [p.key for p in r.owners]}
                         for r in result.reservations],
        "handovers": [{"pod": h.key, "reservation": h.reservation or None, "node": h.node or None,
                       "reason": clip(h.reason)} for h in result.handovers],
        "estimates": [{"owner": clip(e.owner), "kind": e.kind.value, "subject": clip(e.subject),
                       "start": stamp(e.at) if e.at is not None else None, "unknown": clip(e.unknown) or None,
                       "nodes": list(e.nodes), "backfilled": e.backfilled} for e in result.backfill.estimates],
        "queues": queue_document(result.queues),
        "notes": [clip(n) for n in other_notes],
        "skipped": [{"kind": s.kind, "name": clip(s.name), "error": clip(s.error)} for s in skipped],
        "omitted": {},
    }


def jobs_in_turns(jobs: Sequence[JobStatus], by_owner: Mapping[str, Any]) -> list[JobStatus]:
    """The jobs in the order `bounded` cuts them from the end: locked ones first, then starving ones, then the rest;
    within each, in turns across namespaces (every namespace's first job by subject, then every namespace's second,
    ...), so a document cut to its size keeps a share of each team's jobs and one namespace's flood of starving jobs
    pushes no other team's out of `reservoir status`."""
    turn: dict[tuple[bool, bool, str], int] = {}
    keyed = []
    for job in sorted(jobs, key=lambda j: (j.owner not in by_owner, not j.starving, j.subject)):
        kind = (job.owner not in by_owner, not job.starving, job.subject.split("/", 1)[0])
        turn[kind] = turn.get(kind, -1) + 1
        keyed.append(((kind[0], kind[1], turn[kind], job.subject), job))
    return [job for _, job in sorted(keyed, key=lambda pair: pair[0])]


def _size(document: Mapping[str, Any]) -> int:
    return len(render(document).encode())


def render(document: Mapping[str, Any]) -> str:
    """The document as stored: compact JSON, keys in document order."""
    return json.dumps(document, separators=(",", ":"))


def bounded(document: Mapping[str, Any], limit: int = MAX_BYTES) -> dict[str, Any]:
    """The document cut to at most `limit` bytes of JSON: sections in CUT_ORDER are cut from their end, each only as
    far as needed (the longest prefix that fits), and what was left out is counted in `omitted`
    ({section: entries}). A document that fits is returned as it is."""
    out = dict(document)
    out["omitted"] = dict(document.get("omitted") or {})
    if _size(out) <= limit:
        return out
    for section in CUT_ORDER:
        entries = list(out.get(section) or [])
        if not entries:
            continue
        out[section], out["omitted"][section] = [], len(entries)  # the count's own digits are counted in the size
        if _size(out) > limit:
            continue  # even without it, too large: on to the next section
        def fits(count: int, section: str = section, entries: list[Any] = entries) -> bool:
            out[section], out["omitted"][section] = entries[:count], len(entries) - count
            return _size(out) <= limit

        # the longest prefix that fits: galloping up from the start (so no try renders much more than twice the
        # limit, however long the section), then bisecting between the last prefix that fit and the first that did not
        low, step = 0, 1
        while low + step <= len(entries) and fits(low + step):
            low, step = low + step, step * 2
        high = min(low + step, len(entries) + 1) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if fits(middle):
                low = middle
            else:
                high = middle - 1
        out[section] = entries[:low]
        out["omitted"][section] = len(entries) - low
        if not out["omitted"][section]:
            del out["omitted"][section]
        return out
    return out  # still too large with every section empty (only the config and names): written as it is


def content_key(document: Mapping[str, Any]) -> str:
    """What a change of the document is judged by: everything but the time it was planned."""
    return render({k: v for k, v in document.items() if k != "planned"})


class Publisher:
    """Writes the published document through the agent's Writer (fenced): when its content changed, else when the
    last write is older than the `heartbeat` (the resync period, so `planned` stays within about one resync of now
    while the agent leads). A failed write is logged and tried again at the next plan; it never fails the
    reconcile."""

    def __init__(self, writer: Writer, namespace: str, clock: Callable[[], float] = time.monotonic,
                 limit: int = MAX_BYTES) -> None:
        self.writer = writer
        self.namespace = namespace
        self.clock = clock
        self.limit = limit
        self.written: str | None = None  # content_key of the last document written
        self.written_at: float | None = None

    def due(self, document: Mapping[str, Any], heartbeat: float) -> bool:
        if self.written != content_key(document) or self.written_at is None:
            return True
        return self.clock() - self.written_at >= heartbeat

    async def publish(self, result: Plan, *, agent: str, planned: datetime, config: ReservoirConfig,
                      skipped: Sequence[Skipped] = ()) -> bool:
        """Write the plan's document when due; True when it was written."""
        document = bounded(published_document(result, agent=agent, planned=planned, config=config,
                                              skipped=skipped), self.limit)
        # half the resync period: the loop plans at least once per resync period, so each resync's plan writes
        if not self.due(document, config.resync_period.total_seconds() / 2):
            return False
        if document["omitted"]:
            log.warning("status cut to fit", extra=fields(
                configmap=f"{self.namespace}/{keys.STATUS_CONFIGMAP}", limit=self.limit,
                omitted=",".join(f"{k}={v}" for k, v in sorted(document["omitted"].items()))))
        try:
            written = await self.writer.put_configmap(self.namespace, keys.STATUS_CONFIGMAP,
                                                      {keys.STATUS_KEY: render(document)})
        except Exception as err:  # publishing is for operators: never let it stop the agent
            log.warning("status not published", extra=fields(
                configmap=f"{self.namespace}/{keys.STATUS_CONFIGMAP}", error=repr(err)[:300]))
            return False
        if written:
            self.written, self.written_at = content_key(document), self.clock()
        return written


# --- reading it back (the CLI) ---

STALE_RESYNCS = 3  # a plan older than this many resync periods is reported as stale


def start_text(estimate: Mapping[str, Any] | None) -> str | None:
    """An owner's expected start as the CLI shows it (an `estimates` entry, issue 17): the time, the reason it is
    unknown, or None without an entry (the owner does not wait on a lock)."""
    if not estimate:
        return None
    return str(estimate.get("start") or estimate.get("unknown") or "unknown")


class StatusError(Exception):
    """`reservoir status` cannot answer: the message says why and what to do (printed as the one error line)."""


class PublishedError(StatusError, ValueError):
    """The published document cannot be read."""


def parse_published(text: str | None, where: str) -> dict[str, Any] | None:
    """The document stored in the ConfigMap's `keys.STATUS_KEY` (None when the key is absent); PublishedError naming
    `where` when it is not a JSON object of this FORMAT."""
    if text is None:
        return None
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise PublishedError(f"{where} key {keys.STATUS_KEY} is not JSON ({str(err)[:120]}); the agent rewrites it "
                             f"at its next plan, or delete the ConfigMap") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise PublishedError(f"{where} key {keys.STATUS_KEY} is not a status document of format {FORMAT} (found "
                             f"{found!r}): is the agent the same version as this command?")
    return document


def freshness(published: Mapping[str, Any] | None, now: datetime, where: str) -> dict[str, Any]:
    """How old the published plan is: `{agent, planned, age, warning}` (age a Go duration; warning null unless there
    is no plan, or it is older than STALE_RESYNCS resync periods, or unreadable times)."""
    if published is None:
        return {"agent": None, "planned": None, "age": None,
                "warning": f"the agent has published nothing in ConfigMap {where}; is it running?"}
    agent, planned_text = str(published.get("agent") or ""), published.get("planned")
    try:
        planned = parse_time(planned_text) if isinstance(planned_text, str) else None
        resync = parse_duration(str((published.get("config") or {}).get("resyncPeriod") or "30s"))
    except ValueError:
        planned, resync = None, None
    if planned is None or resync is None or planned.tzinfo is None:
        return {"agent": agent or None, "planned": planned_text, "age": None,
                "warning": f"ConfigMap {where}: unreadable plan time or resync period"}
    age = now - planned
    limit = resync * STALE_RESYNCS
    warning = (f"the published plan is {format_duration(age)} old, more than {STALE_RESYNCS} resync periods "
               f"({format_duration(limit)}): is the agent running and leading?") if age > limit else None
    return {"agent": agent or None, "planned": stamp(planned), "age": format_duration(max(age, timedelta(0))),
            "warning": warning}
