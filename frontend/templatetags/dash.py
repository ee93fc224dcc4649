"""Display helpers for the dashboard templates: ages, percentages, Kubernetes quantities, v1 attribute values."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from django import template
from django.utils import timezone

register = template.Library()


def human_duration(seconds: float | None) -> str:
    """'42s', '7m 3s', '3h 12m', '4d 2h': two units at most, because an operator reads it at a glance."""
    if seconds is None:
        return "never"
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {sec}s" if sec and minutes < 10 else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


@register.filter
def age(value) -> str:
    """Time since a datetime (or a timedelta / seconds as-is)."""
    if value is None or value == "":
        return "never"
    if isinstance(value, datetime):
        return human_duration((timezone.now() - value).total_seconds())
    if isinstance(value, timedelta):
        return human_duration(value.total_seconds())
    return human_duration(float(value))


@register.filter
def pct(part, total) -> int:
    """Whole percent of part in total; 0 when the total is 0 (an empty cluster is not 'full')."""
    try:
        part, total = float(part or 0), float(total or 0)
    except (TypeError, ValueError):
        return 0
    return int(round(100 * part / total)) if total else 0


@register.filter
def share(part, total) -> str:
    """CSS width for a bar segment: a percentage with two decimals (floats so small segments still show)."""
    try:
        part, total = float(part or 0), float(total or 0)
    except (TypeError, ValueError):
        return "0%"
    return f"{(100 * part / total) if total else 0:.2f}%"


_BINARY_UNITS = [("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)]


def format_quantity(text) -> str:
    """A Kubernetes quantity for people: '81559Mi' -> '79.6 GiB', '1k' stays '1k', '98' stays '98'.

    Only binary-suffixed values (memory) are rescaled: counts such as multiprocessors read best as written.
    """
    if text is None:
        return ""
    text = str(text)
    if not text.endswith("i"):
        return text
    try:
        from dra.engine.quantity import parse_quantity as parse_quantity_value

        value: Fraction | int = parse_quantity_value(text)
    except Exception:  # not a quantity: show it untouched rather than fail a page
        return text
    for unit, size in _BINARY_UNITS:
        if value >= size:
            number = float(value / size)
            return f"{number:.1f} {unit}B" if number < 100 else f"{number:.0f} {unit}B"
    return f"{float(value):.0f} B"


@register.filter
def qty(text) -> str:
    return format_quantity(text)


def attribute_value(attr: dict | None):
    """The value of a v1 DeviceAttribute ({"string": "x"} / {"int": 3} / {"bool": true} / {"version": "1.2.3"})."""
    if not isinstance(attr, dict):
        return attr
    for key in ("string", "int", "bool", "version"):
        if key in attr:
            return attr[key]
    return None


@register.filter
def attrval(attr):
    return attribute_value(attr)


@register.filter
def get(mapping, key):
    """dict lookup with a variable key (templates cannot do ``d[key]``)."""
    if isinstance(mapping, dict):
        return mapping.get(key)
    return None


@register.filter
def plural(count, word: str) -> str:
    """'1 device', '3 devices'."""
    try:
        n = int(count)
    except (TypeError, ValueError):
        n = 0
    return f"{n:,} {word}" + ("" if n == 1 else "s")


@register.simple_tag(takes_context=True)
def qs(context, **changes) -> str:
    """The current query string with some parameters replaced (filters, pagination, time range)."""
    params = context["request"].GET.copy()
    for key, value in changes.items():
        if value in (None, ""):
            params.pop(key, None)
        else:
            params[key] = value
    encoded = params.urlencode()
    return f"?{encoded}" if encoded else "?"


@register.filter
def ts(value, precision: str = "") -> str:
    """A timestamp for people, in UTC: '2026-11-27 08:03 UTC' (``precision`` "s": seconds, "ms": milliseconds).
    Takes a datetime or an ISO 8601 string (the API's form, 'Z' or an offset, with or without microseconds);
    anything else is shown as given."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    if not isinstance(value, datetime):
        return "" if value is None else str(value)
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    value = value.astimezone(UTC)
    if precision == "ms":
        return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d} UTC"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC" if precision == "s" else "%Y-%m-%d %H:%M UTC")


@register.filter
def held(start, end) -> str:
    """The time from ``start`` to ``end`` to a tenth of a second below ten minutes ('68.1 s': the ledger keeps
    milliseconds, and rounding a short use to '1m' or '70 s' misstates it), else as ``human_duration``."""
    if not isinstance(start, datetime) or not isinstance(end, datetime):
        return ""
    seconds = (end - start).total_seconds()
    return f"{seconds:.1f} s" if seconds < 600 else human_duration(seconds)


@register.filter
def change(value) -> str:
    """One side of an audit trail change: "—" where the field was absent, text as it is, anything else (a number,
    a list, an object) as compact JSON, as the API shows it."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))
