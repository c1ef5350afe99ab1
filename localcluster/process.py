"""A `reservoir` subcommand run as a real process beside the local cluster (make up and the tests)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class ReservoirProcess:
    """`python -m reservoir <args>` with its log in a temporary directory; stop() removes the directory."""

    name = "reservoir"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"reservoir-{self.name}-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"

    def spawn(self, args: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "reservoir", *args], stdout=log,
                                            stderr=subprocess.STDOUT, cwd=REPO,
                                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.running():
            assert self.process is not None
            self.process.kill()
            self.process.wait()

    def stop(self, remove_files: bool = True) -> None:
        """SIGTERM, SIGKILL after 10 s; then remove the certificates and log unless told to keep them."""
        if self.running():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if remove_files:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(log removed)"
