"""Decayed usage per queue, from the ledger: ``U(t) = Σ device-seconds_i × 2^(-(t - t_i) / halfLife)``.

``t_i`` is when an interval closed and its device-seconds ``weight × (end - start)`` (the ledger's own
measure). Kept incrementally as one ``(U, t)`` row per queue with a half-life (``DecayedUsage``): the ledger's
close (``decay_sql``, in the release's statement) decays the row to the close and adds what closed; a read
decays it to now. Setting or changing a queue's half-life (``configure``, in the queue write's transaction)
computes the row afresh from the ledger's closed intervals, so a queue gets its history at once, not from the
day the half-life was set. Intervals still open count when they close. PostgreSQL only (the service's
database); elsewhere the rows stay as ``configure`` made them.
"""
from __future__ import annotations

from django.db import connection
from django.utils import timezone

from usage.models import DecayedUsage, UsageInterval


def decayed(value: float, at_seconds: float, half_life: float, now_seconds: float) -> float:
    """``value`` as of ``at`` decayed to ``now`` (no growth for a clock behind ``at``)."""
    if half_life <= 0:
        return 0.0
    return value * 2.0 ** (-max(0.0, now_seconds - at_seconds) / half_life)


def decay_sql(closed: str) -> str:
    """Two CTEs (``locked_decay``, ``decayed``) for a statement whose CTE ``closed`` is the ledger's close with
    ``RETURNING queue, weight, started_at, ended_at``; uses ``%(now)s``. The rows are locked in id order
    first, so two releases touching the same queues never wait for each other in a cycle."""
    table = connection.ops.quote_name(DecayedUsage._meta.db_table)
    return (f"locked_decay AS (SELECT d.id FROM {table} d WHERE d.queue IN (SELECT queue FROM {closed}) "
            "ORDER BY d.id FOR UPDATE), "
            f"decayed AS (UPDATE {table} d SET "
            "value = d.value * power(2.0, -GREATEST(0.0, EXTRACT(EPOCH FROM (%(now)s - d.at))::float8) "
            "/ d.half_life_seconds) + c.ds, at = GREATEST(d.at, %(now)s) "
            "FROM (SELECT queue, SUM((weight * EXTRACT(EPOCH FROM (ended_at - started_at)))::float8) AS ds "
            f"FROM {closed} GROUP BY queue) c "
            "WHERE d.queue = c.queue AND d.id IN (SELECT id FROM locked_decay))")


def configure(queue: str, half_life: float, now=None) -> None:
    """The queue's half-life is ``half_life`` from now on (0: no row). A new or changed half-life recomputes
    the queue's decayed usage from its closed intervals. Call it inside the queue write's transaction."""
    if half_life <= 0:
        DecayedUsage.objects.filter(queue=queue).delete()
        return
    row = DecayedUsage.objects.select_for_update().filter(queue=queue).first()
    if row is not None and row.half_life_seconds == half_life:
        return
    now = now or timezone.now()
    value = _from_ledger(queue, float(half_life), now)
    DecayedUsage.objects.update_or_create(queue=queue, defaults={"half_life_seconds": float(half_life),
                                                                 "value": value, "at": now})


def _from_ledger(queue: str, half_life: float, now) -> float:
    if connection.vendor != "postgresql":
        return 0.0
    table = connection.ops.quote_name(UsageInterval._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM((weight * EXTRACT(EPOCH FROM (ended_at - started_at)))::float8 * power(2.0, "
            "-GREATEST(0.0, EXTRACT(EPOCH FROM (%(now)s - ended_at))::float8) / %(h)s)), 0) "
            f"FROM {table} WHERE queue = %(q)s AND ended_at IS NOT NULL", {"now": now, "h": half_life, "q": queue})
        return float(cursor.fetchone()[0])


def read(now=None) -> dict[str, float]:
    """Queue name -> its decayed usage now, in device-seconds (queues with a half-life only)."""
    now = now or timezone.now()
    return {r.queue: decayed(r.value, r.at.timestamp(), r.half_life_seconds, now.timestamp())
            for r in DecayedUsage.objects.all()}
