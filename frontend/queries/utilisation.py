"""Utilisation over time, from the periodic ``UtilisationSnapshot`` rows (one per cluster x driver x product
per tick). Bucketed in the database so a 30-day range is a few hundred points whatever the tick rate."""
from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Max, Min, Sum
from django.db.models.functions import Trunc
from django.utils import timezone

from claims.models import UtilisationSnapshot

# Range picker: label -> (span, bucket). Buckets keep each chart at <= ~300 points.
RANGES = {
    "1h": (timedelta(hours=1), "minute"),
    "6h": (timedelta(hours=6), "minute"),
    "24h": (timedelta(hours=24), "hour"),
    "7d": (timedelta(days=7), "hour"),
    "30d": (timedelta(days=30), "day"),
}
DEFAULT_RANGE = "24h"
MAX_SERIES = 8  # more lines than this is unreadable; the rest fold into "other"


def _series(rows, key: str) -> dict:
    """rows of (bucket, key, total, allocated) -> chart.js-ready labels and per-key percentage series.

    A snapshot tick writes one row per (cluster, driver, product); within a bucket several ticks are averaged
    by summing both totals and allocations (the ratio of sums is the time-weighted utilisation).
    """
    buckets = sorted({r["bucket"] for r in rows})
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
    names = top + (["other"] if rest else [])
    series = []
    for name in names:
        points = []
        for b in buckets:
            alloc, total = grid.get((b, name), (0, 0))
            points.append(round(100 * alloc / total, 1) if total else None)
        series.append({"label": name or "(no product name)", "data": points})
    return {"labels": [b.isoformat() for b in buckets], "series": series}


def utilisation(range_key: str, cluster: str = "", now=None) -> dict:
    range_key = range_key if range_key in RANGES else DEFAULT_RANGE
    span, bucket = RANGES[range_key]
    now = now or timezone.now()
    qs = UtilisationSnapshot.objects.filter(taken_at__gte=now - span, taken_at__lte=now)
    if cluster:
        qs = qs.filter(cluster=cluster)
    qs = qs.annotate(bucket=Trunc("taken_at", bucket))
    by_cluster = list(qs.values("bucket", "cluster").annotate(total=Sum("devices_total"),
                                                             allocated=Sum("devices_allocated")))
    by_product = list(qs.values("bucket", "product").annotate(total=Sum("devices_total"),
                                                             allocated=Sum("devices_allocated")))
    # Absolute counts: a bucket holds several ticks, so divide the sums by the ticks in it (the mean).
    fleet = list(qs.values("bucket").annotate(total=Sum("devices_total"), allocated=Sum("devices_allocated"),
                                              shares=Sum("shares_allocated"), ticks=Count("taken_at", distinct=True))
                 .order_by("bucket"))
    for r in fleet:
        ticks = r["ticks"] or 1
        r["total"], r["allocated"], r["shares"] = (round((r[k] or 0) / ticks) for k in ("total", "allocated", "shares"))
    span_info = qs.aggregate(first=Min("taken_at"), last=Max("taken_at"))
    return {
        "range": range_key,
        "ranges": list(RANGES),
        "by_cluster": _series(by_cluster, "cluster"),
        "by_product": _series(by_product, "product"),
        "fleet": {
            "labels": [r["bucket"].isoformat() for r in fleet],
            "allocated": [r["allocated"] for r in fleet],
            "total": [r["total"] for r in fleet],
            "shares": [r["shares"] for r in fleet],
        },
        "points": len(fleet),
        "first": span_info["first"],
        "last": span_info["last"],
    }
