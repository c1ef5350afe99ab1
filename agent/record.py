"""`reservoir record`: watch a live cluster, read-only (list and watch of pods and nodes, nothing else:
deploy/record-rbac.yaml), and write what it shows as a trace (DIR/pods.csv, DIR/nodes.csv) that `reservoir simulate
--as-recorded` replays. What a row holds, the times, the escaping, the hashing and the resume rules are
agent/recording.py's; this module is the I/O around them:

- DIR/record.lock, held with flock for the recorder's life (the kernel lets go of it when the process dies, kill -9
  included): a second recorder on the same directory refuses, naming the first one's pid;
- DIR/record-state.json (agent/recording.py `Recording.state_json`), written to a temporary file, synced and renamed;
- DIR/pods.csv appended a batch of rows at a time, flushed and fsynced before their pods leave the state;
- DIR/nodes.csv rewritten whole (temporary file and rename) when a node is new or changed;
- DIR/anonymize.key (mode 0600), the key of `--anonymize`'s hashes, made at the first run.
The pods and nodes are read through the agent's own list+watch cache (shared.watchcache.WatchCache: paginated lists,
resume from the last resourceVersion, re-list on 410, an object that cannot be read skipped, counted and logged once).
SIGINT or SIGTERM stops it cleanly (rows flushed, state saved: run it again to resume); at the end of `--duration`
(counted from the recording's first start) the pods still open are written and the recording is finished.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import math
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agent.recording import (
    RECORD_COLUMNS,
    Anonymizer,
    NodeReader,
    NodeSeen,
    Options,
    PodReader,
    PodSeen,
    Recording,
    RecordingError,
    read_written_uids,
)
from shared.kube import new_api_client
from shared.tracecsv import NODE_COLUMNS, csv_writer, read_nodes
from shared.watchcache import Skipped, WatchCache

log = logging.getLogger("reservoir.record")
PODS_FILE, NODES_FILE, STATE_FILE, LOCK_FILE, KEY_FILE = (
    "pods.csv", "nodes.csv", "record-state.json", "record.lock", "anonymize.key")
PROGRESS_SECONDS = 5.0  # between progress lines on standard error
FLUSH_SECONDS = 0.5  # rows appended and synced at most this long after the pod ended
STATE_SECONDS = 2.0  # the state saved at most this often (and at every stop)
KEY_BYTES = 32


@dataclass(frozen=True)
class Settings:
    """`reservoir record`'s flags."""

    out: Path
    duration: float  # seconds from the recording's first start; math.inf: until stopped
    options: Options
    kubeconfig: str | None = None
    context: str | None = None
    quiet: bool = False


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, write: Callable[[TextIO], None]) -> None:
    """`path` replaced whole by what `write` writes: a temporary file beside it, synced, renamed over it."""
    # a fresh name made by mkstemp (mode 0600, O_EXCL: never a file or link someone put there)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(name, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(name)
        raise
    _fsync_dir(path.parent)


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold DIR/record.lock (flock) for the block; RecordingError naming the holder's pid when another recorder
    holds it."""
    path = directory / LOCK_FILE
    try:  # O_NOFOLLOW: a link planted as record.lock is refused, not followed (and its target truncated)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        raise RecordingError(f"--out {directory}: cannot open {path} ({err.strerror or err}): it must be a plain "
                             f"file; remove it, or give another --out") from None
    handle = os.fdopen(fd, "a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise RecordingError(f"--out {directory}: another `reservoir record` (pid {holder}) is recording there "
                                 f"({path} is locked): stop it first, or give another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()


def prepare(directory: Path) -> None:
    """The output directory, made when missing; RecordingError naming --out and the fix when it cannot be written."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # the recording holds names
        probe = directory / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise RecordingError(f"--out {directory}: cannot write there ({err.strerror or err}): give a directory you "
                             f"may write, or make this one writable") from None


