"""The overview's maintained unit tally (claims.services.figures.fleet_tally) against the full SQL aggregate.

Real PostgreSQL, the demo fleet (whole GPUs, MIG-partitioned GPUs, shared devices, a taint rule, a stale
cluster) and changes made through the claims and inventory services. After each change the maintained rows
must equal what a fresh scan of every device says, and an allocation change must not scan the devices.
"""
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from claims.models import DeviceAllocation, Phase, ResourceClaim
from claims.services.claims import create_claims, release_claim
from claims.services.consumers import create_consumer
from claims.services.figures import fleet as fleet_q
from claims.services.figures.sql import T_DEVICE
from frontend.demo import GPU, H100, claim, consumer, request
from inventory.models import DeviceTaintRule
from inventory.services.fleet import create_fleet_object

pytestmark = pytest.mark.django_db(transaction=True)

GROUP = ("cluster_id", "driver", "product")


def _by_group(rows):
    return {tuple(r[k] for k in GROUP): {k: int(v) for k, v in r.items() if k not in GROUP} for r in rows}


def scanned_rows():
    return _by_group(fleet_q._tally_rows("u.cluster_id, u.driver, u.product"))


def maintained_rows():
    """The maintained rows, and how many queries of the refresh read the device table."""
    with CaptureQueriesContext(connection) as ctx:
        rows = fleet_q.overview_rows()
    return _by_group(rows), sum(bool(re.search(rf"\b{T_DEVICE}\b", q["sql"])) for q in ctx.captured_queries)


def test_allocation_changes_update_the_tally_without_a_device_scan(demo):
    first, scans = maintained_rows()
    assert first == scanned_rows()
    again, scans = maintained_rows()
    assert (again, scans) == (first, 0)  # polling without a change: nothing read

    def check(label):
        rows, scans = maintained_rows()
        assert scans == 0, f"{label}: the device table was read"
        assert rows == scanned_rows(), label
        return rows

    create_claims("team-x", [claim(f"one-{i}", [request("gpu", GPU, 1, [H100])]) for i in range(3)])
    grown = check("three claims allocated")
    allocated = sum(r["allocated_only"] + r["shared"] for r in grown.values())
    assert allocated == sum(r["allocated_only"] + r["shared"] for r in first.values()) + 3

    held = ResourceClaim.objects.get(namespace__name="team-x", name="one-0")
    for i in range(2):  # two consumers on one exclusive claim: its GPU becomes shared
        create_consumer("team-x", consumer(f"pod-{i}", "one-0"))
    shared = check("a claim reserved for two consumers")
    assert sum(r["shared"] for r in shared.values()) == sum(r["shared"] for r in grown.values()) + 1

    release_claim(held.pk)
    check("a shared claim released")
    release_claim(ResourceClaim.objects.get(namespace__name="research", name="mig-3g").pk)
    check("a MIG partition released")


def test_a_row_committed_below_the_highest_id_is_counted(demo):
    """Allocation ids are handed out in write order, not commit order: a row can appear below the highest id
    already seen. The tally follows ids, not a watermark."""
    fleet_q.overview_rows()
    create_claims("team-x", [claim("late", [request("gpu", GPU, 1, [H100])])])
    row = DeviceAllocation.objects.get(claim__name="late")
    create_claims("team-x", [claim("early", [request("gpu", GPU, 1, [H100])])])
    seen, _ = maintained_rows()
    # As if "late" had taken its id before "early" and committed after the poll above.
    values = {f.attname: getattr(row, f.attname) for f in DeviceAllocation._meta.fields if f.attname != "id"}
    row.delete()
    without, _ = maintained_rows()
    assert without != seen
    DeviceAllocation.objects.create(id=row.id, **values)  # below the highest id, which is early's
    rows, scans = maintained_rows()
    assert scans == 0
    assert rows == scanned_rows() == seen


