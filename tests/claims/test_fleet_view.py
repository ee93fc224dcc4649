"""The worker's fleet view (``claims.services.fleet.current_view``): an inventory push rebuilds its cluster
only; the periodic backstop finds slices edited around the service and rebuilds just that cluster; the
engine cache keeps the device models of the clusters that did not change."""
from __future__ import annotations

import time

import pytest

from claims.models import ResourceClaim
from claims.services import fleet
from claims.services.engines import engines
from inventory.models import Node, ResourceSlice
from inventory.services import sync
from scheduler.services import allocation
from tests.claims.fleet import cluster_body, gpu_claim, load_fleet

NS = "/api/v1/namespaces/default"


@pytest.fixture
def three_clusters(db):
    fleet.invalidate(hard=True)
    engines.reset()
    return load_fleet({"a": [("h100", 1)], "b": [("h100", 1)], "c": [("l4", 1)]})


def _inventories(view) -> dict:
    return {inv.name: inv for inv in view.snapshot.clusters}


def _age(view) -> None:
    view.built_at = time.monotonic() - fleet.SNAPSHOT_MAX_AGE_SECONDS - 1


def test_a_push_rebuilds_its_cluster_only_and_the_engine_keeps_the_other_models(admin_client, three_clusters):
    one = gpu_claim("one", annotations={"draservice.io/allowed-clusters": "name=a"})
    admin_client.post(f"{NS}/resourceclaims", one, format="json")
    assert allocation.allocate_round().allocated == 1
    before = fleet.current_view()
    models = dict(engines.engine.clusters)
    sync.push_inventory("b", cluster_body("b", [("h100", 2)]))
    fleet.invalidate()  # what the push's inventory_changed receiver does after commit: soft
    after = fleet.current_view()
    assert after is not before
    old, new = _inventories(before), _inventories(after)
    assert new["a"] is old["a"] and new["c"] is old["c"] and new["b"] is not old["b"]
    assert len(new["b"].nodes) == 2
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("two", count=8), format="json")
    admin_client.post(f"{NS}/resourceclaims", gpu_claim("three", count=8), format="json")
    # a's only node holds "one" (the new engine counts it there): the two 8-GPU claims take b's two nodes
    assert allocation.allocate_round().allocated == 2
    assert set(ResourceClaim.objects.filter(name__in=["two", "three"]).values_list("cluster", flat=True)) == {"b"}
    engine = engines.engine
    assert engine.clusters["a"] is models["a"] and engine.clusters["c"] is models["c"]
    assert engine.clusters["b"] is not models["b"]
    assert [d.idx for d in engine.devices] == list(range(len(engine.devices)))


def test_the_backstop_rebuilds_a_cluster_whose_slices_were_edited_around_the_service(three_clusters):
    view = fleet.current_view()
    _age(view)
    assert fleet.current_view() is view  # nothing changed: the check passes, the view stays
    row = ResourceSlice.objects.filter(cluster__name="c").first()
    obj = row.object
    obj["spec"]["devices"] = obj["spec"]["devices"][:1]
    ResourceSlice.objects.filter(pk=row.pk).update(object=obj, content_hash="edited")  # no version bump
    assert fleet.current_view() is view  # not yet due
    _age(view)
    rebuilt = fleet.current_view()
    old, new = _inventories(view), _inventories(rebuilt)
    assert new["a"] is old["a"] and new["b"] is old["b"] and new["c"] is not old["c"]
    assert sum(len(s["spec"]["devices"]) for s in new["c"].resource_slices) == 1 + sum(
        len(s["spec"]["devices"]) for s in old["c"].resource_slices if s["metadata"]["name"] != obj["metadata"]["name"])
    Node.objects.filter(cluster__name="a").update(labels={"zone": "x"})  # node labels count too
    _age(rebuilt)
    third = _inventories(fleet.current_view())
    assert third["a"] is not new["a"] and third["b"] is new["b"]
    assert third["a"].nodes[0]["labels"] == {"zone": "x"}


def test_a_hard_invalidation_rebuilds_everything(three_clusters):
    view = fleet.current_view()
    fleet.invalidate()
    soft = fleet.current_view()
    assert _inventories(soft) == _inventories(view) and all(
        soft_inv is _inventories(view)[name] for name, soft_inv in _inventories(soft).items())
    fleet.invalidate(hard=True)  # after the unique index refused a write the view allowed
    hard = _inventories(fleet.current_view())
    assert not any(inv is _inventories(view)[name] for name, inv in hard.items())


def test_the_rows_follower_survives_a_restarted_change_log(three_clusters):
    """``manage.py flush`` empties the change log and restarts its sequence: a worker that followed the old
    log must not wait for the new sequence to catch up with its old place (it would miss every release)."""
    from claims.models import DeviceAllocation, Phase
    from claims.services import claims as claim_services

    claim_services.create_claims("team-a", [gpu_claim("one")])
    allocation.allocate_round()
    assert len(fleet.rows_in_use()) == 1
    fleet._rows.follower.seq += 1_000_000  # where it stood in the old log, far past the restarted sequence
    fleet.reset_rows()
    assert len(fleet.rows_in_use()) == 1
    claim_services.release_claim(ResourceClaim.objects.get(name="one").id)
    assert not DeviceAllocation.objects.exists() and ResourceClaim.objects.get(name="one").phase != Phase.ALLOCATED
    assert fleet.rows_in_use() == {}  # the release is seen: the follower starts from the new log
