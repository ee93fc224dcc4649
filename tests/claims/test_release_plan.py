"""A release's one statement (claims.services.claims.free_devices) is prepared on the connection and, from then
on, run on its generic plan: PostgreSQL planned it anew at every release (a plan for an array parameter assumes
ten ids and lost to the custom plan for one), half a millisecond of the server's CPU each time."""
from __future__ import annotations

import pytest
from django.db import connection

from claims.models import DeviceAllocation, Phase, ResourceClaim
from claims.services import claims as claim_services
from scheduler.services.allocation import allocate_round
from tests.claims.fleet import gpu_claim

NS = "/api/v1/namespaces/team-a"


def _release_plans() -> tuple[int, int]:
    """(generic, custom) plans of the release statement prepared on this connection."""
    with connection.cursor() as cursor:  # Django's own cursor: never prepared itself
        cursor.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                       "WHERE statement LIKE %s", ["%freed AS (DELETE FROM \"claims_deviceallocation\"%"])
        rows = cursor.fetchall()
    assert len(rows) == 1, rows
    return rows[0]


def test_a_release_is_planned_once_per_connection_not_at_every_release(admin_client, small_fleet):
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's prepared statements")
    for i in range(12):
        assert admin_client.post(f"{NS}/resourceclaims", gpu_claim(f"c{i}"), format="json").status_code == 201
    allocate_round()
    with connection.cursor() as cursor:  # a ledger and charges of a busy fleet's size: the plans' estimates
        cursor.execute("INSERT INTO usage_usageinterval (claim_id, claim_uid, claim_name, namespace, queue, cluster, "
                       "node, driver, pool, device, share_id, product, sharing, weight, started_at, reservation) "
                       "SELECT -g, gen_random_uuid(), 'old', 'old', '', 'c0', 'n0', 'd', 'p', 'dev' || g, '', '', "
                       "'', 1, now(), '' FROM generate_series(1, 30000) AS g")
        cursor.execute("SET LOCAL session_replication_role = replica")  # charges of claims that are not there
        cursor.execute("INSERT INTO queues_quotacharge (claim_id, queue_id, device_class, unit, resource, amount, "
                       "cluster, created_at) SELECT -g, (SELECT min(id) FROM queues_queue), 'gpu', 'devices', '', 1, "
                       "'', now() FROM generate_series(1, 30000) AS g")
        cursor.execute("SET LOCAL session_replication_role = origin")
        cursor.execute("ANALYZE usage_usageinterval")
        cursor.execute("ANALYZE queues_quotacharge")
    claims = list(ResourceClaim.objects.filter(phase=Phase.ALLOCATED).order_by("id"))
    assert len(claims) == 12
    for claim in claims:
        claim_services.release_claim(claim.id)
    assert not DeviceAllocation.objects.exists()
    generic, custom = _release_plans()
    # psycopg prepares it at its sixth run; PostgreSQL's first five runs of a prepared statement plan it for
    # their values, then it compares: the generic plan wins from then on (before: 0 generic, 7 custom)
    assert custom <= 5 and generic == 7 - custom, (generic, custom)
