"""`reservoir record`'s pure part (agent/recording.py) and its files (agent/record.py without a cluster): a pod object
becomes the row kube-scheduler's arithmetic says (GPU, no GPU, gated, init containers as pod_requests counts them),
hostile tenant strings reach the CSV escaped, --anonymize hashes alike across a resume, a crash between a row's
append and the state's save writes no row twice, a vanished pod is written explicitly, the recording reads back
through trace.read_pods, and trace.replay's as-recorded parameters replay it at its own pace."""

from __future__ import annotations

import asyncio
import csv
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agent import record
from agent.recording import (
    RECORD_COLUMNS,
    Anonymizer,
    NodeReader,
    Options,
    PodReader,
    Recording,
    RecordingError,
    escape,
    moment,
    read_written_uids,
)
from bench.trace import trace
from shared import keys
from shared.views import ViewError
from tests.builders import loopback_api

ORIGIN = 1_800_000_000.0  # the recording's first start, seconds since the epoch
T0 = "2027-01-15T08:00:00Z"  # == ORIGIN
MODEL = keys.GPU_MODEL_LABEL


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(ORIGIN + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_obj(name: str = "p", *, uid: str | None = None, namespace: str = "team-a",
            requests: dict[str, str] | None = None,
            created: float = 0.0, node: str = "", bound: float | None = None, phase: str = "Pending",
            finished: float | None = None, gates: list[str] | None = None, init: list[dict[str, Any]] | None = None,
            annotations: dict[str, str] | None = None, spec: dict[str, Any] | None = None,
            owner: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "x", "resources": {"requests": requests or {"cpu": "1"}}}
    body_spec: dict[str, Any] = {"containers": [container], **(spec or {})}
    if init:
        body_spec["initContainers"] = init
    if gates:
        body_spec["schedulingGates"] = [{"name": g} for g in gates]
    if node:
        body_spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if bound is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(bound)}]
        status["startTime"] = stamp(bound)
    if finished is not None:
        status["containerStatuses"] = [{"name": "main", "state": {"terminated": {"finishedAt": stamp(finished)}}}]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                            "creationTimestamp": stamp(created), "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": owner, "name": "j", "uid": "o",
                                    "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body_spec, "status": status}


def new_recording(key: bytes | None = None) -> Recording:
    return Recording(origin=ORIGIN, options=Options(anonymize=key is not None), anonymizer=Anonymizer(key))


def as_dict(row: list[str]) -> dict[str, str]:
    assert len(row) == len(RECORD_COLUMNS)
    return dict(zip(RECORD_COLUMNS, row, strict=True))


READ = PodReader()


# --- a pod object -> its row ---

def test_a_gpu_pod_is_recorded_with_its_requests_models_runtime_and_times() -> None:
    rec = new_recording()
    obj = pod_obj("train", requests={"cpu": "1500m", "memory": "1536Mi", keys.GPU_RESOURCE: "2"}, created=10,
                  annotations={keys.MAXIMUM_RUNTIME: "90s"}, owner="Job",
                  spec={"nodeSelector": {MODEL: "NVIDIA-A100"}})
    assert rec.pod_changed(READ(obj), now=ORIGIN + 10.25) == []
    bound = pod_obj("train", requests={"cpu": "1500m", "memory": "1536Mi", keys.GPU_RESOURCE: "2"}, created=10,
                    annotations={keys.MAXIMUM_RUNTIME: "90s"}, owner="Job", node="n1", bound=12, phase="Running",
                    spec={"nodeSelector": {MODEL: "NVIDIA-A100"}})
    assert rec.pod_changed(READ(bound), now=ORIGIN + 12.5) == []
    done = pod_obj("train", requests={"cpu": "1500m", "memory": "1536Mi", keys.GPU_RESOURCE: "2"}, created=10,
                   annotations={keys.MAXIMUM_RUNTIME: "90s"}, owner="Job", node="n1", bound=12, phase="Succeeded",
                   finished=80, spec={"nodeSelector": {MODEL: "NVIDIA-A100"}})
    # seen 5 s after the stamp's second: the API server's stamp stands
    (row,) = rec.pod_changed(READ(done), now=ORIGIN + 85.0)
    got = as_dict(row)
    assert (got["name"], got["cpu_milli"], got["memory_mib"], got["num_gpu"], got["gpu_milli"], got["gpu_spec"]) == (
        "train", "1500", "1536", "2", "1000", "NVIDIA-A100")
    assert (got["creation_time"], got["scheduled_time"], got["deletion_time"]) == ("10.25", "12.5", "80")
    assert (got["pod_phase"], got["end"], got["namespace"], got["owner_kind"], got["declared_runtime"]) == (
        "Succeeded", "Succeeded", "team-a", "Job", "90")
    assert (got["qos"], got["node"], got["uid"], got["gated"], got["end_after"]) == ("Burstable", "n1", "uid-train",
                                                                                    "", "")


