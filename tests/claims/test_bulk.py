"""The bulk writer (claims.services.bulk) writes one row with scalar parameters and several with one array per
column: both forms store the same values, None and JSON included, and each statement touches only its rows."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from claims.models import ResourceClaim
from claims.services import bulk
from tests.claims.fleet import gpu_claim

NS = "/api/v1/namespaces/team-a"
FIELDS = ["phase", "reason", "message", "allocation", "released_at", "lease_expires_at", "resource_version",
          "conditions"]

pytestmark = pytest.mark.django_db


def _claims(admin_client, names: list[str]) -> list[ResourceClaim]:
    for name in names:
        assert admin_client.post(f"{NS}/resourceclaims", gpu_claim(name), format="json").status_code == 201
    return list(ResourceClaim.objects.filter(namespace__name="team-a", name__in=names).order_by("name"))


def _change(claim: ResourceClaim, n: int, now) -> None:
    claim.phase, claim.reason, claim.message = "Released", f"R{n}", f"message {n} with 'quotes' and \u00e9"
    claim.allocation = None if n % 2 else {"devices": {"results": [{"device": f"gpu-{n}"}]}}
    claim.released_at = now + timedelta(seconds=n)
    claim.lease_expires_at = None
    claim.resource_version += 10 + n
    claim.conditions = [{"type": "Released", "status": "True", "reason": f"R{n}"}]


def _stored(claim: ResourceClaim) -> dict:
    row = ResourceClaim.objects.get(pk=claim.pk)
    return {f: getattr(row, f) for f in FIELDS}


def test_one_row_and_several_rows_store_the_same_values(admin_client, small_fleet, monkeypatch):
    one, two, three, untouched = _claims(admin_client, ["a-one", "b-two", "c-three", "d-untouched"])
    before = _stored(untouched)
    now = timezone.now().replace(microsecond=0)
    for n, claim in enumerate((one, two, three)):
        _change(claim, n, now)
    sent: list[str] = []
    if connection.vendor == "postgresql":  # pg_execute binds on the server, past Django's query log
        real = bulk.pg_execute
        monkeypatch.setattr(bulk, "pg_execute", lambda sql, params: sent.append(sql) or real(sql, params))
    with CaptureQueriesContext(connection) as single:
        bulk.update_rows([one], FIELDS)
    with CaptureQueriesContext(connection) as several:
        bulk.update_rows([two, three], FIELDS)
    for claim in (one, two, three):
        assert _stored(claim) == {f: getattr(claim, f) for f in FIELDS}
    assert _stored(untouched) == before
    if connection.vendor == "postgresql":
        # one row: no array to build and unnest; several: one array per column
        assert len(sent) == 2 and not single.captured_queries and not several.captured_queries
        assert "unnest" not in sent[0] and "unnest" in sent[1]
