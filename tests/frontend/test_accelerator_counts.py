"""One definition of an accelerator (claims.services.figures.accelerators), checked as a property over random fleets.

Random fleets of the demo's real node types (H100 nodes carry two compute-domain helper devices each, A100s
are MIG-partitioned: 25 partition devices per GPU), random claims allocated by the real engine, random taint
rules and stale clusters. For every fleet: each node's four states sum to the node's accelerators (known per
node type), and the overview, the sum of the node pages' counts, ``/metrics`` and ``/api/v1/devices/summary/``
agree state by state.
"""
from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from claims.services import fleet as claims_fleet
from claims.services.claims import create_claims
from claims.services.engines import engines
from claims.services.figures import fleet as fleet_q
from claims.services.figures.accelerators import STATES
from claims.services.figures.claim_tally import ClaimTally
from claims.services.figures.fleet_tally import FleetTally
from frontend import metrics as fleet_metrics
from inventory.models import Cluster, Device, DeviceClass, DeviceTaintRule, Node
from inventory.services import clusters as cluster_services
from inventory.services import sync
from inventory.services.fleet import create_fleet_object, replace_fleet_object
from tests.claims.fleet import cluster_body, gpu_claim, load_device_classes, mig_pair_claim
from tests.test_metrics_grafana import scrape

pytestmark = pytest.mark.django_db

# Accelerators per node of each demo node type: physical GPUs, whatever the driver publishes besides.
ACCELERATORS = {"h100": 8, "a100-mig": 8, "l4": 4, "example": 8}
_names = itertools.count()

fleets = st.lists(st.fixed_dictionaries({
    "nodes": st.lists(st.tuples(st.sampled_from(sorted(ACCELERATORS)), st.integers(1, 2)), min_size=1, max_size=3,
                      unique_by=lambda t: t[0]),
    "claims": st.lists(st.sampled_from(["gpu-1", "gpu-3", "mig-pair", "example-2"]), max_size=4),
    "taint": st.booleans(),
    "stale": st.booleans(),
}), min_size=1, max_size=2)


@pytest.fixture(autouse=True)
def _forget_after_the_rollback():
    yield
    _forget_rolled_back_state()


def _build(spec: dict) -> None:
    name = f"prop-{next(_names)}"
    cluster_services.create_cluster(name=name, labels={"env": "prop"}, with_token=False)
    sync.push_inventory(name, cluster_body(name, spec["nodes"]))
    objects = {"gpu-1": lambda n: gpu_claim(n, 1), "gpu-3": lambda n: gpu_claim(n, 3),
               "mig-pair": lambda n: mig_pair_claim(n), "example-2": lambda n: gpu_claim(n, 2, "gpu.example.com")}
    for i, kind in enumerate(spec["claims"]):
        create_claims(name, [objects[kind](f"{kind}-{i}")])
    if spec["taint"]:
        device = Device.objects.filter(cluster__name=name).order_by("id").first()
        create_fleet_object(DeviceTaintRule, {
            "apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": f"t-{name}"},
            "spec": {"deviceSelector": {"driver": device.driver, "pool": device.pool_name, "device": device.name},
                     "taint": {"key": "broken", "effect": "NoSchedule"}}})
    if spec["stale"]:
        old = timezone.now() - timedelta(hours=1)
        Cluster.objects.filter(name=name).update(last_sync_at=old, last_heartbeat_at=old)


# Generation only: each example is a few pushes and allocation rounds, and a failure prints its fleet.
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fleet=fleets)
@example(fleet=[{"nodes": [("h100", 1), ("a100-mig", 1)], "claims": ["gpu-3", "mig-pair"], "taint": True,
                 "stale": False},
                {"nodes": [("l4", 1), ("example", 1)], "claims": ["gpu-1", "example-2"], "taint": False,
                 "stale": True}])
def test_every_count_of_accelerators_agrees(admin_client, monkeypatch, fleet):
    _forget_rolled_back_state()
    load_device_classes()
    with transaction.atomic():  # each example starts from an empty fleet
        for spec in fleet:
            _build(spec)
        monkeypatch.setattr(fleet_q, "_tally", FleetTally())
        monkeypatch.setattr(fleet_q, "_claims", ClaimTally())
        fleet_metrics._cache.clear()
        try:
            _check(admin_client, fleet)
        finally:
            transaction.set_rollback(True)
            _forget_rolled_back_state()


def _forget_rolled_back_state() -> None:
    """The claims round caches the fleet view and its engine per process by version numbers that a rollback
    takes back: an example (or the next test) must not allocate against what a rolled-back one allocated."""
    claims_fleet.invalidate(hard=True)
    engines.reset()


def _check(admin_client, fleet: list[dict]) -> None:
    expected_per_type = {f"-{t}-": n for t, n in ACCELERATORS.items()}
    node_sum = dict.fromkeys(STATES, 0)
    for node in Node.objects.select_related("cluster"):
        tally = fleet_q.node_tally(node.cluster, node.name)
        states = tally.states
        expected = next(n for key, n in expected_per_type.items() if key in node.name)
        assert sum(states.values()) == tally.total == expected, (node.name, states)
        for state, n in states.items():
            node_sum[state] += n

    overview = fleet_q.fleet_overview()["totals"].states
    assert overview == node_sum, fleet
    assert sum(overview.values()) == sum(ACCELERATORS[t] * n for spec in fleet for t, n in spec["nodes"])

    summary = admin_client.get("/api/v1/devices/summary/").json()["accelerators"]
    assert summary == {"total": sum(overview.values()), **overview}

    samples = scrape(admin_client)
    metric = {"free": "draservice_fleet_devices_free", "partial": "draservice_fleet_devices_partial",
              "allocated": "draservice_fleet_devices_allocated_full",
              "unavailable": "draservice_fleet_devices_unavailable"}
    assert {s: int(sum(v for _, v in samples.get(m, []))) for s, m in metric.items()} == overview
    assert int(sum(v for _, v in samples["draservice_fleet_devices"])) == sum(overview.values())


def test_unmarking_a_class_changes_the_count_at_once(admin_client):
    """The maintained overview tally follows a DeviceClass write: unmark the NVIDIA GPU class and its whole GPUs
    stop counting (MIG GPUs still do: a counter set is an accelerator whatever the class); mark it again and
    they are back."""
    _forget_rolled_back_state()
    load_device_classes()
    _build({"nodes": [("h100", 1), ("a100-mig", 1)], "claims": [], "taint": False, "stale": False})
    assert fleet_q.fleet_overview()["totals"].total == 16
    obj = DeviceClass.objects.get(cluster=None, name="gpu.nvidia.com").object
    unmarked = {**obj, "metadata": {**obj["metadata"], "annotations": {
        k: v for k, v in obj["metadata"]["annotations"].items() if k != "draservice.io/accelerator"}}}
    replace_fleet_object(DeviceClass, "gpu.nvidia.com", unmarked, None)
    assert fleet_q.fleet_overview()["totals"].total == 8
    replace_fleet_object(DeviceClass, "gpu.nvidia.com", obj, None)
    assert fleet_q.fleet_overview()["totals"].total == 16
