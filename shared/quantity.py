"""Kubernetes quantity strings as exact integers.

cpu is counted in millicores, everything else (memory, storage, pods, extended resources) in whole units,
rounding up exactly as the apiserver's `MilliValue()` / `Value()` do. No floats: a quantity is parsed to a
`Fraction` and rounded once.
"""

from __future__ import annotations

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


class QuantityError(ValueError):
    """A quantity string the apiserver would not accept; the message quotes it."""


def parse_quantity(text: str | int) -> Fraction:
    """The exact value of a Kubernetes quantity (`500m`, `2Gi`, `1.5`, `1e3`, `128974848`)."""
    if isinstance(text, bool):
        raise QuantityError(f"quantity {text!r} is not valid: expected {ACCEPTED}")
    if isinstance(text, int):
        return Fraction(text)
    if not isinstance(text, str):
        raise QuantityError(f"quantity {text!r} is not valid: expected {ACCEPTED}")
    match = _GRAMMAR.match(text.strip())
    if not match or not text.strip():
        raise QuantityError(f"quantity {text!r} is not valid: expected {ACCEPTED}")
    value = Fraction(match["number"]) if match["number"] != "." else None
    if value is None:
        raise QuantityError(f"quantity {text!r} is not valid: expected {ACCEPTED}")
    if match["binary"]:
        value *= _BINARY[match["binary"]]
    elif match["exp"]:
        value *= Fraction(10) ** int(match["exp"][1:])
    else:
        value *= _DECIMAL[match["decimal"] or ""]
    return -value if match["sign"] == "-" else value


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


def to_int(resource: str, text: str | int) -> int:
    """The quantity as an exact integer: millicores for cpu, whole units (bytes, pods, ...) otherwise."""
    value = parse_quantity(text)
    return _ceil(value * 1000) if resource in MILLI_RESOURCES else _ceil(value)


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
