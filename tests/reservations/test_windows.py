"""Occurrences of reservation windows (``dra.windows``): wall-clock times in a time zone, across DST changes."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dra import windows


def parse(raw):
    window, _, errors = windows.parse(raw)
    assert errors == [] and window is not None
    return window


def utc(*args):
    return datetime(*args, tzinfo=UTC)


def test_a_nightly_berlin_window_keeps_its_wall_clock_hours_across_both_dst_changes():
    w = parse({"start": "2026-03-27T02:00:00", "end": "2026-03-27T06:00:00", "timeZone": "Europe/Berlin",
               "recurrence": {"frequency": "Daily"}})
    got = list(windows.occurrences(w, utc(2026, 3, 27), utc(2026, 3, 31)))
    # 27 and 28 March: CET (+01:00); 29 March 02:00 does not exist (clocks jump to 03:00): read as 03:00 CEST,
    # so that night's window is 3 real hours; from 30 March: CEST (+02:00).
    assert [(o.start, o.end) for o in got] == [
        (utc(2026, 3, 27, 1), utc(2026, 3, 27, 5)),
        (utc(2026, 3, 28, 1), utc(2026, 3, 28, 5)),
        (utc(2026, 3, 29, 1), utc(2026, 3, 29, 4)),
        (utc(2026, 3, 30, 0), utc(2026, 3, 30, 4)),
    ]
    autumn = list(windows.occurrences(w, utc(2026, 10, 24, 12), utc(2026, 10, 26, 12)))
    # 25 October: 02:00 CEST to 06:00 CET is 5 real hours (the clocks go back at 03:00).
    assert [(o.start, o.end) for o in autumn] == [(utc(2026, 10, 25, 0), utc(2026, 10, 25, 5)),
                                                  (utc(2026, 10, 26, 1), utc(2026, 10, 26, 5))]


def test_weekly_on_some_days_until_a_date_inclusive():
    w = parse({"start": "2026-12-01T10:00:00", "end": "2026-12-01T12:00:00", "timeZone": "UTC",
               "recurrence": {"frequency": "Weekly", "daysOfWeek": ["Tue", "Thu"], "until": "2026-12-10"}})
    got = [o.start for o in windows.occurrences(w, utc(2026, 11, 1), utc(2027, 1, 1))]
    assert got == [utc(2026, 12, 1, 10), utc(2026, 12, 3, 10), utc(2026, 12, 8, 10), utc(2026, 12, 10, 10)]


def test_a_one_off_window_and_the_current_or_next_occurrence():
    w = parse({"start": "2026-12-01T02:00:00Z", "end": "2026-12-01T06:00:00Z"})
    assert w.zone == "UTC"
    assert windows.current_or_next(w, utc(2026, 12, 1, 3)) == windows.Occurrence(utc(2026, 12, 1, 2),
                                                                                  utc(2026, 12, 1, 6))
    assert windows.current_or_next(w, utc(2026, 12, 1, 6)) is None


def test_the_first_overlap_of_two_recurring_windows():
    nightly = parse({"start": "2026-12-01T02:00:00", "end": "2026-12-01T06:00:00", "timeZone": "UTC",
                     "recurrence": {"frequency": "Daily"}})
    friday = parse({"start": "2026-12-01T05:00:00", "end": "2026-12-01T07:00:00", "timeZone": "UTC",
                    "recurrence": {"frequency": "Weekly", "daysOfWeek": ["Fri"]}})
    since = utc(2026, 12, 1)
    a = list(windows.occurrences(nightly, since, since + timedelta(days=90)))
    b = list(windows.occurrences(friday, since, since + timedelta(days=90)))
    assert len(a) == 90 and len(b) == 13
    first = windows.first_overlap(a, b)
    assert first is not None and first[0].start == utc(2026, 12, 4, 2) and first[1].start == utc(2026, 12, 4, 5)


def test_bad_windows_name_the_field():
    cases = [
        ({"start": "2026-12-01T06:00:00", "end": "2026-12-01T02:00:00"}, "spec.window.end"),
        ({"start": "tomorrow", "end": "2026-12-01T02:00:00"}, "spec.window.start"),
        ({"start": "2026-12-01T02:00:00", "end": "2026-12-01T06:00:00", "timeZone": "Mars/Olympus"},
         "spec.window.timeZone"),
        ({"start": "2026-12-01T02:00:00", "end": "2026-12-02T06:00:00", "recurrence": {"frequency": "Daily"}},
         "spec.window.end"),
        ({"start": "2026-12-01T02:00:00", "end": "2026-12-01T06:00:00", "recurrence": {"frequency": "Hourly"}},
         "spec.window.recurrence.frequency"),
        ({"start": "2026-12-01T02:00:00", "end": "2026-12-01T06:00:00",
          "recurrence": {"frequency": "Weekly", "daysOfWeek": ["Mon", "Funday"]}},
         "spec.window.recurrence.daysOfWeek[1]"),
        ({"start": "2026-12-01T02:00:00", "end": "2026-12-01T06:00:00",
          "recurrence": {"frequency": "Daily", "until": "2026-11-01"}}, "spec.window.recurrence.until"),
        ({"start": "2026-12-01T02:00:00", "end": "2026-12-01T06:00:00", "every": 2}, "spec.window.every"),
    ]
    for raw, field in cases:
        window, _, errors = windows.parse(raw)
        assert window is None and [f for f, _ in errors] == [field], (raw, errors)
