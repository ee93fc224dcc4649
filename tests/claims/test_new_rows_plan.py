"""The commit's re-read of the allocation rows of the pools a round touched (``locking.new_rows``) is an index
scan: a fleet of a few large clusters has tens of thousands of rows per cluster, and every round runs it under
the device locks other workers wait on. Real PostgreSQL planning with statistics."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from claims.models import DeviceAllocation, Namespace, ResourceClaim
from claims.services import locking

pytestmark = pytest.mark.django_db

TABLE = DeviceAllocation._meta.db_table
DRIVER = "gpu.nvidia.com"


def test_the_rows_of_a_rounds_pools_are_read_by_the_index_not_the_table():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's planner")
    owner = ResourceClaim.objects.create(namespace=Namespace.objects.create(name="a"), name="owner", spec={})
    with connection.cursor() as cursor:  # 2,500 nodes x 8 GPUs, all in one cluster, as a large H100 cluster
        cursor.execute(f"INSERT INTO {TABLE} (claim_id, cluster, driver, pool, device, share_id, admin_access, "
                       "request, created_at) SELECT %s, 'c1', %s, 'node-' || (g / 8), 'gpu-' || (g %% 8), '', false, "
                       "'gpu', now() FROM generate_series(0, 19999) AS g", [owner.id, DRIVER])
        cursor.execute(f"ANALYZE {TABLE}")
    pools = {("c1", DRIVER, f"node-{n}") for n in (3, 700, 1400, 2100)}
    seen = set(DeviceAllocation.objects.filter(pool="node-3").values_list("id", flat=True)[:5])
    with CaptureQueriesContext(connection) as read:
        devices, touched = locking.new_rows(pools, seen)
    assert len(devices) == 4 * 8 - 5 and touched == pools
    sql = next(q["sql"] for q in read.captured_queries if TABLE in q["sql"])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert f"Seq Scan on {TABLE}" not in plan and "Index" in plan, plan
