"""Time windows of advance reservations: one window, or one a day or on some weekdays, in a time zone.

A window is written in wall-clock time (``start``, ``end``: ISO dates with a time and no offset) in an IANA
``timeZone``; a recurrence repeats it ``Daily`` or ``Weekly`` (on ``daysOfWeek``), first on the start's date,
last on ``until`` (a date, inclusive). Each occurrence starts at the same wall-clock time and lasts the same
wall-clock span: "02:00 to 06:00 in Europe/Berlin" is 02:00 to 06:00 on the clock there every night, so it
lasts 3 real hours on the night the clocks go forward and 5 on the night they go back (zoneinfo's offsets,
not a fixed UTC offset). A wall-clock time in the gap of a spring-forward is read with the offset before the
gap (PEP 495, ``fold=0``): 02:30 on that night is 03:30 summer time.

The rules of held capacity (``free_by_start``, ``may_use_held``) are here too, on plain seconds, so that the
scheduler (``scheduler.services.reservations``, ``scheduler.services.reservation_tick``) and the reservation
replay (``benchmarks/reservation_sim``) decide with the same functions.

Pure: no Django, no database (tests/queues/test_windows.py runs without services).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
FREQUENCIES = ("Daily", "Weekly")
WINDOW_FIELDS = ("start", "end", "timeZone", "recurrence")
RECURRENCE_FIELDS = ("frequency", "daysOfWeek", "until")
# One window lasts at most this long; a recurring one at most its period (occurrences never overlap).
MAX_SPAN = timedelta(days=31)
MAX_OCCURRENCES = 100_000  # a bound for any walk over occurrences (a daily window for 270 years)

Errors = list[tuple[str, str]]


@dataclass(frozen=True)
class Window:
    start: datetime  # naive: wall-clock time in ``zone``
    end: datetime
    zone: str
    frequency: str | None = None  # None: once
    days: tuple[int, ...] = ()  # weekdays (0 = Monday) of a Weekly (or filtered Daily) recurrence
    until: date | None = None

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.zone)

    @property
    def span(self) -> timedelta:
        return self.end - self.start


@dataclass(frozen=True, order=True)
class Occurrence:
    start: datetime  # aware, UTC
    end: datetime

    def overlaps(self, other: Occurrence) -> bool:
        return self.start < other.end and other.start < self.end


def parse(raw: Any, path: str = "spec.window") -> tuple[Window | None, dict, Errors]:
    """(window, normalized form, field errors): the window is None when there are errors."""
    errors: Errors = []
    if not isinstance(raw, dict):
        return None, {}, [(path, "Required value: {start, end, timeZone, recurrence}")]
    for key in raw:
        if key not in WINDOW_FIELDS:
            errors.append((f"{path}.{key}", f'Unsupported value: "{key}": supported values: '
                                            + ", ".join(f'"{k}"' for k in WINDOW_FIELDS)))
    zone = raw.get("timeZone", "UTC")
    if not isinstance(zone, str) or not _zone_ok(zone):
        errors.append((f"{path}.timeZone", f"Invalid value: {zone!r}: must be an IANA time zone such as "
                                           "Europe/Berlin"))
        zone = "UTC"
    start = _local(raw.get("start"), f"{path}.start", zone, errors)
    end = _local(raw.get("end"), f"{path}.end", zone, errors)
    if start is not None and end is not None and end <= start:
        errors.append((f"{path}.end", f"Invalid value: {raw.get('end')!r}: must be after start"))
    normalized: dict = {"start": _text(start) if start else raw.get("start"),
                        "end": _text(end) if end else raw.get("end"), "timeZone": zone}
    frequency, days, until = None, (), None
    if raw.get("recurrence") is not None:
        frequency, days, until, rec = _recurrence(raw["recurrence"], f"{path}.recurrence", start, errors)
        normalized["recurrence"] = rec
    if start is not None and end is not None and end > start:
        limit = {"Daily": timedelta(days=1), "Weekly": timedelta(days=7)}.get(frequency or "", MAX_SPAN)
        if frequency == "Weekly" and len(days) > 1:
            limit = min(timedelta(days=(b - a) % 7 or 7) for a, b in zip(days, days[1:] + days[:1], strict=True))
        if end - start > limit:
            errors.append((f"{path}.end", f"Invalid value: {raw.get('end')!r}: a window lasts at most "
                                          f"{_words(limit)}" + (" (its occurrences must not overlap)"
                                                                if frequency else "")))
    if errors or start is None or end is None:
        return None, normalized, errors
    return Window(start, end, zone, frequency, days, until), normalized, []


def _zone_ok(zone: str) -> bool:
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _local(value: Any, path: str, zone: str, errors: Errors) -> datetime | None:
    """A wall-clock time in ``zone``; a value with an offset (``Z``, ``+01:00``) is converted to it."""
    if value is None:
        errors.append((path, "Required value"))
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00")) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None:
        errors.append((path, f"Invalid value: {value!r}: must be a date and time such as 2026-12-01T02:00:00"))
        return None
    if when.tzinfo is not None:
        when = when.astimezone(ZoneInfo(zone)).replace(tzinfo=None)
    return when.replace(microsecond=0)


def _recurrence(raw: Any, path: str, start: datetime | None, errors: Errors):
    if not isinstance(raw, dict):
        errors.append((path, "Invalid value: must be {frequency, daysOfWeek, until}"))
        return None, (), None, {}
    for key in raw:
        if key not in RECURRENCE_FIELDS:
            errors.append((f"{path}.{key}", f'Unsupported value: "{key}": supported values: '
                                            + ", ".join(f'"{k}"' for k in RECURRENCE_FIELDS)))
    frequency = raw.get("frequency")
    if frequency not in FREQUENCIES:
        errors.append((f"{path}.frequency", f'Unsupported value: {frequency!r}: supported values: "Daily", '
                                            '"Weekly"'))
        frequency = None
    days_raw = raw.get("daysOfWeek") or []
    days: list[int] = []
    if not isinstance(days_raw, list):
        errors.append((f"{path}.daysOfWeek", f"Invalid value: {days_raw!r}: must be a list such as [Mon, Tue]"))
        days_raw = []
    for i, d in enumerate(days_raw):
        if d not in DAYS:
            errors.append((f"{path}.daysOfWeek[{i}]", f"Unsupported value: {d!r}: supported values: "
                                                      + ", ".join(f'"{x}"' for x in DAYS)))
        elif DAYS.index(d) in days:
            errors.append((f"{path}.daysOfWeek[{i}]", f"Duplicate value: {d!r}"))
        else:
            days.append(DAYS.index(d))
    if frequency == "Weekly" and not days and not errors and start is not None:
        days = [start.weekday()]  # weekly on the start's weekday
    until = None
    if raw.get("until") is not None:
        try:
            until = date.fromisoformat(str(raw["until"])[:10]) if isinstance(raw["until"], str) else None
        except ValueError:
            until = None
        if until is None:
            errors.append((f"{path}.until", f"Invalid value: {raw['until']!r}: must be a date such as 2027-03-01"))
        elif start is not None and until < start.date():
            errors.append((f"{path}.until", f"Invalid value: {raw['until']!r}: must not be before the start"))
    days.sort()
    rec: dict = {"frequency": frequency or raw.get("frequency")}
    if days:
        rec["daysOfWeek"] = [DAYS[d] for d in days]
    if raw.get("until") is not None:
        rec["until"] = until.isoformat() if until else raw["until"]
    return frequency, tuple(days), until, rec


def occurrences(window: Window, since: datetime, until: datetime) -> Iterator[Occurrence]:
    """The occurrences that end after ``since`` and start before ``until`` (aware datetimes), in order."""
    tz = window.tz
    if window.frequency is None:
        occ = _at(window, window.start, tz)
        if occ.end > since and occ.start < until:
            yield occ
        return
    day = window.start.date()
    # Skip ahead: occurrences ending before ``since`` (a window lasts at most a week).
    first = since.astimezone(tz).date() - timedelta(days=8)
    if first > day:
        day = first
    for _ in range(MAX_OCCURRENCES):
        if window.until is not None and day > window.until:
            return
        if window.frequency == "Daily" and not window.days or day.weekday() in window.days:
            occ = _at(window, datetime.combine(day, window.start.time()), tz)
            if occ.start >= until:
                return
            if occ.end > since and day >= window.start.date():
                yield occ
        elif datetime.combine(day, window.start.time()).replace(tzinfo=tz) >= until:
            return
        day += timedelta(days=1)


def _at(window: Window, local_start: datetime, tz: ZoneInfo) -> Occurrence:
    local_end = local_start + window.span
    return Occurrence(local_start.replace(tzinfo=tz).astimezone(UTC), local_end.replace(tzinfo=tz).astimezone(UTC))


def current_or_next(window: Window, now: datetime) -> Occurrence | None:
    """The occurrence running at ``now``, else the next one (None: none is left)."""
    return next(occurrences(window, now, now + timedelta(days=3660)), None)


def first_overlap(a: list[Occurrence], b: list[Occurrence]) -> tuple[Occurrence, Occurrence] | None:
    """The first pair (one of ``a``, one of ``b``, both sorted) that overlaps, or None."""
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i].overlaps(b[j]):
            return a[i], b[j]
        if a[i].end <= b[j].end:
            i += 1
        else:
            j += 1
    return None


def free_by_start(ends_at: float | None, start: float, margin: float) -> bool:
    """Does a running claim's device count free for a hold that starts at ``start``? Only when its walltime
    ends (``ends_at``; None: no walltime, it may run for ever) a ``margin`` (the lease sweep's period and a
    round's latency: when the device is in fact free again) before the start."""
    return ends_at is not None and ends_at + margin <= start


def may_use_held(walltimes: list[float | None], now: float, margin: float, start: float, end: float,
                 lend_idle: bool, own_waiting: bool = False) -> bool:
    """May a group whose claims have these walltimes (seconds; None or 0: none) land on capacity held for an
    occurrence [start, end), at ``now`` (held: ``now`` is at or after start − lead)? Before the start, only
    when every claim ends, with ``margin``, by the start; inside the window, only with ``lend_idle``, while
    none of the reservation's own claims waits for room in it (``own_waiting``: then the capacity is not idle,
    it is theirs), and when every claim ends by the end. A claim without a walltime never does."""
    if not walltimes or not all(walltimes):
        return False
    inside = start <= now < end
    if inside and (not lend_idle or own_waiting):
        return False
    return now + max(w for w in walltimes if w) + margin <= (end if inside else start)


def _text(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S")


def _words(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours:g} hours" if hours < 48 else f"{hours / 24:g} days"
