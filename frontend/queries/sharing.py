"""Who shares which device: devices held by more than one claim, or by one claim reserved for several
consumers (a named claim shared by pods), and GPUs whose partitions went to different claims."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from django.urls import reverse

from claims.models import DeviceAllocation, Reservation
from claims.services.figures.sql import T_ALLOC, T_RESERVATION, fetch_dicts
from claims.services.figures.units import units_sql
from inventory.models import Device


@dataclass
class SharedDevice:
    cluster: str
    driver: str
    pool: str
    device: str
    claims: int
    consumers: int
    node: str = ""
    product: str = ""
    allow_multiple: bool = False
    holders: list[dict] = field(default_factory=list)  # {claim, namespace, url, consumed, consumers, share_id}

    @property
    def namespaces(self) -> list[str]:
        return sorted({h["namespace"] for h in self.holders})

    @property
    def url(self) -> str:
        return reverse("frontend:device", args=[self.cluster, self.driver, self.pool, self.device])

    @property
    def how(self) -> str:
        if self.allow_multiple:
            return "consumable capacity"
        if self.claims > 1:
            return "several claims"
        return "one claim, several consumers"


def shared_devices(*, namespace: str = "", cluster: str = "", limit: int = 200, offset: int = 0) -> dict:
    """Devices allocated to >1 claim or consumer, most-shared first; one GROUP BY over allocations."""
    where, params = ["NOT da.admin_access"], []
    if cluster:
        where.append("da.cluster = %s")
        params.append(cluster)
    having_ns = ""
    if namespace:
        # Keep a device when any of its claims is in the namespace (the others still show, for context).
        having_ns = (" AND SUM(CASE WHEN da.claim_id IN (SELECT c.id FROM claims_resourceclaim c"
                     " JOIN claims_namespace n ON n.id = c.namespace_id WHERE n.name = %s) THEN 1 ELSE 0 END) > 0")
    base = f"""
        SELECT da.cluster, da.driver, da.pool, da.device, COUNT(DISTINCT da.claim_id) AS claims,
               COALESCE(MAX(r.n), 0) AS consumers
        FROM {T_ALLOC} da
        LEFT JOIN (SELECT claim_id, COUNT(*) AS n FROM {T_RESERVATION} GROUP BY claim_id) r ON r.claim_id = da.claim_id
        WHERE {' AND '.join(where)}
        GROUP BY da.cluster, da.driver, da.pool, da.device
        HAVING (COUNT(DISTINCT da.claim_id) > 1 OR COALESCE(MAX(r.n), 0) > 1){having_ns}
    """
    all_params = params + ([namespace] if namespace else [])
    total = fetch_dicts(f"SELECT COUNT(*) AS n FROM ({base}) s", all_params, analytic=True)[0]["n"]
    rows = fetch_dicts(base + " ORDER BY claims DESC, consumers DESC, da.cluster, da.device LIMIT %s OFFSET %s",
                       all_params + [limit, offset], analytic=True)
    items = [SharedDevice(r["cluster"], r["driver"], r["pool"], r["device"], r["claims"], r["consumers"]) for r in rows]
    _attach(items)
    return {"devices": items, "total": total}


def _attach(items: list[SharedDevice]) -> None:
    """Holders and device facts for the (at most one page of) listed devices."""
    if not items:
        return
    keys = {(i.cluster, i.driver, i.pool, i.device): i for i in items}
    candidates = (DeviceAllocation.objects.filter(admin_access=False, cluster__in={k[0] for k in keys},
                                              pool__in={k[2] for k in keys}, device__in={k[3] for k in keys})
              .select_related("claim", "claim__namespace").order_by("id"))
    allocs = [a for a in candidates if (a.cluster, a.driver, a.pool, a.device) in keys]
    consumers = defaultdict(list)
    for r in Reservation.objects.filter(claim_id__in={a.claim_id for a in allocs}).select_related("consumer"):
        consumers[r.claim_id].append(r.consumer.name)
    for a in allocs:
        keys[(a.cluster, a.driver, a.pool, a.device)].holders.append({
            "claim": a.claim.name, "namespace": a.claim.namespace.name,
            "url": reverse("frontend:claim", args=[a.claim.namespace.name, a.claim.name]),
            "consumed": a.consumed_capacity or {}, "share_id": a.share_id, "consumers": consumers.get(a.claim_id, []),
        })
    for d in Device.objects.filter(cluster__name__in={k[0] for k in keys}, pool_name__in={k[2] for k in keys},
                                   name__in={k[3] for k in keys}).select_related("cluster"):
        item = keys.get((d.cluster.name, d.driver, d.pool_name, d.name))
        if item:
            attrs = d.attributes or {}
            item.node = d.node_name
            item.product = ((attrs.get("productName") or {}).get("string") or (attrs.get("model") or {}).get("string")
                            or "")
            item.allow_multiple = d.allow_multiple_allocations


def split_gpus(*, limit: int = 50) -> list[dict]:
    """Partitioned GPUs (counter sets) whose partitions are held by more than one claim, with who holds them."""
    units, params = units_sql(with_rules=False)
    sql = (f"SELECT u.cluster, u.node_name, u.driver, u.product, u.unit, u.used_devices, u.devices "
           f"FROM ({units}) u WHERE u.partitioned = 1 AND u.claims > 1 "
           f"ORDER BY u.used_devices DESC, u.cluster, u.unit LIMIT %s")
    rows = fetch_dicts(sql, params + [limit], analytic=True)
    by_pool = defaultdict(list)
    for r in rows:
        r["url"] = reverse("frontend:node", args=[r["cluster"], r["node_name"]]) if r["node_name"] else ""
        r["counter_set"] = r["unit"].split("/", 1)[-1]
        r["holders"] = set()
        by_pool[(r["cluster"], r["driver"], r["unit"].split("/", 1)[0])].append(r)
    # Who holds the partitions: one query per pool listed (a pool is one node's GPUs).
    for (cluster, driver, pool), pool_rows in by_pool.items():
        counter_set_of = {d.name: d.consumes_counters[0].get("counterSet") for d in
                          Device.objects.filter(cluster__name=cluster, driver=driver, pool_name=pool)
                          .only("name", "consumes_counters") if d.consumes_counters}
        wanted = {r["counter_set"]: r for r in pool_rows}
        for device, ns, name in (DeviceAllocation.objects.filter(cluster=cluster, driver=driver, pool=pool,
                                                                 admin_access=False)
                                 .values_list("device", "claim__namespace__name", "claim__name")):
            row = wanted.get(counter_set_of.get(device))
            if row is not None:
                row["holders"].add((ns, name))
    for r in rows:
        r["holders"] = [{"label": f"{ns}/{name}", "url": reverse("frontend:claim", args=[ns, name])}
                        for ns, name in sorted(r["holders"])]
    return rows
