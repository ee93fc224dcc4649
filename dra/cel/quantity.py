"""Kubernetes resource.Quantity as a CEL value, with the `kubernetes.quantity` library semantics.

Parsing follows `k8s.io/apimachinery/pkg/api/resource.ParseQuantity`: a signed decimal number and
one optional suffix (binary SI `Ki`..`Ei`, decimal SI `n u m k M G T P E`, or a decimal exponent
`e3`/`E-2`). Values are kept as exact fractions so that `quantity("200M").compareTo(quantity("0.2G"))`
is 0 as upstream; like upstream, anything finer than 10^-9 is rounded away from zero at parse time.
"""
from __future__ import annotations

import re
from fractions import Fraction

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

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
# Upstream's own description of the format; its error text quotes this expression.
SPLIT_RE_STRING = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ERR_FORMAT_WRONG = f"quantities must match the regular expression '{SPLIT_RE_STRING}'"
ERR_NUMERIC = "unable to parse numeric part of quantity"
ERR_SUFFIX = "unable to parse quantity's suffix"

_NUMBER = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?")
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")
_NANO = 10**9
# An exponent this large cannot come from a real device and would make exact arithmetic
# allocate huge integers; upstream's inf.Dec has a similar practical bound.
_MAX_EXPONENT = 10**4


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity; message is upstream's."""


def parse_quantity_value(text: str) -> Fraction:
    """Parse like resource.ParseQuantity and return the exact value (rounded to nano)."""
    if not isinstance(text, str) or not text:
        raise QuantityError(ERR_FORMAT_WRONG)
    match = _NUMBER.match(text)
    assert match is not None  # every part of the pattern is optional
    sign, whole, frac = match.group(1), match.group(2), match.group(3)
    if not whole and not frac:
        raise QuantityError(ERR_FORMAT_WRONG)
    suffix = text[match.end():]
    if suffix in _BINARY:
        factor = Fraction(_BINARY[suffix])
    elif suffix in _DECIMAL:
        factor = _DECIMAL[suffix]
    else:
        exp = _EXPONENT.fullmatch(suffix)
        if exp is None:
            if re.fullmatch(r"[eEinumkKMGTP]*[-+]?[0-9]*", suffix):
                raise QuantityError(ERR_SUFFIX)
            raise QuantityError(ERR_FORMAT_WRONG)
        power = int(exp.group(1))
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(ERR_NUMERIC)
        factor = Fraction(10) ** power
    number = Fraction(int(whole or "0"))
    if frac:
        number += Fraction(int(frac), 10 ** len(frac))
    value = number * factor
    if sign == "-":
        value = -value
    return _round_to_nano(value)


def _round_to_nano(value: Fraction) -> Fraction:
    scaled = value * _NANO
    if scaled.denominator == 1:
        return value
    # inf.RoundUp: away from zero.
    magnitude = -(-abs(scaled.numerator) // scaled.denominator)
    return Fraction(magnitude if value > 0 else -magnitude, _NANO)


class Quantity:
    """An immutable Kubernetes quantity. Equality is by value (`1Gi == 1024Mi`), as upstream."""

    __slots__ = ("value", "text")

    def __init__(self, value: Fraction, text: str | None = None):
        self.value = value
        self.text = text

    @classmethod
    def parse(cls, text: str) -> Quantity:
        return cls(parse_quantity_value(text), text)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value == other.value
        # CEL has no implicit conversion between a quantity and a number or string.
        raise TypeError(f"no such overload: Quantity == {type(other).__name__}")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("quantity", self.value))

    def __repr__(self) -> str:
        return f"quantity({str(self)!r})"

    def __str__(self) -> str:
        return self.text if self.text is not None else format_quantity(self.value)

    # --- the kubernetes.quantity library ---------------------------------------------------
    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def as_int64(self) -> int | None:
        if self.value.denominator != 1:
            return None
        n = self.value.numerator
        return n if _INT64_MIN <= n <= _INT64_MAX else None

    def as_float(self) -> float:
        return float(self.value)

    def add(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(int(other))
        return Quantity(self.value + delta)

    def sub(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(int(other))
        return Quantity(self.value - delta)


def format_quantity(value: Fraction) -> str:
    """A readable canonical-ish form: binary suffix when exact, else decimal SI."""
    if value == 0:
        return "0"
    if value.denominator == 1:
        n = value.numerator
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if n % _BINARY[suffix] == 0 and abs(n) >= _BINARY[suffix]:
                return f"{n // _BINARY[suffix]}{suffix}"
        for suffix in ("E", "P", "T", "G", "M", "k"):
            base = _DECIMAL[suffix].numerator
            if n % base == 0:
                return f"{n // base}{suffix}"
        return str(n)
    for suffix in ("m", "u", "n"):
        scaled = value / _DECIMAL[suffix]
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    return str(float(value))
