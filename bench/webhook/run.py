"""`make bench-webhook`: the pod mutate route against a no-op route on the same server, side by side in one run.

The server (one process, pinned to core 0) is the real aiohttp app over HTTPS; the load comes from a separate
Go process (bench/webhook/loadgen, pinned to core 1) sending a realistic Volcano job pod AdmissionReview.
Closed loop at a fixed concurrency gives throughput; open loop at 500 req/s gives latency.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from certs.rotation import Subject, ensure
from localcluster.cluster import free_port
from shared import keys

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CONCURRENCY = 32
SECONDS = "10s"
RATE = 500

POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"generateName": "job-7-worker-", "namespace": "ns-7",
                 "labels": {"app": "svc-3", "volcano.sh/job-name": "job-7"},
                 "annotations": {keys.GROUP_NAME: "job-7", "volcano.sh/task-spec": "worker"},
                 "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "job-7",
                                      "uid": "6c2c3a4e-0000-4000-8000-000000000007", "controller": True}]},
    "spec": {
        "initContainers": [{"name": "fetch", "image": "busybox",
                            "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}},
                           {"name": "log-shipper", "image": "fluent-bit", "restartPolicy": "Always",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
        "containers": [{"name": "trainer", "image": "pytorch:2", "resources": {
            "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]}}},
        "priority": 0, "schedulerName": "default-scheduler",
    },
}


def review() -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "bench", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "namespace": "ns-7", "object": POD}}).encode()


def loadgen(binary: Path, url: str, body: Path, ca: Path, *extra: str) -> dict:
    out = subprocess.run(["taskset", "-c", "1", str(binary), f"-url={url}", f"-body={body}", f"-ca={ca}",
                          f"-duration={SECONDS}", *extra], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    binary = Path(sys.argv[1])
    work = Path(tempfile.mkdtemp(prefix="reservoir-bench-"))
    ensure(work, Subject("reservoir-webhook", "reservoir-system", ips=("127.0.0.1",)))
    body = work / "review.json"
    body.write_bytes(review())
    port = free_port()
    server = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "bench.webhook.serve",
                               f"--cert={work / 'tls.crt'}", f"--key={work / 'tls.key'}", f"--port={port}"], cwd=REPO,
                              stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        base = f"https://127.0.0.1:{port}"
        ca = work / "ca-bundle.crt"
        noop = loadgen(binary, f"{base}/noop", body, ca, f"-concurrency={CONCURRENCY}")
        mutate = loadgen(binary, f"{base}/mutate/pods", body, ca, f"-concurrency={CONCURRENCY}")
        noop_rate = loadgen(binary, f"{base}/noop", body, ca, f"-rate={RATE}")
        mutate_rate = loadgen(binary, f"{base}/mutate/pods", body, ca, f"-rate={RATE}")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'route':<14}{'mode':<26}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
    for name, r in (("noop", noop), ("mutate/pods", mutate), ("noop", noop_rate), ("mutate/pods", mutate_rate)):
        mode = f"closed, {r['concurrency']} in flight" if r["mode"] == "closed" else f"open, {r['target_rate']} req/s"
        print(f"{name:<14}{mode:<26}{r['rps']:>9.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{r['errors']:>8}")
    ratio = mutate["rps"] / noop["rps"]
    print(f"webhook: mutate/noop throughput ratio {ratio:.2f}, mutate p99 at {RATE} req/s "
          f"{mutate_rate['p99_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
