"""Reading the ledger: device-hours (and their cost) per namespace, queue, cluster, product and sharing mode,
and the intervals of one node or device.

Device-seconds are summed in SQL, exactly: each interval counts ``weight * (end - start)`` clipped to the
window, an open interval ending at ``now``. Cost needs the price of each (cluster, product), so the sum is
always grouped by those too and folded into the groups asked for afterwards (a few rows per group).
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from django.db.models import DateTimeField, DecimalField, F, Func, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least

from draservice.errors import BadRequest
from usage.models import UsageInterval
from usage.services import prices

GROUPS = ("namespace", "queue", "cluster", "product", "sharing", "reservation")
DEFAULT_GROUPS = ["namespace"]
HOUR = Decimal(3600)
# RFC 3339 date-time: a full date, a time with seconds, an offset (Z or ±hh:mm); Python's parser is laxer.
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


class Epoch(Func):
    """Seconds since the epoch of a timestamp, exact on PostgreSQL (numeric); SQLite's to the millisecond."""

    template = "EXTRACT(EPOCH FROM %(expressions)s)"
    output_field = DecimalField(max_digits=30, decimal_places=9)

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="(julianday(%(expressions)s) * 86400.0)", **extra)


@dataclass
class Window:
    since: datetime
    until: datetime  # never after now: the future has no usage yet


@dataclass
class Row:
    keys: dict[str, str]
    device_seconds: Decimal = Decimal(0)
    costs: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    unpriced_seconds: Decimal = Decimal(0)

    def render(self) -> dict:
        out: dict = {**self.keys, "deviceHours": _hours(self.device_seconds),
                     "deviceSeconds": float(round(self.device_seconds, 3))}
        single = len(self.costs) == 1
        out["cost"] = float(round(next(iter(self.costs.values())), 4)) if single else None
        out["currency"] = next(iter(self.costs)) if single else None
        out["costs"] = {c: float(round(v, 4)) for c, v in sorted(self.costs.items())}
        out["unpricedDeviceHours"] = _hours(self.unpriced_seconds)
        return out


def _hours(seconds: Decimal) -> float:
    return float(round(seconds / HOUR, 6))


# --------------------------------------------------------------------------------------------- parameters

def parse_time(raw: str | None, name: str) -> datetime | None:
    if raw is None or raw == "":
        return None
    if not RFC3339.match(raw.strip()):
        raise BadRequest([(name, f"Invalid value: {raw!r}: must be an RFC 3339 date-time "
                                 "(e.g. 2026-01-31T00:00:00Z)")], title="Bad Request")
    try:
        value = datetime.fromisoformat(raw.strip().upper().replace("Z", "+00:00"))
        # In UTC: RFC 3339 allows offsets up to +/-23:59, PostgreSQL only +/-15:59 (a 500 schemathesis found);
        # year 1 at +01:00 or year 9999 at -01:00 is outside what can be rendered (OverflowError).
        return value.astimezone(UTC)
    except (ValueError, OverflowError):
        raise BadRequest([(name, f"Invalid value: {raw!r}: not a valid date-time")],
                         title="Bad Request") from None


def parse_window(since_raw: str | None, until_raw: str | None, now: datetime) -> Window:
    """Defaults: since the first of the current month (UTC), until now (a later ``until`` is cut to now)."""
    since = parse_time(since_raw, "since")
    until = parse_time(until_raw, "until")
    if since is not None and until is not None and until <= since:
        raise BadRequest([("until", "must be after since")], title="Bad Request")
    if since is None:
        since = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    until = min(until, now) if until is not None else now
    return Window(since=since, until=max(until, since))


def parse_group_by(raw: str | None) -> list[str]:
    if raw is None or not raw.strip():
        return list(DEFAULT_GROUPS)
    out: list[str] = []
    for part in raw.split(","):
        name = part.strip()
        if name not in GROUPS:
            raise BadRequest([("groupBy", f"Unsupported value: {name!r}: supported values: {', '.join(GROUPS)}")],
                             title="Bad Request")
        if name not in out:
            out.append(name)
    return out


# ------------------------------------------------------------------------------------------------ reports

