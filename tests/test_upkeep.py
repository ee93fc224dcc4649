"""Where PostgreSQL runs without autovacuum, the service keeps its own tables' planner statistics and dead rows
(draservice.upkeep_sql): with no statistics the change log's read of each round scanned the whole log."""
from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from claims.models import DeviceAllocation
from claims.services.fleet import ALLOCATIONS, ROW_FIELDS
from draservice import beat, changes
from draservice import upkeep_sql as upkeep
from draservice.upkeep_sql import TableStats

CHANGES = "draservice_change"


def test_due_follows_autovacuum_thresholds_most_overdue_first(monkeypatch):
    stats = [
        TableStats("quiet", rows=100_000, changed=10_000, dead=20_000, inserted=20_000),  # all at threshold or below
        TableStats("changed", rows=100_000, changed=10_051, dead=0, inserted=0),
        TableStats("dead", rows=1_000, changed=0, dead=251, inserted=0),
        TableStats("inserted", rows=0, changed=0, dead=0, inserted=1_001),
        TableStats("never-counted", rows=-1, changed=51, dead=0, inserted=0),  # reltuples -1: a new table
        TableStats("far-behind", rows=1_000, changed=5_000, dead=5_000, inserted=0),
    ]
    got = upkeep.due(stats)
    assert [(d.table, d.analyze, d.vacuum) for d in got] == [
        ("far-behind", True, True), ("never-counted", True, False), ("dead", False, True),
        ("inserted", False, True), ("changed", True, False)]
    assert got[0].overdue == pytest.approx(5_000 / 150)
    monkeypatch.setattr(upkeep, "MAX_TABLES", 2)
    assert [d.table for d in upkeep.due(stats)] == ["far-behind", "never-counted"]


def test_the_pass_runs_on_the_notify_queue_every_few_seconds(settings):
    entry = beat.collect()["draservice-upkeep"]
    assert entry["task"] == "draservice.tasks.upkeep"
    assert entry["options"]["queue"] == settings.NOTIFY_QUEUE  # never an allocation worker: a VACUUM takes seconds
    assert entry["schedule"].total_seconds() == settings.DB_UPKEEP_SECONDS == 30
    settings.DB_UPKEEP_SECONDS = 0
    assert "draservice-upkeep" not in beat.collect()


def test_the_utilisation_snapshot_never_holds_up_an_allocation_worker(settings):
    # 0.4-1.6 s at 40,000 devices: on the allocation worker, the claims submitted meanwhile waited once a minute
    entry = beat.collect()["claims-utilisation-snapshot"]
    assert entry["options"]["queue"] == settings.NOTIFY_QUEUE
    assert "options" not in beat.collect()["claims-expire-leases"]  # releases lead to rounds: the allocation queue


def test_the_change_log_is_compacted_beside_the_rounds_not_between_them(settings):
    entry = beat.collect()["draservice-compact-changes"]
    assert entry["task"] == "draservice.tasks.compact_changes"
    assert entry["options"]["queue"] == settings.NOTIFY_QUEUE
    assert "options" not in beat.collect()["draservice-seal-changes"]  # two small statements: stays


