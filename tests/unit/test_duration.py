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
