"""`reservoir`: the one command-line entry point."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from shared import keys
from shared.config import ConfigError, load_config


def _check_config(args: argparse.Namespace) -> int:
    text = Path(args.file).read_text() if args.file != "-" else sys.stdin.read()
    try:
        config = load_config(text)
    except ConfigError as err:
        print(f"{args.file}: invalid: {err}", file=sys.stderr)
        return 1
    print(f"{args.file}: valid ({len(config.windows)} windows, dryRun={str(config.dry_run).lower()})")
    return 0


def _webhook(args: argparse.Namespace) -> int:
    from webhook.main import run

    asyncio.run(run(Path(args.cert_file), Path(args.key_file), args.host, args.port, args.kubeconfig, args.namespace,
                    impersonate=args.impersonate))
    return 0


def _certs(args: argparse.Namespace) -> int:
    from certs.cli import run

    actions = asyncio.run(run(Path(args.out_dir), args.service, args.namespace, args.dns, args.ip, args.inject,
                              args.secret, args.kubeconfig))
    for action in actions:
        print(action)
    return 0


def _agent(args: argparse.Namespace) -> int:
    from agent.controller import run
    from shared.kube import own_namespace

    # the Lease follows the agent's own namespace, never --namespace by accident
    lease_namespace = args.lease_namespace or own_namespace(keys.NAMESPACE)
    asyncio.run(run(args.kubeconfig, args.namespace, args.metrics_port, impersonate=args.impersonate,
                    identity=args.identity, lease_namespace=lease_namespace))
    return 0


def _status(args: argparse.Namespace) -> int:
    from agent.commands import status

    print(asyncio.run(status(args.kubeconfig, args.namespace, args.output, queues=args.queues)))
    return 0


def _release(args: argparse.Namespace) -> int:
    from agent.commands import release

    if not args.all and not args.nodes:
        print("reservoir release: name nodes, or --all to release every Reservoir lock", file=sys.stderr)
        return 2
    for line in asyncio.run(release(args.kubeconfig, args.nodes, args.all)):
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reservoir", description="Reserve Kubernetes capacity for batch workloads.")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser("check-config", help="validate a config.yaml with the same model the agent uses")
    check.add_argument("file", help="path to config.yaml, or - for standard input")
    check.set_defaults(run=_check_config)

    webhook = commands.add_parser("webhook", help="run the admission webhook (HTTPS)")
    webhook.add_argument("--cert-file", required=True, help="serving certificate (re-read when it changes)")
    webhook.add_argument("--key-file", required=True, help="serving key (re-read when it changes)")
    webhook.add_argument("--host", default="0.0.0.0")
    webhook.add_argument("--port", type=int, default=8443)
    webhook.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, else in-cluster")
    webhook.add_argument("--namespace", default=keys.NAMESPACE, help="where the reservoir-config ConfigMap lives")
    webhook.add_argument("--as", dest="impersonate", default=None,
                         help="act as this user, like kubectl --as (e.g. its ServiceAccount, to test RBAC)")
    webhook.set_defaults(run=_webhook)

    certs = commands.add_parser("certs", help="create or renew the webhook certificates and inject the CA bundle")
    certs.add_argument("--out-dir", required=True, help="ca.crt, ca.key, ca-bundle.crt, tls.crt, tls.key go here")
    certs.add_argument("--service", default="reservoir-webhook", help="the webhook Service name (for DNS SANs)")
    certs.add_argument("--namespace", default=keys.NAMESPACE)
    certs.add_argument("--dns", action="append", default=[], help="extra DNS SAN (repeatable)")
    certs.add_argument("--ip", action="append", default=[], help="IP SAN such as 127.0.0.1 (repeatable)")
    certs.add_argument("--inject", action="append", default=[],
                       help="webhook configuration name whose caBundle is set (repeatable)")
    certs.add_argument("--secret", default=None, help="also write a kubernetes.io/tls Secret of this name")
    certs.add_argument("--kubeconfig", default=None)
    certs.set_defaults(run=_certs)

    agent = commands.add_parser("agent", help="run the node-lock agent")
    agent.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, else in-cluster")
    agent.add_argument("--namespace", default=keys.NAMESPACE, help="where the reservoir-config ConfigMap lives")
    agent.add_argument("--lease-namespace", default=None,
                       help="where the reservoir-agent Lease lives (default: the agent's own namespace, from the "
                            f"in-cluster service account, else {keys.NAMESPACE}; not --namespace)")
    agent.add_argument("--metrics-port", type=int, default=9090, help="/metrics, /healthz, /readyz (0: off)")
    agent.add_argument("--identity", default=None, help="leader-election identity (default host-pid)")
    agent.add_argument("--as", dest="impersonate", default=None, help="act as this user, like kubectl --as")
    agent.set_defaults(run=_agent)

    status = commands.add_parser("status", help="every lock, starving jobs and windows")
    status.add_argument("--kubeconfig", default=None)
    status.add_argument("--namespace", default=keys.NAMESPACE)
    status.add_argument("--output", "-o", choices=("table", "json"), default="table")
    status.add_argument("--queues", action="store_true", help="each queue's QueueScoreOrder score and its parts")
    status.set_defaults(run=_status)

    release = commands.add_parser("release", help="remove Reservoir's locks from nodes (and nothing else)")
    release.add_argument("nodes", nargs="*", help="node names")
    release.add_argument("--all", action="store_true", help="every node carrying a Reservoir lock")
    release.add_argument("--kubeconfig", default=None)
    release.set_defaults(run=_release)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
