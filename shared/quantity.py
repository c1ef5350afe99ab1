"""Kubernetes quantity strings as exact integers.

cpu is counted in millicores, everything else (memory, storage, pods, extended resources) in whole units,
rounding up exactly as the apiserver's `MilliValue()` / `Value()` do. No floats: a quantity is parsed to a
`Fraction` and rounded once.

Bounds, checked on the text before any arithmetic, so that no quantity costs more than microseconds (an unbounded
`1e10000000` took 9 s of big-number arithmetic): at most `MAX_LENGTH` (64) characters, at most `MAX_DIGITS` (40)
digits in the number, an exponent (`1e3`) within +-`MAX_EXPONENT` (40); and the value at most `MAX_MAGNITUDE`
(2^63-1 whole units) in magnitude, Kubernetes' own limit ("no quantity may represent a number greater than 2^63-1 in
magnitude", apimachinery `resource.Quantity`; it caps larger ones, Reservoir refuses them). A quantity outside them
raises `QuantityError` naming the value and the bound. Kubernetes' own canonical form never comes near them: 19
integer digits and 9 decimal places at most, suffixes up to `E` (10^18) and `Ei` (2^60).
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

_GRAMMAR = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))$"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
ACCEPTED = "a number with an optional suffix: m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent like 1e3"
MILLI_RESOURCES = frozenset({"cpu"})
MAX_LENGTH = 64
MAX_DIGITS = 40
MAX_EXPONENT = 40
MAX_MAGNITUDE = 2**63 - 1


class QuantityError(ValueError):
    """A quantity string the apiserver would not accept; the message quotes it."""


def _shown(text: object) -> str:
    """The value as an error message quotes it: a string (shortened past MAX_LENGTH), an int (by its size past
    MAX_DIGITS: Python refuses to print an int of more than 4300 digits), else only its type."""
    if isinstance(text, str):
        return repr(text) if len(text) <= MAX_LENGTH else f"{text[:MAX_LENGTH]!r}... ({len(text)} characters)"
    if isinstance(text, int) and not isinstance(text, bool):
        return repr(text) if abs(text) < 10**MAX_DIGITS else f"an integer of about {text.bit_length() * 3 // 10} digits"
    return f"of type {type(text).__name__}"


def _invalid(text: object) -> QuantityError:
    return QuantityError(f"quantity {_shown(text)} is not valid: expected {ACCEPTED}")


def _too_large(text: object) -> QuantityError:
    return QuantityError(f"quantity {_shown(text)} is out of range: at most {MAX_MAGNITUDE} (2^63-1) in magnitude, "
                         "Kubernetes' own limit")


def parse_quantity(text: str | int) -> Fraction:
    """The exact value of a Kubernetes quantity (`500m`, `2Gi`, `1.5`, `1e3`, `128974848`); QuantityError for
    anything else, or anything outside the bounds of the module docstring."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise _invalid(text)
    if isinstance(text, int):
        if abs(text) > MAX_MAGNITUDE:
            raise _too_large(text)
        return Fraction(text)
    body = text.strip()
    if len(body) > MAX_LENGTH:
        raise QuantityError(f"quantity {_shown(text)} is too long: at most {MAX_LENGTH} characters")
    match = _GRAMMAR.match(body)
    if not match or match["number"] == ".":
        raise _invalid(text)
    number = match["number"]
    digits = len(number) - ("." in number)
    if digits > MAX_DIGITS:
        raise QuantityError(f"quantity {text!r} has {digits} digits: at most {MAX_DIGITS}")
    if match["binary"]:
        scale = Fraction(_BINARY[match["binary"]])
    elif match["exp"]:
        exponent = int(match["exp"][1:])  # bounded by MAX_LENGTH: a few digits at most
        if abs(exponent) > MAX_EXPONENT:
            raise QuantityError(f"quantity {text!r} has exponent {exponent}: at most {MAX_EXPONENT} in magnitude")
        scale = Fraction(10) ** exponent
    else:
        scale = _DECIMAL[match["decimal"] or ""]
    value = Fraction(number) * scale  # at most 10^(MAX_DIGITS + MAX_EXPONENT): cheap
    if value > MAX_MAGNITUDE:
        raise _too_large(text)
    return -value if match["sign"] == "-" else value


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


# quantity strings whose integers are kept (to_int): a cluster's pods repeat a few hundred ("500m", "4Gi"); the agent
# reads every pod's at each change and `reservoir simulate` at each of its events. Bounded, so a tenant writing new
# ones pushes out only the oldest; texts over MAX_LENGTH are refused, never kept
QUANTITIES_KEPT = 4096


@functools.lru_cache(maxsize=QUANTITIES_KEPT)
def _text_to_int(milli: bool, text: str) -> int:
    value = parse_quantity(text)
    return _ceil(value * 1000) if milli else _ceil(value)


def to_int(resource: str, text: str | int) -> int:
    """The quantity as an exact integer: millicores for cpu, whole units (bytes, pods, ...) otherwise."""
    milli = resource in MILLI_RESOURCES
    if type(text) is str and len(text) <= MAX_LENGTH:
        return _text_to_int(milli, text)
    value = parse_quantity(text)
    return _ceil(value * 1000) if milli else _ceil(value)


def format_quantity(resource: str, amount: int) -> str:
    """The canonical string for an integer amount, as `kubectl` would print it (`1500m`, `2`, `4Gi`)."""
    if resource in MILLI_RESOURCES:
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    if amount == 0:
        return "0"
    for suffix, factor in reversed(_BINARY.items()):
        if amount % factor == 0:
            return f"{amount // factor}{suffix}"
    return str(amount)