def test_a_cpu_pod_without_declared_runtime_deleted_while_running() -> None:
    rec = new_recording()
    rec.pod_changed(READ(pod_obj("web", node="n2", bound=1, phase="Running", created=0.5)), now=ORIGIN + 1.4)
    (row,) = rec.pod_deleted(READ(pod_obj("web", node="n2", bound=1, phase="Running")), now=ORIGIN + 30.125)
    got = as_dict(row)
    assert (got["num_gpu"], got["gpu_milli"], got["gpu_spec"], got["declared_runtime"]) == ("0", "0", "", "")
    assert (got["creation_time"], got["scheduled_time"], got["deletion_time"]) == ("0", "1.4", "30.125")
    assert (got["pod_phase"], got["end"], got["owner_kind"]) == ("Running", "Deleted", "")
    assert rec.pod_deleted(READ(pod_obj("web")), now=ORIGIN + 31) == [], "a row on its way is not made twice"


def test_requests_count_init_containers_and_sidecars_as_kube_scheduler_does() -> None:
    # containers 1 cpu + sidecar 500m = 1500m running; the init container after the sidecar peaks at 3 + 0.5 = 3.5
    init = [{"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"name": "setup", "resources": {"requests": {"cpu": "3", keys.GPU_RESOURCE: "1"}}}]
    seen = READ(pod_obj("init", requests={"cpu": "1", "memory": "1Gi"}, init=init))
    assert (seen.cpu_milli, seen.memory_mib, seen.num_gpu) == (3500, 2048, 1)


def test_a_gated_pod_records_when_its_gates_went() -> None:
    rec = new_recording()
    rec.pod_changed(READ(pod_obj("g", gates=["example.com/hold"], created=0)), now=ORIGIN + 0.3)
    rec.pod_changed(READ(pod_obj("g", created=0)), now=ORIGIN + 7.5)
    rec.pod_changed(READ(pod_obj("g", created=0, node="n", bound=8, phase="Running")), now=ORIGIN + 8.2)
    (row,) = rec.pod_changed(READ(pod_obj("g", created=0, node="n", bound=8, phase="Failed", finished=9)),
                             now=ORIGIN + 9.9)
    got = as_dict(row)
    assert (got["gated"], got["ungated_time"], got["scheduled_time"], got["deletion_time"], got["end"]) == (
        "yes", "7.5", "8.2", "9.9", "Failed")


def test_models_from_required_affinity_only_when_every_term_names_them() -> None:
    def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}
    both = affinity([{"key": MODEL, "operator": "In", "values": ["T4", "A10"]}],
                    [{"key": MODEL, "operator": "In", "values": ["L4"]}, {"key": "zone", "operator": "Exists"}])
    assert READ(pod_obj(spec=both)).gpu_models == ("A10", "L4", "T4")
    open_term = affinity([{"key": MODEL, "operator": "In", "values": ["T4"]}], [{"key": "zone", "operator": "Exists"}])
    assert READ(pod_obj(spec=open_term)).gpu_models == ()


def test_a_node_row_and_control_plane_nodes_left_out() -> None:
    def node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": name, "uid": "u", "labels": labels, "creationTimestamp": T0},
                "spec": {}, "status": {"allocatable": allocatable}}
    rec = new_recording()
    assert rec.node_seen(NodeReader()(node("g1", {MODEL: "Tesla-T4"}, {"cpu": "96", "memory": "384Gi",
                                                                       keys.GPU_RESOURCE: "8"})))
    assert not rec.node_seen(NodeReader()(node("g1", {MODEL: "Tesla-T4"}, {"cpu": "96", "memory": "384Gi",
                                                                           keys.GPU_RESOURCE: "8"})))
    assert rec.node_seen(NodeReader()(node("c1", {MODEL: "ignored"}, {"cpu": "4500m", "memory": "1000Mi"})))
    assert not rec.node_seen(NodeReader()(node("cp", {"node-role.kubernetes.io/control-plane": ""},
                                                {"cpu": "4", "memory": "8Gi"})))
    assert rec.node_rows() == [["c1", "4500", "1000", "0", ""], ["g1", "96000", "393216", "8", "Tesla-T4"]]