def test_inventory_and_taint_rule_changes_rebuild_the_tally(demo):
    fleet_q.overview_rows()
    free = DeviceAllocation.objects.values_list("device", flat=True)
    from inventory.models import Device

    device = Device.objects.filter(driver=GPU).exclude(name__in=list(free)).order_by("id").first()
    create_fleet_object(DeviceTaintRule, {
        "apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": "fan"},
        "spec": {"deviceSelector": {"driver": GPU, "pool": device.pool_name, "device": device.name},
                 "taint": {"key": "draservice.io/fan", "value": "1", "effect": "NoExecute"}}})
    rows, scans = maintained_rows()
    assert scans >= 1  # a new inventory version is read afresh
    assert rows == scanned_rows()


def test_the_overview_page_shows_the_database_after_changes(client, demo, people):
    """The numbers on the page (its context) equal counts taken from the rows themselves after a change."""
    client.force_login(people["ops"])
    client.get("/")  # remembered state before the changes
    create_claims("team-x", [claim("one", [request("gpu", GPU, 1, [H100])]),
                             claim("too-big", [request("gpus", GPU, 32, [H100])])])
    release_claim(ResourceClaim.objects.get(namespace__name="ml-training", name="bert-eval").pk)
    resp = client.get("/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 200
    totals = resp.context["totals"]
    scanned = scanned_rows()
    live = {c.id for c in resp.context["clusters"] if not c.stale_now}
    assert totals.allocated == sum(r["allocated_only"] + r["shared"] for r in scanned.values())
    assert totals.free == sum(r["free"] for g, r in scanned.items() if g[0] in live)
    assert totals.total == sum(r["total"] for r in scanned.values())
    phases = resp.context["phases"]
    for phase in Phase:
        assert phases[phase.value] == ResourceClaim.objects.filter(phase=phase).count(), phase
    pending = ResourceClaim.objects.filter(phase=Phase.PENDING)
    assert resp.context["pending"]["count"] == pending.count()
    assert resp.context["pending"]["oldest"] == pending.order_by("created_at", "id").first()
    assert f'data-testid="kpi-allocated">{totals.allocated}<'.encode() in resp.content


def test_claim_counts_follow_the_change_log_including_a_late_commit(demo):
    """Phase counts come from the change log: a change whose seq is below one already seen (it committed
    later) is still counted, because the watermark stops at the gap."""
    from django.db.models import F
    from django.utils import timezone

    from draservice.models import Change

    def phases():
        return fleet_q.claim_summary()["phases"]

    def truth():
        return {p.value: ResourceClaim.objects.filter(phase=p).count() for p in Phase}

    assert phases() == truth()
    create_claims("team-x", [claim("one", [request("gpu", GPU, 1, [H100])])])
    assert phases() == truth()

    pending = list(ResourceClaim.objects.filter(phase=Phase.PENDING).order_by("id"))
    early, late = pending[0], pending[1]
    with connection.cursor() as cursor:  # a seq taken by a writer that has not committed yet
        cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'seq'))", [Change._meta.db_table])
        in_flight = cursor.fetchone()[0]
    # A later writer commits first (the trigger logs it above the gap) ...
    ResourceClaim.objects.filter(pk=early.pk).update(phase=Phase.FAILED, resource_version=F("resource_version") + 1)
    assert phases() == truth()
    # ... then the first one: its row and its log entry appear below a seq the tally has already read.
    ResourceClaim.objects.filter(pk=late.pk).update(phase=Phase.FAILED)  # same resource_version: no trigger
    Change.objects.create(seq=in_flight, resource="resourceclaims", namespace=late.namespace.name, name=late.name,
                          uid=str(late.uid), row_id=late.pk, type="MODIFIED", at=timezone.now())
    summary = fleet_q.claim_summary()
    assert summary["phases"] == truth()
    assert summary["pending"]["count"] == truth()[Phase.PENDING] == len(pending) - 2


