"""The claims app's statements that differ between PostgreSQL (the service's database) and SQLite (the embedded
demo), one function each: the services call these and never ask which database runs.

``fold_freed_counts``: on PostgreSQL a release counts what it freed in insert-only ``FreedCount`` rows
(``claims.services.wake.released_sql``), which the worker folds into their ``WakeKey`` rows; on SQLite (one
writer at a time) a release adds to ``WakeKey.freed`` itself, so there is nothing to fold.

``fleet_stamp_expression``: the fleet state's stamp read with a claim (PostgreSQL), so that its answer's queue
is resolved without reading the queues; ``allocated_among``: which devices an allocation holds, in one statement.
"""
from __future__ import annotations

from django.db import connection
from django.db.models import CharField, Q, Value
from django.db.models.expressions import RawSQL

from claims.models import DeviceAllocation, FleetState, FreedCount, WakeKey


def fleet_stamp_sql() -> str:
    """PostgreSQL: the fleet state's stamp (``queues.services.resolve.Tree.at``): its version and the transaction
    that wrote it (a version alone repeats after a rollback)."""
    return f"SELECT version::text || ':' || xmin::text FROM {connection.ops.quote_name(FleetState._meta.db_table)} " \
           "WHERE id = 1"


def fleet_stamp_expression() -> RawSQL | Value:
    """``fleet_stamp_sql`` as an annotation, for the reads whose answer renders a claim's queue (a claim's GET,
    its release): the answer's queue is then resolved without reading the queues while no queue write moved the
    stamp. None on SQLite (the queues are read)."""
    if connection.vendor != "postgresql":
        return Value(None, output_field=CharField())
    return RawSQL(fleet_stamp_sql(), ())


def allocated_among(devices: list[tuple[str, str, str, str]]) -> set[tuple[str, str, str, str]]:
    """Which of ``devices`` ((cluster, driver, pool, device)) an allocation holds now (admin access aside: it
    takes nothing). On PostgreSQL one statement over the unique index whatever their number; a query built
    as an OR of one condition per device cost the wake-up step milliseconds of CPU to compile per batch."""
    if not devices:
        return set()
    if connection.vendor != "postgresql":
        q = Q()
        for cluster, driver, pool, device in devices:
            q |= Q(cluster=cluster, driver=driver, pool=pool, device=device)
        return set(DeviceAllocation.objects.filter(q, admin_access=False)
                   .values_list("cluster", "driver", "pool", "device"))
    table = connection.ops.quote_name(DeviceAllocation._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT a.cluster, a.driver, a.pool, a.device FROM {table} a "
                       "JOIN unnest(%s::text[], %s::text[], %s::text[], %s::text[]) "
                       "AS d(cluster, driver, pool, device) USING (cluster, driver, pool, device) "
                       "WHERE NOT a.admin_access",
                       [list(column) for column in zip(*devices, strict=True)])
        return {tuple(row) for row in cursor.fetchall()}


def fold_freed_counts(limit: int) -> int:
    """Fold up to ``limit`` ``FreedCount`` rows into their keys' ``WakeKey.freed``, in one statement (committed
    whole: every counter, ``freed`` plus its rows, stays as it was). Rows another worker is folding are
    skipped, not waited for; keys are locked in byte order, as every writer of them does. Returns the rows
    folded."""
    if connection.vendor != "postgresql":
        return 0
    keys = connection.ops.quote_name(WakeKey._meta.db_table)
    counts = connection.ops.quote_name(FreedCount._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"WITH gone AS (DELETE FROM {counts} WHERE id IN (SELECT id FROM {counts} ORDER BY id "
                       "LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING key, freed), "
                       "sums AS (SELECT key, sum(freed) AS freed, count(*) AS n FROM gone GROUP BY key), "
                       f"folded AS (INSERT INTO {keys} (key, freed) SELECT key, freed FROM sums "
                       'ORDER BY key COLLATE "C" ON CONFLICT (key) DO UPDATE '
                       f"SET freed = {keys}.freed + excluded.freed) "
                       "SELECT COALESCE(sum(n), 0) FROM sums", [limit])
        return int(cursor.fetchone()[0])
