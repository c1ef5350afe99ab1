"""`python -m localcluster up`: run a local control plane in the foreground until Ctrl-C (what `make up` runs)."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from localcluster import binaries
from localcluster.agent_process import AgentProcess
from localcluster.cluster import ClusterError, LocalCluster, kwok_node
from localcluster.kueue_process import KueueManager
from localcluster.webhook_process import WebhookProcess

REPO = Path(__file__).resolve().parents[1]


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _demo_nodes(count: int) -> str:
    return yaml.safe_dump_all([kwok_node(f"kwok-node-{i}", {"cpu": "8", "memory": "32Gi"}) for i in range(count)])


KUEUE_HINTS = """
Kueue's manager runs too (log in its temporary directory), and Reservoir reads its Workloads:
  kubectl apply -f examples/kueue-queues.yaml             # a ClusterQueue with quota, a LocalQueue in default
  kubectl apply -f examples/seed-000-starvation.yaml      # small pods fill kwok-node-0 (its config: kueue off)
  kubectl apply -f examples/kueue-config.yaml             # ...so switch Kueue's Workloads back on
  kubectl apply -f examples/kueue-big-job.yaml            # an admitted Kueue Job needing the whole node
  kubectl get workloads; reservoir status                 # the node locked for its Workload's job
"""


def up(args: argparse.Namespace) -> int:
    bin_dir = binaries.ensure_built()
    cluster = LocalCluster(bin_dir=bin_dir, log=_log)
    try:
        cluster.start()
    except ClusterError as err:
        _log(f"localcluster: failed to start: {err}")
        return 1
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    webhook = WebhookProcess(cluster)
    agent = AgentProcess(cluster)
    kueue = KueueManager(cluster) if args.kueue else None
    try:
        kubectl = cluster.kubectl
        subprocess.run([*kubectl, "apply", "-k", str(REPO / "deploy" / "crds")], check=True)
        subprocess.run([*kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"], check=True)
        manifests = ("namespace.yaml", "webhook-rbac.yaml", "agent-rbac.yaml", "priorityclass.yaml",
                     "critical-priority-policy.yaml", "configmap.yaml")
        for manifest in manifests:
            subprocess.run([*kubectl, "apply", "-f", str(REPO / "deploy" / manifest)], check=True)
        subprocess.run([*kubectl, "apply", "-f", "-"], input=_demo_nodes(args.nodes).encode(), check=True)
        if kueue is not None:  # issue 32: Kueue's manager, Reservoir's Kueue component and its switch
            kueue.install()
            kueue.start()
            subprocess.run([*kubectl, "apply", "-f", str(REPO / "deploy" / "components" / "kueue" / "rbac.yaml")],
                           check=True)
            subprocess.run([*kubectl, "apply", "-f", str(REPO / "examples" / "kueue-config.yaml")], check=True)
        webhook.start()
        webhook.register(kubectl)
        agent.start()
        print(f"""
Reservoir's local cluster is up ({cluster.start_seconds:.1f}s): {cluster.server}
webhook: {webhook.url} (log {webhook.log_path}), registered as MutatingWebhookConfiguration and
ValidatingWebhookConfiguration "reservoir"
agent: running as ServiceAccount reservoir-agent (log {agent.log_path})

  export KUBECONFIG={cluster.kubeconfig}
  export PATH={bin_dir}:{REPO / ".venv" / "bin"}:$PATH
  kubectl get nodes
  reservoir status          # every lock, starving jobs, windows, queue guarantees

Each example is played on a fresh `make up` (Ctrl-C, then `make up` again: seconds once built), as its page shows,
with what it prints:
  docs/getting-started.md            seed 000, starvation: examples/seed-000-starvation.yaml, seed-000-big-pod.yaml
  docs/concepts/queue-priority.md    seed 001: examples/seed-001-queue-priority.yaml
  docs/concepts/queue-guarantees.md  seed 002: examples/seed-002-queue-guarantee.yaml
  docs/concepts/reservations.md      seed 003: examples/seed-003-reservation.yaml, seed-003-owner.yaml
  docs/concepts/windows.md           seed 004: examples/seed-004-window.yaml, seed-004-reserve-pod.yaml
  docs/concepts/backfill.md          backfill: examples/backfill.yaml, backfill-report.yaml
  docs/concepts/entitlement.md       a forged toleration refused: examples/forged-toleration.yaml
{KUEUE_HINTS if kueue is not None else ""}
Ctrl-C stops every process this started and removes {cluster.workdir}.
""", flush=True)
        while not stop:
            cluster.check_alive()
            if not webhook.running():
                raise ClusterError(f"webhook exited:\n{webhook.log_text()[-2000:]}")
            if not agent.running():
                raise ClusterError(f"agent exited:\n{agent.log_text()[-2000:]}")
            if kueue is not None and not kueue.running():
                raise ClusterError(f"kueue exited:\n{kueue.log_tail()}")
            time.sleep(1)
    except ClusterError as err:
        _log(f"localcluster: {err}")
        return 1
    finally:
        _log("localcluster: stopping")
        agent.stop()
        webhook.stop()
        if kueue is not None:
            kueue.stop()
        cluster.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("up", help="start the local cluster and keep it running until Ctrl-C")
    run.add_argument("--nodes", type=int, default=3, help="how many kwok nodes to create (default 3)")
    run.add_argument("--kueue", action="store_true", help="also run Kueue's manager, with Reservoir reading its "
                                                          "Workloads (docs/tasks/kueue.md)")
    run.set_defaults(run=up)
    build = commands.add_parser("build", help="build the control-plane binaries (cached)")
    build.set_defaults(run=lambda _: print(binaries.ensure_built()) or 0)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
