"""The webhook's HTTPS server: admission routes, health, readiness, metrics, certificate reload.

Limits (issue 10), each a module constant: a body over 3 MiB is refused 413 (declared or counted as it comes,
chunked too); idle keep-alive and header sizes are bounded (`runner_options`); a malformed request is a 400 with a
one-line reason (`webhook.admission`); and every request is answered within the `?timeout=` the API server sends
(its webhook's timeoutSeconds): bodies over INLINE_BODY and the ConfigMap route run in a worker thread so the loop
stays free to answer at the deadline (`_late`), the rest is answered on the loop, bounded by the checks and parser
bounds that make any one of them cost milliseconds (`make fuzz-webhook` measures the slowest).

Logging (issue 15): a routine admission (admitted as it is, or only mutated by the routine steps: priority inherited,
reserve annotations copied) logs at DEBUG; INFO carries the decisions that change something: a lock toleration
granted, a refusal, a warning. Every admission is counted by its decision in `reservoir_webhook_admissions_total`
(`decision_of`), beside `reservoir_webhook_requests_total` (every request by its HTTP outcome).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from prometheus_client import Counter, Gauge, Histogram

from shared import logs
from shared.duration import DurationError, parse_duration
from shared.metrics import new_registry
from shared.quantity import QuantityError
from shared.serving import add_probes
from shared.tolerations import tolerates_lock
from webhook import admission, mutate, validate
from webhook.admission import BadReview, Request, ReviewResponse
from webhook.lookup import Lookup

log = logging.getLogger("reservoir.webhook")
CERT_CHECK_INTERVAL = 2.0


class Metrics:
    """The webhook's metrics (docs/tasks/metrics.md); the process, platform and build-info ones come with the
    registry (shared.metrics), the caches' freshness is registered by webhook.main."""

    def __init__(self) -> None:
        self.registry = new_registry()
        self.requests = Counter("reservoir_webhook_requests_total", "Admission requests answered",
                                ["route", "outcome"], registry=self.registry)
        self.latency = Histogram("reservoir_webhook_request_duration_seconds", "Time to answer an admission request",
                                 ["route", "outcome"], registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.cache_synced = Gauge("reservoir_webhook_cache_synced", "1 when the watch cache has synced",
                                  ["cache"], registry=self.registry)
        self.admissions = Counter("reservoir_webhook_admissions_total", "Admission requests a route decided, by "
                                  "decision: allowed (as it is), mutated (routine changes), granted (a lock toleration "
                                  "added), warned (admitted with a warning), denied",
                                  ["route", "decision"], registry=self.registry)
        self.cert_reloads = Counter("reservoir_webhook_certificate_reloads_total", "Serving certificate reloads",
                                    registry=self.registry)
        self.cert_expiry = Gauge("reservoir_webhook_certificate_expiry_timestamp_seconds", "Unix time the serving "
                                 "certificate this replica serves stops being valid (its notAfter)",
                                 registry=self.registry)

    def serving(self, cert_pem: bytes) -> None:
        """Record the certificate now served: its notAfter (the first certificate of the chain, the leaf). A chain
        that does not parse here (the TLS library took it) leaves the gauge as it was."""
        try:
            leaf = x509.load_pem_x509_certificate(cert_pem)
        except ValueError as err:
            log.warning("serving certificate expiry unreadable", extra=logs.fields(error=str(err)[:300]))
            return
        self.cert_expiry.set(leaf.not_valid_after_utc.timestamp())


# --- decisions: what each admission did, for its log level and the admissions counter ---

DECISIONS = ("allowed", "mutated", "granted", "warned", "denied")  # reservoir_webhook_admissions_total{decision}


def _added_tolerations(patch: Sequence[Any]) -> list[Mapping[str, Any]]:
    """The tolerations a JSON Patch adds (`/spec/tolerations` as a list, or `/spec/tolerations/-` one by one)."""
    added: list[Mapping[str, Any]] = []
    for op in patch:
        if not isinstance(op, Mapping) or op.get("op") != "add":
            continue
        value = op.get("value")
        if op.get("path") == "/spec/tolerations" and isinstance(value, list):
            added += [t for t in value if isinstance(t, Mapping)]
        elif str(op.get("path", "")).startswith("/spec/tolerations/") and isinstance(value, Mapping):
            added.append(value)
    return added


def granted_locks(patch: Sequence[Any], lookup: Lookup) -> list[str]:
    """The locks held now (on some node) that a pod patch lets the pod through: a lock toleration granted. The
    tolerations of its own job and queue every pod gets whether or not they hold a lock are routine; those of a
    held lock change where it may go now."""
    added = _added_tolerations(patch) if lookup.held_owners else []
    return sorted(owner for owner in lookup.held_owners if added and tolerates_lock(added, owner))


def decision_of(answer: ReviewResponse, lookup: Lookup) -> str:
    """One of DECISIONS for an answer, the most telling first: denied, granted (granted_locks), warned, mutated,
    allowed (as it is)."""
    response = answer["response"]
    if not response["allowed"]:
        return "denied"
    patch = response.get("patch")
    if patch and lookup.held_owners:
        try:
            ops = json.loads(base64.b64decode(patch))
        except (binascii.Error, ValueError):
            ops = []
        if isinstance(ops, list) and granted_locks(ops, lookup):
            return "granted"
    if response.get("warnings"):
        return "warned"
    return "mutated" if patch else "allowed"


def _route_mutate_pod(request: Request, lookup: Lookup) -> ReviewResponse:
    """Seed 001 (priority inheritance), 003 (reservation tolerations and affinity) and 004 (reserve annotations
    copied from the PodGroup, window tolerations for reserve pods): DESIGN section 3, mutating pod CREATE. Logged at
    INFO when it grants the toleration of a lock held now (granted_locks) or warns; else, routine, at DEBUG."""
    if request.operation != "CREATE":
        return admission.response(request.uid)
    result = mutate.mutate_pod(request.obj, request.namespace, lookup, request.username, request.groups)
    granted = granted_locks(result.patch, lookup)
    level = logging.INFO if granted or result.warnings else logging.DEBUG
    if (result.reasons or result.warnings) and log.isEnabledFor(level):
        meta = request.obj.get("metadata") or {}
        extra: dict[str, Any] = {"owner": list(granted)} if granted else {}
        if result.warnings:
            extra["warnings"] = [admission.clip(w, 300) for w in result.warnings]
        logs.decision(log, "mutate", level=level, policy="mutate",
                      pod=f"{request.namespace}/{meta.get('name') or meta.get('generateName', '')}",
                      reason="; ".join(result.reasons), **extra)
    return admission.response(request.uid, patch=result.patch, warnings=result.warnings)


def _route_mutate_podgroup(request: Request, lookup: Lookup) -> ReviewResponse:
    """Seed 001: a PodGroup inherits its queue's PriorityClass."""
    if request.operation != "CREATE":
        return admission.response(request.uid)
    result = mutate.mutate_podgroup(request.obj, request.namespace, lookup)
    return admission.response(request.uid, patch=result.patch)


# A validator: the object, the object before the update (None on CREATE), the read model.
Check = Callable[[Mapping[str, Any], Mapping[str, Any] | None, Lookup], validate.Verdict]
Route = Callable[[Request, Lookup], ReviewResponse]


def _validating(check: Check) -> Route:
    """CREATE and UPDATE judged by `check`; an UPDATE only for what it changes (validate.judge_update, against
    the old object judged the same way); DELETE and CONNECT let through."""
    def route(request: Request, lookup: Lookup) -> ReviewResponse:
        if request.operation not in ("CREATE", "UPDATE"):
            return admission.response(request.uid)
        old = request.old if request.operation == "UPDATE" else None
        verdict = check(request.obj, old, lookup)
        if old is not None and not verdict.allowed:
            verdict = validate.judge_update(verdict, check(old, None, lookup))
        if not verdict.allowed:
            logs.decision(log, "deny", policy="validate", kind=request.kind, name=request.name,
                          reason=admission.clip(verdict.message, 500))
        elif verdict.warnings:
            logs.decision(log, "warn", policy="validate", kind=request.kind, name=request.name,
                          warnings=[admission.clip(w, 300) for w in verdict.warnings])
        return admission.response(request.uid, allowed=verdict.allowed, message=verdict.message,
                                  warnings=verdict.warnings, code=422)
    return route


def _route_pod_locks(request: Request, lookup: Lookup) -> ReviewResponse:
    """DESIGN section 3: the entitlement check of the lock tolerations and `spec.nodeName` a pod carries, on CREATE,
    and of those an UPDATE adds (pod updates may add tolerations; validate.added_on_update); fails closed."""
    if request.operation not in ("CREATE", "UPDATE"):
        return admission.response(request.uid)
    if request.operation == "UPDATE" and request.old is not None and all(
            (request.old.get("spec") or {}).get(f) == (request.obj.get("spec") or {}).get(f)
            for f in ("tolerations", "nodeName")):
        return admission.response(request.uid)
    rights = mutate.entitled(request.obj, request.namespace, lookup)
    judged = (validate.added_on_update(request.old, request.obj)
              if request.operation == "UPDATE" and request.old is not None else request.obj)
    verdict = validate.validate_pod_locks(judged, request.namespace, rights, lookup.lock_of_node)
    if not verdict.allowed:
        logs.decision(log, "deny", policy="pod-locks", kind="Pod", pod=f"{request.namespace}/{request.name}",
                      reason=admission.clip(verdict.message, 500))
    return admission.response(request.uid, allowed=verdict.allowed, message=verdict.message, code=403)


def _noop(request: Request, lookup: Lookup) -> ReviewResponse:
    return admission.response(request.uid)


@dataclass(frozen=True)
class Endpoint:
    """One admission route: what answers, the shape of the object it reads (admission module docstring), whether
    it mutates (a late answer then admits unchanged: fail open), and whether it always runs off the event loop."""

    route: Route
    shape: admission.Shape | None
    mutating: bool = False
    offload: bool = False


ROUTES: dict[str, Endpoint] = {
    "/mutate/pods": Endpoint(_route_mutate_pod, admission.POD, mutating=True),
    "/mutate/podgroups": Endpoint(_route_mutate_podgroup, admission.PODGROUP, mutating=True),
    "/validate/pods": Endpoint(_validating(lambda obj, old, _: validate.validate_pod(obj)), admission.POD),
    "/validate/pod-locks": Endpoint(_route_pod_locks, admission.POD),
    "/validate/podgroups": Endpoint(_validating(lambda obj, old, _: validate.validate_podgroup(obj)),
                                    admission.PODGROUP),
    "/validate/queues": Endpoint(_validating(lambda obj, old, lookup: validate.validate_queue(
        obj, lookup.schedulable_allocatable, old)), admission.QUEUE),
    "/validate/reservations": Endpoint(_validating(lambda obj, old, _: validate.validate_reservation(obj)),
                                       admission.RESERVATION),
    # issue 18 (deploy/components/koordinator): Koordinator's Reservations, warned about, never refused
    "/validate/koordinator-reservations": Endpoint(_validating(
        lambda obj, old, _: validate.validate_reservation(obj, koordinator=True)), admission.RESERVATION),
    # YAML and the config model are pure Python and cost milliseconds per KiB: never on the event loop
    "/validate/configmaps": Endpoint(_validating(lambda obj, old, _: validate.validate_configmap(obj)),
                                     admission.CONFIGMAP, offload=True),
    "/noop": Endpoint(_noop, None),  # the ceiling of the stack, for the benchmark
}

# --- limits (issue 10: safe in a shared cluster) ---
MAX_BODY = 3 * 1024 * 1024  # the API server's own limit on a request body: no AdmissionReview it sends is larger
# Idle keep-alive, and (aiohttp starts the same timer when a connection opens) the time a client has to finish its
# first request's headers. Longer than the API server's idle timeout for webhook connections (90 s, Go's default
# that client-go keeps), so the API server closes an idle connection first and never reuses one we are closing
# (Go does not retry a POST that fails so).
KEEPALIVE_TIMEOUT = 120.0
# Request line (the URL with ?timeout=2s), each header, and how many: the API server sends about ten short ones.
MAX_LINE_SIZE = 8190
MAX_FIELD_SIZE = 8190
MAX_HEADERS = 64
# After a 413 aiohttp reads and drops the rest of the body for this long, so a client still sending it can read the
# answer; then the connection is closed (aiohttp's default is 10 s).
LINGERING_TIME = 2.0
DEFAULT_TIMEOUT = 2.0  # timeoutSeconds of every webhook in deploy/webhook-configurations.yaml
MIN_TIMEOUT, MAX_TIMEOUT = 0.1, 30.0  # what `?timeout=` may ask for (the API server allows 1-30 s)
DEADLINE_MARGIN = 0.2  # answer this much before the caller's deadline (at most a tenth of it), so it arrives in time
INLINE_BODY = 64 * 1024  # bodies up to this are answered on the event loop: parsing and judging them costs < 10 ms
ADMISSION_THREADS = 2


def runner_options() -> dict[str, Any]:
    """The server's connection limits, as `web.AppRunner` keyword arguments (module constants above). Bodies are
    not decompressed: the API server never compresses them, and a compressed body is a way past MAX_BODY."""
    return {"keepalive_timeout": KEEPALIVE_TIMEOUT, "lingering_time": LINGERING_TIME, "max_line_size": MAX_LINE_SIZE,
            "max_field_size": MAX_FIELD_SIZE, "max_headers": MAX_HEADERS, "auto_decompress": False, "access_log": None}


def make_runner(app: web.Application) -> web.AppRunner:
    """The AppRunner that serves `app` within the limits (runner_options)."""
    return web.AppRunner(app, **runner_options())


def deadline(timeout: str | None) -> tuple[float, float]:
    """(the caller's timeout, the time this webhook allows itself) in seconds, from the `?timeout=` the API server
    sends (a Go duration, the webhook's timeoutSeconds); DEFAULT_TIMEOUT when it is absent or unreadable."""
    seconds = DEFAULT_TIMEOUT
    if timeout:
        try:
            seconds = parse_duration(timeout).total_seconds()
        except (DurationError, OverflowError, ValueError):
            seconds = DEFAULT_TIMEOUT
    seconds = min(max(seconds, MIN_TIMEOUT), MAX_TIMEOUT)
    return seconds, seconds - min(DEADLINE_MARGIN, seconds / 10)


@dataclass
class _Progress:
    """What is known of a request so far, for an answer at its deadline (set from a worker thread too)."""

    uid: str = ""


@dataclass(frozen=True)
class _Answer:
    status: int
    body: Mapping[str, Any]
    outcome: str
    decision: str | None = None  # a route's answer: one of DECISIONS (decision_of)


def _error(status: int, reason: str, outcome: str) -> _Answer:
    return _Answer(status, {"error": admission.clip(reason)}, outcome)


def _answer(path: str, endpoint: Endpoint, body: bytes, lookup: Callable[[], Lookup], progress: _Progress) -> _Answer:
    """The whole answer to one request body: parse, check its shape, route. Pure computation (it may run in a
    worker thread); every malformed request ends as a 400 with a one-line reason."""
    try:
        review = admission.parse_review(body, endpoint.shape)
    except BadReview as err:
        return _error(400, str(err), "bad-request")
    progress.uid = review.uid
    try:
        snapshot = lookup()
        answer = endpoint.route(review, snapshot)
    except (QuantityError, DurationError) as err:  # a value the shape check does not parse, read by the route
        return _error(400, admission.locate(endpoint.shape, review, err), "bad-request")
    except UnicodeError as err:  # a lone surrogate escape (\ud800): JSON allows it, UTF-8 cannot hold it
        return _error(400, f"request.object holds text that is not valid Unicode: {err}", "bad-request")
    except Exception:  # a bug must not turn into a stack trace for the apiserver
        log.exception("unexpected error", extra=logs.fields(route=path))
        return _error(500, "internal error; see the webhook log", "error")
    outcome = "allowed" if answer["response"]["allowed"] else "denied"
    if answer["response"].get("patch"):
        outcome = "patched"
    decision = decision_of(answer, snapshot)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("admission", extra=logs.fields(route=path, operation=review.operation, kind=review.kind,
                                                 namespace=review.namespace, name=review.name, decision=decision))
    return _Answer(200, answer, outcome, decision)


def _late(endpoint: Endpoint, progress: _Progress, timeout: float) -> _Answer:
    """The answer at the deadline. A mutation whose review was read is admitted unchanged (fail open, as its
    failurePolicy Ignore intends; the agent adds a lock toleration it lacks). Anything else is a 504, so the API
    server applies the webhook's own failurePolicy: Reservoir's objects (Fail) are refused naming the timeout, pods
    and PodGroups (Ignore) are admitted."""
    reason = f"the webhook did not finish within the request's {timeout:g}s timeout"
    if endpoint.mutating and progress.uid:
        return _Answer(200, admission.response(progress.uid, warnings=[f"reservoir: not mutated: {reason}"]),
                       "timeout")
    return _error(504, reason, "timeout")


def make_app(lookup: Callable[[], Lookup], synced: Callable[[], dict[str, bool]],
             metrics: Metrics | None = None) -> web.Application:
    metrics = metrics or Metrics()
    app = web.Application(client_max_size=MAX_BODY)
    pool = ThreadPoolExecutor(ADMISSION_THREADS, thread_name_prefix="admission")

    async def stop_pool(_: web.Application) -> None:
        pool.shutdown(wait=False, cancel_futures=True)  # a request still running there is past its deadline

    app.on_cleanup.append(stop_pool)

    async def respond(path: str, endpoint: Endpoint, http: web.Request, progress: _Progress) -> _Answer:
        if http.content_length is not None and http.content_length > MAX_BODY:
            return _error(413, f"request body of {http.content_length} bytes is over the limit of {MAX_BODY} "
                               "bytes (3 MiB, the API server's own)", "too-large")
        try:
            body = await http.read()  # counts a chunked body as it comes, and stops past client_max_size
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body is over the limit of {MAX_BODY} bytes (3 MiB, the API server's own)",
                          "too-large")
        except (web.RequestPayloadError, ConnectionError) as err:
            return _error(400, f"request body could not be read: {err}", "bad-request")
        if len(body) <= INLINE_BODY and not endpoint.offload:
            return _answer(path, endpoint, body, lookup, progress)
        snapshot = lookup()  # read on the loop: the caches change there
        return await asyncio.get_running_loop().run_in_executor(
            pool, _answer, path, endpoint, body, lambda: snapshot, progress)

    def handler(path: str, endpoint: Endpoint) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(http: web.Request) -> web.Response:
            started = time.perf_counter()
            timeout, allowed = deadline(http.query.get("timeout"))
            progress = _Progress()
            try:
                async with asyncio.timeout(allowed):
                    answer = await respond(path, endpoint, http, progress)
            except TimeoutError:
                answer = _late(endpoint, progress, timeout)
            response = web.Response(body=json.dumps(answer.body).encode(), status=answer.status,
                                     content_type="application/json")
            if answer.status == 504:
                response.force_close()  # the body may be unread: close after answering, do not wait for the rest
            if answer.status == 400:
                log.info("bad request", extra=logs.fields(route=path, reason=answer.body.get("error", "")[:300]))
            metrics.requests.labels(path, answer.outcome).inc()
            if answer.decision is not None:
                metrics.admissions.labels(path, answer.decision).inc()
            metrics.latency.labels(path, answer.outcome).observe(time.perf_counter() - started)
            return response
        return handle

    for path, endpoint in ROUTES.items():
        app.router.add_post(path, handler(path, endpoint))

    def waiting() -> list[str]:
        """The caches not synced yet, sorted; records every cache's state in `reservoir_webhook_cache_synced`."""
        state = synced()
        for name, ok in state.items():
            metrics.cache_synced.labels(name).set(1 if ok else 0)
        return sorted(n for n, ok in state.items() if not ok)

    return add_probes(app, metrics.registry, waiting, describe=lambda names: f"waiting for caches: {', '.join(names)}",
                      before_scrape=waiting)


class ReloadingTLS:
    """A server SSLContext whose certificate and key are re-read when either file changes on disk, so a rotated
    Secret is served without a restart (new handshakes get the new certificate)."""

    def __init__(self, cert_file: Path, key_file: Path, metrics: Metrics | None = None) -> None:
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self.metrics = metrics
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = self._read_stamp()
        self.context.load_cert_chain(self.cert_file, self.key_file)
        self._record()

    def _record(self) -> None:
        """The expiry of the certificate just loaded, in the metrics (Metrics.serving)."""
        if self.metrics is None:
            return
        try:
            self.metrics.serving(self.cert_file.read_bytes())
        except OSError as err:
            log.warning("serving certificate expiry unreadable", extra=logs.fields(error=str(err)[:300]))

    def _read_stamp(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        def stamp(path: Path) -> tuple[int, int, int]:
            st = os.stat(path)  # follows symlinks, as a mounted Secret's ..data link swap needs
            return (st.st_mtime_ns, st.st_size, st.st_ino)
        return (stamp(self.cert_file), stamp(self.key_file))

    def reload_if_changed(self) -> bool:
        try:
            stamp = self._read_stamp()
        except OSError as err:
            log.warning("certificate files unreadable, keeping the current one", extra=logs.fields(error=str(err)))
            return False
        if stamp == self._stamp:
            return False
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as err:  # half-written pair: try again on the next tick
            log.warning("certificate reload failed, keeping the current one", extra=logs.fields(error=str(err)))
            return False
        self._stamp = stamp
        self._record()
        if self.metrics:
            self.metrics.cert_reloads.inc()
        log.info("certificate reloaded", extra=logs.fields(certificate="reloaded", file=str(self.cert_file)))
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(CERT_CHECK_INTERVAL)
            self.reload_if_changed()
