"""Utilisation over time, from the periodic ``UtilisationSnapshot`` rows (one per cluster x driver x product
per tick). Bucketed in the database so a 30-day range is a few hundred points whatever the tick rate.

What is counted: snapshots count *devices* as published in ResourceSlices (see ``claims.services.figures.units``
``COUNTING``): every MIG placement a GPU offers is a device. A bucket with no snapshot is a gap (a null point),
never a line drawn across it. Times are UTC.
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from statistics import median

from django.db.models import Count, Max, Min, Sum
from django.db.models.functions import Trunc
from django.utils import timezone

from claims.models import UtilisationSnapshot

# Range picker: label -> (span, bucket). Buckets keep each chart at <= ~400 points.
RANGES = {
    "1h": (timedelta(hours=1), "minute"),
    "6h": (timedelta(hours=6), "minute"),
    "24h": (timedelta(hours=24), "hour"),
    "7d": (timedelta(days=7), "hour"),
    "30d": (timedelta(days=30), "day"),
}
BUCKET = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1)}
DEFAULT_RANGE = "24h"
MAX_SERIES = 8  # more lines than this is unreadable; the rest fold into "other"
MAX_POINTS = 1500  # a timeline with more steps than this gets one null per gap instead of one per missing step


def default_range(now: datetime | None = None) -> str:
    """The range to open with: 24 h, unless the snapshots cannot fill it.

    A fresh install has a few minutes of snapshots; in 24 h of hourly buckets they are one point. So while the
    history is younger than a day, the shortest range that holds all of it (1 h or 6 h, minute buckets); when
    the newest snapshot is older than a day (the worker stopped), the shortest range that still reaches it.
    Two aggregates over the ``taken_at`` index.
    """
    now = now or timezone.now()
    span = RANGES[DEFAULT_RANGE][0]
    seen = UtilisationSnapshot.objects.filter(taken_at__lte=now).aggregate(first=Min("taken_at"),
                                                                          last=Max("taken_at"))
    if seen["first"] is None:
        return DEFAULT_RANGE
    if now - seen["last"] > span:
        return next((k for k, (s, _) in RANGES.items() if now - seen["last"] <= s), DEFAULT_RANGE)
    return next(k for k, (s, _) in RANGES.items() if now - seen["first"] <= s or k == DEFAULT_RANGE)


def timeline(buckets: list[datetime], unit: timedelta) -> list[datetime | None]:
    """The x axis: the buckets that have data plus the missing steps between them as ``None`` (a gap).

    The step is the usual distance between snapshots (at least one bucket): snapshots every 5 minutes in minute
    buckets are not gaps, a missing 5-minute tick is.
    """
    if len(buckets) < 2:
        return list(buckets)
    # statistics.median takes any ordered values its middle two can be averaged of; typeshed says numbers only.
    step = max(unit, median(b - a for a, b in zip(buckets, buckets[1:], strict=False)))  # type: ignore[type-var]
    steps = (buckets[-1] - buckets[0]) / step
    out: list[datetime | None] = [buckets[0]]
    for prev, cur in zip(buckets, buckets[1:], strict=False):
        if cur - prev > step * 1.5:
            missing = int(round((cur - prev) / step)) - 1
            # One null is enough to break the line; a gap per missing step keeps the axis proportional.
            out.extend([None] * (missing if steps <= MAX_POINTS else 1))
        out.append(cur)
    return out


def _label(b: datetime | None, long: bool) -> str:
    if b is None:
        return ""
    b = b.astimezone(UTC)
    return b.strftime("%b %d %H:%M") if long else b.strftime("%H:%M")


def _axis(buckets: list[datetime], unit: timedelta, long: bool) -> tuple[list[datetime | None], list[str]]:
    axis = timeline(buckets, unit)
    return axis, [_label(b, long) for b in axis]


def _series(rows, key: str, unit: timedelta, long: bool) -> dict:
    """rows of (bucket, key, total, allocated) -> chart.js-ready labels and per-key percentage series.

    A snapshot tick writes one row per (cluster, driver, product); within a bucket several ticks are averaged
    by summing both totals and allocations (the ratio of sums is the time-weighted utilisation).
    """
    totals: dict[str, int] = {}
    for r in rows:
        totals[r[key]] = totals.get(r[key], 0) + (r["total"] or 0)
    keys = sorted(totals, key=lambda k: -totals[k])
    top, rest = keys[:MAX_SERIES], set(keys[MAX_SERIES:])
    grid: dict[tuple, list[int]] = {}
    for r in rows:
        k = r[key] if r[key] not in rest else "other"
        cell = grid.setdefault((r["bucket"], k), [0, 0])
        cell[0] += r["allocated"] or 0
        cell[1] += r["total"] or 0
    axis, labels = _axis(sorted({r["bucket"] for r in rows}), unit, long)
    series = []
    for name in top + (["other"] if rest else []):
        points = []
        for b in axis:
            alloc, total = grid.get((b, name), (0, 0)) if b is not None else (0, 0)
            points.append(round(100 * alloc / total, 1) if total else None)
        series.append({"label": name or "(no product name)", "data": points})
    return {"labels": labels, "series": series}


def _fleet(qs, unit: timedelta, long: bool) -> dict:
    # Absolute counts: a bucket holds several ticks, so divide the sums by the ticks in it (the mean).
    rows = {r["bucket"]: r for r in qs.values("bucket").annotate(
        total=Sum("devices_total"), allocated=Sum("devices_allocated"), shares=Sum("shares_allocated"),
        ticks=Count("taken_at", distinct=True))}
    axis, labels = _axis(sorted(rows), unit, long)
    out: dict[str, list] = {"labels": labels, "allocated": [], "total": [], "shares": []}
    for b in axis:
        r = rows.get(b) if b is not None else None
        for k in ("allocated", "total", "shares"):
            out[k].append(round((r[k] or 0) / (r["ticks"] or 1)) if r else None)
    return out


def utilisation(range_key: str | None, cluster: str = "", now=None) -> dict:
    now = now or timezone.now()
    chosen = range_key in RANGES
    range_key = range_key if range_key in RANGES else default_range(now)
    span, bucket = RANGES[range_key]
    unit, long = BUCKET[bucket], span > timedelta(hours=24)
    qs = UtilisationSnapshot.objects.filter(taken_at__gte=now - span, taken_at__lte=now)
    if cluster:
        qs = qs.filter(cluster=cluster)
    qs = qs.annotate(bucket=Trunc("taken_at", bucket, tzinfo=UTC))
    by_cluster = list(qs.values("bucket", "cluster").annotate(total=Sum("devices_total"),
                                                             allocated=Sum("devices_allocated")))
    by_product = list(qs.values("bucket", "product").annotate(total=Sum("devices_total"),
                                                             allocated=Sum("devices_allocated")))
    fleet = _fleet(qs, unit, long)
    span_info = qs.aggregate(first=Min("taken_at"), last=Max("taken_at"), ticks=Count("taken_at", distinct=True))
    return {
        "range": range_key,
        "range_chosen": chosen,
        "ranges": list(RANGES),
        "bucket": bucket,
        "by_cluster": _series(by_cluster, "cluster", unit, long),
        "by_product": _series(by_product, "product", unit, long),
        "fleet": fleet,
        "points": sum(1 for v in fleet["total"] if v is not None),
        "gaps": sum(1 for v in fleet["total"] if v is None),
        "ticks": span_info["ticks"],
        "first": span_info["first"],
        "last": span_info["last"],
    }
