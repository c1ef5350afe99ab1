"""`reservoir`: the one command-line entry point."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvloop

from shared import keys, logs
from shared.config import ConfigError, load_config
from shared.tracecsv import REPLAY_SETTING
from shared.version import version

if TYPE_CHECKING:
    from webhook.certs_secret import SecretSource

WEBHOOK_CONFIGURATION = "reservoir"  # deploy/webhook-configurations.yaml: the Mutating and the Validating one


def _serve(main: Coroutine[Any, Any, None]) -> None:
    """Run a long-running program (the webhook, the agent) on uvloop's event loop. Issue 15: an idle agent's cpu is
    the watch events it reads (a node's status update every 20-45 s on the local cluster's kwok nodes, 3,000-5,000 a
    minute at 1,000 nodes), and most of each event's cost is the event loop and TLS, not Reservoir: reading one event
    from the node watch took 237 us of cpu on asyncio's loop and 176 us on uvloop's (bench/scale,
    docs/tasks/big-clusters.md)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


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

    files = (args.cert_file, args.key_file)
    if args.manage_certs == any(files) or any(files) != all(files):
        print("reservoir webhook: give --cert-file and --key-file, or --manage-certs (not both)", file=sys.stderr)
        return 2
    secret = _managed_certs(args) if args.manage_certs else None
    cert_file, key_file = (Path(args.cert_file), Path(args.key_file)) if args.cert_file else (None, None)
    _serve(run(cert_file, key_file, args.host, args.port, args.kubeconfig, args.namespace,
               impersonate=args.impersonate, secret=secret))
    return 0


def _managed_certs(args: argparse.Namespace) -> SecretSource:
    """--manage-certs: the Secret the webhook serves from, and the elected writer that keeps it and the caBundle."""
    from certs.manager import CertWriter, Settings
    from certs.rotation import Subject
    from shared.duration import parse_duration
    from shared.kube import own_namespace
    from webhook.certs_secret import SecretSource

    namespace = args.cert_namespace or own_namespace(keys.NAMESPACE)
    settings = Settings(
        secret=args.cert_secret, namespace=namespace,
        subject=Subject(args.service, namespace, tuple(args.cert_dns), tuple(args.cert_ip)),
        configurations=tuple(args.webhook_configuration or [WEBHOOK_CONFIGURATION]),
        validity=parse_duration(args.cert_validity), ca_validity=parse_duration(args.ca_validity))
    return SecretSource(namespace, args.cert_secret, CertWriter(settings).run)


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
    _serve(run(args.kubeconfig, args.namespace, args.metrics_port, impersonate=args.impersonate,
               identity=args.identity, lease_namespace=lease_namespace))
    return 0


def _quiet_retries(args: argparse.Namespace) -> None:
    """A command run by hand ends with one line when it fails: the list retries it makes on the way are not shown
    (with -v they are)."""
    if not args.verbose:
        logging.getLogger("reservoir.watchcache").setLevel(logging.ERROR)


def _status(args: argparse.Namespace) -> int:
    from agent.commands import status, why

    _quiet_retries(args)
    if args.why:
        if args.queues:
            print("reservoir status: --why and --queues do not go together", file=sys.stderr)
            return 2
        shown = asyncio.run(why(args.kubeconfig, args.namespace or "default", args.why, args.reservoir_namespace,
                                args.output, context=args.context))
    else:  # without --why, -n names Reservoir's namespace, as before --reservoir-namespace existed
        shown = asyncio.run(status(args.kubeconfig, args.namespace or args.reservoir_namespace, args.output,
                                   queues=args.queues, context=args.context))
    if shown.warning:
        print(f"warning: {shown.warning}", file=sys.stderr)
    print(shown.text)
    return 0


def _release(args: argparse.Namespace) -> int:
    from agent.commands import release

    if not args.all and not args.nodes:
        print("reservoir release: name nodes, or --all to release every Reservoir lock", file=sys.stderr)
        return 2
    _quiet_retries(args)
    for line in asyncio.run(release(args.kubeconfig, args.nodes, args.all, context=args.context)):
        print(line)
    return 0


