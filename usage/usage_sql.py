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
from usage.models import DecayedUsage, DecayedUsageDelta, UsageInterval


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
    """A CTE (``decayed``) for a statement whose CTE ``closed`` returns the closed intervals; uses ``%(now)s``:
    one insert-only delta per queue with a half-life. No row another release writes: the ``DecayedUsage`` row
    is only read here (a queue's first half-life, set while a release commits, may miss that one release, as
    the release's close is not yet in the ledger ``configure`` reads)."""
    rows, deltas = _decay_tables()
    return (f"decayed AS (INSERT INTO {deltas} (queue, value, at) "
            "SELECT c.queue, c.ds, %(now)s FROM (SELECT queue, "
            "SUM((weight * EXTRACT(EPOCH FROM (ended_at - started_at)))::float8) AS ds "
            f"FROM {closed} GROUP BY queue) c WHERE EXISTS (SELECT 1 FROM {rows} d WHERE d.queue = c.queue))")


def _decay_factor(at: str, half_life: str) -> str:
    """SQL: 2^(-(now - at) / half_life), never above 1 (no growth for a clock behind ``at``)."""
    return f"power(2.0, -GREATEST(0.0, EXTRACT(EPOCH FROM (%(now)s - {at}))::float8) / {half_life})"


def _decay_tables() -> tuple[str, str]:
    """The quoted tables of the rows and of their deltas."""
    quote = connection.ops.quote_name
    return quote(DecayedUsage._meta.db_table), quote(DecayedUsageDelta._meta.db_table)


def read_decayed(now) -> dict[str, float]:
    """Queue name -> its decayed usage at ``now`` (queues with a half-life): the row and its deltas, decayed."""
    if connection.vendor != "postgresql":  # no deltas: SQLite keeps the rows as ``configure`` made them
        return {r.queue: r.value * 2.0 ** (-max(0.0, (now - r.at).total_seconds()) / r.half_life_seconds)
                for r in DecayedUsage.objects.all()}
    rows, deltas = _decay_tables()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT d.queue, d.value * {_decay_factor('d.at', 'd.half_life_seconds')} + COALESCE(("
            f"SELECT SUM(x.value * {_decay_factor('x.at', 'd.half_life_seconds')}) FROM {deltas} x "
            f"WHERE x.queue = d.queue), 0) FROM {rows} d", {"now": now})
        return {queue: float(value) for queue, value in cursor.fetchall()}


def fold(now) -> int:
    """Move every delta into its queue's row (decayed to ``now``), in one statement: it deletes exactly the
    deltas its snapshot sees and adds exactly those. Deltas of a queue without a row (its half-life set to 0)
    are dropped. Returns the deltas folded. Locks the rows only against ``configure``, never a release."""
    if connection.vendor != "postgresql":
        return 0
    rows, deltas = _decay_tables()
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH gone AS (DELETE FROM {deltas} RETURNING queue, value, at), "
            f"summed AS (SELECT g.queue, SUM(g.value * {_decay_factor('g.at', 'd.half_life_seconds')}) AS v "
            f"FROM gone g JOIN {rows} d ON d.queue = g.queue GROUP BY g.queue), "
            f"folded AS (UPDATE {rows} d SET value = d.value * {_decay_factor('d.at', 'd.half_life_seconds')} "
            "+ s.v, at = GREATEST(d.at, %(now)s) FROM summed s WHERE d.queue = s.queue) "
            "SELECT count(*) FROM gone", {"now": now})
        return int(cursor.fetchone()[0])


def reset_decayed(queue: str, half_life: float, now) -> None:
    """The queue's row computed afresh from the ledger's closed intervals, its deltas dropped, in one statement:
    one snapshot, so a release that commits meanwhile is either in the ledger read or keeps its delta."""
    if connection.vendor != "postgresql":
        DecayedUsage.objects.update_or_create(queue=queue, defaults={"half_life_seconds": float(half_life),
                                                                     "value": 0.0, "at": now})
        return
    rows, deltas = _decay_tables()
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH gone AS (DELETE FROM {deltas} WHERE queue = %(q)s) "
            f"INSERT INTO {rows} (queue, half_life_seconds, value, at) SELECT %(q)s, %(h)s, ({_ledger_sum()}), %(now)s "
            "ON CONFLICT (queue) DO UPDATE SET half_life_seconds = EXCLUDED.half_life_seconds, "
            "value = EXCLUDED.value, at = EXCLUDED.at", {"q": queue, "h": float(half_life), "now": now})


def _ledger_sum() -> str:
    """SQL: queue ``%(q)s``'s closed intervals decayed to ``%(now)s`` with half-life ``%(h)s``."""
    table = connection.ops.quote_name(UsageInterval._meta.db_table)
    return ("SELECT COALESCE(SUM((weight * EXTRACT(EPOCH FROM (ended_at - started_at)))::float8 * "
            f"{_decay_factor('ended_at', '%(h)s')}), 0) FROM {table} WHERE queue = %(q)s AND ended_at IS NOT NULL")


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
