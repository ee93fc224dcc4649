"""The lease sweep keeps up: one sweep goes on past a full batch whether the batch released its claims or only
gave them their notice (a watched cluster's claim whose lease lapsed is ``Releasing`` first, see
``claims.services.walltime``). It stopped at the first batch that released fewer than a batch's size, which
under load was every batch: leases expired later and later and the fleet filled with claims past their end."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from claims import tasks
from claims.models import Phase, ResourceClaim
from claims.services import claims as claim_services
from inventory.models import Cluster
from scheduler.services import allocation
from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = pytest.mark.django_db

NS = "/api/v1/namespaces/team-a/resourceclaims"


def allocated_leased(admin_client, prefix: str, count: int) -> list[int]:
    """``count`` new 1-GPU claims with a lease, allocated on cluster c1 (4 H100 nodes: 32 GPUs), whose agent
    heartbeats (so a lapsed lease gets its notice rather than an immediate release). Returns their ids."""
    if not Cluster.objects.filter(name="c1").exists():
        load_fleet({"c1": [("h100", 4)]})
    before = set(ResourceClaim.objects.values_list("id", flat=True))
    items = [gpu_claim(f"{prefix}-{i}", annotations={"draservice.io/lease-ttl": "1h"}) for i in range(count)]
    assert admin_client.post(f"{NS}/batch", {"items": items}, format="json").status_code == 201
    while allocation.allocate_round().taken:
        pass
    Cluster.objects.filter(name="c1").update(last_heartbeat_at=timezone.now())
    ids = set(ResourceClaim.objects.filter(phase=Phase.ALLOCATED).values_list("id", flat=True)) - before
    assert len(ids) == count
    return sorted(ids)


def releasing(ids: list[int]) -> set[int]:
    return {c.id for c in ResourceClaim.objects.filter(id__in=ids)
            if any(x["type"] == "Releasing" and x["status"] == "True" for x in c.conditions)}


def test_one_sweep_gives_every_lapsed_lease_its_notice_past_a_full_batch(admin_client):
    ids = allocated_leased(admin_client, "job", 30)
    ResourceClaim.objects.filter(id__in=ids).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    with CaptureQueriesContext(connection) as queries:
        assert claim_services.expire_leases(limit=8) == 0  # notices only: nothing released yet
    assert releasing(ids) == set(ids)  # all 30, not the first batch's 8
    assert ResourceClaim.objects.filter(id__in=ids, phase=Phase.ALLOCATED).count() == 30
    # Three full batches and the one that found 6: each its own transaction of a bounded size.
    takes = [q for q in queries.captured_queries if '"lease_expires_at" ASC LIMIT 8 FOR UPDATE' in q["sql"]]
    assert len(takes) == 4


def test_a_sweep_releases_past_deadlines_and_notices_lapsed_leases_in_the_same_batches(admin_client):
    ids = allocated_leased(admin_client, "job", 20)
    past = timezone.now() - timedelta(seconds=1)
    ResourceClaim.objects.filter(id__in=ids).update(lease_expires_at=past)
    assert claim_services.expire_leases(limit=5) == 0
    noticed, later = ids[:10], ids[10:]  # the first ten's notice ends: released at the next sweep
    ResourceClaim.objects.filter(id__in=noticed).update(lease_expires_at=past)
    ResourceClaim.objects.filter(id__in=later).update(lease_expires_at=timezone.now() + timedelta(minutes=5))
    fresh = allocated_leased(admin_client, "more", 10)  # lapsed, no notice yet
    ResourceClaim.objects.filter(id__in=fresh).update(lease_expires_at=past)

    assert claim_services.expire_leases(limit=5) == 10  # 20 due rows in 4 full batches of 5
    assert set(ResourceClaim.objects.filter(id__in=noticed, phase=Phase.RELEASED).values_list("id", flat=True)) \
        == set(noticed)
    assert releasing(fresh) == set(fresh)
    assert ResourceClaim.objects.filter(id__in=later + fresh, phase=Phase.ALLOCATED).count() == 20


def test_a_sweep_is_bounded_and_the_next_one_goes_on(admin_client):
    ids = allocated_leased(admin_client, "job", 20)
    ResourceClaim.objects.filter(id__in=ids).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    claim_services.expire_leases(limit=4, batches=2)
    assert len(releasing(ids)) == 8
    claim_services.expire_leases(limit=4, batches=2)
    assert len(releasing(ids)) == 16


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_sweep_past_its_time_asks_for_itself_again_behind_the_rounds(admin_client, live_broker, monkeypatch):
    """The beat's sweep stops after its time (here: after one batch of 5) and asks for itself again through the
    broker, debounced: the worker process goes on with the rest."""
    ids = allocated_leased(admin_client, "job", 24)
    ResourceClaim.objects.filter(id__in=ids).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    monkeypatch.setattr(tasks, "LEASE_SWEEP_SECONDS", 0.0)
    monkeypatch.setattr(tasks, "LEASE_SWEEP_BATCH", 5)
    assert tasks.expire_leases() == 0  # in this process: one batch of notices
    assert len(releasing(ids)) == 5
    deadline = time.monotonic() + 30
    while len(releasing(ids)) < 24:  # the worker's sweep (batches of 500) gave the other 19 theirs
        assert time.monotonic() < deadline, f"{len(releasing(ids))} of 24 noticed"
        time.sleep(0.1)