def _uninstall(args: argparse.Namespace) -> int:
    from agent.uninstall import Uninstall, run

    _quiet_retries(args)
    asyncio.run(run(args.kubeconfig, Uninstall(crds=args.crds, leave_install=args.leave_install),
                    context=args.context, out=lambda line: print(line, flush=True)))
    return 0


def _record(args: argparse.Namespace) -> int:
    """`reservoir record`: agent/record.py. Errors of the flags or of --out end it with one line naming the flag."""
    import math

    from agent.record import Settings, record
    from agent.recording import Options, RecordingError
    from shared.duration import DurationError, parse_duration

    def fail(message: str) -> int:
        print(f"reservoir record: {message}", file=sys.stderr)
        return 2

    duration = math.inf
    if args.duration != "0":
        try:
            seconds = parse_duration(args.duration).total_seconds()
        except DurationError as err:
            return fail(f"--duration: {err} (e.g. --duration 24h; 0 records until stopped)")
        if seconds <= 0:
            return fail(f"--duration {args.duration}: expected a duration above 0, such as 24h (0 records until "
                        f"stopped)")
        duration = seconds
    for flag, value in (("--gpu-resource", args.gpu_resource), ("--gpu-model-label", args.gpu_model_label)):
        if not value or any(c.isspace() for c in value):
            return fail(f"{flag} {value!r}: expected a resource or label name such as nvidia.com/gpu")
    _quiet_retries(args)
    settings = Settings(out=Path(args.out), duration=duration, kubeconfig=args.kubeconfig, context=args.context,
                        quiet=args.quiet, options=Options(anonymize=args.anonymize, gpu_resource=args.gpu_resource,
                                                          gpu_model_label=args.gpu_model_label))
    try:
        last = asyncio.run(record(settings))
    except RecordingError as err:
        return fail(str(err))
    print(last, file=sys.stderr)
    return 0