def test_a_rolled_back_seq_costs_a_lookup_not_a_full_read(demo, monkeypatch):
    """A seq that never appears (its writer rolled back; no beat seals it here) is looked up by seq on each
    refresh: the changes after it are read once, not again and again until a full read of every claim."""
    from django.db.models import F

    from claims.services.figures import claim_tally
    from draservice.models import Change

    monkeypatch.setattr(claim_tally, "MAX_CHANGES", 5)
    fleet_q.claim_summary()
    with connection.cursor() as cursor:  # rolled back: this seq never lands in the log
        cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'seq'))", [Change._meta.db_table])
    claims = list(ResourceClaim.objects.order_by("id")[:8])
    for i in range(4):  # 2 changes a refresh: 8 in all after the gap, more than MAX_CHANGES
        for c in claims[2 * i:2 * i + 2]:
            ResourceClaim.objects.filter(pk=c.pk).update(phase=Phase.FAILED,
                                                         resource_version=F("resource_version") + 1)
        with CaptureQueriesContext(connection) as ctx:
            summary = fleet_q.claim_summary()
        assert summary["phases"] == {p.value: ResourceClaim.objects.filter(phase=p).count() for p in Phase}
        whole = [q["sql"] for q in ctx.captured_queries
                 if 'FROM "claims_resourceclaim"' in q["sql"] and "WHERE" not in q["sql"]]
        assert not whole, f"refresh {i}: every claim read again"


def _reading_devices(monkeypatch):
    """Pool keys of the devices each refresh reads (through the tally's unit making)."""
    read: list[tuple] = []
    make = fleet_q._tally._make_units

    def spy(rows, pools):
        read.extend((r[1], r[3], r[4]) for r in rows if (r[1], r[3], r[4]) in pools)
        return make(rows, pools)

    monkeypatch.setattr(fleet_q._tally, "_make_units", spy)
    return read


def _signatures_read(monkeypatch):
    """Pool keys whose signatures each refresh reads (the pools and slices of the buckets that moved)."""
    read: list[tuple] = []
    signatures = fleet_q._tally._pool_signatures

    def spy(scope):
        out = signatures(scope)
        read.extend(out)
        return out

    monkeypatch.setattr(fleet_q._tally, "_pool_signatures", spy)
    return read


def test_pool_buckets_agree_between_python_and_postgresql():
    """The tally finds the pools gone from a bucket by hashing here what PostgreSQL hashed: both must agree."""
    from claims.services.figures.fleet_tally import BUCKET_HEX, bucket_of

    names = [("gpu.nvidia.com", "node-a"), ("gpu.amd.com", "pool-\u00e9t\u00e9-\u6c60"), ("x", ""), ("", "y/z")]
    with connection.cursor() as cursor:
        for driver, pool in names:
            cursor.execute("SELECT substr(md5(%s || '/' || %s), 1, %s)", [driver, pool, BUCKET_HEX])
            assert cursor.fetchone()[0] == bucket_of(driver, pool), (driver, pool)


def _allocated_slice():
    """An allocated GPU in a node-local slice that also has an idle, untainted whole GPU: (allocation, its slice
    row, the idle GPU's name)."""
    from inventory.models import Device

    for alloc in DeviceAllocation.objects.filter(driver=GPU, admin_access=False).order_by("id"):
        device = Device.objects.filter(cluster__name=alloc.cluster, driver=alloc.driver, pool_name=alloc.pool,
                                       name=alloc.device).select_related("resource_slice").first()
        if device is None:
            continue
        held = set(DeviceAllocation.objects.filter(cluster=alloc.cluster, driver=alloc.driver, pool=alloc.pool)
                   .values_list("device", flat=True))
        # Not tainted already, by itself or by a rule (the demo's taint rule selects one device).
        ruled = {name for pool, name in DeviceTaintRule.objects.values_list("pool_name", "device_name")
                 if pool in ("", alloc.pool)}
        for d in device.resource_slice.object["spec"]["devices"]:
            if d["name"] not in held | ruled and "" not in ruled and not d.get("consumesCounters") \
                    and not d.get("taints"):
                return alloc, device.resource_slice, d["name"]
    raise AssertionError("the demo fleet has an allocated GPU beside an idle one")


def _check(label):
    rows, _ = maintained_rows()
    assert rows == scanned_rows(), label
    return rows


