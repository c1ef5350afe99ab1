"""A strict logfmt parser for the tests: `key=value` pairs separated by single spaces, a value bare (no space, `"`,
`=` or control character) or a JSON string in double quotes, which is what go-logfmt and Loki read. And the
structured fields of captured records, for tests that read what a module logged."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any

from shared.logs import FIELDS

_PAIR = re.compile(r'([^\s="]+)=("(?:[^"\\\x00-\x1f]|\\.)*"|[^\s="\x00-\x1f]*)(?: |$)')


def parse(line: str) -> dict[str, str]:
    """The pairs of one logfmt line; ValueError when the line is not valid logfmt (or repeats a key)."""
    out: dict[str, str] = {}
    at = 0
    while at < len(line):
        match = _PAIR.match(line, at)
        if match is None or (match.end() == len(line) and line.endswith(" ")):
            raise ValueError(f"not logfmt at {at}: {line[at:at + 40]!r} in {line!r}")
        name, raw = match.groups()
        if name in out:
            raise ValueError(f"key {name!r} twice in {line!r}")
        out[name] = json.loads(raw) if raw.startswith('"') else raw
        at = match.end()
    return out


def records(text: str) -> list[dict[str, str]]:
    """The logfmt lines of a process's log (other lines, such as a crash's output, are left out)."""
    out = []
    for line in text.splitlines():
        try:
            out.append(parse(line))
        except ValueError:
            continue
    return out


def matches(record: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(str(record.get(k)) == str(v) for k, v in want.items())


def find(text: str, **want: Any) -> list[dict[str, str]]:
    """The log lines of `text` whose fields include every `want` (values compared as text)."""
    return [r for r in records(text) if matches(r, want)]


def captured(caplog_records: Iterable[logging.LogRecord], **want: Any) -> list[dict[str, Any]]:
    """The captured records as `{"msg": ..., "level": ..., **fields}` whose fields include every `want`."""
    out = []
    for record in caplog_records:
        values = {"msg": record.getMessage(), "level": record.levelname.lower(), "logger": record.name,
                  **(getattr(record, FIELDS, None) or {})}
        if matches(values, want):
            out.append(values)
    return out