def _follower_plan() -> str:
    """The plan of the statement an allocation round reads the change log with (``changes.Follower``)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT max(seq) FROM {CHANGES}")
        top = cursor.fetchone()[0]
    follower = changes.Follower(ALLOCATIONS, top - 10, DeviceAllocation._meta.db_table, ROW_FIELDS)
    with CaptureQueriesContext(connection) as read:
        follower.read()
    sql = next(q["sql"] for q in read.captured_queries if f"FROM {CHANGES} c" in q["sql"])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.django_db(transaction=True)  # VACUUM cannot run inside a transaction
def test_a_log_without_statistics_gets_them_and_the_rounds_read_uses_its_index():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's statistics")
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {CHANGES} (txid, resource, namespace, name, uid, row_id, type, at) "
                       "SELECT 0, 'deviceallocations', '', 'x', '', g, 'ADDED', now() "
                       "FROM generate_series(1, 30000) AS g")
        # No statistics, as on a server whose autovacuum never ran (this one may have analyzed it before).
        cursor.execute(f"SELECT count(*) FROM pg_statistic WHERE starelid = '{CHANGES}'::regclass")
        had_statistics = cursor.fetchone()[0] > 0
    deadline = time.monotonic() + 10
    # Both counters this pass reads: earlier tests' changes can bring ``changed`` there before these inserts
    # are reported, and the vacuum is due by the inserts.
    while (lambda s: s.changed < 30_000 or s.inserted < 30_000)(
            next(s for s in upkeep.table_stats() if s.table == CHANGES)):
        assert time.monotonic() < deadline, "the server did not report the inserted rows"
        time.sleep(0.2)  # a backend reports its counters when idle, at most once a second
    if not had_statistics:  # planned blind: a third of the log guessed for seq > n, and all of it scanned
        assert "Seq Scan on draservice_change" in _follower_plan()
    with CaptureQueriesContext(connection) as ran:
        done = upkeep.run(force=True)
    # Throttled as autovacuum is, from before its first VACUUM to after its last statement.
    statements = [q["sql"] for q in ran.captured_queries]
    first = next(i for i, sql in enumerate(statements) if sql.startswith(("VACUUM", "ANALYZE")))
    assert "SET vacuum_cost_delay = '2ms'" in statements[:first] and statements[-1] == "RESET vacuum_cost_delay"
    mine = next(d for d in done if d.table == CHANGES)
    assert mine.analyze and mine.vacuum
    after = next(s for s in upkeep.table_stats() if s.table == CHANGES)
    assert after.changed == 0 and after.rows >= 30_000
    plan = _follower_plan()
    assert "Index Scan using draservice_change_pkey" in plan and "Seq Scan on draservice_change" not in plan, plan
    assert CHANGES not in {d.table for d in upkeep.run(force=True)}  # nothing changed since: not again
    print(f"\nstatistics before the pass: {had_statistics}; plan after it:\n{plan}")


def _statistics_targets(table: str) -> dict[str, int]:
    with connection.cursor() as cursor:
        # PostgreSQL 17 stores the default as NULL, earlier releases as -1
        cursor.execute("SELECT attname, coalesce(attstattarget, -1) FROM pg_attribute WHERE attrelid = %s::regclass "
                       "AND attnum > 0 AND NOT attisdropped", [table])
        return dict(cursor.fetchall())


@pytest.mark.django_db
def test_analyze_skips_the_claims_documents_and_samples_their_table_lightly():
    """Under load the claims table is analyzed every few seconds: at the default target its JSON documents cost
    a second of a core each time. Every column of it has chosen a target (a new one must choose too)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's statistics")
    claims = _statistics_targets("claims_resourceclaim")
    assert not [c for c, t in claims.items() if t == -1], "columns left at the default statistics target"
    documents = {"spec", "allocation", "conditions", "diagnostics", "labels", "annotations", "message",
                 "allowed_cluster_selector", "preemption"}
    assert {c for c, t in claims.items() if t == 0} == documents
    assert max(claims.values()) == 20  # ANALYZE samples 300 x 20 rows, not 30,000
    assert {c: t for c, t in _statistics_targets("claims_claimhistory").items() if t == 0} == {"labels": 0, "spec": 0}
    device = _statistics_targets("inventory_device")
    assert device["attributes"] == 0 and device["attribute_index"] == -1  # the search's @> is estimated from it
    with connection.cursor() as cursor:  # an empty table gets no statistics: some history to analyze
        cursor.execute("INSERT INTO claims_claimhistory (claim_uid, namespace, claim_name, labels, spec, created_at) "
                       "SELECT gen_random_uuid(), 'ns', 'c' || g, '{}', '{}', now() "
                       "FROM generate_series(1, 50) AS g")
        cursor.execute("ANALYZE claims_claimhistory")
        cursor.execute("SELECT attname FROM pg_stats WHERE tablename = 'claims_claimhistory'")
        analyzed = {name for (name,) in cursor.fetchall()}
    assert "claim_name" in analyzed and not analyzed & {"spec", "labels"}
