"""Allocation history of one node or one device: which claims held its devices, when, and how many at once.

``holdings`` is the one place that reads the history. Today it is rebuilt from the claims: a claim keeps its
cluster, node, ``allocated_at`` and ``released_at`` after release; the devices of a live claim are its
``DeviceAllocation`` rows, those of a released claim the ``Allocated`` event's ``devices`` (the allocation
itself is cleared on release). A claim deleted since is gone from this view (its events remain). When the
usage ledger lands, ``holdings`` reads that instead and the pages stay as they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from claims.models import ClaimEvent, DeviceAllocation, ResourceClaim
from claims.services import events as ev
from inventory.models import Device

# label -> (span, step). 60-170 steps per chart.
RANGES = {"1h": (timedelta(hours=1), timedelta(minutes=1)), "6h": (timedelta(hours=6), timedelta(minutes=5)),
          "24h": (timedelta(hours=24), timedelta(minutes=15)), "7d": (timedelta(days=7), timedelta(hours=1)),
          "30d": (timedelta(days=30), timedelta(hours=6))}
LIMIT = 500  # holdings per page: the newest; the page says when there were more


@dataclass
class Holding:
    """One claim holding devices on the node from ``start`` to ``end`` (None: still held)."""

    namespace: str
    name: str
    start: datetime
    end: datetime | None
    devices: list[tuple[str, str, str, str]] = field(default_factory=list)  # (driver, pool, device, share id)

    def holds_any(self, keys: set[tuple[str, str, str]]) -> bool:
        return any(d[:3] in keys for d in self.devices)


def holdings(cluster: str, node: str, start: datetime, end: datetime, limit: int = LIMIT) -> tuple[list[Holding], bool]:
    """Claims that held devices on ``cluster``/``node`` at some time in [start, end], newest first, and whether
    there were more than ``limit``. Uses the claims' (cluster, phase) index, then two lookups by claim."""
    rows = list(ResourceClaim.objects.filter(cluster=cluster, node=node, allocated_at__isnull=False,
                                             allocated_at__lte=end)
                .filter(Q(released_at__isnull=True) | Q(released_at__gte=start))
                .select_related("namespace").only("id", "uid", "name", "allocated_at", "released_at",
                                                  "namespace__name")
                .order_by("-allocated_at", "-id")[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    devices: dict[int, list] = {}
    for a in DeviceAllocation.objects.filter(claim_id__in=[c.id for c in rows if c.released_at is None],
                                            admin_access=False).values("claim_id", "driver", "pool", "device",
                                                                       "share_id"):
        devices.setdefault(a["claim_id"], []).append((a["driver"], a["pool"], a["device"], a["share_id"] or ""))
    released = {c.uid: c.id for c in rows if c.released_at is not None}
    for e in ClaimEvent.objects.filter(claim_uid__in=list(released), type=ev.ALLOCATED).values("claim_uid", "data"):
        devices[released[e["claim_uid"]]] = [(d.get("driver", ""), d.get("pool", ""), d.get("device", ""),
                                               d.get("shareID", "")) for d in (e["data"] or {}).get("devices") or ()]
    return [Holding(c.namespace.name, c.name, c.allocated_at, c.released_at, devices.get(c.id, [])) for c in rows
            if c.allocated_at is not None], more  # always (the query asks for allocated claims only)


def _steps(start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    out, t = [], start
    while t < end:
        out.append(t)
        t += step
    return out


def series(hs: list[Holding], start: datetime, end: datetime, step: timedelta,
           devices: set[tuple[str, str, str]] | None = None) -> dict:
    """Per step: devices held (by any claim at any moment of the step), of them shared (by more than one
    claim, or through a share), and claims holding. Given ``devices`` (one device, or a GPU's partitions), only
    those devices and the claims on them count."""
    if devices is not None:
        hs = [h for h in hs if h.holds_any(devices)]
    steps = _steps(start, end, step)
    held, shared, claims = [], [], []
    for t in steps:
        t_end = t + step
        live = [h for h in hs if h.start < t_end and (h.end is None or h.end >= t)]
        owners: dict[tuple, set] = {}
        share = set()
        for h in live:
            for d in h.devices:
                if devices is not None and d[:3] not in devices:
                    continue
                owners.setdefault(d[:3], set()).add((h.namespace, h.name))
                if d[3]:
                    share.add(d[:3])
        held.append(len(owners))
        shared.append(len({k for k, v in owners.items() if len(v) > 1} | share))
        claims.append(len(live))
    long = end - start > timedelta(hours=24)
    fmt = "%b %d %H:%M" if long else "%H:%M"
    return {"labels": [t.astimezone(UTC).strftime(fmt) for t in steps], "held": held, "shared": shared,
            "claims": claims}


def default_range(cluster: str, node: str, now: datetime) -> str:
    """The shortest range that holds the node's whole history (at least 1 h, at most 30 days): a node first
    used ten minutes ago gets 60 one-minute steps, not a line squeezed into the last of a day's 96."""
    first = (ResourceClaim.objects.filter(cluster=cluster, node=node, allocated_at__isnull=False,
                                          allocated_at__gte=now - RANGES["30d"][0])
             .order_by("allocated_at").values_list("allocated_at", flat=True).first())
    age = now - first if first else timedelta(0)
    return next((key for key, (span, _) in RANGES.items() if age <= span), "30d")


def history(cluster: str, node: str, range_key: str | None, devices: set[tuple[str, str, str]] | None = None,
            now: datetime | None = None) -> dict:
    """The page's data. ``devices``: (driver, pool, device) keys to narrow the node's history to (a device, or
    every partition of one GPU); None: the whole node."""
    now = now or timezone.now()
    range_key = range_key if range_key in RANGES else default_range(cluster, node, now)
    span, step = RANGES[range_key]
    # Steps start on a whole step (UTC) so the axis reads 14:00, 14:15, ... rather than the minute it was opened.
    end = datetime.fromtimestamp((now.timestamp() // step.total_seconds() + 1) * step.total_seconds(), tz=UTC)
    start = end - span
    hs, more = holdings(cluster, node, start, end)
    if devices is not None:
        hs = [h for h in hs if h.holds_any(devices)]
    chart = series(hs, start, end, step, devices)
    # The y axis at the node's (or device's, or GPU's) scale: 2 of 8 GPUs held is a quarter of the height.
    chart["scale"] = len(devices) if devices is not None else Device.objects.filter(
        cluster__name=cluster, node_name=node).values("driver", "pool_name", "name").distinct().count()
    return {"range": range_key, "ranges": list(RANGES), "start": start, "end": end, "step": step,
            "holdings": hs, "more": more, "chart": chart,
            "device_names": sorted({d[2] for d in devices}) if devices is not None else None}
