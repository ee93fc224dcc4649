"""Open an interval for every allocation row that exists when the ledger is installed, so that "an interval is
open exactly while its allocation row exists" holds from the start (usage before the upgrade is not known: each
interval starts when its claim was allocated, the best the database remembers). The queue is left blank: it is
resolved at admission, which these claims went through before the ledger existed."""
from collections import defaultdict

from django.db import migrations

from dra.k8s.inventory import product_name
from usage.services.ledger import to_decimal, weight_of


def backfill(apps, schema_editor):
    DeviceAllocation = apps.get_model("claims", "DeviceAllocation")
    Device = apps.get_model("inventory", "Device")
    ResourceSlice = apps.get_model("inventory", "ResourceSlice")
    UsageInterval = apps.get_model("usage", "UsageInterval")
    rows = list(DeviceAllocation.objects.filter(admin_access=False).select_related("claim", "claim__namespace")
                .order_by("id"))
    if not rows:
        return
    clusters, pools = {r.cluster for r in rows}, {r.pool for r in rows}
    devices = {(d["cluster__name"], d["driver"], d["pool_name"], d["name"]): d for d in Device.objects.filter(
        cluster__name__in=clusters, pool_name__in=pools).values(
        "cluster__name", "driver", "pool_name", "name", "capacity", "consumes_counters", "attributes", "node_name")}
    counters: dict[tuple, dict] = defaultdict(dict)
    for s in ResourceSlice.objects.filter(cluster__name__in=clusters, pool_name__in=pools).values(
            "cluster__name", "driver", "pool_name", "object"):
        for cs in ((s["object"] or {}).get("spec") or {}).get("sharedCounters") or ():
            counters[(s["cluster__name"], s["driver"], s["pool_name"])][cs.get("name")] = cs.get("counters") or {}
    out = []
    for r in rows:
        d = devices.get((r.cluster, r.driver, r.pool, r.device))
        raw = None if d is None else {"capacity": d["capacity"], "consumesCounters": d["consumes_counters"],
                                      "attributes": d["attributes"]}
        weight, sharing = weight_of(raw, counters[(r.cluster, r.driver, r.pool)], r.share_id, r.consumed_capacity)
        out.append(UsageInterval(
            claim_id=r.claim_id, claim_uid=r.claim.uid, claim_name=r.claim.name, namespace=r.claim.namespace.name,
            cluster=r.cluster, node=r.claim.node or (d or {}).get("node_name") or "", driver=r.driver, pool=r.pool,
            device=r.device, share_id=r.share_id, product=product_name(raw), sharing=sharing,
            weight=to_decimal(weight), started_at=r.claim.allocated_at or r.created_at))
    UsageInterval.objects.bulk_create(out, batch_size=1000)


class Migration(migrations.Migration):
    dependencies = [
        ("usage", "0001_initial"),
        ("claims", "0005_taken_by"),
        ("inventory", "0004_pool_events"),
    ]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
