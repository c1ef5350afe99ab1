"""The webhook's HTTPS server: admission routes, health, readiness, metrics, certificate reload."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.serving import add_probes
from webhook import admission, mutate, validate
from webhook.admission import BadReview, Request, ReviewResponse
from webhook.lookup import Lookup

log = logging.getLogger("reservoir.webhook")
CERT_CHECK_INTERVAL = 2.0


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("reservoir_webhook_requests_total", "Admission requests answered",
                                ["route", "outcome"], registry=self.registry)
        self.latency = Histogram("reservoir_webhook_request_duration_seconds", "Time to answer an admission request",
                                 ["route", "outcome"], registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.cache_synced = Gauge("reservoir_webhook_cache_synced", "1 when the watch cache has synced",
                                  ["cache"], registry=self.registry)
        self.cert_reloads = Counter("reservoir_webhook_certificate_reloads_total", "Serving certificate reloads",
                                    registry=self.registry)


def _route_mutate_pod(request: Request, lookup: Lookup) -> ReviewResponse:
    """Seed 001 (priority inheritance), 003 (reservation tolerations and affinity) and 004 (reserve annotations
    copied from the PodGroup, window tolerations for reserve pods): DESIGN section 3, mutating pod CREATE."""
    if request.operation != "CREATE":
        return admission.response(request.uid)
    result = mutate.mutate_pod(request.obj, request.namespace, lookup)
    if result.reasons:
        meta = request.obj.get("metadata") or {}
        log.info("decision=mutate pod=%s/%s changes=%r", request.namespace,
                 meta.get("name") or meta.get("generateName", ""), "; ".join(result.reasons))
    return admission.response(request.uid, patch=result.patch, warnings=result.warnings)


def _route_mutate_podgroup(request: Request, lookup: Lookup) -> ReviewResponse:
    """Seed 001: a PodGroup inherits its queue's PriorityClass."""
    if request.operation != "CREATE":
        return admission.response(request.uid)
    result = mutate.mutate_podgroup(request.obj, lookup)
    return admission.response(request.uid, patch=result.patch)


Check = Callable[[Mapping[str, Any], Lookup], validate.Verdict]
Route = Callable[[Request, Lookup], ReviewResponse]


def _validating(check: Check) -> Route:
    def route(request: Request, lookup: Lookup) -> ReviewResponse:
        if request.operation == "DELETE":
            return admission.response(request.uid)
        verdict = check(request.obj, lookup)
        if not verdict.allowed:
            log.info("decision=deny kind=%s name=%s reason=%r", request.kind, request.name, verdict.message)
        return admission.response(request.uid, allowed=verdict.allowed, message=verdict.message,
                                  warnings=verdict.warnings, code=422)
    return route


def _noop(request: Request, lookup: Lookup) -> ReviewResponse:
    return admission.response(request.uid)


ROUTES: dict[str, Route] = {
    "/mutate/pods": _route_mutate_pod,
    "/mutate/podgroups": _route_mutate_podgroup,
    "/validate/pods": _validating(lambda obj, _: validate.validate_pod(obj)),
    "/validate/podgroups": _validating(lambda obj, _: validate.validate_podgroup(obj)),
    "/validate/queues": _validating(lambda obj, lookup: validate.validate_queue(obj, lookup.schedulable_allocatable)),
    "/validate/reservations": _validating(lambda obj, _: validate.validate_reservation(obj)),
    "/validate/configmaps": _validating(lambda obj, _: validate.validate_configmap(obj)),
    "/noop": _noop,  # the ceiling of the stack, for the benchmark
}


def make_app(lookup: Callable[[], Lookup], synced: Callable[[], dict[str, bool]],
             metrics: Metrics | None = None) -> web.Application:
    metrics = metrics or Metrics()
    app = web.Application(client_max_size=3 * 1024 * 1024)

    def handler(path: str, route: Route) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(http: web.Request) -> web.Response:
            started = time.perf_counter()
            outcome = "error"
            try:
                review = admission.parse_review(await http.read())
                answer = route(review, lookup())
                outcome = "allowed" if answer["response"]["allowed"] else "denied"
                if answer["response"].get("patch"):
                    outcome = "patched"
                return web.Response(body=json.dumps(answer).encode(), content_type="application/json")
            except BadReview as err:
                outcome = "bad-request"
                return web.json_response({"error": str(err)}, status=400)
            except Exception:  # a bug must not turn into a stack trace for the apiserver
                log.exception("route=%s unexpected error", path)
                return web.json_response({"error": "internal error; see the webhook log"}, status=500)
            finally:
                metrics.requests.labels(path, outcome).inc()
                metrics.latency.labels(path, outcome).observe(time.perf_counter() - started)
        return handle

    for path, route in ROUTES.items():
        app.router.add_post(path, handler(path, route))

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

    def _read_stamp(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        def stamp(path: Path) -> tuple[int, int, int]:
            st = os.stat(path)  # follows symlinks, as a mounted Secret's ..data link swap needs
            return (st.st_mtime_ns, st.st_size, st.st_ino)
        return (stamp(self.cert_file), stamp(self.key_file))

    def reload_if_changed(self) -> bool:
        try:
            stamp = self._read_stamp()
        except OSError as err:
            log.warning("certificate files unreadable, keeping the current one: %s", err)
            return False
        if stamp == self._stamp:
            return False
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as err:  # half-written pair: try again on the next tick
            log.warning("certificate reload failed, keeping the current one: %s", err)
            return False
        self._stamp = stamp
        if self.metrics:
            self.metrics.cert_reloads.inc()
        log.info("certificate=reloaded file=%s", self.cert_file)
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(CERT_CHECK_INTERVAL)
            self.reload_if_changed()
