"""Metrics both programs serve, written once (issue 14, "Metrics and alerts"): the registry every program starts
from, `reservoir_build_info`, and gauges read at scrape time (watch-cache freshness, and the agent's lock expiries).

`new_registry()` holds the process collector (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
`process_open_fds`, `process_start_time_seconds`, ...), the platform collector (`python_info`), the garbage
collector's (`python_gc_*`) and `reservoir_build_info{version,revision,python} 1` (shared.version). A custom registry
has none of them by itself; these are the ones prometheus_client's default registry carries.

`reservoir_cache_last_heard_timestamp_seconds{cache}` is the Unix time each watch cache last heard from the API
server: a list completed (or a 404 for an API that is not installed), any watch event, bookmarks included
(shared.watchcache.WatchCache.heard); its creation time until it first has. It is read at scrape time, from the
very clock readiness uses (shared.serving.STALE_AFTER), so `time() - it > 640` is exactly "readiness calls this
cache stale". A timestamp rather than an age: Prometheus computes the age itself, and an age frozen in the last
scrape of a process that stopped answering would look fresh. One series per cache: a fixed set of names.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.version import revision, version

BUILD_INFO = "reservoir_build_info"
CACHE_LAST_HEARD = "reservoir_cache_last_heard_timestamp_seconds"


def new_registry() -> CollectorRegistry:
    """A registry with the process, platform and GC collectors and `reservoir_build_info` (module docstring)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    Gauge(BUILD_INFO, "Always 1: the Reservoir build serving these metrics (package version, source revision, "
          "Python version)", ["version", "revision", "python"],
          registry=registry).labels(version(), revision(), platform.python_version()).set(1)
    return registry


class ScrapeGauge(Collector):
    """A gauge whose samples `read()` gives at each scrape, as (label values, value) pairs; one that raises is
    logged by prometheus_client and fails that scrape only, never the program."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str],
                 read: Callable[[], Iterable[tuple[Sequence[str], float]]]) -> None:
        self.name, self.documentation, self.labels, self.read = name, documentation, list(labels), read

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.name, self.documentation, labels=self.labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, value in self.read():
            family.add_metric(list(values), value)
        yield family


class Heard(Protocol):
    """What the freshness gauge asks of a watch cache (shared.watchcache.WatchCache)."""

    @property
    def name(self) -> str: ...

    def stale_for(self, now: float | None = None) -> float: ...


def cache_freshness(registry: CollectorRegistry, caches: Callable[[], Iterable[Heard]]) -> None:
    """Register `reservoir_cache_last_heard_timestamp_seconds{cache}` (module docstring) for `caches()` in
    `registry`."""
    def read() -> Iterator[tuple[Sequence[str], float]]:
        wall, mono = time.time(), time.monotonic()
        for cache in caches():
            yield (cache.name,), wall - cache.stale_for(mono)

    registry.register(ScrapeGauge(CACHE_LAST_HEARD, "Unix time the watch cache last heard from the API server (a "
                                  "list, a watch event or a bookmark); its creation time until it first has",
                                  ["cache"], read))
