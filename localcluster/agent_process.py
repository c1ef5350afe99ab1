"""Run `reservoir agent` as a real process against the local cluster, as its ServiceAccount (impersonated), so
a permission missing from deploy/agent-rbac.yaml fails where it is used. Used by `make up` and the tests."""

from __future__ import annotations

from localcluster.cluster import LocalCluster
from localcluster.process import ReservoirProcess

AGENT_USER = "system:serviceaccount:reservoir-system:reservoir-agent"


class AgentProcess(ReservoirProcess):
    name = "agent"

    def __init__(self, cluster: LocalCluster, identity: str = "agent-0", metrics_port: int = 0) -> None:
        super().__init__()
        self.cluster = cluster
        self.identity = identity
        self.metrics_port = metrics_port  # 0: no metrics server

    def start(self, env: dict[str, str] | None = None) -> None:
        self.spawn(["agent", f"--kubeconfig={self.cluster.kubeconfig}", f"--as={AGENT_USER}",
                    f"--metrics-port={self.metrics_port}", f"--identity={self.identity}"], env=env)
