"""Figures: the ledger's cost in the commit (1,000 devices of a 500-claim round opened in one statement) and
a month's report over 200,000 intervals. Printed with ``-s``; bounds are generous (2 shared cores)."""
from __future__ import annotations

import time
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection

from tests.usage.conftest import T0
from usage.models import UsageInterval
from usage.services import ledger, reports

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def test_opening_a_rounds_intervals_is_one_quick_statement(fleet, clock, django_assert_max_num_queries):
    from claims.services import fleet as fleet_service

    snapshot = fleet_service.current_view().snapshot
    held = [ledger.Held(SimpleNamespace(id=i, uid=uuid.uuid4(), name=f"c{i}", namespace=SimpleNamespace(name="ns")),
                        "c1", "c1-h100-000", [{"driver": "gpu.nvidia.com", "pool": "c1-h100-000",
                                               "device": f"gpu-{j}"} for j in (0, 1)])
            for i in range(500)]
    started = time.perf_counter()
    with django_assert_max_num_queries(1):
        assert ledger.open_intervals(held, snapshot, clock.t) == 1000
    took = time.perf_counter() - started
    started = time.perf_counter()
    ledger.open_intervals(held, snapshot, clock.t)  # the snapshot's pools are indexed now, as in a busy worker
    again = time.perf_counter() - started
    print(f"\nledger: 1000 intervals of a 500-claim round opened in {took * 1000:.1f} ms (1 statement; "
          f"{again * 1000:.1f} ms once the snapshot's pools are indexed)")
    assert took < 1.0


def test_a_months_report_over_200k_intervals(db):
    table = connection.ops.quote_name(UsageInterval._meta.db_table)
    with connection.cursor() as cur:
        # 200,000 intervals over March: 50 namespaces, 4 products, 5 clusters; one in ten still open.
        cur.execute(f"""
            INSERT INTO {table} (claim_id, claim_uid, claim_name, namespace, queue, cluster, node, driver, pool,
                                 device, share_id, product, sharing, weight, started_at, ended_at)
            SELECT g, gen_random_uuid(), 'c' || g, 'ns-' || (g %% 50), 'q-' || (g %% 7), 'cluster-' || (g %% 5),
                   'node-' || (g %% 500), 'gpu.nvidia.com', 'pool-' || (g %% 500), 'gpu-' || (g %% 8), '',
                   'product-' || (g %% 4), 'exclusive', 1, %s + (g %% 2600000) * interval '1 second',
                   CASE WHEN g %% 10 = 0 THEN NULL
                        ELSE %s + (g %% 2600000) * interval '1 second' + (g %% 7200) * interval '1 second' END
            FROM generate_series(1, 200000) AS g""", [T0 - timedelta(days=1), T0 - timedelta(days=1)])
    now = T0 + timedelta(days=30)
    window = reports.Window(T0 - timedelta(days=1), now)
    started = time.perf_counter()
    out = reports.usage(window, ["namespace", "product"], None, now)
    took = time.perf_counter() - started
    print(f"\nreport: 200,000 intervals, groupBy namespace,product ({len(out['items'])} rows) in {took * 1000:.0f} ms")
    assert len(out["items"]) == 50 * 2 and took < 10  # g % 50 and g % 4 pair up 2 products per namespace
