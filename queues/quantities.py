"""Quota amounts for people and API messages: memory in binary quantities (``70Gi``), devices as counts.

Usage and quota are kept as exact ``Fraction``s of the base unit (bytes for memory); shown raw, a memory figure
is a 10- or 11-digit byte count nobody reads. Only resources whose name says they are memory are scaled: other
counters (``multiprocessors``, MIG ``memory-slice-N`` placement counters) are counts.
"""
from __future__ import annotations

import re
from fractions import Fraction

_MEMORY = re.compile(r"(^|[-_./])(memory|mem|vram)$", re.IGNORECASE)
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def is_memory(name: str) -> bool:
    return bool(_MEMORY.search(name or ""))


def plain(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


def quantity(value: Fraction | int, name: str = "", *, exact: bool = True) -> str:
    """``value`` of resource ``name`` as a Kubernetes quantity: memory with the largest binary suffix that
    keeps it whole (``exact``: ``80384Mi``, a valid quantity for API messages), or, for reading, in ``Gi`` with
    one decimal (``78.5Gi``); anything else as a plain number."""
    value = Fraction(value)
    if not is_memory(name) or value <= 0:
        return plain(value)
    for suffix, size in _BINARY:
        if value >= size and (value / size).denominator == 1:
            if exact or size >= 2**30:
                return f"{value // size}{suffix}"
            break
    if exact:
        return plain(value)
    for suffix, size in _BINARY:
        if value >= size:
            return f"{float(value / size):.1f}".rstrip("0").rstrip(".") + suffix
    return plain(value)