def parse_filters(params) -> dict[str, list[str]]:
    """``?namespace=a,b&product=…``: keep only those values of a grouping (any of ``GROUPS``)."""
    out = {}
    for name in GROUPS:
        raw = params.get(name)
        if raw is not None and raw.strip():
            out[name] = sorted({v.strip() for v in raw.split(",")})
    return out


def overlapping(window: Window, namespaces: frozenset[str] | None,
                filters: dict[str, list[str]] | None = None) -> QuerySet[UsageInterval]:
    qs = UsageInterval.objects.filter(started_at__lt=window.until).filter(
        Q(ended_at__isnull=True) | Q(ended_at__gt=window.since))
    for name, values in (filters or {}).items():
        qs = qs.filter(**{f"{name}__in": values})
    return qs if namespaces is None else qs.filter(namespace__in=sorted(namespaces))


def device_seconds(window: Window, groups: list[str], namespaces: frozenset[str] | None, now: datetime,
                   filters: dict[str, list[str]] | None = None) -> list[dict]:
    """Per distinct value of ``groups``: the exact device-seconds in the window (one SQL aggregate)."""
    at = DateTimeField()
    start = Greatest(F("started_at"), Value(window.since, output_field=at), output_field=at)
    end = Least(Coalesce(F("ended_at"), Value(now, output_field=at), output_field=at),
                Value(window.until, output_field=at), output_field=at)
    # Never negative: only intervals that start before ``until`` are read, and one ends no earlier than it
    # started (``ledger.close_intervals``).
    seconds = Epoch(end) - Epoch(start)
    return list(overlapping(window, namespaces, filters).values(*groups).order_by(*groups)
                .annotate(device_seconds=Sum(F("weight") * seconds,
                                             output_field=DecimalField(max_digits=30, decimal_places=9))))


def usage(window: Window, groups: list[str], namespaces: frozenset[str] | None, now: datetime,
          filters: dict[str, list[str]] | None = None) -> dict:
    """The report: rows per group (device-hours, cost per currency), and the totals."""
    inner = sorted(set(groups) | {"cluster", "product"}, key=GROUPS.index)
    table = prices.table()
    rows: dict[tuple, Row] = {}
    total = Row(keys={})
    for r in device_seconds(window, inner, namespaces, now, filters):
        ds = Decimal(r["device_seconds"] or 0)
        if ds <= 0:
            continue
        key = tuple(r[g] for g in groups)
        row = rows.setdefault(key, Row(keys={g: r[g] for g in groups}))
        price = prices.price_for(table, r["product"], r["cluster"])
        for target in (row, total):
            target.device_seconds += ds
            if price is None:
                target.unpriced_seconds += ds
            else:
                target.costs[price.currency] += ds / HOUR * price.per_device_hour
    return {"groupBy": groups, "since": _iso(window.since), "until": _iso(window.until),
            "items": [rows[k].render() for k in sorted(rows)], "total": total.render()}


def history(cluster: str, node: str, device: str, window: Window | None,
            namespaces: frozenset[str] | None) -> QuerySet[UsageInterval]:
    """Intervals on one node, or one device (``name`` or ``driver/pool/name``) of ``cluster``."""
    qs = UsageInterval.objects.filter(cluster=cluster)
    if node:
        qs = qs.filter(node=node)
    if device:
        driver, _, rest = device.partition("/")
        pool, _, name = rest.rpartition("/")
        qs = qs.filter(driver=driver, pool=pool, device=name) if rest and pool else qs.filter(device=device)
    if window is not None:
        qs = qs.filter(started_at__lt=window.until).filter(Q(ended_at__isnull=True) | Q(ended_at__gt=window.since))
    if namespaces is not None:
        qs = qs.filter(namespace__in=sorted(namespaces))
    return qs.order_by("id")


def render_interval(i: UsageInterval) -> dict:
    return {"claim": f"{i.namespace}/{i.claim_name}", "claimUID": str(i.claim_uid), "namespace": i.namespace,
            "queue": i.queue or None, "reservation": i.reservation or None, "cluster": i.cluster,
            "node": i.node or None,
            "device": f"{i.driver}/{i.pool}/{i.device}", "shareID": i.share_id or None, "product": i.product,
            "sharing": i.sharing, "weight": float(i.weight), "start": _iso(i.started_at),
            "end": _iso(i.ended_at) if i.ended_at else None}


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")