def test_a_malformed_pod_is_refused_by_the_reader_not_by_the_recording() -> None:
    bad = pod_obj("bad", requests={"cpu": "lots"})
    with pytest.raises(ViewError):
        READ(bad)
    no_uid = pod_obj("nouid")
    no_uid["metadata"]["uid"] = ""
    with pytest.raises(ViewError):
        READ(no_uid)


# --- hostile strings ---

HOSTILE = ["a\nb", "tab\there", "cr\rlf", "=HYPERLINK(\"http://x\")", "-cmd", "@sum", "\u202eevil", "zero\u200bw",
           "sep\u2028line", "nul\x00", "back\\slash", "quote\"comma,", "x" * 5000, "\x1b[31mred"]


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_fields_carry_no_control_or_line_characters_and_are_capped(text: str) -> None:
    safe = escape(text)
    assert len(safe) <= 253
    assert not any(c in safe for c in "\n\r\t\x00\x1b\u2028\u202e\u200b")
    assert not safe.startswith(("=", "+", "-", "@"))


def test_hostile_strings_written_and_read_back_one_row_each(tmp_path: Path) -> None:
    rec = new_recording()
    rows = []
    for i, text in enumerate(HOSTILE):
        obj = pod_obj(f"p{i}", created=1, node="n", bound=2, phase="Succeeded", finished=3, owner=text,
                      spec={"nodeSelector": {MODEL: text}})
        obj["metadata"]["name"] = text  # the API would refuse most of these: the recorder must not care
        obj["metadata"]["namespace"] = text
        rows.extend(rec.pod_changed(READ(obj), now=ORIGIN + 3.5))
    path = tmp_path / "pods.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(RECORD_COLUMNS)
        writer.writerows(rows)
    assert len(path.read_text(encoding="utf-8").splitlines()) == len(HOSTILE) + 1, "one line per row"
    back = trace.read_pods(path)
    assert len(back) == len(HOSTILE)
    assert all(p.name == escape(t) and "|" not in p.gpu_spec.replace("\\u007c", "") for p, t in zip(back, HOSTILE,
                                                                                                     strict=True))


# --- anonymizing ---

def test_anonymize_hashes_names_alike_across_a_resume_and_differently_under_another_key() -> None:
    key = b"k" * 32
    first = new_recording(key)
    (row,) = first.pod_changed(READ(pod_obj("secret-job", uid="6f1c", namespace="acme-research",
                                            node="gpu-host-10-0-0-1", bound=1, phase="Succeeded", finished=2)),
                               now=ORIGIN + 2)
    resumed = Recording.from_state(first.state_json(), "state", Options(anonymize=True), key)
    (again,) = resumed.pod_changed(READ(pod_obj("secret-job", uid="other", namespace="acme-research",
                                                node="gpu-host-10-0-0-1", bound=1, phase="Succeeded", finished=2)),
                                   now=ORIGIN + 2)
    a, b = as_dict(row), as_dict(again)
    assert (a["name"], a["namespace"], a["node"]) == (b["name"], b["namespace"], b["node"])
    assert a["name"].startswith("pod-") and a["namespace"].startswith("ns-") and a["node"].startswith("node-")
    assert "secret" not in ",".join(row) and "acme" not in ",".join(row) and "10-0-0-1" not in ",".join(row)
    other = new_recording(b"o" * 32)
    (third,) = other.pod_changed(READ(pod_obj("secret-job", namespace="acme-research", node="n", bound=1,
                                              phase="Succeeded", finished=2)), now=ORIGIN + 2)
    assert as_dict(third)["name"] != a["name"]


