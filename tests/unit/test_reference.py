"""The docs site's reference pages, generated from the code (reservoir/reference.py): every configuration field and
every key carries a description, every metric, command and alert is listed, and a field without a description fails."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from reservoir import reference
from reservoir.cli import build_parser
from shared import keys
from shared.config import ReservoirConfig

REPO = Path(__file__).resolve().parents[2]


def test_every_configuration_field_has_a_description() -> None:
    assert reference.missing_descriptions() == []


def test_a_field_without_a_description_is_named_and_fails_the_page() -> None:
    class Inner(BaseModel):
        """An inner section."""
        told: int = Field(1, description="said")
        untold: int = 2

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner, description="the inner section")
        items: list[Inner] = Field(default_factory=list, description="inner sections")

    assert reference.missing_descriptions(Outer) == ["inner.untold", "items[].untold"]
    with pytest.raises(ValueError, match=r"inner\.untold, items\[\]\.untold"):
        reference.configuration_page(Outer)


def test_the_configuration_page_has_a_row_per_field_with_its_default() -> None:
    page = reference.configuration_page()
    for path, section in reference._sections(ReservoirConfig, ""):
        for name, info in section.model_fields.items():
            field = f"{path}.{info.alias or name}" if path else (info.alias or name)
            assert f"| `{field}` |" in page, field
    row = next(line for line in page.splitlines() if line.startswith("| `starvation.starvingJobTimeThreshold` |"))
    assert "| `10m` |" in row and "| duration |" in row
    assert "| `maxLockedNodePercent` | integer (>= 0, <= 90) | `50` |" in page
    assert "## `windows[]`" in page and "| `windows[].podNumToReserve` |" in page


def test_every_key_of_shared_keys_is_on_the_keys_page_with_a_description() -> None:
    rows = [row for _, section in reference.key_rows() for row in section]
    listed = {name for _, name, _ in rows}
    for name in ("LOCK", "LOCK_EXCLUSIVE", "BACKFILL_GATE", "HANDOVER_GATE", "EXPECTED_START", "MAXIMUM_RUNTIME",
                 "KUEUE_QUEUE_NAME", "KOORDINATOR_RESERVATION_AFFINITY"):
        assert name in listed, name
    assert not [name for _, name, text in rows if not text], "a key without a comment in shared/keys.py"
    assert "KUEUE_API_VERSION" not in listed  # API names are not keys
    page = reference.keys_page()
    assert f"| `{keys.LOCK}` | `LOCK` |" in page
    assert not re.search(r"\bissue \d+", page, re.IGNORECASE)


def test_the_metrics_page_lists_what_each_program_serves() -> None:
    page = reference.metrics_page()
    agent, webhook = page.split("## The webhook")
    for name in ("reservoir_locks", "reservoir_reconcile_duration_seconds", "reservoir_lock_expiry_timestamp_seconds",
                 "reservoir_cache_last_heard_timestamp_seconds", "reservoir_watch_skipped_objects_total",
                 "process_resident_memory_bytes", "reservoir_build_info"):
        assert f"| `{name}` |" in agent, name
    for name in ("reservoir_webhook_requests_total", "reservoir_webhook_admissions_total",
                 "reservoir_cache_last_heard_timestamp_seconds"):
        assert f"| `{name}` |" in webhook, name
    assert "| `reservoir_locks` | gauge | `kind` |" in agent
    assert "reservoir_locks" not in webhook


def test_the_cli_page_shows_every_command_help() -> None:
    page = reference.cli_page()
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert commands
    for name in commands:
        assert f"## `reservoir {name}`" in page, name
    assert "usage: reservoir check-config" in page


def test_every_page_the_site_generates_is_in_its_nav() -> None:
    config = (REPO / "mkdocs.yml").read_text()
    for path in reference.PAGES:
        assert f": {path}" in config, path


def test_a_pages_config_marker_becomes_the_models_rows_and_an_unknown_field_fails() -> None:
    page = "Intro\n\n<!-- config: starvation maxLockedNodePercent -->\n\nAfter\n"
    out = reference.expand_config_tables(page)
    assert "| `starvation.lockCooldown` | duration | `30m` |" in out
    assert "| `maxLockedNodePercent` |" in out and "| `dryRun` |" not in out
    assert out.startswith("Intro\n\n| field |") and out.endswith("\n\nAfter\n")
    with pytest.raises(ValueError, match="'starvation.maxLockDurations', not a configuration field"):
        reference.expand_config_tables("<!-- config: starvation.maxLockDurations -->\n")


def test_every_config_marker_in_the_docs_names_real_fields() -> None:
    pages = sorted((REPO / "docs").rglob("*.md"))
    marked = [p for p in pages if reference.CONFIG_MARKER.search(p.read_text())]
    assert len(marked) >= 9
    for page in marked:
        assert "| field | type |" in reference.expand_config_tables(page.read_text()), page


RULES = REPO / "deploy/components/monitoring/prometheus-rule.yaml"


def _alert_rules() -> list[dict[str, Any]]:
    spec = yaml.safe_load(RULES.read_text())["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule]


def test_the_alerts_table_has_a_row_per_alert_of_the_rules_file() -> None:
    rules = _alert_rules()
    assert len(rules) >= 6
    rows = [line for line in reference.alerts_table(RULES).splitlines() if line.startswith("| `")]
    assert [row.split(" | ")[0] for row in rows] == [f"| `{rule['alert']}`" for rule in rules]
    for row, rule in zip(rows, rules, strict=True):
        fires = f"`{' '.join(str(rule['expr']).split())}` for {rule['for']}"
        assert row.startswith(f"| `{rule['alert']}` | {rule['labels']['severity']} | {fires} | "), row
    assert reference.alerts_table() == reference.alerts_table(RULES)


def test_the_alerts_table_shows_placeholders_as_names_on_one_line() -> None:
    table = reference.alerts_table(RULES)
    assert "{{" not in table and "}}" not in table
    stale = next(line for line in table.splitlines() if line.startswith("| `ReservoirCacheStale` |"))
    assert "| &lt;pod&gt; has not heard from the API server about &lt;cache&gt; for &lt;value&gt;: it" in stale
    assert "`decision=patch-failed node=<node>`" in table  # inside a code span, shown as it is


def test_an_alert_row_is_one_escaped_line_and_an_alert_without_a_runbook_fails(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("""\
spec:
  groups:
  - name: g
    rules:
    - record: job:x:sum
      expr: sum(x)
    - alert: A
      expr: x > 1
      for: 2m
      labels: {severity: page}
      annotations:
        description: >-
          {{ $labels.pod }} sees {{ $value | humanizePercentage }}
          of x|y
        runbook: run `kubectl logs {{ $labels.pod }}`
