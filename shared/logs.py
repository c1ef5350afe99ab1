"""Reservoir's log lines: logfmt (`--log-format text`, the default) or one JSON object per line (`--log-format json`).

Every line has `time`, `level`, `logger` and `msg`, then the record's structured fields in the order given:

    time=2025-01-02T03:04:05.678Z level=info logger=reservoir.agent msg=decision decision=lock policy=window \
node=n1 owner=window/nightly reason="window nightly is open"

A call site passes its fields with `extra=fields(...)`, or `decision(log, "lock", policy=..., node=..., owner=...,
reason=...)` for a decision, so that the values are never spliced into the message. A value is quoted when it
has to be (empty, whitespace, `=`, `"`, `\\`, control or non-ASCII characters) and then escaped as JSON escapes a
string (`\\"`, `\\\\`, `\\n`, `\\u00e9`), which is what logfmt parsers (go-logfmt, logfmt.js, Loki) read back.
A line never spans two lines: a traceback is one `exc` value.

Library chatter (the leader-election library, the Kubernetes client, aiohttp's access log) is only shown with
`--log-level DEBUG`; otherwise those loggers log warnings and errors alone.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

FORMATS: Final = ("text", "json")
# the attribute of a LogRecord that carries its structured fields (set with extra=fields(...))
FIELDS: Final = "reservoir_fields"
# the loggers kept at WARNING unless --log-level DEBUG: kubernetes_asyncio.leaderelection logs every renew at INFO
QUIET_LOGGERS: Final = ("kubernetes_asyncio", "aiohttp.access", "aiohttp.client", "aiohttp.internal")

_BARE_VALUE = re.compile(r"[\x21\x23-\x3c\x3e-\x5b\x5d-\x7e]+")  # printable ASCII except space, ", = and \
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/]")


def fields(**values: Any) -> dict[str, Any]:
    """`log.info("msg", extra=fields(node=name, owner=owner))`: structured fields for one record."""
    return {FIELDS: values}


def decision(logger: logging.Logger, what: str, *, level: int = logging.INFO, **values: Any) -> None:
    """One decision, one line: `msg=decision decision=<what>` and then the fields (policy, node, owner, reason...)."""
    if logger.isEnabledFor(level):
        logger.log(level, "decision", extra=fields(decision=what, **values), stacklevel=2)


_NOTE_FIELD = re.compile(r'\s*([^\s="]+)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?=\s|$)')


def note_fields(note: str) -> dict[str, str] | None:
    """`key=value key="quoted value" reason=free text, to the end`: the fields of such a line (the planner's
    notes), or None when a word before `reason=` is not key=value. A value the planner could not write bare (a job
    named by a tenant: `job="ns/ReplicaSet/a b"`) is written with `quote` and read back here, so no text inside it
    can pass for a field of its own."""
    out: dict[str, str] = {}
    at = 0
    while at < len(note):
        if note.startswith("reason=", at) or note.startswith(" reason=", at):
            out["reason"] = note[note.index("reason=", at) + len("reason="):]
            return out
        match = _NOTE_FIELD.match(note, at)
        if match is None:
            return None if note[at:].strip() else out
        name, value = match.group(1), match.group(2)
        if value.startswith('"'):
            try:
                value = json.loads(value)
            except ValueError:
                return None
        out[name] = value
        at = match.end()
    return out


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(_text(item) for item in (sorted(value, key=str) if isinstance(value, set | frozenset)
                                                 else value))
    return str(value)


def quote(value: Any) -> str:
    """A logfmt value: bare when that is unambiguous, else a double-quoted JSON string (ASCII only)."""
    text = _text(value)
    return text if _BARE_VALUE.fullmatch(text) else json.dumps(text, ensure_ascii=True)


def printable(text: str) -> str:
    """Text safe to print on an operator's terminal: each control or other non-printable character (an escape
    sequence a tenant put in a job name, a newline that would fake a table row) shown as Python escapes it (`\\x1b`,
    `\\n`); printable text, non-ASCII letters included, as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def key(name: str) -> str:
    """A logfmt key: never quoted, so anything a parser would stop at becomes `_`."""
    return _KEY_UNSAFE.sub("_", name) or "_"


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record_fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    """The record as ordered fields: time, level, logger, msg, the structured fields, then exc/stack if any."""
    out: dict[str, Any] = {"time": _timestamp(record), "level": record.levelname.lower(), "logger": record.name,
                           "msg": record.getMessage()}
    extra = getattr(record, FIELDS, None)
    if isinstance(extra, Mapping):
        for name, value in extra.items():
            name = str(name)
            out[f"field.{name}" if name in ("time", "level", "logger", "msg") else name] = value
    if record.exc_info:
        out["exc"] = formatter.formatException(record.exc_info)
    elif record.exc_text:
        out["exc"] = record.exc_text
    if record.stack_info:
        out["stack"] = formatter.formatStack(record.stack_info)
    return out


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key(name)}={quote(value)}" for name, value in record_fields(record, self).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        values = {name: value if value is None or isinstance(value, str | int | float | bool) else
                  (sorted(value, key=str) if isinstance(value, set | frozenset) else value)
                  for name, value in record_fields(record, self).items()}
        return json.dumps(values, ensure_ascii=False, default=str, separators=(",", ":"))


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return LogfmtFormatter()
    raise ValueError(f"log format {log_format!r}: want one of {', '.join(FORMATS)}")


def quiet_libraries(level: int) -> None:
    """The libraries' INFO lines (a leader-election renew, an HTTP access line) only at DEBUG."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level <= logging.DEBUG else logging.WARNING)


def setup(level: str | int = "INFO", log_format: str = "text") -> None:
    """The process's logging: one handler on stderr with the chosen format, and quiet libraries."""
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"log level {level!r}: want DEBUG, INFO, WARNING or ERROR")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    handler.set_name("reservoir")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "reservoir"]:  # set up again: replaced, not doubled
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    quiet_libraries(numeric)
