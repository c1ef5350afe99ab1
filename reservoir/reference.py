"""The documentation site's reference pages, rendered from the definitions themselves so they cannot drift from them
(docs/hooks/reference.py adds them to the site at build time; `make docs`):

- `configuration.md` from the pydantic model (shared.config.ReservoirConfig): every field's YAML path, type, default
  and `description`; a field without a description is an error (`missing_descriptions`, checked in the unit tests);
- `keys.md` from shared/keys.py: every annotation, label, taint and gate key, with the comment beside it;
- `metrics.md` from the registries the agent and the webhook serve (agent.controller.AgentMetrics,
  webhook.server.Metrics, and the collectors both programs add to them);
- `cli.md` from the command line's parser (reservoir.cli.build_parser), each command's `--help`;

and the tables that pages other than these carry: `<!-- config: FIELD ... -->` (expand_config_tables) and
`<!-- alerts -->` (expand_alerts_table, from the alert rules in deploy/components/monitoring).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from agent.controller import AgentMetrics, register_lock_expiries
from reservoir.cli import build_parser
from shared import keys
from shared.config import ReservoirConfig
from shared.duration import format_duration
from shared.metrics import ScrapeGauge, cache_freshness
from shared.watchcache import count_skips
from webhook.server import Metrics as WebhookMetrics

HELP_WIDTH = "100"  # columns the CLI's help is wrapped to on the page, whatever the terminal building the site

CONFIG_INTRO = """\
# Configuration reference

The ConfigMap `reservoir-config` (namespace `reservoir-system`) holds `config.yaml`; `reservoir check-config FILE`
validates one with the same model the agent and the webhook use. Durations are Go durations (`90m`, `2h30m`) or
plain seconds; quantities are Kubernetes quantities. Unknown keys are refused, naming the field.

This page is generated from the configuration model itself (`shared/config.py`).
"""


# --- configuration ---

def _model_of(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """(model, is a list of it) when a field holds a nested model or a list of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if typing.get_origin(annotation) is list:
        [item] = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item, True
    return None


def _type_name(info: FieldInfo) -> str:
    """A reader's name for the field's type: duration, integer (0-100), list of strings, ..."""
    annotation = info.annotation
    bounds = [m for m in info.metadata if hasattr(m, "ge") or hasattr(m, "le") or hasattr(m, "gt")]
    name = _plain_type(annotation)
    limits = []
    for item in bounds:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("le", "<=")):
            value = getattr(item, attr, None)
            if value is not None:
                limits.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return f"{name} ({', '.join(limits)})" if limits else name


def _plain_type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _plain_type(args[0])
    if origin in (typing.Union, types.UnionType):
        kinds = [_plain_type(a) for a in args if a is not type(None)]
        return " or ".join(kinds) + (" or none" if type(None) in args else "")
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {_plain_type(args[0])}s"
    if origin is dict:
        return "map" if _plain_type(args[1]) == "string" else f"map of {_plain_type(args[1])}s"
    named = {"Resources": "resource list"}  # shared.resources.Resources: a map of resource names to quantities
    return {bool: "boolean", int: "integer", float: "number", str: "string", timedelta: "duration"}.get(
        annotation, named.get(getattr(annotation, "__name__", ""), getattr(annotation, "__name__", str(annotation))))


def _default_text(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return ""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, timedelta):
        return f"`{format_duration(value)}`"
    if isinstance(value, (list, dict)) and not value:
        return f"`{'[]' if isinstance(value, list) else '{}'}`"
    return f"`{value}`"


def _yaml_name(name: str, info: FieldInfo) -> str:
    return info.alias or name


