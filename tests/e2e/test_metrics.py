"""Issue 14, "Metrics and alerts", against the real programs: the agent and the webhook run on the local control plane
(the webhook registered, so the pods made here pass through it; the agent locks a node for a starving PodGroup, with
an expiry), both `/metrics` are scraped, and then with promtool (built from its Go module by `make cluster-bin`):

- the PrometheusRule's spec (deploy/components/monitoring/prometheus-rule.yaml) passes `promtool check rules`, and
  every metric its alert expressions name is one of the two scrapes';
- every query of the Grafana dashboard (deploy/components/grafana-dashboard) parses (`promtool check rules`, each
  query a recording rule) and names only scraped metrics;
- `promtool test rules` shows each alert fire and not fire, on input series named as the scrape names them, with
  the label values it shows (caches, lock kinds). The alerts' annotations are left out of that copy of the rules:
  promtool compares them in full, rendered, and their templates are checked by `promtool check rules` already.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import binaries
from localcluster.agent_process import AgentProcess
from localcluster.cluster import COMPLETE_AFTER, free_port
from localcluster.webhook_process import WebhookProcess
from shared import keys
from shared.ownership import JobRef
from tests.conftest import unavailable
from tests.e2e.kit import REPO, Kit, apply_setup, running_webhook
from tests.e2e.scenarios import SETUP, STARVATION_CONFIG, configure, spare_node

RULES = REPO / "deploy/components/monitoring/prometheus-rule.yaml"
DASHBOARD = REPO / "deploy/components/grafana-dashboard/reservoir-dashboard.json"
ALERTS = {"ReservoirNoLeader", "ReservoirCacheStale", "ReservoirWebhookErrors", "ReservoirWebhookCertificateExpiring",
          "ReservoirLockPastExpiry", "ReservoirReconcileErrors"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan", "Inf", "NaN"}


@pytest.fixture(scope="module")
def promtool() -> Path:
    if binaries.promtool_missing():
        message = f"promtool not built ({binaries.promtool()}): run `make cluster-bin`"
        unavailable(message)
    return binaries.promtool()


def run(args: list[str | Path], cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert done.returncode == 0, f"{' '.join(map(str, args))}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def served(text: str) -> set[str]:
    """Every series name a scrape offers: its samples' names, and each declared family's (a histogram's _bucket,
    _sum and _count too), so a family with no sample yet (a label never used) still counts."""
    names = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers once strings, label matchers, ranges and the
    label lists of by/without/on/ignoring/group_* are out, less function names (followed by `(`) and keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        if not text[match.end():].lstrip().startswith("(") and match.group() not in PROMQL_WORDS:
            names.add(match.group())
    return names


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(panel title, query) of every panel target; the dashboard's $job variable as its All value."""
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets") or []:
            yield panel["title"], target["expr"].replace("$job", ".*")


def rules_spec() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())["spec"]


async def scrape_both(kit: Kit, agent: AgentProcess, webhook: WebhookProcess) -> tuple[str, str]:
    """Both programs' /metrics once the agent leads and reports the lock's expiry."""
    def get(url: str, context: ssl.SSLContext | None = None) -> str:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.read().decode()

    agent_url = f"http://127.0.0.1:{agent.metrics_port}/metrics"

    async def expiry_reported() -> bool:
        return 'reservoir_lock_expiry_timestamp_seconds{kind="job",node="metrics-node"}' in get(agent_url)
    await kit.wait_for(expiry_reported, what="the lock's expiry in the agent's /metrics", timeout=30)
    context = ssl.create_default_context(cafile=str(webhook.dir / "ca-bundle.crt"))
    return get(agent_url), get(f"{webhook.url}/metrics", context)


