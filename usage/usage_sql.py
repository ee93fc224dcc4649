"""The usage app's statements that differ between PostgreSQL (the service's database) and SQLite (the embedded
demo), one function each: the ledger and the decayed usage call these and never ask which database runs.

PostgreSQL writes the ledger with COPY and closes intervals in one statement that also brings the queues'
decayed usage up to date (``close_intervals_ctes``: CTEs a caller's own statement can include, as a release
does in ``claims.services.claims``). SQLite gets the plain ORM writes and no decayed usage (its rows stay as
``usage.services.decay.configure`` made them).
"""
from __future__ import annotations

from django.db import connection
from django.db.models import F, Value
from django.db.models.functions import Greatest

from draservice.bulk import copy_rows
from usage.models import DecayedUsage, UsageInterval


def insert_intervals(rows: list[dict], columns: list[str]) -> None:
    """Insert interval rows (``columns``: their keys). COPY on PostgreSQL: no model instances, a round's
    thousand rows in one round trip, under the commit's locks."""
    if connection.vendor == "postgresql":
        copy_rows(UsageInterval, columns, rows, json_columns=set())
    else:
        UsageInterval.objects.bulk_create([UsageInterval(**r) for r in rows], batch_size=1000)


def close_intervals(claim_ids: list[int], now) -> int:
    """End the open intervals of ``claim_ids`` at ``now``, never before they started; the number closed. On
    PostgreSQL one statement (every release runs it), with the decayed usage brought up to date."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"WITH {close_intervals_ctes()} SELECT count(*) FROM closed",
                           {"ids": list(claim_ids), "now": now})
            return int(cursor.fetchone()[0])
    return (UsageInterval.objects.filter(claim_id__in=claim_ids, ended_at__isnull=True)
            .update(ended_at=Greatest(F("started_at"), Value(now))))


def close_intervals_ctes() -> str:
    """PostgreSQL: the close as CTEs of a caller's statement on ``%(ids)s`` and ``%(now)s``: ``closed`` (the
    intervals closed) and the queues' decayed usage brought up to date with them, in the same statement."""
    table = connection.ops.quote_name(UsageInterval._meta.db_table)
    closed = (f"UPDATE {table} SET ended_at = GREATEST(started_at, %(now)s) "
              "WHERE claim_id = ANY(%(ids)s) AND ended_at IS NULL RETURNING queue, weight, started_at, ended_at")
    return f"closed AS ({closed}), {_decay_ctes('closed')}"


def _decay_ctes(closed: str) -> str:
    """Two CTEs (``locked_decay``, ``decayed``) for a statement whose CTE ``closed`` returns the closed
    intervals; uses ``%(now)s``. The rows are locked in id order first, so two releases touching the same
    queues never wait for each other in a cycle."""
    table = connection.ops.quote_name(DecayedUsage._meta.db_table)
    return (f"locked_decay AS (SELECT d.id FROM {table} d WHERE d.queue IN (SELECT queue FROM {closed}) "
            "ORDER BY d.id FOR UPDATE), "
            f"decayed AS (UPDATE {table} d SET "
            "value = d.value * power(2.0, -GREATEST(0.0, EXTRACT(EPOCH FROM (%(now)s - d.at))::float8) "
            "/ d.half_life_seconds) + c.ds, at = GREATEST(d.at, %(now)s) "
            "FROM (SELECT queue, SUM((weight * EXTRACT(EPOCH FROM (ended_at - started_at)))::float8) AS ds "
            f"FROM {closed} GROUP BY queue) c "
            "WHERE d.queue = c.queue AND d.id IN (SELECT id FROM locked_decay))")


def decayed_from_ledger(queue: str, half_life: float, now) -> float:
    """The queue's decayed usage at ``now`` from its closed intervals (0 on SQLite)."""
    if connection.vendor != "postgresql":
        return 0.0
    table = connection.ops.quote_name(UsageInterval._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM((weight * EXTRACT(EPOCH FROM (ended_at - started_at)))::float8 * power(2.0, "
            "-GREATEST(0.0, EXTRACT(EPOCH FROM (%(now)s - ended_at))::float8) / %(h)s)), 0) "
            f"FROM {table} WHERE queue = %(q)s AND ended_at IS NOT NULL", {"now": now, "h": half_life, "q": queue})
        return float(cursor.fetchone()[0])


def decayed_as_of(queue: str, half_life: float, at) -> float:
    """The queue's decayed usage at ``at`` (a past moment) from the intervals closed by then (0 on SQLite)."""
    if connection.vendor != "postgresql" or half_life <= 0:
        return 0.0
    table = connection.ops.quote_name(UsageInterval._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM((weight * EXTRACT(EPOCH FROM (ended_at - started_at)))::float8 * power(2.0, "
            "-EXTRACT(EPOCH FROM (%(at)s - ended_at))::float8 / %(h)s)), 0) "
            f"FROM {table} WHERE queue = %(q)s AND ended_at <= %(at)s", {"at": at, "h": half_life, "q": queue})
        return float(cursor.fetchone()[0])
