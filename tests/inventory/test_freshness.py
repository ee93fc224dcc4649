"""Stale clusters, the engine snapshot, and the demo fleet."""
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from dra.engine.types import ClusterInventory, FleetSnapshot
from inventory import demo
from inventory.models import Cluster, Device, DeviceClass, DeviceTaintRule, Node
from inventory.services.clusters import sweep_stale_clusters
from inventory.services.sync import push_inventory
from inventory.signals import inventory_changed
from inventory.snapshot import build_fleet_snapshot

pytestmark = pytest.mark.django_db


def age(cluster_name, seconds):
    past = timezone.now() - timedelta(seconds=seconds)
    Cluster.objects.filter(name=cluster_name).update(last_sync_at=past, last_heartbeat_at=None)


def test_a_cluster_silent_past_the_window_is_stale(cluster_factory, admin_client, settings, real_slices):
    settings.STALE_CLUSTER_SECONDS = 60
    cluster_factory("c1")
    cluster_factory("c2")
    assert Cluster.objects.get(name="c1").stale  # never heard from
    push_inventory("c1", {"resourceSlices": real_slices[:1]})
    push_inventory("c2", {"resourceSlices": real_slices[1:2]})
    assert not Cluster.objects.get(name="c1").stale
    age("c1", 61)
    clusters = {c["name"]: c for c in admin_client.get("/api/v1/clusters").json()["results"]}
    assert clusters["c1"]["stale"] and not clusters["c2"]["stale"]
    assert [c["name"] for c in admin_client.get("/api/v1/clusters", {"stale": "true"}).json()["results"]] == ["c1"]
    stale_devices = admin_client.get("/api/v1/devices", {"stale": "true"}).json()["results"]
    assert {d["cluster"] for d in stale_devices} == {"c1"} and all(d["clusterStale"] for d in stale_devices)


def test_sweep_marks_once_and_a_heartbeat_revives(cluster_factory, settings, real_slices,
                                                  django_capture_on_commit_callbacks):
    settings.STALE_CLUSTER_SECONDS = 60
    _, agent = cluster_factory("c1")
    push_inventory("c1", {"resourceSlices": real_slices[:1]})
    age("c1", 120)
    signals = []

    def receiver(**kwargs):
        signals.append((kwargs["cluster"], kwargs["reason"]))

    inventory_changed.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            assert sweep_stale_clusters() == ["c1"]
        with django_capture_on_commit_callbacks(execute=True):
            assert sweep_stale_clusters() == []  # already marked: no second signal
        assert Cluster.objects.get(name="c1").stale_since is not None
        assert Device.objects.filter(cluster__name="c1").count() == 8  # devices stay; only offers stop
        with django_capture_on_commit_callbacks(execute=True):
            assert agent.post("/api/v1/clusters/c1/heartbeat", {}, format="json").status_code == 200
    finally:
        inventory_changed.disconnect(receiver)
    assert signals == [("c1", "stale"), ("c1", "heartbeat-fresh")]
    cluster = Cluster.objects.get(name="c1")
    assert cluster.stale_since is None and not cluster.stale


def test_fleet_snapshot_for_the_engine(cluster_factory, settings, real_slices, django_assert_max_num_queries):
    settings.STALE_CLUSTER_SECONDS = 60
    cluster_factory("c1", {"region": "eu"})
    cluster_factory("c2")
    class_obj = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.amd.com"},
                 "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.amd.com'"}}]}}
    rule = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": "r"},
            "spec": {"deviceSelector": {"driver": "gpu.amd.com"}, "taint": {"key": "k", "effect": "NoSchedule"}}}
    push_inventory("c1", {"resourceSlices": real_slices, "nodes": [{"name": "rpl-s", "labels": {"z": "a"}}],
                          "deviceClasses": [class_obj], "deviceTaintRules": [rule]})
    push_inventory("c2", {"resourceSlices": real_slices[:1]})
    DeviceClass.objects.create(name="gpu.amd.com", object=class_obj)
    DeviceTaintRule.objects.create(name="fleet-rule", object={**rule, "metadata": {"name": "fleet-rule"}})
    age("c2", 120)
    with django_assert_max_num_queries(6):
        snapshot = build_fleet_snapshot()
    assert isinstance(snapshot, FleetSnapshot) and all(isinstance(c, ClusterInventory) for c in snapshot.clusters)
    c1, c2 = snapshot.clusters
    assert (c1.name, c1.labels, c1.stale, c2.name, c2.stale) == ("c1", {"region": "eu"}, False, "c2", True)
    assert sorted(c1.resource_slices, key=lambda o: o["metadata"]["name"]) == \
        sorted(real_slices, key=lambda o: o["metadata"]["name"])
    assert {"name": "rpl-s", "labels": {"z": "a"}} in c1.nodes and len(c1.nodes) == 7
    assert [r["metadata"]["name"] for r in c1.device_taint_rules] == ["fleet-rule", "r"]
    assert [r["metadata"]["name"] for r in c2.device_taint_rules] == ["fleet-rule"]
    assert c1.device_classes == [class_obj] and snapshot.device_classes == [class_obj]
    assert [c.name for c in build_fleet_snapshot(clusters=["c2"]).clusters] == ["c2"]


def test_demo_fleet_generator_is_realistic_and_deterministic():
    fleet = demo.generate_fleet(48)
    assert sum(len(c.body["nodes"]) for c in fleet) == 48 and len(fleet) == 4
    assert {c.labels["provider"] for c in fleet} == {"aws", "gcp", "azure", "onprem"}
    assert fleet[0].body == demo.generate_fleet(48)[0].body
    drivers = {s["spec"]["driver"] for c in fleet for s in c.body["resourceSlices"]}
    assert {"gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com", "gpu.example.com"} <= drivers
    uuids = [d["attributes"]["uuid"]["string"] for c in fleet for s in c.body["resourceSlices"]
             for d in s["spec"].get("devices", []) if "uuid" in d.get("attributes", {})]
    assert len(uuids) == len(set(uuids)) > 100
    node = fleet[0].body["nodes"][0]["labels"]
    assert {"topology.kubernetes.io/zone", "topology.draservice.io/rack", "topology.kubernetes.io/region"} <= set(node)
    assert len(demo.synthetic_cluster(10)["resourceSlices"]) == 10


def test_load_demo_fleet_is_idempotent(db):
    out = StringIO()
    call_command("load_demo_fleet", "--nodes", "12", stdout=out)
    counts = (Cluster.objects.count(), Node.objects.count(), Device.objects.count(), DeviceClass.objects.count())
    versions = list(Cluster.objects.order_by("name").values_list("inventory_version", flat=True))
    call_command("load_demo_fleet", "--nodes", "12", stdout=out)
    assert (Cluster.objects.count(), Node.objects.count(), Device.objects.count(),
            DeviceClass.objects.count()) == counts
    assert list(Cluster.objects.order_by("name").values_list("inventory_version", flat=True)) == versions
    assert counts[1] == 12 and counts[3] == 8 and counts[2] > 100
    assert "unchanged" in out.getvalue()
    assert all(c.labels.get(demo.DEMO_LABEL) == "true" for c in Cluster.objects.all())
