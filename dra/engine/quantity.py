"""Kubernetes resource quantities (``resource.Quantity``): exact parsing and canonical formatting.

Capacity arithmetic must be exact (a device with ``80Gi`` holds exactly ten ``8Gi`` shares), so values are
``fractions.Fraction`` and never floats. Formatting follows apimachinery's canonical form, so that
``consumedCapacity`` in results reads like what the API server would store.
"""
from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache
from typing import TypeAlias

BINARY_SI = "BinarySI"
DECIMAL_SI = "DecimalSI"
DECIMAL_EXPONENT = "DecimalExponent"

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX_BY_EXP = {exp: suffix for suffix, exp in _DECIMAL.items()}
_BINARY_SUFFIX_BY_POW = {pow_: suffix for suffix, pow_ in _BINARY.items()}

_RE = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?$")
_NANO = Fraction(1, 10**9)

# An exact quantity value: a plain int when integral (nearly always), a Fraction otherwise.
Amount: TypeAlias = int | Fraction


class QuantityError(ValueError):
    pass


def parse_quantity_with_format(text: str) -> tuple[Amount, str]:
    """Returns (value, format) of a quantity string; raises ``QuantityError`` for anything malformed."""
    if isinstance(text, (list, dict)):  # from JSON; unhashable, so it must not reach the cache
        raise QuantityError(f"quantities must match the regular expression: {text!r}")
    return _parse_with_format(text)


@lru_cache(maxsize=65536)
def _parse_with_format(text: str) -> tuple[Amount, str]:
    if not isinstance(text, str):
        if isinstance(text, bool):
            raise QuantityError(f"quantities must match the regular expression: {text!r}")
        if isinstance(text, int):
            return Fraction(text), DECIMAL_SI
        raise QuantityError(f"quantities must match the regular expression: {text!r}")
    match = _RE.match(text.strip())
    if not match or text.strip() == "":
        raise QuantityError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}")
    sign, number, suffix, exponent = match.groups()
    value = Fraction(number)
    if sign == "-":
        value = -value
    if exponent is not None:
        value *= Fraction(10) ** int(exponent)
        fmt = DECIMAL_EXPONENT
    elif suffix in _BINARY:
        value *= 1024 ** _BINARY[suffix]
        fmt = BINARY_SI
    else:
        value *= Fraction(10) ** _DECIMAL[suffix or ""]
        fmt = DECIMAL_SI
    # apimachinery keeps at most nanounit precision and rounds up (away from zero).
    if value.denominator != 1 and (value / _NANO).denominator != 1:
        nanos = -((-value.numerator * 10**9) // value.denominator) if value > 0 else \
            (value.numerator * 10**9) // value.denominator
        value = Fraction(nanos, 10**9)
    # Integral values (bytes, counts: nearly all of them) stay plain ints: exact, and much faster to add and
    # compare than Fractions in the search's inner loop.
    if value.denominator == 1:
        return int(value), fmt
    return value, fmt


def parse_quantity(text: str) -> Amount:
    return parse_quantity_with_format(text)[0]


def format_quantity(value: Amount, fmt: str = DECIMAL_SI) -> str:
    """Canonical string of ``value`` in ``fmt`` (apimachinery ``Quantity.String()``)."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mag = -value if value < 0 else value
    if fmt == BINARY_SI and mag.denominator == 1 and mag >= 1024:
        n = mag.numerator
        power = 0
        while n % 1024 == 0 and power < 6:
            n //= 1024
            power += 1
        if power:
            return f"{sign}{n}{_BINARY_SUFFIX_BY_POW[power]}"
        return f"{sign}{mag.numerator}"
    if fmt == BINARY_SI and mag.denominator == 1:
        return f"{sign}{mag.numerator}"
    # Decimal forms: the largest exponent (multiple of 3) that keeps an integer mantissa.
    exp = 0
    scaled = mag
    while scaled.denominator != 1 and exp > -9:
        scaled *= 1000
        exp -= 3
    if scaled.denominator != 1:  # below nano precision: round up like apimachinery
        scaled = Fraction(-(-scaled.numerator // scaled.denominator))
    n = scaled.numerator
    while exp < 18 and n % 1000 == 0:
        n //= 1000
        exp += 3
    if fmt == DECIMAL_EXPONENT:
        return f"{sign}{n}" + (f"e{exp}" if exp else "")
    return f"{sign}{n}{_DECIMAL_SUFFIX_BY_EXP[exp]}"


def canonical(text: str) -> str:
    value, fmt = parse_quantity_with_format(text)
    return format_quantity(value, fmt)


class Q:
    """A quantity value that remembers the format it came in, so derived values print the same way."""

    __slots__ = ("value", "fmt")

    def __init__(self, value: Amount, fmt: str = DECIMAL_SI):
        self.value = value
        self.fmt = fmt

    @classmethod
    def parse(cls, text) -> Q:
        value, fmt = parse_quantity_with_format(text)
        return cls(value, fmt)

    def __str__(self) -> str:
        return format_quantity(self.value, self.fmt)

    def __repr__(self) -> str:
        return f"Q({self})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Q) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)