""")
    assert reference.alerts_table(rules).splitlines()[2:] == [
        "| `A` | page | `x > 1` for 2m | &lt;pod&gt; sees &lt;value&gt; of x\\|y | run `kubectl logs <pod>` |"]
    rules.write_text(rules.read_text() + "    - {alert: B, expr: y > 1, annotations: {description: d}}\n")
    with pytest.raises(ValueError, match="alert B in .* has no runbook annotation"):
        reference.alerts_table(rules)


def test_the_alerts_marker_becomes_the_table_on_the_metrics_page() -> None:
    out = reference.expand_alerts_table("Intro\n\n<!-- alerts -->\n\nAfter\n", RULES)
    assert out.startswith("Intro\n\n| alert | severity | fires when |") and out.endswith("|\n\nAfter\n")
    assert "| `ReservoirNoLeader` | critical | `(max(reservoir_leader) or vector(0)) < 1` for 5m |" in out
    page = (REPO / "docs/tasks/metrics.md").read_text()
    assert len(reference.ALERTS_MARKER.findall(page)) == 1
    assert "`ReservoirNoLeader` |" not in page  # no hand-written table beside the generated one
    spec = importlib.util.spec_from_file_location("docs_hook", REPO / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    rendered = hook.on_page_markdown(page, page=None, config=None, files=None)
    assert "| `ReservoirNoLeader` | critical | `" in rendered and "<!-- alerts -->" not in rendered
