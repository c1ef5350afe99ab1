from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.duration import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(("text", "expected"), [
    ("500s", timedelta(seconds=500)),
    ("2h30m", timedelta(hours=2, minutes=30)),
    ("1h0m0s", timedelta(hours=1)),
    ("90m", timedelta(minutes=90)),
    ("1.5h", timedelta(minutes=90)),
    ("0", timedelta(0)),
    ("300ms", timedelta(milliseconds=300)),
    ("1us", timedelta(microseconds=1)),
    ("1µs", timedelta(microseconds=1)),
    ("1500ns", timedelta(microseconds=1)),
    ("-2m", timedelta(minutes=-2)),
    (".5s", timedelta(milliseconds=500)),
    ("1h1h", timedelta(hours=2)),
])
def test_parse(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "5", "1d", "h", "1.h5", "2 h", "1y", "s1", ".s", "--1s", "1hm"])
def test_bad_durations_quote_the_text(text: str) -> None:
    with pytest.raises(DurationError) as err:
        parse_duration(text)
    assert repr(text) in str(err.value)


@given(st.integers(min_value=0, max_value=10**7))
def test_format_round_trip(seconds: int) -> None:
    value = timedelta(seconds=seconds)
    assert parse_duration(format_duration(value)) == value


def test_format_examples() -> None:
    assert format_duration(timedelta(hours=2, minutes=30)) == "2h30m"
    assert format_duration(timedelta(0)) == "0s"
    assert format_duration(timedelta(seconds=61)) == "1m1s"


# --- bounds (issue 10) ---

def test_a_duration_beyond_go_s_limit_is_a_duration_error_not_an_overflow() -> None:
    """`volcano.sh/maximum-runtime: "999999999999h"` raised OverflowError from timedelta."""
    with pytest.raises(DurationError) as err:
        parse_duration("999999999999h")
    assert "'999999999999h'" in str(err.value) and "2562047h47m16.854775807s" in str(err.value)


def test_the_largest_go_duration_parses_and_one_nanosecond_more_does_not() -> None:
    assert parse_duration("2562047h47m16.854775807s") == timedelta(seconds=9223372036, microseconds=854775)
    with pytest.raises(DurationError):
        parse_duration("2562047h47m16.854775808s")
    with pytest.raises(DurationError):
        parse_duration("-2562048h")


def test_a_long_text_fails_before_any_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost is checked as work done, never as time (`python -m bench.unit_speed` times it): a million-digit
    text is refused on its length, with no part of it matched and no number made of it."""
    from fractions import Fraction
    from types import SimpleNamespace

    from shared import duration

    work: list[str] = []
    real_part = duration._PART

    def fraction(*args: object) -> Fraction:
        work.append("Fraction")
        return Fraction(*args)  # type: ignore[arg-type]

    def part(*args: object) -> object:
        work.append("match")
        return real_part.match(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(duration, "Fraction", fraction)
    monkeypatch.setattr(duration, "_PART", SimpleNamespace(match=part))
    duration._parse_kept.cache_clear()  # "1h" parsed anew, not read from what earlier tests kept
    with pytest.raises(DurationError) as err:
        parse_duration("1" * 1_000_000 + "h")
    assert work == [] and "at most 64 characters" in str(err.value)
    assert parse_duration("1h") == timedelta(hours=1) and "match" in work and "Fraction" in work, "the spies see work"


def test_texts_kept_are_bounded_and_give_the_same_durations() -> None:
    """parse_duration keeps the values of the texts it saw (a cluster's pods repeat a few), at most DURATIONS_KEPT:
    a tenant writing ever new ones pushes out only the oldest, and a text over MAX_LENGTH is never kept. Kept or
    not, the answer is the parse's, and a text refused is refused again."""
    from shared import duration

    duration._parse_kept.cache_clear()
    assert parse_duration("90m") == parse_duration("90m") == timedelta(minutes=90)
    for i in range(duration.DURATIONS_KEPT + 100):
        assert parse_duration(f"{i}s") == timedelta(seconds=i)
    assert duration._parse_kept.cache_info().currsize == duration.DURATIONS_KEPT
    padded = " " * duration.MAX_LENGTH + "1h"
    assert parse_duration(padded) == timedelta(hours=1)
    for _ in range(2):
        with pytest.raises(DurationError):
            parse_duration("1x")
    assert duration._parse_kept.cache_info().currsize == duration.DURATIONS_KEPT


@pytest.mark.parametrize("value", [5, None, ["1h"], 1.5])
def test_values_of_other_types_fail_with_a_duration_error(value: object) -> None:
    with pytest.raises(DurationError) as err:
        parse_duration(value)  # type: ignore[arg-type]
    assert type(value).__name__ in str(err.value)


@given(st.text(max_size=80))
def test_any_text_parses_or_fails_with_a_duration_error(text: str) -> None:
    try:
        parse_duration(text)
    except DurationError:
        pass
