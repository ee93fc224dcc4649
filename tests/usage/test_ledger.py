"""The usage ledger against real PostgreSQL and the real allocation round, with an injected clock: exact
device-hours, MIG and consumable-capacity weights, written in the commit's transaction, closed by every path
that frees devices."""
from __future__ import annotations

import importlib
from datetime import timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from django.apps import apps as django_apps
from django.db import transaction

from claims.models import Consumer, DeviceAllocation, ResourceClaim
from claims.services import claims as claim_services
from claims.services import commit as commit_service
from claims.services import consumers as consumer_services
from claims.services import preemption
from inventory import demo
from inventory.services import clusters as cluster_services
from inventory.services import sync
from tests.claims.fleet import gpu_claim, load_device_classes, mig_pair_claim
from tests.usage.conftest import T0, assert_ledger_matches_allocations, run_rounds
from usage.models import UsageInterval
from usage.services import ledger, reports

pytestmark = pytest.mark.django_db

NS = "/api/v1/namespaces/team-a"
MIG_WEIGHT = Fraction(9856, 80384)  # a 1g.10gb partition's memory over its A100's memory counter


def report(groups, since, until, now, namespaces=None):
    return reports.usage(reports.Window(since, until), groups, namespaces, now)


def claim_id(name: str) -> int:
    return ResourceClaim.objects.get(name=name).id


def test_exclusive_devices_count_exactly_to_the_second(admin_client, fleet, clock):
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("job", count=2), format="json").status_code == 201
    run_rounds()
    rows = list(UsageInterval.objects.order_by("device"))
    assert len(rows) == 2 and {r.weight for r in rows} == {Decimal(1)}
    r0 = rows[0]
    assert (r0.namespace, r0.claim_name, r0.cluster, r0.sharing, r0.started_at) == ("team-a", "job", "c1",
                                                                                     "exclusive", T0)
    assert r0.node == ResourceClaim.objects.get(name="job").node and r0.product == "NVIDIA H100 80GB HBM3"
    assert r0.queue == "default" and r0.ended_at is None
    clock.advance(hours=1, minutes=30, seconds=1)
    # Open intervals end at now when read.
    mid = report(["namespace"], T0 - timedelta(days=1), clock.t, clock.t)
    assert mid["items"][0]["deviceSeconds"] == 2 * 5401
    claim_services.release_claim(claim_id("job"))
    assert set(UsageInterval.objects.values_list("ended_at", flat=True)) == {T0 + timedelta(seconds=5401)}
    clock.advance(hours=5)
    out = report(["namespace", "product"], T0 - timedelta(days=1), clock.t, clock.t)
    assert out["items"] == [{"namespace": "team-a", "product": "NVIDIA H100 80GB HBM3", "deviceHours": 3.000556,
                             "deviceSeconds": 10802.0, "cost": None, "currency": None, "costs": {},
                             "unpricedDeviceHours": 3.000556}]
    # The window clips: half an hour of the 1.5 h, on two devices.
    clipped = report(["cluster"], T0 + timedelta(hours=1), T0 + timedelta(hours=4), clock.t)
    assert clipped["items"][0]["deviceSeconds"] == 2 * 1801


def test_mig_partitions_count_their_share_of_the_parent(admin_client, fleet, clock):
    admin_client.post(f"{NS}/resourceclaims", mig_pair_claim("mig"), format="json")
    run_rounds()
    rows = list(UsageInterval.objects.all())
    assert len(rows) == 2 and {r.sharing for r in rows} == {"partition"}
    assert {r.product for r in rows} == {"NVIDIA A100-SXM4-80GB"}
    assert rows[0].weight == Decimal(MIG_WEIGHT.numerator) / Decimal(MIG_WEIGHT.denominator) \
        or abs(rows[0].weight - Decimal(float(MIG_WEIGHT))) < Decimal("1e-12")
    clock.advance(hours=10)
    out = report(["sharing"], T0, clock.t, clock.t)
    assert out["items"][0]["sharing"] == "partition"
    assert out["items"][0]["deviceHours"] == pytest.approx(float(2 * 10 * MIG_WEIGHT), abs=1e-6)