async def test_alert_rules_and_dashboard_name_only_served_metrics_and_each_alert_fires(
        kit: Kit, promtool: Path, tmp_path: Path) -> None:
    await apply_setup(kit, *SETUP, "deploy/webhook-rbac.yaml")
    await configure(kit, STARVATION_CONFIG)  # maxLockDuration 10m: the lock has an expiry
    agent = AgentProcess(kit.cluster, metrics_port=free_port())
    async with running_webhook(kit) as webhook:
        agent.start()
        try:
            await kit.create_node("metrics-node", {"cpu": "4", "memory": "16Gi"})
            await spare_node(kit)
            await kit.create_pod("hog", {"cpu": "3"}, annotations={COMPLETE_AFTER: "8s"})
            await kit.wait_pod("hog", lambda p: p.get("status", {}).get("phase") == "Running", "Running")
            await kit.custom.create_namespaced_custom_object(
                keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, kit.namespace, keys.PODGROUP_PLURAL,
                {"apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}", "kind": "PodGroup",
                 "metadata": {"name": "gang"}, "spec": {"minMember": 2}})
            for i in range(2):
                await kit.create_pod(f"gang-{i}", {"cpu": "2"}, annotations={keys.GROUP_NAME: "gang"})
            owner = JobRef(kit.namespace, "PodGroup", "gang").owner_id

            async def locked() -> bool:
                node = await kit.read_node("metrics-node")
                return any(t["key"] == keys.LOCK and t["value"] == owner for t in node["spec"].get("taints") or [])
            await kit.wait_for(locked, what="metrics-node locked for the PodGroup", timeout=30)
            agent_text, webhook_text = await scrape_both(kit, agent, webhook)
        finally:
            agent.stop()
    assert "reservoir_leader 1.0" in agent_text and "reservoir_build_info{" in agent_text
    assert re.search(r'reservoir_webhook_requests_total\{[^}]*route="/mutate/pods"[^}]*\} [1-9]', webhook_text)
    assert "reservoir_webhook_certificate_expiry_timestamp_seconds " in webhook_text
    names = served(agent_text) | served(webhook_text)

    # the alert rules: promtool checks them; each names only served metrics
    spec = rules_spec()
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(spec))
    assert f"SUCCESS: {len(ALERTS)} rules found" in run([promtool, "check", "rules", rules])
    alerts = {r["alert"]: r for g in spec["groups"] for r in g["rules"]}
    assert set(alerts) == ALERTS
    for name, rule in alerts.items():
        used = metric_names(rule["expr"])
        assert used and used <= names, f"{name}: {sorted(used - names)} not served (served: {sorted(names)})"
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name

    # the dashboard: each query parses (as a recording rule) and names only served metrics
    queries = list(dashboard_queries())
    assert len(queries) >= 15
    recording = tmp_path / "dashboard.yaml"
    recording.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries)]}]}))
    assert f"SUCCESS: {len(queries)} rules found" in run([promtool, "check", "rules", recording])
    for title, expr in queries:
        used = metric_names(expr)
        assert used and used <= names, f"panel {title!r}: {sorted(used - names)} not served"

    # each alert fires, and does not, on series named and labelled as the scrapes are
    caches = sorted(set(re.findall(r'reservoir_cache_last_heard_timestamp_seconds\{cache="([^"]+)"', agent_text)))
    assert "nodes" in caches
    bare = {"groups": [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
                       for g in spec["groups"]]}
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(bare))
    tests = alert_tests(caches[0])
    for test in tests:
        for series in test["input_series"]:
            assert series["series"].split("{")[0] in names, series
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["bare.yaml"], "evaluation_interval": "1m",
                                                         "tests": tests}))
    out = run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path)
    assert "SUCCESS" in out, out
    fired = {t["alertname"] for test in tests for t in test["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for test in tests for t in test["alert_rule_test"] if not t["exp_alerts"]}
    assert fired == quiet == ALERTS, "each alert shown both to fire and not to"


def alert_tests(cache: str) -> list[dict[str, Any]]:
    """promtool unit tests: for each alert a story where it fires and one where it does not (promtool's time
    starts at 0: a timestamp gauge of 0 is as old as the evaluation time)."""
    agent = 'job="reservoir-agent-metrics",pod="reservoir-agent-0"'
    hook = 'job="reservoir-webhook-metrics",pod="reservoir-webhook-0"'

    def case(series: list[tuple[str, str]], checks: list[tuple[str, str, list[dict[str, str]]]]) -> dict[str, Any]:
        return {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [{"eval_time": at, "alertname": name,
                                     "exp_alerts": [{"exp_labels": labels} for labels in expected]}
                                    for name, at, expected in checks]}

    hour = 3600
    return [
        # no leader: both replicas 0 for 10 minutes; then one leads
        case([(f"reservoir_leader{{{agent}}}", "0x10 1x10"),
              ('reservoir_leader{job="reservoir-agent-metrics",pod="reservoir-agent-1"}', "0x20")],
             [("ReservoirNoLeader", "8m", [{"severity": "critical"}]), ("ReservoirNoLeader", "18m", [])]),
        # a cache last heard at 0 goes stale after 640 s and 5 minutes; one heard every minute never does
        case([(f'reservoir_cache_last_heard_timestamp_seconds{{{agent},cache="{cache}"}}', "0x30"),
              (f'reservoir_cache_last_heard_timestamp_seconds{{{hook},cache="{cache}"}}', "0+60x30")],
             [("ReservoirCacheStale", "20m", [{"severity": "warning", "cache": cache, "job": "reservoir-agent-metrics",
                                               "pod": "reservoir-agent-0"}]),
              ("ReservoirCacheStale", "8m", [])]),
        # webhook errors: 10% of requests fail from minute 0 to 30, none after
        case([(f'reservoir_webhook_requests_total{{{hook},route="/mutate/pods",outcome="patched"}}',
               "0+90x30 2700+100x30"),
              (f'reservoir_webhook_requests_total{{{hook},route="/mutate/pods",outcome="error"}}',
               "0+10x30 300x30")],
             [("ReservoirWebhookErrors", "25m", [{"severity": "warning"}]), ("ReservoirWebhookErrors", "55m", [])]),
        # a certificate with 6 days left fires; one with 30 days does not
        case([(f'reservoir_webhook_certificate_expiry_timestamp_seconds{{{hook}}}', f"{6 * 24 * hour}x30"),
              ('reservoir_webhook_certificate_expiry_timestamp_seconds{job="reservoir-webhook-metrics",'
               'pod="reservoir-webhook-1"}', f"{30 * 24 * hour}x30")],
             [("ReservoirWebhookCertificateExpiring", "15m",
               [{"severity": "critical", "job": "reservoir-webhook-metrics", "pod": "reservoir-webhook-0"}]),
              ("ReservoirWebhookCertificateExpiring", "5m", [])]),
        # a lock expiring at 10 minutes, reported by two replicas: one alert, from 21 minutes; an hour-long one never
        case([(f'reservoir_lock_expiry_timestamp_seconds{{{agent},node="n1",kind="job"}}', "600x40"),
              ('reservoir_lock_expiry_timestamp_seconds{job="reservoir-agent-metrics",pod="reservoir-agent-1",'
               'node="n1",kind="job"}', "600x40"),
              (f'reservoir_lock_expiry_timestamp_seconds{{{agent},node="n2",kind="queue"}}', f"{hour}x40")],
             [("ReservoirLockPastExpiry", "25m", [{"severity": "warning", "node": "n1", "kind": "job"}]),
              ("ReservoirLockPastExpiry", "19m", [])]),  # past expiry + 300 s since 15m, but not yet for 5m
        # a reconcile error a minute for 40 minutes; none after
        case([(f"reservoir_reconcile_errors_total{{{agent}}}", "0+1x40 40x40")],
             [("ReservoirReconcileErrors", "35m", [{"severity": "warning", "job": "reservoir-agent-metrics",
                                                    "pod": "reservoir-agent-0"}]),
              ("ReservoirReconcileErrors", "75m", [])]),
    ]


def test_the_metric_name_reader_finds_selectors_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.9, sum by (le, how) (rate(a_seconds_bucket{how=~"x|y", job!="b_total"}[5m] '
            'offset 5m))) / on (pod) group_left (node) b_total > bool 3 or vector(0) unless absent(c:recorded)')
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c:recorded"}
    assert metric_names("time() - 7 * 24 * 3600") == set()
