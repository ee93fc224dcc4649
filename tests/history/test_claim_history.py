"""Claims' history for replay: arrival, shape, queue label and walltime survive the claim's deletion, for one claim
(PostgreSQL's one-statement create) and a batch alike, and are pruned past ``HISTORY_DAYS``."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from claims.models import ClaimHistory
from claims.services import history
from tests.claims.fleet import gpu_claim

pytestmark = pytest.mark.django_db

URL = "/api/v1/namespaces/team-a/resourceclaims"


def test_a_claim_deleted_before_it_ran_keeps_its_arrival_and_shape(admin_client, classes):
    body = gpu_claim("job", 3, labels={"draservice.io/queue": "a"},
                     annotations={"draservice.io/lease-ttl": "10m"})
    made = admin_client.post(URL, body, format="json")
    assert made.status_code == 201, made.content
    uid = made.json()["metadata"]["uid"]
    assert admin_client.delete(f"{URL}/job").status_code == 200
    (row,) = ClaimHistory.objects.filter(claim_uid=uid)
    assert (row.namespace, row.claim_name, row.lease_seconds) == ("team-a", "job", 600)
    assert row.labels == {"draservice.io/queue": "a"}
    assert row.spec["devices"]["requests"][0]["exactly"]["count"] == 3
    assert row.created_at.isoformat().startswith(made.json()["metadata"]["creationTimestamp"][:19])


def test_a_batch_writes_one_row_per_claim_and_a_refused_batch_none(admin_client, classes):
    batch = {"kind": "List", "items": [gpu_claim(f"b{i}", i + 1) for i in range(3)]}
    assert admin_client.post(f"{URL}/batch", batch, format="json").status_code == 201
    assert sorted(ClaimHistory.objects.values_list("claim_name", flat=True)) == ["b0", "b1", "b2"]
    # A name already taken refuses the whole batch: no history for claims that do not exist.
    again = admin_client.post(f"{URL}/batch", {"kind": "List", "items": [gpu_claim("b9"), gpu_claim("b0")]},
                              format="json")
    assert again.status_code == 409
    assert ClaimHistory.objects.count() == 3


def test_prune_drops_what_is_older_than_history_days(settings, admin_client, classes):
    settings.HISTORY_DAYS = 30
    for name in ("old", "kept"):
        admin_client.post(URL, gpu_claim(name), format="json")
    ClaimHistory.objects.filter(claim_name="old").update(created_at=timezone.now() - timedelta(days=31))
    ClaimHistory.objects.filter(claim_name="kept").update(created_at=timezone.now() - timedelta(days=29))
    assert history.prune(batch=1) == 1
    assert list(ClaimHistory.objects.values_list("claim_name", flat=True)) == ["kept"]
