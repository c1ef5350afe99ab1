from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.quantity import QuantityError, format_quantity, parse_quantity, to_int


@pytest.mark.parametrize(
    ("resource", "text", "expected"),
    [
        ("cpu", "500m", 500),
        ("cpu", "1", 1000),
        ("cpu", "1.5", 1500),
        ("cpu", "0.1", 100),
        ("cpu", "1n", 1),  # rounds up, as MilliValue() does
        ("cpu", "100u", 1),
        ("cpu", "2k", 2_000_000),
        ("cpu", "1e3", 1_000_000),
        ("cpu", ".5", 500),
        ("cpu", "5.", 5000),
        ("memory", "1Ki", 1024),
        ("memory", "2Gi", 2 * 2**30),
        ("memory", "1.5Gi", 3 * 2**29),
        ("memory", "128974848", 128974848),
        ("memory", "129e6", 129_000_000),
        ("memory", "129M", 129_000_000),
        ("memory", "123Mi", 123 * 2**20),
        ("memory", "1E", 10**18),
        ("memory", "1Ei", 2**60),
        ("memory", "1P", 10**15),
        ("memory", "0.5", 1),  # rounds up, as Value() does
        ("memory", "1500m", 2),
        ("memory", "1E-3", 1),
        ("nvidia.com/gpu", "8", 8),
        ("pods", "110", 110),
        ("cpu", "-1", -1000),
        ("cpu", "+2", 2000),
        ("cpu", 3, 3000),
    ],
)
def test_to_int(resource: str, text: str, expected: int) -> None:
    assert to_int(resource, text) == expected


@pytest.mark.parametrize("text", ["", "1x", "Gi", "1 Gi", "1.2.3", "1ki", "1KI", "e3", "1e", "1e1.5", ".", "--1",
                                  "1Mi1"])
def test_bad_quantities_quote_the_text(text: str) -> None:
    with pytest.raises(QuantityError) as err:
        parse_quantity(text)
    assert repr(text) in str(err.value)


def test_exact_fraction() -> None:
    assert parse_quantity("1.5Gi") == Fraction(3 * 2**29)
    assert parse_quantity("1m") == Fraction(1, 1000)


@pytest.mark.parametrize(("resource", "amount", "text"), [
    ("cpu", 1500, "1500m"), ("cpu", 2000, "2"), ("memory", 4 * 2**30, "4Gi"), ("memory", 1000, "1000"),
    ("memory", 0, "0"), ("pods", 3, "3"),
])
def test_format(resource: str, amount: int, text: str) -> None:
    assert format_quantity(resource, amount) == text


@given(st.integers(min_value=0, max_value=2**62), st.sampled_from(["cpu", "memory", "ephemeral-storage", "pods"]))
def test_format_parse_round_trip(amount: int, resource: str) -> None:
    assert to_int(resource, format_quantity(resource, amount)) == amount


_number = st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False, allow_infinity=False)
_suffix = st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "e3", "e-2"])


@given(_number, _suffix, _number, _suffix, st.sampled_from(["cpu", "memory"]))
def test_rounding_preserves_order(a, sa, b, sb, resource) -> None:
    """Exact values ordered a <= b stay ordered after rounding to integers."""
    ta, tb = f"{a}{sa}", f"{b}{sb}"
    if parse_quantity(ta) <= parse_quantity(tb):
        assert to_int(resource, ta) <= to_int(resource, tb)
    else:
        assert to_int(resource, ta) >= to_int(resource, tb)


@given(_number, _suffix)
def test_rounding_is_ceiling(value, suffix) -> None:
    text = f"{value}{suffix}"
    exact = parse_quantity(text)
    units = to_int("memory", text)
    assert units - 1 < exact <= units


# --- bounds (issue 10): checked on the text before any big-number arithmetic ---

