"""The docs site's reference pages, generated from the code (reservoir/reference.py): every configuration field and
every key carries a description, every metric and command is listed, and a field without a description fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
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
