"""Run `reservoir agent` as a real process against the local cluster, as its ServiceAccount (impersonated), so
a permission missing from deploy/agent-rbac.yaml fails where it is used. Used by `make up` and the tests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from localcluster.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
AGENT_USER = "system:serviceaccount:reservoir-system:reservoir-agent"


class AgentProcess:
    def __init__(self, cluster: LocalCluster, identity: str = "agent-0") -> None:
        self.cluster = cluster
        self.identity = identity
        self.dir = Path(tempfile.mkdtemp(prefix="reservoir-agent-"))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log = open(self.dir / "agent.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "shared.cli", "agent", f"--kubeconfig={self.cluster.kubeconfig}",
             f"--as={AGENT_USER}", "--metrics-port=0", f"--identity={self.identity}"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        )

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, remove_files: bool = True) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if remove_files:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return (self.dir / "agent.log").read_text(errors="replace")
        except OSError:
            return "(log removed)"