def test_a_recording_resumes_only_with_its_own_flags() -> None:
    state = new_recording().state_json()
    with pytest.raises(RecordingError, match="--anonymize; resume it with the same flags|--gpu-resource"):
        Recording.from_state(state, "state", Options(anonymize=True), b"k" * 32)
    with pytest.raises(RecordingError, match="not a recording state"):
        Recording.from_state("{", "state", Options(), None)


# --- resume ---

def write_rows(path: Path, rows: list[list[str]]) -> None:
    new = not path.exists()
    with path.open("a", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        if new:
            writer.writerow(RECORD_COLUMNS)
        writer.writerows(rows)


def test_a_crash_between_the_row_and_the_state_writes_no_row_twice(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    rec = new_recording()
    rec.pod_changed(READ(pod_obj("a", created=0, node="n", bound=1, phase="Running")), now=ORIGIN + 1)
    rec.pod_changed(READ(pod_obj("b", created=0)), now=ORIGIN + 1)
    state = rec.state_json()  # saved with both open
    rows = rec.pod_changed(READ(pod_obj("a", created=0, node="n", bound=1, phase="Succeeded", finished=5)),
                           now=ORIGIN + 5.2)
    write_rows(path, rows)  # appended and synced ... and the recorder is killed before the state is saved again
    resumed = Recording.from_state(state, "state", Options(), None)
    resumed.written_uids = read_written_uids(path)
    assert set(resumed.open) == {"uid-a", "uid-b"}
    # the first list after the restart still shows both pods (a Succeeded)
    for obj in (pod_obj("a", created=0, node="n", bound=1, phase="Succeeded", finished=5), pod_obj("b", created=0)):
        assert resumed.pod_changed(READ(obj), now=ORIGIN + 60) == []
    assert resumed.resume(["uid-a", "uid-b"], now=ORIGIN + 60) == []
    assert set(resumed.open) == {"uid-b"}
    assert [p.name for p in trace.read_pods(path)] == ["a"]


def test_a_row_cut_short_by_a_crash_is_cut_off_and_written_again(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    rec = new_recording()
    rows = rec.pod_changed(READ(pod_obj("a", node="n", bound=1, phase="Succeeded", finished=2)), now=ORIGIN + 2)
    rows += rec.pod_changed(READ(pod_obj("b", node="n", bound=1, phase="Running")), now=ORIGIN + 2)
    state = rec.state_json()
    write_rows(path, rows)
    with path.open("a", encoding="utf-8") as handle:
        handle.write("c,1000,1024,0,0,,BestEff")  # the last row, half written
    resumed = Recording.from_state(state, "state", Options(), None)
    resumed.written_uids = read_written_uids(path)
    assert resumed.written_uids == {"uid-a"} and path.read_text().endswith("\n")


def test_a_pod_that_vanished_while_the_recorder_was_down_is_written_with_both_bounds(tmp_path: Path) -> None:
    rec = new_recording()
    rec.pod_changed(READ(pod_obj("gone", created=0, node="n", bound=1, phase="Running")), now=ORIGIN + 1)
    rec.pod_changed(READ(pod_obj("pending", created=0)), now=ORIGIN + 1)
    rec.seen_until = ORIGIN + 40
    resumed = Recording.from_state(rec.state_json(), "state", Options(), None)
    (row,) = resumed.resume(["uid-pending"], now=ORIGIN + 100)
    got = as_dict(row)
    assert (got["name"], got["end"], got["pod_phase"], got["end_after"], got["deletion_time"]) == (
        "gone", "Vanished", "Unknown", "40", "100")
    rest = [as_dict(r) for r in resumed.finish()]
    assert [(r["name"], r["deletion_time"], r["end"], r["pod_phase"]) for r in rest] == [
        ("pending", "", "", "Pending")]


def test_moment_refines_the_stamp_only_within_its_second() -> None:
    assert moment(100.0, 100.4) == 100.4
    assert moment(100.0, 101.5) == 100.0  # seen late: the stamp
    assert moment(100.0, 99.0) == 100.0  # a clock behind the API server's
    assert moment(None, 5.0) == 5.0


# --- the files, without a cluster ---

def test_open_recording_refuses_a_second_recorder_a_finished_recording_and_an_unwritable_dir(tmp_path: Path) -> None:
    settings = record.Settings(out=tmp_path / "rec", duration=60.0, options=Options())
    record.prepare(settings.out)
    with record.locked(settings.out):
        with pytest.raises(RecordingError, match=r"another `reservoir record` \(pid \d+\)"):
            with record.locked(settings.out):
                pass
    done = new_recording()
    done.finish()
    (settings.out / record.STATE_FILE).write_text(done.state_json())
    with pytest.raises(RecordingError, match="finished"):
        record.open_recording(settings, ORIGIN)
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(RecordingError, match="--out .*cannot write there"):
        record.prepare(blocked / "rec")


def test_the_key_is_kept_so_a_resumed_recording_hashes_alike(tmp_path: Path) -> None:
    key = record.anonymize_key(tmp_path)
    assert record.anonymize_key(tmp_path) == key and len(key) == 32
    assert (tmp_path / record.KEY_FILE).stat().st_mode & 0o777 == 0o600


# --- the recording read back and replayed at its own pace ---

def test_the_recording_reads_back_and_replays_as_recorded(tmp_path: Path) -> None:
    rec = new_recording()
    rows = []
    rec.pod_changed(READ(pod_obj("early", created=-30, node="n", bound=-29, phase="Running")), now=ORIGIN)
    rows += rec.pod_changed(READ(pod_obj("a", created=0, node="n", bound=2, phase="Succeeded", finished=50)),
                            now=ORIGIN + 60)
    rows += rec.pod_deleted(READ(pod_obj("cancelled", created=5)), now=ORIGIN + 9)
    rec.pod_changed(READ(pod_obj("waiting", created=70)), now=ORIGIN + 70)
    rows += rec.finish()
    path = tmp_path / "pods.csv"
    write_rows(path, rows)
    pods = trace.read_pods(path)
    assert {p.name: (p.creation_time, p.scheduled_time, p.deletion_time) for p in pods} == {
        "a": (0, 2, 50), "cancelled": (5, None, 9), "early": (-30, -29, None), "waiting": (70, None, None)}
    replay = trace.replay(pods, arrival_seconds=None, runtime_factor=1, runtime_floor=0, runtime_cap=math.inf,
                          unended=True)
    # every arrival as recorded from the first one; the trace's last moment is 70: "early" runs from its bind to it
    assert {p.name: (p.arrival, p.runtime) for p in replay.pods} == {
        "early": (0, 99), "a": (30, 48), "waiting": (100, 0)}
    assert replay.skipped == 1 and replay.factor == 1.0
    # without `unended`, as before: only pods with both times
    assert [p.name for p in trace.replay(pods, arrival_seconds=None, runtime_factor=1, runtime_floor=0,
                                         runtime_cap=math.inf).pods] == ["a"]


# --- the recorder's loop against a stand-in API server (no cluster) ---

class StandInApi:
    """Lists from `objects` by path; a watch streams what `send` queues for its path."""

    def __init__(self) -> None:
        self.objects: dict[str, list[dict[str, Any]]] = {"/api/v1/pods": [], "/api/v1/nodes": []}
        self.queues: dict[str, asyncio.Queue[bytes]] = {p: asyncio.Queue() for p in self.objects}

    def send(self, path: str, kind: str, obj: dict[str, Any]) -> None:
        self.queues[path].put_nowait(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":  # ended after a quiet 0.2 s (the cache watches again)
            response = web.StreamResponse(status=200)
            await response.prepare(request)
            while True:
                try:
                    line = await asyncio.wait_for(self.queues[request.path].get(), 0.2)
                except TimeoutError:
                    await response.write_eof()
                    return response
                await response.write(line)
        body = {"kind": "List", "metadata": {"resourceVersion": "1"}, "items": self.objects[request.path]}
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")


async def until(predicate: Any) -> None:
    """Wait (at most 4 s) until `predicate()` holds."""
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


async def run_recorder(tmp_path: Path, api_server: StandInApi, steps: Any) -> tuple[bool, record.Recorder]:
    settings = record.Settings(out=tmp_path, duration=math.inf, options=Options())
    recording = record.open_recording(settings, ORIGIN)
    pods_path = tmp_path / record.PODS_FILE
    if not pods_path.exists():
        pods_path.write_text(",".join(RECORD_COLUMNS) + "\n")
    with pods_path.open("a", newline="", encoding="utf-8") as handle:
        recorder = record.Recorder(settings, recording, handle, None)
        async with loopback_api(api_server.handle, "GET") as api:
            task = asyncio.create_task(recorder.run(api))
            await steps(recorder)
            recorder.stop.set()
            finished = await asyncio.wait_for(task, 10)
    return finished, recorder


async def test_the_recorder_writes_ended_pods_skips_poison_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    server = StandInApi()
    server.objects["/api/v1/nodes"] = [{"metadata": {"name": "n1", "uid": "n", "creationTimestamp": T0},
                                        "status": {"allocatable": {"cpu": "8", "memory": "16Gi",
                                                                   keys.GPU_RESOURCE: "2"}}}]
    server.objects["/api/v1/pods"] = [pod_obj("listed", created=-5, node="n1", bound=-4, phase="Running")]

    async def first_run(recorder: record.Recorder) -> None:
        await until(lambda: recorder.recording.pods_seen == 1)
        server.send("/api/v1/pods", "ADDED", pod_obj("short", created=1))
        poison = pod_obj("poison", requests={"cpu": "banana"})
        server.send("/api/v1/pods", "ADDED", poison)
        server.send("/api/v1/pods", "MODIFIED", pod_obj("short", created=1, node="n1", bound=2, phase="Succeeded",
                                                         finished=3))
        await until(lambda: recorder.rows_written == 1 and recorder.skipped == 1)

    finished, recorder = await run_recorder(tmp_path, server, first_run)
    assert not finished and recorder.rows_written == 1
    assert [p.name for p in trace.read_pods(tmp_path / "pods.csv")] == ["short"]
    assert trace.read_nodes(tmp_path / "nodes.csv")[0].gpu == 2
    assert set(Recording.from_state((tmp_path / record.STATE_FILE).read_text(), "s", Options(), None).open) == {
        "uid-listed"}

    # resumed: "listed" vanished while it was down, "short" is still listed and already written
    server = StandInApi()
    server.objects["/api/v1/pods"] = [pod_obj("short", created=1, node="n1", bound=2, phase="Succeeded", finished=3)]

    async def second_run(recorder: record.Recorder) -> None:
        await until(lambda: recorder.rows_written == 1)

    _, recorder = await run_recorder(tmp_path, server, second_run)
    back = {p.name: p for p in trace.read_pods(tmp_path / "pods.csv")}
    assert sorted(back) == ["listed", "short"] and back["listed"].pod_phase == "Unknown"
    assert rows_of(tmp_path / "pods.csv")["listed"]["end"] == "Vanished"


def rows_of(path: Path) -> dict[str, dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return {row["name"]: row for row in csv.DictReader(handle)}


# --- the hostile review's findings ---

def test_a_pod_naming_thousands_of_long_models_keeps_the_file_readable(tmp_path: Path) -> None:
    """One affinity term listing 3,000 models of 61 characters: at most MAX_MODELS of them are written, so the row
    stays under the csv module's field limit and pods.csv reads back (it was 189,000 characters, and every resume
    and every simulate of the recording failed); a pods.csv that is not CSV is refused by name, not with a
    traceback."""
    from agent.recording import MAX_MODELS

    values = [f"model-{i:04d}-" + "x" * 50 for i in range(3000)]
    term = {"matchExpressions": [{"key": MODEL, "operator": "In", "values": values}]}
    obj = pod_obj("wide", created=1, node="n", bound=2, phase="Succeeded", finished=3,
                  spec={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                      "nodeSelectorTerms": [term]}}}})
    (row,) = new_recording().pod_changed(READ(obj), now=ORIGIN + 3.5)
    assert len(as_dict(row)["gpu_spec"].split("|")) == MAX_MODELS
    path = tmp_path / "pods.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(RECORD_COLUMNS)
        writer.writerow(row)
    assert [p.name for p in trace.read_pods(path)] == ["wide"]
    assert read_written_uids(path) == {"uid-wide"}
    path.write_text(",".join(RECORD_COLUMNS) + "\n\"" + "x" * 200_000 + "\",a\n")
    with pytest.raises(RecordingError, match="unreadable as CSV"):
        read_written_uids(path)


def test_anonymize_hashes_the_uid_custom_owner_kinds_and_models_no_node_carries() -> None:
    """Under --anonymize the uid is hashed too (a uid maps back to a name for anyone with the cluster's audit log),
    an owner kind outside Kubernetes' own (a custom controller names a product) is written Other, and a model no
    node carries (a tenant's string) is hashed; a model a node carries (the operator's label) is kept."""
    rec = new_recording(b"k" * 32)
    rec.node_seen(NodeReader()({"metadata": {"name": "g1", "uid": "u", "labels": {MODEL: "Tesla-T4"},
                                             "creationTimestamp": T0},
                                "spec": {}, "status": {"allocatable": {"cpu": "8", "memory": "8Gi",
                                                                       keys.GPU_RESOURCE: "1"}}}))
    term = {"matchExpressions": [{"key": MODEL, "operator": "In", "values": ["Tesla-T4", "ProjectNebula-X"]}]}
    obj = pod_obj("p", uid="6f1c-secret", created=1, node="g1", bound=2, phase="Succeeded", finished=3,
                  owner="AcmeSecretTrainer", spec={"affinity": {"nodeAffinity": {
                      "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}})
    got = as_dict(new_row := rec.pod_changed(READ(obj), now=ORIGIN + 3.5)[0])
    assert got["uid"].startswith("uid-") and "6f1c" not in ",".join(new_row)
    assert got["owner_kind"] == "Other" and "Acme" not in ",".join(new_row) and "Nebula" not in ",".join(new_row)
    kept, hashed = sorted(got["gpu_spec"].split("|"), key=lambda m: m != "Tesla-T4")
    assert kept == "Tesla-T4" and hashed.startswith("model-")
    plain = new_recording()
    (row,) = plain.pod_changed(READ(pod_obj("q", created=1, node="n", bound=2, phase="Succeeded", finished=3,
                                            owner="AcmeSecretTrainer")), now=ORIGIN + 3.5)
    assert as_dict(row)["owner_kind"] == "AcmeSecretTrainer"  # without --anonymize, as the pod says


async def test_a_pod_whose_new_version_is_unreadable_is_not_written_as_deleted(tmp_path: Path) -> None:
    """The pods cache drops a pod whose new version it cannot read and reports it DELETED: the pod still exists, so
    the recorder keeps it open (it was written "Deleted" at that moment, and its real end never); once readable
    again it is followed to its real end."""
    server = StandInApi()
    server.objects["/api/v1/nodes"] = []
    server.objects["/api/v1/pods"] = [pod_obj("resized", created=-5, node="n1", bound=-4, phase="Running")]

    async def steps(recorder: record.Recorder) -> None:
        await until(lambda: recorder.recording.pods_seen == 1)
        server.send("/api/v1/pods", "MODIFIED", pod_obj("resized", created=-5, node="n1", bound=-4, phase="Running",
                                                         requests={"cpu": "banana"}))
        await until(lambda: recorder.skipped == 1)
        await asyncio.sleep(0.2)
        assert recorder.rows_written == 0 and "uid-resized" in recorder.recording.open
        server.send("/api/v1/pods", "MODIFIED", pod_obj("resized", created=-5, node="n1", bound=-4,
                                                         phase="Succeeded", finished=3))
        await until(lambda: recorder.rows_written == 1)

    await run_recorder(tmp_path, server, steps)
    assert rows_of(tmp_path / "pods.csv")["resized"]["end"] == "Succeeded"


def test_files_a_local_user_planted_are_not_followed_and_written_uids_do_not_grow(tmp_path: Path) -> None:
    """record.lock planted as a link to another file: refused, and the target untouched (the lock used to follow it
    and truncate it); the state's temporary file is a fresh mkstemp name. A pod written, then deleted, leaves the
    recorder's memory (a day's recording on a busy cluster held every uid ever written)."""
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / record.LOCK_FILE).symlink_to(target)
    with pytest.raises(RecordingError, match="must be a plain file"), record.locked(tmp_path):
        pass
    assert target.read_text() == "keep me"
    (tmp_path / f".{record.STATE_FILE}.tmp").symlink_to(target)  # the old fixed temporary name
    record.write_atomically(tmp_path / record.STATE_FILE, lambda handle: handle.write("{}"))
    assert target.read_text() == "keep me" and (tmp_path / record.STATE_FILE).read_text() == "{}"
    assert (tmp_path / record.STATE_FILE).stat().st_mode & 0o077 == 0
    rec = new_recording()
    done = READ(pod_obj("d", created=1, node="n", bound=2, phase="Succeeded", finished=3))
    (row,) = rec.pod_changed(done, now=ORIGIN + 3.5)
    rec.written(as_dict(row)["uid"])
    assert rec.pod_changed(done, now=ORIGIN + 4) == [] and "uid-d" in rec.written_uids  # still listed: ignored
    assert rec.pod_deleted(done, now=ORIGIN + 5) == [] and "uid-d" not in rec.written_uids


def test_a_pods_csv_with_other_columns_is_refused_not_appended_to(tmp_path: Path) -> None:
    """A pods.csv whose header is not the recording's (columns reordered by hand, another tool's file): refused by
    name, since rows appended to it would land under the wrong columns."""
    path = tmp_path / "pods.csv"
    path.write_text(",".join(reversed(RECORD_COLUMNS)) + "\n")
    with pytest.raises(RecordingError, match="are not the ones `reservoir record` writes"):
        read_written_uids(path)
    path.write_text(",".join(RECORD_COLUMNS) + "\n")
    assert read_written_uids(path) == set()


def test_a_pod_a_relist_lacks_is_written_vanished_between_the_watchs_last_word_and_the_relist() -> None:
    """Deleted while the watch was down (an outage, a 410): not "Deleted at the relist", which would stretch its
    runtime by the outage, but Vanished with both bounds, as after a restart; a pod already written leaves memory."""
    rec = new_recording()
    running = READ(pod_obj("r", created=1, node="n", bound=2, phase="Running"))
    assert rec.pod_changed(running, now=ORIGIN + 2.5) == []
    (row,) = rec.pod_vanished(running, now=ORIGIN + 100, known_until=ORIGIN + 40)
    got = as_dict(row)
    assert (got["end"], got["pod_phase"], got["deletion_time"], got["end_after"]) == ("Vanished", "Unknown", "100",
                                                                                      "40")


@pytest.mark.parametrize("key", [None, b"k" * 32], ids=["plain", "anonymize"])
def test_a_written_pod_leaves_the_state_and_is_not_written_again_after_a_resume(tmp_path: Path,
                                                                                  key: bytes | None) -> None:
    """The recorder tells the recording which rows it appended by their uid column, which --anonymize hashes: the
    pod still leaves the open pods (under --anonymize it stayed in them, and in every saved state, for the whole
    run), a resumed run whose first list lacks it writes no second row (it wrote one more, Vanished), and a resumed
    run counts each pod once."""
    rec = new_recording(key)
    path = tmp_path / "pods.csv"
    rows = rec.pod_changed(READ(pod_obj("a", created=0, node="n", bound=1, phase="Running")), now=ORIGIN + 1)
    rec.pod_changed(READ(pod_obj("b", created=0)), now=ORIGIN + 1)
    rows = rec.pod_changed(READ(pod_obj("a", created=0, node="n", bound=1, phase="Succeeded", finished=4)),
                           now=ORIGIN + 4)
    write_rows(path, rows)
    for row in rows:
        rec.written(as_dict(row)["uid"])
    assert set(rec.open) == {"uid-b"} and rec.made == {}
    assert "uid-a" not in json.loads(rec.state_json())["open"]
    assert rec.pod_changed(READ(pod_obj("a", created=0, node="n", bound=1, phase="Succeeded", finished=4)),
                           now=ORIGIN + 5) == [], "still listed, already written: ignored"
    resumed = Recording.from_state(rec.state_json(), "state", rec.options, key)
    resumed.written_uids = read_written_uids(path)
    assert resumed.resume(["uid-b"], now=ORIGIN + 60) == [], "a is gone and already written: no Vanished row"
    assert set(resumed.open) == {"uid-b"}
    again = Recording.from_state(rec.state_json(), "state", rec.options, key)
    again.written_uids = read_written_uids(path)
    assert again.resume(["uid-a", "uid-b"], now=ORIGIN + 60) == []
    assert again.pod_deleted(READ(pod_obj("a", created=0, node="n", bound=1, phase="Succeeded", finished=4)),
                             now=ORIGIN + 61) == [] and again.written_uids == set()
