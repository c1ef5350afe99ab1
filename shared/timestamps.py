"""RFC 3339 timestamps as the Kubernetes API writes them (`2026-11-22T10:17:00Z`): the one format, both ways."""

from __future__ import annotations

from datetime import datetime
from typing import TypeGuard

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def stamp(moment: datetime) -> str:
    """A UTC datetime as the API writes it, to the second."""
    return moment.strftime(FORMAT)


# the years an object's time is read within: naive or farther out is not comparable, or overflows when a duration is
# added to it (views, lock info, grants, expiries)
FIRST_YEAR, LAST_YEAR = 1970, 9000


def in_range(moment: datetime | None) -> TypeGuard[datetime]:
    """An aware time between FIRST_YEAR and LAST_YEAR."""
    return moment is not None and moment.tzinfo is not None and FIRST_YEAR <= moment.year <= LAST_YEAR


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 timestamp as an aware datetime; None when absent."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