def _simulate(args: argparse.Namespace) -> int:
    """`reservoir simulate`: bench-trace's replay in one process (bench/trace/simulate.py). The engine and the trace
    format live in the source tree's bench/, which the installed package does not ship: found beside this package
    when Reservoir runs from a checkout (an editable install), else refused with a message."""
    root = Path(__file__).resolve().parents[1]
    if (root / "bench" / "trace" / "simulate.py").is_file() and str(root) not in sys.path:
        sys.path.append(str(root))
    try:  # by name: bench/ is no package of Reservoir's (nor checked with it: it drives the local cluster too)
        simulate = importlib.import_module("bench.trace.simulate")
        report = importlib.import_module("bench.trace.report")
        trace = importlib.import_module("bench.trace.trace")
    except ImportError as error:
        missing = error.name or ""
        if missing and missing.split(".")[0] != "bench":  # the engine found, a library it needs not
            print(f"reservoir simulate: needs {missing}, of the bench extra: `make` installs it "
                  f"(requirements-test.lock), or pip install '.[bench]' in the checkout", file=sys.stderr)
            return 2
        print("reservoir simulate: needs Reservoir's source tree (bench/trace/), which the installed package does not "
              "ship: run it from a checkout", file=sys.stderr)
        return 2

    def fail(message: str) -> int:
        print(f"reservoir simulate: {message}", file=sys.stderr)
        return 1

    # the replay's shaping flags default to None so that --as-recorded can tell one given; bench-trace's defaults
    # otherwise (bench/trace/run.py's)
    shaping = {"--fraction": "fraction", "--window": "window", "--arrival-seconds": "arrival_seconds",
               "--runtime-factor": "runtime_factor", "--runtime-floor": "runtime_floor",
               "--runtime-cap": "runtime_cap"}
    if args.as_recorded:
        given = [flag for flag, name in shaping.items() if getattr(args, name) is not None]
        if given:
            print(f"reservoir simulate: --as-recorded replays the recording as it happened (every node, no "
                  f"compression, no floor, cap or window): drop {', '.join(given)}", file=sys.stderr)
            return 2
        if args.pods is None:
            print("reservoir simulate: --as-recorded replays a recording: give --pods and --nodes (the files "
                  "`reservoir record` wrote)", file=sys.stderr)
            return 2
    for name, default in REPLAY_SETTING.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for flag, value in (("--tail", args.tail), ("--window", args.window)):
        if not value >= 0:  # NaN too
            return fail(f"{flag} {value}: expected seconds >= 0 (--window 0: every arrival)")
    minor = simulate.KUBERNETES_MINOR
    if args.kubernetes is not None:
        found = re.fullmatch(r"v?1\.(\d{1,3})(\.\d+)?", args.kubernetes.strip())
        if found is None:
            print(f"reservoir simulate: --kubernetes {args.kubernetes!r}: expected a version such as 1.35 or "
                  f"v1.35.2", file=sys.stderr)
            return 2
        minor = int(found.group(1))
    arms = [simulate.ArmSpec("alone", None, "trace-alone")]
    if not args.config:
        arms = simulate.default_arms()
    used = {"alone"}
    for file in args.config or ():
        try:
            text = Path(file).read_text() if file != "-" else sys.stdin.read()
        except OSError as err:
            return fail(f"--config {file}: cannot read it: {err.strerror or err}")
        try:
            config = load_config(text)
        except ConfigError as err:
            return fail(f"--config {file}: invalid: {err}")
        name = base = trace.pod_name(Path(file).stem if file != "-" else "stdin")[:40].strip("-") or "config"
        k = 2
        while name in used:
            name, k = f"{base}-{k}", k + 1
        used.add(name)
        namespace = f"trace-{name}"
        if config.backfill.enabled and not config.backfill.covers(namespace, None):
            print(f"reservoir simulate: warning: --config {file}: backfill.namespaces {config.backfill.namespaces} "
                  f"does not name {namespace}, the namespace this arm's pods are created in: none of them is held "
                  f"for backfill unless backfill.queues covers them (name {namespace}, or \"*\")", file=sys.stderr)
        arms.append(simulate.ArmSpec(name, config, namespace))
    try:
        replay = simulate.replayed(pods_csv=args.pods, nodes_csv=args.nodes, seed=args.seed, fraction=args.fraction,
                                   arrival_seconds=args.arrival_seconds, runtime_factor=args.runtime_factor,
                                   runtime_floor=args.runtime_floor, runtime_cap=args.runtime_cap,
                                   window=args.window if args.window > 0 else None, as_recorded=args.as_recorded)
    except OSError as err:
        return fail(f"{err.filename}: cannot read it: {err.strerror or err}")
    except (trace.TraceError, simulate.SimulationError) as err:
        return fail(str(err))
    print(replay.header, file=sys.stderr if args.output == "json" else sys.stdout, flush=True)
    jobs = args.jobs if args.jobs > 0 else min(len(arms), os.cpu_count() or 1)
    try:
        outcomes = simulate.simulate(arms, replay.nodes, replay.pods, seed=args.seed, tail=args.tail,
                                     progress=not args.quiet, jobs=jobs, minor=minor)
    except simulate.SimulationError as err:
        return fail(str(err))
    result = [o.arm for o in outcomes]
    shown = sys.stderr if args.output == "json" else sys.stdout
    if args.output == "json":
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            written = Path(tmp) / "simulate.json"
            report.write_json(result, written)
            sys.stdout.write(written.read_text())
    else:
        print("\n".join(simulate.main_lines(outcomes)))
    if args.plot:
        for picture in report.plot(result, Path(args.plot)):
            print(f"picture: {picture}", file=shown)
    return 0


# `reservoir simulate`'s replay shaping when not given (and not --as-recorded): bench-trace's setting
KUBECONFIG_HELP = ("default: $KUBECONFIG (a list, merged as kubectl merges), else ~/.kube/config, else in-cluster")


def _client_flags(command: argparse.ArgumentParser) -> None:
    """--kubeconfig and --context, as kubectl has them, for the commands that talk to a cluster from outside."""
    command.add_argument("--kubeconfig", default=None, help=KUBECONFIG_HELP)
    command.add_argument("--context", default=None, help="the kubeconfig context to use (default: its current-context)")


