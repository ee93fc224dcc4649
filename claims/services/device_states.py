"""Which devices claims hold: what the inventory's device view shows as ``allocation``, and ``?state=``.

Registered with ``inventory.hooks`` by ``ClaimsConfig.ready()`` (the inventory never imports this app).
A device is matched by (cluster name, driver, pool, device name), the key of ``DeviceAllocation``.

States, as the dashboard draws them (``frontend.queries.nodes.build_views``):

* ``free``: no claim holds it (admin-access allocations do not consume a device, upstream, so they do not
  count);
* ``allocated``: one claim holds it (the whole device, or a share of it) for at most one consumer;
* ``shared``: several claims hold shares of it, or one claim holding it is reserved for several consumers.
"""
from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, Exists, OuterRef, Q

from claims.models import DeviceAllocation, Reservation

FREE, ALLOCATED, SHARED = "free", "allocated", "shared"
STATES = (FREE, ALLOCATED, SHARED)


def _held_here():
    """Allocations on the outer ``Device`` row (correlated subquery)."""
    return DeviceAllocation.objects.filter(cluster=OuterRef("cluster__name"), driver=OuterRef("driver"),
                                           pool=OuterRef("pool_name"), device=OuterRef("name"), admin_access=False)


def _multi_consumer_claims():
    return (Reservation.objects.order_by().values("claim_id").annotate(n=Count("id")).filter(n__gt=1)
            .values("claim_id"))


def state_condition(state: str) -> Q:
    """A filter on ``inventory.models.Device`` selecting the devices in ``state`` (correlated subqueries on
    the allocations' device index, so a filtered listing costs one probe per device it looks at)."""
    held = _held_here()
    another_claim = DeviceAllocation.objects.filter(
        cluster=OuterRef("cluster"), driver=OuterRef("driver"), pool=OuterRef("pool"), device=OuterRef("device"),
        admin_access=False).exclude(claim_id=OuterRef("claim_id"))
    shared = Q(Exists(held.filter(Q(claim_id__in=_multi_consumer_claims()) | Q(Exists(another_claim)))))
    if state == FREE:
        return ~Q(Exists(held))
    if state == ALLOCATED:
        return Q(Exists(held)) & ~shared
    if state == SHARED:
        return shared
    raise ValueError(state)


def allocation_states(devices: list) -> dict:
    """``{device.pk: {"state", "claims": [{namespace, name, request, shareID?}]}}`` for held devices."""
    if not devices:
        return {}
    by_key = {(d.cluster.name, d.driver, d.pool_name, d.name): d.pk for d in devices}
    # The three IN lists narrow the allocation index to about the page; exact keys are matched below.
    rows = (DeviceAllocation.objects.filter(cluster__in={k[0] for k in by_key}, pool__in={k[2] for k in by_key},
                                            device__in={k[3] for k in by_key}, admin_access=False)
            .values_list("cluster", "driver", "pool", "device", "claim_id", "claim__namespace__name", "claim__name",
                         "request", "share_id").order_by("id"))
    holders: dict[int, list[dict]] = defaultdict(list)
    claim_ids = set()
    for cluster, driver, pool, device, claim_id, namespace, name, request, share_id in rows:
        pk = by_key.get((cluster, driver, pool, device))
        if pk is None:
            continue
        holder = {"namespace": namespace, "name": name, "request": request, "_claim": claim_id}
        if share_id:
            holder["shareID"] = share_id
        holders[pk].append(holder)
        claim_ids.add(claim_id)
    consumers = dict(Reservation.objects.filter(claim_id__in=claim_ids).order_by().values("claim_id")
                     .annotate(n=Count("id")).values_list("claim_id", "n"))
    out = {}
    for pk, held in holders.items():
        distinct = {h["_claim"] for h in held}
        many = len(distinct) > 1 or any(consumers.get(c, 0) > 1 for c in distinct)
        out[pk] = {"state": SHARED if many else ALLOCATED,
                   "claims": [{k: v for k, v in h.items() if k != "_claim"} for h in held]}
    return out
