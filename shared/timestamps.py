"""RFC 3339 timestamps as the Kubernetes API writes them (`2026-11-22T10:17:00Z`): the one format, both ways."""

from __future__ import annotations

from datetime import datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def stamp(moment: datetime) -> str:
    """A UTC datetime as the API writes it, to the second."""
    return moment.strftime(FORMAT)


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 timestamp as an aware datetime; None when absent."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