def _sections(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """(YAML path, model) of `model` and each model nested in it, depth first."""
    yield path, model
    for name, info in model.model_fields.items():
        nested = _model_of(info.annotation)
        if nested is not None:
            child, is_list = nested
            child_path = f"{path}.{_yaml_name(name, info)}" if path else _yaml_name(name, info)
            yield from _sections(child, child_path + ("[]" if is_list else ""))


def missing_descriptions(model: type[BaseModel] = ReservoirConfig) -> list[str]:
    """The YAML paths of the fields (in `model` and every model nested in it) that have no description."""
    missing = []
    for path, section in _sections(model, ""):
        for name, info in section.model_fields.items():
            if not (info.description or "").strip():
                missing.append(f"{path}.{_yaml_name(name, info)}" if path else _yaml_name(name, info))
    return missing


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rows(model: type[BaseModel]) -> dict[str, str]:
    """Each field's YAML path -> its table row (configuration_page's columns)."""
    rows = {}
    for path, section in _sections(model, ""):
        for name, info in section.model_fields.items():
            nested = _model_of(info.annotation)
            field = f"{path}.{_yaml_name(name, info)}" if path else _yaml_name(name, info)
            kind = "section" if nested and not nested[1] else ("list of sections" if nested else _type_name(info))
            rows[field] = f"| `{field}` | {_cell(kind)} | {_default_text(info)} | {_cell(info.description or '')} |"
    return rows


CONFIG_MARKER = re.compile(r"^<!--[ \t]*config:[ \t]*(.*?)[ \t]*-->[ \t]*$", re.MULTILINE)


def config_table(fields: Sequence[str], model: type[BaseModel] = ReservoirConfig) -> str:
    """The configuration table of `fields` for a page: each a field's YAML path (`starvation.maxLockDuration`) or a
    section's (`starvation`: every field in it, the nested sections' own rows too), in the order given. An unknown
    path is a ValueError naming it and the page's fix."""
    rows = _rows(model)
    out = []
    for wanted in fields:
        inside = [row for path, row in rows.items() if path.startswith((f"{wanted}.", f"{wanted}[]."))]
        picked = inside or [row for path, row in rows.items() if path == wanted]  # a section's rows, or the field's
        if not picked:
            raise ValueError(f"<!-- config: ... --> names {wanted!r}, not a configuration field or section "
                             f"(shared/config.py; YAML names, as in the configuration reference)")
        out += [row for row in picked if row not in out]
    return "\n".join(["| field | type | default | meaning |", "|---|---|---|---|", *out])


def expand_config_tables(markdown: str) -> str:
    """A page's `<!-- config: FIELD ... -->` lines replaced by config_table(FIELDs): the pages show the model's own
    descriptions and defaults, never a copy of them."""
    return CONFIG_MARKER.sub(lambda m: config_table(m.group(1).split()), markdown)


def configuration_page(model: type[BaseModel] = ReservoirConfig) -> str:
    """The configuration reference: one section per model, a row per field. A field without a description is a
    ValueError naming it."""
    missing = missing_descriptions(model)
    if missing:
        raise ValueError(f"configuration fields without a description (give them Field(description=...) in "
                         f"shared/config.py): {', '.join(missing)}")
    out = [CONFIG_INTRO]
    rows = _rows(model)
    for path, section in _sections(model, ""):
        out.append(f"\n## `{path}`\n" if path else "\n## Top level\n")
        doc = (section.__doc__ or "").strip()
        if doc:
            out.append(" ".join(doc.split()) + "\n")
        out.append("\n| field | type | default | meaning |\n|---|---|---|---|")
        out += [rows[f"{path}.{_yaml_name(name, info)}" if path else _yaml_name(name, info)]
                for name, info in section.model_fields.items()]
        out.append("")
    return "\n".join(out)


# --- keys ---

API_NAME_SUFFIXES = ("_API_VERSION", "_GROUP", "_VERSION", "_PLURAL", "_DOMAIN")
ISSUE_REFERENCE = re.compile(r"\s*\(issue \d+[^)]*\)|\bissue \d+[:,;]?\s*", re.IGNORECASE)


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line (without '#')."""
    out = {}
    for number, line in enumerate(source.splitlines(), start=1):
        if "#" in line:
            code, _, comment = line.partition("#")
            if not code.strip() or code.rstrip().endswith((")", '"', "'")) or "=" in code:
                out[number] = comment.strip()
    return out


def key_rows(path: Path | None = None) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """shared/keys.py's keys by its `# --- section ---` comments: [(section, [(key, constant, comment)])]. A key is a
    module-level string constant holding a '/' (an annotation, label, taint or gate key), API names aside."""
    source = (path or Path(keys.__file__)).read_text()
    comments = _comments(source)
    lines = source.splitlines()
    sections: list[tuple[str, list[tuple[str, str, str]]]] = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        value = getattr(keys, name, None)
        header = _section_above(lines, node.lineno)
        if header is not None and (not sections or sections[-1][0] != header):
            sections.append((header, []))
        if not isinstance(value, str) or "/" not in value or name.endswith(API_NAME_SUFFIXES) or not sections:
            continue
        text = [comments[node.lineno]] if node.lineno in comments and "=" in lines[node.lineno - 1] else []
        above = node.lineno - 1
        block: list[str] = []
        while above >= 1 and lines[above - 1].lstrip().startswith("#") and "---" not in lines[above - 1]:
            block.insert(0, comments.get(above, ""))
            above -= 1
        description = ISSUE_REFERENCE.sub(" ", " ".join(block + text)).strip()
        sections[-1][1].append((value, name, " ".join(description.split())))
    return [(title, rows) for title, rows in sections if rows]


def _section_above(lines: Sequence[str], lineno: int) -> str | None:
    """The title of the nearest `# --- title ---` comment above line `lineno`."""
    for line in reversed(lines[:lineno - 1]):
        match = re.match(r"#\s*---\s*(.*?)\s*---", line.strip())
        if match:
            return ISSUE_REFERENCE.sub(" ", match.group(1)).replace(" ;", ";").strip().rstrip(";")
    return None


def keys_page() -> str:
    out = ["# Keys\n",
           "Every annotation, label, taint and scheduling-gate key Reservoir reads or writes, by where it lives. "
           "Generated from `shared/keys.py`, the one module that spells them.\n"]
    for title, rows in key_rows():
        out.append(f"\n## {title[0].upper()}{title[1:]}\n\n| key | in the code | what |\n|---|---|---|")
        out += [f"| `{key}` | `{name}` | {_cell(text)} |" for key, name, text in rows]
        out.append("")
    return "\n".join(out)


# --- metrics ---

def _served(registry: CollectorRegistry) -> list[tuple[str, str, str, list[str]]]:
    """(name, type, help, labels) of every metric family `registry` serves, sorted by name: a collector that
    describes itself by that, one that does not (the process, platform and GC collectors) by what it collects."""
    out: dict[str, tuple[str, str, str, list[str]]] = {}
    for collector in list(registry._collector_to_names):
        describe = getattr(collector, "describe", None)
        for family in describe() if describe is not None else collector.collect():
            if hasattr(collector, "_labelnames"):  # prometheus_client's Counter, Gauge, Histogram
                labels = list(collector._labelnames)
            elif isinstance(collector, ScrapeGauge):
                labels = list(collector.labels)
            else:
                labels = sorted({label for sample in family.samples for label in sample.labels})
            name = family.name + ("_total" if family.type == "counter" else "")
            out.setdefault(name, (name, family.type, family.documentation, labels))
    return sorted(out.values())


def agent_registry() -> CollectorRegistry:
    """The agent's registry as its process fills it (agent.controller.Agent), with no cache or lock behind it."""
    registry = AgentMetrics().registry
    count_skips(registry)
    cache_freshness(registry, list)
    register_lock_expiries(registry, list)
    return registry


def webhook_registry() -> CollectorRegistry:
    """The webhook's registry as its process fills it (webhook.main)."""
    registry = WebhookMetrics().registry
    count_skips(registry)
    cache_freshness(registry, list)
    return registry


def metrics_page() -> str:
    out = ["# Metrics\n",
           "What `/metrics` serves on each program (the agent on `--metrics-port`, the webhook beside its admission "
           "routes). Generated from the registries the programs build. The alert rules that read them are in "
           "`deploy/components/monitoring`; see [Metrics and alerts](../tasks/metrics.md).\n"]
    for program, registry in (("agent", agent_registry()), ("webhook", webhook_registry())):
        out.append(f"\n## The {program}\n\n| metric | type | labels | what |\n|---|---|---|---|")
        for name, kind, text, labels in _served(registry):
            shown = ", ".join(f"`{label}`" for label in labels) or "-"
            out.append(f"| `{name}` | {kind} | {shown} | {_cell(ISSUE_REFERENCE.sub(' ', text).strip())} |")
        out.append("")
    return "\n".join(out)


# --- alerts ---

ALERT_RULES = Path(__file__).resolve().parents[1] / "deploy/components/monitoring/prometheus-rule.yaml"
ALERTS_MARKER = re.compile(r"^<!--[ \t]*alerts[ \t]*-->[ \t]*$", re.MULTILINE)
PLACEHOLDER = re.compile(r"\{\{[^}]*?\$(?:labels\.)?(\w+)[^}]*\}\}")  # {{ $labels.pod }}, {{ $value | humanize }}


def _annotation_cell(text: str) -> str:
    """An alert's annotation as a table cell: on one line, each Go-template placeholder shown as `<pod>`, `<value>`
    (the label or value it stands for), written `&lt;pod&gt;` outside code spans, where a browser would take it for a
    tag."""
    shown = [PLACEHOLDER.sub(r"<\1>" if i % 2 else r"&lt;\1&gt;", part) for i, part in enumerate(text.split("`"))]
    return _cell("`".join(shown))


def alerts_table(path: Path = ALERT_RULES) -> str:
    """The alerts of the PrometheusRule at `path`, a row each in the file's order: its name, severity, when it fires
    (its `expr`, held for its `for`), what it means (its `description`) and what to do (its `runbook`), so the docs
    show the rules' own words and thresholds. An alert without a description or a runbook is a ValueError naming
    it. The expression is a code span, whose `|` Markdown's tables leave alone."""
    spec = yaml.safe_load(path.read_text())["spec"]
    out = ["| alert | severity | fires when | what it means | what to do |", "|---|---|---|---|---|"]
    for rule in (rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule):
        annotations = rule.get("annotations", {})
        missing = [key for key in ("description", "runbook") if not annotations.get(key)]
        if missing:
            raise ValueError(f"alert {rule['alert']} in {path} has no {' or '.join(missing)} annotation")
        fires = f"`{' '.join(str(rule['expr']).split())}` for {rule.get('for', '0s')}"
        out.append(f"| `{rule['alert']}` | {rule.get('labels', {}).get('severity', '-')} | {fires} "
                   f"| {_annotation_cell(annotations['description'])} | {_annotation_cell(annotations['runbook'])} |")
    return "\n".join(out)


def expand_alerts_table(markdown: str, path: Path = ALERT_RULES) -> str:
    """A page's `<!-- alerts -->` line replaced by alerts_table(path): the page lists the alerts the rules define, in
    their own words, never a copy of them."""
    return ALERTS_MARKER.sub(lambda _: alerts_table(path), markdown)


# --- the command line ---

def _commands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix} {name}")


def cli_page(parser_factory: Callable[[], argparse.ArgumentParser] = build_parser) -> str:
    """Each command's `--help`, wrapped at HELP_WIDTH columns."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        out = ["# Command line\n",
               "`reservoir` (also `kubectl reservoir`: the same program installed as a kubectl plugin). Generated "
               "from its parser; `reservoir COMMAND --help` prints the same.\n"]
        for name, parser in _commands(parser_factory(), "reservoir"):
            out.append(f"\n## `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        return "\n".join(out)
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


PAGES: dict[str, Callable[[], str]] = {
    "reference/configuration.md": configuration_page,
    "reference/keys.md": keys_page,
    "reference/metrics.md": metrics_page,
    "reference/cli.md": cli_page,
}
