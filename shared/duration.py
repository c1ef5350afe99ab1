"""Durations in Go's `time.ParseDuration` syntax (`500s`, `2h30m`, `1h0m0s`, `90m`, `1.5h`), exact to the
microsecond.

Bounds, so that no text costs more than microseconds and none overflows: at most `MAX_LENGTH` (64) characters,
checked before any arithmetic; and at most `MAX_NANOSECONDS` (2^63-1 ns, about 292 years: `2562047h47m16.854775807s`)
in magnitude, Go's own limit (time.ParseDuration refuses more with "invalid duration"), which also keeps every result
far inside `datetime.timedelta` (999999999 days). `999999999999h` is a DurationError, never an OverflowError.
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from fractions import Fraction

_UNIT_NS = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,  # U+00B5 micro sign
    "μs": 10**3,  # U+03BC greek mu
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
MAX_LENGTH = 64
MAX_NANOSECONDS = 2**63 - 1
LARGEST = "2562047h47m16.854775807s"
ACCEPTED = "a Go duration such as 500s, 90m, 2h30m or 1.5h (units ns, us, ms, s, m, h)"


class DurationError(ValueError):
    """A duration string Go's time.ParseDuration would refuse; the message quotes it."""


# duration texts whose values are kept (parse_duration): a cluster's pods repeat a few (`maximum-runtime` values);
# the agent reads every pod's at each change and `reservoir simulate` at each of its events. Bounded, so a tenant
# writing new ones pushes out only the oldest; texts over MAX_LENGTH are never kept
DURATIONS_KEPT = 4096


def parse_duration(text: str) -> timedelta:
    """Parse a Go duration. `0` alone is accepted; every other number needs a unit."""
    if type(text) is str and len(text) <= MAX_LENGTH:
        return _parse_kept(text)
    return _parse(text)


@functools.lru_cache(maxsize=DURATIONS_KEPT)
def _parse_kept(text: str) -> timedelta:
    return _parse(text)


def _parse(text: str) -> timedelta:
    if not isinstance(text, str):
        raise DurationError(f"duration of type {type(text).__name__} is not valid: expected {ACCEPTED}")
    body = text.strip()
    if len(body) > MAX_LENGTH:
        raise DurationError(f"duration {text[:MAX_LENGTH]!r}... ({len(text)} characters) is too long: at most "
                            f"{MAX_LENGTH} characters")
    sign = -1 if body.startswith("-") else 1
    if body[:1] in ("+", "-"):
        body = body[1:]
    if body == "0":
        return timedelta(0)
    if not body:
        raise DurationError(f"duration {text!r} is not valid: expected {ACCEPTED}")
    total = Fraction(0)
    pos = 0
    while pos < len(body):
        match = _PART.match(body, pos)
        if not match or match.group(1) in ("", "."):
            raise DurationError(f"duration {text!r} is not valid: expected {ACCEPTED}")
        total += Fraction(match.group(1)) * _UNIT_NS[match.group(2)]  # bounded by MAX_LENGTH: cheap
        pos = match.end()
    if total > MAX_NANOSECONDS:
        raise DurationError(f"duration {text!r} is out of range: at most {LARGEST} (2^63-1 ns, Go's limit)")
    microseconds = total / 1000
    whole = microseconds.numerator // microseconds.denominator
    return timedelta(microseconds=sign * whole)


def format_duration(value: timedelta) -> str:
    """A short Go-style rendering: `2h30m`, `90s`, `0s`; sub-second parts are dropped."""
    seconds = int(value.total_seconds())
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return sign + (out or "0s")