def build_parser(prog: str = "reservoir") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Reserve Kubernetes capacity for batch workloads.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="on an error, print its traceback too (otherwise one line on stderr)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    parser.add_argument("--log-format", choices=logs.FORMATS, default="text",
                        help="text (logfmt, the default) or json (one object per line)")
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser("check-config", help="validate a config.yaml with the same model the agent uses")
    check.add_argument("file", help="path to config.yaml, or - for standard input")
    check.set_defaults(run=_check_config)

    webhook = commands.add_parser("webhook", help="run the admission webhook (HTTPS)")
    webhook.add_argument("--cert-file", default=None, help="serving certificate (re-read when it changes)")
    webhook.add_argument("--key-file", default=None, help="serving key (re-read when it changes)")
    managed = webhook.add_argument_group(
        "certificates kept by the webhook itself (--manage-certs, instead of --cert-file/--key-file)")
    managed.add_argument("--manage-certs", action="store_true",
                         help="serve the pair in the --cert-secret Secret, read through the API; one replica, elected "
                              "by the Lease reservoir-webhook-certs, creates the CA and serving certificate there, "
                              "injects the CA bundle into the webhook configurations, renews and rotates them")
    managed.add_argument("--cert-secret", default="reservoir-webhook-tls", help="the Secret (default %(default)s)")
    managed.add_argument("--cert-namespace", default=None,
                         help="the Secret's and the Lease's namespace (default: the webhook's own, from the "
                              f"in-cluster service account, else {keys.NAMESPACE})")
    managed.add_argument("--service", default="reservoir-webhook",
                         help="the webhook's Service: the serving certificate's DNS names (default %(default)s)")
    managed.add_argument("--cert-dns", action="append", default=[], help="another DNS name to serve (repeatable)")
    managed.add_argument("--cert-ip", action="append", default=[], help="an IP address to serve (repeatable)")
    managed.add_argument("--webhook-configuration", action="append", default=[], metavar="NAME",
                         help="the Mutating and ValidatingWebhookConfiguration whose caBundle is kept (repeatable; "
                              f"default {WEBHOOK_CONFIGURATION}); no other is touched")
    managed.add_argument("--cert-validity", default="8760h",
                         help="serving certificate lifetime, a Go duration (default %(default)s); renewed at 2/3")
    managed.add_argument("--ca-validity", default="87600h",
                         help="CA lifetime (default %(default)s); rotated at 2/3, the old CA trusted until it expires")
    webhook.add_argument("--host", default="0.0.0.0")
    webhook.add_argument("--port", type=int, default=8443)
    webhook.add_argument("--kubeconfig", default=None, help=KUBECONFIG_HELP)
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
    agent.add_argument("--kubeconfig", default=None, help=KUBECONFIG_HELP)
    agent.add_argument("--namespace", default=keys.NAMESPACE, help="where the reservoir-config ConfigMap lives")
    agent.add_argument("--lease-namespace", default=None,
                       help="where the reservoir-agent Lease lives (default: the agent's own namespace, from the "
                            f"in-cluster service account, else {keys.NAMESPACE}; not --namespace)")
    agent.add_argument("--metrics-port", type=int, default=9090, help="/metrics, /healthz, /readyz (0: off)")
    agent.add_argument("--identity", default=None, help="leader-election identity (default host-pid)")
    agent.add_argument("--as", dest="impersonate", default=None, help="act as this user, like kubectl --as")
    agent.set_defaults(run=_agent)

    status = commands.add_parser("status", help="every lock, and the starving jobs, windows and guarantees of the "
                                                "agent's last published plan; --why POD")
    _client_flags(status)
    status.add_argument("-n", "--namespace", default=None,
                        help="with --why: the pod's namespace (default default); without: Reservoir's namespace, "
                             "as --reservoir-namespace")
    status.add_argument("--reservoir-namespace", default=keys.NAMESPACE,
                        help=f"where the agent publishes its plan ({keys.STATUS_CONFIGMAP}) and reads "
                             f"{keys.CONFIGMAP_NAME} (default {keys.NAMESPACE})")
    status.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table",
                        help="table (default), wide (more columns), json or yaml (docs/tasks/command-line.md)")
    status.add_argument("--queues", action="store_true",
                        help="each queue's QueueScoreOrder score and its parts, from the last published plan")
    status.add_argument("--why", metavar="POD", default=None,
                        help="explain why this pending pod (in -n NAMESPACE) is or is not covered by a lock")
    status.set_defaults(run=_status)

    release = commands.add_parser("release", help="remove Reservoir's locks from nodes (and nothing else)")
    release.add_argument("nodes", nargs="*", help="node names")
    release.add_argument("--all", action="store_true", help="every node carrying a Reservoir lock")
    _client_flags(release)
    release.set_defaults(run=_release)

    record = commands.add_parser(
        "record", help="watch a cluster (read-only) and write its pods and nodes as a trace for `reservoir simulate`",
        description="Watches pods and nodes (list and watch, nothing else: deploy/record-rbac.yaml) and writes DIR/"
                    "pods.csv and DIR/nodes.csv in the trace format of `make bench-trace` (Alibaba's openb columns "
                    "first, then uid, namespace, owner_kind, declared_runtime, node, gated, ungated_time, end, "
                    "end_after). A pod's row is written when it ends (Succeeded, Failed or deleted); times are "
                    "seconds since the recording's first start. Stopped (Ctrl-C, SIGTERM, kill -9), the same "
                    "command resumes it without losing or repeating a row. Replay it with `reservoir simulate --pods "
                    "DIR/pods.csv --nodes DIR/nodes.csv --as-recorded`.")
    record.add_argument("--out", required=True, metavar="DIR",
                        help="the recording's directory (made when missing; resumed when it holds one)")
    record.add_argument("--duration", default="24h",
                        help="how long to record, a Go duration counted from the recording's first start (default "
                             "%(default)s; 0: until stopped); then the pods still open are written and it ends")
    record.add_argument("--anonymize", action="store_true",
                        help="write pod, namespace and node names as keyed hashes (the key: DIR/anonymize.key); GPU "
                             "models are kept")
    record.add_argument("--gpu-resource", default=keys.GPU_RESOURCE,
                        help="the extended resource counted as GPUs (default %(default)s)")
    record.add_argument("--gpu-model-label", default=keys.GPU_MODEL_LABEL,
                        help="the node label naming its GPU model (default %(default)s, set by NVIDIA's GPU feature "
                             "discovery); a pod's nodeSelector or required affinity on it is its choice of models")
    _client_flags(record)
    record.add_argument("-q", "--quiet", action="store_true", help="no progress lines on standard error")
    record.set_defaults(run=_record)

    simulate = commands.add_parser(
        "simulate", help="replay a GPU cluster's trace in one process: kube-scheduler alone beside Reservoir's configs",
        description="The replay `make bench-trace` runs on a real control plane, as a deterministic discrete-event "
                    "simulation in one process: a model of kube-scheduler places the pods, Reservoir's own webhook, "
                    "planner and writer decide the rest (bench/trace/simulate.py says what is modelled and what is "
                    "not). Prints bench-trace's per-class table and last line; kube-scheduler alone is always the "
                    "first column, then one column per --config (without one: bench-trace's starvation and "
                    "backfill arms).")
    simulate.add_argument("--pods", default=None, metavar="PODS.csv",
                          help="the trace's pods (Alibaba's openb format); default: the synthetic trace of --seed")
    simulate.add_argument("--nodes", default=None, metavar="NODES.csv", help="the trace's nodes (openb format)")
    simulate.add_argument("--config", action="append", default=[], metavar="FILE",
                          help="a config.yaml to run as a column of its own (repeatable; - for standard input); its "
                               "pods are created in namespace trace-<file name>")
    simulate.add_argument("--seed", type=int, default=0,
                          help="the synthetic trace's draws and kube-scheduler's tie-breaks (default %(default)s)")
    simulate.add_argument("-o", "--output", choices=("table", "json"), default="table",
                          help="table (default), or json: every pod's record, sample and summary per arm")
    simulate.add_argument("--plot", default=None, metavar="DIR",
                          help="also write trace-timeline.png and trace-waits.png there (needs matplotlib)")
    simulate.add_argument("--as-recorded", action="store_true",
                          help="replay a recording of `reservoir record` as it happened: every node, arrivals and "
                               "runtimes (end - bind) as recorded, no compression, floor, cap or window; a pod "
                               "still running or pending when the recording stopped runs to its last moment")
    setting = {name: f"{value:g}" for name, value in REPLAY_SETTING.items()}
    simulate.add_argument("--fraction", type=float, default=None,
                          help=f"share of each node shape (default {setting['fraction']})")
    simulate.add_argument("--window", type=float, default=None,
                          help="seconds of the compressed arrivals replayed, at the same intensity (default "
                               f"{setting['window']}; 0: all)")
    simulate.add_argument("--arrival-seconds", type=float, default=None,
                          help="the trace's arrival span compressed into this many seconds (default "
                               f"{setting['arrival_seconds']})")
    simulate.add_argument("--runtime-factor", type=float, default=None,
                          help=f"runtimes divided by this (default {setting['runtime_factor']})")
    simulate.add_argument("--runtime-floor", type=float, default=None,
                          help=f"shortest runtime, seconds (default {setting['runtime_floor']})")
    simulate.add_argument("--runtime-cap", type=float, default=None,
                          help=f"longest runtime, seconds (default {setting['runtime_cap']})")
    simulate.add_argument("--tail", type=float, default=300.0,
                          help="seconds after the last arrival an arm waits for pending pods (default 300)")
    simulate.add_argument("-j", "--jobs", type=int, default=0,
                          help="arms simulated at once, each in a process (default: one per CPU, at most one per "
                               "arm; the results do not depend on it)")
    simulate.add_argument("--kubernetes", default=None, metavar="1.N",
                          help="the Kubernetes version whose kube-scheduler is modelled (default: the one make "
                               "bench-trace runs); before 1.36 NodeResourcesBalancedAllocation scored a node's balance "
                               "with the pod only, from 1.36 the change the pod makes to it")
    simulate.add_argument("-q", "--quiet", action="store_true", help="no progress lines on standard error")
    simulate.set_defaults(run=_simulate)

    uninstall = commands.add_parser(
        "uninstall", help="remove Reservoir: webhook configurations, every lock, then what it installed",
        description="In this order: the webhook configurations; the agent (its Deployment scaled to 0, its Lease held "
                    "by this command); every lock on every node (Reservoir's taints, labels and annotations, nothing "
                    "else); Reservoir's scheduling gates on pods; the placeholder pods; then the namespace "
                    f"{keys.NAMESPACE}, the cluster-wide RBAC and the placeholders' PriorityClass. Never Volcano's "
                    "CRDs, Queues or PodGroups. Prints one line per object removed; safe to run again.")
    uninstall.add_argument("--crds", action="store_true",
                           help="also delete the Reservation CRD, and with it every Reservation (default: kept)")
    uninstall.add_argument("--leave-install", action="store_true",
                           help="stop after the placeholder pods: leave the namespace, RBAC and PriorityClass to the "
                                "tool that installed them (the Helm chart's pre-delete hook)")
    _client_flags(uninstall)
    uninstall.set_defaults(run=_uninstall)
    return parser


