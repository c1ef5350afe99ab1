"""`make fuzz-webhook`: hostile AdmissionReviews (bench/fuzz/cases.py) against the real webhook over HTTPS.

The server is the real app (`webhook.server.make_app` behind `make_runner`, its TLS from `certs.rotation.ensure`) in
its own process pinned to core 0, reading a realistic snapshot in which some cached objects are hostile too; the
client is this process, on core 1, sending one request at a time per connection (`--concurrency`), each with the
`?timeout=2s` the API server sends. Every answer's status and time (from the first byte sent to the last byte of
the answer read) is recorded. The last line:

    fuzz: N requests, 5xx E, slowest S ms

E must be 0 and S under 100 (a 400 or a 413 is a fine answer); the exit status says whether they are.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from bench.fuzz.cases import Case, cases
from shared import keys

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SEED = 20260
DEFAULT_COUNT = 10_000
SLOWEST_ALLOWED_MS = 100.0
CHUNK = 256 * 1024


def lookup():  # -> webhook.lookup.Lookup (imported late: the client side does not need the webhook)
    """What the fuzzed server reads: 200 queues, 2,000 PodGroups, 50 Reservations, 3 windows, 20 nodes (the
    benchmark's snapshot plus nodes), and cached objects a tenant could have made hostile while the webhook was
    down: Reservations with owners no matcher can read, a PodGroup with odd annotations, a Queue with odd fields."""
    from bench.webhook.serve import snapshot
    from shared.views import NodeView, PodGroupView, QueueView, ReservationView
    from webhook.lookup import Lookup

    base = snapshot()
    nodes = {f"node-{i}": NodeView.from_obj({"metadata": {"name": f"node-{i}", "labels": {"zone": f"z{i % 3}"}},
                                             "status": {"allocatable": {"cpu": "32", "memory": "128Gi"}}})
             for i in range(20)}
    reservations = dict(base.reservations)
    hostile_owners = ([{"object": {"name": {"not": "a string"}}}], [{"labelSelector": {"matchLabels": {"a": 1}}}],
                      [{"labelSelector": "x"}], ["owner"], [{"controller": [1]}],
                      [{"labelSelector": {"matchExpressions": [{"key": 5, "operator": "In", "values": "x"}]}}],
                      [{"labelSelector": {}}])
    for index, owners in enumerate(hostile_owners):
        obj = {"metadata": {"name": f"hostile-{index}", "labels": {"pool": "a"}},
               "spec": {"owners": owners, "template": {"spec": {"containers": [
                   {"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}},
               "status": {"phase": "Available"}}
        try:
            reservations[f"hostile-{index}"] = ReservationView.from_obj(obj)
        except Exception:  # a view the shared code refuses to build: the cache would skip it too
            continue
    podgroups = dict(base.podgroups)
    queues = dict(base.queues)
    for build, store, key, obj in (
        (PodGroupView.from_obj, podgroups, ("ns-7", "job-7"), {
            "metadata": {"name": "job-7", "namespace": "ns-7",
                         "annotations": {keys.RESERVEABLE: "maybe", keys.MAXIMUM_RUNTIME: "999999999999h"}},
            "spec": {"queue": "q-1", "minMember": 4}}),
        (QueueView.from_obj, queues, "q-1", {"metadata": {"name": "q-1"}, "spec": {"priorityClassName": "missing"}}),
    ):
        try:
            store[key] = build(obj)  # type: ignore[index]
        except Exception:
            continue
    return Lookup(podgroups=podgroups, queues=queues, priority_classes=base.priority_classes,
                  reservations=reservations, config=base.config, nodes=nodes)


async def serve(cert: Path, key: Path, port: int) -> None:
    from aiohttp import web

    from webhook.server import Metrics, ReloadingTLS, make_app, make_runner

    snapshot = lookup()
    # The snapshot is built once and never changes: out of the collector's sight, so a full collection walks what the
    # requests allocate, not 80,000 cached objects (50 ms) that no request can free.
    gc.collect()
    gc.freeze()
    tls = ReloadingTLS(cert, key)
    runner = make_runner(make_app(lambda: snapshot, lambda: {"snapshot": True}, Metrics()))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.context, backlog=1024).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), CHUNK):
        yield body[start:start + CHUNK]


async def send(session: aiohttp.ClientSession, case: Case) -> tuple[int, float, str]:
    """(status, milliseconds, what a 200 said: allowed, denied or patched) of one case; status 0 when no answer
    came."""
    data = _chunks(case.body) if case.chunked else case.body
    started = time.perf_counter()
    try:
        async with session.post(f"{case.route}?timeout=2s", data=data,
                                headers={"Content-Type": "application/json"}) as response:
            body = await response.read()
            status = response.status
    except (aiohttp.ClientError, ConnectionError, TimeoutError):
        status, body = 0, b""
    elapsed = (time.perf_counter() - started) * 1000
    said = ""
    if status == 200:
        answer = json.loads(body)["response"]
        said = "patched" if answer.get("patch") else "allowed" if answer["allowed"] else "denied"
    return status, elapsed, said


class Tally:
    def __init__(self) -> None:
        self.statuses: collections.Counter[tuple[str, int]] = collections.Counter()
        self.answers: collections.Counter[str] = collections.Counter()
        self.failures: list[tuple[int, float, Case]] = []
        self.slowest: tuple[float, Case | None] = (0.0, None)
        self.count = 0

    def add(self, case: Case, status: int, ms: float, said: str = "") -> None:
        self.count += 1
        self.statuses[(case.route, status)] += 1
        if said:
            self.answers[said] += 1
        if status >= 500 or status == 0:
            self.failures.append((status, ms, case))
        if ms > self.slowest[0]:
            self.slowest = (ms, case)

    @property
    def server_errors(self) -> int:
        return sum(n for (_, status), n in self.statuses.items() if status >= 500)

    @property
    def unanswered(self) -> int:
        return sum(n for (_, status), n in self.statuses.items() if status == 0)


async def run_cases(base_url: str, ca_file: Path, seed: int, count: int, concurrency: int) -> Tally:
    """Send every case, `concurrency` connections each sending one request at a time. A case is generated between
    two requests of its connection, never while one is in flight, and the client's own garbage is collected there
    too, so what is timed is the server (with one connection, exactly; with more, the others' generating overlaps)."""
    tally = Tally()
    context = ssl.create_default_context(cafile=str(ca_file))
    generated = cases(seed, count)
    gc.disable()

    async def worker() -> None:
        connector = aiohttp.TCPConnector(ssl=context, limit=1)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(base_url, connector=connector, timeout=timeout) as session:
            for case in generated:
                tally.add(case, *await send(session, case))
                if tally.count % 100 == 0:
                    gc.collect()

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        gc.enable()
    return tally


def report(tally: Tally) -> str:
    """The summary lines, the last one `fuzz: N requests, 5xx E, slowest S ms`."""
    lines = []
    by_route: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for (route, status), n in sorted(tally.statuses.items()):
        by_route[route][status] += n
    for route, statuses in by_route.items():
        counts = "  ".join(f"{status or 'no answer'}: {n}" for status, n in sorted(statuses.items()))
        lines.append(f"{route:<24}{counts}")
    lines.append("200s: " + ", ".join(f"{said} {n}" for said, n in sorted(tally.answers.items())))
    for status, ms, case in tally.failures[:10]:
        lines.append(f"FAILED {case.route} -> {status or 'no answer'} in {ms:.1f} ms: {case.what[:300]}")
    if tally.slowest[1] is not None:
        lines.append(f"slowest: {tally.slowest[1].route} ({len(tally.slowest[1].body)} bytes"
                     f"{', chunked' if tally.slowest[1].chunked else ''}): {tally.slowest[1].what[:200]}")
    if tally.unanswered:
        lines.append(f"no answer: {tally.unanswered}")
    lines.append(f"fuzz: {tally.count} requests, 5xx {tally.server_errors}, slowest {tally.slowest[0]:.1f} ms")
    return "\n".join(lines)


def _pinned(core: int, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *command] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 \
        else command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make fuzz-webhook", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SEED", DEFAULT_SEED)))
    parser.add_argument("--count", type=int, default=int(os.environ.get("COUNT", DEFAULT_COUNT)))
    parser.add_argument("--concurrency", type=int, default=1)
    sub = parser.add_subparsers(dest="command")
    serving = sub.add_parser("serve", help="(internal) run the server")
    serving.add_argument("--cert", required=True)
    serving.add_argument("--key", required=True)
    serving.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "serve":
        asyncio.run(serve(Path(args.cert), Path(args.key), args.port))
        return 0

    from certs.rotation import Subject, ensure
    from localcluster.cluster import free_port

    work = Path(tempfile.mkdtemp(prefix="reservoir-fuzz-"))
    ensure(work, Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",)))
    port = free_port()
    server = subprocess.Popen(_pinned(0, [sys.executable, "-m", "bench.fuzz.webhook", "serve",
                                          f"--cert={work / 'tls.crt'}", f"--key={work / 'tls.key'}",
                                          f"--port={port}"]),
                              cwd=REPO, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready", "the server did not start"
        if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(0, {1})
        started = time.perf_counter()
        tally = asyncio.run(run_cases(f"https://127.0.0.1:{port}", work / "ca-bundle.crt", args.seed, args.count,
                                      args.concurrency))
        elapsed = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"seed {args.seed}, {args.count} cases, {args.concurrency} connection(s), {elapsed:.0f} s")
    print(report(tally))
    ok = tally.server_errors == 0 and tally.unanswered == 0 and tally.slowest[0] < SLOWEST_ALLOWED_MS
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