def test_weights_of_whole_devices_partitions_and_shares():
    counters = {"gpu-0": {"memory": {"value": "80Gi"}, "sm": {"value": "98"}}}

    def part(**amounts):
        return {"consumesCounters": [{"counterSet": "gpu-0", "counters": {
            k: {"value": v} for k, v in amounts.items()}}]}

    # The whole GPU of a partitionable pool consumes all of its memory: one device, exclusive.
    assert ledger.weight_of(part(memory="80Gi", sm="98"), counters, "", None) == (1, "exclusive")
    assert ledger.weight_of(part(memory="20Gi", sm="14"), counters, "", None) == (Fraction(1, 4), "partition")
    # Without a memory counter, the largest share of what is counted.
    assert ledger.weight_of(part(sm="49"), counters, "", None) == (Fraction(1, 2), "partition")
    shared = {"capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}}
    assert ledger.weight_of(shared, {}, "s1", {"memory": "8Gi", "cores": "50"}) == (Fraction(1, 10), "shared")
    assert ledger.weight_of(shared, {}, "s1", {"cores": "50"}) == (Fraction(1, 2), "shared")
    # A share that states no consumption, a device the snapshot lacks: charged as a whole device.
    assert ledger.weight_of(shared, {}, "s1", None) == (1, "shared")
    assert ledger.weight_of(None, {}, "", None) == (1, "exclusive")


def _shared_cluster() -> None:
    """One node whose eight H100s each take many claims (allowMultipleAllocations), 80Gi of memory each."""
    load_device_classes()
    slices = demo.node_slices("h100", "share-node")
    for s in slices:
        for d in s["spec"].get("devices") or ():
            d["allowMultipleAllocations"] = True
            d["capacity"] = {"memory": {"value": "80Gi"}}
    cluster_services.create_cluster(name="c-share", labels={"env": "share"}, with_token=False)
    sync.push_inventory("c-share", {"resourceSlices": slices, "nodes": [{"name": "share-node", "labels": {}}]})


def test_a_consumable_capacity_share_counts_consumed_over_capacity(admin_client, db, clock):
    _shared_cluster()
    claim = gpu_claim("slice")
    claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "20Gi"}}
    assert admin_client.post(f"{NS}/resourceclaims", claim, format="json").status_code == 201
    run_rounds()
    (row,) = UsageInterval.objects.all()
    assert (row.weight, row.sharing) == (Decimal("0.25"), "shared") and row.share_id
    clock.advance(hours=4)
    assert report(["sharing"], T0, clock.t, clock.t)["items"][0]["deviceHours"] == 1.0
    assert_ledger_matches_allocations()


def test_a_failed_commit_leaves_no_interval(admin_client, fleet, clock, monkeypatch):
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("job", count=2), format="json")

    def boom(*args, **kwargs):
        raise RuntimeError("crash after the ledger was written, before the commit ended")

    monkeypatch.setattr(commit_service, "record", boom)
    with pytest.raises(RuntimeError):
        run_rounds()
    assert UsageInterval.objects.count() == 0 and DeviceAllocation.objects.count() == 0
    monkeypatch.undo()
    clock.advance(seconds=1)  # the patched clock was undone too: put it back
    monkeypatch.setattr("django.utils.timezone.now", clock)
    run_rounds()
    assert UsageInterval.objects.count() == 2
    assert_ledger_matches_allocations()


def test_every_path_that_frees_devices_closes_its_intervals(admin_client, fleet, clock):
    for name in ("rel", "del", "lease", "pre"):
        body = gpu_claim(name)
        if name == "lease":
            body["metadata"]["annotations"] = {"draservice.io/lease-ttl": "60s"}
        admin_client.post(f"{NS}/resourceclaims", body, format="json")
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
                "spec": {"spec": gpu_claim("x")["spec"]}}
    admin_client.post(f"{NS}/resourceclaimtemplates", template, format="json")
    consumer = {"metadata": {"name": "pod"}, "spec": {"resourceClaims": [{"name": "gpu",
                                                                          "resourceClaimTemplateName": "t"}]}}
    assert admin_client.post(f"{NS}/consumers", consumer, format="json").status_code == 201
    run_rounds()
    assert UsageInterval.objects.filter(ended_at__isnull=True).count() == 5
    assert_ledger_matches_allocations()
    clock.advance(minutes=1)
    claim_services.release_claim(claim_id("rel"))
    clock.advance(minutes=1)
    claim_services.delete_claim(claim_id("del"))
    clock.advance(minutes=1)
    assert claim_services.expire_leases() == 1
    clock.advance(minutes=1)
    with transaction.atomic():
        preemption.requeue(preemption.locked([claim_id("pre")]), "test", clock.t)
    clock.advance(minutes=1)
    consumer_services.delete_consumer(Consumer.objects.get(name="pod").id)
    ended = dict(UsageInterval.objects.values_list("claim_name", "ended_at"))
    assert ended["rel"] == T0 + timedelta(minutes=1) and ended["del"] == T0 + timedelta(minutes=2)
    assert ended["lease"] == T0 + timedelta(minutes=3) and ended["pre"] == T0 + timedelta(minutes=4)
    assert [v for k, v in ended.items() if k not in ("rel", "del", "lease", "pre")] == [T0 + timedelta(minutes=5)]
    # The deleted claims' rows stay: the ledger outlives them.
    assert UsageInterval.objects.count() == 5 and not ResourceClaim.objects.filter(name="del").exists()
    assert_ledger_matches_allocations()


def test_the_upgrade_opens_intervals_for_allocations_made_before_the_ledger(admin_client, fleet, clock):
    backfill = importlib.import_module("usage.migrations.0002_backfill_open_intervals").backfill
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("job", count=2), format="json")
    admin_client.post(f"{NS}/resourceclaims", mig_pair_claim("mig"), format="json")
    run_rounds()
    fields = ("claim_id", "claim_uid", "namespace", "cluster", "node", "driver", "pool", "device", "share_id",
              "product", "sharing", "weight", "started_at", "ended_at")
    written = sorted(UsageInterval.objects.values_list(*fields))
    assert len(written) == 4
    UsageInterval.objects.all().delete()  # as before the upgrade
    backfill(django_apps, None)
    assert sorted(UsageInterval.objects.values_list(*fields)) == written
    assert_ledger_matches_allocations()
