"""The claims app's statements that differ between PostgreSQL (the service's database) and SQLite (the embedded
demo), one function each: the services call these and never ask which database runs.

``fold_freed_counts``: on PostgreSQL a release counts what it freed in insert-only ``FreedCount`` rows
(``claims.services.wake.released_sql``), which the worker folds into their ``WakeKey`` rows; on SQLite (one
writer at a time) a release adds to ``WakeKey.freed`` itself, so there is nothing to fold.
"""
from __future__ import annotations

from django.db import connection

from claims.models import FreedCount, WakeKey


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