def describe_error(err: BaseException) -> str:
    """One line for an error that ends a command: an API error's status code, reason and message; a connection
    that failed; a kubeconfig that is missing or wrong; else the exception's type and text."""
    from aiohttp import ClientConnectorError
    from kubernetes_asyncio.client.exceptions import ApiException

    from agent.published import StatusError
    from shared.kube import KubeconfigError

    if isinstance(err, ApiException):
        message = ""
        try:
            body = json.loads(err.body) if err.body else None
            if isinstance(body, dict):
                message = str(body.get("message") or "")
        except (TypeError, ValueError):
            message = err.body.decode(errors="replace") if isinstance(err.body, bytes) else str(err.body or "")
        text = f"API error {err.status} {err.reason or ''}".rstrip() + (f": {message}" if message else "")
    elif isinstance(err, ClientConnectorError):
        os_error = err.os_error
        cause = (os.strerror(os_error.errno) if os_error.errno else str(os_error)) if os_error else str(err)
        text = f"cannot connect to the API server at {err.host}:{err.port}: {cause.lower()}"
    elif isinstance(err, (KubeconfigError, StatusError)):
        text = str(err)
    elif isinstance(err, TimeoutError):
        text = "the API server did not answer in time"
    else:
        text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> int:
    # installed as `kubectl-reservoir` too: kubectl runs it as a plugin, handing it the arguments after `reservoir`
    invoked = Path(sys.argv[0]).name
    prog = "kubectl reservoir" if invoked.startswith("kubectl-reservoir") else "reservoir"
    args = build_parser(prog).parse_args(argv)
    logs.setup(args.log_level, args.log_format)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
        print(f"{prog}: error: {describe_error(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