def anonymize_key(directory: Path) -> bytes:
    """The recording's hashing key (DIR/anonymize.key, mode 0600), made at the first run with --anonymize: written
    whole to a fresh temporary file and linked into place (a crash leaves no key, or the whole key; never a short one
    that would refuse every resume), and read back either way."""
    path = directory / KEY_FILE
    if not path.exists():
        fd, name = tempfile.mkstemp(prefix=f".{KEY_FILE}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(KEY_BYTES))
                handle.flush()
                os.fsync(handle.fileno())
            with suppress(FileExistsError):  # another run made it first: its key it is
                os.link(name, path)
        finally:
            os.unlink(name)
        _fsync_dir(directory)
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise RecordingError(f"{path}: {len(key)} bytes, expected {KEY_BYTES}: not this recording's key; restore "
                             f"it, or give another --out")
    return key


def open_recording(settings: Settings, now: float) -> Recording:
    """The recording in --out: resumed from its state (with pods.csv's uids and nodes.csv's rows), else a new one
    whose origin is `now`."""
    directory, options = settings.out, settings.options
    key = anonymize_key(directory) if options.anonymize else None
    state, pods = directory / STATE_FILE, directory / PODS_FILE
    if state.exists():
        recording = Recording.from_state(state.read_text(encoding="utf-8"), str(state), options, key)
        if recording.finished:
            raise RecordingError(f"--out {directory}: this recording finished (its --duration passed and every open "
                                 f"pod was written): give another --out for a new one")
    elif read_written_uids(pods):  # a header alone: the first run stopped before its first save, nothing to keep
        raise RecordingError(f"--out {directory}: {pods} holds rows but {state} is missing: not a recording that "
                             f"can be resumed; give another --out")
    else:
        recording = Recording(origin=now, options=options, anonymizer=Anonymizer(key))
    recording.written_uids = read_written_uids(pods)
    recording.pods_seen = len(recording.written_uids | {recording.written_form(uid) for uid in recording.open})
    if (directory / NODES_FILE).exists():
        recording.nodes = {row.sn: row for row in read_nodes(directory / NODES_FILE)}
    return recording


class Recorder:
    """One run of `reservoir record` on an open recording: the watches feed the recording, rows are appended in
    batches, the state and the node list saved when they changed."""

    def __init__(self, settings: Settings, recording: Recording, pods_file: TextIO,
                 progress: TextIO | None) -> None:
        self.settings = settings
        self.recording = recording
        self.pods_file = pods_file
        self.writer = csv_writer(pods_file)
        self.progress = progress
        self.pending: list[list[str]] = []
        self.nodes_changed = True  # nodes.csv written at the first save, even before any node is seen
        self.state_dirty = True
        self.state_saved_at = 0.0
        self.rows_written = 0
        self.skipped = 0
        self.unreadable: set[str] = set()  # uids of pods whose last version could not be read
        self.pods: WatchCache[PodSeen] | None = None  # the pods' watch cache, while run() runs
        self.heard_wall = time.time()  # wall time the pods' watch last spoke (an event, a bookmark; not a relist)
        self.stop = asyncio.Event()

    # --- what the watches show ---

    def pod_event(self, event: str, pod: PodSeen | None) -> None:
        if pod is None:
            return
        if event == "DELETED" and pod.uid in self.unreadable:
            # the cache drops a pod whose new version it cannot read and says DELETED: the pod is still there, so it
            # stays open with what was last read of it (a later readable version brings it up to date; deleted while
            # unreadable, it is written at the recording's end, or as vanished after a restart)
            return
        self.unreadable.discard(pod.uid)
        now = time.time()
        if event == "DELETED" and self.pods is not None and self.pods.relisting:
            rows = self.recording.pod_vanished(pod, now, self.heard_wall)
        elif event == "DELETED":
            rows = self.recording.pod_deleted(pod, now)
        else:
            rows = self.recording.pod_changed(pod, now)
        if not (self.pods is not None and self.pods.relisting):
            self.heard_wall = max(self.heard_wall, now)
        self.pending.extend(rows)
        self.state_dirty = True

    def node_event(self, event: str, node: NodeSeen | None) -> None:
        if node is not None and event != "DELETED" and self.recording.node_seen(node):
            self.nodes_changed = True

    def skip(self, skipped: Skipped) -> None:
        self.skipped += 1
        if skipped.cache == "pods" and skipped.uid:
            self.unreadable.add(skipped.uid)

    # --- the files ---

    def flush(self) -> None:
        """The rows made so far appended and synced, then their pods out of the state."""
        if not self.pending:
            return
        rows, self.pending = self.pending, []
        for row in rows:
            self.writer.writerow(row)
        self.pods_file.flush()
        os.fsync(self.pods_file.fileno())
        uid_at = RECORD_COLUMNS.index("uid")
        for row in rows:
            self.recording.written(row[uid_at])
        self.rows_written += len(rows)
        self.state_dirty = True

    def save(self, force: bool = False) -> None:
        """The node list and the state, each when it changed (the state at most every STATE_SECONDS unless
        `force`)."""
        directory = self.settings.out
        if self.nodes_changed:
            def nodes(handle: TextIO) -> None:
                writer = csv_writer(handle)
                writer.writerow(NODE_COLUMNS)
                writer.writerows(self.recording.node_rows())
            write_atomically(directory / NODES_FILE, nodes)
            self.nodes_changed = False
        now = time.monotonic()
        if self.state_dirty and (force or now - self.state_saved_at >= STATE_SECONDS):
            self.recording.seen_until = time.time()
            text = self.recording.state_json()

            def state(handle: TextIO) -> None:
                handle.write(text)
            write_atomically(directory / STATE_FILE, state)
            self.state_dirty, self.state_saved_at = False, now

    def line(self, left: float) -> str:
        r = self.recording
        remaining = "until stopped" if math.isinf(left) else f"{left:.0f}s left"
        return (f"record: {r.pods_seen:,} pods seen, {self.rows_written:,} rows written, {len(r.open):,} open, "
                f"{len(r.nodes):,} nodes, {self.skipped:,} objects skipped, {remaining}")

    # --- the run ---

    async def run(self, api: client.ApiClient) -> bool:
        """Record until the duration passes (True: the recording is finished) or a signal stops it (False)."""
        settings = self.settings
        pods: WatchCache[PodSeen] = WatchCache(
            api, "pods", "/api/v1/pods", PodReader(settings.options.gpu_resource, settings.options.gpu_model_label),
            key=lambda obj: obj["metadata"]["uid"], on_change=self.pod_event, on_skip=self.skip)
        self.pods = pods
        nodes: WatchCache[NodeSeen] = WatchCache(
            api, "nodes", "/api/v1/nodes", NodeReader(settings.options.gpu_resource, settings.options.gpu_model_label),
            on_change=self.node_event, on_skip=self.skip)
        # the first lists here, not in the caches' loops: a refusal (403: no RBAC) ends the command with its message
        for cache in (nodes, pods):
            try:
                await cache.list()
            except ApiException as err:
                if err.status != 403:
                    raise
                raise RecordingError(f"the API server refused to list {cache.name} (403 Forbidden): bind the "
                                     f"account the recorder runs as to the ClusterRole reservoir-record "
                                     f"(deploy/record-rbac.yaml: list and watch of pods and nodes)") from None
        self.pending.extend(self.recording.resume(pods.items.keys(), time.time()))
        self.flush()
        self.save(force=True)
        tasks = [asyncio.create_task(cache.run(), name=f"record-{cache.name}") for cache in (pods, nodes)]
        finished = False
        try:
            last_progress = 0.0
            while not self.stop.is_set():
                left = self.left()
                if left <= 0:
                    finished = True
                    break
                try:
                    await asyncio.wait_for(self.stop.wait(), timeout=min(FLUSH_SECONDS, left))
                except TimeoutError:
                    pass
                for task in tasks:
                    error = task.exception() if task.done() and not task.cancelled() else None
                    if error is not None:
                        raise error
                # the last moment the pods' watch spoke (bookmarks included), on the wall clock: a pod a later
                # relist lacks was there until then at least
                self.heard_wall = max(self.heard_wall, time.time() - pods.stale_for())
                self.flush()
                self.save()
                if self.progress is not None and time.monotonic() - last_progress >= PROGRESS_SECONDS:
                    print(self.line(self.left()), file=self.progress, flush=True)
                    last_progress = time.monotonic()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if finished:
            self.pending.extend(self.recording.finish())
        self.flush()
        self.save(force=True)
        if self.progress is not None:
            print(self.line(self.left()), file=self.progress, flush=True)
        return finished

    def left(self) -> float:
        if math.isinf(self.settings.duration):
            return math.inf
        return max(0.0, self.recording.origin + self.settings.duration - time.time())


async def record(settings: Settings) -> str:
    """`reservoir record`: the whole run; the last line to print (finished, or stopped and resumable)."""
    prepare(settings.out)
    with locked(settings.out):
        recording = open_recording(settings, time.time())
        pods_path = settings.out / PODS_FILE
        if not pods_path.exists():
            def header(handle: TextIO) -> None:
                csv_writer(handle).writerow(RECORD_COLUMNS)
            write_atomically(pods_path, header)
        with pods_path.open("a", newline="", encoding="utf-8") as pods_file:
            recorder = Recorder(settings, recording, pods_file, None if settings.quiet else sys.stderr)
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, recorder.stop.set)
            api = await new_api_client(settings.kubeconfig, context=settings.context)
            try:
                finished = await recorder.run(api)
            finally:
                await api.close()
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(signum)
    where = f"{pods_path} and {settings.out / NODES_FILE}"
    if finished:
        return (f"record: finished: {recorder.rows_written:,} rows written in this run ({len(recording.written_uids):,}"
                f" pods in all), {len(recording.nodes):,} nodes: {where}")
    return (f"record: stopped: {recorder.rows_written:,} rows written in this run, {len(recording.open):,} pods open "
            f"kept in {settings.out / STATE_FILE}: run the same command again to resume")
