"""The dashboard's Usage page: device-hours per day stacked by one grouping, the finance table, and the prices
with their changes."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from draservice import audit
from usage.services import prices, reports

# Range picker: label -> (span, bucket). Each bucket is one aggregate query: at most ~30 per page.
RANGES = {"7d": (timedelta(days=7), timedelta(days=1)), "30d": (timedelta(days=30), timedelta(days=1)),
          "90d": (timedelta(days=91), timedelta(days=7))}
DEFAULT_RANGE = "30d"
MAX_SERIES = 8  # more stacks than this is unreadable; the rest fold into "other"


def window_for(range_key: str, now: datetime) -> tuple[str, reports.Window, timedelta]:
    range_key = range_key if range_key in RANGES else DEFAULT_RANGE
    span, bucket = RANGES[range_key]
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    since = midnight + timedelta(days=1) - span  # whole days, today included
    return range_key, reports.Window(since=since, until=now), bucket


def series(window: reports.Window, bucket: timedelta, group: str, now: datetime) -> dict:
    """Chart.js-ready: bucket labels and one device-hours series per value of ``group`` (stacked)."""
    starts, at = [], window.since
    while at < window.until:
        starts.append(at)
        at += bucket
    cells: dict[tuple[int, str], float] = {}
    totals: dict[str, float] = {}
    for i, start in enumerate(starts):
        w = reports.Window(since=start, until=min(start + bucket, window.until))
        for r in reports.device_seconds(w, [group], None, now):
            hours = float(r["device_seconds"] or 0) / 3600
            cells[(i, r[group])] = hours
            totals[r[group]] = totals.get(r[group], 0.0) + hours
    keys = sorted(totals, key=lambda k: -totals[k])
    top, rest = keys[:MAX_SERIES], keys[MAX_SERIES:]
    out = [{"label": k or "(none)", "data": [round(cells.get((i, k), 0.0), 4) for i in range(len(starts))]}
           for k in top]
    if rest:
        out.append({"label": "other", "data": [round(sum(cells.get((i, k), 0.0) for k in rest), 4)
                                               for i in range(len(starts))]})
    return {"labels": [s.date().isoformat() for s in starts], "series": out}


def page_data(range_key: str, group: str, now: datetime) -> dict:
    group = group if group in reports.GROUPS else reports.DEFAULT_GROUPS[0]
    range_key, window, bucket = window_for(range_key, now)
    table = reports.usage(window, [group, "product"], None, now)
    return {"range": range_key, "ranges": list(RANGES), "group": group, "groups": list(reports.GROUPS),
            "chart": series(window, bucket, group, now), "rows": table["items"], "total": table["total"],
            "since": table["since"], "until": table["until"]}


def price_data(show_history: bool) -> dict:
    """The price table (product, then cluster; the product-wide price first) and, for admins, its newest
    changes from the audit trail."""
    table = sorted(prices.table().values(), key=lambda p: (p.product, p.cluster))
    return {"prices": [{"product": p.product, "cluster": p.cluster, "currency": p.currency,
                        "perDeviceHour": prices.audited(p)["spec"]["pricePerDeviceHour"]} for p in table],
            "changes": audit.events(prices.KIND) if show_history else []}