def test_a_huge_exponent_fails_before_any_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """`1e10000000` took 9 s of Fraction arithmetic before the exponent was bounded. The cost is checked as work
    done, never as time (`python -m bench.unit_speed` times it): no Fraction is made."""
    from shared import quantity

    made: list[tuple[object, ...]] = []

    def fraction(*args: object) -> Fraction:
        made.append(args)
        return Fraction(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(quantity, "Fraction", fraction)
    quantity._text_to_int.cache_clear()  # "1e3" below must be parsed, not found among the texts kept
    with pytest.raises(QuantityError) as err:
        to_int("cpu", "1e10000000")
    assert made == []
    assert "'1e10000000'" in str(err.value) and "exponent 10000000" in str(err.value) and "at most 40" in str(err.value)
    assert to_int("cpu", "1e3") == 1_000_000 and made, "the spy sees the arithmetic of a quantity within bounds"


@pytest.mark.parametrize(("text", "bound"), [
    ("1e41", "exponent 41: at most 40"),
    ("1e-41", "exponent -41: at most 40"),
    ("1" * 41, "41 digits: at most 40"),
    ("0." + "0" * 39 + "1", "41 digits: at most 40"),
    ("1" * 65, "at most 64 characters"),
    ("9" * 100000, "at most 64 characters"),
    ("9223372036854775808", "at most 9223372036854775807"),
    ("8Ei", "at most 9223372036854775807"),
    ("10E", "at most 9223372036854775807"),
    ("1e19", "at most 9223372036854775807"),
    ("-1e19", "at most 9223372036854775807"),
])
def test_each_bound_fails_with_a_quantity_error_naming_it(text: str, bound: str) -> None:
    with pytest.raises(QuantityError) as err:
        parse_quantity(text)
    assert bound in str(err.value)
    assert text[:20] in str(err.value)


@pytest.mark.parametrize("text", ["9e18", "1e-40", "9223372036854775807", "-9223372036854775807", "7Ei", "9E",
                                  "0." + "0" * 38 + "1", "1" * 19, "1e18", "9223372036854775807000m"])
def test_values_inside_the_bounds_parse(text: str) -> None:
    parse_quantity(text)


def test_an_integer_outside_the_bounds_fails_without_printing_it() -> None:
    with pytest.raises(QuantityError) as err:
        parse_quantity(10**5000)  # Python refuses to print an int this long: the message must not try
    assert "digits" in str(err.value) and "9223372036854775807" in str(err.value)
    with pytest.raises(QuantityError):
        parse_quantity(2**63)
    assert parse_quantity(2**63 - 1) == 2**63 - 1


@pytest.mark.parametrize("value", [1.5, None, [1], {"a": 1}, True])
def test_values_of_other_types_fail_with_a_quantity_error(value: object) -> None:
    with pytest.raises(QuantityError) as err:
        parse_quantity(value)  # type: ignore[arg-type]
    assert type(value).__name__ in str(err.value)


@given(st.text(max_size=80))
def test_any_text_parses_or_fails_with_a_quantity_error(text: str) -> None:
    try:
        parse_quantity(text)
    except QuantityError:
        pass


def test_texts_kept_are_bounded_and_give_the_same_integers() -> None:
    """to_int keeps the integers of the quantity strings it saw (a cluster repeats a few hundred), at most
    QUANTITIES_KEPT of them: a tenant writing ever new ones pushes out only the oldest. Kept or not, the answer is
    the parse's, per resource (cpu in millicores)."""
    from shared import quantity

    quantity._text_to_int.cache_clear()
    assert to_int("cpu", "500m") == 500 and to_int("memory", "500m") == 1
    assert to_int("cpu", "500m") == 500 and to_int("memory", "500m") == 1, "kept per resource's unit"
    for i in range(quantity.QUANTITIES_KEPT + 100):
        assert to_int("memory", f"{i}Ki") == i * 1024
    assert quantity._text_to_int.cache_info().currsize == quantity.QUANTITIES_KEPT
    with pytest.raises(QuantityError):
        to_int("cpu", "1" * (quantity.MAX_LENGTH + 1))
    assert quantity._text_to_int.cache_info().currsize == quantity.QUANTITIES_KEPT
