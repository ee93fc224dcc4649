"""What admitted claims use, per queue, and what a placement would add: in devices, counters and capacity.

Amounts are exact (``int`` or ``Fraction``, as ``dra.engine.quantity``); stored as decimals in ``QuotaCharge``.
"""
from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from fractions import Fraction

from django.db.models import Sum

from dra.engine.quantity import QuantityError, parse_quantity
from queues.models import QuotaCharge

# (queue id, deviceClassName, unit, resource, cluster) -> amount
Usage = dict[tuple[int, str, str, str, str], Fraction]
# (deviceClassName, unit, resource) -> amount
Need = dict[tuple[str, str, str], Fraction]

_counter_cache: dict = {"key": None, "devices": {}}


def load(queue_ids=None) -> Usage:
    """Charges held, summed. A charge lives exactly as long as its claim's allocation: written when a commit
    admits the claim, deleted in the statement that frees its devices (``claims.services.queueing.uncharge``).
    So this reads the charges alone; joined to the claims to keep those still Allocated, it read every claim
    ever released on every round (tens of milliseconds of PostgreSQL at tens of thousands of claims)."""
    qs = QuotaCharge.objects.all()
    if queue_ids is not None:
        qs = qs.filter(queue_id__in=list(queue_ids))
    out: Usage = defaultdict(Fraction)
    for queue_id, cls, unit, resource, cluster, amount in (
            qs.values_list("queue_id", "device_class", "unit", "resource", "cluster").order_by()
            .annotate(total=Sum("amount")).values_list("queue_id", "device_class", "unit", "resource", "cluster",
                                                       "total")):
        out[(queue_id, cls, unit, resource, cluster)] += to_fraction(amount)
    return out


def to_fraction(value) -> Fraction:
    return Fraction(value) if not isinstance(value, Decimal) else Fraction(value)


def to_decimal(value: Fraction) -> Decimal:
    return Decimal(value.numerator) / Decimal(value.denominator)


def requested_devices(spec: dict) -> list[tuple[str, int]]:
    """(deviceClassName, count) a claim asks for (first alternative of firstAvailable; All counts 1)."""
    out = []
    for req in ((spec or {}).get("devices") or {}).get("requests") or []:
        exactly = req.get("exactly") or (req.get("firstAvailable") or [{}])[0]
        count = exactly.get("count", 1) if exactly.get("allocationMode", "ExactCount") == "ExactCount" else 1
        out.append((exactly.get("deviceClassName", ""), int(count or 1)))
    return out


def request_classes(spec: dict) -> dict[str, str]:
    """Result ``request`` name (``req`` or ``req/sub``) -> deviceClassName, from a v1 claim spec."""
    out: dict[str, str] = {}
    for req in ((spec or {}).get("devices") or {}).get("requests") or []:
        name = req.get("name", "")
        exactly = req.get("exactly")
        if exactly:
            out[name] = exactly.get("deviceClassName", "")
        for sub in req.get("firstAvailable") or []:
            out[f"{name}/{sub.get('name', '')}"] = sub.get("deviceClassName", "")
    return out


def device_counters(view) -> dict[tuple[str, str, str, str], dict[str, Fraction]]:
    """(cluster, driver, pool, device) -> counter name -> amount the device consumes (over its counter sets)."""
    if _counter_cache["key"] == view.key:
        return _counter_cache["devices"]
    devices: dict = {}
    for inv in view.snapshot.clusters:
        for sl in inv.resource_slices:
            spec = sl.get("spec") or {}
            pool = (spec.get("pool") or {}).get("name", "")
            for dev in spec.get("devices") or []:
                counters: dict[str, Fraction] = defaultdict(Fraction)
                for cc in dev.get("consumesCounters") or []:
                    for name, c in (cc.get("counters") or {}).items():
                        try:
                            counters[name] += Fraction(parse_quantity((c or {}).get("value", "0")))
                        except QuantityError:
                            continue
                if counters:
                    devices[(inv.name, spec.get("driver", ""), pool, dev.get("name", ""))] = dict(counters)
    _counter_cache.update(key=view.key, devices=devices)
    return devices


def needs(placements, view) -> dict[str, Need]:
    """Cluster -> what the placements use: devices (dedicated results), counters (summed consumesCounters of
    the allocated devices), capacity (consumedCapacity of shares). Admin access counts nothing."""
    counters = device_counters(view) if view is not None else {}
    out: dict[str, Need] = defaultdict(lambda: defaultdict(Fraction))
    for p in placements:
        for claim, allocation in zip(p.claims, p.allocations, strict=True):
            classes = request_classes(claim.spec)
            for res in ((allocation or {}).get("devices") or {}).get("results") or []:
                if res.get("adminAccess"):
                    continue
                cls = classes.get(res.get("request", ""), "") or classes.get(res.get("request", "").split("/")[0], "")
                need = out[p.cluster]
                if not res.get("shareID"):
                    need[(cls, "devices", "")] += 1
                for name, amount in counters.get((p.cluster, res["driver"], res["pool"], res["device"]), {}).items():
                    need[(cls, "counters", name)] += amount
                for name, qty in (res.get("consumedCapacity") or {}).items():
                    try:
                        need[(cls, "capacity", name)] += Fraction(parse_quantity(qty))
                    except QuantityError:
                        continue
    return out