def _in_use(rows):
    return sum(r["allocated_only"] + r["shared"] for r in rows.values())


def test_an_inventory_change_reads_only_the_pools_that_moved(demo, monkeypatch):
    """A push to one cluster reads the devices of the pools it changed, not the fleet's; a node's labels read
    none. After each change (a taint, an allocated device removed and brought back, a slice deleted, claims
    allocated and released in between) the maintained rows equal a fresh computation."""
    from inventory.models import Device, Node, Pool
    from inventory.services.sync import delete_resource_slice, put_node, put_resource_slice

    first = _check("before")
    read = _reading_devices(monkeypatch)
    signed = _signatures_read(monkeypatch)
    alloc, row, idle = _allocated_slice()
    cluster = row.cluster.name
    pool = (cluster, row.driver, row.pool_name)
    in_pool = Device.objects.filter(cluster__name=cluster, driver=row.driver, pool_name=row.pool_name).count()
    pools = Pool.objects.filter(cluster__name=cluster).count()

    node = Node.objects.filter(cluster__name=cluster).order_by("name").first()
    put_node(cluster, node.name, {"name": node.name, "labels": {**node.labels, "touched": "1"}})
    _check("a node's labels changed")
    assert read == []

    original = row.object
    devices = original["spec"]["devices"]
    tainted = {**original, "spec": {**original["spec"], "devices": [
        {**d, "taints": [{"key": "draservice.io/broken", "value": "1", "effect": "NoSchedule"}]}
        if d["name"] == idle else d for d in devices if d["name"] != alloc.device]}}
    put_resource_slice(cluster, row.name, tainted)
    shrunk = _check("an idle device tainted and an allocated one removed")
    assert set(read) == {pool} and len(read) == in_pool - 1
    # Only the moved pool's bucket had its pools' signatures read, not every pool of the cluster.
    assert pool in signed and len(signed) < pools, (len(signed), pools)
    assert _in_use(shrunk) == _in_use(first) - 1  # the allocation names a device that is gone
    assert sum(r["tainted"] for r in shrunk.values()) > sum(r["tainted"] for r in first.values())

    create_claims("team-x", [claim("between", [request("gpu", GPU, 1, [H100])])])
    release_claim(ResourceClaim.objects.get(namespace__name="team-x", name="between").pk)
    _check("a claim allocated and released while the device is gone")

    read.clear()
    put_resource_slice(cluster, row.name, original)
    back = _check("the slice as it was")
    assert set(read) == {pool} and len(read) == in_pool
    assert back == first  # the allocation holds its device again

    read.clear()
    delete_resource_slice(cluster, row.name)
    _check("the slice deleted")
    assert set(read) <= {pool}
    assert Device.objects.filter(cluster__name=cluster, driver=row.driver, pool_name=row.pool_name).count() \
        == len(read)


def test_clusters_added_and_deleted_keep_the_tally_exact(demo):
    from inventory.demo import node_slices
    from inventory.models import Cluster
    from inventory.services.clusters import create_cluster, delete_cluster
    from inventory.services.sync import push_inventory

    _check("before")
    create_cluster(name="late-joiner", labels={"provider": "onprem"}, with_token=False)
    push_inventory("late-joiner", {"resourceSlices": node_slices("h100", "late-h100-00000"),
                                   "nodes": [{"name": "late-h100-00000", "labels": {}}],
                                   "deviceClasses": [], "deviceTaintRules": []})
    grown = _check("a cluster added")
    assert any(g[0] == Cluster.objects.get(name="late-joiner").pk for g in grown)
    create_claims("team-x", [claim(f"new-{i}", [request("gpu", GPU, 1, [H100])]) for i in range(3)])
    _check("claims allocated on the new fleet")

    busy = Cluster.objects.get(name=DeviceAllocation.objects.filter(admin_access=False).order_by("id")
                               .values_list("cluster", flat=True).first())
    delete_cluster(busy)  # its allocations stay behind (the claims app's business), naming devices now gone
    gone = _check("a cluster with allocations deleted")
    assert all(g[0] != busy.pk for g in gone)
