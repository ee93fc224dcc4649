"""Consumable capacity (KEP-5075): what one allocation takes from a device's capacity, and whether it fits.

Same rules as upstream ``consumable_capacity.go``: a capacity the request does not mention consumes the
policy default (or the whole capacity without a policy); a requested amount is rounded up to the valid range
(``min`` plus a multiple of ``step``) or to the next valid value; the result must satisfy the policy and, summed
with what is already consumed on the device, stay within the capacity. A request naming a capacity the device
does not have never fits.
"""
from __future__ import annotations

from fractions import Fraction

from .model import Capacity, Device
from .quantity import BINARY_SI, Amount, Q


def consumed_amount(requested: Q | None, cap: Capacity) -> Q:
    """``calculateConsumedCapacity``."""
    if requested is None:
        if cap.default is not None:
            return cap.default
        return Q(cap.value, cap.fmt)
    if not cap.has_policy:
        return requested
    if cap.has_range and cap.range_min is not None:
        return _round_up_range(requested, cap)
    if cap.valid_values:
        for v in cap.valid_values:  # ascending, by API validation
            if requested.value <= v.value:
                return v
        return requested
    return requested


def _round_up_range(requested: Q, cap: Capacity) -> Q:
    lo = cap.range_min
    assert lo is not None  # the caller checks
    if requested.value < lo.value:
        return lo
    if cap.range_step is None:
        return requested
    # Upstream works on integer Value() (rounded up to whole units); so do we, to give the same numbers.
    req_i, lo_i, step_i = _ceil(requested.value), _ceil(lo.value), _ceil(cap.range_step.value)
    if step_i <= 0:
        return requested
    n, mod = divmod(req_i - lo_i, step_i)
    if mod:
        n += 1
    return Q(Fraction(lo_i + step_i * n), BINARY_SI)


def violates_policy(value: Q, cap: Capacity) -> bool:
    """``violatesPolicy``: above ``max``, off the ``step`` grid, or not one of ``validValues``."""
    if not cap.has_policy:
        return False
    if cap.default is not None and value.value == cap.default.value:
        return False
    if cap.has_range:
        if cap.range_max is not None and value.value > cap.range_max.value:
            return True
        if cap.range_step is not None and cap.range_min is not None:
            step = _ceil(cap.range_step.value)
            if step > 0 and (_ceil(value.value) - _ceil(cap.range_min.value)) % step:
                return True
        return False
    if cap.valid_values:
        return all(value.value != v.value for v in cap.valid_values)
    return False


def _ceil(value: Amount) -> int:
    return -((-value.numerator) // value.denominator)


def consumption(requests: dict[str, Q] | None, device: Device) -> dict[str, Q] | None:
    """What one allocation of ``device`` consumes (``GetConsumedCapacityFromRequest``), or None if it cannot
    be allocated at all whatever else is consumed (unknown capacity name or policy violation)."""
    if requests:
        for name in requests:
            if name not in device.capacity:
                return None
    out: dict[str, Q] = {}
    for name, cap in device.capacity.items():
        amount = consumed_amount(requests.get(name) if requests else None, cap)
        if violates_policy(amount, cap):
            return None
        out[name] = amount
    return out


def fits(amounts: dict[str, Q], device: Device, *used: dict[str, Amount] | None) -> str | None:
    """None if ``amounts`` plus every mapping in ``used`` stays within capacity; else the capacity that overflows."""
    for name, amount in amounts.items():
        total = amount.value
        for u in used:
            if u:
                total += u.get(name, 0)
        if total > device.capacity[name].value:
            return name
    return None
